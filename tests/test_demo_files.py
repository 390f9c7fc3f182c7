"""What the demo's server hands out: the example clips it offers, and not the other files beside them."""

import socket
import urllib.error
import urllib.request
from pathlib import Path

from apps.demo.app import allowed_paths, build_demo, launch_demo
from apps.demo.config import DemoConfig
from tests.model_factories import write_test_clip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_server_hands_out_the_offered_clips_and_nothing_else_of_their_folder(tmp_path):
    examples = tmp_path / "examples"
    (examples / "sub").mkdir(parents=True)
    clip = write_test_clip(examples / "ball.mp4", seconds=1.0, fps=4)
    (examples / "notes.txt").write_text("private")
    write_test_clip(examples / "sub" / "other.mp4", seconds=1.0, fps=4)
    temp_root = tmp_path / "runs"  # under the system temp folder: Gradio serves it already
    config = DemoConfig(examples_dir=examples, temp_root=temp_root, port=free_port())
    assert allowed_paths(config) == [str(clip.resolve())]
    app = build_demo(config)
    _, url, _ = launch_demo(app, config, prevent_thread_lock=True, quiet=True)
    try:
        served = {p.name: status_of(f"{url}gradio_api/file={p}") for p in (clip, examples / "notes.txt")}
        served["other.mp4"] = status_of(f"{url}gradio_api/file={examples / 'sub' / 'other.mp4'}")
    finally:
        app.close()
    assert served["ball.mp4"] == 200
    assert served["notes.txt"] >= 400 and served["other.mp4"] >= 400


def test_an_image_renamed_mp4_is_refused_at_upload(tmp_path):
    import cv2
    import numpy as np

    from apps.demo.checks import on_upload

    image = tmp_path / "photo.png"
    cv2.imwrite(str(image), np.full((64, 64, 3), 120, np.uint8))
    renamed = image.rename(tmp_path / "photo.mp4")
    status = on_upload(str(renamed), DemoConfig(examples_dir=tmp_path, temp_root=tmp_path / "runs"))
    assert status == (
        "**Cannot use this clip:** photo.mp4 holds a single image, not a video; upload a video clip "
        "\\(MP4, MOV, AVI, WebM ...\\)."
    )


def test_a_hub_preset_that_cannot_load_is_explained_in_the_pages_words():
    from apps.demo.checks import HUB_UNAVAILABLE, readable
    from pipeline.presets import PresetError

    err = PresetError(
        "--preset hub: Salesforce/blip-image-captioning-base neither in the Hugging Face cache (/root/.cache/hf/hub) "
        "nor reachable on the hub (no network, or HF_HUB_OFFLINE is set); use --preset offline"
    )
    assert readable(err) == HUB_UNAVAILABLE and "/root" not in HUB_UNAVAILABLE and "--" not in HUB_UNAVAILABLE
    assert readable(ValueError("a clip at /srv/up/x.mp4"), Path("/srv/up/x.mp4")) == "a clip at x.mp4"
    missing = PresetError("the offline model pack is not in this installation (missing: /srv/pack). Use --preset hub")
    assert readable(missing).startswith("The offline model pack is not installed on this server. Choose **hub**")


def test_samples_that_coincide_are_said_to(tmp_path):
    from apps.demo import run
    from pipeline.rollout import RolloutResult
    from tests.test_record import make_record

    record = make_record(["a ball falls."], [["a ball rolls."], ["a ball rolls."], ["a ball."]])
    status = run.outputs(RolloutResult(tmp_path, record, [], []), tmp_path / "run.zip", "req", 1.0, 3, 0.8)[5]
    assert "The 3 samples give 2 different future(s): at temperature 0.8" in status
    assert "- Predictor: `predictor`, readout tokens" in status  # which predictor ran: a fitted one shows its name
    record.predictions[1].sentences = ["a ball stops."]
    status = run.outputs(RolloutResult(tmp_path, record, [], []), tmp_path / "run.zip", "req", 1.0, 3, 0.8)[5]
    assert "different future" not in status


def test_a_demo_stopped_beside_another_leaves_the_others_examples_served(tmp_path):
    """Gradio caches the example clips it serves and clears its cache when a server starts or stops: each demo has a
    cache of its own, so stopping one does not take the other's examples."""
    examples = tmp_path / "examples"
    examples.mkdir()
    write_test_clip(examples / "ball.mp4", seconds=1.0, fps=4)
    apps = []
    try:
        for i in range(2):
            config = DemoConfig(examples_dir=examples, temp_root=tmp_path / f"runs{i}", port=free_port())
            app = build_demo(config)
            _, url, _ = launch_demo(app, config, prevent_thread_lock=True, quiet=True)
            apps.append((app, url))
        caches = [Path(app.GRADIO_CACHE) for app, _ in apps]
        assert caches[0] != caches[1] and caches[1].is_relative_to(tmp_path / "runs1")
        apps[0][0].close()
        [cached] = [p for p in caches[1].rglob("ball.mp4")]
        assert status_of(f"{apps[1][1]}gradio_api/file={cached}") == 200
    finally:
        for app, _ in apps:
            app.close()


def test_api_calls_with_values_the_page_never_sends_are_refused_in_one_log_line(tmp_path, capfd, caplog):
    from gradio_client import Client, handle_file

    clip = write_test_clip(tmp_path / "clip.mp4", seconds=1.0, fps=4)
    config = DemoConfig(examples_dir=tmp_path / "none", temp_root=tmp_path / "runs", port=free_port())
    app = build_demo(config)
    _, url, _ = launch_demo(app, config, prevent_thread_lock=True, quiet=True)
    refused = []
    try:
        client = Client(url, verbose=False)
        for args in ((1000, 1.0, "auto"), (2, -5.0, "auto"), (2, 1.0, "nonsense")):
            try:
                client.predict(handle_file(str(clip)), *args, 0, 0, 1, api_name="/rollout")
            except Exception as err:  # the caller is told why
                refused.append(str(err))
    finally:
        app.close()
    assert len(refused) == 3 and "Value 1000 is greater than maximum value 10" in refused[0]
    assert "Traceback" not in capfd.readouterr().err
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused a request")]
    assert len(lines) == 3 and lines[2].startswith("refused a request: Model preset: Value: nonsense")


def test_a_run_is_estimated_from_the_rates_of_the_last_one(tmp_path):
    """Before any run there is no estimate; after one, the next request's time is its frames and images at the
    measured rates, with a note when its preset has not loaded its models yet."""
    from apps.demo.checks import on_check
    from apps.demo.estimate import RunTimes
    from encoders.frames import probe_video
    from tests.test_record import make_record

    clip = write_test_clip(tmp_path / "clip.mp4", seconds=4, fps=10)
    config = DemoConfig(temp_root=tmp_path / "runs")
    times = RunTimes()
    info = probe_video(clip)
    status = on_check(str(clip), 3, config, 0, lambda i: times.sentence(i, 1.0, 32, 3, "offline"))[0]
    assert "no estimate yet" in status
    record = make_record(["a", "b", "c", "d"], [["x", "y"]])
    record.timings_s = {"sample_frames": 0.4, "load_models": 9.0, "caption": 3.6, "predict": 0.2, "render": 1.8}
    times.learn(record, seconds=16.0, preset="offline")  # 4 frames, 2 images; 1 s of writing and packing
    assert (times.per_frame, times.per_image, times.fixed) == (1.0, 1.0, 1.0)
    assert times.estimate(frames=4, images=3) == 8.0
    assert times.sentence(info, 1.0, 32, 3, "offline") == "about 8.0 s for 4 frames and 3 predicted images"
    assert times.sentence(info, 2.0, 32, 6, "hub").startswith("about 9.0 s after the models load")
    assert times.sentence(info, 1.0, 2, 3, "offline").startswith("about 6.0 s for 2 frames")  # --max-frames caps
    assert times.sentence(info, float("nan"), 32, 3, "offline") == ""  # a setting the run will refuse
    status = on_check(str(clip), 3, config, 0, lambda i: times.sentence(i, 1.0, 32, 3, "offline"))[0]
    assert status.endswith("… (about 8.0 s for 4 frames and 3 predicted images)")

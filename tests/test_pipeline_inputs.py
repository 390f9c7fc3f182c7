"""Unusual and hostile inputs to `python -m pipeline.rollout`: each gives a complete run with a documented
result (frames downscaled or thinned, a warning in rollout.json) or a one-line error, never a traceback and
never a half-written run folder.  Tiny local models of the real architectures, built once for the module."""

import json

import imageio.v3 as iio
import pytest

from pipeline import rollout as rollout_module
from pipeline.rollout import main
from pipeline.tiny_pack import make_tiny_blip, make_tiny_predictor, make_tiny_sd
from tests.model_factories import one_torch_thread, write_test_clip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    with one_torch_thread():
        return [
            "--captioner",
            str(make_tiny_blip(root / "blip")),
            "--renderer",
            str(make_tiny_sd(root / "sd")),
            "--predictor",
            str(make_tiny_predictor(root / "predictor", d_x=4, d_t=2, n_heads=1, n_layers=1)),
        ]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_test_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=3.0, fps=10)


def run_cli(video, options, models, tmp_path, capsys):
    """main() on `video`; returns (exit code, run folder, stdout, stderr)."""
    out = tmp_path / "run"
    with one_torch_thread():
        code = main([str(video), "--out", str(out), *options, *models])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, out, captured.out, captured.err


def assert_no_staging_left(folder):
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".run.partial-")], "no staging folder left"


def test_4k_clip_is_downscaled_and_runs(models, tmp_path, capsys):
    video = write_test_clip(tmp_path / "uhd.mp4", seconds=1.0, fps=3, size=(3840, 2160))
    code, out, printed, err = run_cli(video, ["--frames", "2", "--steps", "1"], models, tmp_path, capsys)
    assert code == 0, err
    record = json.loads((out / "rollout.json").read_text())
    assert (record["clip"]["width"], record["clip"]["height"]) == (3840, 2160)
    assert [o["frame_index"] for o in record["observed"]] == [0, 2]
    for entry in record["observed"]:
        assert iio.imread(out / entry["image"]).shape[:2] == (288, 512), "longer side <= 512, aspect kept"
    assert iio.imread(out / "rollout.mp4", index=0).shape == (288, 512, 3)
    assert_no_staging_left(tmp_path)


def test_hour_long_clip_is_thinned_to_max_frames_with_a_warning(models, tmp_path, capsys):
    video = write_test_clip(tmp_path / "hour.mp4", seconds=3600, fps=1)  # a real hour, at 1 fps to stay small
    code, out, printed, err = run_cli(
        video, ["--interval", "1", "--max-frames", "8", "--steps", "1"], models, tmp_path, capsys
    )
    assert code == 0, err
    record = json.loads((out / "rollout.json").read_text())
    indices = [o["frame_index"] for o in record["observed"]]
    assert len(indices) == 8 and indices[0] == 0 and indices[-1] == 3599
    assert all(b - a > 400 for a, b in zip(indices, indices[1:])), "evenly spread over the hour"
    assert record["clip"]["duration_s"] == pytest.approx(3600)
    assert any("3600 frames planned" in w and "max_frames=8" in w for w in record["warnings"])
    assert "warning: 3600 frames planned" in printed


def test_stream_corrupt_part_way_runs_on_the_frames_before_the_break(models, tmp_path, capsys):
    video = write_test_clip(tmp_path / "cut.mp4", seconds=3.0, fps=10, faststart=True)  # index in front
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 2])
    code, out, printed, err = run_cli(video, ["--interval", "0.5", "--steps", "1"], models, tmp_path, capsys)
    assert code == 0, err
    record = json.loads((out / "rollout.json").read_text())
    indices = [o["frame_index"] for o in record["observed"]]
    assert 1 <= len(indices) < 6 and indices == [0, 5, 10, 15, 20, 25][: len(indices)]
    assert len(record["warnings"]) == 1 and "truncated or corrupt" in record["warnings"][0]
    assert f"returning {len(indices)} of 6 planned frames" in record["warnings"][0]
    assert "warning: cut.mp4: decoding stopped" in printed
    assert len(record["predictions"][0]["sentences"]) == 1 and (out / "storyboard.png").is_file()


def test_frames_option_takes_evenly_spaced_frames(models, clip, tmp_path, capsys):
    code, out, printed, err = run_cli(clip, ["--frames", "3", "--steps", "1"], models, tmp_path, capsys)
    assert code == 0, err
    record = json.loads((out / "rollout.json").read_text())
    assert [o["frame_index"] for o in record["observed"]] == [0, 14, 29]  # first, middle, last of 30 frames
    assert [o["timestamp_s"] for o in record["observed"]] == [0.0, 1.4, 2.9]
    assert record["sampling"]["num_frames"] == 3
    # The tiny random captioner may ramble past the predictor's token slots; nothing else is warned about.
    assert [w for w in record["warnings"] if "token slots were cut" not in w] == []


@pytest.mark.parametrize(
    "options, message",
    [
        (["--steps", "0"], "--steps must be between 1 and 64, got 0"),
        (["--samples", "0"], "--samples must be at least 1, got 0"),
        (["--frames", "0"], "--frames must be between 1 and 256, got 0"),
        (["--max-frames", "0"], "--max-frames must be between 1 and 256, got 0"),
        (["--interval", "0"], "--interval must be a positive number of seconds, got 0.0"),
        (["--interval", "nan"], "--interval must be a positive number of seconds, got nan"),
        (["--temperature", "-1"], "--temperature must be 0 (greedy) or positive, got -1.0"),
        (["--temperature", "1", "--top-k", "0"], "--top-k must be at least 1, got 0"),
        (["--fps", "0"], "--fps must be between 0.1 and 60 frames a second, got 0"),
        (["--fps", "1e-9"], "--fps must be between 0.1 and 60 frames a second, got 1e-09"),
        (["--fps", "1e9"], "--fps must be between 0.1 and 60 frames a second, got 1e+09"),
        (["--frames-per-state", "1000000000"], "--frames-per-state must be between 1 and 16"),
    ],
)
def test_bad_settings_are_refused_before_any_work(models, clip, tmp_path, capsys, monkeypatch, options, message):
    called = []
    monkeypatch.setattr(rollout_module, "sample_frames", lambda *a, **k: called.append(1))
    code, out, printed, err = run_cli(clip, options, models, tmp_path, capsys)
    assert code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1
    assert not called and not out.exists()
    assert_no_staging_left(tmp_path)


def test_out_naming_a_file_is_refused(models, clip, tmp_path, capsys):
    target = tmp_path / "run"
    target.write_text("not a folder")
    with one_torch_thread():
        code = main([str(clip), "--out", str(target), "--overwrite", *models])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: --out {target} is a file, not a folder; choose another --out\n"
    assert target.read_text() == "not a folder"


def test_unexpected_failure_is_one_line_and_leaves_no_run_folder(models, clip, tmp_path, capsys, monkeypatch):
    def failing_write_outputs(folder, *args):
        (folder / "observed").mkdir()
        (folder / "observed" / "000.png").write_bytes(b"half")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(rollout_module, "write_outputs", failing_write_outputs)
    code, out, printed, err = run_cli(clip, ["--steps", "1"], models, tmp_path, capsys)
    assert code == 1
    assert err == "error: internal failure (RuntimeError: disk on fire); rerun with --verbose for the traceback\n"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_verbose_shows_the_traceback_of_an_unexpected_failure(models, clip, tmp_path, capsys, monkeypatch):
    def failing_sampler(*args, **kwargs):
        raise RuntimeError("decoder crashed")

    monkeypatch.setattr(rollout_module, "sample_frames", failing_sampler)
    for flag in ("--verbose", "--debug"):
        assert main([str(clip), "--out", str(tmp_path / "run"), flag, *models]) == 1
        err = capsys.readouterr().err
        assert "Traceback" in err and 'raise RuntimeError("decoder crashed")' in err
        assert err.endswith("error: internal failure (RuntimeError: decoder crashed)\n")
    assert list(tmp_path.iterdir()) == []


def test_a_clip_whose_name_is_not_utf8_is_refused_before_anything_is_written(
    models, clip, tmp_path, capsys, monkeypatch
):
    import os
    import shutil

    folder = tmp_path / "clips"
    folder.mkdir()
    bad = os.path.join(os.fsencode(folder), b"bad\xff\xfename.mp4")  # a name OpenCV's reader would crash on
    shutil.copyfile(clip, bad)
    video = os.fsdecode(bad)
    monkeypatch.chdir(tmp_path)  # where the default runs/ folder would go
    with one_torch_thread():
        code = main([video, *models])  # the default run folder would be named after the clip
    err = capsys.readouterr().err
    assert code == 2 and "bad\\xff\\xfename.mp4 is not valid UTF-8" in err and "Traceback" not in err
    assert sorted(os.listdir(folder)) == [bad.rsplit(b"/", 1)[1].decode("utf-8", "surrogateescape")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clips"]  # no runs/, no lock, no staging


def test_a_permission_error_while_reading_the_clip_names_the_clip_not_the_run_folder(
    models, clip, tmp_path, capsys, monkeypatch
):
    def unreadable(path, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(rollout_module, "sample_frames", unreadable)
    code, out, printed, err = run_cli(clip, ["--steps", "1"], models, tmp_path, capsys)
    assert code == 2 and err == f"error: {clip}: Permission denied\n"
    assert not out.exists()
    assert_no_staging_left(tmp_path)


def test_an_out_that_is_a_dangling_link_or_a_mount_point_is_refused_before_any_work(
    models, clip, tmp_path, capsys, monkeypatch
):
    import os

    from pipeline import run_folder

    called = []
    monkeypatch.setattr(rollout_module, "sample_frames", lambda *a, **k: called.append(1))
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "nowhere" / "run")
    code, _, _, err = run_cli(clip, ["--steps", "1", "--overwrite"], models, tmp_path, capsys)
    assert code == 2 and "is a link to nothing" in err and not called
    link.unlink()
    link.mkdir()
    monkeypatch.setattr(run_folder.os.path, "ismount", lambda path: os.fspath(path) == os.fspath(link))
    code, _, _, err = run_cli(clip, ["--steps", "1", "--overwrite"], models, tmp_path, capsys)
    assert code == 2 and "is a mount point" in err and not called

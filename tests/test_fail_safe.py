"""Every `python -m` command fails safe (docs/commands.md): no run lost or overwritten, checks before work, the stop
signals handled alike, and one exit-code convention (2 and one `error:` line for bad input, 1 for an internal
failure, 128 + n for signal n). Concurrent runs and signals are tested on real subprocesses; tiny models throughout."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from apps.demo import app as demo_app
from encoders.frames import VideoError, sample_frames
from encoders.grounding import FeatureReference
from pipeline import rollout as rollout_module
from pipeline import run_folder as run_folder_module
from pipeline.rollout import main as rollout_main
from pipeline.tiny_pack import make_tiny_blip, make_tiny_predictor, make_tiny_sd
from renderers.outputs import write_storyboard
from tests.model_factories import one_torch_thread, run_ffmpeg, write_test_clip
from tests.test_train import TINY, VAL_NAME, make_data
from world_model.benchmark.table5 import main as benchmark_main
from world_model.evaluation import evaluate as evaluate_module
from world_model.training import loop
from world_model.training import train as train_module
from world_model.utils.cli import UsageError, check_device, run_command
from world_model.utils.files import claimed

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/world_model/cpu.yaml"
# `python -c SLOW_ROLLOUT MARKER ARGS...`: the rollout command whose renderer touches MARKER, then waits a minute
# (so that a run can be signalled, or overlapped by another, while it works).
SLOW_ROLLOUT = """
import sys, time
from pathlib import Path
from pipeline import rollout

def slow_renderer(*args):
    def render(prompts, seed=0, init_images=None):
        Path(sys.argv[1]).touch()
        time.sleep(60)
    render.continues = False
    return render

rollout.load_renderer = slow_renderer
sys.exit(rollout.main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    with one_torch_thread():
        return {
            "captioner": make_tiny_blip(root / "blip"),
            "renderer": make_tiny_sd(root / "sd"),
            "predictor": make_tiny_predictor(root / "predictor", d_x=4, d_t=2, n_heads=1, n_layers=1),
        }


def flags(models, **replaced) -> list[str]:
    return [arg for name, path in {**models, **replaced}.items() for arg in (f"--{name}", str(path))]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_test_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=2.0, fps=5, size=(48, 32))


@pytest.fixture
def no_sampling(monkeypatch):
    """Records calls to the frame sampler (the first work of a run) instead of reading the clip."""
    called = []
    monkeypatch.setattr(rollout_module, "sample_frames", lambda *a, **k: called.append(1))
    return called


def run(args, capsys, main=rollout_main) -> tuple[int, str]:
    """main(args): (exit code, stderr); a traceback is never printed."""
    with one_torch_thread():
        code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def assert_one_error(err: str, *says: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for text in says:
        assert text in err, err


def slow_rollout(cwd: Path, marker: Path, *args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_ROLLOUT, str(marker), *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds  # a guard against a hang only: a loaded machine is slow to import
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


# ----- row 1: two runs into one folder -----
def test_two_runs_into_one_out_keep_the_first_and_refuse_the_second(models, clip, tmp_path):
    out = tmp_path / "same"
    first = slow_rollout(tmp_path, tmp_path / "first", clip, "--steps", "1", "--out", out, *flags(models))
    try:
        wait_for(tmp_path / "first", first)  # the first run is rendering, its folder claimed
        second = subprocess.run(
            [sys.executable, "-m", "pipeline.rollout", clip, "--steps", "1", "--out", out, *flags(models)],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2 and "Traceback" not in second.stderr
    says = f"error: --out {out} is in use: process {first.pid} is writing a run there; choose another --out\n"
    assert second.stderr.endswith(says), second.stderr
    assert "wrote" not in second.stdout


def test_an_out_another_run_holds_is_refused_even_with_overwrite(models, clip, tmp_path, capsys, no_sampling):
    out = tmp_path / "held"
    with claimed(out):
        code, err = run([clip, "--out", out, "--overwrite", *flags(models)], capsys)
    assert code == 2 and not no_sampling
    assert_one_error(err, f"--out {out} is in use: process {os.getpid()} is writing a run there")
    assert list(tmp_path.iterdir()) == []


def test_runs_started_in_the_same_second_get_their_own_default_folders(models, clip, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_folder_module, "timestamp", lambda: "20260101-120000")
    taken = Path("runs/clip-20260101-120000")
    with claimed(taken):  # another run, started this second, holds the plain name
        code, _ = run([clip, "--steps", "1", *flags(models)], capsys)
        assert code == 0
    code, _ = run([clip, "--steps", "1", *flags(models)], capsys)  # the plain name is free again: this run takes it
    assert code == 0
    kept = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert kept == ["clip-20260101-120000", "clip-20260101-120000-2"], "each run kept, none overwritten"
    assert all((tmp_path / "runs" / name / "rollout.json").is_file() for name in kept)


# ----- rows 3 and 4: stop signals on a real process -----
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_ends_a_rollout_with_one_line_and_nothing_left(models, clip, tmp_path, signum):
    marker, out = tmp_path / "rendering", tmp_path / "out" / "run"
    proc = slow_rollout(tmp_path, marker, clip, "--steps", "1", "--out", out, *flags(models))
    try:
        wait_for(marker, proc)
        assert any(p.name.startswith(".run.partial-") for p in out.parent.iterdir()), "the run was staging"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum
    assert err.strip() == f"interrupted by {signal.Signals(signum).name}; nothing was written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rendering"], "no run, staging, lock or made folder left"


QUIET_START = """
import importlib.util, os, signal, sys, time
sys.modules["__main__"].__spec__ = importlib.util.find_spec(sys.argv[1])  # as `python -m MODULE` sets it
import world_model.utils.quiet_start
os.kill(os.getpid(), signal.SIGTERM)  # while the command's libraries would be importing
time.sleep(5)
"""


@pytest.mark.parametrize("program, stopped", [("pipeline.rollout", True), ("pytest", False)])
def test_a_signal_while_a_command_starts_exits_with_one_line(program, stopped):
    proc = subprocess.run(
        [sys.executable, "-c", QUIET_START, program], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    if stopped:
        assert proc.returncode == 128 + signal.SIGTERM
        assert proc.stderr.strip() == "interrupted by SIGTERM while starting; nothing was written"
    else:  # not a project command: the import changes nothing, and SIGTERM kills as it always does
        assert proc.returncode == -signal.SIGTERM and proc.stderr == ""


# ----- rows 2, 5, 7, 9: checks before work -----
def test_an_interval_far_shorter_than_a_frame_is_refused_before_any_model_loads(models, clip, tmp_path, capsys):
    args = [clip, "--interval", "1e-9", "--steps", "1", "--max-frames", "4", "--out", tmp_path / "run"]
    code, err = run([*args, *flags(models)], capsys)
    assert code == 2
    assert_one_error(err, "--interval 1e-09 is shorter than one frame of clip.mp4 (0.2s at 5 fps)")
    assert list(tmp_path.iterdir()) == []


def test_a_frame_count_above_the_cap_is_refused(models, clip, tmp_path, capsys, no_sampling):
    code, err = run([clip, "--frames", "1000000000", "--out", tmp_path / "run", *flags(models)], capsys)
    assert code == 2 and not no_sampling
    assert_one_error(err, "--frames must be between 1 and 256, got 1000000000")


@pytest.mark.parametrize("device, says", [("bogus", "is not a device"), ("cuda:7", "CUDA GPU")])
def test_a_device_the_machine_lacks_is_refused_before_any_work(
    models, clip, tmp_path, capsys, no_sampling, device, says
):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    code, err = run([clip, "--device", device, "--out", tmp_path / "run", *flags(models)], capsys)
    assert code == 2 and not no_sampling
    assert_one_error(err, f"--device {device}", says)
    assert list(tmp_path.iterdir()) == []


def test_check_device_accepts_what_the_machine_has_and_names_what_it_lacks():
    check_device(None)
    check_device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="--device cuda: this machine has no CUDA GPU"):
            check_device("cuda")
    with pytest.raises(UsageError, match="--device xpu: only cpu, cuda, cuda:N and mps"):
        check_device("xpu")


@pytest.mark.parametrize("out", [".", "", "..", "./"])
def test_an_out_that_names_no_new_folder_is_refused_before_any_work(models, clip, tmp_path, capsys, no_sampling, out):
    os.chdir(tmp_path)
    try:
        code, err = run([clip, "--out", out, *flags(models)], capsys)
    finally:
        os.chdir(REPO)
    assert code == 2 and not no_sampling
    assert_one_error(err, "does not name a new file or folder")
    assert list(tmp_path.iterdir()) == []


def test_the_working_folder_is_refused_as_out_even_with_overwrite(models, clip, tmp_path, capsys, no_sampling):
    os.chdir(tmp_path)
    try:
        code, err = run([clip, "--out", tmp_path, "--overwrite", *flags(models)], capsys)
    finally:
        os.chdir(REPO)
    assert code == 2 and not no_sampling
    assert_one_error(err, "is the working folder or holds it")


def test_a_refused_input_leaves_no_folders_under_a_new_nested_out(models, tmp_path, capsys):
    notes = tmp_path / "notes.mp4"
    notes.write_text("not a video\n" * 30)
    code, err = run([notes, "--out", tmp_path / "out/a/b/run", *flags(models)], capsys)
    assert code == 2
    assert_one_error(err, f"Cannot read {notes} as a video")
    assert list(tmp_path.iterdir()) == [notes], "out/a/b made for the run are removed again"


# ----- row 6: damaged captioner folders -----
@pytest.mark.parametrize("damage", ["model", "grounding"])
def test_a_damaged_captioner_folder_names_the_file(models, clip, tmp_path, capsys, damage):
    captioner = Path(shutil.copytree(models["captioner"], tmp_path / "captioner"))
    FeatureReference.fit(torch.randn(80, 64)).save(captioner)  # a grounding reference of 64-d features
    name = {"model": "model.safetensors", "grounding": "grounding.safetensors"}[damage]
    data = (captioner / name).read_bytes()
    (captioner / name).write_bytes(data[: len(data) // 2 if damage == "model" else 1000])
    code, err = run([clip, "--steps", "1", "--out", tmp_path / "run", *flags(models, captioner=captioner)], capsys)
    assert code == 2
    assert_one_error(err, f"{captioner / name} is truncated or corrupt and cannot be read")
    assert not (tmp_path / "run").exists()


# ----- row 8: a cut AVI whose header still counts every frame -----
@pytest.mark.parametrize("codec", [["-c:v", "mjpeg"], ["-c:v", "mpeg4", "-vtag", "XVID"]])
def test_an_avi_cut_short_warns_as_a_cut_mp4_does(tmp_path, codec):
    source = write_test_clip(tmp_path / "source.mp4", seconds=40, fps=2, size=(32, 32))
    avi = tmp_path / "long.avi"
    run_ffmpeg("-i", str(source), *codec, str(avi))
    whole = sample_frames(avi, interval=1.0)
    assert whole.warnings == [] and len(whole) == 40
    data = avi.read_bytes()
    avi.write_bytes(data[: len(data) // 2])  # as `head -c`: the header still counts 80 frames
    cut = sample_frames(avi, interval=1.0)
    header = "long.avi: its header counts 80 frames (40.00s) but the file holds only"
    assert cut.warnings[0].startswith(header) and cut.warnings[0].endswith("probably truncated or corrupt."), (
        cut.warnings
    )
    assert 0 < len(cut) < 40  # (the data may also stop decoding before the part the file holds ends: a second warning)


# ----- row 10: CSV files that are not UTF-8 -----
@pytest.mark.parametrize("encoding", ["utf-16", "random bytes"])
def test_a_csv_that_is_not_utf8_is_named(models, tmp_path, capsys, encoding):
    data = make_data(tmp_path / "data")
    val = data / VAL_NAME
    if encoding == "random bytes":
        val.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    else:
        val.write_text(val.read_text(encoding="utf-8"), encoding=encoding)
    code, err = run(["--checkpoint", models["predictor"], "--data", data], capsys, evaluate_module.main)
    assert code == 2
    assert_one_error(err, f"{val}: not UTF-8 text", "save it as a UTF-8 CSV")


# ----- rows 11 and 13: outputs checked first, and exit 2 for bad input in train, evaluate and benchmark -----
def unwritable(tmp_path: Path) -> Path:
    """A path that cannot be written, for root too: its parent is a file."""
    (tmp_path / "a_file").write_text("")
    return tmp_path / "a_file" / "out"


def test_evaluate_refuses_an_unwritable_out_before_loading_anything(models, tmp_path, capsys, monkeypatch):
    called = []
    monkeypatch.setattr(evaluate_module, "evaluate_checkpoint", lambda *a: called.append(1))
    out = unwritable(tmp_path) / "metrics.json"
    code, err = run(
        ["--checkpoint", models["predictor"], "--data", tmp_path, "--out", out], capsys, evaluate_module.main
    )
    assert code == 2 and not called
    assert_one_error(err, f"--out {out}: {tmp_path / 'a_file'} is a file, not a folder")


def test_train_refuses_an_unwritable_out_before_reading_data(tmp_path, capsys, monkeypatch):
    read = []
    monkeypatch.setattr(train_module.TrainingData, "load", lambda *a: read.append(1))
    out = unwritable(tmp_path)
    code, err = run(["--config", CONFIG, "--data", tmp_path, "--out", out], capsys, train_module.main)
    assert code == 2 and not read
    assert_one_error(err, f"--out {out}")


def test_a_second_train_into_a_held_out_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    with claimed(out):
        code, err = run(["--config", CONFIG, "--data", tmp_path, "--out", out, "--resume"], capsys, train_module.main)
    assert code == 2
    assert_one_error(err, f"--out {out} is in use")


def test_train_refuses_an_out_that_holds_other_files(tmp_path, capsys):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"mine")
    code, err = run(["--config", CONFIG, "--data", tmp_path, "--out", out], capsys, train_module.main)
    assert code == 2
    assert_one_error(err, f"--out {out} holds files that are not a training run (holiday.jpg)")
    assert sorted(p.name for p in out.iterdir()) == ["holiday.jpg"]


@pytest.mark.parametrize(
    "main, args, says",
    [
        (train_module.main, ["--config", CONFIG, "--data", "{tmp}/nowhere", "--out", "{tmp}/run"], "nowhere"),
        (train_module.main, ["--config", "{tmp}/missing.yaml", "--data", "{tmp}", "--out", "{tmp}/run"], "missing"),
        (evaluate_module.main, ["--checkpoint", "{tmp}/none", "--data", "{tmp}"], "cloze_test"),
        (evaluate_module.main, ["--checkpoint", "{tmp}", "--data", "{tmp}", "--device", "bogus"], "--device bogus"),
        (evaluate_module.main, ["--checkpoint", "{tmp}", "--data", "{tmp}", "--out", "{tmp}"], "is a folder"),
        (benchmark_main, ["--preset", "nope", "--data", "{tmp}", "--out", "{tmp}/bench"], "nope"),
        (benchmark_main, ["--preset", "cpu", "--data", "{tmp}", "--out", "{tmp}/b", "--seeds", "x"], "--seeds"),
    ],
)
def test_bad_input_to_train_evaluate_and_benchmark_exits_2_with_one_line(tmp_path, capsys, main, args, says):
    code, err = run([a.format(tmp=tmp_path) for a in map(str, args)], capsys, main)
    assert code == 2
    assert_one_error(err, says)


@pytest.mark.parametrize(
    "module, args, says",
    [
        ("world_model.data.synthetic.generator", ["generate", "--episodes", "1", "--out", "{tmp}", "--size", "0"],
         "--size must be between 16 and 1,024, got 0"),
        ("world_model.training.coherence", ["--checkpoint", "{tmp}", "--data", "{tmp}", "--seeds", "0", "-1"],
         "--seeds must be >= 0, got -1"),
        ("world_model.benchmark.speed", ["--vocab-size", "0"], "--vocab-size must be >= 1"),
        ("pipeline.explain_bench", ["--repeats", "0"], "--repeats must be >= 1, got 0"),
        ("pipeline.bench", ["--size", "100000x100000"], "--size: a side may be at most 7680 pixels"),
        ("world_model.benchmark.coherence_rows", ["--data", "{tmp}", "--out", "{tmp}/c"],
         "the following arguments are required: --runs"),
        ("pipeline.pack.train_captioner", ["--data", "{tmp}", "--out", "{tmp}/c", "--batch-size", "0"],
         "--batch-size must be >= 1, got 0"),
        ("pipeline.pack.train_captioner", ["--data", "{tmp}", "--out", "{tmp}/c", "--max-steps", "0"],
         "--max-steps must be >= 1, got 0"),
        ("pipeline.pack.train_captioner", ["--data", "{tmp}", "--out", "{tmp}/c", "--patch-size", "0"],
         "--patch-size must be >= 1, got 0"),
        ("pipeline.pack.train_renderer", ["--data", "{tmp}", "--out", "{tmp}/r", "--batch-size", "0"],
         "--batch-size must be >= 1, got 0"),
        ("pipeline.pack.train_renderer", ["--data", "{tmp}", "--out", "{tmp}/r", "--max-steps", "-1"],
         "--max-steps must be >= 1, got -1"),
        ("pipeline.pack.train_renderer", ["--data", "{tmp}", "--out", "{tmp}/r", "--lr", "inf"],
         "--lr must be a finite number, got inf"),
        ("pipeline.pack.train_renderer", ["--data", "{tmp}", "--out", "{tmp}/r", "--block-out-channels", "0"],
         "--block-out-channels must be one or more positive widths, got (0,)"),
    ],
)  # fmt: skip
def test_a_setting_out_of_range_exits_2_naming_it_before_any_work(tmp_path, capsys, module, args, says):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as stopped:
        main([a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and says in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was made


def test_an_internal_failure_exits_1_and_points_to_verbose(capsys, monkeypatch):
    def broken():
        raise RuntimeError("a bug")

    assert run_command(broken) == 1
    says = "error: internal failure (RuntimeError: a bug); rerun with --verbose for the traceback\n"
    assert capsys.readouterr().err == says
    assert run_command(broken, verbose=True) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("error: internal failure (RuntimeError: a bug)\n")


# ----- row 12: the demo's flags -----
@pytest.mark.parametrize(
    "args, says",
    [
        (["--port", "-1"], "--port must be between 1 and 65535, got -1"),
        (["--port", "70000"], "--port must be between 1 and 65535, got 70000"),
        (["--queue-size", "0"], "--queue-size must be at least 1, got 0"),
        (["--temp-root", "{file}"], "--temp-root {file} is a file, not a folder"),
        (["--temp-root", "{file}/runs"], "--temp-root {file}/runs/request: {file} is a file, not a folder"),
        (["--device", "bogus"], "--device bogus is not a device"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--threads", "0"], "--threads must be between 1 and"),
    ],
)
def test_bad_demo_flags_are_refused_before_the_server_starts(tmp_path, capsys, monkeypatch, args, says):
    started = []
    monkeypatch.setattr(demo_app, "launch_demo", lambda *a, **k: started.append(1))
    file = tmp_path / "a_file"
    file.write_text("")
    code, err = run([a.format(file=file) for a in args], capsys, demo_app.main)
    assert code == 2 and not started
    assert_one_error(err, says.format(file=file))


def test_a_damaged_predictor_folder_stops_the_demo_at_start(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(demo_app, "launch_demo", lambda *a, **k: started.append(1))
    folder = make_tiny_predictor(tmp_path / "predictor", d_x=4, d_t=2, n_heads=1, n_layers=1)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a copy cut short
    code, err = run(["--predictor", folder, "--temp-root", tmp_path / "runs"], capsys, demo_app.main)
    assert code == 2 and not started
    assert_one_error(err, f"--predictor {folder}:", "truncated or corrupt")


def test_a_stop_signal_stops_the_demo_with_its_exit_code(tmp_path, capsys, monkeypatch):
    def serve_until_signalled(demo, config):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:  # Gradio closes the server and returns quietly
            pass

    monkeypatch.setattr(demo_app, "build_demo", lambda config: None)
    monkeypatch.setattr(demo_app, "launch_demo", serve_until_signalled)
    code, err = run(["--temp-root", tmp_path / "runs"], capsys, demo_app.main)
    assert code == 128 + signal.SIGTERM
    assert err.strip().endswith("interrupted by SIGTERM; server stopped")


# ----- row 14: messages that say what is true -----
def test_a_fifo_or_a_device_is_not_called_an_empty_file(tmp_path):
    fifo = tmp_path / "clip.mp4"
    os.mkfifo(fifo)
    with pytest.raises(VideoError, match=r"clip.mp4 is not a regular file \(a FIFO\)"):
        sample_frames(fifo)
    with pytest.raises(VideoError, match=r"/dev/zero is not a regular file \(a character device\)"):
        sample_frames("/dev/zero")


def test_a_signal_before_the_first_saved_epoch_does_not_claim_last_holds_one(tmp_path, capsys, monkeypatch):
    def signalled_epoch(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        raise AssertionError("SIGTERM did not stop training")

    monkeypatch.setattr(train_module, "run_epoch", signalled_epoch)
    out = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(TINY))  # JSON is YAML
    data = make_data(tmp_path / "data")
    code, err = run(["--config", config, "--data", data, "--out", out, "--no-progress"], capsys, train_module.main)
    assert code == 128 + signal.SIGTERM
    says = "interrupted by SIGTERM; stopped during epoch 1, before any epoch was saved; start again with --resume"
    assert err.strip() == says
    assert not (out / "last").exists() and not (tmp_path / ".run.lock").exists()


def test_signals_held_raise_the_signal_that_arrived_once_the_block_ends():
    with pytest.raises(KeyboardInterrupt) as stopped:
        with loop.signals_held():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)  # the handler has run by now: the block goes on
    assert stopped.value.signum == signal.SIGHUP


def test_a_cjk_clip_name_draws_without_glyph_warnings(tmp_path):
    image = np.zeros((32, 32, 3), np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_storyboard([(image, "t=0 ボール")], [(image, "step 1")], tmp_path / "board.png", title="ボールの動画.mp4")
    assert not [w for w in caught if "Glyph" in str(w.message)]
    assert (tmp_path / "board.png").stat().st_size > 0


def test_a_full_disk_is_refused_before_the_work_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import collections

    from world_model.utils import cli
    from world_model.utils.files import write_json_atomic

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda path: usage(10, 10, 0))
    with pytest.raises(UsageError, match="disk is full"):
        cli.check_writable(tmp_path / "out.json", "--out")
    monkeypatch.undo()
    target = tmp_path / "kept.json"
    target.write_text('{"old": 1}')

    class Full:
        def __init__(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", lambda *a, **k: Full())
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic(target, {"new": 2})
    assert target.read_text() == '{"old": 1}' and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]


@pytest.mark.parametrize("module", ["pipeline.pack.train_renderer", "pipeline.pack.train_captioner"])
def test_the_pack_trainers_refuse_an_unwritable_out_before_reading_data(tmp_path, capsys, module):
    import importlib

    (tmp_path / "a_file").write_text("")
    code, err = run(["--data", tmp_path / "nowhere", "--out", tmp_path / "a_file" / "run"], capsys,
                    importlib.import_module(module).main)  # fmt: skip
    assert code == 2
    assert_one_error(err, "is a file, not a folder")


@pytest.mark.slow
def test_sigterm_while_a_request_runs_stops_the_demo_cleanly(tmp_path):
    """The request's worker thread is inside torch when the signal arrives: the process still ends with 143 and
    one line, the request's folder removed, not with SIGABRT ("terminate called without an active exception")."""
    import socket

    from gradio_client import Client, handle_file

    models = [
        "--captioner", str(make_tiny_blip(tmp_path / "blip")),
        "--renderer", str(make_tiny_sd(tmp_path / "sd")),
        "--predictor", str(make_tiny_predictor(tmp_path / "predictor", d_x=4, d_t=2, n_heads=1, n_layers=1)),
    ]  # fmt: skip
    clip = write_test_clip(tmp_path / "clip.mp4", seconds=20.0, fps=10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "apps.demo", *models, "--port", str(port), "--temp-root", str(tmp_path / "runs")]
    demo = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(240):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        client.submit(handle_file(str(clip)), 10, 0.5, "custom", 0, 0, 1, api_name="/rollout")
        for _ in range(120):  # until the request's folder exists: the rollout is running
            if list((tmp_path / "runs").glob("*")):
                break
            time.sleep(0.25)
        time.sleep(1.0)
        demo.send_signal(signal.SIGTERM)
        _, err = demo.communicate(timeout=120)
    finally:
        demo.kill()
    assert demo.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "terminate called" not in err and "interrupted by SIGTERM; server stopped" in err
    assert [p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith("gradio-")] == []  # no request

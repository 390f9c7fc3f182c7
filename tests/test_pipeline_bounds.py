"""Bounded work in the rollout: documented caps, a progress report per rendered state, a storyboard of
bounded size, and SIGTERM cleaning up like Ctrl-C."""

import os
import signal

import pytest

from pipeline import rollout as rollout_module
from pipeline.config import MAX_FRAMES, ModelChoice
from pipeline.rollout import MAX_SAMPLES, MAX_STEPS, main, run_rollout
from tests.model_factories import one_torch_thread
from world_model.models.generation_config import MAX_SEED, GenerationConfig


def model_args(parts):
    return [x for k in ("captioner", "renderer", "predictor") for x in (f"--{k}", parts[k])]


@pytest.mark.parametrize(
    "flag, cap",
    [("--steps", MAX_STEPS), ("--samples", MAX_SAMPLES), ("--max-frames", MAX_FRAMES), ("--seed", MAX_SEED)],
)
def test_settings_above_their_cap_are_refused_before_any_work(parts, tmp_path, capsys, monkeypatch, flag, cap):
    called = []
    monkeypatch.setattr(rollout_module, "sample_frames", lambda *a, **k: called.append(1))
    code = main(
        [
            str(parts["clip"]),
            flag,
            str(cap + 1),
            "--temperature",
            "1",
            "--out",
            str(tmp_path / "run"),
            *model_args(parts),
        ]
    )
    err = capsys.readouterr().err
    low = 0 if flag == "--seed" else 1
    assert code == 2 and err == f"error: {flag} must be between {low} and {cap}, got {cap + 1}\n"
    assert not called and list(tmp_path.iterdir()) == []


def test_rendering_reports_progress_after_every_state(parts, tmp_path):
    seen = []
    with one_torch_thread():
        result = run_rollout(
            parts["clip"],
            2,
            ModelChoice(**{k: parts[k] for k in ("captioner", "renderer", "predictor")}),
            generation=GenerationConfig(samples=2, temperature=1.0),
            output=tmp_path / "run",
            progress=lambda fraction, message: seen.append(message),
        )
    assert [m for m in seen if m.startswith("rendering")] == [
        f"rendering predicted state {i} of 4" for i in range(1, 5)
    ]
    assert [len(images) for images in result.rendered] == [2, 2]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_mid_run_removes_the_staging_folder(parts, tmp_path, monkeypatch, capsys, signum):
    def signalled_renderer(*args):
        def render(prompts, seed=0, init_images=None):
            os.kill(os.getpid(), signum)  # as Ctrl-C, `kill PID` or a closed terminal would
            raise AssertionError("the signal did not stop the run")

        render.continues = False
        return render

    monkeypatch.setattr(rollout_module, "load_renderer", signalled_renderer)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with one_torch_thread():
        code = main([str(parts["clip"]), "--steps", "1", "--out", str(tmp_path / "run"), *model_args(parts)])
    assert code == 128 + signum
    err = capsys.readouterr().err
    assert (
        err.strip() == f"interrupted by {signal.Signals(signum).name}; nothing was written" and "Traceback" not in err
    )
    assert list(tmp_path.iterdir()) == [], "no run folder, no hidden staging folder and no lock file"
    assert {s: signal.getsignal(s) for s in before} == before


def test_hub_preset_without_network_or_cache_fails_at_once_with_one_line(parts, tmp_path, capsys, monkeypatch):
    from pipeline import presets

    asked = []
    monkeypatch.setattr(presets, "hub_model_available", lambda model_id: asked.append(model_id) or False)
    called = []
    monkeypatch.setattr(rollout_module, "sample_frames", lambda *a, **k: called.append(1))
    code = main([str(parts["clip"]), "--preset", "hub", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    hub = presets.load_preset("hub")
    assert code == 2 and err.startswith("error: --preset hub: ") and err.count("\n") == 1
    assert hub.captioner in err and "--preset offline" in err
    assert asked == [hub.captioner, hub.renderer] and not called


def test_library_noise_is_quiet_unless_verbose(parts, tmp_path, capfd):
    with one_torch_thread():
        code = main([str(parts["clip"]), "--steps", "1", "--out", str(tmp_path / "run"), *model_args(parts)])
    captured = capfd.readouterr()
    assert code == 0 and "wrote" in captured.out
    assert captured.err == "", "no loading bars, library advice or decoder messages on stderr"

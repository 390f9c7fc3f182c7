"""Training loop, stopping rule, resume, evaluation CLI and config checks on a tiny ROCStories fixture."""

import copy
import csv
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.model_factories import one_torch_thread
from world_model.data.rocstories import CLOZE_COLUMNS, TRAIN_COLUMNS, DataError
from world_model.evaluation.coherence import RULES
from world_model.evaluation.evaluate import main as evaluate_main
from world_model.evaluation.floors import FLOORS, count_copy_prior, count_prior
from world_model.models.checkpoint import CheckpointError
from world_model.models.four_tensor import FourTensorModel
from world_model.models.registry import MODEL_TYPES, build_model, load_model, model_vocab_size
from world_model.text.vocab import Vocabulary
from world_model.training import loop
from world_model.training import train as train_mod
from world_model.training.batches import prefix_windows
from world_model.training.checkpoints import (
    TIMING_KEYS,
    TrainingError,
    flatten_optimizer_state,
    unflatten_optimizer_state,
)
from world_model.training.config import ConfigError, TrainingConfig, load_config, validate_config
from world_model.training.loop import best_epoch_index, should_stop, stop_reason
from world_model.training.train import smoothing_prior, train
from world_model.utils.cli import Interrupted, stop_signals_raise

REPO = Path(__file__).resolve().parents[1]
TRAIN_NAME = "ROCStories__spring2016 - ROCStories_spring2016.csv"
VAL_NAME = "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
TEST_NAME = "cloze_test_test__spring2016 - cloze_test_ALL_test.csv"
TINY = {
    "model": {"type": "four_tensor", "d_x": 4, "d_t": 2, "n_heads": 1, "n_layers": 1, "dropout": 0.1},
    "training": {"batch_size": 8, "eval_batch_size": 4, "max_epochs": 4, "seed": 1},
}
# `python -c SLOW_TRAIN DELAY ARGS...`: the command line of world_model.training.train, sleeping DELAY seconds after
# every optimizer step (so that a run can be interrupted mid-epoch).
SLOW_TRAIN = """
import sys, time
from world_model.training import loop, train

step = loop.optimizer_step

def slow_step(*args, **kwargs):
    stats = step(*args, **kwargs)
    time.sleep(float(sys.argv[1]))
    return stats

loop.optimizer_step = slow_step
sys.exit(train.main(sys.argv[2:]))
"""
EPOCH_KEYS = {
    "epoch",
    "train_loss",
    "val_window_loss",
    "val_last_ce",
    "val_token_accuracy",
    "val_perplexity",
    "epoch_seconds",
    "wall_seconds",
    "train_windows_per_second",
}


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def sentence(rng):
    name, verb, rest = (
        rng.choice(w)
        for w in (["Tom", "Ann", "Bob", "Sue"], ["ran", "sat", "ate", "sang"], ["home", "fast", "cake", "late"])
    )
    return f"{name} {verb} {rest}."


def make_data(root: Path, n_train=40, n_cloze=10) -> Path:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    write_csv(
        root / TRAIN_NAME, TRAIN_COLUMNS, [[f"t{i}", "T"] + [sentence(rng) for _ in range(5)] for i in range(n_train)]
    )
    cloze = [[f"c{i}"] + [sentence(rng) for _ in range(6)] + [str(1 + i % 2)] for i in range(n_cloze)]
    write_csv(root / VAL_NAME, CLOZE_COLUMNS, cloze[: n_cloze // 2])
    write_csv(root / TEST_NAME, CLOZE_COLUMNS, cloze[n_cloze // 2 :])
    return root


def weights(path: Path) -> dict:
    return load_file(path)


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def untimed(history):
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


def read_metrics(out: Path):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("rocstories"))


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """An uninterrupted 4-epoch run on one torch thread, as the commands the resume tests start run: (out folder,
    summary). Bit-identical results need the same thread count (a reduction splits differently over threads)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    with one_torch_thread():
        return out, train(copy.deepcopy(TINY), data_dir, out, progress=False)


# ----- the stopping rule, as a pure function -----
@pytest.mark.parametrize(
    "losses, stop",
    [
        ([], False),
        ([3.0, 2.0, 1.5, 1.2, 1.1, 1.0, 0.9], False),  # still improving
        ([1.0, 1.1, 1.1, 1.1, 1.1], False),  # only four epochs since the minimum
        ([1.0, 1.1, 1.1, 1.1, 1.1, 1.1], True),  # five epochs since, and above 1.01 x minimum
        ([1.0, 1.1, 1.1, 1.1, 1.1, 1.01], False),  # equal to 1.01 x minimum is not above it
        ([1.0, 1.1, 1.1, 1.1, 1.1, 1.0101], True),
        ([1.0, 2.0, 2.0, 2.0, 2.0, 1.005], False),  # late, but back within the tolerance
        ([1.0, 2.0, 2.0, 2.0, 2.0, 1.005, 2.0], True),
        ([1.0, 1.1, 1.1, 0.9, 1.1, 1.1, 1.1, 1.1], False),  # a new minimum restarts the count
        ([1.0, 1.1, 1.1, 0.9, 1.1, 1.1, 1.1, 1.1, 1.1], True),
        ([1.0, 1.0, 1.2, 1.2, 1.2, 1.2], True),  # a tie does not replace the first minimum
    ],
)
def test_should_stop(losses, stop):
    assert should_stop(losses) is stop
    # stopping happens exactly at the first epoch where the rule holds, never before
    if stop:
        assert not any(should_stop(losses[:i]) for i in range(len(losses)))


def test_should_stop_parameters_and_best_epoch():
    assert should_stop([1.0, 1.5, 1.5], patience=2)
    assert not should_stop([1.0, 1.5, 1.5], patience=3)
    assert not should_stop([1.0] + [1.04] * 5, tolerance=1.05)
    assert should_stop([1.0] + [1.06] * 5, tolerance=1.05)
    assert best_epoch_index([3.0, 2.0, 2.0, 2.5]) == 1
    assert best_epoch_index([]) is None
    h = lambda e, v, t=1.0: {"epoch": e, "val_window_loss": v, "train_loss": t}
    assert stop_reason([h(1, 2.0), h(2, 1.0)], max_epochs=2, patience=5, tolerance=1.01) == "max_epochs"
    assert stop_reason([h(1, 2.0)], max_epochs=2, patience=5, tolerance=1.01) is None
    assert stop_reason([h(1, float("nan"))], max_epochs=9, patience=5, tolerance=1.01) == "non_finite_loss"
    six = [h(1, 1.0)] + [h(e, 1.5) for e in range(2, 7)]
    assert stop_reason(six, max_epochs=6, patience=5, tolerance=1.01) == "patience"  # patience wins on the last epoch


def test_loop_stops_by_the_rule_and_keeps_the_minimum(data_dir, tmp_path, monkeypatch):
    """Scripted validation losses: minimum at epoch 2, stop at epoch 7 (five epochs later), best/ = epoch 2."""
    scripted = iter([3.0, 2.0, 2.5, 1.99 * 1.02, 2.5, 2.5, 2.5, 2.5, 2.5])
    real = loop.metrics_from_sums

    def fake(sums):
        metrics = real(sums)
        metrics["val_window_loss"] = next(scripted)
        return metrics

    monkeypatch.setattr(loop, "metrics_from_sums", fake)
    summary = train(copy.deepcopy(TINY), data_dir, tmp_path / "out", max_epochs=20, train_subset=8, progress=False)
    assert (summary["stop_reason"], summary["best_epoch"], summary["last_epoch"]) == ("patience", 2, 7)
    assert json.loads((tmp_path / "out/best/config.json").read_text())["extra"]["epoch"] == 2
    assert len(read_metrics(tmp_path / "out")) == 7


# ----- a full run -----
def test_run_writes_metrics_curves_summary_and_best(reference, data_dir):
    out, summary = reference
    history = read_metrics(out)
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert all(EPOCH_KEYS <= h.keys() for h in history)
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "summary.json").read_text())
    for key in (
        "config",
        "corpus_statistics",
        "best_epoch",
        "last_epoch",
        "stop_reason",
        "best_metrics",
        "wall_seconds_to_best",
        "wall_seconds_total",
        "parameters",
    ):
        assert key in saved
    assert saved["stop_reason"] == "max_epochs" and saved["last_epoch"] == 4
    assert saved["corpus_statistics"]["train_stories"] == 40 and saved["corpus_statistics"]["validation_stories"] == 10
    best = min(history, key=lambda h: h["val_window_loss"])
    assert saved["best_epoch"] == best["epoch"]
    assert saved["best_metrics"]["val_last_ce"] == best["val_last_ce"]
    model = FourTensorModel.from_pretrained(out / "best")
    assert json.loads((out / "best/config.json").read_text())["extra"]["epoch"] == best["epoch"]
    assert sum(p.numel() for p in model.parameters()) == saved["parameters"]
    assert isinstance(load_model(out / "best"), FourTensorModel)
    assert len(Vocabulary.load(out / "best")) == saved["corpus_statistics"]["vocab_size"]


def test_two_runs_give_the_same_weights(reference, data_dir, tmp_path):
    out, _ = reference
    with one_torch_thread():  # the reference's thread count
        train(copy.deepcopy(TINY), data_dir, tmp_path / "again", progress=False)
    assert same_tensors(
        weights(out / "last/model/model.safetensors"), weights(tmp_path / "again/last/model/model.safetensors")
    )
    assert untimed(read_metrics(out)) == untimed(read_metrics(tmp_path / "again"))


def test_resume_after_sigkill_is_bit_identical(reference, data_dir, tmp_path):
    ref, _ = reference
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(TINY))  # JSON is YAML
    out = tmp_path / "killed"
    args = ["--config", str(config), "--data", str(data_dir), "--out", str(out), "--no-progress"]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}  # the reference's thread count
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_TRAIN, "0.25", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=one_thread,
    )
    state = out / "last/state.json"
    deadline = time.monotonic() + 600  # a guard against a hang only: a loaded machine takes minutes
    try:
        while time.monotonic() < deadline:
            try:
                if json.loads(state.read_text())["epoch"] == 2:
                    break
            except (OSError, ValueError):
                pass
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("no last/ for epoch 2 within 600 s")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(state.read_text())["epoch"] == 2
    resumed = subprocess.run(  # the module's command line, as run by hand
        [sys.executable, "-m", "world_model.training.train", *args, "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=one_thread,
    )
    assert resumed.returncode == 0, resumed.stderr
    for name in ("last/model/model.safetensors", "best/model.safetensors", "last/optimizer.safetensors"):
        assert same_tensors(weights(ref / name), weights(out / name)), name
    assert untimed(read_metrics(ref)) == untimed(read_metrics(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_epoch"] == 2 and summary["last_epoch"] == 4


def test_time_budget_stops_after_an_epoch_and_resumes(data_dir, tmp_path):
    out = tmp_path / "budget"
    summary = train(copy.deepcopy(TINY), data_dir, out, max_epochs=3, max_minutes=1e-6, progress=False)
    assert (summary["stop_reason"], summary["last_epoch"]) == ("time_budget", 1)
    # the epoch budget may change on resume (it decides when to stop, not what an epoch computes)
    summary = train(copy.deepcopy(TINY), data_dir, out, max_epochs=2, resume=True, progress=False)
    assert (summary["stop_reason"], summary["last_epoch"], summary["resumed_from_epoch"]) == ("max_epochs", 2, 1)


def test_a_damaged_resume_names_the_damaged_file(data_dir, tmp_path):
    out = tmp_path / "damaged"
    train(copy.deepcopy(TINY), data_dir, out, max_epochs=1, progress=False)
    run_json = (out / "run.json").read_text()
    (out / "run.json").write_text("{cut sh")
    with pytest.raises(TrainingError, match=f"{out / 'run.json'} is damaged .*cannot be resumed"):
        train(copy.deepcopy(TINY), data_dir, out, max_epochs=2, resume=True, progress=False)
    (out / "run.json").write_text(run_json)
    import pickle

    (out / "last" / "optimizer.safetensors").write_bytes(pickle.dumps({"state": 1}))  # a pickle, not safetensors
    with pytest.raises(CheckpointError, match="optimizer.safetensors is missing or damaged"):
        train(copy.deepcopy(TINY), data_dir, out, max_epochs=2, resume=True, progress=False)


def test_a_resume_on_another_thread_count_is_recorded_and_said(data_dir, tmp_path, capsys):
    """The thread count decides the order of a matmul's sums, so a run repeats to the last decimal only on its own:
    run.json and summary.json record it, and a resume that differs says so."""
    out, threads = tmp_path / "threads", torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        summary = train(copy.deepcopy(TINY), data_dir, out, max_epochs=1, progress=False)
        assert summary["torch_threads"] == 1 == json.loads((out / "run.json").read_text())["torch_threads"]
        capsys.readouterr()
        torch.set_num_threads(2)
        summary = train(copy.deepcopy(TINY), data_dir, out, max_epochs=2, resume=True, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert "the run used 1 thread(s), this one 2" in capsys.readouterr().out
    assert summary["torch_threads"] == 2 and summary["resumed_from_epoch"] == 1


def test_a_run_saved_before_new_config_fields_still_resumes(data_dir, tmp_path):
    out = tmp_path / "older"
    train(copy.deepcopy(TINY), data_dir, out, max_epochs=1, progress=False)
    record = json.loads((out / "run.json").read_text())
    del record["config"]["model"]["qkv_form"]  # as written by a version without the field
    (out / "run.json").write_text(json.dumps(record))
    summary = train(copy.deepcopy(TINY), data_dir, out, max_epochs=2, resume=True, progress=False)
    assert (summary["last_epoch"], summary["resumed_from_epoch"]) == (2, 1)
    record["config"]["model"]["d_x"] = 8  # a real difference is still refused
    (out / "run.json").write_text(json.dumps(record))
    with pytest.raises(TrainingError, match="d_x"):
        train(copy.deepcopy(TINY), data_dir, out, max_epochs=3, resume=True, progress=False)


def test_sigterm_mid_epoch_leaves_the_last_epoch_resumable(data_dir, tmp_path):
    config = tmp_path / "tiny.yaml"
    long_run = copy.deepcopy(TINY)
    long_run["training"]["max_epochs"] = 50  # cannot finish before the signal, however the machine is loaded
    config.write_text(json.dumps(long_run))
    out = tmp_path / "term"
    args = ["--config", str(config), "--data", str(data_dir), "--out", str(out), "--no-progress"]
    cmd = [sys.executable, "-c", SLOW_TRAIN, "0.25", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    try:
        while not (out / "last/state.json").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "no last/ for epoch 1"
            time.sleep(0.02)
        time.sleep(0.3)  # inside epoch 2
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "interrupted by SIGTERM; stopped " in output and "continue with --resume" in output
    assert "Traceback" not in output
    assert json.loads((out / "last/state.json").read_text())["epoch"] >= 1
    assert not list(out.glob(".last.tmp-*")) and not (out / "summary.json").exists()


def test_signals_held_raise_once_the_block_ends_and_restore_the_handlers():
    saved = []
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals_raise():
        with pytest.raises(Interrupted):
            with loop.signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run by now: the block goes on
                saved.append("epoch")
        assert saved == ["epoch"]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, "a second signal does not cut the unwinding short"
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(KeyboardInterrupt):
        with loop.signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            saved.append("again")
    assert saved == ["epoch", "again"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with loop.signals_held():  # no signal: nothing raised
        saved.append("quiet")
    assert saved[-1] == "quiet"


def test_sigterm_during_the_save_of_an_epoch_finishes_that_save(data_dir, tmp_path, monkeypatch, capsys):
    save_epoch = train_mod.checkpoints.save_epoch

    def signalled_save(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # as a supervisor would, while curves.png is drawn
        time.sleep(0.05)
        save_epoch(*args)

    monkeypatch.setattr(train_mod.checkpoints, "save_epoch", signalled_save)
    out = tmp_path / "held"
    with pytest.raises(Interrupted) as stopped:
        train(copy.deepcopy(TINY), data_dir, out, max_epochs=3, progress=False)
    assert stopped.value.note.startswith(f"stopped after epoch 1; {out / 'last'} holds epoch 1")
    assert json.loads((out / "last/state.json").read_text())["epoch"] == 1 and (out / "curves.png").is_file()
    monkeypatch.undo()
    summary = train(copy.deepcopy(TINY), data_dir, out, max_epochs=2, resume=True, progress=False)
    assert (summary["last_epoch"], summary["resumed_from_epoch"]) == (2, 1)


# ----- refusals and bad input -----
def test_refuses_to_overwrite_or_resume_a_different_run(reference, data_dir, capsys):
    out, _ = reference
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(TrainingError, match="already holds a training run"):
        train(copy.deepcopy(TINY), data_dir, out, progress=False)
    changed = copy.deepcopy(TINY)
    changed["training"]["lr"] = 1e-3
    with pytest.raises(TrainingError, match="training.lr"):
        train(changed, data_dir, out, resume=True, progress=False)
    with pytest.raises(TrainingError, match="train_subset"):
        train(copy.deepcopy(TINY), data_dir, out, resume=True, train_subset=10, progress=False)
    assert (out / "metrics.jsonl").read_text() == before
    # a finished run resumed with the same config has nothing left to do
    assert train(copy.deepcopy(TINY), data_dir, out, resume=True, progress=False)["last_epoch"] == 4
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"train_subset": 0}, TrainingError, "train-subset"),
        ({"max_minutes": 0}, TrainingError, "max-minutes"),
        ({"max_minutes": -1.0}, TrainingError, "max-minutes"),
        ({"max_epochs": 0}, ConfigError, "max_epochs"),
    ],
)
def test_bad_arguments_fail_before_training(data_dir, tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        train(copy.deepcopy(TINY), data_dir, tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def test_bad_config_and_data_fail_before_training(data_dir, tmp_path, capsys):
    bad = copy.deepcopy(TINY)
    bad["model"]["d_z"] = 3
    with pytest.raises(ConfigError, match="d_z"):
        train(bad, data_dir, tmp_path / "a", progress=False)
    bad = copy.deepcopy(TINY)
    bad["training"]["learning_rate"] = 0.1
    with pytest.raises(ConfigError, match="learning_rate"):
        train(bad, data_dir, tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="training.lr must be float"):
        validate_config({"training": {"lr": "fast"}})
    with pytest.raises(ConfigError, match="vocabulary"):
        validate_config({"model": {"vocab_size": 10}})
    with pytest.raises(ConfigError, match="dropout"):
        validate_config({"model": {"dropout": 2.0}})
    with pytest.raises(ConfigError, match="model.d_x 100,000 is above 1,024"):
        validate_config({"model": {"d_x": 100000}})
    with pytest.raises(ConfigError, match="d_x \\* d_t = 65,536 is above 16,384"):
        validate_config({"model": {"d_x": 256, "d_t": 256}})
    assert validate_config({"training": {"lr": "3e-4"}})["training"]["lr"] == 3e-4  # PyYAML reads 3e-4 as a string
    with pytest.raises(ConfigError, match="training.precision must be 'fp32' or 'bf16', got 'fp16'"):
        TrainingConfig(precision="fp16")
    assert TrainingConfig.from_dict({"lr": 1}).to_dict() == validate_config({"training": {"lr": 1}})["training"]
    no_val = make_data(tmp_path / "noval")
    for name in (VAL_NAME, TEST_NAME):
        (no_val / name).unlink()
    with pytest.raises(DataError, match="validation"):
        train(copy.deepcopy(TINY), no_val, tmp_path / "b", progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    config = tmp_path / "bad.yaml"
    config.write_text("model: {type: four_tensor}\ntrainng: {lr: 0.1}\n")
    assert train_mod.main(["--config", str(config), "--data", str(data_dir), "--out", str(tmp_path / "c")]) == 2
    assert "trainng" in capsys.readouterr().err
    config.write_text("# nothing yet\n")  # an empty config is not the defaults (100 epochs) in disguise
    assert train_mod.main(["--config", str(config), "--data", str(data_dir), "--out", str(tmp_path / "c")]) == 2
    assert "the config file is empty" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_shipped_configs_load():
    cpu = load_config(REPO / "configs/world_model/cpu.yaml")
    assert (cpu["model"]["d_x"], cpu["model"]["d_t"], cpu["model"]["n_heads"], cpu["model"]["n_layers"]) == (
        16,
        8,
        4,
        2,
    )
    assert cpu["training"]["max_epochs"] == 30 and cpu["training"]["lr"] == 3e-4
    for name, heads, layers in (("paper_h2_l2", 2, 2), ("paper_h4_l2", 4, 2), ("paper_h4_l3", 4, 3)):
        c = load_config(REPO / f"configs/world_model/{name}.yaml")
        assert (c["model"]["d_x"], c["model"]["d_t"], c["model"]["n_heads"], c["model"]["n_layers"]) == (
            64,
            32,
            heads,
            layers,
        )
        assert (c["training"]["max_epochs"], c["training"]["patience"], c["training"]["tolerance"]) == (100, 5, 1.01)


# ----- registry and evaluation -----
def test_registry_builds_loads_and_asks_for_the_vocab_size(monkeypatch):
    model = build_model({"type": "four_tensor", "d_x": 4, "d_t": 2, "n_heads": 1, "n_layers": 1}, vocab_size=9)
    assert model.config.vocab_size == 9
    with pytest.raises(ValueError, match="unknown model type"):
        build_model({"type": "nope"}, vocab_size=9)
    vocab = Vocabulary(["<pad>", "<unk>", "a", "b"])
    assert model_vocab_size("four_tensor", vocab) == 4

    class Wider(FourTensorModel):
        @classmethod
        def vocab_size_for(cls, vocab):
            return len(vocab) + 2

    monkeypatch.setitem(MODEL_TYPES, "wider", (MODEL_TYPES["four_tensor"][0], Wider))
    assert model_vocab_size("wider", vocab) == 6


def test_load_model_rejects_unknown_types(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery"}))
    with pytest.raises(CheckpointError, match="mystery"):
        load_model(tmp_path)


def test_optimizer_state_round_trip():
    model = build_model({"d_x": 2, "d_t": 2, "n_heads": 1, "n_layers": 1}, vocab_size=5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.training_step(torch.randint(0, 5, (2, 5, 16))).loss.backward()
    opt.step()
    tensors, meta = flatten_optimizer_state(opt.state_dict())
    meta = json.loads(json.dumps(meta))
    restored = unflatten_optimizer_state(tensors, meta)
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(restored)
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])


def test_evaluate_cli_matches_the_best_epoch(reference, data_dir, tmp_path, capsys):
    out, summary = reference
    result_path = tmp_path / "eval.json"
    assert (
        evaluate_main(
            [
                "--checkpoint",
                str(out / "best"),
                "--data",
                str(data_dir),
                "--out",
                str(result_path),
                "--batch-size",
                str(TINY["training"]["eval_batch_size"]),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    result = json.loads(result_path.read_text())
    assert set(result) >= {
        "val_last_ce",
        "val_token_accuracy",
        "val_perplexity",
        "val_window_loss",
        "validation_windows",
        "last_tokens",
        "checkpoint",
        "model_type",
        "parameters",
    }
    best = summary["best_metrics"]
    assert result["val_last_ce"] == pytest.approx(best["val_last_ce"], rel=1e-6)
    assert result["val_window_loss"] == pytest.approx(best["val_window_loss"], rel=1e-6)
    assert result["val_token_accuracy"] == best["val_token_accuracy"]
    assert (result["validation_windows"], result["model_type"], result["parameters"]) == (
        10,
        "four_tensor",
        summary["parameters"],
    )
    assert result["last_tokens"] == summary["corpus_statistics"]["validation_last_sentence_tokens"]
    # the floors beside the model, fitted on the folder's 40 training stories, and Story Cloze for both halves
    floors = result["floors"]
    assert floors["train_windows"] == 40 and floors["selection"]["heldout_windows"] == 4
    assert all(floors[name]["last_tokens"] == result["last_tokens"] for name in FLOORS)
    cloze = result["story_cloze"]
    assert (
        list(cloze) == ["model", *FLOORS, "references"] and cloze["references"]["GPT-1 (Radford et al., 2018)"] == 0.865
    )
    assert all(
        list(cloze[name]) == ["val", "test"] and cloze[name]["test"]["stories"] == 5 for name in ("model", *FLOORS)
    )
    coherence = result["coherence"]
    assert list(coherence) == ["model", *FLOORS, "bag_of_words_dual_encoder", "references"]
    assert all(
        coherence[name]["rule"] in RULES and coherence[name]["retrieval"]["candidates"] == 11  # 2 + the 9 other stories
        for name in ("model", *FLOORS)
    )
    assert coherence["model"]["test"] == coherence["model"]["rules"]["test"][coherence["model"]["rule"]]
    assert coherence["bag_of_words_dual_encoder"]["fit"]["epoch"] >= 1
    printed = capsys.readouterr().out
    assert "val_last_ce" in printed and "position_unigram_copy" in printed and "Story Cloze accuracy" in printed
    assert "rule chosen on the val half" in printed and "bag_of_words_dual_encoder" in printed

    # words the checkpoint never saw are scored as <unk> and counted
    other = tmp_path / "other"
    other.mkdir()
    write_csv(
        other / VAL_NAME,
        CLOZE_COLUMNS,
        [["z1", "Zed flew.", "Zed ran.", "Tom sat.", "Ann ate.", "Bob sang home.", "Sue ran.", "1"]],
    )
    args = ["--checkpoint", str(out / "best"), "--data", str(other), "--out", str(result_path), "--device", "cpu"]
    assert evaluate_main([*args, "--overwrite"]) == 0
    other_result = json.loads(result_path.read_text())
    assert other_result["unknown_tokens"] == 3  # zed, flew, zed
    assert other_result["floors"] is None and list(other_result["story_cloze"]) == [
        "model",
        "references",
    ]  # no training file
    assert list(other_result["coherence"]) == ["model", "references"]
    assert "floors: none (no training file" in capsys.readouterr().out
    assert evaluate_main(["--checkpoint", str(tmp_path), "--data", str(data_dir)]) == 2


def test_evaluate_never_writes_over_its_checkpoint_or_an_existing_file_unasked(reference, data_dir, tmp_path, capsys):
    import hashlib

    best = reference[0] / "best"
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in best.iterdir() if p.is_file()}
    existing = tmp_path / "kept.json"
    existing.write_text('{"mine": 1}')
    args = ["--checkpoint", str(best), "--data", str(data_dir), "--device", "cpu"]
    assert evaluate_main([*args, "--out", str(best / "config.json")]) == 2
    assert "lies inside the checkpoint" in capsys.readouterr().err
    assert evaluate_main([*args, "--out", str(best / "config.json"), "--overwrite"]) == 2
    assert evaluate_main([*args, "--out", str(data_dir / "metrics.json")]) == 2
    assert "lies inside the data folder" in capsys.readouterr().err
    assert evaluate_main([*args, "--out", str(existing)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere" / "x.json")
    assert evaluate_main([*args, "--out", str(tmp_path / "dangling.json")]) == 2
    assert "is a link to nothing" in capsys.readouterr().err
    assert existing.read_text() == '{"mine": 1}' and not (data_dir / "metrics.json").exists()
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in best.iterdir() if p.is_file()} == digests


def test_evaluate_holdout_scores_a_held_out_run_on_its_own_slice_with_floors_fitted_before_it(
    data_dir, tmp_path, capsys
):
    config = copy.deepcopy(TINY)
    config["training"].update(max_epochs=1, holdout_stories=8)
    summary = train(config, data_dir, tmp_path / "run", progress=False)
    result_path = tmp_path / "eval.json"
    args = ["--checkpoint", str(tmp_path / "run" / "best"), "--data", str(data_dir), "--device", "cpu"]
    assert evaluate_main([*args, "--holdout", "8", "--out", str(result_path), "--batch-size", "4"]) == 0
    result = json.loads(result_path.read_text())
    assert result["val_last_ce"] == pytest.approx(summary["best_metrics"]["val_last_ce"], rel=1e-6)
    assert result["validation_windows"] == 8 and result["validation"] == "the last 8 training stories (held out)"
    assert result["floors"]["train_windows"] == 32  # the 40 training stories less the 8 scored
    assert all(result["story_cloze"][name]["val"]["stories"] == 5 for name in ("model", *FLOORS))  # still the cloze
    capsys.readouterr()
    assert evaluate_main([*args, "--out", str(result_path), "--overwrite"]) == 0
    cloze = json.loads(result_path.read_text())
    assert cloze["validation"] == "the cloze stories" and cloze["validation_windows"] == 10
    assert cloze["floors"]["train_windows"] == 40
    assert evaluate_main([*args, "--holdout", "40"]) == 2
    assert "leaves none of the 40 training stories" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evaluate_main([*args, "--holdout", "-1"])


def test_the_baseline_trains_and_evaluates_through_the_same_commands(data_dir, tmp_path, capsys):
    config = copy.deepcopy(TINY)
    config["model"] = {"type": "baseline", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "dropout": 0.1}
    config["training"]["max_epochs"] = 2
    summary = train(config, data_dir, tmp_path / "run", progress=False)
    model = load_model(tmp_path / "run" / "best")
    vocab = Vocabulary.load(tmp_path / "run" / "best")
    assert type(model).__name__ == "BaselineModel" and model.config.content_vocab_size == len(vocab)
    assert model.config.vocab_size == len(vocab) + 2
    result_path = tmp_path / "eval.json"
    assert (
        evaluate_main(
            [
                "--checkpoint",
                str(tmp_path / "run" / "best"),
                "--data",
                str(data_dir),
                "--out",
                str(result_path),
                "--batch-size",
                "4",
            ]
        )
        == 0
    )
    result = json.loads(result_path.read_text())
    assert result["model_type"] == "baseline"
    assert result["val_last_ce"] == pytest.approx(summary["best_metrics"]["val_last_ce"], rel=1e-6)
    assert math.isfinite(result["val_last_ce_teacher_forced"])
    assert 0 < result["val_last_end_cost"] < result["val_last_ce"] and 0 < result["floors"]["end_cost"]
    printed = capsys.readouterr().out
    assert "val_last_ce_teacher_forced:" in printed and "val_last_end_cost:" in printed
    assert f"{result['val_last_end_cost']:.4f} for this model" in printed
    last = result["floors"]["last_sentence"]
    assert f"(the tokens the flat baseline is trained on): L_S(4) {last['val_last_ce']:.4f}" in printed


def test_prefix_windows_make_every_sentence_a_target_behind_only_the_ones_before_it():
    from world_model.models.baseline import BaselineModel
    from world_model.models.baseline_config import BaselineConfig

    windows = torch.randint(2, 30, (3, 5, 4))
    windows[:, :, 3] = 0  # one padding slot per sentence
    expanded = prefix_windows(windows)
    assert expanded.shape == (12, 5, 4)
    model = BaselineModel(BaselineConfig(content_vocab_size=30, d_x=4, d_t=2, n_heads=2, n_layers=1, n_tokens=4))
    packed = model.pack(expanded)
    bos, eos = model.config.bos_id, model.config.eos_id
    for s in range(3):
        for t in range(1, 5):
            row = s * 4 + t - 1
            live = windows[s, :t, :3].reshape(-1)
            assert packed.prefix[row, : packed.prefix_len[row]].tolist() == [bos, *live.tolist()]
            assert packed.gold[row, : packed.gold_len[row]].tolist() == [*windows[s, t, :3].tolist(), eos]
    assert torch.equal(expanded[3::4], windows)  # t = T is the stored window itself


def test_baseline_trains_on_every_target_sentence_and_validates_on_the_last(data_dir, tmp_path):
    config = copy.deepcopy(TINY)
    config["model"] = {"type": "baseline", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "dropout": 0.1}
    config["training"].update(max_epochs=1, target_sentences="all")
    summary = train(config, data_dir, tmp_path / "all", progress=False)
    config["training"]["target_sentences"] = "last"
    last = train(config, data_dir, tmp_path / "last", progress=False)
    assert summary["train_windows"] == 4 * last["train_windows"] == 4 * 40
    assert summary["validation_windows"] == last["validation_windows"] == 10
    with pytest.raises(ConfigError, match="target_sentences 'all' is for the flat baseline"):
        validate_config({"model": {"type": "four_tensor"}, "training": {"target_sentences": "all"}})
    with pytest.raises(ConfigError, match="training.target_sentences must be 'last' or 'all'"):
        TrainingConfig(target_sentences="first")


def test_adam_eps_reaches_the_optimizer_and_changes_the_run(data_dir, tmp_path):
    config = copy.deepcopy(TINY)
    config["training"]["max_epochs"] = 1
    train(config, data_dir, tmp_path / "default", progress=False)
    config["training"]["adam_eps"] = "1e-2"  # a numeric string, as PyYAML reads 1e-2
    train(config, data_dir, tmp_path / "eps", progress=False)
    groups = [
        json.loads((tmp_path / run / "last" / "optimizer.json").read_text())["param_groups"]
        for run in ("eps", "default")
    ]
    assert {g["eps"] for g in groups[0]} == {1e-2} and {g["eps"] for g in groups[1]} == {1e-8}
    weights = [load_file(tmp_path / run / "last" / "model" / "model.safetensors") for run in ("eps", "default")]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[1])
    with pytest.raises(ConfigError, match=r"training.adam_eps must be > 0, got 0.0"):
        TrainingConfig(adam_eps=0)


def test_label_smoothing_reaches_the_baseline_loss_and_is_refused_with_the_copy_path(data_dir, tmp_path):
    config = copy.deepcopy(TINY)
    config["model"] = {"type": "baseline", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "dropout": 0.1}
    config["training"]["max_epochs"] = 1
    train(config, data_dir, tmp_path / "plain", progress=False)
    config["training"]["label_smoothing"] = 0.3
    train(config, data_dir, tmp_path / "smooth", progress=False)
    config["training"]["label_smoothing_prior"] = "counts"
    train(config, data_dir, tmp_path / "counts", progress=False)
    config["training"]["label_smoothing_prior"] = "counts_copy"
    train(config, data_dir, tmp_path / "counts_copy", progress=False)
    runs = ("smooth", "plain", "counts", "counts_copy")
    weights = [load_file(tmp_path / run / "last" / "model" / "model.safetensors") for run in runs]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[1])
    assert any(not torch.equal(weights[0][k], weights[2][k]) for k in weights[2])  # counts, not uniform
    assert any(not torch.equal(weights[2][k], weights[3][k]) for k in weights[3])  # the copy share reaches the loss
    with pytest.raises(ConfigError, match="label_smoothing_prior 'counts' needs training.label_smoothing > 0"):
        validate_config({"model": {"type": "baseline"}, "training": {"label_smoothing_prior": "counts"}})
    with pytest.raises(ConfigError, match="label_smoothing_prior must be one of 'uniform', 'counts', 'counts_copy'"):
        TrainingConfig(label_smoothing=0.1, label_smoothing_prior="unigram")
    with pytest.raises(ConfigError, match="'counts_copy' is for the flat baseline; a 'four_tensor' model"):
        validate_config(
            {
                "model": {"type": "four_tensor"},
                "training": {"label_smoothing": 0.1, "label_smoothing_prior": "counts_copy"},
            }
        )
    with pytest.raises(ConfigError, match="not defined for the copy path's mixture"):
        validate_config({"model": {"type": "four_tensor", "copy_path": True}, "training": {"label_smoothing": 0.1}})
    with pytest.raises(ConfigError, match=r"training.label_smoothing must be in \[0, 1\), got 1.0"):
        TrainingConfig(label_smoothing=1)


def test_the_count_prior_of_a_run_is_fitted_on_its_training_story_windows_alone():
    windows = torch.tensor([[[2, 3], [2, 0], [4, 3], [2, 3], [3, 0]], [[3, 2], [4, 4], [2, 0], [3, 3], [2, 4]]])
    model = build_model({"type": "baseline", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "n_tokens": 2}, 5)
    assert smoothing_prior(TrainingConfig(), windows, 5, model) == (None, None)
    assert smoothing_prior(TrainingConfig(label_smoothing=0.2), windows, 5, model) == (None, None)  # uniform
    counts, no_copy = smoothing_prior(
        TrainingConfig(label_smoothing=0.2, label_smoothing_prior="counts"), windows, 5, model
    )
    expected = count_prior(windows, 5, model.config.vocab_size, model.config.eos_id)
    assert counts.shape == (3, model.config.vocab_size) and torch.equal(counts, expected) and no_copy is None
    copying = smoothing_prior(
        TrainingConfig(label_smoothing=0.2, label_smoothing_prior="counts_copy"), windows, 5, model
    )
    for got, want in zip(copying, count_copy_prior(windows, 5, model.config.vocab_size, model.config.eos_id)):
        assert torch.equal(got, want)
    four = build_model({"type": "four_tensor", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "n_tokens": 2}, 5)
    slots, _ = smoothing_prior(TrainingConfig(label_smoothing=0.2, label_smoothing_prior="counts"), windows, 5, four)
    assert torch.equal(slots, count_prior(windows, 5, 5))  # no [EOS]: the position unigram of the token slots
    torch.testing.assert_close(slots[:, :5], counts[:2, :5] / counts[:2, :5].sum(-1, keepdim=True))


def test_a_four_tensor_run_trains_with_count_smoothing(data_dir, tmp_path):
    config = copy.deepcopy(TINY)
    config["training"]["max_epochs"] = 1
    train(config, data_dir, tmp_path / "plain", progress=False)
    config["training"].update(label_smoothing=0.3, label_smoothing_prior="counts")
    summary = train(config, data_dir, tmp_path / "counts", progress=False)
    weights = [load_file(tmp_path / run / "last" / "model" / "model.safetensors") for run in ("counts", "plain")]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[1])
    assert math.isfinite(summary["best_metrics"]["val_last_ce"])


@pytest.mark.parametrize(
    "preset, four_tensor_millions, baseline_millions",
    [("paper_h2_l2", 122.2, 175.9), ("paper_h4_l2", 172.5, 175.9), ("paper_h4_l3", 256.4, 226.2)],
)
def test_paper_presets_reproduce_the_reported_parameter_totals(preset, four_tensor_millions, baseline_millions):
    from world_model.training.config import load_config

    config = load_config(REPO / "configs" / "world_model" / f"{preset}.yaml")
    with torch.device("meta"):  # nothing is allocated
        four_tensor = build_model(config["model"], 36711)
        shared = {
            k: config["model"][k] for k in ("d_x", "d_t", "n_heads", "n_layers", "dropout", "n_tokens", "n_states")
        }
        baseline = build_model({**shared, "type": "baseline"}, 36711)
    assert round(sum(p.numel() for p in four_tensor.parameters()) / 1e6, 1) == four_tensor_millions
    assert round(sum(p.numel() for p in baseline.parameters()) / 1e6, 1) == baseline_millions


@pytest.mark.parametrize(
    "model", [TINY["model"], {"type": "baseline", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "dropout": 0.1}]
)
def test_bf16_training_keeps_fp32_weights_and_lands_near_fp32(model, data_dir, tmp_path):
    """--precision bf16 trains both model types under autocast: fp32 weights and checkpoints, finite losses, and
    after one epoch a validation window loss within 0.05 nats of the same run in fp32 (the tiny model's loss
    scale; bf16 products carry about 3 significant digits)."""
    runs = {}
    for precision in ("fp32", "bf16"):
        config = {"model": model, "training": {**TINY["training"], "max_epochs": 1}}
        runs[precision] = train(config, data_dir, tmp_path / precision, precision=precision, progress=False)
        assert runs[precision]["config"]["training"]["precision"] == precision
        assert all(
            t.dtype == torch.float32 for t in weights(tmp_path / precision / "best" / "model.safetensors").values()
        )
    fp32, bf16 = (runs[p]["best_metrics"]["val_window_loss"] for p in ("fp32", "bf16"))
    assert math.isfinite(bf16) and abs(bf16 - fp32) < 0.05

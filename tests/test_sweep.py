"""The learning-rate sweep on held-out training stories (`world_model.benchmark.sweep`) and the training's holdout."""

import json
from pathlib import Path

import pytest
import torch

from tests.test_benchmark import TINY_PRESET, write_preset
from tests.test_train import make_data
from world_model.benchmark import sweep
from world_model.benchmark.preset import load_preset, run_config
from world_model.data.rocstories import DataError, build_vocabulary, encode_windows, load_corpus
from world_model.evaluation.floors import FLOORS
from world_model.text.vocab import PAD_ID
from world_model.training.batches import load_training_windows
from world_model.training.config import TrainingConfig


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("rocstories"))  # 40 training stories, 10 cloze stories


def test_holdout_validates_on_the_last_training_stories_and_trains_on_the_others(data_dir):
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    _, stats, train, val = load_training_windows(data_dir, 4, 16, train_subset=None, holdout=6)
    assert torch.equal(val, encode_windows(corpus.train[-6:], vocab, 16))
    assert torch.equal(train, encode_windows(corpus.train[:-6], vocab, 16))
    assert "held out" in stats["validation"]
    _, _, train, _ = load_training_windows(data_dir, 4, 16, train_subset=10, holdout=6)
    assert torch.equal(train, encode_windows(corpus.train[:10], vocab, 16))
    _, _, _, cloze = load_training_windows(data_dir, 4, 16)
    assert torch.equal(cloze, encode_windows(corpus.validation, vocab, 16))
    with pytest.raises(DataError, match="leaves none"):
        load_training_windows(data_dir, 4, 16, holdout=40)


def test_sweep_trains_every_rate_and_model_on_held_out_stories_and_chooses_the_lowest_mean(
    data_dir, tmp_path, monkeypatch
):
    preset = write_preset(tmp_path / "tiny.yaml", TINY_PRESET)
    out = tmp_path / "sweep"
    settings = {
        "pair": "h1_l1",
        "holdout": 8,
        "train_subset": None,
        "max_epochs": 1,
        "progress": False,
    }
    results = sweep.run_sweep(sweep.SweepSettings(preset, data_dir, out, "1e-4,3e-2", **settings), command="test")
    assert [(r["lr"], r["model_type"]) for r in results["runs"]] == [
        (1e-4, "four_tensor"),
        (1e-4, "baseline"),
        (3e-2, "four_tensor"),
        (3e-2, "baseline"),
    ]
    for r in results["runs"]:
        summary = json.loads((out / "runs" / f"{r['model_type']}_lr{r['lr']:g}" / "summary.json").read_text())
        assert summary["validation_windows"] == 8 and summary["train_windows"] == 32
        assert summary["config"]["training"]["holdout_stories"] == 8
        assert summary["config"]["training"]["lr"] == r["lr"]
        assert summary["best_metrics"]["val_last_ce"] == r["heldout_last_ce"]
    means = {lr: sum(r["heldout_last_ce"] for r in results["runs"] if r["lr"] == lr) / 2 for lr in (1e-4, 3e-2)}
    assert results["chosen_lr"] == min(means, key=means.get)
    # the floors beside them: fitted on the runs' 32 training stories, measured on the 8 held-out stories' S(4) tokens
    corpus = load_corpus(data_dir)
    heldout = encode_windows(corpus.train[-8:], build_vocabulary(corpus), 16)
    floors = results["floors"]
    assert floors["train_windows"] == 32
    assert all(floors[name]["last_tokens"] == int((heldout[:, -1] != PAD_ID).sum()) for name in FLOORS)
    assert floors["position_unigram_copy"]["val_last_ce"] < floors["unigram"]["val_last_ce"]
    report = (out / "results.md").read_text()
    assert f"position_unigram {floors['position_unigram']['val_last_ce']:.4f}" in report
    assert f"Chosen: lr {results['chosen_lr']:g}" in report and "widen --lrs" in report  # two rates: always an edge
    monkeypatch.setattr(sweep.train_mod, "train", lambda *a, **k: pytest.fail("a finished run was retrained"))
    again = sweep.run_sweep(sweep.SweepSettings(preset, data_dir, out, "1e-4,3e-2", resume=True, **settings), "test")
    assert again["runs"] == results["runs"], "finished runs are read back, not retrained"


def test_the_report_warns_only_when_the_chosen_rate_is_at_the_edge_of_the_grid():
    def results(means):
        return {"mean_heldout_last_ce": means, "chosen_lr": float(min(means, key=means.get))}

    assert sweep.edge_note(results({"1e-3": 6.3, "2e-3": 6.2, "4e-3": 6.25})) == ""
    assert "grid's largest rate" in sweep.edge_note(results({"1e-3": 6.3, "2e-3": 6.2, "4e-3": 6.1}))
    assert "grid's smallest rate" in sweep.edge_note(results({"4e-3": 6.3, "1e-3": 6.0, "2e-3": 6.2}))


def test_the_cpu_preset_uses_the_rate_its_committed_sweep_chose_with_its_other_settings():
    folder = Path(__file__).resolve().parents[1] / "results" / "benchmark" / "cpu_sweep"
    results = json.loads((folder / "results.json").read_text())
    cpu = run_config(load_preset("cpu"), results["pair"], "four_tensor")
    assert results["preset"] == "cpu" and cpu["training"]["lr"] == results["chosen_lr"]
    swept = {"lr", "max_epochs", "schedule_epochs", "holdout_stories"}  # what the sweep sets itself
    for run in results["runs"]:
        config = json.loads((folder / "runs" / f"{run['model_type']}_lr{run['lr']:g}" / "summary.json").read_text())
        saved = TrainingConfig.from_dict(config["config"]["training"]).to_dict()  # fields added since: defaults
        trained = {k: v for k, v in saved.items() if k not in swept}
        assert trained == {k: v for k, v in cpu["training"].items() if k not in swept}, run

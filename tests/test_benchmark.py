"""The Table 5 benchmark (world_model/benchmark/: table5.py and the modules it runs) on a tiny ROCStories fixture with
a tiny preset."""

import json
import re
import shutil
import time
import types
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_train import TRAIN_NAME, make_data
from world_model.benchmark import attention as attn
from world_model.benchmark import attention_report
from world_model.benchmark import paper as paper_check
from world_model.benchmark import table5 as bench
from world_model.benchmark.preset import (
    MODEL_LABELS,
    MODELS,
    SHARED_MODEL_KEYS,
    BenchmarkError,
    load_preset,
    row_label,
    run_config,
    run_name,
)
from world_model.benchmark.report import pair_record, run_mismatches
from world_model.data.rocstories import build_vocabulary, encode_windows, load_cloze_halves, load_corpus
from world_model.evaluation import coherence as coh
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.floors import FLOORS, floor_report
from world_model.models.registry import build_model, count_parameters, load_model
from world_model.text.vocab import Vocabulary
from world_model.training import train as train_mod
from world_model.training.checkpoints import config_differences
from world_model.training.config import ConfigError

TINY_PRESET = {
    "pairs": {"h1_l1": {"n_heads": 1, "n_layers": 1}, "h2_l1": {"n_heads": 2, "n_layers": 1}},
    "model": {"d_x": 4, "d_t": 2, "dropout": 0.1},
    "training": {"batch_size": 8, "eval_batch_size": 4, "max_epochs": 2, "seed": 1},
    "budget": {"train_subset": 24, "max_minutes": None},
}
# One pair and five variants of it (d = 8, H = 2, d_H = 4): the attention preset's machinery at toy size.
TINY_ATTENTION_PRESET = {
    "pairs": {"h2_l1": {"n_heads": 2, "n_layers": 1}},
    "model": {"d_x": 4, "d_t": 2, "dropout": 0.1},
    "training": {"batch_size": 8, "eval_batch_size": 4, "max_epochs": 1, "seed": 1},
    "budget": {"train_subset": 24, "max_minutes": None},
    "variants": {
        "tucker_2_1": {
            "type": "four_tensor",
            "pair": "h2_l1",
            "model": {"qkv_form": "tucker", "tucker_ranks": [2, 1, 2, 1]},
        },
        "tucker_1_shared": {
            "type": "four_tensor",
            "pair": "h2_l1",
            "model": {"qkv_form": "tucker", "tucker_ranks": [1, 1, 1, 1], "tucker_shared_factors": True},
        },
        "gqa_kv1": {"type": "baseline", "pair": "h2_l1", "model": {"attention": "gqa", "n_kv_heads": 1}},
        "mla_dc2": {
            "type": "baseline",
            "pair": "h2_l1",
            "model": {"attention": "mla", "mla_kv_rank": 2, "mla_q_rank": 2},
        },
        "tucker_2_3_3": {
            "type": "baseline",
            "pair": "h2_l1",
            "model": {"attention": "tucker", "tucker_ranks": [2, 3, 3]},
        },
    },
}
PAPER_TOTALS_M = {
    ("h2_l2", "four_tensor"): 122.2,
    ("h4_l2", "four_tensor"): 172.5,
    ("h4_l3", "four_tensor"): 256.4,
    ("h2_l2", "baseline"): 175.9,
    ("h4_l2", "baseline"): 175.9,
    ("h4_l3", "baseline"): 226.2,
}


def write_preset(path: Path, preset: dict = TINY_PRESET) -> Path:
    path.write_text(yaml.safe_dump(preset, sort_keys=False))  # keep the order of pairs and variants
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("rocstories"))


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    return write_preset(tmp_path_factory.mktemp("preset") / "tiny.yaml")


@pytest.fixture(scope="module")
def finished(data_dir, preset, tmp_path_factory):
    """One whole benchmark through the command line: (out folder, results.json)."""
    out = tmp_path_factory.mktemp("bench") / "out"
    assert bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--no-progress"]) == 0
    return out, json.loads((out / "results.json").read_text())


def summary(out: Path, name: str) -> dict:
    return json.loads((out / "runs" / name / "summary.json").read_text())


def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train_mod, "train", refuse)


# ----- a whole benchmark -----
def test_writes_one_row_per_pair_and_model_and_the_reports(finished, preset):
    out, results = finished
    assert [(r["pair"], r["model_type"]) for r in results["runs"]] == [
        ("h1_l1", "four_tensor"),
        ("h1_l1", "baseline"),
        ("h2_l1", "four_tensor"),
        ("h2_l1", "baseline"),
    ]
    assert results["complete"] and [p["pair"] for p in results["pairs"]] == ["h1_l1", "h2_l1"]
    for r in results["runs"]:
        s = summary(out, run_name(r["pair"], r["model_type"]))
        assert (r["parameters"], r["best_epoch"], r["last_epoch"], r["stop_reason"]) == (
            s["parameters"],
            s["best_epoch"],
            s["last_epoch"],
            s["stop_reason"],
        )
        assert r["val_last_ce"] == s["best_metrics"]["val_last_ce"]
        assert r["val_token_accuracy"] == s["best_metrics"]["val_token_accuracy"]
        assert s["config"]["model"]["type"] == r["model_type"]
        assert (s["config"]["model"]["n_heads"], s["config"]["model"]["n_layers"]) == (r["n_heads"], r["n_layers"])
        # the per-epoch history is the run's own metrics.jsonl, and the windows/s come from it
        lines = (out / r["run_dir"] / "metrics.jsonl").read_text().splitlines()
        assert r["history"] == [json.loads(line) for line in lines] and len(lines) == s["last_epoch"]
        seconds = sum(h["train_seconds"] for h in r["history"])
        assert r["train_windows_per_second"] == pytest.approx(s["train_windows"] * len(lines) / seconds)
        assert r["train_windows"] == 24 and r["stopped_by"] == "epoch cap"
    # parameters differ across pairs (H enters the 4-tensor count, not the baseline's)
    params = {(r["pair"], r["model_type"]): r["parameters"] for r in results["runs"]}
    assert params[("h1_l1", "four_tensor")] < params[("h2_l1", "four_tensor")]
    assert params[("h1_l1", "baseline")] == params[("h2_l1", "baseline")]
    md = (out / "results.md").read_text()
    table = [line for line in md.splitlines() if line.startswith(("| h1_l1 ", "| h2_l1 "))]
    assert len(table) == 4 + 2 + 4 + 4  # one row per run, one per pair, one Story Cloze and one coherence row per run
    assert "epoch cap" in md and "python -m world_model.benchmark --preset" in md
    assert (out / "ls4_per_epoch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["command"].startswith("python -m world_model.benchmark --preset " + str(preset))
    assert results["corpus_statistics"]["train_stories"] == 40 and results["validation_windows"] == 10
    assert results["machine"]["torch"] == torch.__version__ and results["machine"]["torch_threads"] >= 1


def test_floors_and_story_cloze_are_in_the_reports(finished, data_dir):
    out, results = finished
    floors = results["floors"]
    assert [f["floor"] for f in floors["rows"]] == list(FLOORS)
    assert floors["train_windows"] == 24 and floors["selection"]["heldout_windows"] == 3  # the runs' windows, last 10%
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    _, report = floor_report(
        encode_windows(corpus.train[:24], vocab), encode_windows(corpus.validation, vocab), len(vocab)
    )
    assert floors["end_cost"] == pytest.approx(report["end_cost"], rel=1e-12) and floors["end_cost"] > 0
    assert floors["last_sentence"] == report["last_sentence"]
    for f in floors["rows"]:
        assert f["val_last_ce"] == pytest.approx(report[f["floor"]]["val_last_ce"], rel=1e-12)
        assert list(f["story_cloze"]) == ["val", "test"] and f["story_cloze"]["val"]["stories"] == 5
    halves = load_cloze_halves(data_dir)
    for r in results["runs"]:
        best = out / r["run_dir"] / "best"
        expected = sc.story_cloze(sc.model_scorer(load_model(best)), halves, Vocabulary.load(best))
        assert r["story_cloze"] == expected and set(expected["test"]) == {"summed", "per_token", "stories"}
    md = (out / "results.md").read_text()
    assert "## Count floors (training data only)" in md and "## Story Cloze accuracy" in md
    position = report["position_unigram"]["val_last_ce"]
    assert f"must say where S(4) ends is {position + report['end_cost']:.4f}" in md
    last = report["last_sentence"]["val_last_ce"]
    assert f"scores {last:.4f}, and {last + report['end_cost']:.4f} with the end cost" in md
    assert sum(line.startswith("| floor: ") for line in md.splitlines()) == 2 * len(FLOORS), "Story Cloze, coherence"
    assert "GPT-1 (Radford et al., 2018) 86.5%" in md


def test_every_run_and_floor_has_its_coherence_report(finished, data_dir):
    out, results = finished
    halves = load_cloze_halves(data_dir)
    for r in results["runs"]:
        best = out / r["run_dir"] / "best"
        expected = coh.coherence_report(sc.model_scorer(load_model(best)), halves, Vocabulary.load(best))
        assert r["coherence"] == expected and expected["rule"] in coh.RULES
        assert json.loads((out / r["run_dir"] / "coherence.json").read_text()) == expected, "kept with the run"
    for f in results["floors"]["rows"]:
        assert 0 <= f["coherence"]["test"] <= 1 and set(f["coherence"]["retrieval"]) >= {"recall_at_1", "mrr"}
    md = (out / "results.md").read_text()
    assert "## Coherence: Story Cloze by a rule chosen on val, and retrieval" in md
    run = results["runs"][0]
    c = run["coherence"]
    assert f"| {c['rule']} | {c['test']:.1%} | {c['val']:.1%} | {c['retrieval']['recall_at_1']:.3f} |" in md


def test_delta_and_time_ratio_come_from_the_runs_own_summaries(finished):
    out, results = finished
    for p in results["pairs"]:
        four, base = summary(out, f"{p['pair']}_four_tensor"), summary(out, f"{p['pair']}_baseline")
        assert p["delta_last_ce"] == base["best_metrics"]["val_last_ce"] - four["best_metrics"]["val_last_ce"]
        assert p["time_to_best_ratio"] == base["wall_seconds_to_best"] / four["wall_seconds_to_best"]
        assert p["total_time_ratio"] == base["wall_seconds_total"] / four["wall_seconds_total"]
        assert p["delta_last_ce"] != 0  # two different models: the sign of the subtraction is observable
        assert f"| {p['pair']} | {p['delta_last_ce']:+.4f} |" in (out / "results.md").read_text()


def test_the_two_runs_of_a_pair_are_matched(finished):
    out, results = finished
    for p in results["pairs"]:
        assert p["matched"] and p["mismatches"] == []
        four = json.loads((out / "runs" / f"{p['pair']}_four_tensor" / "run.json").read_text())
        base = json.loads((out / "runs" / f"{p['pair']}_baseline" / "run.json").read_text())
        assert four["config"]["training"] == base["config"]["training"]
        assert four["train_subset"] == base["train_subset"] == 24
        assert (four["train_windows"], four["validation_windows"]) == (
            base["train_windows"],
            base["validation_windows"],
        )
        for key in SHARED_MODEL_KEYS:
            assert four["config"]["model"][key] == base["config"]["model"][key]
    # a mismatch is reported, not hidden
    rows = {r["model_type"]: dict(r) for r in results["runs"] if r["pair"] == "h1_l1"}
    rows["baseline"]["config"] = json.loads(json.dumps(rows["baseline"]["config"]))
    rows["baseline"]["config"]["training"]["lr"] = 1.0
    record = pair_record("h1_l1", rows)
    assert not record["matched"] and any("lr" in m for m in record["mismatches"])


# ----- the paper-preset parameter check -----
def test_paper_parameter_totals_on_the_meta_device(monkeypatch):
    devices = []
    real = paper_check.build_model

    def spy(section, vocab_size):
        model = real(section, vocab_size)
        devices.append({p.device.type for p in model.parameters()})
        assert vocab_size == 36_711
        return model

    monkeypatch.setattr(paper_check, "build_model", spy)
    start = time.monotonic()
    rows = paper_check.paper_parameter_check()
    assert time.monotonic() - start < 20
    assert devices == [{"meta"}] * 6  # nothing allocated: ~1.4G parameters in all
    assert {(r["pair"], r["model_type"]): r["parameters_m"] for r in rows} == PAPER_TOTALS_M
    assert all(r["match"] and r["paper_m"] == PAPER_TOTALS_M[(r["pair"], r["model_type"])] for r in rows)
    exact = {(r["pair"], r["model_type"]): r["parameters"] for r in rows}
    assert exact[("h2_l2", "baseline")] == exact[("h4_l2", "baseline")] == 175_892_480
    assert exact[("h4_l3", "baseline")] == 226_242_560


def test_results_carry_the_paper_check(finished):
    out, results = finished
    check = {(c["pair"], c["model_type"]): c for c in results["paper_parameter_check"]}
    assert {k: c["parameters_m"] for k, c in check.items()} == PAPER_TOTALS_M and all(
        c["match"] for c in check.values()
    )
    assert "| h4_l2 | 4-tensor | 172,512,128 | 172.5M | 172.5M | yes |" in (out / "results.md").read_text()


def test_presets_share_the_paper_matching_rule():
    paper, cpu = load_preset("paper"), load_preset("cpu")
    for p in (paper, cpu):
        assert p["pairs"] == {
            "h2_l2": {"n_heads": 2, "n_layers": 2},
            "h4_l2": {"n_heads": 4, "n_layers": 2},
            "h4_l3": {"n_heads": 4, "n_layers": 3},
        }
        for pair in p["pairs"]:
            four, base = (run_config(p, pair, t) for t in MODELS)
            assert four["training"] == base["training"]
            assert all(four["model"][k] == base["model"][k] for k in SHARED_MODEL_KEYS)
            assert (
                four["training"]["weight_decay"],
                four["training"]["patience"],
                four["training"]["tolerance"],
                four["model"]["dropout"],
            ) == (0.01, 5, 1.01, 0.1)
    # the paper preset keeps section 8.2 exactly; the cpu preset documents its optimiser deviations
    assert (paper["training"]["lr"], paper["training"].get("lr_schedule", "constant")) == (3e-4, "constant")
    assert (paper["model"]["d_x"], paper["model"]["d_t"], paper["training"]["max_epochs"]) == (64, 32, 100)
    assert (cpu["model"]["d_x"], cpu["model"]["d_t"]) == (16, 8)
    # the cpu preset: the headline pair by default, all training stories, at least three seeds, the extra rows
    assert cpu["default_pairs"] == ["h4_l2"] and len(cpu["seeds"]) >= 3 and cpu["budget"]["train_subset"] is None
    causal = run_config(cpu, "h4_l2", "four_tensor", variant="causal")["model"]
    copy = run_config(cpu, "h4_l2", "four_tensor", variant="causal_copy")["model"]
    assert causal["temporal_causal"] and not causal["copy_path"] and copy["temporal_causal"] and copy["copy_path"]
    marker = run_config(cpu, "h4_l2", "baseline", variant="marker")["model"]
    assert marker["target_marker"] and not run_config(cpu, "h4_l2", "baseline")["model"]["target_marker"]
    scaled = run_config(cpu, "h4_l2", "baseline", variant="marker_scaled")["model"]
    assert scaled["target_marker"] and scaled["scale_embeddings"] and not marker["scale_embeddings"]
    # the count-smoothed baseline changes its loss and nothing else of the training section
    smoothed = run_config(cpu, "h4_l2", "baseline", variant="count_smoothed", seed=2)
    plain = run_config(cpu, "h4_l2", "baseline", seed=2)
    assert config_differences(plain["training"], smoothed["training"]) == [
        "label_smoothing: 0.0 -> 0.4",
        "label_smoothing_prior: 'uniform' -> 'counts'",
    ]
    assert smoothed["model"] == plain["model"]
    facts = {"train_subset": None, "train_windows": 20000, "validation_windows": 3742, "vocab_size": 9}
    ref, row = {"config": plain, **facts}, {"config": smoothed, **facts}
    intended = cpu["variants"]["count_smoothed"]["training"]
    assert run_mismatches(ref, row, intended) == [] and len(run_mismatches(ref, row)) == 2
    row["config"] = run_config(cpu, "h4_l2", "baseline", variant="count_smoothed", seed=1)
    assert run_mismatches(ref, row, intended) == ["seed: 2 -> 1"]  # what the variant does not change still counts
    both = run_config(cpu, "h4_l2", "baseline", variant="marker_scaled_count_smoothed", seed=2)
    assert both["model"] == run_config(cpu, "h4_l2", "baseline", variant="marker_scaled", seed=2)["model"]
    assert both["training"] == smoothed["training"]  # the two changes together, nothing else
    tensor = run_config(cpu, "h4_l2", "four_tensor", variant="count_smoothed_4t", seed=2)
    assert tensor["model"] == run_config(cpu, "h4_l2", "four_tensor", seed=2)["model"]
    assert tensor["training"] == smoothed["training"]  # the baseline's loss on the 4-tensor model, nothing else
    copied = run_config(cpu, "h4_l2", "baseline", variant="copy_smoothed", seed=2)
    assert copied["model"] == plain["model"] and config_differences(plain["training"], copied["training"]) == [
        "label_smoothing: 0.0 -> 0.5",
        "label_smoothing_prior: 'uniform' -> 'counts_copy'",
    ]
    assert paper["budget"] == {"train_subset": None, "max_minutes": None}


# ----- bad input: an error before any training -----
def test_unknown_preset_or_pair_and_bad_data_are_errors_before_training(
    data_dir, preset, tmp_path, monkeypatch, capsys
):
    no_training(monkeypatch)
    only_train = tmp_path / "only_train"
    only_train.mkdir()
    shutil.copy(data_dir / TRAIN_NAME, only_train / TRAIN_NAME)
    cases = [
        (["--preset", "no_such_preset", "--data", str(data_dir)], "unknown preset 'no_such_preset'"),
        (["--preset", str(tmp_path / "missing.yaml"), "--data", str(data_dir)], "not found"),
        (["--preset", str(preset), "--data", str(data_dir), "--pairs", "h1_l1,h9_l9"], "unknown pair(s) ['h9_l9']"),
        (["--preset", "cpu", "--data", str(data_dir), "--pairs", "h1_l1"], "known pairs: h2_l2,h4_l2,h4_l3"),
        (["--preset", str(preset), "--data", str(only_train)], "no validation file"),
        (["--preset", str(preset), "--data", str(tmp_path / "nowhere")], "no such folder"),
        (["--preset", str(preset), "--data", str(data_dir), "--train-subset", "0"], "positive number of stories"),
        (["--preset", str(preset), "--data", str(data_dir), "--max-minutes", "-1"], "positive number of minutes"),
    ]
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        assert bench.main(args + ["--out", str(out), "--no-progress"]) == 2, args
        assert message in capsys.readouterr().err, args
        assert not (out / "runs").exists() and not (out / "results.json").exists()


def test_a_budget_below_one_epoch_is_an_error_before_training(data_dir, preset, tmp_path, monkeypatch, capsys):
    no_training(monkeypatch)
    out = tmp_path / "out"
    assert (
        bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--max-minutes", "0.0001"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--max-minutes 0.0001 is too small" in err and "h1_l1_four_tensor" in err and "h2_l1_baseline" in err
    assert not out.exists()


def test_the_budget_is_split_across_the_runs_left_and_leaves_room_for_one_epoch(
    data_dir, preset, tmp_path, monkeypatch
):
    """Four runs, 4 minutes, 10 s estimated per epoch: the first run's share is ~60 s and it is handed 50 s; a run
    that ends at once leaves its time to the later ones (shares ~80, ~120, ~240 s)."""
    calls = []
    monkeypatch.setattr(bench, "estimate_epoch_seconds", lambda config, *a, **k: 10.0)
    monkeypatch.setattr(
        train_mod,
        "train",
        lambda config, data, out, **kw: calls.append(kw["max_minutes"] * 60) or Path(out).mkdir(parents=True),
    )
    monkeypatch.setattr(bench, "write_reports", lambda results, out: None)
    clock = iter(range(1000, 10**6))  # the benchmark's clock: one second per reading, whatever the machine's load
    monkeypatch.setattr(
        bench, "time", types.SimpleNamespace(monotonic=lambda: float(next(clock)), perf_counter=time.perf_counter)
    )
    results = bench.run_benchmark(
        bench.BenchmarkSettings(preset, data_dir, tmp_path / "out", max_minutes=4.0, progress=False)
    )
    # each reading of the clock is one second of set-up or bookkeeping, which counts against the budget: every share
    # is a few seconds under the ideal one (60, 80, 120, 240 s less the estimated epoch), never above it
    assert len(calls) == 4 and all(ideal - 15 < c <= ideal for c, ideal in zip(calls, [50, 70, 110, 230]))
    assert 58 < results["settings"]["share_minutes"] * 60 < 60


def test_a_time_budget_is_refused_with_several_processes(data_dir, preset, tmp_path, monkeypatch, capsys):
    no_training(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "out"
    assert bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--max-minutes", "30"]) == 2
    assert "several processes" in capsys.readouterr().err and not out.exists()


def test_refuses_an_output_folder_in_use_without_resume(finished, data_dir, preset, tmp_path, monkeypatch, capsys):
    no_training(monkeypatch)
    out = tmp_path / "copy"
    shutil.copytree(finished[0], out)
    before = (out / "results.json").read_text()
    assert bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert (out / "results.json").read_text() == before


# ----- --resume -----
def test_resume_skips_finished_runs_and_resumes_interrupted_ones(finished, data_dir, preset, tmp_path, monkeypatch):
    out = tmp_path / "copy"
    shutil.copytree(finished[0], out)
    first = json.loads((out / "results.json").read_text())
    calls = []
    real = train_mod.train

    def counting(config, data, run_out, **kw):
        calls.append((Path(run_out).name, kw["resume"]))
        return real(config, data, run_out, **kw)

    monkeypatch.setattr(train_mod, "train", counting)
    args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--resume", "--no-progress"]
    assert bench.main(args) == 0
    assert calls == []  # every run had finished
    again = json.loads((out / "results.json").read_text())
    assert [r["val_last_ce"] for r in again["runs"]] == [r["val_last_ce"] for r in first["runs"]]
    assert all(r["skipped_by_resume"] for r in again["runs"])

    # an interrupted run (no summary.json; last/ holds its epoch 2) is resumed, here under a higher epoch cap
    (out / "runs" / "h2_l1_baseline" / "summary.json").unlink()
    assert bench.main(args + ["--max-epochs", "3"]) == 0
    assert calls == [("h2_l1_baseline", True)]
    resumed = summary(out, "h2_l1_baseline")
    assert (resumed["resumed_from_epoch"], resumed["last_epoch"]) == (2, 3)
    final = json.loads((out / "results.json").read_text())
    assert [r["skipped_by_resume"] for r in final["runs"]] == [True, True, True, False]
    assert final["runs"][3]["last_epoch"] == 3 and len(final["runs"][3]["history"]) == 3
    # the finished runs kept their cap of 2: the pair is reported as not matched, not silently mixed
    pair = {p["pair"]: p for p in final["pairs"]}["h2_l1"]
    assert not pair["matched"] and pair["mismatches"] == ["max_epochs: 2 -> 3"]
    assert "h2_l1: the two runs are NOT matched" in (out / "results.md").read_text()


def test_resume_refuses_a_different_run_before_training(finished, data_dir, preset, tmp_path, monkeypatch, capsys):
    no_training(monkeypatch)
    out = tmp_path / "copy"
    shutil.copytree(finished[0], out)
    (out / "runs" / "h1_l1_baseline" / "summary.json").unlink()
    changed = json.loads(json.dumps(TINY_PRESET))
    changed["training"]["lr"] = 1e-3
    other = write_preset(tmp_path / "other.yaml", changed)
    assert bench.main(["--preset", str(other), "--data", str(data_dir), "--out", str(out), "--resume"]) == 2
    assert "training.lr" in capsys.readouterr().err


# ----- attention parameters and the variants of a preset -----
TINY_SHAPE = {"d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 2}  # d = 8, d_H = 4


@pytest.mark.parametrize(
    "extra, by_hand",
    [
        ({"type": "four_tensor"}, 2 * 3 * 2 * 8 * 8),  # 3 maps x H heads x d^2 per layer, no output map
        # per map and head: core 2*1*3*2 + factors 4*2 + 2*1 + 4*3 + 2*2
        ({"type": "four_tensor", "qkv_form": "tucker", "tucker_ranks": [2, 1, 3, 2]}, 2 * 6 * (12 + 26)),
        (
            {"type": "four_tensor", "qkv_form": "tucker", "tucker_ranks": [2, 1, 3, 2], "tucker_shared_factors": True},
            2 * (6 * 12 + 26),
        ),
        ({"type": "baseline"}, 2 * 4 * 8 * 8),  # W_Q, W_K, W_V, W_O
        ({"type": "baseline", "attention": "gqa", "n_kv_heads": 1}, 2 * (2 * 8 * 8 + 2 * 1 * 4 * 8)),
        # W_DQ 8x2, W_UQ 2x8, W_DK, W_DV 8x2, W_UK, W_UV 2x8, W_O 8x8
        ({"type": "baseline", "attention": "mla", "mla_kv_rank": 2, "mla_q_rank": 2}, 2 * (16 + 16 + 32 + 32 + 64)),
        # W and W~: n_H r_1 + d r_2 + d r_3 + r_1 r_2 r_3
        (
            {"type": "baseline", "attention": "tucker", "tucker_ranks": [2, 3, 3]},
            2 * 2 * (2 * 2 + 8 * 3 + 8 * 3 + 2 * 3 * 3),
        ),
    ],
)
def test_attention_parameter_count_by_hand(extra, by_hand):
    section = {**TINY_SHAPE, **extra}
    model = build_model(section, 30)
    assert attn.attention_parameter_count(model) == by_hand
    assert attn.config_attention_parameters(section, 30) == by_hand  # the same count on the meta device
    # only the attention is counted: the rest of the model is the reference's, parameter for parameter
    reference = build_model({**TINY_SHAPE, "type": extra["type"]}, 30)
    assert count_parameters(model) - by_hand == count_parameters(reference) - attn.attention_parameter_count(reference)


def test_attention_parameter_count_refuses_other_models():
    with pytest.raises(TypeError, match="FourTensorModel, BaselineModel"):
        attn.attention_parameter_count(torch.nn.Linear(2, 2))


def test_pareto_front_keeps_the_undominated_points():
    points = [(1, 5.0), (2, 4.0), (3, 4.5), (4, 3.0), (2, 4.0), (5, 3.0)]
    assert attn.pareto_front(points) == [True, True, False, True, True, False]


def test_target_needs_a_tucker_4_tensor_run_five_times_smaller_within_one_percent():
    def row(variant, model_type, kind, ratio, delta):
        return {
            "pair": "p",
            "variant": variant,
            "model_type": model_type,
            "kind": kind,
            "attention_ratio": ratio,
            "delta_percent": delta,
        }

    rows = [
        row("reference", "four_tensor", "dense", 1.0, 0.0),
        row("small", "four_tensor", "tucker", 4.9, 0.1),
        row("base", "baseline", "tucker", 9.0, -2.0),
        row("a", "four_tensor", "tucker", 6.0, 1.5),
        row("b", "four_tensor", "tucker", 10.0, 0.8),
    ]
    [check] = attn.target_check(rows)
    assert check["candidates"] == ["a", "b"] and check["best"] == "b" and check["met"] is True
    [check] = attn.target_check(rows[:4])
    assert check["best"] == "a" and check["met"] is False
    [check] = attn.target_check(rows[:3])
    assert check["met"] is None and check["best"] is None


@pytest.fixture(scope="module")
def attention_finished(data_dir, tmp_path_factory):
    """The variants machinery end to end on the tiny fixture: (out folder, results.json)."""
    preset = write_preset(tmp_path_factory.mktemp("preset") / "tiny_attention.yaml", TINY_ATTENTION_PRESET)
    out = tmp_path_factory.mktemp("bench") / "attention"
    assert bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--no-progress"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_variants_train_after_the_pair_and_are_matched_with_their_reference(attention_finished):
    out, results = attention_finished
    assert [(r["pair"], r["model_type"]) for r in results["runs"]] == [("h2_l1", "four_tensor"), ("h2_l1", "baseline")]
    spec = TINY_ATTENTION_PRESET["variants"]
    assert [v["variant"] for v in results["variants"]] == list(spec) and results["complete"]
    for v in results["variants"]:
        s = summary(out, f"h2_l1_{v['model_type']}_{v['variant']}")
        ref = summary(out, f"h2_l1_{v['model_type']}")
        assert v["model_type"] == spec[v["variant"]]["type"] and v["val_last_ce"] == s["best_metrics"]["val_last_ce"]
        for key, value in spec[v["variant"]]["model"].items():
            assert s["config"]["model"][key] == value
        assert s["config"]["training"] == ref["config"]["training"] and v["mismatches"] == []
        assert {k: s["config"]["model"][k] for k in SHARED_MODEL_KEYS} == {
            k: ref["config"]["model"][k] for k in SHARED_MODEL_KEYS
        }
        assert (s["train_windows"], s["validation_windows"]) == (ref["train_windows"], ref["validation_windows"])


def test_attention_rows_count_the_saved_models_and_compare_with_the_reference(attention_finished):
    out, results = attention_finished
    rows = results["attention"]
    assert [(r["model_type"], r["variant"]) for r in rows] == [
        ("four_tensor", "reference"),
        ("baseline", "reference"),
    ] + [(v["type"], name) for name, v in TINY_ATTENTION_PRESET["variants"].items()]
    refs = {r["model_type"]: r for r in rows if r["variant"] == "reference"}
    for r in rows:
        model = load_model(out / r["run_dir"] / "best")
        assert r["attention_parameters"] == attn.attention_parameter_count(model)
        assert r["parameters"] == count_parameters(model)
        ref = refs[r["model_type"]]
        assert r["attention_ratio"] == ref["attention_parameters"] / r["attention_parameters"]
        assert r["delta_percent"] == pytest.approx(100 * (r["val_last_ce"] - ref["val_last_ce"]) / ref["val_last_ce"])
    kinds = {r["variant"]: (r["kind"], r["attention"]) for r in rows if r["variant"] != "reference"}
    assert kinds == {
        "tucker_2_1": ("tucker", "Tucker (2, 1, 2, 1)"),
        "tucker_1_shared": ("tucker", "Tucker (1, 1, 1, 1), shared factors"),
        "gqa_kv1": ("gqa", "GQA n_KV 1"),
        "mla_dc2": ("mla", "MLA d_c 2, d_c^Q 2"),
        "tucker_2_3_3": ("tucker", "Tucker (2, 3, 3)"),
    }
    assert all(r["attention_ratio"] > 1 for r in rows if r["variant"] != "reference")

    # the Pareto flags: no flagged run is dominated, every other run is dominated by a flagged one
    def dominates(a, b):
        return (
            a["attention_parameters"] <= b["attention_parameters"]
            and a["val_last_ce"] <= b["val_last_ce"]
            and (a["attention_parameters"], a["val_last_ce"]) != (b["attention_parameters"], b["val_last_ce"])
        )

    front = [r for r in rows if r["pareto"]]
    assert front and all(not any(dominates(o, r) for o in rows) for r in front)
    assert all(any(dominates(f, r) for f in front) for r in rows if not r["pareto"])
    # the target: the shared-factor Tucker run is the only one >= 5x smaller
    [target] = results["attention_target"]
    shared = next(r for r in rows if r["variant"] == "tucker_1_shared")
    assert target["candidates"] == ["tucker_1_shared"] and target["met"] == (shared["delta_percent"] <= 1.0)


def test_variant_notes_name_the_seed_of_the_run_they_are_about():
    row = {"pair": "h4_l2", "model_type": "baseline", "variant": "scaled", "stop_reason": "max_epochs"}
    found = attention_report.notes(
        {"variants": [{**row, "seed": 1, "mismatches": ["max_epochs: 10 -> 7"]}, {**row, "seed": 2}]}
    )
    assert found == [
        "h4_l2 baseline scaled (seed 1): NOT matched with its reference: max_epochs: 10 -> 7",
        "h4_l2 baseline scaled (seed 2): its reference run has not finished; no ratio or Δ%.",
    ]
    assert attention_report.notes({"variants": [{**row, "mismatches": []}]}) == []  # matched: nothing to say


def test_the_per_epoch_plot_names_each_row_once_with_its_seeds():
    from matplotlib.figure import Figure

    from world_model.benchmark.report import plot_ls4_panel

    def run(model_type, seed, variant=None):
        history = [{"epoch": 1, "val_last_ce": 6.0 + seed}, {"epoch": 2, "val_last_ce": 5.9 + seed}]
        row = {
            "pair": "h2_l1",
            "model_type": model_type,
            "seed": seed,
            "n_heads": 2,
            "n_layers": 1,
            "parameters": 3_372_800,
        }
        return {**row, "variant": variant, "history": history, "best_epoch": 2, "val_last_ce": 5.9 + seed}

    rows = [run("four_tensor", 0), run("baseline", 0), run("four_tensor", 1), run("baseline", 1, "marker")]
    colors = {("four_tensor", None): "C0", ("baseline", None): "C1", ("baseline", "marker"): "C2"}
    floors = [{"floor": "unigram", "val_last_ce": 6.3}]
    ax = Figure().subplots()
    plot_ls4_panel(ax, "h2_l1", rows, colors, floors)
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "4-tensor (3.37M, seeds 0, 1)",
        "baseline (3.37M, seed 0)",
        "baseline marker (3.37M, seed 1)",
        "floor: unigram (6.30)",
    ]
    assert len([line for line in ax.get_lines() if line.get_linestyle() == "-"]) == 4  # every seed still drawn


def test_every_row_of_the_plot_has_a_colour_of_its_own_and_none_is_the_floors_gray():
    from matplotlib.colors import to_rgb

    from world_model.benchmark.report import row_colors

    runs = [{"model_type": "baseline", "variant": f"v{i}", "seed": s} for i in range(18) for s in (0, 1)]
    colors = row_colors([{"model_type": "four_tensor", "seed": 0}] + runs)
    assert len(colors) == 19 and colors[("baseline", "v0")] != colors[("four_tensor", None)]
    rgb = [to_rgb(c) for c in colors.values()]
    assert len(set(rgb[:18])) == 18 and rgb[18] == rgb[0]  # 18 rows before the first repeat
    assert all(max(c) - min(c) > 0.05 for c in rgb)  # no gray: that is the floors' colour


def test_attention_reports_table_and_figure(attention_finished):
    out, results = attention_finished
    md = (out / "results.md").read_text()
    assert "## L_S(4) against attention parameters" in md and "ls4_vs_attention_params.png" in md
    for r in results["attention"]:
        assert (
            f"| h2_l1 | {r['variant']} | {MODEL_LABELS[r['model_type']]} | {r['attention']} | "
            f"{r['attention_parameters']:,} | " in md
        )
    verdict = "MET" if results["attention_target"][0]["met"] else "NOT met"
    assert f"fewer attention parameters than the dense one within 1% of its L_S(4): {verdict}" in md
    assert (out / "ls4_vs_attention_params.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_preset_without_variants_has_no_attention_report(finished):
    out, results = finished
    assert "attention" not in results and "variants" not in results
    assert (
        not (out / attention_report.PARETO_FIGURE).exists()
        and "against attention parameters" not in (out / "results.md").read_text()
    )
    assert all(r["attention_parameters"] > 0 for r in results["runs"])


@pytest.mark.parametrize(
    "variant, error, message",
    [
        ({"type": "four_tensor", "pair": "h9_l9", "model": {}}, BenchmarkError, "not a pair of the preset"),
        ({"type": "gpt", "pair": "h2_l1", "model": {}}, BenchmarkError, "is not one of"),
        ({"type": "baseline", "pair": "h2_l1", "model": {"d_x": 8}}, BenchmarkError, "must not set ['d_x']"),
        (
            {"type": "baseline", "pair": "h2_l1", "model": {"tucker_ranks": [2, 3, 3]}},
            ConfigError,
            "applies only to attention='tucker'",
        ),
        (
            {"type": "four_tensor", "pair": "h2_l1", "model": {"qkv_form": "tucker", "tucker_ranks": [9, 1, 1, 1]}},
            ConfigError,
            "r_m = 9",
        ),
        ({"pair": "h2_l1"}, BenchmarkError, "must be {type, pair, model, training, versus, seeds}"),
        ({"type": "baseline", "pair": "h2_l1", "seeds": [0, 0]}, BenchmarkError, "'seeds' must be a list of distinct"),
        ({"type": "baseline", "pair": "h2_l1", "seeds": [0, 1]}, BenchmarkError, "needs the preset's 'seeds:' section"),
        ({"type": "baseline", "pair": "h2_l1", "versus": "four_tensor"}, BenchmarkError, "must be a list of row names"),
        (
            {"type": "baseline", "pair": "h2_l1", "versus": ["no_such_row"]},
            BenchmarkError,
            "versus 'no_such_row' is not",
        ),
        ({"type": "baseline", "pair": "h2_l1", "versus": ["bad"]}, BenchmarkError, "versus 'bad' is not another row"),
        ({"type": "baseline", "pair": "h2_l1", "training": {"lr": 0.1}}, BenchmarkError, "not ['lr']"),
        (
            {"type": "baseline", "pair": "h2_l1", "training": {"label_smoothing_prior": "counts"}},
            ConfigError,
            "needs training.label_smoothing > 0",
        ),
    ],
)
def test_a_bad_variant_is_an_error_when_the_preset_is_read(tmp_path, variant, error, message):
    preset = json.loads(json.dumps(TINY_ATTENTION_PRESET))
    preset["variants"] = {"bad": variant}
    with pytest.raises(error) as info:
        load_preset(write_preset(tmp_path / "bad.yaml", preset))
    assert message in str(info.value)


def test_report_only_reads_light_run_files_and_trains_nothing(finished, data_dir, preset, tmp_path, monkeypatch):
    no_training(monkeypatch)
    out = tmp_path / "light"
    shutil.copytree(finished[0], out)
    for folder in (out / "runs").iterdir():  # keep only what a commit of a finished run carries
        for heavy in ("best", "last"):
            shutil.rmtree(folder / heavy)
    (out / "runs" / "h2_l1_baseline" / "summary.json").unlink()  # an unfinished run
    (out / "results.json").unlink()
    args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--report-only", "--no-progress"]
    assert bench.main(args) == 0
    again = json.loads((out / "results.json").read_text())
    names = [r["run_dir"] for r in again["runs"]]
    assert names == ["runs/h1_l1_four_tensor", "runs/h1_l1_baseline", "runs/h2_l1_four_tensor"]
    assert not again["complete"]
    before = {r["run_dir"]: r for r in finished[1]["runs"]}
    for row in again["runs"]:  # the Story Cloze figures come from each run's story_cloze.json
        assert row["story_cloze"] == before[row["run_dir"]]["story_cloze"] is not None
        assert row["val_last_ce"] == before[row["run_dir"]]["val_last_ce"]


def test_report_only_keeps_the_machine_the_runs_were_timed_on(finished, data_dir, preset, tmp_path, monkeypatch):
    no_training(monkeypatch)
    out = tmp_path / "rewritten"
    shutil.copytree(finished[0], out)
    earlier = json.loads((out / "results.json").read_text())
    timed_on = {**earlier["machine"], "load_average_start": [9.5, 9.5, 9.5], "load_average_end": [8.5, 8.5, 8.5]}
    (out / "results.json").write_text(json.dumps({**earlier, "machine": timed_on}))
    args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--report-only", "--no-progress"]
    assert bench.main(args) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["machine"] == timed_on  # not this invocation's load: nothing was timed by it
    assert "load average [9.5, 9.5, 9.5] at the start, [8.5, 8.5, 8.5] at the end" in again["notes"][-1]
    (out / "results.json").write_text("{truncated")  # no readable record: this machine's, as for a first report
    assert bench.main(args) == 0
    assert json.loads((out / "results.json").read_text())["machine"]["load_average_start"] != [9.5, 9.5, 9.5]


def test_report_only_leaves_another_presets_report_as_it_was(finished, data_dir, preset, tmp_path, monkeypatch, capsys):
    import hashlib

    no_training(monkeypatch)
    out = tmp_path / "other"
    shutil.copytree(finished[0], out)
    earlier = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**earlier, "preset": {**earlier["preset"], "name": "another"}}))
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}
    for flag in ("--report-only", "--resume"):
        args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), flag, "--no-progress"]
        assert bench.main(args) == 2
        assert "holds the report of preset 'another'" in capsys.readouterr().err
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()} == digests


def test_the_earlier_invocation_note_names_the_variants_too(attention_finished, data_dir, tmp_path, monkeypatch):
    no_training(monkeypatch)
    out = tmp_path / "again"
    shutil.copytree(attention_finished[0], out)
    preset = write_preset(tmp_path / "tiny_attention.yaml", TINY_ATTENTION_PRESET)
    args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--report-only", "--no-progress"]
    assert bench.main(args) == 0
    [note] = [n for n in json.loads((out / "results.json").read_text())["notes"] if "earlier invocation" in n]
    named = note.split(": ", 1)[1].split(";")[0].split(", ")
    assert named == ["h2_l1 4-tensor", "h2_l1 baseline"] + [
        f"h2_l1 {MODEL_LABELS[v['type']]} {name}" for name, v in TINY_ATTENTION_PRESET["variants"].items()
    ]
    assert "--report-only" in note


def test_a_run_made_before_a_setting_existed_reads_back_with_its_default(
    finished, data_dir, preset, tmp_path, monkeypatch
):
    no_training(monkeypatch)
    out = tmp_path / "older"
    shutil.copytree(finished[0], out)
    path = out / "runs" / "h1_l1_baseline" / "summary.json"
    older = json.loads(path.read_text())
    for key in ("adam_eps", "target_sentences"):  # settings added to TrainingConfig after such a run was made
        del older["config"]["training"][key]
    path.write_text(json.dumps(older))
    args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--report-only", "--no-progress"]
    assert bench.main(args) == 0
    again = json.loads((out / "results.json").read_text())
    row = next(r for r in again["runs"] if r["run_dir"] == "runs/h1_l1_baseline")
    assert (row["config"]["training"]["adam_eps"], row["config"]["training"]["target_sentences"]) == (1e-8, "last")
    pair = next(p for p in again["pairs"] if p["pair"] == "h1_l1")
    assert pair["matched"] and pair["mismatches"] == []


def test_seeds_train_every_row_once_per_seed_and_pair_the_differences(data_dir, tmp_path, capsys):
    preset = write_preset(
        tmp_path / "seeds.yaml",
        {
            **TINY_PRESET,
            "pairs": {"h1_l1": {"n_heads": 1, "n_layers": 1}},
            "seeds": [3, 4],
            "training": {**TINY_PRESET["training"], "max_epochs": 1},
            "variants": {
                "causal": {"type": "four_tensor", "pair": "h1_l1", "model": {"temporal_causal": True}},
                "marker": {
                    "type": "baseline",
                    "pair": "h1_l1",
                    "model": {"target_marker": True},
                    "versus": ["causal", "four_tensor"],
                },
            },
        },
    )
    out = tmp_path / "out"
    assert bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(
        f"h1_l1_{m}_s{s}" for m in ("four_tensor", "baseline", "four_tensor_causal", "baseline_marker") for s in (3, 4)
    )
    for name in ("h1_l1_four_tensor_s3", "h1_l1_four_tensor_causal_s4"):
        assert summary(out, name)["config"]["training"]["seed"] == int(name[-1])
    assert summary(out, "h1_l1_baseline_marker_s3")["config"]["model"]["target_marker"]
    rows = {(r["model_type"], r["variant"]): r for r in results["seed_summary"]}
    four = [r["val_last_ce"] for r in results["runs"] if r["model_type"] == "four_tensor"]
    assert rows[("four_tensor", None)]["val_last_ce"]["mean"] == pytest.approx(sum(four) / 2)
    paired = {p["comparison"]: p for p in results["paired"]}
    base = [r["val_last_ce"] for r in results["runs"] if r["model_type"] == "baseline"]
    diff = paired["baseline - 4-tensor"]
    assert diff["seeds"] == [3, 4] and diff["differences"] == pytest.approx([b - f for b, f in zip(base, four)])
    assert diff["ci95"][0] < diff["mean"] < diff["ci95"][1]
    assert "four_tensor reference - causal" in paired
    marked = [v["val_last_ce"] for v in results["variants"] if v["variant"] == "marker"]
    assert paired["baseline reference - marker"]["differences"] == pytest.approx([b - m for b, m in zip(base, marked)])
    causal = [v["val_last_ce"] for v in results["variants"] if v["variant"] == "causal"]
    versus = paired["four_tensor causal - baseline marker"]["differences"]
    assert versus == pytest.approx([c - m for c, m in zip(causal, marked)])
    versus = paired["four_tensor reference - baseline marker"]["differences"]
    assert versus == pytest.approx([f - m for f, m in zip(four, marked)])
    md = (out / "results.md").read_text()
    assert "## Over seeds" in md
    shared = next(line for line in md.splitlines() if line.startswith("Settings shared"))
    assert "seeds 3, 4" in shared and "seed 1" not in shared  # the seeds run, not the preset's default seed
    for seed in (3, 4):  # the notes name the seed of each pair they speak of
        assert sum(note.startswith(f"h1_l1 (seed {seed}): Δ L_S(4)") for note in results["notes"]) == 1
    for r in results["runs"] + results["variants"]:  # a one-epoch cap: every run, variants too, is flagged as capped
        assert (r["stop_reason"], r["best_epoch"], r["last_epoch"]) == ("max_epochs", 1, 1)
        capped = (
            f"{row_label(r)} (seed {r['seed']}): stopped by the epoch cap (1) before the section 8.2 rule fired; its "
            "selected epoch 1 is the minimum so far (the last epoch: still improving)."
        )
        assert results["notes"].count(capped) == 1
    printed = capsys.readouterr().out  # the command's last lines: every run (variants too) by seed, then the means
    for seed in (3, 4):
        assert f"h1_l1 4-tensor causal (seed {seed}): " in printed and f"h1_l1 baseline (seed {seed}): " in printed
    mean = rows[("four_tensor", None)]["val_last_ce"]["mean"]
    assert f"h1_l1 4-tensor, seeds 3, 4: L_S(4) {mean:.4f} ± " in printed
    assert f"h1_l1 baseline - 4-tensor, seeds 3, 4: mean {diff['mean']:+.4f}, 95% interval [" in printed


def test_precision_flag_sets_every_runs_training_precision(data_dir, preset, tmp_path, monkeypatch):
    configs = []
    monkeypatch.setattr(bench, "estimate_epoch_seconds", lambda config, *a, **k: 1.0)
    monkeypatch.setattr(
        train_mod, "train", lambda config, data, out, **kw: configs.append(config) or Path(out).mkdir(parents=True)
    )
    monkeypatch.setattr(bench, "write_reports", lambda results, out: None)
    bench.run_benchmark(bench.BenchmarkSettings(preset, data_dir, tmp_path / "out", progress=False, precision="bf16"))
    assert len(configs) == 4 and {c["training"]["precision"] for c in configs} == {"bf16"}
    with pytest.raises(ValueError, match="precision"):
        bench.run_benchmark(
            bench.BenchmarkSettings(preset, data_dir, tmp_path / "other", progress=False, precision="fp16")
        )


def test_rows_flag_trains_only_the_named_rows_and_rejects_unknown_ones(data_dir, tmp_path, monkeypatch):
    preset = write_preset(
        tmp_path / "rows.yaml",
        {
            **TINY_PRESET,
            "pairs": {"h1_l1": {"n_heads": 1, "n_layers": 1}},
            "seeds": [3, 4],
            "variants": {"causal": {"type": "four_tensor", "pair": "h1_l1", "model": {"temporal_causal": True}}},
        },
    )
    trained = []
    monkeypatch.setattr(bench, "estimate_epoch_seconds", lambda config, *a, **k: 1.0)
    monkeypatch.setattr(
        train_mod,
        "train",
        lambda config, data, out, **kw: trained.append(Path(out).name) or Path(out).mkdir(parents=True),
    )
    monkeypatch.setattr(bench, "write_reports", lambda results, out: None)
    args = ["--preset", str(preset), "--data", str(data_dir), "--no-progress"]
    assert bench.main([*args, "--out", str(tmp_path / "out"), "--rows", "causal,baseline"]) == 0
    assert trained == [
        "h1_l1_baseline_s3",
        "h1_l1_four_tensor_causal_s3",
        "h1_l1_baseline_s4",
        "h1_l1_four_tensor_causal_s4",
    ]
    for bad, message in (
        ("gpt", "unknown row(s) ['gpt'] for preset 'rows'; known rows: four_tensor,baseline,causal"),
        ("baseline,baseline", "--rows names a row twice"),
    ):
        with pytest.raises(BenchmarkError, match=re.escape(message)):
            bench.run_benchmark(bench.BenchmarkSettings(preset, data_dir, tmp_path / "other", progress=False, rows=bad))


def test_pareto_labels_stay_inside_the_axes_and_clear_of_each_other_and_of_the_points():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The converged attention benchmark's crowd: six baseline rows within 3x in parameters and 0.1 nats.
    xy = [(6784, 6.17), (13264, 6.11), (20544, 6.12), (45056, 6.14), (66624, 6.15), (81920, 6.16), (81920, 6.07)]
    xy += [(98304, 6.14), (131072, 6.11), (393280, 6.28), (39552, 5.94), (69600, 5.82), (182400, 5.78)]
    labels = [(f"attention form number {i}", p) for i, p in enumerate(xy)]
    fig = Figure(figsize=(7, 5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(*zip(*xy), linestyle="", marker="s")
    ax.set_xscale("log")
    fig.tight_layout()
    attention_report.place_labels(ax, labels)

    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert [t.get_text() for t in ax.texts] == [text for text, _ in labels]  # one label a point, none left over
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    assert not any(attention_report._overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    points = [ax.transData.transform(p) for p in xy]
    for i, box in enumerate(boxes):  # no label covers another point
        assert not any(box.x0 < x < box.x1 and box.y0 < y < box.y1 for j, (x, y) in enumerate(points) if j != i)

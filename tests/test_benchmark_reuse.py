"""Benchmark presets with per-row seeds (`reference_seeds:`, a variant's `seeds:`) and runs taken over from another
benchmark's run folder (`reuse_runs:`, world_model/benchmark/reuse.py); on the tiny ROCStories fixture of
tests/test_train.py with toy presets."""

import json
from pathlib import Path

import pytest

from tests.test_benchmark import TINY_PRESET, write_preset
from tests.test_train import make_data
from world_model.benchmark import table5 as bench
from world_model.benchmark.preset import MODELS, BenchmarkError, choose_seeds, load_preset
from world_model.benchmark.reuse import LIGHT_FILES, reuse_notes
from world_model.benchmark.runs import REUSED_FILE, plan_runs
from world_model.training import train as train_mod

ONE_PAIR = {"h1_l1": {"n_heads": 1, "n_layers": 1}}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("rocstories"))


# ----- per-row seeds -----
def seeded_preset(**extra) -> dict:
    return {
        **TINY_PRESET,
        "pairs": ONE_PAIR,
        "training": {**TINY_PRESET["training"], "max_epochs": 1},
        "seeds": [0],
        "reference_seeds": [0, 1],
        "variants": {
            "gqa": {"type": "baseline", "pair": "h1_l1", "model": {"attention": "gqa", "n_kv_heads": 1}},
            "mla": {
                "type": "baseline",
                "pair": "h1_l1",
                "model": {"attention": "mla", "mla_kv_rank": 2},
                "seeds": [0, 2],
            },
        },
        **extra,
    }


def test_each_row_runs_its_own_seeds_seed_by_seed_and_seeds_flag_replaces_them(tmp_path):
    spec = load_preset(write_preset(tmp_path / "seeded.yaml", seeded_preset()))
    seeds = choose_seeds(spec, None)
    assert seeds == {"four_tensor": [0, 1], "baseline": [0, 1], "gqa": [0], "mla": [0, 2]}
    runs = plan_runs(spec, ["h1_l1"], seeds, None, tmp_path / "out")
    assert [r.name for r in runs] == [
        "h1_l1_four_tensor_s0",
        "h1_l1_baseline_s0",
        "h1_l1_baseline_gqa_s0",
        "h1_l1_baseline_mla_s0",
        "h1_l1_four_tensor_s1",
        "h1_l1_baseline_s1",
        "h1_l1_baseline_mla_s2",
    ]
    assert all(r.config["training"]["seed"] == r.seed for r in runs)
    assert set(map(tuple, choose_seeds(spec, [5]).values())) == {(5,)}  # --seeds: every row, its own lists too
    with pytest.raises(BenchmarkError, match="--seeds must be distinct"):
        choose_seeds(spec, [1, 1])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seeds": None}, "'reference_seeds' needs the preset's 'seeds:' section"),
        ({"reference_seeds": [1, -1]}, "'reference_seeds' must be a list of distinct integers >= 0"),
        ({"reuse_runs": 3}, "'reuse_runs' must be the path of a folder"),
    ],
)
def test_bad_seed_lists_and_reuse_folders_are_errors_when_the_preset_is_read(tmp_path, change, message):
    preset = seeded_preset(**change)
    preset = {k: v for k, v in preset.items() if v is not None}
    with pytest.raises(BenchmarkError, match=message):
        load_preset(write_preset(tmp_path / "bad.yaml", preset))


# ----- runs taken over from another benchmark -----
@pytest.fixture(scope="module")
def earlier(data_dir, tmp_path_factory):
    """A finished benchmark of the pair's two runs, seeds 0 and 1: the runs another preset may take over."""
    preset = {
        **TINY_PRESET,
        "pairs": ONE_PAIR,
        "seeds": [0, 1],
        "training": {**TINY_PRESET["training"], "max_epochs": 1},
    }
    path = write_preset(tmp_path_factory.mktemp("preset") / "earlier.yaml", preset)
    out = tmp_path_factory.mktemp("bench") / "earlier"
    assert bench.main(["--preset", str(path), "--data", str(data_dir), "--out", str(out), "--no-progress"]) == 0
    return out


def counting_train(monkeypatch) -> list[str]:
    trained, real = [], train_mod.train

    def counting(config, data, run_out, **kw):
        trained.append(Path(run_out).name)
        return real(config, data, run_out, **kw)

    monkeypatch.setattr(train_mod, "train", counting)
    return trained


def test_identical_finished_runs_are_taken_over_and_the_rest_trained(earlier, data_dir, tmp_path, monkeypatch, capsys):
    trained = counting_train(monkeypatch)
    preset = write_preset(tmp_path / "reusing.yaml", seeded_preset(reuse_runs=str(earlier / "runs")))
    out = tmp_path / "out"
    assert bench.main(["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--no-progress"]) == 0
    taken = [f"h1_l1_{m}_s{s}" for s in (0, 1) for m in MODELS]
    assert trained == ["h1_l1_baseline_gqa_s0", "h1_l1_baseline_mla_s0", "h1_l1_baseline_mla_s2"]
    for name in taken:
        folder = out / "runs" / name
        assert sorted(p.name for p in folder.iterdir()) == sorted([*LIGHT_FILES, REUSED_FILE])  # no checkpoint
        assert (folder / "summary.json").read_text() == (earlier / "runs" / name / "summary.json").read_text()
    results = json.loads((out / "results.json").read_text())
    assert results["reuse"]["reused"] == taken and results["reuse"]["refused"] == {}
    reused = {r["run_dir"]: r["reused_from"] for r in results["runs"]}
    assert reused == {f"runs/{name}": str((earlier / "runs" / name).resolve()) for name in taken}
    before = {r["run_dir"]: r["val_last_ce"] for r in json.loads((earlier / "results.json").read_text())["runs"]}
    assert {r["run_dir"]: r["val_last_ce"] for r in results["runs"]} == before
    assert any(
        n.startswith("Taken over from another benchmark") and "runs/h1_l1_baseline_s1 from" in n
        for n in results["notes"]
    )
    assert not any("earlier invocation" in n for n in results["notes"])
    # a later --resume finds them finished in OUT, and still knows where they came from
    trained.clear()
    args = ["--preset", str(preset), "--data", str(data_dir), "--out", str(out), "--resume", "--no-progress"]
    capsys.readouterr()
    assert bench.main(args) == 0 and trained == []
    assert f"h1_l1_baseline_s1: taken over from {(earlier / 'runs' / 'h1_l1_baseline_s1').resolve()}; skipped" in (
        capsys.readouterr().out
    )
    again = json.loads((out / "results.json").read_text())
    assert {r["run_dir"]: r["reused_from"] for r in again["runs"]} == reused and again["reuse"]["reused"] == []


def test_a_run_whose_settings_differ_is_not_taken_over(earlier, data_dir, tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(bench, "estimate_epoch_seconds", lambda config, *a, **k: 1.0)
    monkeypatch.setattr(
        train_mod, "train", lambda config, data, out, **kw: trained.append(Path(out).name) or Path(out).mkdir()
    )
    monkeypatch.setattr(bench, "write_reports", lambda results, out: None)
    changed = seeded_preset(reuse_runs=str(earlier / "runs"))
    changed["training"] = {**changed["training"], "max_epochs": 2}  # the epoch cap too: the run would differ
    preset = write_preset(tmp_path / "other.yaml", changed)
    results = bench.run_benchmark(bench.BenchmarkSettings(preset, data_dir, tmp_path / "out", progress=False))
    assert results["reuse"]["reused"] == []
    assert sorted(results["reuse"]["refused"]) == sorted(f"h1_l1_{m}_s{s}" for s in (0, 1) for m in MODELS)
    assert results["reuse"]["refused"]["h1_l1_baseline_s1"] == ["config.training.max_epochs: 1 -> 2"]
    note = f"h1_l1_baseline_s1: NOT taken over from {results['reuse']['source']}, its run differs: "
    assert note + "config.training.max_epochs: 1 -> 2." in reuse_notes({"runs": [], "reuse": results["reuse"]})
    assert trained[:2] == ["h1_l1_four_tensor_s0", "h1_l1_baseline_s0"]  # trained again, not copied
    assert not (tmp_path / "out" / "runs" / "h1_l1_baseline_s0" / "summary.json").exists()
    # another training subset (so other windows) is refused as well
    trained.clear()
    results = bench.run_benchmark(
        bench.BenchmarkSettings(
            write_preset(tmp_path / "subset.yaml", seeded_preset(reuse_runs=str(earlier / "runs"))),
            data_dir,
            tmp_path / "subset",
            train_subset=20,
            progress=False,
        )
    )
    refused = results["reuse"]["refused"]["h1_l1_four_tensor_s0"]
    assert "train_subset: 24 -> 20" in refused and any(d.startswith("train_windows:") for d in refused)

"""The cpu benchmark's coherence rows: each seed's predictor scored alone and with a head, resumable, with paired
intervals against the paper's 4-tensor row (world_model.benchmark.coherence_rows), on tiny runs."""

import json

import pytest
import torch

from tests.test_train import make_data
from world_model.benchmark import coherence_rows as rows
from world_model.data.rocstories import build_vocabulary, load_corpus
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig

SEEDS = (0, 1)


def write_run(folder, vocab, seed: int, ls4: float) -> None:
    """A finished benchmark run: its selected checkpoint in best/ and its summary."""
    torch.manual_seed(seed)
    config = FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1, temporal_causal=True)
    FourTensorModel(config).save_pretrained(folder / "best", vocab=vocab)
    (folder / "summary.json").write_text(json.dumps({"best_epoch": 1, "best_metrics": {"val_last_ce": ls4}}))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("coherence_rows")
    data = make_data(root / "data")
    vocab = build_vocabulary(load_corpus(data))
    for seed in SEEDS:
        write_run(root / "runs" / f"h4_l2_four_tensor_causal_copy_s{seed}", vocab, seed, 5.0 + seed)
        reference = root / "reference" / "runs" / f"h4_l2_four_tensor_s{seed}"
        reference.mkdir(parents=True)
        cloze = {"val": {"summed": 0.4, "per_token": 0.6}, "test": {"summed": 0.45, "per_token": 0.5 + 0.1 * seed}}
        (reference / "story_cloze.json").write_text(json.dumps(cloze))
        (reference / "summary.json").write_text(json.dumps({"best_metrics": {"val_last_ce": 6.0}}))
    return root, data


def argv(root, data, out, seeds=SEEDS) -> list[str]:
    return [
        "--runs", str(root / "missing"), str(root / "runs"), "--data", str(data), "--out", str(out),
        "--seeds", *map(str, seeds), "--reference", str(root / "reference"),
    ]  # fmt: skip


def test_every_seed_is_scored_alone_and_with_a_head_and_paired(setup, tmp_path):
    root, data = setup
    out = tmp_path / "out"
    assert rows.main(argv(root, data, out)) == 0
    results = json.loads((out / "results.json").read_text())
    records = results["seeds"]
    assert [r["seed"] for r in records] == list(SEEDS) and [r["ls4"] for r in records] == [5.0, 6.0]
    for r in records:
        for scorer in ("predictor", "head"):
            assert 0 <= r[scorer]["test"] <= 1 and 0 <= r[scorer]["recall_at_1"] <= r[scorer]["recall_at_10"] <= 1
        assert (root / "runs" / r["run"] / "best" / "coherence_head.safetensors").is_file(), "the head is kept"
    paired = results["summary"]["paired"]
    head_minus = paired["head - predictor"]["test"]
    assert head_minus["differences"] == pytest.approx([r["head"]["test"] - r["predictor"]["test"] for r in records])
    versus_paper = paired["predictor - paper 4-tensor"]["test"]
    # the paper row is read with the rule of higher val accuracy: per token, 0.5 and 0.6
    assert versus_paper["differences"] == pytest.approx(
        [records[0]["predictor"]["test"] - 0.5, records[1]["predictor"]["test"] - 0.6]
    )
    assert len(versus_paper["ci95"]) == 2
    report = (out / "results.md").read_text()
    assert "| 1 | 6.000 |" in report and "head - paper 4-tensor" in report


def test_finished_seeds_are_skipped_and_a_missing_run_is_named(setup, tmp_path):
    root, data = setup
    out = tmp_path / "out"
    (out / "seeds").mkdir(parents=True)
    kept = {
        "seed": 0, "run": "kept", "ls4": 4.0, "best_epoch": 1,
        "predictor": {"rule": "summed", "test": 0.5, "val": 0.5, "recall_at_1": 0.1, "recall_at_10": 0.2, "mrr": 0.3},
        "head": {"rule": "summed", "test": 0.7, "val": 0.6, "recall_at_1": 0.1, "recall_at_10": 0.2, "mrr": 0.3, "epoch": 1},
    }  # fmt: skip
    (out / "seeds" / "causal_copy_s0.json").write_text(json.dumps(kept))
    assert rows.main(argv(root, data, out, seeds=(0,))) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [kept], "a finished seed is read back, not scored again"
    assert rows.main(argv(root, data, tmp_path / "other", seeds=(7,))) == 2

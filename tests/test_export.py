"""Exporting a run for shipping: fp16 weights, the sentence bank, and a model card that states the run's own
settings, its variants, the floors and Story Cloze."""

import json

import torch
from safetensors.torch import load_file

from tests.test_train import TINY, make_data
from world_model.models.registry import load_model
from world_model.training import export
from world_model.training.train import train


def test_export_writes_fp16_weights_bank_and_an_honest_card(tmp_path):
    data = make_data(tmp_path / "data")
    config = {
        "model": {**TINY["model"], "temporal_causal": True, "copy_path": True, "copy_dim": 3},
        "training": {
            **TINY["training"],
            "max_epochs": 1,
            "lr": 2e-3,
            "lr_schedule": "warmup_cosine",
            "warmup_steps": 2,
        },
    }
    train(config, data, tmp_path / "run", progress=False)
    out = tmp_path / "shipped"
    assert (
        export.main(
            ["--run", str(tmp_path / "run"), "--out", str(out), "--data", str(data), "--command", "python -m X"]
        )
        == 0
    )
    assert all(t.dtype == torch.float16 for t in load_file(out / "model.safetensors").values())
    assert load_model(out).config.copy_path  # the variant travels with the folder
    assert (out / "sentence_bank.json.gz").is_file()
    card = (out / "README.md").read_text()
    assert "temporal_causal, copy_path" in card and "lr 0.002" in card and "lr_schedule warmup_cosine" in card
    assert "AdamW 3e-4" not in card  # the settings come from the run, not from a template
    assert "position_unigram_copy" in card and "Story Cloze" in card
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert f"Selected epoch {summary['best_epoch']}" in card
    assert f"python -m world_model.training.export --run {tmp_path / 'run'} --out {out}" in card  # its own command

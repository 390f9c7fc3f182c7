"""Why full-rank Tucker (4, 128, 128) underfits at MHA's settings: the benchmark row retrained with one change.

    python probes/attention/tucker_full_rank.py VARIANT --data ../shared/data/rocstories \
        --out OUT [--epochs 3]

VARIANT is one of
    mha_init     every layer's Tucker attention starts as the exact Tucker form (`tucker_from_grouped`) of an MHA
                 layer initialised as the baseline initialises its MHA (N(0, 0.02), W_O at 0.02 / sqrt(2L)): the
                 run starts from MHA's function and MHA's weight scales, and differs from MHA only in how the
                 same maps are parametrised (products of factors and cores, each moved by Adam).
    score_scale  the softmax scale 1/sqrt(r_3) (the width the score's dot product runs over) in place of
                 1/sqrt(d_H); the scale is not a saved weight, so OUT's checkpoints reload at 1/sqrt(d_H): read
                 this variant from OUT/metrics.jsonl, which the run itself wrote.

The config is the benchmark run's own (`runs/h4_l2_baseline_tucker_4_128_128_s0/run.json`, lr 4e-3, seed 0);
OUT is an ordinary training folder (metrics.jsonl, summary.json, curves.png).
"""

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

import world_model.training.train as training
from world_model.models.attention_conversions import tucker_from_grouped
from world_model.models.attention_family import FamilyAttention

RUN = (
    Path(__file__).resolve().parents[2]
    / "results"
    / "benchmark"
    / "attention"
    / "runs"
    / "h4_l2_baseline_tucker_4_128_128_s0"
    / "run.json"
)


def mha_init(model: nn.Module) -> None:
    """Each block's Tucker attention set to the Tucker form of a freshly initialised MHA layer."""
    for block in model.blocks:
        attention = block.attention
        mha = FamilyAttention(replace(attention.config, kind="mha", tucker_ranks=None, tucker_ranks_out=None))
        p = mha.proj
        for linear in (p.W_q, p.W_k, p.W_v):
            nn.init.normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.normal_(p.W_o.weight, mean=0.0, std=0.02 / math.sqrt(2 * len(model.blocks)))
        attention.proj.load_state_dict(tucker_from_grouped(mha).proj.state_dict())


def score_scale(model: nn.Module) -> None:
    """Each block's softmax scale set to 1/sqrt(r_3)."""
    for block in model.blocks:
        block.attention.scale = 1.0 / math.sqrt(block.attention.config.tucker_ranks[2])


VARIANTS = {"mha_init": mha_init, "score_scale": score_scale}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--data", required=True, help="the ROCStories folder")
    parser.add_argument("--out", required=True, help="the run folder to write")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    config = json.loads(RUN.read_text())["config"]
    if config["model"]["tucker_ranks"] != [4, 128, 128]:
        raise SystemExit(f"{RUN} is not the full-rank Tucker row")
    build = training.build_model

    def build_variant(model_section: dict, vocab_size: int) -> nn.Module:
        model = build(model_section, vocab_size)
        with torch.no_grad():
            VARIANTS[args.variant](model)
        return model

    training.build_model = build_variant  # train() seeds the RNG, then builds: the change is seeded too
    training.train(config, args.data, args.out, max_epochs=args.epochs, progress=False)


if __name__ == "__main__":
    main()

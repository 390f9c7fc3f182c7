"""Probe (section 10): validate running averages of the weights beside the trained weights, every epoch.

After each optimizer step every average moves towards the weights by 1 - d_t, with d_t = min(d, (1 + t) / (10 + t))
at step t (the warm-up of the usual exponential moving average), for d in DECAYS. After each epoch's validation
the averages are validated the same way and one line per epoch goes to RUN.ema.jsonl: {"t": steps, "raw": the
run's own metrics, "<d>": the average's}. Training, selection and the checkpoints are the run's own, unchanged.
Everything else is `python -m world_model.training.train`, whose arguments this script takes:

    python probes/baseline/weight_average_probe.py --config CFG --data DATA --out RUN ...

A probe, not a setting of the package: it wraps the training loop's step and validation for this process only.
"""

from __future__ import annotations

import json
import sys

import torch

from world_model.training import loop
from world_model.training import train as train_module

DECAYS = (0.99, 0.995, 0.998)
AVERAGES: dict = {"t": 0, "weights": None}
plain_step, plain_validate = loop.optimizer_step, loop.validate


def step(trainer, batch, live):
    """loop.optimizer_step, then every average moved towards the new weights."""
    stats = plain_step(trainer, batch, live)
    weights = [p.detach() for p in trainer.model.parameters()]
    if AVERAGES["weights"] is None:
        AVERAGES["weights"] = {d: [w.clone() for w in weights] for d in DECAYS}
    AVERAGES["t"] += 1
    t = AVERAGES["t"]
    for d, average in AVERAGES["weights"].items():
        torch._foreach_lerp_(average, weights, 1 - min(d, (1 + t) / (10 + t)))
    return stats


def validate_with_averages(trainer, out_path: str):
    """loop.validate on the weights, then on each average (the weights put back after); appends the line."""
    metrics = plain_validate(trainer)
    params = list(trainer.model.parameters())
    weights = [p.detach().clone() for p in params]
    line = {"t": AVERAGES["t"], "raw": metrics}
    with torch.no_grad():
        for d, average in AVERAGES["weights"].items():
            torch._foreach_copy_(params, average)
            line[str(d)] = plain_validate(trainer)
        torch._foreach_copy_(params, weights)
    with open(out_path, "a") as f:
        f.write(json.dumps(line) + "\n")
    return metrics


if __name__ == "__main__":
    out = sys.argv[sys.argv.index("--out") + 1]
    loop.optimizer_step = step
    loop.validate = lambda trainer: validate_with_averages(trainer, out + ".ema.jsonl")
    sys.exit(train_module.main(sys.argv[1:]))

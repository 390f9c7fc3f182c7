"""Learning-rate schedules: the warm-up + cosine of the predictor's trainer and of the offline pack's trainers
(captioner and renderer)."""

from __future__ import annotations

import math


def warmup_cosine(peak_lr: float, step: int, progress: float, warmup_steps: int, final_fraction: float = 0.1) -> float:
    """Linear warm-up to ``peak_lr`` over the first ``warmup_steps`` steps, times a cosine that decays from 1 to
    ``final_fraction`` as ``progress`` (the spent fraction of the step or time budget) goes from 0 to 1."""
    warmup = min(1.0, (step + 1) / max(warmup_steps, 1))
    cosine = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return peak_lr * warmup * (final_fraction + (1 - final_fraction) * cosine)


def schedule_follows_max_epochs(training: dict) -> bool:
    """True when the learning-rate schedule's length is max_epochs (so a resume must keep max_epochs)."""
    return training["lr_schedule"] == "warmup_cosine" and training["schedule_epochs"] == 0


def learning_rate(training: dict, step: int, steps_per_epoch: int) -> float:
    """The rate of optimizer step `step` (0-based over the whole run) under the config's schedule."""
    if training["lr_schedule"] == "constant":
        return training["lr"]
    horizon = (training["schedule_epochs"] or training["max_epochs"]) * steps_per_epoch
    return warmup_cosine(
        training["lr"], step, step / max(horizon, 1), training["warmup_steps"], training["final_lr_fraction"]
    )

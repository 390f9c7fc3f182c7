"""Learning-rate schedules: the warm-up + cosine of the predictor's trainer (`learning_rate`) and of the offline
pack's trainers (captioner and renderer, `warmup_cosine`)."""

from __future__ import annotations

import math

from world_model.training.config import TrainingConfig


def warmup_cosine(peak_lr: float, step: int, progress: float, warmup_steps: int, final_fraction: float = 0.1) -> float:
    """Linear warm-up to ``peak_lr`` over the first ``warmup_steps`` steps, times a cosine that decays from 1 to
    ``final_fraction`` as ``progress`` (the spent fraction of the step or time budget) goes from 0 to 1."""
    warmup = min(1.0, (step + 1) / max(warmup_steps, 1))
    cosine = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return peak_lr * warmup * (final_fraction + (1 - final_fraction) * cosine)


def schedule_follows_max_epochs(config: TrainingConfig) -> bool:
    """True when the learning-rate schedule's length is max_epochs (so a resume must keep max_epochs)."""
    return config.lr_schedule == "warmup_cosine" and config.schedule_epochs == 0


def learning_rate(config: TrainingConfig, step: int, steps_per_epoch: int) -> float:
    """The rate of optimizer step `step` (0-based over the whole run) under the config's schedule: lr, or
    `warmup_cosine` over (schedule_epochs or max_epochs) x `steps_per_epoch` steps."""
    if config.lr_schedule == "constant":
        return config.lr
    horizon = (config.schedule_epochs or config.max_epochs) * steps_per_epoch
    return warmup_cosine(config.lr, step, step / max(horizon, 1), config.warmup_steps, config.final_lr_fraction)

"""Learning-rate schedules: the warm-up + cosine of the predictor's trainer (`learning_rate`) and of the offline
pack's trainers (captioner and renderer, `warmup_cosine`).

Why not transformers' schedulers: `transformers.get_cosine_with_min_lr_schedule_with_warmup` (what
`get_scheduler("cosine_with_min_lr")` builds) and its `_lr_rate` sibling compute a different rate, so switching
would change every warmup_cosine run already trained (and break the bit-identical resume of one trained before).
Compared step by step with the cpu preset's settings (lr 2e-3, warm-up 300, cosine over 8 x 313 steps, floor 0.05,
10 epochs; transformers 5.24):
  - transformers warms up to the full lr and starts the cosine only after the warm-up, over the remaining steps;
    here the warm-up multiplies a cosine that runs from step 0 over the whole window (step 1000: 1.346e-3 here,
    1.565e-3 there);
  - past the decay window transformers' cosine rises again (cos(pi p) for p > 1), where this one stays at the
    floor: 4.5e-4 instead of 1e-4 by the last step of the 10 epochs, 3.5 times the rate;
  - `get_cosine_with_min_lr_schedule_with_warmup` warms up as k / warm-up (0 at the first step), this as
    (k + 1) / warm-up, like the `_lr_rate` variant.
"""

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

"""The learning-rate schedule of the offline pack's trainers (captioner and renderer)."""

from __future__ import annotations

import math


def warmup_cosine(peak_lr: float, step: int, progress: float, warmup_steps: int, final_fraction: float = 0.1) -> float:
    """Linear warm-up to ``peak_lr`` over the first ``warmup_steps`` steps, times a cosine that decays from 1 to
    ``final_fraction`` as ``progress`` (the spent fraction of the step or time budget) goes from 0 to 1."""
    warmup = min(1.0, (step + 1) / max(warmup_steps, 1))
    cosine = 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
    return peak_lr * warmup * (final_fraction + (1 - final_fraction) * cosine)

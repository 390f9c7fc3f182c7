"""What a predictor's `training_step` returns, the same for the 4-tensor model and the flat baseline."""

from __future__ import annotations

from typing import NamedTuple

import torch


class StepStats(NamedTuple):
    """One training step: the window loss and the last-slice statistics on S(T)."""

    loss: torch.Tensor  # mean cross-entropy over the non-padding targets of S(1..T)
    window_ce_sum: torch.Tensor  # summed cross-entropy over the same targets
    window_tokens: torch.Tensor  # their count
    last_ce_sum: torch.Tensor  # summed cross-entropy over the non-padding tokens of S(T)
    last_correct: torch.Tensor  # argmax matches on those tokens (eval mode; 0 in training mode, which skips the argmax)
    last_tokens: torch.Tensor  # their count

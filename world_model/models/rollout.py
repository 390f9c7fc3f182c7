"""The sliding-window rollout every predictor and readout shares: predict a state, append it, keep the last T."""

from __future__ import annotations

from typing import Callable

import torch


def slide_rollout(
    window: torch.Tensor, steps: int, n_states: int, next_state: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Predict `steps` future states from `window` (B, T', N) -> (B, steps, N).

    Each step asks `next_state(window)` for the next state (B, N) of the current window, appends it, and keeps the
    window's last `n_states` sentences (the oldest is dropped once the window holds `n_states`); the window passed
    to `next_state` holds long ids and lives on the device of `window`.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    window, predicted = window.long(), []
    for _ in range(steps):
        state = next_state(window)
        predicted.append(state)
        window = torch.cat([window, state[:, None]], dim=1)[:, -n_states:]
    return torch.stack(predicted, dim=1)

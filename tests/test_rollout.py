"""The shared sliding-window rollout: each step sees the last n_states sentences, its prediction appended."""

import pytest
import torch

from world_model.models.rollout import slide_rollout


def test_each_step_sees_the_window_slid_by_its_predictions():
    window = torch.arange(2 * 2 * 3).reshape(2, 2, 3).int()  # (B=2, T'=2, N=3), int ids: the loop makes them long
    seen = []

    def next_state(current: torch.Tensor) -> torch.Tensor:
        seen.append(current.clone())
        return current[:, -1] + 100  # (B, N): the last sentence, shifted

    predicted = slide_rollout(window, steps=3, n_states=3, next_state=next_state)
    assert predicted.shape == (2, 3, 3) and predicted.dtype == torch.long
    first, second, third = window[:, -1] + 100, window[:, -1] + 200, window[:, -1] + 300
    assert torch.equal(predicted, torch.stack([first, second, third], dim=1))
    assert [tuple(w.shape) for w in seen] == [(2, 2, 3), (2, 3, 3), (2, 3, 3)]
    assert torch.equal(seen[1], torch.cat([window, first[:, None]], dim=1))
    assert torch.equal(seen[2], torch.stack([window[:, 1], first, second], dim=1))  # the oldest sentence dropped


def test_steps_below_one_are_refused():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        slide_rollout(torch.zeros(1, 2, 3, dtype=torch.long), 0, 3, lambda w: w[:, -1])

"""Running a block with a model in eval mode."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`with eval_mode(model):` the block runs with `model` in eval mode (no dropout); its train/eval mode is
    restored afterwards, whether the block ends or raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)

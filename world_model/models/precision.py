"""Numeric precision of training, evaluation and rollout: fp32, or bf16 mixed precision via autocast.

In bf16 the matrix products run in bfloat16 under `torch.autocast` (on CPU, the matrix units of CPUs
that have them; on CUDA, tensor cores) while the weights, the optimizer state, the softmax of the
readout and every loss sum stay in fp32.
"""

from __future__ import annotations

import torch

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def autocast(precision: str, device: torch.device | str) -> torch.autocast:
    """A context manager: bf16 autocast on `device` for "bf16", a no-op for "fp32"."""
    check_precision(precision)
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")

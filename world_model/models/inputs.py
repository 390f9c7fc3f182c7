"""Checks on the token windows that callers hand to a predictor; one set of messages for every model."""

from __future__ import annotations

import torch

INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


def check_window(
    token_ids: torch.Tensor,
    n_states: int,
    n_tokens: int,
    vocab_size: int,
    name: str = "token_ids",
    sentences: int | None = None,
    vocab_name: str = "vocabulary",
) -> None:
    """Reject anything but integer ids (B, T', N) in [0, vocab_size), with T' == `sentences` or else 1 <= T' <= n_states."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(token_ids).__name__}")
    if token_ids.dtype not in INT_DTYPES:
        raise TypeError(f"{name} must hold integer token ids, got dtype {token_ids.dtype}")
    want = f"{sentences}" if sentences is not None else f"1..{n_states}"
    if token_ids.dim() != 3:
        hint = " (insert the batch axis: ids[None])" if token_ids.dim() == 2 else ""
        raise ValueError(f"{name} must have shape (B>=1, {want}, {n_tokens}), got {tuple(token_ids.shape)}{hint}")
    B, T, N = token_ids.shape
    T_ok = T == sentences if sentences is not None else 1 <= T <= n_states
    if B < 1 or not T_ok or N != n_tokens:
        raise ValueError(f"{name} must have shape (B>=1, {want}, {n_tokens}), got {tuple(token_ids.shape)}")
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size):
        bad = token_ids[(token_ids < 0) | (token_ids >= vocab_size)][0]
        raise ValueError(f"{name} holds id {int(bad)}, outside the {vocab_name} [0, {vocab_size})")


def check_example(
    token_ids_full: torch.Tensor, n_states: int, n_tokens: int, vocab_size: int, vocab_name: str = "vocabulary"
) -> None:
    """A stored training example must be (B, T+1, N); a rank-2 (T+1, N) window is rejected (section 4.1)."""
    if not isinstance(token_ids_full, torch.Tensor) or token_ids_full.dim() != 3:
        shape = (
            tuple(token_ids_full.shape) if isinstance(token_ids_full, torch.Tensor) else type(token_ids_full).__name__
        )
        raise ValueError(
            f"a training example must have shape (B, T+1, N) = (B, {n_states + 1}, {n_tokens}), got {shape}; "
            "a single (T+1, N) window needs its batch axis: window[None]"
        )
    if token_ids_full.shape[1] != n_states + 1:
        raise ValueError(f"a training example must hold T+1 = {n_states + 1} sentences, got {token_ids_full.shape[1]}")
    check_window(token_ids_full, n_states, n_tokens, vocab_size, "token_ids_full", n_states + 1, vocab_name)

"""The flat baseline's packing of a stored window (B, T+1, N) into token strings (section 7.4 of the 4-tensor
paper): the prefix [BOS] + S(0..T-1) without padding or separators, the gold S(T) + [EOS] as a target only, and
the alignment of a free run's tokens with that gold span. `world_model.models.baseline` uses them.

Shapes: B batch, M ids per row before packing, L packed length, G steps of the longest gold span.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from world_model.models.generation_config import after_first


class Packed(NamedTuple):
    """Section 7.4 packing of a stored window, right-padded with the padding id."""

    prefix: torch.Tensor  # (B, Lp) [BOS] + S(0) .. S(T-1), padding removed, no separators (+ [BOS]: target marker)
    prefix_len: torch.Tensor  # (B,) live length of each prefix, >= 1
    gold: torch.Tensor  # (B, G) S(T) with padding removed, then [EOS]; target only
    gold_len: torch.Tensor  # (B,) live length of each gold span, >= 1 (the [EOS])


class FreeRun(NamedTuple):
    """One free-running pass over a batch of windows."""

    packed: Packed
    logits: torch.Tensor  # (B, G, V) logits of the last live position at step k
    tokens: torch.Tensor  # (B, G) argmax appended after step k (detached ids)


def compact(ids: torch.Tensor, keep: torch.Tensor, pad: int, lead: int | None = None, tail: int | None = None):
    """Keep the `keep` entries of each row in order, optionally behind `lead` and before `tail`.

    ids, keep (B, M) -> right-padded rows (B, Lmax) and their lengths (B,).
    """
    B = ids.shape[0]
    start = int(lead is not None)
    lengths = keep.sum(dim=1) + start + int(tail is not None)  # (B,)
    out = ids.new_full((B, int(lengths.max())), pad)
    dest = keep.cumsum(dim=1) - 1 + start  # (B, M) target column of each kept id
    rows = torch.arange(B, device=ids.device)[:, None].expand_as(ids)
    out[rows[keep], dest[keep]] = ids[keep]
    if lead is not None:
        out[:, 0] = lead
    if tail is not None:
        out[torch.arange(B, device=ids.device), lengths - 1] = tail
    return out, lengths


def gold_steps(packed: Packed, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(active, content), each (B, G): the steps k < gold_len of each row, and those whose gold is not [EOS]."""
    steps = torch.arange(packed.gold.shape[1], device=packed.gold.device)
    active = steps[None, :] < packed.gold_len[:, None]
    return active, active & (packed.gold != eos_id)


def aligned_correct(tokens: torch.Tensor, gold: torch.Tensor, content: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Greedy token accuracy on gold content positions: tokens, gold, content (B, G) -> matches (B, G).

    Position k counts only if the model emitted gold[k] there and had not emitted [EOS] before k:
    greedy evaluation stops at [EOS], so whatever the free run produced after it is not in the string.
    """
    return (tokens == gold) & content & ~after_first(tokens == eos_id)

"""What counting says about where sentences end, and the count priors that label smoothing trains towards.

End cost (`count_end_cost`). The floors, like the 4-tensor readout, are scored only on live slots, so they are told
for free that S(4) has not ended yet. The free-running baseline is not: at each step it also gives [EOS] some mass,
and on a content token it pays -log(1 - p([EOS])) for it. The count version of that cost is the per-slot end rate of
the training sentences (all five of every window), h_n = (#ending at n + 1) / (#reaching n + 2); a writer that must
say where S(4) ends and knows only that rate pays the mean of -log(1 - h_n) over the S(4) tokens, on top of a floor.

Count prior (`count_prior`). What a count predicts at each step of a sentence written free-running, [EOS] included:
the position unigram (alpha chosen as in `select_floors`) times the chance that a training sentence goes on past the
slot, and [EOS] with the chance that it ends there. The target of training.label_smoothing_prior "counts". With the
copy floor's weight w (`count_copy_prior`), a share w of every content step goes to copying the window's context
instead: the target of training.label_smoothing_prior "counts_copy".
"""

from __future__ import annotations

import torch

from world_model.evaluation.floors.counts import (
    CONTEXT,
    CountFloor,
    best_alpha,
    best_copy_weight,
    check_windows,
    slot_counts,
    split_heldout,
)
from world_model.text.vocab import PAD_ID


def sentence_end_counts(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ends, reaching), each (N + 1,) float64, over every sentence of `windows` (S, 5, N): how many end at slot k
    (hold k tokens), and how many are still going there (hold at least k)."""
    n = windows.shape[2]
    lengths = (windows != PAD_ID).sum(-1).flatten()  # (S * 5,) sentence lengths
    ends = torch.bincount(lengths, minlength=n + 1).double()
    reaching = (lengths[:, None] >= torch.arange(n + 1)[None, :]).sum(0).double()
    return ends, reaching


def count_end_cost(train_windows: torch.Tensor, windows: torch.Tensor) -> float:
    """Mean -log(1 - h_n) over the non-padding S(4) tokens of `windows` (S, 5, N), h_n the add-one per-slot end rate
    of every sentence of `train_windows` (module docstring): what knowing only the length statistics costs a model
    that, like the free-running baseline, must spend mass on [EOS] at every slot."""
    n = train_windows.shape[2]
    if windows.shape[2] != n:
        raise ValueError(f"windows have {windows.shape[2]} slots a sentence, the training windows {n}")
    ends, reaching = sentence_end_counts(train_windows)
    cost = -torch.log1p(-(ends[:n] + 1) / (reaching[:n] + 2))  # (N,) paid by a token at slot k
    live = windows[:, CONTEXT] != PAD_ID  # (S, N)
    if not live.any():
        raise ValueError("the windows hold no non-padding S(4) token")
    return float((cost[None, :] * live).sum() / live.sum())


def count_prior(
    train_windows: torch.Tensor,
    vocab_size: int,
    model_vocab: int,
    eos_id: int | None = None,
    copy_weight: float = 0.0,
) -> torch.Tensor:
    """q, what counting predicts at each step of a sentence, float32: (N + 1, model_vocab) for a writer with an
    [EOS] id (step k = 0..N of a free-running sentence), (N, model_vocab) the position unigram alone without one
    (`eos_id` None: a predictor of the live token slots, such as the 4-tensor readout).

    With [EOS], row k < N is (1 - end_k) * position_unigram[k] over the ids below `vocab_size` and end_k at
    `eos_id`, where end_k = #(sentences ending at k) / #(sentences reaching k) over every sentence of
    `train_windows` (S, 5, N); row N (a sentence that filled every slot) is [EOS] alone. The unigram's alpha is
    chosen on a held-out slice of `train_windows` (`best_alpha`) and the table refitted on them all; nothing else
    is read. Every row sums to 1, or with a `copy_weight` w in (0, 1) the position unigram is scaled by 1 - w and
    row k sums to 1 - w (1 - end_k): the rest is what `count_copy_prior` gives to copying the window's context.
    """
    if not 0 <= copy_weight < 1:
        raise ValueError(f"copy weight must be in [0, 1), got {copy_weight}")
    check_windows(train_windows, vocab_size, "training windows")
    if eos_id is not None and not vocab_size <= eos_id < model_vocab:
        raise ValueError(f"[EOS] id {eos_id} must lie in [{vocab_size}, {model_vocab}): past the sentence vocabulary")
    if model_vocab < vocab_size:
        raise ValueError(f"the model's vocabulary ({model_vocab}) is smaller than the sentences' ({vocab_size})")
    n = train_windows.shape[2]
    fit, held = split_heldout(train_windows)
    alpha, _ = best_alpha("position_unigram", slot_counts(fit, vocab_size), held)
    table = (1 - copy_weight) * CountFloor.fit("position_unigram", slot_counts(train_windows, vocab_size), alpha).table
    if eos_id is None:
        prior = torch.zeros(n, model_vocab, dtype=torch.float64)
        prior[:, :vocab_size] = table
        return prior.float()
    ends, reaching = sentence_end_counts(train_windows)
    end = ends / reaching.clamp(min=1)  # (N + 1,) p(the sentence ends at k | it reached k)
    prior = torch.zeros(n + 1, model_vocab, dtype=torch.float64)
    prior[:n, :vocab_size] = (1 - end[:n, None]) * table
    prior[:, eos_id] = end
    prior[n, eos_id] = 1.0
    return prior.float()


def count_copy_prior(
    train_windows: torch.Tensor, vocab_size: int, model_vocab: int, eos_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the position-unigram + copy floor predicts at each step of a free-running sentence, [EOS] included:
    (prior (N + 1, model_vocab), copy_mass (N + 1,)), float32. The copy weight w is the copy floor's, chosen on the
    held-out slice of `train_windows` (as `select_floors` chooses it). Row k of `prior` is `count_prior` with that w, and
    copy_mass[k] = w (1 - end_k) is the share of step k that goes to copy(v), the share of v among the non-padding
    tokens of the window's context S(0..3); the two add up to 1 at every step. The target of
    training.label_smoothing_prior "counts_copy"."""
    check_windows(train_windows, vocab_size, "training windows")
    fit, held = split_heldout(train_windows)
    counts = slot_counts(fit, vocab_size)
    w, _ = best_copy_weight(counts, held, best_alpha("position_unigram", counts, held)[0])
    ends, reaching = sentence_end_counts(train_windows)
    end = ends / reaching.clamp(min=1)  # (N + 1,)
    return count_prior(train_windows, vocab_size, model_vocab, eos_id, w), (w * (1 - end)).float()

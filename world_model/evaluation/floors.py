"""Count floors for L_S(4): predictors of S(4)'s tokens that learn nothing about stories (issue 13).

Three floors, each a distribution over the ids of the vocabulary but padding (padding is never a target;
the unknown id is an ordinary outcome, as it is for the models' softmax):

    unigram                 token counts over every sentence of the training windows, add-alpha smoothed
    position_unigram        one such distribution per token slot n (counts at slot n of all five sentences)
    position_unigram_copy   (1 - w) position_unigram + w copy, copy(v) = the share of v among the
                            non-padding tokens of the window's four context sentences S(0..3)

Selection (`select_floors`) reads training windows only: the last HELDOUT_FRACTION of them (in corpus order)
are held out, the floors are fitted on the rest, alpha is the grid value of ALPHAS of lowest held-out L_S(4)
(per floor) and the copy weight the value of COPY_WEIGHTS of lowest held-out L_S(4) at the position
floor's alpha. The chosen floors are then refitted on all the training windows given. L_S(4) is the mean
cross-entropy (nats) over the non-padding tokens of S(4), as the models report it; token accuracy is the
argmax match rate on the same tokens.

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

Last-sentence floor (`last_sentence_floor`). The floors count all five sentences of a window; the flat baseline is
trained on the tokens of S(4) alone (section 7.4). The position unigram counted on the training S(4) slots only is what
counting learns from the baseline's own training tokens: a reference for the baseline rows, not a floor of the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from world_model.text.vocab import PAD_ID

HELDOUT_FRACTION = 0.1
ALPHAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
COPY_WEIGHTS = tuple(round(0.05 * i, 2) for i in range(1, 13))  # 0.05 .. 0.6
FLOORS = ("unigram", "position_unigram", "position_unigram_copy")
CONTEXT = 4  # S(0..3) condition S(4)


def check_windows(windows: torch.Tensor, vocab_size: int, name: str = "windows") -> None:
    """Integer windows (S >= 1, 5, N) with ids in [0, vocab_size); ValueError otherwise."""
    if (
        not isinstance(windows, torch.Tensor)
        or windows.dtype.is_floating_point
        or windows.dim() != 3
        or windows.shape[1] != CONTEXT + 1
        or windows.shape[0] < 1
    ):
        raise ValueError(
            f"{name} must be an integer tensor (S >= 1, {CONTEXT + 1}, N), got "
            f"{getattr(windows, 'dtype', type(windows).__name__)} {tuple(getattr(windows, 'shape', ()))}"
        )
    if int(windows.min()) < 0 or int(windows.max()) >= vocab_size:
        raise ValueError(f"{name} hold ids outside [0, {vocab_size})")


def slot_counts(windows: torch.Tensor, vocab_size: int, last_only: bool = False) -> torch.Tensor:
    """(N, V) float64: how often each id stands at each slot over all five sentences, or over S(4) alone with
    `last_only` (padding counted too, and ignored by the floors)."""
    check_windows(windows, vocab_size)
    n = windows.shape[2]
    counted = windows[:, CONTEXT:] if last_only else windows
    flat = (torch.arange(n)[None, None, :] * vocab_size + counted.long()).reshape(-1)
    return torch.bincount(flat, minlength=n * vocab_size).reshape(n, vocab_size).double()


@dataclass
class CountFloor:
    """A fitted floor: `table` (N, V) holds p(v | slot n) (rows equal for the unigram), zero at padding."""

    name: str
    alpha: float
    copy_weight: float
    table: torch.Tensor

    @classmethod
    def fit(cls, name: str, counts: torch.Tensor, alpha: float, copy_weight: float = 0.0) -> "CountFloor":
        """The floor `name` from `slot_counts`, add-`alpha` smoothed over the V - 1 ids but padding."""
        if name not in FLOORS:
            raise ValueError(f"unknown floor {name!r}; floors: {list(FLOORS)}")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if not 0 <= copy_weight < 1 or (copy_weight > 0) != (name == "position_unigram_copy"):
            raise ValueError(
                f"copy weight {copy_weight} does not fit floor {name!r} (in (0, 1) for the copy floor, else 0)"
            )
        counts = counts.clone()
        counts[:, PAD_ID] = 0
        if name == "unigram":
            counts = counts.sum(0, keepdim=True).expand_as(counts)
        smoothed = counts + alpha
        smoothed[:, PAD_ID] = 0
        return cls(name, alpha, copy_weight, smoothed / smoothed.sum(-1, keepdim=True))

    def _copy(self, context: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """copy(ids[s, ...]) from the context of window s, and the weight w[s] (0 where the context is empty)."""
        ctx = context.reshape(len(context), -1)
        live = ctx != PAD_ID
        n_ctx = live.sum(1)
        shape = ids.shape
        flat = ids.reshape(len(ids), -1)
        hits = ((flat[:, :, None] == ctx[:, None, :]) & live[:, None, :]).sum(-1).double()
        copy = (hits / n_ctx.clamp(min=1)[:, None].double()).reshape(shape)
        weight = (n_ctx > 0).double() * self.copy_weight
        return copy, weight.reshape(-1, *([1] * (len(shape) - 1)))

    def token_probs(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """p(target[s, n]) given the window's context (S, 4, N): float64 (S, N)."""
        slots = torch.arange(target.shape[1])[None, :]
        p = self.table[slots, target.long()]
        if self.copy_weight:
            copy, w = self._copy(context, target.long())
            p = (1 - w) * p + w * copy
        return p

    def token_log_probs(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """log p(target[s, n]) given the context (S, 4, N): float64 (S, N), 0 at padding targets."""
        return torch.where(target != PAD_ID, self.token_probs(context, target).log(), 0.0)

    def predictions(self, context: torch.Tensor) -> torch.Tensor:
        """The argmax id of every slot of S(4) given the context (S, 4, N): (S, N).

        With copy, the argmax is the slot's own argmax or one of the context tokens (copy adds mass only
        there), so only those candidates are compared (the slot's argmax wins ties)."""
        S, n = len(context), self.table.shape[0]
        best = self.table.argmax(-1).expand(S, n)  # (S, N)
        if not self.copy_weight:
            return best
        ctx = context.reshape(S, -1).long()  # (S, 4N)
        copy_best, w = self._copy(context, best)
        copy_ctx, _ = self._copy(context, ctx)
        slots = torch.arange(n)[None, :]
        p_best = (1 - w) * self.table[slots, best] + w * copy_best  # (S, N)
        p_ctx = (1 - w[:, :, None]) * self.table[slots[..., None], ctx[:, None, :]] + (w * copy_ctx)[
            :, None, :
        ]  # (S, N, 4N)
        p_ctx = torch.where(ctx[:, None, :] != PAD_ID, p_ctx, -1.0)
        top, where = p_ctx.max(-1)
        return torch.where(top > p_best, ctx.gather(1, where), best)


def floor_metrics(floor: CountFloor, windows: torch.Tensor, accuracy: bool = True) -> dict:
    """L_S(4) (nats, mean over the non-padding S(4) tokens) and token accuracy (unless `accuracy` is False)
    of `floor` on `windows` (S, 5, N)."""
    check_windows(windows, floor.table.shape[1])
    if windows.shape[2] != floor.table.shape[0]:
        raise ValueError(
            f"windows have {windows.shape[2]} slots a sentence, the floor was fitted on {floor.table.shape[0]}"
        )
    context, target = windows[:, :CONTEXT], windows[:, CONTEXT]
    live = target != PAD_ID
    tokens = int(live.sum())
    if not tokens:
        raise ValueError("the windows hold no non-padding S(4) token")
    metrics = {"last_ce": -float(floor.token_log_probs(context, target).sum()) / tokens, "last_tokens": tokens}
    if accuracy:
        metrics["token_accuracy"] = int(((floor.predictions(context) == target) & live).sum()) / tokens
    return metrics


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
    held-out slice of `train_windows` (`select_floors`). Row k of `prior` is `count_prior` with that w, and
    copy_mass[k] = w (1 - end_k) is the share of step k that goes to copy(v), the share of v among the non-padding
    tokens of the window's context S(0..3); the two add up to 1 at every step. The target of
    training.label_smoothing_prior "counts_copy"."""
    w = select_floors(train_windows, vocab_size)["selection"]["position_unigram_copy"]["copy_weight"]
    ends, reaching = sentence_end_counts(train_windows)
    end = ends / reaching.clamp(min=1)  # (N + 1,)
    return count_prior(train_windows, vocab_size, model_vocab, eos_id, w), (w * (1 - end)).float()


def last_sentence_floor(train_windows: torch.Tensor, val_windows: torch.Tensor, vocab_size: int) -> dict:
    """The position unigram counted on the S(4) slots of the training windows alone: what counting learns from the
    tokens the flat baseline's loss reads (section 7.4: it is trained on S(T) only, a fifth of the sentences the
    floors count). Alpha is chosen on the held-out slice as in `select_floors`, then the floor is refitted on all
    `train_windows` and scored on `val_windows`: {"alpha", "heldout_last_ce", "val_last_ce"}."""
    check_windows(train_windows, vocab_size, "training windows")
    fit, held = split_heldout(train_windows)
    alpha, heldout_ce = best_alpha("position_unigram", slot_counts(fit, vocab_size, last_only=True), held)
    floor = CountFloor.fit("position_unigram", slot_counts(train_windows, vocab_size, last_only=True), alpha)
    return {
        "alpha": alpha,
        "heldout_last_ce": heldout_ce,
        "val_last_ce": floor_metrics(floor, val_windows, accuracy=False)["last_ce"],
    }


def split_heldout(windows: torch.Tensor, fraction: float = HELDOUT_FRACTION) -> tuple[torch.Tensor, torch.Tensor]:
    """(fit, held-out): the last ceil(fraction * S) windows are held out; both parts must be non-empty."""
    held = math.ceil(fraction * len(windows))
    if not 0 < held < len(windows):
        raise ValueError(
            f"cannot hold out {fraction:g} of {len(windows)} training window(s): both parts must be non-empty"
        )
    return windows[:-held], windows[-held:]


def best_alpha(name: str, counts: torch.Tensor, held: torch.Tensor) -> tuple[float, float]:
    """The value of ALPHAS whose floor `name` fitted on `counts` (N, V) has the lowest L_S(4) on the held-out
    windows `held` (S, 5, N), and that L_S(4) (the first such value on a tie)."""
    scores = {
        alpha: floor_metrics(CountFloor.fit(name, counts, alpha), held, accuracy=False)["last_ce"] for alpha in ALPHAS
    }
    alpha = min(scores, key=scores.get)
    return alpha, scores[alpha]


def select_floors(train_windows: torch.Tensor, vocab_size: int, fraction: float = HELDOUT_FRACTION) -> dict:
    """Choose every floor's settings on a held-out slice of the training windows, then refit on them all.

    Returns {"floors": {name: CountFloor}, "selection": {"fit_windows", "heldout_windows", "heldout_fraction",
    name: {"alpha", "copy_weight", "heldout_last_ce"}}}. Nothing but `train_windows` is read.
    """
    check_windows(train_windows, vocab_size, "training windows")
    fit, held = split_heldout(train_windows, fraction)
    counts = slot_counts(fit, vocab_size)
    selection: dict = {"fit_windows": len(fit), "heldout_windows": len(held), "heldout_fraction": fraction}
    for name in ("unigram", "position_unigram"):
        alpha, heldout_ce = best_alpha(name, counts, held)
        selection[name] = {"alpha": alpha, "copy_weight": 0.0, "heldout_last_ce": heldout_ce}
    alpha = selection["position_unigram"]["alpha"]
    scores = {
        w: floor_metrics(CountFloor.fit("position_unigram_copy", counts, alpha, w), held, accuracy=False)["last_ce"]
        for w in COPY_WEIGHTS
    }
    weight = min(scores, key=scores.get)
    selection["position_unigram_copy"] = {"alpha": alpha, "copy_weight": weight, "heldout_last_ce": scores[weight]}
    all_counts = slot_counts(train_windows, vocab_size)
    floors = {
        name: CountFloor.fit(name, all_counts, selection[name]["alpha"], selection[name]["copy_weight"])
        for name in FLOORS
    }
    return {"floors": floors, "selection": selection}


def floor_report(train_windows: torch.Tensor, val_windows: torch.Tensor, vocab_size: int) -> tuple[dict, dict]:
    """Select and refit the floors on `train_windows`, then measure them on `val_windows`.

    Returns (floors {name: CountFloor}, report {"selection": ..., "train_windows", "end_cost" (`count_end_cost`),
    "last_sentence" (`last_sentence_floor`), name: {"alpha", "copy_weight", "heldout_last_ce", "val_last_ce",
    "val_token_accuracy", "last_tokens"}}).
    """
    chosen = select_floors(train_windows, vocab_size)
    report = {
        "train_windows": len(train_windows),
        "selection": {k: v for k, v in chosen["selection"].items() if k not in FLOORS},
        "end_cost": count_end_cost(train_windows, val_windows),
        "last_sentence": last_sentence_floor(train_windows, val_windows, vocab_size),
    }
    for name, floor in chosen["floors"].items():
        m = floor_metrics(floor, val_windows)
        report[name] = {
            **chosen["selection"][name],
            "val_last_ce": m["last_ce"],
            "val_token_accuracy": m["token_accuracy"],
            "last_tokens": m["last_tokens"],
        }
    return chosen["floors"], report

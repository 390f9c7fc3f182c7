"""The count floors' building blocks: slot counts, the unigram and position-unigram tables, copying the context,
and the held-out choice of their smoothing (see the package docstring for what each floor is).

Shapes: S windows, each (5, N) ids (S(0..3) the context, S(4) the target), V the sentence vocabulary (id 0 padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from world_model.text.vocab import PAD_ID

HELDOUT_FRACTION = 0.1
ALPHAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
COPY_WEIGHTS = tuple(round(0.05 * i, 2) for i in range(1, 13))  # 0.05 .. 0.6
TABLE_FLOORS = ("unigram", "position_unigram", "position_unigram_copy")  # the floors a CountFloor holds
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


def context_copy(context: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The copy distribution of each window's context at the given ids: context (S, 4, N), ids (S, ...) ->
    (copy float64 like ids, has_context (S,) bool). copy(v) is the share of v among the non-padding tokens of
    S(0..3); a window whose context is all padding copies nothing (copy 0, has_context False)."""
    ctx = context.reshape(len(context), -1)
    live = ctx != PAD_ID
    n_ctx = live.sum(1)
    flat = ids.reshape(len(ids), -1).long()
    hits = ((flat[:, :, None] == ctx[:, None, :]) & live[:, None, :]).sum(-1).double()
    return (hits / n_ctx.clamp(min=1)[:, None].double()).reshape(ids.shape), n_ctx > 0


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
        if name not in TABLE_FLOORS:
            raise ValueError(f"unknown floor {name!r}; floors: {list(TABLE_FLOORS)}")
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
        """copy(ids[s, ...]) from the context of window s (`context_copy`), and the weight w[s] (0 where the context
        is empty), shaped to broadcast against ids."""
        copy, has_context = context_copy(context, ids)
        weight = has_context.double() * self.copy_weight
        return copy, weight.reshape(-1, *([1] * (ids.dim() - 1)))

    def token_probs(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """p(target[s, ..., n]) given the window's context (S, 4, N): target (S, N) or (S, K, N) -> float64 like it."""
        slots = torch.arange(target.shape[-1])
        p = self.table[slots, target.long()]
        if self.copy_weight:
            copy, w = self._copy(context, target.long())
            p = (1 - w) * p + w * copy
        return p

    def token_log_probs(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """log p(target[s, ..., n]) given the context (S, 4, N): float64 like target, 0 at padding targets."""
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


def best_copy_weight(counts: torch.Tensor, held: torch.Tensor, alpha: float) -> tuple[float, float]:
    """The value of COPY_WEIGHTS whose copy floor (position unigram of `counts` at `alpha`) has the lowest L_S(4) on
    the held-out windows `held`, and that L_S(4) (the first such value on a tie)."""
    scores = {
        w: floor_metrics(CountFloor.fit("position_unigram_copy", counts, alpha, w), held, accuracy=False)["last_ce"]
        for w in COPY_WEIGHTS
    }
    weight = min(scores, key=scores.get)
    return weight, scores[weight]

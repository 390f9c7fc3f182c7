"""The co-occurrence floor: the position unigram rescaled by what the window's context words have been seen to
precede in the training stories, mixed with a copy of the context.

    cooccurrence_copy   p(v | n, C) = (1 - w) q(v | n, C) + w copy(v | C)
                        q(v | n, C) = p_pos(v | n) r_C(v)^beta / Z(n, C)
                        r_C(v)      = t_C(v) / u(v)
                        t_C(v)      = mean over the distinct ids c of C of (A[c, v] + m u(v)) / (A[c, .] + m)

A[c, v] (`cooccurrence_counts`) counts, over the training windows and the sentences j = 1..4 of each, the tokens v of
sentence j in a window whose sentences before j hold the id c (c counted once a window and sentence: trigger pairs,
Rosenfeld 1996), and u(v) = (A[., v] + 1) / (A[., .] + V - 1) is the add-one marginal of its columns over the ids but
padding. So t_C is what the words of the context C have been followed by, shrunk towards u with strength m, and q is
the position unigram raised where those words point and lowered elsewhere (unigram rescaling, Gildea and Hofmann 1999;
beta its exponent). Like the other floors it knows no word order: a bag of context words, the slot index and copying.
m, beta and the copy weight w are chosen together on the held-out slice of the training windows
(`select_cooccurrence`); p_pos keeps the alpha the position_unigram floor chose.

Shapes: S windows, context (S, 4, N) and target (S, N) ids, V the sentence vocabulary (id 0 padding, never predicted).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from world_model.evaluation.floors.counts import (
    CONTEXT,
    COPY_WEIGHTS,
    CountFloor,
    check_windows,
    context_copy,
    slot_counts,
)
from world_model.text.vocab import PAD_ID

BETAS = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)  # exponents of the rescaling, chosen on held-out training windows
STRENGTHS = (10.0, 30.0, 100.0, 300.0, 1000.0)  # m: pseudo-counts of u in every context word's row
CHUNK = 256  # windows at a time: the ratios are (CHUNK, V) float64
PREDICTION_CHUNK = 16  # windows at a time for the argmax: (PREDICTION_CHUNK, N, V) float64


def sparse(indices: torch.Tensor, values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A coalesced sparse COO float64 tensor."""
    return torch.sparse_coo_tensor(indices, values.double(), size, check_invariants=False).coalesce()


def cooccurrence_counts(windows: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A, (V, V) sparse COO float64: A[c, v] is how often v stands in sentence j = 1..4 of a window whose sentences
    before j hold c, each distinct id c counted once a window and sentence; padding is neither c nor v."""
    check_windows(windows, vocab_size)
    keys = []
    for j in range(1, CONTEXT + 1):
        before, _ = windows[:, :j].reshape(len(windows), -1).long().sort(dim=1)  # (S, j N)
        distinct = before != PAD_ID
        distinct[:, 1:] &= before[:, 1:] != before[:, :-1]
        target = windows[:, j].long()  # (S, N)
        pairs = distinct[:, :, None] & (target != PAD_ID)[:, None, :]  # (S, j N, N)
        keys.append((before[:, :, None] * vocab_size + target[:, None, :])[pairs])
    key, count = torch.cat(keys).unique(return_counts=True)
    return sparse(torch.stack([key // vocab_size, key % vocab_size]), count, (vocab_size, vocab_size))


@dataclass
class CooccurrenceFloor:
    """A fitted co-occurrence floor (module docstring): `position` the position_unigram floor, `counts` A (V, V)."""

    position: CountFloor
    counts: torch.Tensor
    strength: float
    beta: float
    copy_weight: float
    name: str = field(default="cooccurrence_copy", init=False)

    def __post_init__(self) -> None:
        v = self.position.table.shape[1]
        if self.position.name != "position_unigram":
            raise ValueError(f"the co-occurrence floor rescales the position unigram, got {self.position.name!r}")
        if not self.counts.is_sparse or tuple(self.counts.shape) != (v, v):
            raise ValueError(f"counts must be a sparse ({v}, {v}) tensor, got {tuple(self.counts.shape)}")
        if not (self.strength > 0 and self.beta > 0 and 0 <= self.copy_weight < 1):
            raise ValueError(
                f"strength and beta must be > 0 and the copy weight in [0, 1), got {self.strength}, {self.beta}, "
                f"{self.copy_weight}"
            )
        counts = self.counts.coalesce()
        rows = torch.sparse.sum(counts, 1).to_dense() if counts._nnz() else torch.zeros(v, dtype=torch.float64)
        marginal = (torch.sparse.sum(counts, 0).to_dense() if counts._nnz() else torch.zeros(v)).double() + 1
        marginal[PAD_ID] = 0
        self._marginal = marginal / marginal.sum()  # u (V,)
        self._shrink = self.strength / (rows + self.strength)  # m / (A[c, .] + m), (V,)
        c, _ = counts.indices()
        self._followers = sparse(counts.indices(), counts.values() / (rows[c] + self.strength), (v, v))

    @property
    def table(self) -> torch.Tensor:
        """The position unigram (N, V) it rescales."""
        return self.position.table

    @property
    def alpha(self) -> float:
        return self.position.alpha

    def ratios(self, context: torch.Tensor) -> torch.Tensor:
        """r_C(v) for each window's context (S, 4, N): float64 (S, V), 0 at padding, 1 where the context is empty."""
        ids = context.reshape(len(context), -1).long()
        v = self.table.shape[1]
        bag = torch.zeros(len(ids), v, dtype=torch.float64).scatter_(1, ids, 1.0)
        bag[:, PAD_ID] = 0
        n_distinct = bag.sum(1, keepdim=True)
        bag = bag / n_distinct.clamp(min=1)  # (S, V): 1 / |C| at each distinct id of C
        with warnings.catch_warnings():  # torch's sparse product goes through its CSR layout, which warns it is beta
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
            followed = torch.sparse.mm(bag.to_sparse(), self._followers).to_dense()  # (S, V)
        t = followed + (bag @ self._shrink)[:, None] * self._marginal
        u = torch.where(self._marginal > 0, self._marginal, 1.0)
        r = torch.where(n_distinct > 0, t / u, 1.0)
        r[:, PAD_ID] = 0
        return r

    def rescaled_probs(self, context: torch.Tensor, target: torch.Tensor, betas: tuple[float, ...]) -> torch.Tensor:
        """q(target[s, ..., n] | n, C_s) at each exponent of `betas`: target (S, N) or (S, K, N), K candidate
        sentences a window -> float64 (len(betas), *target.shape), 0 at padding targets."""
        out = torch.zeros(len(betas), *target.shape, dtype=torch.float64)
        n = target.shape[-1]
        slots = torch.arange(n)[None, :]
        for start in range(0, len(context), CHUNK):
            part = slice(start, start + CHUNK)
            r, tgt = self.ratios(context[part]), target[part].long().reshape(-1, n)  # (s, V), (s K, N)
            per_window = len(tgt) // len(r)
            for b, beta in enumerate(betas):
                rb = r**beta  # (s, V)
                z = rb @ self.table.T  # (s, N): sum over v of p_pos(v | n) r(v)^beta
                rb, z = rb.repeat_interleave(per_window, dim=0), z.repeat_interleave(per_window, dim=0)  # (s K, .)
                out[b, part] = (self.table[slots, tgt] * rb.gather(1, tgt) / z).reshape(target[part].shape)
        return out

    def token_probs(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """p(target[s, ..., n]) given the window's context (S, 4, N): target (S, N) or (S, K, N) -> float64 like it."""
        q = self.rescaled_probs(context, target, (self.beta,))[0]
        copy, has_context = context_copy(context, target)
        w = has_context.double().reshape(-1, *([1] * (target.dim() - 1))) * self.copy_weight
        return (1 - w) * q + w * copy

    def token_log_probs(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """log p(target[s, ..., n]) given the context (S, 4, N): float64 like target, 0 at padding targets."""
        return torch.where(target != PAD_ID, self.token_probs(context, target).log(), 0.0)

    def predictions(self, context: torch.Tensor) -> torch.Tensor:
        """The argmax id of every slot of S(4) given the context (S, 4, N): (S, N)."""
        out = []
        for start in range(0, len(context), PREDICTION_CHUNK):
            ctx = context[start : start + PREDICTION_CHUNK]
            rb = self.ratios(ctx) ** self.beta  # (s, V)
            q = self.table[None] * rb[:, None, :]  # (s, N, V)
            q = q / q.sum(-1, keepdim=True)
            ids = ctx.reshape(len(ctx), -1).long()
            live = (ids != PAD_ID).double()
            copy = torch.zeros(len(ctx), q.shape[-1], dtype=torch.float64).scatter_add_(1, ids, live)
            copy = copy / live.sum(1, keepdim=True).clamp(min=1)  # (s, V), 0 at padding
            w = (live.sum(1) > 0).double()[:, None, None] * self.copy_weight
            out.append(((1 - w) * q + w * copy[:, None, :]).argmax(-1))
        return torch.cat(out)


def select_cooccurrence(
    fit: torch.Tensor, held: torch.Tensor, train_windows: torch.Tensor, vocab_size: int, alpha: float
) -> tuple[CooccurrenceFloor, dict]:
    """Choose m, beta and the copy weight of the co-occurrence floor on the held-out windows `held` (S, 5, N), counts
    from `fit`, then refit it on all `train_windows` (the position unigram at `alpha` throughout). Returns the floor
    and {"alpha", "strength", "beta", "copy_weight", "heldout_last_ce"} (the first best on a tie, grid order)."""
    context, target = held[:, :CONTEXT], held[:, CONTEXT]
    live = target != PAD_ID
    copy, has_context = context_copy(context, target)
    position = CountFloor.fit("position_unigram", slot_counts(fit, vocab_size), alpha)
    counts = cooccurrence_counts(fit, vocab_size)
    scores = {}
    for m in STRENGTHS:
        q = CooccurrenceFloor(position, counts, m, BETAS[0], 0.0).rescaled_probs(context, target, BETAS)
        for b, beta in enumerate(BETAS):
            for w in COPY_WEIGHTS:
                weight = has_context.double()[:, None] * w
                p = (1 - weight) * q[b] + weight * copy
                scores[m, beta, w] = -float(p[live].log().mean())
    m, beta, w = min(scores, key=scores.get)
    floor = CooccurrenceFloor(
        CountFloor.fit("position_unigram", slot_counts(train_windows, vocab_size), alpha),
        cooccurrence_counts(train_windows, vocab_size),
        m,
        beta,
        w,
    )
    return floor, {"alpha": alpha, "strength": m, "beta": beta, "copy_weight": w, "heldout_last_ce": scores[m, beta, w]}

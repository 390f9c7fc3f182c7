"""Markov floors over sentences: predict the next sentence from the last ``order`` sentences alone, by counting.

A Markov-n floor is fitted on sequences of sentences (a synthetic world's training episodes) and asks: how far does
counting what followed the same last n sentences get? A world whose Markov-2 floor reaches the ceiling does not
need memory. Each episode's history is padded in front with ``START`` (so the floor, like a predictor with a
left-padded window, knows when it is at the start).

The distribution is interpolated back-off over the known sentences (those of the fitted sequences): with ``c_j`` the
last ``j`` sentences and ``n(c_j, s)`` the number of times ``s`` followed them,

    P_j(s | c_j) = (n(c_j, s) + beta P_{j-1}(s | c_{j-1})) / (n(c_j) + beta),   P_{-1} uniform,

so an unseen history backs off to the shorter one. ``beta`` is chosen on a held-out slice of the training sequences
(``STRENGTHS``, one-step log-loss) and the floor refitted on them all. ``k_step`` pushes the distribution ``k``
sentences ahead through the chain.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from functools import lru_cache
from typing import Sequence

import numpy as np

START = "<start>"
STRENGTHS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
HELDOUT_FRACTION = 0.1
MIN_PROB = 1e-6  # the probability a log-loss charges for a sentence given less (or one outside the known set)
EXPAND_MIN = 1e-3  # k_step follows a continuation only if its probability is at least this
BEAM = 64  # ... and keeps the likeliest BEAM histories after each step


class MarkovFloor:
    """A fitted Markov-``order`` floor over ``known`` sentences (see the module docstring)."""

    def __init__(self, order: int, known: list[str], counts: dict[tuple[str, ...], Counter], strength: float):
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        self.order, self.known, self.strength = order, known, strength
        self.index = {s: i for i, s in enumerate(known)}
        self._tables = {
            history: (np.array([self.index[s] for s in c]), np.array(list(c.values()), float))
            for history, c in counts.items()
        }
        self._cached = lru_cache(maxsize=50_000)(self._distribution)

    @classmethod
    def fit(cls, sequences: Sequence[Sequence[str]], order: int, strength: float | None = None) -> "MarkovFloor":
        """Count every sentence of ``sequences`` after each of its histories of length 0..order; with no
        ``strength``, choose it on the last ``HELDOUT_FRACTION`` of the sequences (at least one) first."""
        if not sequences or not any(sequences):
            raise ValueError("need at least one non-empty sequence of sentences to count")
        if strength is None:
            n_held = max(1, math.floor(HELDOUT_FRACTION * len(sequences)))
            if len(sequences) > n_held:
                counted, held = sequences[:-n_held], sequences[-n_held:]
                strength = min(STRENGTHS, key=lambda b: cls._fit(counted, order, b).log_loss(held))
            else:
                strength = 1.0
        return cls._fit(sequences, order, strength)

    @classmethod
    def _fit(cls, sequences: Sequence[Sequence[str]], order: int, strength: float) -> "MarkovFloor":
        counts: dict[tuple[str, ...], Counter] = defaultdict(Counter)
        known = list(dict.fromkeys(s for sequence in sequences for s in sequence))
        for sequence in sequences:
            padded = [START] * order + list(sequence)
            for t in range(order, len(padded)):
                for j in range(order + 1):
                    counts[tuple(padded[t - j : t])][padded[t]] += 1
        return cls(order, known, dict(counts), strength)

    def _history(self, observed: Sequence[str]) -> tuple[str, ...]:
        return tuple(([START] * self.order + list(observed))[-self.order :])

    def _distribution(self, history: tuple[str, ...]) -> np.ndarray:
        probs = np.full(len(self.known), 1.0 / len(self.known))
        for j in range(self.order + 1):
            table = self._tables.get(history[len(history) - j :] if j else ())
            if table is not None:
                ids, counts = table
                probs = self.strength * probs
                np.add.at(probs, ids, counts)
                probs /= counts.sum() + self.strength
        return probs

    def distribution(self, observed: Sequence[str]) -> np.ndarray:
        """(C,) probabilities over ``known`` of the sentence after ``observed`` (read-only)."""
        return self._cached(self._history(observed))

    def k_step(self, observed: Sequence[str], steps: int) -> list[np.ndarray]:
        """(C,) distributions of the sentence 1..steps ahead of ``observed``: the chain's marginals, following each
        history's continuations of probability at least ``EXPAND_MIN`` and keeping the ``BEAM`` likeliest histories
        after each step (renormalised), so the marginals are exact up to the branches dropped."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        frontier = {self._history(observed): 1.0}
        marginals = []
        for _ in range(steps):
            marginal = np.zeros(len(self.known))
            grown: dict[tuple[str, ...], float] = defaultdict(float)
            for history, p in frontier.items():
                probs = self._cached(history)
                marginal += p * probs
                for i in np.flatnonzero(probs >= EXPAND_MIN):
                    grown[history[1:] + (self.known[i],)] += p * probs[i]
            marginals.append(marginal)
            kept = sorted(grown.items(), key=lambda item: -item[1])[:BEAM]
            total = sum(p for _, p in kept)
            frontier = {history: p / total for history, p in kept}
        return marginals

    def probability(self, probs: np.ndarray, sentence: str) -> float:
        """The probability ``probs`` (over ``known``) gives ``sentence`` (0 for a sentence outside ``known``)."""
        i = self.index.get(sentence)
        return 0.0 if i is None else float(probs[i])

    def log_loss(self, sequences: Sequence[Sequence[str]]) -> float:
        """Mean one-step log-loss (nats) over every sentence of ``sequences`` (at least ``MIN_PROB`` each)."""
        losses = [
            -math.log(max(self.probability(self.distribution(sequence[:t]), sequence[t]), MIN_PROB))
            for sequence in sequences
            for t in range(len(sequence))
        ]
        return sum(losses) / len(losses)

"""Next-state forecasts on a synthetic world's held-out episodes, scored beside the world's ceilings and floors.

**Prediction points.** Every held-out episode of S seconds is cut after each of its first ``o`` seconds, ``o = 1 ..
S - steps``; a point is the observed sentences of seconds ``0..o-1`` and the true sentences ``k = 1..steps`` seconds
on. Forecasters see only the observed sentences (or captions of them, in the video loop).

**Forecasts.** A forecaster gives, for each point and each ``k``, its likeliest sentence, the probability it gives
that sentence (its confidence), and the probability it gives the true one (None if it gives no distribution, as
copy-the-last-state does). Scores per scene and over all, for each ``k``:

* accuracy: the share of points whose likeliest sentence is the true one;
* log-loss: the mean of ``-log max(p(true), MIN_PROB)``, nats a sentence;
* ECE: expected calibration error of the confidence over the ``calibration.BINS`` equal-width bins;
* ``accuracy_ci95``: a 95% interval of the accuracy over the held-out episodes (points of one episode are not
  independent, so the interval is the normal one over per-episode means).

**Ceilings and entropy** (``world_model.data.synthetic.ceilings``), the mean over the points of: the largest
probability of the true ``k``-step distribution given the simulator's full state; the same given only the observed
sentences; that distribution's entropy (the log-loss a perfect sentence-level predictor pays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from world_model.data.synthetic.ceilings import beliefs, entropy, k_step_distributions
from world_model.data.synthetic.episodes import episode_sentences
from world_model.data.synthetic.scenes import SCENE_TYPES
from world_model.data.synthetic.simulation import replay
from world_model.evaluation.calibration import reliability
from world_model.evaluation.floors.markov import MIN_PROB, MarkovFloor
from world_model.evaluation.seed_stats import mean_interval
from world_model.text.vocab import same_sentence

ALL = "all"


@dataclass
class Point:
    """One prediction point: episode ``record`` observed for ``len(observed)`` seconds, ``future`` the truth."""

    record: dict
    observed: list[str]
    future: list[str]

    @property
    def scene(self) -> str:
        return self.record["scene"]


@dataclass
class Forecast:
    """A forecaster's answer at one point, for k = 1..steps: its likeliest sentences, the probability it gives each,
    and the probability it gives each true sentence (None when it gives no distribution)."""

    predicted: list[str]
    confidence: list[float | None]
    truth_prob: list[float | None]


def prediction_points(records: Sequence[dict], steps: int) -> list[Point]:
    """Every cut ``o = 1 .. S - steps`` of every episode record, in episode order then cut order."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    points = []
    for record in records:
        sentences = episode_sentences(record)
        if len(sentences) <= steps:
            raise ValueError(
                f"episode {record.get('id', '?')} has {len(sentences)} seconds; predicting {steps} ahead needs more"
            )
        points += [Point(record, sentences[:o], sentences[o : o + steps]) for o in range(1, len(sentences) - steps + 1)]
    return points


def ceilings_at(points: Sequence[Point], steps: int, scenes: Sequence[str] = SCENE_TYPES) -> dict[str, list[list]]:
    """Per point, for k = 1..steps: ``full_state`` (the full-state ceiling), ``from_sentences`` (the largest
    probability given only the observed sentences) and ``entropy`` (nats, of that distribution)."""
    out: dict[str, list[list]] = {"full_state": [], "from_sentences": [], "entropy": []}
    by_episode: dict[str, list] = {}
    for point in points:
        record = point.record
        key = record["id"]
        if key not in by_episode:  # one filter pass over the whole episode serves every cut of it
            by_episode[key] = list(beliefs(episode_sentences(record), scenes, record["fps"]))
        belief = by_episode[key][len(point.observed) - 1]
        said = k_step_distributions(belief, steps)
        scene, _ = replay(record["seed"], len(point.observed), scenes, record["fps"])
        full = k_step_distributions(scene, steps)
        out["full_state"].append([d[0][1] for d in full])
        out["from_sentences"].append([d[0][1] for d in said])
        out["entropy"].append([entropy(d) for d in said])
    return out


def copy_last_forecasts(points: Sequence[Point], steps: int) -> list[Forecast]:
    """Copy the last observed sentence for every step (no distribution)."""
    return [Forecast([p.observed[-1]] * steps, [None] * steps, [None] * steps) for p in points]


def markov_forecasts(floor: MarkovFloor, points: Sequence[Point], steps: int) -> list[Forecast]:
    """The floor's k-step marginals at every point, read as forecasts."""
    forecasts = []
    for point in points:
        marginals = floor.k_step(point.observed, steps)
        best = [int(m.argmax()) for m in marginals]
        forecasts.append(
            Forecast(
                [floor.known[i] for i in best],
                [float(m[i]) for m, i in zip(marginals, best)],
                [floor.probability(m, truth) for m, truth in zip(marginals, point.future)],
            )
        )
    return forecasts


def fit_markov_floors(train_records: Sequence[dict], orders: Sequence[int] = (1, 2, 3)) -> dict[str, MarkovFloor]:
    """Markov floors of the given orders counted on the training episodes' sentences ({"markov1": ...})."""
    sequences = [episode_sentences(r) for r in train_records]
    return {f"markov{n}": MarkovFloor.fit(sequences, n) for n in orders}


def _groups(points: Sequence[Point]) -> dict[str, list[int]]:
    """Point indices per scene (sorted by scene type order) and over all (``ALL``)."""
    groups: dict[str, list[int]] = {ALL: list(range(len(points)))}
    for kind in sorted({p.scene for p in points}, key=lambda s: (SCENE_TYPES + (s,)).index(s)):
        groups[kind] = [i for i, p in enumerate(points) if p.scene == kind]
    return groups


def episode_interval(values: Sequence[float], episodes: Sequence[str]) -> list[float] | None:
    """Normal 95% interval of the mean of ``values`` whose points cluster by episode: over the per-episode means
    weighted by their point counts (None below two episodes)."""
    sums: dict[str, list[float]] = {}
    for v, e in zip(values, episodes, strict=True):
        sums.setdefault(e, []).append(v)
    if len(sums) < 2:
        return None
    total = sum(len(v) for v in sums.values())
    mean = sum(values) / total
    # ratio estimator's variance: sum_e (sum_e - n_e mean)^2 / total^2 * E / (E - 1)
    e = len(sums)
    var = sum((sum(v) - len(v) * mean) ** 2 for v in sums.values()) / total**2 * e / (e - 1)
    half = 1.96 * math.sqrt(var)
    return [mean - half, mean + half]


def score(points: Sequence[Point], forecasts: Sequence[Forecast], steps: int) -> dict[str, dict[str, dict]]:
    """{scene or ``ALL``: {"1".."steps": {"accuracy", "accuracy_ci95", "log_loss", "ece"}}} (log-loss and ECE None
    for a forecaster without distributions)."""
    if len(points) != len(forecasts):
        raise ValueError(f"{len(points)} points but {len(forecasts)} forecasts")
    out: dict[str, dict[str, dict]] = {}
    for group, rows in _groups(points).items():
        out[group] = {}
        for k in range(steps):
            hits = [float(same_sentence(forecasts[i].predicted[k], points[i].future[k])) for i in rows]
            probs = [forecasts[i].truth_prob[k] for i in rows]
            confidence = [forecasts[i].confidence[k] for i in rows]
            has_distribution = all(p is not None for p in probs)
            out[group][str(k + 1)] = {
                "accuracy": sum(hits) / len(hits),
                "accuracy_ci95": episode_interval(hits, [points[i].record["id"] for i in rows]),
                "log_loss": (
                    sum(-math.log(max(p, MIN_PROB)) for p in probs) / len(probs) if has_distribution else None
                ),
                "ece": expected_calibration_error(confidence, hits) if has_distribution else None,
            }
    return out


def expected_calibration_error(confidence: Sequence[float], hits: Sequence[float]) -> float:
    """ECE of the confidences against the 0/1 outcomes over ``calibration.BINS`` equal-width bins."""
    bins = reliability(torch.tensor(confidence, dtype=torch.float64), torch.tensor(hits, dtype=torch.float64))
    return sum(b["windows"] * abs(b["confidence"] - b["accuracy"]) for b in bins) / len(hits)


def ceiling_table(points: Sequence[Point], ceilings: dict[str, list[list]], steps: int) -> dict[str, dict[str, dict]]:
    """{scene or ``ALL``: {"1".."steps": {"ceiling_full_state", "ceiling_from_sentences", "entropy_from_sentences"}}}:
    means over the group's points."""
    names = {
        "full_state": "ceiling_full_state",
        "from_sentences": "ceiling_from_sentences",
        "entropy": "entropy_from_sentences",
    }
    table = {}
    for group, rows in _groups(points).items():
        table[group] = {
            str(k + 1): {name: sum(ceilings[key][i][k] for i in rows) / len(rows) for key, name in names.items()}
            for k in range(steps)
        }
    return table


def _interval(values: Sequence[float]) -> dict:
    """{"mean", "lo", "hi"}: the Student-t 95% interval of the mean (lo and hi None below two values)."""
    stats = mean_interval(values)
    lo, hi = stats["ci95"] or (None, None)
    return {"mean": stats["mean"], "lo": lo, "hi": hi}


def seed_scores(points: Sequence[Point], runs: Sequence[Sequence[Forecast]], steps: int) -> dict[str, dict[str, dict]]:
    """A predictor trained with several seeds (one forecast list per seed), scored like ``score``: accuracy, log-loss
    and ECE as ``{"mean", "lo", "hi"}`` over the seeds (lo and hi None with one seed), ``accuracy_ci95`` over the
    held-out episodes of the seed-mean accuracy, and each seed's accuracy under ``seeds``."""
    per_seed = [score(points, forecasts, steps) for forecasts in runs]
    out: dict[str, dict[str, dict]] = {}
    for group, rows in _groups(points).items():
        out[group] = {}
        for k in range(steps):
            key = str(k + 1)
            mean_hits = [
                sum(same_sentence(f[i].predicted[k], points[i].future[k]) for f in runs) / len(runs) for i in rows
            ]
            out[group][key] = {
                "accuracy": _interval([s[group][key]["accuracy"] for s in per_seed]),
                "accuracy_ci95": episode_interval(mean_hits, [points[i].record["id"] for i in rows]),
                "log_loss": _interval([s[group][key]["log_loss"] for s in per_seed]),
                "ece": _interval([s[group][key]["ece"] for s in per_seed]),
                "seeds": [s[group][key]["accuracy"] for s in per_seed],
            }
    return out


def paired_scores(
    points: Sequence[Point], first: Sequence[Sequence[Forecast]], second: Sequence[Sequence[Forecast]], steps: int
) -> dict[str, dict[str, dict]]:
    """first minus second, seed by seed (the i-th run of each): accuracy and log-loss differences as ``{"mean", "lo",
    "hi", "over"}``, the interval over the seed pairs when there are two or more, else over the held-out episodes."""
    pairs = list(zip(first, second))
    if not pairs:
        raise ValueError("need at least one run of each predictor to pair")
    scored = [(score(points, a, steps), score(points, b, steps)) for a, b in pairs]
    out: dict[str, dict[str, dict]] = {}
    for group, rows in _groups(points).items():
        out[group] = {}
        for k in range(steps):
            key = str(k + 1)
            entry = {}
            for metric in ("accuracy", "log_loss"):
                diffs = [a[group][key][metric] - b[group][key][metric] for a, b in scored]
                if len(pairs) > 1:
                    entry[metric] = {**_interval(diffs), "over": "seeds"}
                    continue
                a, b = pairs[0]
                if metric == "accuracy":
                    per_point = [
                        float(same_sentence(a[i].predicted[k], points[i].future[k]))
                        - float(same_sentence(b[i].predicted[k], points[i].future[k]))
                        for i in rows
                    ]
                else:
                    per_point = [
                        math.log(max(b[i].truth_prob[k], MIN_PROB)) - math.log(max(a[i].truth_prob[k], MIN_PROB))
                        for i in rows
                    ]
                lo, hi = episode_interval(per_point, [points[i].record["id"] for i in rows]) or (None, None)
                entry[metric] = {"mean": diffs[0], "lo": lo, "hi": hi, "over": "episodes"}
            out[group][key] = entry
    return out

"""Ceilings of next-state prediction in the synthetic world, computed exactly from the simulator.

Two ceilings, both the expected exact-match accuracy of a Bayes-optimal predictor of the sentence ``k`` seconds
ahead (the largest probability of that sentence's distribution, averaged over prediction points):

* **full state** (``k_step_ceilings``): the predictor knows the simulator's whole state at the end of the observed
  seconds (heights, speeds, the lit call lamp, how many balls the bin holds), as the frames show it;
* **from sentences** (``sentence_predictive``): the predictor knows only the observed *sentences*. Its distribution is
  the posterior mixture over every scene start (``scenes.scene_prior``) and every run of outcomes that would have
  produced exactly those sentences (``posterior``), pushed ``k`` seconds on. No sentence-level predictor can do better;
  the entropy of that distribution is the log-loss a perfect sentence-level predictor pays.

``ceiling`` summarises the one-step full-state ceiling of recorded episodes.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Iterator, Sequence

from world_model.data.synthetic.scenes import SCENE_TYPES, Scene, scene_prior
from world_model.data.synthetic.simulation import DEFAULT_FPS, Episode, replay

Belief = list[tuple[float, Scene]]


def state_key(scene: Scene) -> str:
    """A key equal for two scenes exactly when their whole states are."""
    return repr(sorted(vars(scene).items()))


def k_step_distributions(scene: Scene | Belief, steps: int) -> list[list[tuple[str, float]]]:
    """Exact distribution of the sentence of each of the next ``steps`` seconds from the scene's current state (or
    from a mixture of states, ``[(probability, scene)]``): entry ``k - 1`` is that of the ``k``-th second ahead,
    most likely first (ties alphabetically). Walks the tree of every second's ``choices()`` on copies of the scene;
    branches that reach the same full state are merged, so the tree stays as wide as the set of reachable states."""
    if steps < 1:
        raise ValueError(f"need steps >= 1, got {steps}")
    frontier = [(1.0, scene)] if isinstance(scene, Scene) else list(scene)
    distributions = []
    for _ in range(steps):
        mass: dict[str, float] = {}
        states: dict[str, tuple[float, Scene]] = {}
        for p, state in frontier:
            for q, outcome in state.choices():
                if q <= 0:
                    continue
                child = copy.deepcopy(state)
                text, _ = child.advance(outcome)
                mass[text] = mass.get(text, 0.0) + p * q
                key = state_key(child)
                states[key] = (states[key][0] + p * q, child) if key in states else (p * q, child)
        distributions.append(sorted(mass.items(), key=lambda item: (-item[1], item[0])))
        frontier = list(states.values())
    return distributions


@lru_cache(maxsize=16)
def _after_first_second(scenes: tuple[str, ...], fps: int) -> dict[str, Belief]:
    """For each sentence a first second can have, the (unnormalised) states it leaves, over every scene start of
    every scene type in ``scenes`` (drawn uniformly, as ``simulation.simulate`` draws them)."""
    split: dict[str, dict[str, tuple[float, Scene]]] = {}
    for kind in scenes:
        for p, start in scene_prior(kind, fps):
            for q, outcome in start.choices():
                child = copy.deepcopy(start)
                text, _ = child.advance(outcome)
                states = split.setdefault(text, {})
                key = state_key(child)
                weight = p * q / len(scenes)
                states[key] = (states[key][0] + weight, child) if key in states else (weight, child)
    return {text: list(states.values()) for text, states in split.items()}


def beliefs(sentences: Sequence[str], scenes: Sequence[str] = SCENE_TYPES, fps: int = DEFAULT_FPS) -> Iterator[Belief]:
    """The states the world can be in after each prefix of the observed ``sentences`` (seconds 0, 1, ...): for
    prefix length 1, 2, ..., every reachable state with its posterior probability (they sum to 1; equal states are
    merged). Raises ``ValueError`` when no start and no run of outcomes produces a prefix (a sentence the world never
    says, or one that cannot follow the others)."""
    if not sentences:
        raise ValueError("need at least one observed sentence")
    belief = _after_first_second(tuple(scenes), fps).get(sentences[0], [])
    if not belief:
        raise ValueError(f"no scene of {list(scenes)} begins with {sentences[0]!r}")
    total = sum(p for p, _ in belief)
    yield [(p / total, state) for p, state in belief]
    for t, observed in enumerate(sentences[1:], start=1):
        states: dict[str, tuple[float, Scene]] = {}
        for p, state in belief:
            for q, outcome in state.choices():
                child = copy.deepcopy(state)
                text, _ = child.advance(outcome)
                if text == observed and q > 0:
                    key = state_key(child)
                    states[key] = (states[key][0] + p * q, child) if key in states else (p * q, child)
        if not states:
            raise ValueError(f"no state of the world produces sentence {t} ({observed!r}) after the ones before it")
        total = sum(p for p, _ in states.values())
        belief = [(p / total, state) for p, state in states.values()]
        yield belief


def posterior(sentences: Sequence[str], scenes: Sequence[str] = SCENE_TYPES, fps: int = DEFAULT_FPS) -> Belief:
    """The belief after all of the observed ``sentences`` (see ``beliefs``)."""
    *_, belief = beliefs(sentences, scenes, fps)
    return belief


def entropy(distribution: Sequence[tuple[str, float]]) -> float:
    """Shannon entropy in nats of a ``[(sentence, probability)]`` distribution."""
    return -sum(p * math.log(p) for _, p in distribution if p > 0)


def sentence_predictive(
    sentences: Sequence[str], steps: int, scenes: Sequence[str] = SCENE_TYPES, fps: int = DEFAULT_FPS
) -> list[list[tuple[str, float]]]:
    """The Bayes-optimal distribution of the sentence ``k`` seconds after the observed ``sentences`` (k = 1..steps)
    given only those sentences, most likely first: the posterior mixture's ``k_step_distributions``."""
    return k_step_distributions(posterior(sentences, scenes, fps), steps)


def k_step_ceilings(
    episode: dict | int, observe: int, steps: int, scenes: Sequence[str] = SCENE_TYPES, fps: int = DEFAULT_FPS
) -> list[float]:
    """Expected exact-match accuracy of the Bayes-optimal predictor of the sentence ``k`` seconds
    ahead (``k = 1..steps``) for one episode, after it has seen seconds ``0..observe-1`` (the
    simulator's full state at the end of second ``observe - 1``): the largest probability of each
    ``k``-step distribution. ``episode`` is an episode record (its seed and fps are used, and the
    replayed sentences are checked against its own) or an episode seed (then ``fps`` is used).

    Raises ``ValueError`` when the replay does not reproduce the record (e.g. other ``scenes``)."""
    if observe < 1:
        raise ValueError(f"need observe >= 1, got {observe}")
    if isinstance(episode, dict):
        if observe > len(episode["sentences"]):
            raise ValueError(
                f"episode {episode.get('id', episode['seed'])} has {len(episode['sentences'])} seconds; "
                f"cannot observe {observe}"
            )
        scene, sentences = replay(episode["seed"], observe, scenes, episode["fps"])
        recorded = [s["text"] for s in episode["sentences"][:observe]]
        if scene.kind != episode["scene"] or sentences != recorded:
            raise ValueError(
                f"episode {episode.get('id', episode['seed'])}: replaying seed {episode['seed']} with "
                f"scene types {list(scenes)} does not reproduce its record; pass the scene types it was "
                "generated with (summary.json 'scene_types')"
            )
    else:
        scene, _ = replay(episode, observe, scenes, fps)
    return [dist[0][1] for dist in k_step_distributions(scene, steps)]


def ceiling(records: Sequence[dict], weights: Sequence[float] | None = None) -> dict:
    """Expected exact-match accuracy of the Bayes-optimal next-sentence predictor over the
    prediction steps of ``records`` (episode records or Episodes), computed from the recorded
    distributions: ``{"overall", "per_scene": {kind: value}, "steps": {kind: count}}`` (a value
    is None when there is no step). ``weights`` weight whole episodes (default 1 each)."""
    weights = [1.0] * len(records) if weights is None else list(weights)
    hit: dict[str, float] = {}
    mass: dict[str, float] = {}
    steps: dict[str, int] = {}
    for record, w in zip(records, weights, strict=True):
        if isinstance(record, Episode):
            kind, dists = record.kind, [[p for _, p in dist] for dist in record.next]
        else:
            kind, dists = record["scene"], [[p for _, p in step["distribution"]] for step in record["next"]]
        for probs in dists:
            hit[kind] = hit.get(kind, 0.0) + w * max(probs)
            mass[kind] = mass.get(kind, 0.0) + w
            steps[kind] = steps.get(kind, 0) + 1
    per_scene = {k: hit[k] / mass[k] if mass[k] else None for k in sorted(hit)}
    total = sum(mass.values())
    return {
        "overall": sum(hit.values()) / total if total else None,
        "per_scene": per_scene,
        "steps": dict(sorted(steps.items())),
    }


def sentence_ceiling(records: Sequence[dict], scenes: Sequence[str] = SCENE_TYPES) -> dict:
    """The one-step ceiling from sentences over the prediction steps of episode ``records`` (each second t >= 1
    predicted from the sentences of seconds 0..t-1), in ``ceiling``'s form, with the mean entropy (nats) of the
    Bayes-optimal distributions beside it: ``{"overall", "per_scene", "entropy": {"overall", "per_scene"}, "steps"}``."""
    hit: dict[str, float] = {}
    nats: dict[str, float] = {}
    steps: dict[str, int] = {}
    for record in records:
        kind, sentences = record["scene"], [s["text"] for s in record["sentences"]]
        for belief in list(beliefs(sentences, scenes, record["fps"]))[:-1]:
            (dist,) = k_step_distributions(belief, 1)
            hit[kind] = hit.get(kind, 0.0) + dist[0][1]
            nats[kind] = nats.get(kind, 0.0) + entropy(dist)
            steps[kind] = steps.get(kind, 0) + 1
    total = sum(steps.values())
    return {
        "overall": sum(hit.values()) / total if total else None,
        "per_scene": {k: hit[k] / steps[k] for k in sorted(hit)},
        "entropy": {
            "overall": sum(nats.values()) / total if total else None,
            "per_scene": {k: nats[k] / steps[k] for k in sorted(nats)},
        },
        "steps": dict(sorted(steps.items())),
    }

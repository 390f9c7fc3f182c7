"""Ceilings of next-state prediction in the synthetic world, from the simulator's exact distributions.

The *ceiling* is the expected exact-match accuracy of the Bayes-optimal next-sentence predictor,
i.e. the mean over all prediction steps of the next sentence's distribution's largest probability:
it conditions on the simulator's full state (what the frames up to second ``t`` show: heights,
speeds, the lit call lamp, who is inside), so a predictor that reads only the sentences can score
below it on deterministic steps whose timing depends on continuous quantities (when a box reaches
the wall, when a ball settles). ``k_step_ceilings`` extends it to the sentence ``k`` seconds ahead by
enumerating every branch of the draws to come.
"""

from __future__ import annotations

import copy
from typing import Sequence

from world_model.data.synthetic.scenes import SCENE_TYPES, Scene
from world_model.data.synthetic.simulation import DEFAULT_FPS, Episode, replay


def k_step_distributions(scene: Scene, steps: int) -> list[list[tuple[str, float]]]:
    """Exact distribution of the sentence of each of the next ``steps`` seconds from the scene's
    current state: entry ``k - 1`` is that of the ``k``-th second ahead, most likely first (ties
    alphabetically). Walks the tree of every second's ``choices()`` on copies of the scene; branches
    that reach the same full state are merged, so the tree stays as wide as the set of reachable states."""
    if steps < 1:
        raise ValueError(f"need steps >= 1, got {steps}")
    frontier = [(1.0, scene)]
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
                key = repr(sorted(vars(child).items()))
                states[key] = (states[key][0] + p * q, child) if key in states else (p * q, child)
        distributions.append(sorted(mass.items(), key=lambda item: (-item[1], item[0])))
        frontier = list(states.values())
    return distributions


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

"""Running the synthetic world's scenes: seeded episodes, one semantic state per second, rendered to frames.

Second ``t`` of an episode covers the frames of ``[t, t + 1)`` and is described by one sentence
(``scenes``). Each second's random draw (if any) is made at its start, from a finite set of outcomes
with known probabilities, so for the state reached at the end of second ``t`` the simulator
enumerates the exact distribution of the sentence of second ``t + 1`` (``next_distribution``).

Splits: episode ``i`` of base seed ``S`` uses ``episode_seed = 2 * (S * MAX_EPISODES + i) + b`` with
``b = 0`` for ``train`` and ``b = 1`` for ``heldout``: training seeds are even and held-out seeds
odd, so the two splits never share an episode seed whatever the base seeds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from world_model.data.synthetic.scenes import SCENE_TYPES, SCENES, Scene, make_scene

SPLITS = ("train", "heldout")
MAX_EPISODES = 1_000_000  # per base seed; keeps the episode seed streams of different base seeds apart
DEFAULT_SECONDS = 14  # long enough that a sentence can depend on one ten seconds before it (scenes)
DEFAULT_FPS = 12
DEFAULT_SIZE = 96
MIN_SIZE = 16  # pixels a side: the smallest frame the scenes are drawn legibly in (the tests' worlds)
# How the offline pack sees one second of a clip: STATE_FRAMES frames of it (first, middle, last) tiled left to right
# into one strip of STRIP_SIZE (encoders.world_dataset decodes them; the pack's captioner reads and its renderer draws them).
STATE_FRAMES = 3
STRIP_SIZE = (48, 144)  # (height, width): three 48 x 48 frames


def next_distribution(scene: Scene) -> list[tuple[str, float]]:
    """Exact distribution of the sentence of the next second from the scene's current state, most
    likely first (ties alphabetically). Simulates every outcome of the next draw on a copy."""
    mass: dict[str, float] = {}
    for p, outcome in scene.choices():
        if p > 0:
            text, _ = copy.deepcopy(scene).advance(outcome)
            mass[text] = mass.get(text, 0.0) + p
    return sorted(mass.items(), key=lambda item: (-item[1], item[0]))


Pick = Callable[[list[tuple[float, object]]], int]


def sampler(rng: np.random.Generator) -> Pick:
    """A ``Pick`` that draws each outcome with its probability."""

    def pick(options: list[tuple[float, object]]) -> int:
        if len(options) == 1:
            return 0
        u, total = rng.random(), 0.0
        for i, (p, _) in enumerate(options):
            total += p
            if u < total:
                return i
        return len(options) - 1

    return pick


@dataclass
class Episode:
    """A simulated episode: one sentence per second, the next-sentence distribution after every
    second but the last, and per-frame snapshots (``frames()`` renders them)."""

    scene: Scene = field(repr=False)
    sentences: list[str]
    next: list[list[tuple[str, float]]]
    snapshots: list[list[dict]] = field(repr=False)
    seed: int | None = None
    id: str = ""

    @property
    def kind(self) -> str:
        return self.scene.kind

    def frames(self, size: int = DEFAULT_SIZE) -> list[np.ndarray]:
        """Every frame of the episode in order (``seconds * fps`` of them), each a ``(size, size, 3)`` uint8 RGB image."""
        return [self.scene.draw(snap, size) for second in self.snapshots for snap in second]

    def record(self) -> dict:
        """The episode's JSON record (one line of episodes.jsonl, before the clip's name and size are added)."""
        return {
            "id": self.id,
            "scene": self.kind,
            "seed": self.seed,
            "fps": self.scene.fps,
            "seconds": len(self.sentences),
            "attributes": {k: round(v, 4) if isinstance(v, float) else v for k, v in self.scene.attributes().items()},
            "sentences": [{"second": t, "text": s} for t, s in enumerate(self.sentences)],
            "next": [
                {"from_second": t, "distribution": [[s, p] for s, p in dist], "best": dist[0][0], "best_p": dist[0][1]}
                for t, dist in enumerate(self.next)
            ],
        }


def run_scene(scene: Scene, seconds: int, pick: Pick) -> Episode:
    """Run ``scene`` for ``seconds`` seconds, resolving each draw with ``pick`` (an index into
    ``scene.choices()``)."""
    start = copy.deepcopy(scene)
    sentences, nexts, snapshots = [], [], []
    for t in range(seconds):
        if t:
            nexts.append(next_distribution(scene))
        options = scene.choices()
        text, snaps = scene.advance(options[pick(options)][1])
        sentences.append(text)
        snapshots.append(snaps)
    renderer = start  # attributes and drawing never depend on the dynamic state
    return Episode(renderer, sentences, nexts, snapshots)


def episode_seed(seed: int, index: int, split: str = "train") -> int:
    """The seed of episode ``index`` of base seed ``seed``: even for train, odd for heldout."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if seed < 0 or not 0 <= index < MAX_EPISODES:
        raise ValueError(f"need seed >= 0 and 0 <= index < {MAX_EPISODES}; got seed {seed}, index {index}")
    return 2 * (seed * MAX_EPISODES + index) + SPLITS.index(split)


def simulate(
    ep_seed: int, scenes: Sequence[str] = SCENE_TYPES, seconds: int = DEFAULT_SECONDS, fps: int = DEFAULT_FPS
) -> Episode:
    """The episode of seed ``ep_seed``: its scene type is drawn uniformly from ``scenes``."""
    unknown = [s for s in scenes if s not in SCENES]
    if unknown or not scenes:
        raise ValueError(f"scene types must be among {SCENE_TYPES}; got {list(scenes)}")
    if seconds < 1 or fps < 1:
        raise ValueError(f"need seconds >= 1 and fps >= 1; got {seconds}, {fps}")
    rng = np.random.default_rng(ep_seed)
    kind = scenes[int(rng.integers(len(scenes)))]
    episode = run_scene(make_scene(kind, rng, fps), seconds, sampler(rng))
    episode.seed = ep_seed
    return episode


def replay(
    ep_seed: int, seconds: int, scenes: Sequence[str] = SCENE_TYPES, fps: int = DEFAULT_FPS
) -> tuple[Scene, list[str]]:
    """The scene of episode ``ep_seed`` in the state it reached at the end of its first ``seconds``
    seconds, and the sentences of those seconds. ``simulate`` draws the scene type, the scene's
    attributes and every second's outcome from one generator, in that order; this makes the same
    draws in the same order, so the state is the one the episode actually reached (``scenes`` must
    be the list the episode was generated with: it changes the first draw)."""
    if seconds < 0:
        raise ValueError(f"need seconds >= 0, got {seconds}")
    rng = np.random.default_rng(ep_seed)
    scene = make_scene(scenes[int(rng.integers(len(scenes)))], rng, fps)
    pick = sampler(rng)
    sentences = []
    for _ in range(seconds):
        options = scene.choices()
        text, _ = scene.advance(options[pick(options)][1])
        sentences.append(text)
    return scene, sentences

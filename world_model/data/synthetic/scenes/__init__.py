"""The synthetic world's scene types: small state machines whose physics is integrated at the video frame rate.

| scene | what happens | predicting the next sentence needs |
|---|---|---|
| ``ball`` | a dropped ball falls, bounces lower each time, comes to rest | the drop height, read off the timing |
| ``box`` | a pushed box slides against friction and hits a wall | when it reaches the wall, off the timing |
| ``elevator`` | a car opens, lets someone in or out, closes, goes to a called floor | chance; the called floor |
| ``occlusion`` | a ball or box moves between two walls, behind a screen and out | what hid, which way, how fast |
| ``blocks`` | a ball presses a switch (a lamp lights 4 s later), sets off a row of blocks | row length, speed, switch |
| ``counting`` | balls drop into a bin that overflows at a capacity shown once | the capacity; drops since emptied |
| ``doors`` | people come in by a door, fetch a parcel from a random door, go out | chance; the door they came in by |

Every second is described by exactly one canonical sentence from a fixed template (at most ``MAX_TOKENS`` tokens of
``world_model.text.vocab``, ending with "."). ``make_scene`` builds a scene with its latents and distractors drawn
from a generator; ``scene_prior`` lists every scene a kind can start as, with its probability (``base``).
"""

from __future__ import annotations

import itertools

import numpy as np

from world_model.data.synthetic.scenes.base import COLOURS, FLOOR_PX, MAX_TOKENS, OBJECT_COLOURS, WORLD, Scene, draw
from world_model.data.synthetic.scenes.blocks import BlocksScene
from world_model.data.synthetic.scenes.counting import CountingScene
from world_model.data.synthetic.scenes.doors import DoorsScene
from world_model.data.synthetic.scenes.occlusion import OcclusionScene
from world_model.data.synthetic.scenes.physical import BallScene, BoxScene, ElevatorScene

SCENES: dict[str, type[Scene]] = {
    cls.kind: cls
    for cls in (BallScene, BoxScene, ElevatorScene, OcclusionScene, BlocksScene, CountingScene, DoorsScene)
}
SCENE_TYPES = tuple(SCENES)
FIRST_SCENE_TYPES = ("ball", "box", "elevator")  # the world before memory, interaction and chance were added

__all__ = [
    "COLOURS",
    "FIRST_SCENE_TYPES",
    "FLOOR_PX",
    "MAX_TOKENS",
    "OBJECT_COLOURS",
    "SCENES",
    "SCENE_TYPES",
    "WORLD",
    "Scene",
    "make_scene",
    "scene_of",
    "scene_prior",
]

# The words that tell which scene a sentence comes from, tried in order (the last two scenes' words occur in others).
SCENE_WORDS = (
    ("elevator", {"elevator"}),
    ("doors", {"door", "room", "parcel"}),
    ("counting", {"bin", "chute"}),
    ("blocks", {"block", "blocks", "switch", "lamp"}),
    ("occlusion", {"screen", "left", "right"}),
    ("box", {"box"}),
    ("ball", {"ball"}),
)


def make_scene(kind: str, rng: np.random.Generator, fps: int) -> Scene:
    """A scene of ``kind`` with its latents drawn from ``rng`` in order, then its distractors."""
    cls = SCENES[kind]
    latents = {name: draw(rng, distribution) for name, distribution in cls.latents().items()}
    return cls(fps, latents, rng)


def scene_prior(kind: str, fps: int) -> list[tuple[float, Scene]]:
    """Every start of a scene of ``kind``: one scene (default distractors) per combination of its latents, with the
    probability ``make_scene`` draws that combination."""
    cls = SCENES[kind]
    names, distributions = zip(*cls.latents().items())
    prior = []
    for combination in itertools.product(*distributions):
        p = float(np.prod([q for q, _ in combination]))
        prior.append((p, cls(fps, dict(zip(names, (v for _, v in combination))))))
    return prior


def scene_of(sentence: str) -> str:
    """The scene type a sentence of the synthetic world speaks of (``SCENE_WORDS``), else "other"."""
    words = set(sentence.lower().replace(".", " ").split())
    return next((kind for kind, cues in SCENE_WORDS if words & cues), "other")

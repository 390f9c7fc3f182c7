"""A seeded procedural world of simple physical scenes, for training and scoring next-state predictors.

    python -m world_model.data.synthetic.world generate --episodes N --seed S --out DIR [--split train|heldout]
                                                   [--scenes ball,box,elevator] [--seconds 8] [--fps 12] [--size 96]

Scene types (each a small state machine whose physics is integrated at the video frame rate):

* ``ball``: a ball dropped from rest falls under gravity, bounces off the floor with restitution
  ``BALL_RESTITUTION`` (each bounce lower than the one before) and comes to rest once its rebound
  speed drops below ``BALL_REST_SPEED``. Deterministic.
* ``box``: a box pushed toward a wall slides with constant friction, hits the wall (inelastically)
  and stays there. Deterministic.
* ``elevator``: a car in a four-floor shaft opens its doors, lets a person walk in or out (or nobody
  moves), closes its doors, is called to another floor and moves one floor per second until it
  stops there. Stochastic: who boards (``P_ENTER``, ``P_LEAVE``) and which floor calls next
  (``CALL_WEIGHTS``).

Colour and size (named in the sentences, as a viewer sees them), horizontal position, drop height,
push speed, start floor and the person's colour (not named) are distractors drawn per episode.

One semantic state per second: second ``t`` covers the frames of ``[t, t + 1)`` and is described by
exactly one canonical sentence from a fixed template (at most 16 tokens of ``world_model.text.vocab``,
ending with "."). Each second's random draw (if any) is made at its start, from a finite set of
outcomes with known probabilities, so for the state reached at the end of second ``t`` the simulator
enumerates the exact distribution of the sentence of second ``t + 1``. The *ceiling* is the
expected exact-match accuracy of the Bayes-optimal next-sentence predictor, i.e. the mean over all
prediction steps of that distribution's largest probability: it conditions on the simulator's full
state (what the frames up to second ``t`` show: heights, speeds, the lit call lamp, who is inside),
so a predictor that reads only the sentences can score below it on deterministic steps whose timing
depends on continuous quantities (when a box reaches the wall, when a ball settles).

Splits: episode ``i`` of base seed ``S`` uses ``episode_seed = 2 * (S * MAX_EPISODES + i) + b`` with
``b = 0`` for ``train`` and ``b = 1`` for ``heldout``: training seeds are even and held-out seeds
odd, so the two splits never share an episode seed whatever the base seeds.

Output of ``generate``: ``DIR/<split>/episode_00000.mp4`` (H.264, ``fps`` frames a second),
``DIR/<split>/episodes.jsonl`` (one record per episode, byte-identical for the same arguments) and
``DIR/<split>/summary.json`` (counts per scene type, sentence vocabulary, ceiling).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import cv2
import numpy as np

from world_model.text.vocab import Vocabulary, tokenize
from world_model.utils.video import write_video

SCENE_TYPES = ("ball", "box", "elevator")
SPLITS = ("train", "heldout")
MAX_EPISODES = 1_000_000  # per base seed; keeps the episode seed streams of different base seeds apart
MAX_TOKENS = 16
DEFAULT_SECONDS = 8
DEFAULT_FPS = 12
DEFAULT_SIZE = 96
# How the offline pack sees one second of a clip: STATE_FRAMES frames of it (first, middle, last) tiled left to right
# into one strip of STRIP_SIZE (encoders.world_dataset decodes them; the pack's captioner reads and its renderer draws them).
STATE_FRAMES = 3
STRIP_SIZE = (48, 144)  # (height, width): three 48 x 48 frames

WORLD = 4.0  # the square world is WORLD x WORLD units; y = 0 is the floor
FLOOR_PX = 8  # floor band at the bottom of the image, in pixels

COLOURS = {  # RGB
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 200, 30),
    "purple": (150, 60, 190),
    "orange": (240, 130, 30),
}
BACKGROUND = (235, 235, 235)
FLOOR_COLOUR = (90, 90, 90)
WALL_COLOUR = (60, 60, 60)

GRAVITY = 4.0  # units / s^2 (slow, so a fall spans a second or more)
BALL_RESTITUTION = 0.7
BALL_REST_SPEED = 0.5  # rebound speed below which the ball stays on the floor
BALL_RADIUS = {"small": 0.12, "large": 0.22}
BALL_DROP = (2.1, 2.8)  # drop heights (of the ball's bottom): the first second is always a fall

BOX_FRICTION = 0.25  # deceleration, units / s^2
BOX_HIT_TIME = (1.3, 3.6)  # seconds from the push to the wall (the push speed follows from it)
BOX_SIDE = {"small": 0.45, "large": 0.75}
BOX_WALL_X = 3.5  # left face of the wall
BOX_START = (0.15, 0.8)

FLOOR_NAMES = {1: "one", 2: "two", 3: "three", 4: "four"}
P_ENTER = 0.5  # an empty car at open doors: a person walks in
P_LEAVE = 0.7  # an occupied car at open doors: the person walks out
CALL_WEIGHTS = {1: 2.0, 2: 1.0, 3: 1.0, 4: 1.0}  # next call, among the floors other than the current one


def _smooth(s: float) -> float:
    s = min(max(s, 0.0), 1.0)
    return s * s * (3 - 2 * s)


class Scene:
    """One scene's state. ``choices()`` lists the outcomes of the draw made at the start of the
    next second as ``(probability, outcome)``; ``advance(outcome)`` integrates that second at
    ``fps`` and returns its sentence and one snapshot (a dict) per frame; ``draw`` renders a
    snapshot. Everything but the draw is deterministic."""

    kind = ""

    def __init__(self, fps: int):
        self.fps = fps
        self.second = 0

    def choices(self) -> list[tuple[float, object]]:
        return [(1.0, None)]

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        raise NotImplementedError

    def attributes(self) -> dict:
        raise NotImplementedError

    def draw(self, snap: dict, size: int) -> np.ndarray:
        raise NotImplementedError


def _canvas(size: int) -> np.ndarray:
    image = np.empty((size, size, 3), np.uint8)
    image[:] = BACKGROUND
    image[size - FLOOR_PX :] = FLOOR_COLOUR
    return image


def _px_scale(size: int) -> float:
    return (size - FLOOR_PX) / WORLD


def ball_center_px(x: float, y: float, radius: float, size: int) -> tuple[float, float]:
    """(column, row) of the centre of a ball whose bottom is at height ``y``, in pixel-centre
    coordinates (the floor band's top edge lies at row ``size - FLOOR_PX - 0.5``)."""
    s = _px_scale(size)
    return x * s, size - FLOOR_PX - 0.5 - (y + radius) * s


class BallScene(Scene):
    kind = "ball"

    def __init__(self, rng: np.random.Generator, fps: int):
        super().__init__(fps)
        self.colour = str(rng.choice(list(COLOURS)))
        self.size_word = str(rng.choice(list(BALL_RADIUS)))
        self.radius = BALL_RADIUS[self.size_word]
        self.x = float(rng.uniform(0.6, 3.4))
        self.drop = float(rng.uniform(*BALL_DROP))
        self.y, self.v, self.t = self.drop, 0.0, 0.0
        self.resting = False
        self.impacts: list[tuple[float, float]] = []  # (time, rebound speed)

    def attributes(self) -> dict:
        return {"colour": self.colour, "size": self.size_word, "x": self.x, "drop_height": self.drop}

    def _step(self, dt: float) -> None:
        end = self.t + dt
        while not self.resting and self.t < end:
            left = end - self.t
            t_hit = (self.v + math.sqrt(max(self.v * self.v + 2 * GRAVITY * self.y, 0.0))) / GRAVITY
            if t_hit > left:
                self.y = max(self.y + self.v * left - 0.5 * GRAVITY * left * left, 0.0)
                self.v -= GRAVITY * left
                self.t = end
                break
            self.t += t_hit
            rebound = -(self.v - GRAVITY * t_hit) * BALL_RESTITUTION
            self.y = 0.0
            if rebound < BALL_REST_SPEED:
                self.v, self.resting = 0.0, True
            else:
                self.v = rebound
                self.impacts.append((self.t, rebound))
        self.t = end

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        rested_before, v_start, bounces = self.resting, self.v, len(self.impacts)
        snaps = []
        for _ in range(self.fps):
            snaps.append({"t": self.t, "x": self.x, "y": self.y, "v": self.v, "resting": self.resting})
            self._step(1.0 / self.fps)
        self.second += 1
        name = f"the {self.size_word} {self.colour} ball"
        if rested_before:
            text = f"{name} rests on the floor."
        elif self.resting:
            text = f"{name} comes to rest on the floor."
        elif len(self.impacts) > bounces:
            text = f"{name} bounces off the floor."
        elif v_start > 0 and self.v > 0:
            text = f"{name} rises into the air."
        elif v_start > 0:
            text = f"{name} rises and starts to fall."
        else:
            text = f"{name} falls toward the floor."
        return text, snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = _canvas(size)
        cx, cy = ball_center_px(snap["x"], snap["y"], self.radius, size)
        r = self.radius * _px_scale(size)
        rows, cols = np.ogrid[:size, :size]
        image[(rows - cy) ** 2 + (cols - cx) ** 2 <= r * r] = COLOURS[self.colour]  # pixel centres inside the disc
        return image


class BoxScene(Scene):
    kind = "box"

    def __init__(self, rng: np.random.Generator, fps: int):
        super().__init__(fps)
        self.colour = str(rng.choice(list(COLOURS)))
        self.size_word = str(rng.choice(list(BOX_SIDE)))
        self.side = BOX_SIDE[self.size_word]
        self.x = float(rng.uniform(*BOX_START))  # left face
        gap = BOX_WALL_X - self.x - self.side
        hit = float(rng.uniform(*BOX_HIT_TIME))  # gap = v t - a t^2 / 2 at t = hit, still moving then
        self.v = self.push = gap / hit + BOX_FRICTION * hit / 2
        self.start = self.x
        self.stopped = False
        self.hit_time: float | None = None
        self.t = 0.0

    def attributes(self) -> dict:
        return {"colour": self.colour, "size": self.size_word, "start_x": self.start, "push_speed": self.push}

    def _step(self, dt: float) -> None:
        if not self.stopped:
            run = min(dt, self.v / BOX_FRICTION)
            x = self.x + self.v * run - 0.5 * BOX_FRICTION * run * run
            if x + self.side >= BOX_WALL_X:
                # time of contact: x + v t - a t^2 / 2 = wall - side
                gap = BOX_WALL_X - self.side - self.x
                t_hit = (self.v - math.sqrt(max(self.v * self.v - 2 * BOX_FRICTION * gap, 0.0))) / BOX_FRICTION
                self.x, self.v, self.stopped, self.hit_time = BOX_WALL_X - self.side, 0.0, True, self.t + t_hit
            else:
                self.x, self.v = x, self.v - BOX_FRICTION * run
                if self.v <= 0:
                    self.v, self.stopped = 0.0, True
        self.t += dt

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        stopped_before, first = self.stopped, self.second == 0
        snaps = []
        for _ in range(self.fps):
            snaps.append({"t": self.t, "x": self.x, "v": self.v})
            self._step(1.0 / self.fps)
        self.second += 1
        name = f"the {self.size_word} {self.colour} box"
        if stopped_before:
            text = f"{name} rests against the wall."
        elif self.stopped:
            text = f"{name} hits the wall and stops."
        elif first:
            text = f"{name} is pushed toward the wall."
        else:
            text = f"{name} slides toward the wall."
        return text, snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = _canvas(size)
        s = _px_scale(size)
        floor = size - FLOOR_PX
        image[int(floor - 3.2 * s) : floor, round(BOX_WALL_X * s) : round((BOX_WALL_X + 0.2) * s)] = WALL_COLOUR
        left, right = snap["x"] * s, (snap["x"] + self.side) * s
        cv2.rectangle(
            image,
            (round(left * 16), round((floor - self.side * s) * 16)),
            (round(right * 16) - 16, (floor - 1) * 16),
            COLOURS[self.colour],
            -1,
            cv2.LINE_8,
            4,
        )
        return image


class ElevatorScene(Scene):
    kind = "elevator"

    def __init__(self, rng: np.random.Generator, fps: int):
        super().__init__(fps)
        self.floor = int(rng.integers(1, 5))
        self.pos = float(self.floor)
        self.occupied = bool(rng.random() < 0.5)
        self.shirt = str(rng.choice(list(COLOURS)))
        self.phase = "open"
        self.doors = 0.0  # 0 closed, 1 open
        self.target: int | None = None
        self.start_floor, self.start_occupied = self.floor, self.occupied

    def attributes(self) -> dict:
        return {"start_floor": self.start_floor, "start_occupied": self.start_occupied, "shirt": self.shirt}

    def choices(self) -> list[tuple[float, object]]:
        if self.phase == "board":
            p = P_LEAVE if self.occupied else P_ENTER
            return [(p, "leave" if self.occupied else "enter"), (round(1 - p, 12), "stay")]
        if self.phase == "move" and self.target is None:
            floors = [f for f in sorted(CALL_WEIGHTS) if f != self.floor]
            total = sum(CALL_WEIGHTS[f] for f in floors)
            return [(CALL_WEIGHTS[f] / total, f) for f in floors]
        return [(1.0, None)]

    def _snap(self, person: float | None) -> dict:
        # person: None (nobody visible), else the person's x as a fraction from the car (0) to the landing (1)
        return {"pos": self.pos, "doors": self.doors, "person": person, "target": self.target}

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        n, here = self.fps, FLOOR_NAMES[self.floor]
        snaps = []
        if self.phase == "open":
            for k in range(n):
                self.doors = _smooth(k / n)
                snaps.append(self._snap(0.0 if self.occupied else None))
            self.doors, self.phase = 1.0, "board"
            text = (
                f"the elevator opens its doors on floor {here} with a person inside."
                if self.occupied
                else f"the empty elevator opens its doors on floor {here}."
            )
        elif self.phase == "board":
            for k in range(n):
                s = _smooth(k / n)
                person = {"enter": 1.0 - s, "leave": s}.get(outcome, 0.0 if self.occupied else None)
                snaps.append(self._snap(person))
            if outcome == "enter":
                self.occupied = True
                text = f"a person walks into the elevator on floor {here}."
            elif outcome == "leave":
                self.occupied = False
                text = f"a person walks out of the elevator on floor {here}."
            else:
                text = f"the elevator waits on floor {here} with its doors open."
            self.phase = "close"
        elif self.phase == "close":
            for k in range(n):
                self.doors = 1.0 - _smooth(k / n)
                snaps.append(self._snap(0.0 if self.occupied else None))
            self.doors, self.phase = 0.0, "move"
            text = f"the elevator closes its doors on floor {here}."
        else:
            if self.target is None:
                self.target = int(outcome)
            step = 1 if self.target > self.floor else -1
            for k in range(n):
                self.pos = self.floor + step * _smooth(k / n)
                snaps.append(self._snap(0.0 if self.occupied else None))
            self.floor += step
            self.pos = float(self.floor)
            way, there = ("up" if step > 0 else "down"), FLOOR_NAMES[self.floor]
            if self.floor == self.target:
                text = f"the elevator goes {way} and stops at floor {there}."
                self.target, self.phase = None, "open"
            else:
                text = f"the elevator goes {way} to floor {there} on its way to floor {FLOOR_NAMES[self.target]}."
        self.second += 1
        return text, snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = _canvas(size)
        storey = (size - FLOOR_PX) / 4
        floor_row = lambda f: size - FLOOR_PX - (f - 1) * storey  # bottom row of floor f  # noqa: E731
        shaft_l, shaft_r = round(0.36 * size), round(0.64 * size)
        image[: size - FLOOR_PX, shaft_l:shaft_r] = (200, 200, 200)
        for f in range(2, 5):  # landings
            row = round(floor_row(f))
            image[row - 1 : row + 1] = FLOOR_COLOUR
        image[: size - FLOOR_PX, shaft_l:shaft_r][:, [0, -1]] = WALL_COLOUR
        if snap["target"] is not None:  # the lit call lamp beside the shaft
            row = floor_row(snap["target"]) - storey / 2
            cv2.circle(image, (round(0.3 * size), round(row)), max(2, size // 32), (250, 200, 0), -1)
        bottom = floor_row(snap["pos"])
        top = bottom - storey + 2
        car_l, car_r = shaft_l + 2, shaft_r - 3
        image[round(top) : round(bottom) - 1, car_l : car_r + 1] = (170, 150, 120)
        if snap["person"] is not None:  # body and head; x from the car centre (0) to the landing (1)
            cx = (car_l + car_r) / 2 + snap["person"] * (0.9 * size - (car_l + car_r) / 2)
            h = 0.7 * storey
            colour = COLOURS[self.shirt]
            image[
                round(bottom - 0.6 * h) : round(bottom) - 1, round(cx - 0.08 * storey) : round(cx + 0.08 * storey) + 1
            ] = colour
            cv2.circle(image, (round(cx), round(bottom - 0.8 * h)), max(1, round(0.12 * storey)), (120, 80, 50), -1)
        half = (car_r - car_l + 1) / 2 * (1 - snap["doors"])  # each door panel's width
        if half >= 0.5:
            image[round(top) : round(bottom) - 1, car_l : car_l + round(half)] = (120, 130, 140)
            image[round(top) : round(bottom) - 1, car_r + 1 - round(half) : car_r + 1] = (120, 130, 140)
        return image


SCENES: dict[str, Callable[[np.random.Generator, int], Scene]] = {
    "ball": BallScene,
    "box": BoxScene,
    "elevator": ElevatorScene,
}


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
        return [self.scene.draw(snap, size) for second in self.snapshots for snap in second]

    def record(self) -> dict:
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
    episode = run_scene(SCENES[kind](rng, fps), seconds, sampler(rng))
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
    scene = SCENES[scenes[int(rng.integers(len(scenes)))]](rng, fps)
    pick = sampler(rng)
    sentences = []
    for _ in range(seconds):
        options = scene.choices()
        text, _ = scene.advance(options[pick(options)][1])
        sentences.append(text)
    return scene, sentences


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


def generate(
    episodes: int,
    seed: int,
    out_dir: str | Path,
    split: str = "train",
    scenes: Sequence[str] = SCENE_TYPES,
    seconds: int = DEFAULT_SECONDS,
    fps: int = DEFAULT_FPS,
    size: int = DEFAULT_SIZE,
    overwrite: bool = False,
) -> dict:
    """Write ``episodes`` episodes of ``split`` to ``out_dir/<split>/`` (clips, episodes.jsonl,
    summary.json) and return the summary. The folder is built beside its destination and renamed
    into place when complete; an existing non-empty one is refused unless ``overwrite``."""

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    dest = Path(out_dir) / split
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not overwrite:
        raise FileExistsError(f"{dest} already exists; choose another --out or pass --overwrite")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{split}.partial-"))
    try:
        records, counts = [], {k: 0 for k in scenes}
        for i in range(episodes):
            episode = simulate(episode_seed(seed, i, split), scenes, seconds, fps)
            episode.id = f"{split}-{i:05d}"
            name = f"episode_{i:05d}.mp4"
            write_video(episode.frames(size), staging / name, fps=fps)
            record = {**episode.record(), "video": name, "size": [size, size]}
            records.append(record)
            counts[episode.kind] += 1
        with open(staging / "episodes.jsonl", "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
        sentences = [s["text"] for r in records for s in r["sentences"]]
        summary = {
            "split": split,
            "base_seed": seed,
            "episodes": episodes,
            "scene_types": list(scenes),
            "seconds": seconds,
            "fps": fps,
            "size": [size, size],
            "counts": counts,
            "episode_seeds": "2 * (base_seed * %d + index) + (0 train | 1 heldout)" % MAX_EPISODES,
            "vocabulary": Vocabulary.build(sentences).itos[2:],
            "distinct_sentences": len(set(sentences)),
            "max_tokens": max(len(tokenize(s)) for s in sentences),
            "ceiling": ceiling(records),
        }
        (staging / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m world_model.data.synthetic.world", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write clips, episodes.jsonl and summary.json")
    gen.add_argument("--episodes", type=int, required=True)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--split", choices=SPLITS, default="train")
    gen.add_argument("--scenes", default=",".join(SCENE_TYPES), help="comma-separated scene types")
    gen.add_argument("--seconds", type=int, default=DEFAULT_SECONDS)
    gen.add_argument("--fps", type=int, default=DEFAULT_FPS)
    gen.add_argument("--size", type=int, default=DEFAULT_SIZE)
    gen.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        summary = generate(
            args.episodes,
            args.seed,
            args.out,
            args.split,
            tuple(args.scenes.split(",")),
            args.seconds,
            args.fps,
            args.size,
            args.overwrite,
        )
    except (ValueError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    c = summary["ceiling"]
    per = ", ".join(f"{k} {v:.4f}" for k, v in c["per_scene"].items())
    print(
        f"wrote {summary['episodes']} {args.split} episodes to {args.out / args.split}: {summary['counts']}; "
        f"ceiling {c['overall']:.4f} ({per})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The first three scenes: a dropped ball, a pushed box and an elevator.

* ``ball``: a ball dropped from rest falls under gravity, bounces off the floor with restitution
  ``BALL_RESTITUTION`` (each bounce lower than the one before) and comes to rest once its rebound
  speed drops below ``BALL_REST_SPEED``. Latents: colour, size, drop height (``BALL_DROPS``).
* ``box``: a box pushed toward a wall slides with constant friction, hits the wall (inelastically)
  and stays there. Latents: colour, size, the time it takes to reach the wall (``BOX_HIT_TIMES``).
* ``elevator``: a car in a four-floor shaft opens its doors, lets a person walk in or out (or nobody
  moves), closes its doors, is called to another floor and moves one floor per second until it
  stops there. Latents: start floor, whether someone is inside. Outcomes: who boards (``P_ENTER``,
  ``P_LEAVE``) and which floor calls next (``CALL_WEIGHTS``).

Distractors: the ball's horizontal position, the box's start position (its push speed follows), the
passenger's shirt.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from world_model.data.synthetic.scenes.base import (
    COLOURS,
    FLOOR_COLOUR,
    SIZES,
    WALL_COLOUR,
    Distribution,
    Scene,
    canvas,
    floor_px,
    px_scale,
    smooth,
    uniform,
)

GRAVITY = 4.0  # units / s^2 (slow, so a fall spans a second or more)
BALL_RESTITUTION = 0.7
BALL_REST_SPEED = 0.5  # rebound speed below which the ball stays on the floor
BALL_RADIUS = {"small": 0.12, "large": 0.22}
BALL_DROPS = (2.15, 2.35, 2.55, 2.75)  # drop heights (of the ball's bottom): the first second is always a fall
BALL_X = (0.6, 3.4)  # the ball's horizontal position (a distractor)

BOX_FRICTION = 0.25  # deceleration, units / s^2
BOX_HIT_TIMES = (1.4, 1.8, 2.2, 2.6, 3.1, 3.4)  # seconds from the push to the wall (none on a frame at 4 or 12 fps)
BOX_SIDE = {"small": 0.45, "large": 0.75}
BOX_WALL_X = 3.5  # left face of the wall
BOX_START = (0.15, 0.8)  # the box's start position (a distractor: the push speed makes the hit time the same)

FLOOR_NAMES = {1: "one", 2: "two", 3: "three", 4: "four"}
P_ENTER = 0.5  # an empty car at open doors: a person walks in
P_LEAVE = 0.7  # an occupied car at open doors: the person walks out
CALL_WEIGHTS = {1: 2.0, 2: 1.0, 3: 1.0, 4: 1.0}  # next call, among the floors other than the current one


def appearance() -> dict[str, Distribution]:
    """The latents every named object has: its colour and its size word."""
    return {"colour": uniform(list(COLOURS)), "size": uniform(SIZES)}


class BallScene(Scene):
    """A ball dropped from rest; snapshots ``{"t", "x", "y", "v", "resting"}`` (world units, ``y`` of its bottom)."""

    kind = "ball"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {**appearance(), "drop": uniform(BALL_DROPS)}

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.colour, self.size_word, self.drop = latents["colour"], latents["size"], latents["drop"]
        self.radius = BALL_RADIUS[self.size_word]
        self.x = float(rng.uniform(*BALL_X)) if rng is not None else sum(BALL_X) / 2
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
        image = canvas(size)
        s = px_scale(size)
        cx, cy = snap["x"] * s, size - floor_px(size) - 0.5 - (snap["y"] + self.radius) * s
        rows, cols = np.ogrid[:size, :size]
        image[(rows - cy) ** 2 + (cols - cx) ** 2 <= (self.radius * s) ** 2] = COLOURS[self.colour]
        return image


class BoxScene(Scene):
    """A box pushed toward the wall at ``push`` units / s; snapshots ``{"t", "x", "v"}`` (``x`` of its left face)."""

    kind = "box"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {**appearance(), "hit": uniform(BOX_HIT_TIMES)}

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.colour, self.size_word, self.hit = latents["colour"], latents["size"], latents["hit"]
        self.side = BOX_SIDE[self.size_word]
        self.x = float(rng.uniform(*BOX_START)) if rng is not None else sum(BOX_START) / 2  # left face
        gap = BOX_WALL_X - self.x - self.side
        self.v = self.push = gap / self.hit + BOX_FRICTION * self.hit / 2  # gap = v t - a t^2 / 2 at t = hit
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
        image = canvas(size)
        s, floor = px_scale(size), size - floor_px(size)
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
    """A car cycling open, board, close, move (a floor a second, to the called floor); snapshots
    ``{"pos", "doors", "person", "target"}`` (see ``_snap``)."""

    kind = "elevator"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {"floor": uniform([1, 2, 3, 4]), "occupied": uniform([False, True])}

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.floor = latents["floor"]
        self.pos = float(self.floor)
        self.occupied = latents["occupied"]
        self.shirt = str(rng.choice(list(COLOURS))) if rng is not None else "blue"
        self.phase = "open"
        self.doors = 0.0  # 0 closed, 1 open
        self.target: int | None = None
        self.start_floor, self.start_occupied = self.floor, self.occupied

    def attributes(self) -> dict:
        return {"start_floor": self.start_floor, "start_occupied": self.start_occupied, "shirt": self.shirt}

    def choices(self) -> Distribution:
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
                self.doors = smooth(k / n)
                snaps.append(self._snap(0.0 if self.occupied else None))
            self.doors, self.phase = 1.0, "board"
            text = (
                f"the elevator opens its doors on floor {here} with a person inside."
                if self.occupied
                else f"the empty elevator opens its doors on floor {here}."
            )
        elif self.phase == "board":
            for k in range(n):
                s = smooth(k / n)
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
                self.doors = 1.0 - smooth(k / n)
                snaps.append(self._snap(0.0 if self.occupied else None))
            self.doors, self.phase = 0.0, "move"
            text = f"the elevator closes its doors on floor {here}."
        else:
            if self.target is None:
                self.target = int(outcome)
            step = 1 if self.target > self.floor else -1
            for k in range(n):
                self.pos = self.floor + step * smooth(k / n)
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
        image = canvas(size)
        base = size - floor_px(size)
        storey = base / 4
        floor_row = lambda f: base - (f - 1) * storey  # bottom row of floor f  # noqa: E731
        shaft_l, shaft_r = round(0.36 * size), round(0.64 * size)
        image[:base, shaft_l:shaft_r] = (200, 200, 200)
        for f in range(2, 5):  # landings
            row = round(floor_row(f))
            image[row - 1 : row + 1] = FLOOR_COLOUR
        image[:base, shaft_l:shaft_r][:, [0, -1]] = WALL_COLOUR
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

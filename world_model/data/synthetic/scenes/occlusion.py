"""``occlusion``: an object rolls (a ball) or slides (a box) at a constant speed between two walls, passing behind
a screen in the middle each way. While it is wholly behind the screen the sentence cannot name it ("the screen
hides something."); when it comes out, which object it is, on which side and after how many seconds all follow
from what was seen before it hid: its kind, colour and size, its direction, and its speed ("slowly" or
"quickly", named while it rolls toward the screen; at either speed a pass behind the screen lasts more than a
second and a half).

Latents: kind, colour, size, speed, the side it starts on and where in that lane (``START_OFFSETS``); it always
starts toward the screen. Deterministic after that.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from world_model.data.synthetic.scenes.base import (
    COLOURS,
    WALL_COLOUR,
    WORLD,
    Distribution,
    Scene,
    canvas,
    fill_disc,
    fill_rect,
    uniform,
)
from world_model.data.synthetic.scenes.physical import BALL_RADIUS, appearance

SCREEN = (1.1, 2.9)  # left and right edges of the screen
SCREEN_HEIGHT = 1.5
SCREEN_COLOUR = (120, 110, 100)
LANE = (0.1, 3.9)  # inner faces of the left and right walls
SPEEDS = {"slowly": 0.4, "quickly": 0.8}  # units / s
OCCLUDED_BOX_SIDE = {"small": 0.3, "large": 0.5}
REFERENCE_SIZE = 96  # "hidden" is decided in frames of this size (the video's), so a sentence and its frames agree
START_OFFSETS = (0.0, 0.15)  # gap between the object and its wall at the start (it moves a second before hiding)


@lru_cache(maxsize=1)
def _screen_columns() -> set[int]:
    """The pixel columns the screen covers in a frame of ``REFERENCE_SIZE``."""
    mask = np.zeros((REFERENCE_SIZE, REFERENCE_SIZE, 3), np.uint8)
    fill_rect(mask, SCREEN[0], 0.0, SCREEN[1], SCREEN_HEIGHT, (1, 1, 1))
    return set(np.flatnonzero(mask[..., 0].any(axis=0)).tolist())


class OcclusionScene(Scene):
    """A ball or box moving between the walls behind a central screen; snapshots ``{"x", "v", "hidden"}`` (``x``
    of its centre, ``v`` signed)."""

    kind = "occlusion"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {
            "object": uniform(["ball", "box"]),
            **appearance(),
            "speed": uniform(list(SPEEDS)),
            "side": uniform(["left", "right"]),
            "offset": uniform(START_OFFSETS),
        }

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.object, self.colour, self.size_word = latents["object"], latents["colour"], latents["size"]
        self.speed_word, self.side = latents["speed"], latents["side"]
        self.half = BALL_RADIUS[self.size_word] if self.object == "ball" else OCCLUDED_BOX_SIDE[self.size_word] / 2
        near = LANE[0] + latents["offset"] + self.half
        self.x = near if self.side == "left" else WORLD - near
        self.v = SPEEDS[self.speed_word] * (1 if self.side == "left" else -1)  # toward the screen

    def attributes(self) -> dict:
        return {
            "object": self.object,
            "colour": self.colour,
            "size": self.size_word,
            "speed": self.speed_word,
            "start_side": self.side,
        }

    def hidden(self) -> bool:
        """Whether the object is wholly behind the screen: no pixel of it shows in a frame of ``REFERENCE_SIZE``."""
        mask = np.zeros((REFERENCE_SIZE, REFERENCE_SIZE, 3), np.uint8)
        self._draw_object(mask, self.x, (1, 1, 1))
        columns = np.flatnonzero(mask[..., 0].any(axis=0))
        return bool(len(columns)) and set(columns) <= _screen_columns()

    def _draw_object(self, image: np.ndarray, x: float, colour) -> None:
        if self.object == "ball":
            fill_disc(image, x, self.half, self.half, colour)
        else:
            fill_rect(image, x - self.half, 0.0, x + self.half, 2 * self.half, colour)

    def _step(self, dt: float) -> str | None:
        """Move for ``dt`` seconds, bouncing elastically off the walls; the wall it bounced off, if any."""
        self.x += self.v * dt
        if self.x - self.half < LANE[0]:
            self.x, self.v = 2 * (LANE[0] + self.half) - self.x, -self.v
            return "left"
        if self.x + self.half > LANE[1]:
            self.x, self.v = 2 * (LANE[1] - self.half) - self.x, -self.v
            return "right"
        return None

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        snaps, walls = [], []
        for _ in range(self.fps):
            snaps.append({"x": self.x, "v": self.v, "hidden": self.hidden()})
            wall = self._step(1.0 / self.fps)
            if wall and not walls:
                walls.append(wall)
        self.second += 1
        first, last = snaps[0]["hidden"], snaps[-1]["hidden"]
        name = f"the {self.size_word} {self.colour} {self.object}"
        moves = "rolls" if self.object == "ball" else "slides"
        way = "right" if self.v > 0 else "left"
        if first and last:
            text = "the screen hides something."
        elif last:
            text = f"{name} goes behind the screen."
        elif first:
            text = f"{name} comes out on the {way} of the screen."
        elif walls:
            text = f"{name} bounces off the {walls[0]} wall."
        elif (self.v > 0) == (self.x < WORLD / 2):
            text = f"{name} {moves} {self.speed_word} {way} toward the screen."
        else:
            text = f"{name} {moves} {way} toward the wall."
        return text, snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = canvas(size)
        fill_rect(image, 0.0, 0.0, LANE[0], 2.2, WALL_COLOUR)
        fill_rect(image, LANE[1], 0.0, WORLD, 2.2, WALL_COLOUR)
        self._draw_object(image, snap["x"], COLOURS[self.colour])
        fill_rect(image, SCREEN[0], 0.0, SCREEN[1], SCREEN_HEIGHT, SCREEN_COLOUR)  # in front of the object
        return image

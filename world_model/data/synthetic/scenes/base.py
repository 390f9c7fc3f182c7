"""What every scene of the synthetic world shares: the palette, the canvas, and the ``Scene`` interface.

A scene's randomness comes in two kinds, kept apart so that what the sentences say can be reasoned about exactly:

* **latents** (``Scene.latents()``): the draws a sentence can depend on, each a finite distribution (colour, size,
  drop height, capacity...). They are drawn once, when the scene is built, in the order listed;
* **outcomes** (``Scene.choices()``): the draw made at the start of each second (who boards, which door...).

Everything else a scene draws (a horizontal position, a shirt colour nobody names) is a *distractor*: it changes
the frames, never a sentence. So enumerating the latents with default distractors (``scene_prior``) and then the
outcomes second by second reaches every sentence sequence the scene can produce, with its exact probability.
"""

from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np

MAX_TOKENS = 16  # longest sentence of any scene, in tokens

WORLD = 4.0  # the square world is WORLD x WORLD units; y = 0 is the floor
FLOOR_PX = 8  # floor band at the bottom of an image of 96 pixels (scaled for other sizes: see floor_px)

COLOURS = {  # RGB; the colours a sentence names
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 200, 30),
    "purple": (150, 60, 190),
    "orange": (240, 130, 30),
}
# Objects nobody names by colour, drawn in colours of their own: a block of a row alternates two, a parcel one.
BLOCK_COLOURS = ((30, 170, 170), (230, 110, 170))
PARCEL_COLOUR = (200, 160, 90)
OBJECT_COLOURS = (*COLOURS.values(), *BLOCK_COLOURS, PARCEL_COLOUR)  # what counts as an object in a frame

BACKGROUND = (235, 235, 235)
FLOOR_COLOUR = (90, 90, 90)
WALL_COLOUR = (60, 60, 60)

SIZES = ("small", "large")
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}

Distribution = list[tuple[float, object]]


def uniform(values: Sequence[object]) -> Distribution:
    """Each of ``values`` with probability 1 / len(values)."""
    return [(1.0 / len(values), v) for v in values]


def draw(rng: np.random.Generator, distribution: Distribution) -> object:
    """One value of ``distribution`` drawn with its probability (one ``rng.random()``)."""
    u, total = rng.random(), 0.0
    for p, value in distribution:
        total += p
        if u < total:
            return value
    return distribution[-1][1]


def smooth(s: float) -> float:
    """Smoothstep of ``s`` clipped to [0, 1]: eases doors, cars and people in and out."""
    s = min(max(s, 0.0), 1.0)
    return s * s * (3 - 2 * s)


class Scene:
    """One scene's state. ``latents()`` lists the scene's sentence-relevant draws; ``choices()`` the outcomes of the
    draw made at the start of the next second as ``(probability, outcome)``; ``advance(outcome)`` integrates that
    second at ``fps`` and returns its sentence and one snapshot (a dict) per frame; ``draw`` renders a snapshot as a
    ``(size, size, 3)`` uint8 RGB image. Built with ``rng``, a scene draws its distractors from it; without, it
    takes their defaults. Everything but the draws is deterministic."""

    kind = ""

    def __init__(self, fps: int):
        self.fps = fps
        self.second = 0

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        """The finite distribution of each latent, in draw order."""
        return {}

    def choices(self) -> Distribution:
        return [(1.0, None)]

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        raise NotImplementedError

    def attributes(self) -> dict:
        raise NotImplementedError

    def draw(self, snap: dict, size: int) -> np.ndarray:
        raise NotImplementedError


def floor_px(size: int) -> int:
    """Height of the floor band in an image of ``size`` pixels (8 at 96)."""
    return max(1, round(FLOOR_PX * size / 96))


def canvas(size: int) -> np.ndarray:
    image = np.empty((size, size, 3), np.uint8)
    image[:] = BACKGROUND
    image[size - floor_px(size) :] = FLOOR_COLOUR
    return image


def px_scale(size: int) -> float:
    """Pixels per world unit."""
    return (size - floor_px(size)) / WORLD


def to_px(x: float, y: float, size: int) -> tuple[float, float]:
    """(column, row) of the world point (x, y) in pixel-centre coordinates (the floor band's top edge, y = 0,
    lies at row ``size - floor_px - 0.5``)."""
    s = px_scale(size)
    return x * s - 0.5, size - floor_px(size) - 0.5 - y * s


def fill_disc(image: np.ndarray, x: float, y: float, radius: float, colour: Sequence[int]) -> None:
    """Paint the pixels whose centres lie inside the disc of ``radius`` centred at the world point (x, y)."""
    size = image.shape[0]
    cx, cy = to_px(x, y, size)
    r = radius * px_scale(size)
    rows, cols = np.ogrid[:size, :size]
    image[(rows - cy) ** 2 + (cols - cx) ** 2 <= r * r] = colour


def fill_rect(image: np.ndarray, left: float, bottom: float, right: float, top: float, colour: Sequence[int]) -> None:
    """Paint the pixels whose centres lie inside the world rectangle [left, right] x [bottom, top]."""
    size = image.shape[0]
    s, base = px_scale(size), size - floor_px(size)
    c0, c1 = max(0, int(np.ceil(left * s - 0.5))), min(size, int(np.floor(right * s - 0.5)) + 1)
    r0, r1 = max(0, int(np.ceil(base - top * s - 0.5))), min(size, int(np.floor(base - bottom * s - 0.5)) + 1)
    if c0 < c1 and r0 < r1:
        image[r0:r1, c0:c1] = colour


def fill_polygon(image: np.ndarray, points: Sequence[tuple[float, float]], colour: Sequence[int]) -> None:
    """Paint a convex polygon given by world points (anti-aliasing off, sub-pixel precision)."""
    size = image.shape[0]
    corners = np.array([[round(c * 16) for c in to_px(x, y, size)] for x, y in points], np.int32)
    cv2.fillConvexPoly(image, corners, tuple(int(c) for c in colour), cv2.LINE_8, 4)

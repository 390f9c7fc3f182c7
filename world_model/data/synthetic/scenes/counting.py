"""``counting``: balls drop one a second from a chute into an opaque bin that holds a fixed number of them.

In the first second a sign shows how many balls the bin holds ("a sign says the bin holds three balls."); the sign
then goes and is never shown again. A ball that finds the bin full bounces off it onto the floor; in the next
second the bin empties through a trapdoor, the stray ball rolls away, and counting starts again. Every drop into
the bin reads the same ("a small red ball drops into the bin."): whether the next ball bounces off depends on the
capacity shown at the start and on how many balls dropped since the bin last emptied.

Latents: the balls' colour and size, the capacity (``CAPACITIES``). Deterministic after that.
"""

from __future__ import annotations

import numpy as np

from world_model.data.synthetic.scenes.base import (
    COLOURS,
    NUMBER_WORDS,
    WORLD,
    Distribution,
    Scene,
    canvas,
    fill_disc,
    fill_rect,
    uniform,
)
from world_model.data.synthetic.scenes.physical import BALL_RADIUS, appearance

CAPACITIES = (2, 3, 4)
BIN = (1.4, 2.6, 1.0)  # left, right, height
BIN_COLOUR = (140, 100, 60)
CHUTE = (1.75, 2.25, 3.2)  # left, right, mouth height (it reaches the top of the world)
CHUTE_COLOUR = (80, 80, 80)
SIGN = (0.15, 1.5, 1.6, 2.3)  # left, right, bottom, top
SIGN_COLOUR, DOT_COLOUR = (250, 250, 250), (20, 20, 20)
DROP_SPEED = 2.5  # units / s as a ball leaves the chute (it is in the bin, or off it, within the second)
GRAVITY = 4.0
STRAY_SPEED = (2.0, 0.8)  # a ball bouncing off the full bin: (right, up), units / s


class CountingScene(Scene):
    """A chute over an opaque bin of ``capacity`` balls; snapshots ``{"balls", "sign", "trapdoor"}``: the (x, y)
    centres of the balls in sight, whether the sign and the open trapdoor show."""

    kind = "counting"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {**appearance(), "capacity": uniform(CAPACITIES)}

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.colour, self.size_word, self.capacity = latents["colour"], latents["size"], latents["capacity"]
        self.radius = BALL_RADIUS[self.size_word]
        self.count = 0
        self.phase = "sign"  # sign, fill, empty

    def attributes(self) -> dict:
        return {"colour": self.colour, "size": self.size_word, "capacity": self.capacity}

    def _fall(self, t: float) -> float:
        """Height of a dropped ball's centre ``t`` seconds after it leaves the chute."""
        return CHUTE[2] - self.radius - DROP_SPEED * t - GRAVITY * t * t / 2

    def _landing(self) -> float:
        """Seconds from the chute to the rim of the bin."""
        drop = CHUTE[2] - BIN[2] - 2 * self.radius
        return (-DROP_SPEED + (DROP_SPEED**2 + 2 * GRAVITY * drop) ** 0.5) / GRAVITY

    def _stray(self, s: float) -> tuple[float, float] | None:
        """Centre of a ball ``s`` seconds after it bounced off the full bin (None once it has rolled out of sight):
        it flies off to the right, lands and rolls on."""
        x = 2.0 + STRAY_SPEED[0] * s
        y = max(self.radius, BIN[2] + self.radius + STRAY_SPEED[1] * s - GRAVITY * s * s / 2)
        return (x, y) if x - self.radius < WORLD else None

    def _ball(self, t: float, goes_in: bool) -> tuple[float, float] | None:
        """Where a ball dropped at the start of the second is at ``t`` seconds into it, None out of sight."""
        if t < self._landing() or goes_in:
            y = self._fall(t)
            return (2.0, y) if y + self.radius > BIN[2] else None  # inside the bin once below its rim
        return self._stray(t - self._landing())

    def _snaps(self, what: str) -> list[dict]:
        """One second's snapshots: ``what`` is "sign", "drop" (into the bin), "bounce" or "empty"."""
        snaps = []
        for f in range(self.fps):
            t = f / self.fps
            ball = None
            if what in ("drop", "bounce"):
                ball = self._ball(t, what == "drop")
            elif what == "empty":  # the stray ball rolls on and away
                ball = self._stray(1.0 - self._landing() + t)
            snaps.append(
                {
                    "balls": [] if ball is None else [ball],
                    "sign": what == "sign",
                    "trapdoor": what == "empty" and t >= 0.25,
                }
            )
        return snaps

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        ball = f"a {self.size_word} {self.colour} ball"
        if self.phase == "sign":
            snaps, text = self._snaps("sign"), f"a sign says the bin holds {NUMBER_WORDS[self.capacity]} balls."
            self.phase = "fill"
        elif self.phase == "empty":
            snaps, text = self._snaps("empty"), "the bin empties through its trapdoor."
            self.count, self.phase = 0, "fill"
        elif self.count < self.capacity:
            snaps, text = self._snaps("drop"), f"{ball} drops into the bin."
            self.count += 1
        else:
            snaps, text = self._snaps("bounce"), f"{ball} bounces off the full bin."
            self.phase = "empty"
        self.second += 1
        return text, snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = canvas(size)
        for x, y in snap["balls"]:
            fill_disc(image, x, y, self.radius, COLOURS[self.colour])
        fill_rect(image, BIN[0], 0.0, BIN[1], BIN[2], BIN_COLOUR)  # in front of a ball dropping into it
        if snap["trapdoor"]:
            fill_rect(image, BIN[0] + 0.1, 0.0, BIN[1] - 0.1, 0.12, (30, 30, 30))
        fill_rect(image, CHUTE[0], CHUTE[2], CHUTE[1], 4.0, CHUTE_COLOUR)  # in front of a ball still inside it
        if snap["sign"]:
            left, right, bottom, top = SIGN
            fill_rect(image, left, bottom, right, top, SIGN_COLOUR)
            step = (right - left) / (self.capacity + 1)
            for i in range(self.capacity):
                fill_disc(image, left + step * (i + 1), (bottom + top) / 2, 0.07, DOT_COLOUR)
        return image

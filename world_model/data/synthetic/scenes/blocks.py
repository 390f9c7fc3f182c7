"""``blocks``: interaction and delayed cause. A ball rolls along the floor toward a row of blocks standing in front
of a wall. On its way it rolls over a switch; a lamp lights ``LAMP_DELAY`` seconds after the switch is pressed, and
from then on goes out and lights again every ``LAMP_ON`` seconds. The ball hits the first block and stops; each
block slides one gap in a second and knocks into the next, and the last one slides into the wall.

The first sentence names the ball's speed and the number of blocks; after that, when the ball reaches the blocks,
which block hits the wall, and when the lamp lights and goes out can only be known from earlier sentences ("a
block knocks into the next block." reads the same for every block of the row; when the lamp next changes depends
on when the ball pressed the switch, or on when the lamp last changed). A lamp event is added to the sentence of
the second it happens in ("... and the lamp lights up.").

Latents: the ball's colour, size and speed, where it starts (``START_X``), the number of blocks (``ROW``).
Deterministic after that.
"""

from __future__ import annotations

import numpy as np

from world_model.data.synthetic.scenes.base import (
    BLOCK_COLOURS,
    COLOURS,
    NUMBER_WORDS,
    WALL_COLOUR,
    Distribution,
    Scene,
    canvas,
    fill_disc,
    fill_rect,
    uniform,
)
from world_model.data.synthetic.scenes.physical import BALL_RADIUS, appearance

SPEEDS = {"slowly": 0.3, "quickly": 0.6}  # units / s
START_X = (0.2, 0.35)  # the ball's centre at the start
ROW = (2, 3, 4)  # blocks in the row
SWITCH_X = 1.0  # the ball presses the switch as its centre passes it
WALL_X = 3.7  # the wall's left face
BLOCK = (0.2, 0.5)  # width, height
GAP = 0.25  # between blocks, and between the last block and the wall; a block slides it in one second
LAMP_DELAY = 4.0  # seconds from the switch to the lamp
LAMP_ON = 3.0  # seconds the lamp stays lit, and then dark, in turn
LAMP = (3.0, 3.3, 0.18)  # centre and radius
LAMP_OFF_COLOUR, LAMP_LIT_COLOUR = (100, 100, 100), (255, 240, 160)
SWITCH_COLOUR = (40, 40, 40)


class BlocksScene(Scene):
    """A ball, a switch, a lamp and a row of blocks; snapshots ``{"t", "ball", "blocks", "lamp"}``: the ball's
    centre x, each block's left face, whether the lamp is lit."""

    kind = "blocks"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {**appearance(), "speed": uniform(list(SPEEDS)), "start": uniform(START_X), "row": uniform(ROW)}

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.colour, self.size_word, self.speed_word = latents["colour"], latents["size"], latents["speed"]
        self.start, self.row = latents["start"], latents["row"]
        self.radius = BALL_RADIUS[self.size_word]
        self.speed = SPEEDS[self.speed_word]
        width = BLOCK[0]
        self.lefts = [WALL_X - GAP - (self.row - j) * width - (self.row - 1 - j) * GAP for j in range(self.row)]
        self.t_press = (SWITCH_X - self.start) / self.speed
        self.t_hit = (self.lefts[0] - self.radius - self.start) / self.speed
        self.t_lamp = self.t_press + LAMP_DELAY

    def attributes(self) -> dict:
        return {
            "colour": self.colour,
            "size": self.size_word,
            "speed": self.speed_word,
            "start_x": self.start,
            "blocks": self.row,
        }

    def _at(self, t: float) -> dict:
        """The snapshot at time ``t``."""
        ball = self.start + self.speed * min(t, self.t_hit)
        blocks = [left + GAP * min(max(t - self.t_hit - j, 0.0), 1.0) for j, left in enumerate(self.lefts)]
        return {
            "t": t,
            "ball": ball,
            "blocks": blocks,
            "lamp": t >= self.t_lamp and (t - self.t_lamp) // LAMP_ON % 2 == 0,
        }

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        t0, t1 = self.second, self.second + 1
        snaps = [self._at(t0 + f / self.fps) for f in range(self.fps)]
        within = lambda t: t0 <= t < t1  # noqa: E731
        ball = f"the {self.size_word} {self.colour} ball"
        if t0 == 0:
            text = f"{ball} rolls {self.speed_word} toward a row of {NUMBER_WORDS[self.row]} blocks"
        elif within(self.t_press):
            text = f"{ball} rolls over the switch"
        elif within(self.t_hit):
            text = f"{ball} hits the first block"
        elif t1 <= self.t_hit:
            text = f"{ball} rolls toward the blocks"
        elif within(self.t_hit + self.row):
            text = "the last block hits the wall"
        elif any(within(self.t_hit + j) for j in range(1, self.row)):
            text = "a block knocks into the next block"
        else:
            text = "the ball and the blocks stand still"
        turns = [j for j in range(int(t1 - self.t_lamp) // int(LAMP_ON) + 1) if within(self.t_lamp + j * LAMP_ON)]
        if turns:
            text += " and the lamp lights up" if turns[0] % 2 == 0 else " and the lamp goes out"
        self.second += 1
        return text + ".", snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = canvas(size)
        fill_rect(image, WALL_X, 0.0, WALL_X + 0.2, 2.0, WALL_COLOUR)
        fill_rect(image, SWITCH_X - 0.12, 0.0, SWITCH_X + 0.12, 0.05, SWITCH_COLOUR)
        x, y, r = LAMP
        fill_rect(image, x - 0.02, y, x + 0.02, 4.0, WALL_COLOUR)  # the cord
        fill_disc(image, x, y, r, LAMP_LIT_COLOUR if snap["lamp"] else LAMP_OFF_COLOUR)
        for j, left in enumerate(snap["blocks"]):
            fill_rect(image, left, 0.0, left + BLOCK[0], BLOCK[1], BLOCK_COLOURS[j % 2])
        fill_disc(image, snap["ball"], self.radius, self.radius, COLOURS[self.colour])
        return image

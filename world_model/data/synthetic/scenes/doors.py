"""``doors``: a stochastic agent. People come into a room through one of three doors, walk to a door chosen at
random with known weights (``TARGET_WEIGHTS``, among the two doors they did not come in by), pick up the parcel
that waits there, carry it back to the door they came in by and leave. Walking from one door to the next takes a
second. When the room is empty, a new person comes in with probability ``P_ARRIVE`` each second, through a door
drawn with ``DOOR_WEIGHTS``, in a shirt of a random colour (named). Parcels are restocked behind the doors.

Which door someone walks to is chance; which door they carry the parcel back to, and when they get there, are
known only from the sentence of the second they came in.

Latents: the first person's door and shirt (the first second always brings someone in). Outcomes: the target
door, and each empty second whether someone comes in and through which door in which shirt.
"""

from __future__ import annotations

import numpy as np

from world_model.data.synthetic.scenes.base import (
    COLOURS,
    PARCEL_COLOUR,
    Distribution,
    Scene,
    canvas,
    fill_disc,
    fill_rect,
    smooth,
)

DOORS = {"left": 0.7, "middle": 2.0, "right": 3.3}  # each door's centre; neighbours are a second's walk apart
DOOR_WEIGHTS = {"left": 0.4, "middle": 0.2, "right": 0.4}  # which door a newcomer comes in by
TARGET_WEIGHTS = {"left": 3.0, "middle": 2.0, "right": 1.0}  # which other door they walk to
P_ARRIVE = 0.5
DOOR_SIZE = (0.6, 1.5)  # width, height
DOOR_COLOUR, OPEN_DOOR_COLOUR = (150, 110, 70), (40, 35, 30)
SKIN, LEGS = (235, 190, 150), (60, 60, 80)
PARCEL = 0.22  # side
SHELF = 1.65  # height of the parcels' shelves, above the doors and the people
BEHIND, IN_ROOM = 0.0, 1.0  # a person's depth: in the doorway (drawn inside the door) or in the room


def arrivals() -> Distribution:
    """Who comes in: (door, shirt) with their joint probability."""
    return [(DOOR_WEIGHTS[d] / len(COLOURS), (d, c)) for d in DOORS for c in COLOURS]


class DoorsScene(Scene):
    """A room with three doors, a parcel by each; snapshots ``{"person", "carrying", "open"}``: the person's (x,
    depth) or None, whether they carry a parcel, the open door's name or None."""

    kind = "doors"

    @classmethod
    def latents(cls) -> dict[str, Distribution]:
        return {"arrival": arrivals()}

    def __init__(self, fps: int, latents: dict, rng: np.random.Generator | None = None):
        super().__init__(fps)
        self.door, self.shirt = latents["arrival"]  # the door they came in by
        self.first = latents["arrival"]
        self.phase = "arrive"  # arrive, choose, walk, pick, back, leave, empty
        self.x = DOORS[self.door]
        self.target: str | None = None
        self.carrying = False

    def attributes(self) -> dict:
        door, shirt = self.first
        return {"first_door": door, "first_shirt": shirt}

    def choices(self) -> Distribution:
        if self.phase == "choose":
            others = [d for d in DOORS if d != self.door]
            total = sum(TARGET_WEIGHTS[d] for d in others)
            return [(TARGET_WEIGHTS[d] / total, d) for d in others]
        if self.phase == "empty":
            return [(round(1 - P_ARRIVE, 12), None)] + [(P_ARRIVE * p, who) for p, who in arrivals()]
        return [(1.0, None)]

    def _walk(self, goal: str) -> tuple[list[dict], bool]:
        """One second's walk to the next door toward ``goal``: the snapshots, and whether it got there."""
        order = list(DOORS)
        here, there = order.index(self._at()), order.index(goal)
        start, end = self.x, DOORS[order[here + (1 if there > here else -1)]]
        snaps = [self._snap(start + (end - start) * smooth(f / self.fps), IN_ROOM) for f in range(self.fps)]
        self.x = end
        return snaps, end == DOORS[goal]

    def _at(self) -> str:
        """The door the person stands at."""
        return next(d for d, x in DOORS.items() if x == self.x)

    def _snap(self, x: float | None, depth: float = IN_ROOM, open_door: str | None = None) -> dict:
        return {
            "person": None if x is None else (x, depth),
            "carrying": self.carrying,
            "taken": self.target if self.carrying else None,
            "open": open_door,
        }

    def advance(self, outcome: object) -> tuple[str, list[dict]]:
        n = self.fps
        if self.phase == "choose":
            self.target, self.phase = str(outcome), "walk"
        if self.phase == "empty" and outcome is not None:
            (self.door, self.shirt), self.phase = outcome, "arrive"
            self.x = DOORS[self.door]
        if self.phase == "arrive":
            snaps = [self._snap(self.x, smooth(f / n), self.door) for f in range(n)]
            article = "an" if self.shirt[0] in "aeiou" else "a"
            text = f"a person in {article} {self.shirt} shirt comes in through the {self.door} door."
            self.phase = "choose"
        elif self.phase == "walk":
            snaps, there = self._walk(self.target)
            text = f"the person walks to the {self.target} door."
            if there:
                self.phase = "pick"
        elif self.phase == "pick":
            snaps = []
            for f in range(n):
                self.carrying = f >= n // 2
                snaps.append(self._snap(self.x))
            text = f"the person picks up the parcel at the {self.target} door."
            self.phase = "back"
        elif self.phase == "back":
            snaps, there = self._walk(self.door)
            text = f"the person carries the parcel back to the {self.door} door."
            if there:
                self.phase = "leave"
        elif self.phase == "leave":
            snaps = [self._snap(self.x, 1 - smooth(f / n), self.door) for f in range(n)]
            text = f"the person leaves through the {self.door} door."
            self.phase, self.carrying, self.target = "empty", False, None
        else:
            snaps = [self._snap(None) for _ in range(n)]
            text = "the room is empty."
        self.second += 1
        return text, snaps

    def draw(self, snap: dict, size: int) -> np.ndarray:
        image = canvas(size)
        w, h = DOOR_SIZE
        for name, x in DOORS.items():
            fill_rect(image, x - w / 2, 0.0, x + w / 2, h, OPEN_DOOR_COLOUR if snap["open"] == name else DOOR_COLOUR)
            if snap["taken"] != name:  # the parcel on the shelf above the door
                fill_rect(image, x - PARCEL / 2, SHELF, x + PARCEL / 2, SHELF + PARCEL, PARCEL_COLOUR)
        if snap["person"] is not None:
            x, depth = snap["person"]
            scale = 0.6 + 0.4 * depth  # smaller in the doorway
            fill_rect(image, x - 0.1 * scale, 0.0, x + 0.1 * scale, 0.45 * scale, LEGS)
            fill_rect(image, x - 0.14 * scale, 0.45 * scale, x + 0.14 * scale, 1.0 * scale, COLOURS[self.shirt])
            fill_disc(image, x, 1.13 * scale, 0.13 * scale, SKIN)
            if snap["carrying"]:
                fill_rect(
                    image, x + 0.14 * scale, 0.5 * scale, x + 0.14 * scale + PARCEL, 0.5 * scale + PARCEL, PARCEL_COLOUR
                )
        return image

"""What a rendered state strip shows, measured against the simulator's own drawing of that second.

The synthetic world is drawn in a few flat colours, objects in colours only objects use
(``world_model.data.synthetic.scenes.OBJECT_COLOURS``), so the objects of a frame are the connected regions of
those colours. A rendered frame is not flat: each pixel is read as the nearest colour of the simulator's drawing of
the same second (``palette``; chroma counts half, as video keeps it at half resolution), thin fringes and specks are
dropped, and the regions left are its objects. Counted so, the clips' decoded 96-pixel strips (video compression
smears colour, as the renders learn to) have as many objects as the simulator's drawing of the same frames in
99.5% of 1,470 frames (35 held-out episodes; the misses are slivers of an object at the screen's edge), and the
simulator's frames as many as it drew, slivers under ``MIN_AREA`` pixels aside (``tests/test_render_scores.py``).

Scores of a rendered strip against the true strip of the same second (both (H, 3 H, 3) uint8, ``STATE_FRAMES``
frames side by side):

* ``counts_right``: the fraction of its frames with as many objects as the true frame;
* ``position_error``: per object colour drawn in both frames, the distance between the centres of that colour's
  pixels, in pixels of a 96-pixel frame, averaged (None when no colour is in both);
* ``pixel_error``: the mean absolute difference of the two strips' first frames, in [0, 1] (how far the render
  starts from where the world really was).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from encoders.frames import state_offsets
from world_model.data.synthetic import scenes, simulation
from world_model.data.synthetic.simulation import STATE_FRAMES

REFERENCE_SIZE = 96  # frames are counted at this size (resized to it), positions measured in its pixels
MIN_AREA = 8  # pixels: a smaller region of an object colour (a speck, a sliver at the screen's edge) is no object
CHROMA_WEIGHT = 0.5  # colour distances weigh chroma this much against luma (video keeps chroma at half resolution)
YCBCR = np.array([[0.299, 0.587, 0.114], [-0.169, -0.331, 0.5], [0.5, -0.419, -0.081]], dtype=np.float32)


def palette(true: np.ndarray) -> np.ndarray:
    """(C, 3) int: the object colours, then every other colour of ``true`` (H, W, 3) uint8, the simulator's exact
    drawing of a second."""
    objects = [tuple(int(v) for v in c) for c in scenes.OBJECT_COLOURS]
    drawn = {tuple(int(v) for v in c) for c in np.unique(true.reshape(-1, 3), axis=0)}
    return np.array(objects + sorted(drawn - set(objects)))


def nearest_colours(frame: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 -> (H, W) int: the index in ``colours`` (C, 3) of each pixel's nearest colour, in YCbCr with
    chroma weighted by ``CHROMA_WEIGHT`` (a small object whose colour the video smeared keeps its brightness)."""
    weight = np.array([1.0, CHROMA_WEIGHT, CHROMA_WEIGHT], dtype=np.float32)
    pixels = (frame.reshape(-1, 3).astype(np.float32) @ YCBCR.T) * weight
    reference = (colours.astype(np.float32) @ YCBCR.T) * weight
    distances = ((pixels[:, None, :] - reference[None]) ** 2).sum(axis=-1)
    return distances.argmin(axis=-1).reshape(frame.shape[:2])


def object_regions(frame: np.ndarray, colours: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The objects of one (H, W, 3) uint8 frame, resized to ``REFERENCE_SIZE`` and its pixels read as the nearest of
    ``colours`` (``palette``): (object colour index, (2,) centre (x, y) in pixels) per connected region of an object
    colour that survives an opening with a 2 x 2 square (thin fringes where a blurred edge passes near an object
    colour are no objects) and covers at least ``MIN_AREA`` pixels."""
    if frame.shape[:2] != (REFERENCE_SIZE, REFERENCE_SIZE):
        frame = cv2.resize(frame, (REFERENCE_SIZE, REFERENCE_SIZE), interpolation=cv2.INTER_LINEAR)
    labels = nearest_colours(frame, colours)
    regions = []
    for index in range(len(scenes.OBJECT_COLOURS)):
        mask = (labels == index).astype(np.uint8)
        if not mask.any():
            continue
        mask = cv2.morphologyEx(mask, cv2.MORPH_OPEN, np.ones((2, 2), np.uint8))
        n, _, stats, centres = cv2.connectedComponentsWithStats(mask, connectivity=4)
        regions += [(index, centres[r]) for r in range(1, n) if stats[r, cv2.CC_STAT_AREA] >= MIN_AREA]
    return regions


def frames_of(strip: np.ndarray, frames: int = STATE_FRAMES) -> list[np.ndarray]:
    """A (H, frames * W, 3) strip -> its ``frames`` (H, W, 3) frames, left to right."""
    width = strip.shape[1] // frames
    if width * frames != strip.shape[1]:
        raise ValueError(f"a strip of width {strip.shape[1]} is not {frames} frames side by side")
    return [strip[:, i * width : (i + 1) * width] for i in range(frames)]


@dataclass
class StripScore:
    """A rendered strip against the true one (see the module's docstring)."""

    counts_right: float
    position_error: float | None
    pixel_error: float


def score_strip(rendered: np.ndarray, true: np.ndarray) -> StripScore:
    """Score ``rendered`` against ``true``, the simulator's drawing of the second (same-sized (H, 3 H, 3) uint8)."""
    if rendered.shape != true.shape:
        raise ValueError(f"rendered strip {rendered.shape} and true strip {true.shape} differ in size")
    colours = palette(true)
    right, distances = [], []
    for mine, theirs in zip(frames_of(rendered), frames_of(true)):
        drawn, real = object_regions(mine, colours), object_regions(theirs, colours)
        right.append(len(drawn) == len(real))
        for colour in {c for c, _ in drawn} & {c for c, _ in real}:
            here = np.mean([p for c, p in drawn if c == colour], axis=0)
            there = np.mean([p for c, p in real if c == colour], axis=0)
            distances.append(float(np.linalg.norm(here - there)))
    first = np.abs(frames_of(rendered)[0].astype(np.float32) - frames_of(true)[0].astype(np.float32)).mean() / 255
    return StripScore(float(np.mean(right)), float(np.mean(distances)) if distances else None, float(first))


def simulator_strips(record: dict, scene_types: list[str], frame_size: int = REFERENCE_SIZE) -> list[np.ndarray]:
    """The simulator's own drawing of every second of the episode ``record`` (its "seed", "fps" and sentences),
    generated with ``scene_types``: one (frame_size, STATE_FRAMES * frame_size, 3) uint8 strip a second, the frames
    a clip's strip holds (``encoders.frames.state_offsets``)."""
    fps, seconds = int(record["fps"]), len(record["sentences"])
    episode = simulation.simulate(record["seed"], scene_types, seconds, fps)
    offsets = state_offsets(fps, 1.0, STATE_FRAMES)
    return [
        np.concatenate([episode.scene.draw(second[i], frame_size) for i in offsets], axis=1)
        for second in episode.snapshots
    ]

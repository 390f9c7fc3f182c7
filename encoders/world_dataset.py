"""State strips of the synthetic world's clips, paired with their sentences, for training and scoring
the offline captioner and renderer.

A *state strip* is what the offline pack reads and draws for one second of a clip: ``STATE_FRAMES``
frames of that second (first, middle, last; ``encoders.frames.state_offsets``) tiled left to right,
so one image shows the motion its sentence names ("rises", "falls", "walks into"). Strips are decoded
from the MP4s exactly as ``pipeline.rollout`` decodes a user's clip (``sample_frames`` with
``frames_per_state``), then resized to ``STRIP_SIZE`` with PIL's bilinear filter, as the captioner's
image processor does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from encoders.frames import sample_frames
from world_model.data.synthetic.episodes import read_records
from world_model.data.synthetic.simulation import STATE_FRAMES, STRIP_SIZE


@dataclass
class StateSet:
    """Every second of some episodes: ``images[i]`` shows second ``second[i]`` of episode
    ``records[episode[i]]``, whose sentence is ``sentences[i]``."""

    images: np.ndarray = field(repr=False)  # (N, H, W, 3) uint8 RGB strips
    sentences: list[str]
    episode: np.ndarray  # (N,) int, index into records
    second: np.ndarray  # (N,) int
    records: list[dict] = field(repr=False)

    def __len__(self) -> int:
        return len(self.sentences)


def episode_strips(video: str | Path, size: tuple[int, int] = STRIP_SIZE) -> list[np.ndarray]:
    """One (H, W, 3) uint8 strip per second of ``video``, resized to ``size`` = (H, W)."""
    clip = sample_frames(video, frames_per_state=STATE_FRAMES, max_frames=10_000)
    return [resize(frame.image, size) for frame in clip]


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(h, w, 3) uint8 -> (H, W, 3) uint8 with PIL's bilinear filter (antialiased when shrinking)."""
    if image.shape[:2] == tuple(size):
        return image
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), Image.Resampling.BILINEAR))


def read_states(
    split_dir: str | Path, limit: int | None = None, size: tuple[int, int] = STRIP_SIZE, progress: bool = True
) -> StateSet:
    """Decode the strips of the first ``limit`` episodes of ``split_dir`` (all by default).

    Raises ``ValueError`` when a clip yields a different number of strips than its record has sentences.
    """
    records = read_records(split_dir, limit)
    images, sentences, episode, second = [], [], [], []
    for i, record in enumerate(tqdm(records, desc=f"decoding {Path(split_dir).name}", disable=not progress)):
        strips = episode_strips(record["path"], size)
        if len(strips) != len(record["sentences"]):
            raise ValueError(f"{record['path']}: {len(strips)} state strips for {len(record['sentences'])} sentences")
        images += strips
        sentences += [s["text"] for s in record["sentences"]]
        episode += [i] * len(strips)
        second += range(len(strips))
    return StateSet(np.stack(images), sentences, np.array(episode), np.array(second), records)

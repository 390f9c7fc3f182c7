"""Writing frames as a browser-playable MP4 or a looping GIF, atomically (``world_model.utils.files``)."""

from __future__ import annotations

from pathlib import Path

import imageio.v2 as imageio
import numpy as np

from world_model.utils.files import replacing_file


def write_video(frames: list[np.ndarray], path: str | Path, fps: float = 2) -> Path:
    """Write (H, W, 3) uint8 RGB frames, all the same size, as an H.264 / yuv420p MP4 that
    browsers play (index at the front for streaming).  Odd sizes are padded to even by repeating
    the last row / column, since yuv420p needs even dimensions."""
    height, width = frame_size(frames)
    pad = ((0, height % 2), (0, width % 2), (0, 0))
    with replacing_file(Path(path)) as tmp:
        writer = imageio.get_writer(
            tmp,
            format="FFMPEG",
            mode="I",
            fps=fps,
            codec="libx264",
            pixelformat="yuv420p",
            macro_block_size=1,
            output_params=["-movflags", "+faststart"],
        )
        with writer:
            for frame in frames:
                writer.append_data(np.pad(frame, pad, mode="edge"))
    return Path(path)


def write_gif(frames: list[np.ndarray], path: str | Path, fps: float = 2) -> Path:
    """Write (H, W, 3) uint8 RGB frames, all the same size, as a looping GIF."""
    frame_size(frames)
    with replacing_file(Path(path)) as tmp:
        imageio.mimwrite(tmp, frames, format="GIF", duration=1000 / fps, loop=0)
    return Path(path)


def frame_size(frames: list[np.ndarray]) -> tuple[int, int]:
    """(height, width) shared by all frames; raises ValueError unless all are (H, W, 3) uint8."""
    if not frames:
        raise ValueError("no frames to write")
    sizes = {frame.shape for frame in frames}
    if len(sizes) != 1 or any(frame.dtype != np.uint8 for frame in frames):
        raise ValueError(f"frames must all be (H, W, 3) uint8 of one size; got shapes {sorted(sizes)}")
    shape = sizes.pop()
    if len(shape) != 3 or shape[2] != 3:
        raise ValueError(f"frames must be (H, W, 3) RGB; got {shape}")
    return shape[0], shape[1]

"""Write rendered frames as an MP4, a GIF or a storyboard PNG.

Every writer renders into a temporary file in the destination folder and then ``os.replace``s it
onto ``path``, so readers never see a half-written file and a failed write leaves no debris.
Missing parent folders are created.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
from matplotlib.figure import Figure

CAPTION_WIDTH = 30  # characters per caption line in storyboards
CAPTION_LINES = 6
CAPTION_INCHES = 1.2  # storyboard height below each row of frames, for up to CAPTION_LINES lines
TITLE_INCHES = 0.4
MAX_COLUMNS = 8  # storyboard cells per row; more wrap onto the next row
MAX_SECTION_ROWS = 4  # rows per section (observed, predicted); more cells are thinned evenly
MAX_ASPECT = 2.0  # frames taller than this (height / width) are drawn narrower, not taller


def write_video(frames: list[np.ndarray], path: str | Path, fps: float = 2) -> Path:
    """Write (H, W, 3) uint8 RGB frames, all the same size, as an H.264 / yuv420p MP4 that
    browsers play (index at the front for streaming).  Odd sizes are padded to even by repeating
    the last row / column, since yuv420p needs even dimensions."""
    height, width = _frame_size(frames)
    pad = ((0, height % 2), (0, width % 2), (0, 0))
    with _replacing(Path(path)) as tmp:
        writer = imageio.get_writer(
            tmp, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
            macro_block_size=1, output_params=["-movflags", "+faststart"],
        )
        with writer:
            for frame in frames:
                writer.append_data(np.pad(frame, pad, mode="edge"))
    return Path(path)


def write_gif(frames: list[np.ndarray], path: str | Path, fps: float = 2) -> Path:
    """Write (H, W, 3) uint8 RGB frames, all the same size, as a looping GIF."""
    _frame_size(frames)
    with _replacing(Path(path)) as tmp:
        imageio.mimwrite(tmp, frames, format="GIF", duration=1000 / fps, loop=0)
    return Path(path)


def write_storyboard(
    observed: list[tuple[np.ndarray, str]],
    predicted: list[tuple[np.ndarray, str]],
    path: str | Path,
    title: str | None = None,
) -> Path:
    """Write a PNG with the observed frames in the top section and the predicted ones below, each
    (H, W, 3) uint8 RGB image above its caption (wrapped).  Timestamps or step labels go in the caption
    strings.  The PNG is 300 px wide per column, at most ``MAX_COLUMNS`` columns: longer sections wrap
    onto further rows, at most ``MAX_SECTION_ROWS`` each (more cells are thinned evenly, first and last
    kept, and the title says so), so the board is at most 2,400 px wide and 8 rows high.  A row is as
    high as its tallest frame at that width (``MAX_ASPECT`` at most) plus its captions."""
    columns = min(max(len(observed), len(predicted)), MAX_COLUMNS)
    if columns == 0:
        raise ValueError("nothing to draw: no observed and no predicted frames")
    sections = [("observed", _thin(observed, columns * MAX_SECTION_ROWS)), ("predicted", _thin(predicted, columns * MAX_SECTION_ROWS))]
    shown = [f"{len(cells)} of {len(full)} {label}" for (label, cells), full in zip(sections, (observed, predicted))
             if len(cells) < len(full)]
    if shown:
        title = f"{title or ''} (showing {', '.join(shown)})".strip()
    rows = [max(1, -(-len(cells) // columns)) for _, cells in sections]
    aspect = min(max(image.shape[0] / image.shape[1] for image, _ in [*observed, *predicted]), MAX_ASPECT)
    height = sum(rows) * (3 * aspect + CAPTION_INCHES) + (TITLE_INCHES if title else 0)
    figure = Figure(figsize=(3 * columns, height), dpi=100, layout="constrained")
    axes = figure.subplots(sum(rows), columns, squeeze=False)
    for first, n_rows, (label, cells) in zip((0, rows[0]), rows, sections):
        axes[first, 0].set_ylabel(label, fontsize=12, fontweight="bold")
        for k, ax in enumerate(axes[first:first + n_rows].flat):
            ax.set_xticks([])
            ax.set_yticks([])
            ax.spines[:].set_visible(False)
            if k < len(cells):
                image, caption = cells[k]
                ax.imshow(image)
                wrapped = textwrap.wrap(caption, CAPTION_WIDTH, max_lines=CAPTION_LINES, placeholder=" ...")
                ax.set_xlabel("\n".join(wrapped), fontsize=9)
    if title:
        figure.suptitle(title, fontsize=13)
    with _replacing(Path(path)) as tmp:
        figure.savefig(tmp, format="png")
    return Path(path)


def _thin(cells: list, limit: int) -> list:
    """At most ``limit`` of ``cells``, evenly spaced, first and last kept."""
    if len(cells) <= limit:
        return cells
    return [cells[k] for k in np.linspace(0, len(cells) - 1, limit).round().astype(int)]


def _frame_size(frames: list[np.ndarray]) -> tuple[int, int]:
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


@contextmanager
def _replacing(path: Path) -> Iterator[str]:
    """Yield a temporary file name next to ``path`` (same suffix); move it onto ``path`` on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(handle)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

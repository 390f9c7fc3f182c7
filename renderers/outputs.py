"""Write observed and predicted frames, with their captions, as one storyboard PNG.

The PNG is drawn into a temporary file beside ``path`` and renamed onto it (``world_model.utils.files``),
so readers never see a half-written file. The MP4 and GIF writers are ``world_model.utils.video``.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import numpy as np
from matplotlib import font_manager, ft2font
from matplotlib.figure import Figure

from world_model.utils.files import replacing_file

CAPTION_WIDTH = 30  # characters per caption line in storyboards
CAPTION_LINES = 6
CAPTION_INCHES = 1.2  # storyboard height below each row of frames, for up to CAPTION_LINES lines
TITLE_INCHES = 0.4
MAX_COLUMNS = 8  # storyboard cells per row; more wrap onto the next row
MAX_SECTION_ROWS = 4  # rows per section (observed, predicted); more cells are thinned evenly
MAX_ASPECT = 2.0  # frames taller than this (height / width) are drawn narrower, not taller


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
    sections = [
        ("observed", _thin(observed, columns * MAX_SECTION_ROWS)),
        ("predicted", _thin(predicted, columns * MAX_SECTION_ROWS)),
    ]
    shown = [
        f"{len(cells)} of {len(full)} {label}"
        for (label, cells), full in zip(sections, (observed, predicted))
        if len(cells) < len(full)
    ]
    if shown:
        title = f"{title or ''} (showing {', '.join(shown)})".strip()
    rows = [max(1, -(-len(cells) // columns)) for _, cells in sections]
    aspect = min(max(image.shape[0] / image.shape[1] for image, _ in [*observed, *predicted]), MAX_ASPECT)
    height = sum(rows) * (3 * aspect + CAPTION_INCHES) + (TITLE_INCHES if title else 0)
    figure = Figure(figsize=(3 * columns, height), dpi=100, layout="constrained")
    axes = figure.subplots(sum(rows), columns, squeeze=False)
    for first, n_rows, (label, cells) in zip((0, rows[0]), rows, sections):
        axes[first, 0].set_ylabel(label, fontsize=12, fontweight="bold")
        for k, ax in enumerate(axes[first : first + n_rows].flat):
            ax.set_xticks([])
            ax.set_yticks([])
            ax.spines[:].set_visible(False)
            if k < len(cells):
                image, caption = cells[k]
                ax.imshow(image)
                wrapped = textwrap.wrap(drawable(caption), CAPTION_WIDTH, max_lines=CAPTION_LINES, placeholder=" ...")
                ax.set_xlabel("\n".join(wrapped), fontsize=9)
    if title:
        figure.suptitle(drawable(title), fontsize=13)
    with replacing_file(Path(path)) as tmp:
        figure.savefig(tmp, format="png")
    return Path(path)


def drawable(text: str) -> str:
    """`text` with each character the storyboard's font has no glyph for (a CJK clip name, say) replaced by "?",
    where matplotlib would draw an empty box and warn; the full text is in rollout.json."""
    glyphs = font_glyphs()
    return "".join(ch if ch.isspace() or ord(ch) in glyphs else "?" for ch in text)


@functools.cache
def font_glyphs() -> frozenset[int]:
    """The code points of the font matplotlib draws text with (its default sans-serif)."""
    path = font_manager.findfont(font_manager.FontProperties())
    return frozenset(ft2font.FT2Font(path).get_charmap())


def _thin(cells: list, limit: int) -> list:
    """At most ``limit`` of ``cells``, evenly spaced, first and last kept."""
    if len(cells) <= limit:
        return cells
    return [cells[k] for k in np.linspace(0, len(cells) - 1, limit).round().astype(int)]

"""A command's output folder: checked before any model work, written as a staging folder beside it, renamed into
place when complete (``world_model.utils.files.replace_dir``)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


class RunFolderError(ValueError):
    """The output folder cannot be used: it is a file, holds files, or cannot be written."""


def prepare_run_dir(out_dir: Path, overwrite: bool) -> Path:
    """Check the destination now, before any model work, and make a staging folder beside it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RunFolderError(f"{out_dir} is a file, not a folder; choose another --out")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise RunFolderError(f"{out_dir} already holds files; choose another --out or pass --overwrite")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.partial-"))
        staging.chmod(0o755)  # mkdtemp makes it private; a run folder is for reading
        return staging
    except OSError as err:
        raise RunFolderError(f"cannot write the run folder {out_dir}: {err.strerror or err}") from err


def default_out_dir(video: Path) -> Path:
    return Path("runs") / f"{video.stem}-{time.strftime('%Y%m%d-%H%M%S')}"

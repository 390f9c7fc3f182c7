"""A command's run folder: claimed before any model work (``world_model.utils.files.claimed``), written as a staging
folder beside it, renamed into place when complete (``world_model.utils.files.replace_dir``)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from world_model.utils.cli import UsageError, check_output
from world_model.utils.files import FolderInUse, claimed


class RunFolderError(ValueError):
    """The output folder cannot be used: it is a file, holds files, is in use, or cannot be written."""


@contextlib.contextmanager
def run_folder(
    out_dir: Path | None, overwrite: bool, name: str = "run", inputs: dict | None = None
) -> Iterator[tuple[Path, Path]]:
    """Claim the run folder and make its staging folder: yields (run folder, staging folder). `out_dir` None picks
    `runs/<name>-<time>`, with `-2`, `-3`, ... added when another run has that name (two runs in one second
    each get their own). An explicit `out_dir` that holds files (unless `overwrite`) or that another run holds is a
    RunFolderError, and so is one that is, or lies inside, one of the `inputs` (`check_output`'s). The staging folder,
    and folders made for the run, are removed when the block raises."""
    with contextlib.ExitStack() as stack:
        out_dir = stack.enter_context(
            claim_default(name) if out_dir is None else claim_explicit(out_dir, overwrite, inputs)
        )
        try:
            staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.partial-"))
        except OSError as err:
            raise RunFolderError(f"cannot write the run folder {out_dir}: {err.strerror or err}") from err
        staging.chmod(0o755)  # mkdtemp makes it private; a run folder is for reading
        try:
            yield out_dir, staging
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


@contextlib.contextmanager
def claim_explicit(out_dir: Path, overwrite: bool, inputs: dict | None = None) -> Iterator[Path]:
    """Hold `out_dir` (--out) for this run after checking it can be used and is none of the `inputs`."""
    check_out(out_dir, inputs)
    claimed_it = False  # a PermissionError after the claim comes from the run's own work, and names its file
    try:
        with claimed(out_dir):
            if out_dir.exists() and not out_dir.is_dir():
                raise RunFolderError(f"--out {out_dir} is a file, not a folder; choose another --out")
            if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
                raise RunFolderError(f"--out {out_dir} already holds files; choose another --out or pass --overwrite")
            claimed_it = True
            yield out_dir
    except FolderInUse as err:
        raise RunFolderError(f"{err}; choose another --out") from None
    except PermissionError as err:
        if claimed_it:
            raise
        raise RunFolderError(f"cannot write the run folder {out_dir}: {err.strerror}") from None


@contextlib.contextmanager
def claim_default(name: str) -> Iterator[Path]:
    """Hold the first free `runs/<name>-<time>[-k]` for this run."""
    base = Path("runs") / f"{name}-{timestamp()}"
    check_out(base)
    for k in itertools.count(1):
        out_dir = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            with claimed(out_dir):
                if out_dir.exists():
                    continue
                yield out_dir
                return
        except FolderInUse:
            continue


def timestamp() -> str:
    """The local time to the second, as default run folders are named: 20261206-182659."""
    return time.strftime("%Y%m%d-%H%M%S")


def check_out(out_dir: Path, inputs: dict | None = None) -> None:
    """A RunFolderError for a folder that cannot be written, a link to nothing, one of the `inputs` or inside one
    (`check_output`; whether it holds files is `claim_explicit`'s rule), a mount point (the finished run replaces the
    folder by renaming, which a mount point refuses), or the working folder or one that holds it."""
    if out_dir.is_dir() and os.path.ismount(out_dir):
        raise RunFolderError(f"--out {out_dir} is a mount point, which a run cannot replace; give a folder inside it")
    try:
        check_output(out_dir, "--out", inputs, overwrite=True)
    except UsageError as err:
        raise RunFolderError(str(err)) from None
    if Path.cwd().is_relative_to(os.path.abspath(out_dir)):
        raise RunFolderError(f"--out {out_dir} is the working folder or holds it; give a new folder such as runs/mine")

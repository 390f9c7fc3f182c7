"""Writing files and folders so that a reader never sees half of one: write beside, then rename into place."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

REPO_ROOT = Path(__file__).resolve().parents[2]


def repo_path(path: str | os.PathLike) -> str:
    """`path` relative to the repository root when it lies inside it, as committed records name paths; else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written folder onto `final_dir`, replacing what was there only once it is complete."""
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}")
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old is not None and old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    elif old is not None:  # a file or a link stood where the folder goes
        old.unlink(missing_ok=True)


@contextmanager
def atomic_dir(folder: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder beside `folder` to write into. When the block ends normally its files are made
    world-readable and it replaces `folder` (`replace_dir`); when it raises, it is removed and `folder` is untouched."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
    try:
        yield tmp
        for path in [tmp, *tmp.rglob("*")]:  # mkdtemp and some writers create private files; a model is for reading
            path.chmod(0o755 if path.is_dir() else 0o644)
        replace_dir(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json_atomic(path: str | os.PathLike, data: Any, ensure_ascii: bool = True) -> None:
    """Write `data` as indented JSON to `path` through `replacing_file`: the old file stays whole on a failure."""
    with replacing_file(Path(path)) as staged, open(staged, "w", encoding="utf-8") as file:
        json.dump(data, file, indent=2, ensure_ascii=ensure_ascii)
        file.write("\n")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` through `replacing_file`: staged beside it, then renamed into place."""
    with replacing_file(Path(path)) as staged:
        Path(staged).write_text(text, encoding="utf-8")


@contextmanager
def replacing_file(path: Path) -> Iterator[str]:
    """Yield a temporary file name next to ``path`` (same suffix); move it onto ``path`` on success. On a failure
    (a full disk, a signal) the temporary file is removed and the old ``path`` stays whole."""
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


class FolderInUse(ValueError):
    """Another process holds the folder (it is writing a run there)."""


@contextmanager
def claimed(folder: Path, flag: str = "--out") -> Iterator[None]:
    """Hold `folder` for this process for the block: a lock file `.<name>.lock` beside it, taken with flock, so a
    second process that claims the same folder gets FolderInUse at once (the lock dies with its process; the file is
    removed when the block ends). The folder's missing parents are made, and removed again when the block ends and
    they are still empty (a refused run leaves nothing behind)."""
    folder = Path(folder)
    made = missing_parents(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock = take_lock(folder.parent / f".{folder.name}.lock", folder, flag)
        try:
            yield
        finally:
            Path(lock.name).unlink(missing_ok=True)
            lock.close()
    finally:
        for parent in made:
            with contextlib.suppress(OSError):
                parent.rmdir()


def missing_parents(folder: Path) -> list[Path]:
    """The parents of `folder` that do not exist yet, deepest first."""
    return [parent for parent in folder.absolute().parents if not parent.exists()]


def take_lock(path: Path, folder: Path, flag: str):
    """The open lock file `path`, flock'ed by this process; FolderInUse when another process holds it. A lock file
    that its holder removed while this process waited is not a lock: then it is made anew."""
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise FolderInUse(f"{flag} {folder} is in use: {holder} is writing a run there") from None
        if path.exists() and os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
            handle.truncate(0)
            handle.write(f"process {os.getpid()}")
            handle.flush()
            return handle
        handle.close()

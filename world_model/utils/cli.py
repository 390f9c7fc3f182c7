"""How every `python -m` command ends (docs/commands.md): one exit-code convention, one `error:` line, and the
stop signals handled alike.

    exit 0    success (warnings go to stderr)
    exit 2    bad input or settings: one line `error: ...` naming the file or flag
    exit 1    an internal failure: one line, and `--verbose` shows the traceback
    128 + n   stopped by signal n (SIGINT 130, SIGTERM 143, SIGHUP 129): one line, staging removed

`run_command(work, verbose)` runs a command's work under these rules; `check_device`, `check_writable` and
`check_output` are the checks a command makes before loading models or reading data. Every command's flags and its
`main` come from `world_model.utils.flags`.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable, Iterator

import torch

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2
MIN_FREE_BYTES = 1 << 20  # an output needs at least this much free disk before a command starts its work
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)  # the project's input errors derive from these


class UsageError(ValueError):
    """Bad input or settings found by a command's checks; the message names the file or flag."""


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM or SIGHUP) arrived; unwinds like Ctrl-C so staging folders are removed."""

    def __init__(self, signum: int, note: str = ""):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.note = note  # what the interrupted work left, for the one line the command prints


def signal_of(err: KeyboardInterrupt) -> int:
    """The stop signal behind `err` (a bare KeyboardInterrupt is Ctrl-C: SIGINT)."""
    return int(getattr(err, "signum", signal.SIGINT))


def as_interrupted(err: KeyboardInterrupt, note: str) -> Interrupted:
    """`err` (Ctrl-C or a stop signal) as an `Interrupted` that carries `note`."""
    return Interrupted(signal_of(err), note)


def raise_interrupted(signum: int, frame) -> None:
    """Signal handler: ignore further stop signals while the first one unwinds (cleanup is not cut short), and
    raise `Interrupted`."""
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    raise Interrupted(signum)


def handled_signals() -> list[int]:
    """The stop signals this process handles: those it does not ignore. A signal ignored from the start stays
    ignored (`nohup` ignores SIGHUP so that a run outlives its terminal; a shell's background job ignores SIGINT)."""
    return [signum for signum in STOP_SIGNALS if signal.getsignal(signum) != signal.SIG_IGN]


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Inside the block SIGINT, SIGTERM and SIGHUP raise `Interrupted` (only in the main thread, where handlers can
    be set, and not those the process ignores: `handled_signals`); the previous handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, raise_interrupted) for signum in handled_signals()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_command(
    work: Callable[[], object],
    verbose: bool = False,
    on_interrupt: str = "",
    input_errors: tuple[type[BaseException], ...] = INPUT_ERRORS,
) -> int:
    """Run a command's `work` under the convention of the module docstring: an int it returns is the exit code,
    anything else means 0. `on_interrupt` is added to the line a stop signal prints (e.g. how to resume);
    `input_errors` are the exception types that mean bad input or settings (exit 2); any other exception is an
    internal failure (exit 1). With `verbose` the traceback of an error is printed too."""
    try:
        with stop_signals_raise():
            code = work()
        return code if isinstance(code, int) else EXIT_OK
    except KeyboardInterrupt as err:
        signum, note = signal_of(err), getattr(err, "note", "") or on_interrupt
        print(f"\ninterrupted by {signal.Signals(signum).name}" + (f"; {note}" if note else ""), file=sys.stderr)
        return 128 + signum
    except input_errors as err:
        if verbose:
            traceback.print_exc()
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:
        if verbose:
            traceback.print_exc()
        hint = "" if verbose else "; rerun with --verbose for the traceback"
        print(f"error: internal failure ({type(err).__name__}: {one_line(err)}){hint}", file=sys.stderr)
        return EXIT_INTERNAL


def one_line(err: BaseException) -> str:
    """The error's message on one line (an OSError without one says its errno text and file)."""
    if isinstance(err, OSError) and err.strerror and str(err).startswith("["):
        text = f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def check_device(device: str | None, flag: str = "--device") -> None:
    """A UsageError unless `device` (None: the default) names a torch device this machine has."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"{flag} {device} is not a device; use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"{flag} {device}: this machine has no CUDA GPU (torch sees none); use --device cpu")
        if parsed.index is not None and parsed.index >= count:
            raise UsageError(f"{flag} {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"{flag} {device}: MPS is not available on this machine; use --device cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"{flag} {device}: only cpu, cuda, cuda:N and mps are supported")


def check_writable(path: str | os.PathLike, flag: str = "--out") -> None:
    """A UsageError unless a file or folder can be created at `path`: its nearest existing ancestor must be a
    folder that a file can be written in (tried with a temporary file, which is removed; nothing else is made)."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise UsageError(f"{flag} {str(path)!r} does not name a new file or folder; give one such as runs/mine")
    ancestor = path.parent.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{flag} {path}: {ancestor} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as err:
        raise UsageError(f"{flag} {path} cannot be written: {ancestor}: {err.strerror or err}") from None
    if shutil.disk_usage(ancestor).free < MIN_FREE_BYTES:
        raise UsageError(f"{flag} {path} cannot be written: {ancestor}'s disk is full")


def check_range(flag: str, value: float | None, low: float | None = None, high: float | None = None) -> None:
    """A ValueError naming `flag` unless `value` (None passes: an unset optional setting) is a finite number in
    [low, high] (None: unbounded on that side). Settings dataclasses call it from ``__post_init__``, so a value out
    of range exits 2 at parse time, before any work."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        shown = lambda x: f"{x:,}" if isinstance(x, int) else f"{x:g}"  # noqa: E731
        if low is not None and high is not None:
            span = f"between {shown(low)} and {shown(high)}"
        else:
            span = f">= {shown(low)}" if low is not None else f"<= {shown(high)}"
        raise ValueError(f"{flag} must be {span}, got {shown(value)}")


def check_positive(flag: str, value: float | None) -> None:
    """A ValueError naming `flag` unless `value` (None passes) is a finite number above 0 (a rate, a duration)."""
    check_range(flag, value)
    if value is not None and value <= 0:
        raise ValueError(f"{flag} must be > 0, got {value:g}")


def check_not_dangling(path: Path, flag: str) -> None:
    """A UsageError when `path` is a symbolic link to nothing (writing through it would fail, or land elsewhere)."""
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{flag} {path} is a link to nothing ({os.readlink(path)}); give a real path")


def check_output(
    path: str | os.PathLike,
    flag: str,
    inputs: dict[str, str | os.PathLike | None] | None = None,
    overwrite: bool = False,
) -> None:
    """A UsageError unless writing `path` loses nothing: it can be created (`check_writable`), is not a link to
    nothing, is neither one of the `inputs` (what each is called -> its path; None is skipped) nor inside one, and,
    without `overwrite`, does not exist yet."""
    path = Path(path)
    check_not_dangling(path, flag)
    check_writable(path, flag)
    target = path.resolve()
    for name, given in (inputs or {}).items():
        if given is None:
            continue
        source = Path(given).resolve()
        if target == source or source in target.parents:
            raise UsageError(
                f"{flag} {path} {'is' if target == source else 'lies inside'} the {name} {given}, an input; "
                "write it elsewhere"
            )
    if path.exists() and not overwrite:
        raise UsageError(f"{flag} {path} already exists; pass --overwrite to replace it")

"""Imported first by every `python -m` command module, for its side effect: while the program is one of the
project's commands (the `__main__` module belongs to the project) and its libraries are still importing, a stop
signal (SIGINT, SIGTERM, SIGHUP; not one the process ignores) ends it at once with one line and 128 + n instead of a
KeyboardInterrupt traceback out of an import. Nothing has been written at that point; `world_model.utils.cli.run_command`
takes the signals over once the command's work starts. Imported by anything else (tests, a notebook), it does nothing."""

from __future__ import annotations

import os
import signal
import sys

PROJECT_PACKAGES = ("pipeline", "world_model", "apps", "encoders", "renderers")


def exit_at_once(signum: int, frame) -> None:
    sys.stderr.write(f"\ninterrupted by {signal.Signals(signum).name} while starting; nothing was written\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def running_a_command() -> bool:
    """Whether the program is a project module run with `python -m`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name.split(".")[0] in PROJECT_PACKAGES


if running_a_command():
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(stop) != signal.SIG_IGN:
            signal.signal(stop, exit_at_once)

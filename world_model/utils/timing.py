"""Timing stages of a job."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """`with timed(timings, stage):` adds the block's wall-clock seconds to `timings[stage]`."""
    start = time.perf_counter()
    yield
    timings[stage] = timings.get(stage, 0.0) + time.perf_counter() - start

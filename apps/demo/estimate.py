"""How long a request will take, said before it runs: rates measured on this server's own finished runs.

A run's time is about (sampled frames) x (seconds to decode and caption one) + (predicted images) x (seconds to
predict and render one) + what writing and packing the outputs takes, once the preset's models are loaded; a
preset's first run also loads its models. Before any run has finished there is nothing to go by, and the status
says so rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from apps.demo.checks import format_duration
from encoders.frames import VideoInfo, sample_times
from pipeline.record import RolloutRecord


@dataclass
class RunTimes:
    """Seconds per unit of work, from the last finished run of this server."""

    per_frame: float | None = None  # decoding and captioning, per sampled frame
    per_image: float | None = None  # predicting and rendering, per predicted image (steps x futures)
    fixed: float = 0.0  # writing the run folder and packing it, per run
    loaded: set[str] = field(default_factory=set)  # the preset choices (as requested) this server has run

    def learn(self, record: RolloutRecord, seconds: float, preset: str) -> None:
        """Take the rates of a finished run: its record, its running time in seconds and the preset requested."""
        t = record.timings_s
        images = sum(len(p.images) for p in record.predictions)
        self.per_frame = (t.get("sample_frames", 0.0) + t.get("caption", 0.0)) / max(len(record.observed), 1)
        self.per_image = (t.get("predict", 0.0) + t.get("render", 0.0)) / max(images, 1)
        measured = ("sample_frames", "caption", "predict", "render", "load_models")
        self.fixed = max(seconds - sum(t.get(stage, 0.0) for stage in measured), 0.0)
        self.loaded.add(preset)

    def estimate(self, frames: int, images: int) -> float | None:
        """Seconds for `frames` sampled frames and `images` predicted images once the models are loaded, or None
        before any run has finished."""
        if self.per_frame is None or self.per_image is None:
            return None
        return frames * self.per_frame + images * self.per_image + self.fixed

    def sentence(self, info: VideoInfo, interval: float, max_frames: int, images: int, preset: str) -> str:
        """What the status says before a run: the estimate and what it counts, or that none can be made yet (or ""
        for settings the run itself will refuse)."""
        if not (isinstance(interval, (int, float)) and math.isfinite(interval) and interval > 0 and images >= 1):
            return ""
        frames = min(len(sample_times(info, interval)), max_frames)
        seconds = self.estimate(frames, images)
        if seconds is None:
            return "no estimate yet: the first run on this server loads the models and measures the rest"
        loading = "" if preset in self.loaded else " after the models load (the first run of this preset)"
        return f"about {format_duration(seconds)}{loading} for {frames} frames and {images} predicted images"

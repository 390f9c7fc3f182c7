"""The rollout's settings as dataclasses: which models (`ModelChoice`), which frames (`FrameSampling`) and what is
written (`OutputConfig`); how sentences are predicted is `world_model.models.generation_config.GenerationConfig`.

The same classes serve the Python API (`run_rollout(video, steps, models, frames, generation, output)`), the
command line (`world_model.utils.flags.SettingsParser` turns their fields into flags; `metadata["help"]` is the flag's
help). Each checks its values in `__post_init__`, so a bad setting
fails before any model work, with the flag's name in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pipeline.presets import PipelinePreset, choose_preset
from world_model.utils.hub import default_device

MAX_FRAMES = 256  # sampled frames per run
MAX_FRAMES_PER_STATE = 16  # frames tiled into one state strip
MIN_FPS, MAX_FPS = 0.1, 60.0  # frame rates of rollout.mp4 a player shows as a video
DEFAULT_INTERVAL_S = 1.0


class ConfigError(ValueError):
    """A setting is out of range or two settings contradict each other; the message names the flag."""


@dataclass
class ModelChoice:
    """The models of a run: a preset (configs/pipeline/<name>.yaml, or `auto`), any component overridden."""

    flag_group = "models"
    preset: str = field(default="auto", metadata={"help": "model preset: auto, hub or offline (default auto)"})
    captioner: str | None = field(
        default=None, metadata={"help": "image-to-text model: hub id or folder (overrides the preset)"}
    )
    renderer: str | None = field(
        default=None, metadata={"help": "text-to-image model: hub id or folder (overrides the preset)"}
    )
    predictor: str | None = field(default=None, metadata={"help": "predictor checkpoint folder (overrides the preset)"})
    device: str | None = field(default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"})

    def overrides(self) -> dict[str, str]:
        """The components named explicitly: {component: hub id or folder}."""
        return {
            c: v
            for c, v in (("captioner", self.captioner), ("renderer", self.renderer), ("predictor", self.predictor))
            if v
        }


@dataclass
class FrameSampling:
    """Which frames of the clip are captioned: one every `interval` seconds, or `num_frames` evenly spaced."""

    flag_group = "frames"
    interval: float | None = field(
        default=None, metadata={"help": f"seconds between sampled frames (default {DEFAULT_INTERVAL_S:g})"}
    )
    num_frames: int | None = field(
        default=None, metadata={"aliases": ["--frames"], "help": "sample this many evenly spaced frames instead"}
    )
    max_frames: int = field(default=32, metadata={"help": f"cap on sampled frames (default 32, at most {MAX_FRAMES})"})
    frames_per_state: int | None = field(
        default=None, metadata={"help": "frames tiled into each state strip (default: the preset's, else 1)"}
    )
    merge_repeats: bool | None = field(
        default=None,
        metadata={
            "help": "consecutive identical captions are one state of the window: true or false (default: the "
            "preset's; true but for the offline pack, whose predictor reads one sentence per second)"
        },
    )

    def __post_init__(self) -> None:
        if self.interval is not None and self.num_frames is not None:
            raise ConfigError("--interval and --frames exclude each other: sample by time or by count")
        if self.interval is not None and not (math.isfinite(self.interval) and self.interval > 0):
            raise ConfigError(f"--interval must be a positive number of seconds, got {self.interval}")
        if self.num_frames is not None and not 1 <= self.num_frames <= MAX_FRAMES:
            raise ConfigError(f"--frames must be between 1 and {MAX_FRAMES}, got {self.num_frames}")
        if not 1 <= self.max_frames <= MAX_FRAMES:
            raise ConfigError(f"--max-frames must be between 1 and {MAX_FRAMES}, got {self.max_frames}")
        if self.frames_per_state is not None and (
            not 1 <= self.frames_per_state <= MAX_FRAMES_PER_STATE
            or (self.frames_per_state > 1 and self.num_frames is not None)
        ):
            raise ConfigError(
                f"--frames-per-state must be between 1 and {MAX_FRAMES_PER_STATE}, and 1 with --frames (evenly "
                f"spaced frames); got {self.frames_per_state}"
            )

    @property
    def seconds(self) -> float:
        """The interval in use: `interval`, or the default."""
        return DEFAULT_INTERVAL_S if self.interval is None else self.interval


@dataclass
class OutputConfig:
    """What a run writes and how it treats frames outside the captioner's world."""

    flag_group = "output"
    out_dir: Path | None = field(
        default=None, metadata={"aliases": ["--out"], "help": "run folder (default runs/<clip>-<time>)"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing run folder"})
    fps: float = field(default=2.0, metadata={"help": "frame rate of rollout.mp4 (default 2)"})
    init_from_last_frame: bool = field(
        default=False, metadata={"help": "render image-to-image from the last observed frame"}
    )
    on_unknown: Literal["warn", "stop"] = field(
        default="warn",
        metadata={"help": "frames outside the captioner's world: warn (default) or stop before predicting"},
    )

    def __post_init__(self) -> None:
        if self.out_dir is not None:
            self.out_dir = Path(self.out_dir)
        if not (math.isfinite(self.fps) and MIN_FPS <= self.fps <= MAX_FPS):
            raise ConfigError(f"--fps must be between {MIN_FPS:g} and {MAX_FPS:g} frames a second, got {self.fps:g}")
        if self.on_unknown not in ("warn", "stop"):
            raise ConfigError(f"--on-unknown must be one of warn, stop, got {self.on_unknown!r}")


@dataclass
class Plan:
    """A run resolved before any work: the preset with overrides applied, the frames to read, the device."""

    preset: PipelinePreset
    reason: str  # why this preset
    frames: FrameSampling  # frames_per_state and merge_repeats filled in from the preset
    device: str


def make_plan(models: ModelChoice, frames: FrameSampling) -> Plan:
    """The preset (`auto` resolved, overrides applied) and the frame sampling with the preset's strip width."""
    named = models.overrides()
    if len(named) == 3:
        preset, reason = PipelinePreset("custom", **named), "all components named"
    else:
        preset, reason = choose_preset(models.preset)
    preset = preset.with_models(named)
    if frames.frames_per_state is None:
        frames = replace(frames, frames_per_state=1 if frames.num_frames is not None else preset.frames_per_state)
    if frames.merge_repeats is None:
        frames = replace(frames, merge_repeats=preset.merge_repeats)
    return Plan(preset, reason, frames, str(default_device(models.device)))

"""The demo's settings: one dataclass, filled from the command line (`world_model.utils.flags.SettingsParser`) or by a caller."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.presets import COMPONENTS, PROJECT_ROOT, available_presets
from world_model.generation.predict import MAX_STEPS
from world_model.utils.cli import check_range

DEMO_MAX_STEPS = min(10, MAX_STEPS)  # the demo's own cap, within the rollout's: a shared server's request stays short
MAX_FILE_MB = 200.0  # uploads larger than this are refused (by Gradio before the upload, and by us after)
MAX_MINUTES = 10.0  # clips longer than this are refused before any model work
RUN_MAX_AGE_S = 2 * 3600  # request folders older than this are deleted when a new request starts
CACHE_PREFIX = "gradio-"  # a server's own Gradio cache under temp_root, never pruned as a request folder
EXAMPLES_DIR = PROJECT_ROOT / "examples"
CUSTOM = "custom"  # the preset choice meaning "the models named on the command line"


def default_temp_root() -> Path:
    return Path(tempfile.gettempdir()) / "world-model-demo"


@dataclass
class DemoConfig:
    """What the demo serves and with which models; every field is also a flag of `python -m apps.demo`."""

    host: str = field(
        default="127.0.0.1", metadata={"help": "address to serve on (default 127.0.0.1, this machine only)"}
    )
    port: int = field(default=7860, metadata={"help": "port (default 7860)"})
    preset: str | None = field(
        default=None,
        metadata={
            "help": f"initial preset: {', '.join(available_presets())} (default auto, or custom when all three "
            "models are named)"
        },
    )
    captioner: str | None = field(default=None, metadata={"help": "image-to-text model: hub id or folder"})
    renderer: str | None = field(default=None, metadata={"help": "text-to-image model: hub id or folder"})
    predictor: str | None = field(default=None, metadata={"help": "predictor checkpoint folder"})
    device: str | None = field(default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"})
    concurrency: int = field(default=1, metadata={"help": "rollouts run at the same time (default 1)"})
    queue_size: int = field(default=16, metadata={"help": "requests waiting at most (default 16)"})
    max_file_mb: float = field(default=MAX_FILE_MB, metadata={"help": f"upload limit in MB (default {MAX_FILE_MB:g})"})
    max_minutes: float = field(default=MAX_MINUTES, metadata={"help": f"clip length limit (default {MAX_MINUTES:g})"})
    max_frames: int = field(default=32, metadata={"help": "frames sampled from a clip at most (default 32)"})
    temp_root: Path | None = field(
        default=None, metadata={"help": f"folder for the per-request run folders (default {default_temp_root()})"}
    )
    examples_dir: Path = field(default=EXAMPLES_DIR, metadata={"help": "folder of example clips (*.mp4)"})
    steps: int = field(default=3, metadata={"help": f"initial predicted steps (1 to {DEMO_MAX_STEPS}, default 3)"})
    interval: float = field(default=1.0, metadata={"help": "initial sampling interval in seconds (default 1)"})
    seed: int = field(default=0, metadata={"help": "initial seed (default 0)"})
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch CPU threads for the models (default: half the CPU cores, at least 1: a rollout then keeps "
            "its speed beside another busy process)"
        },
    )

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {self.concurrency}")
        if not 1 <= self.steps <= DEMO_MAX_STEPS:
            raise ValueError(f"--steps must be between 1 and {DEMO_MAX_STEPS}, got {self.steps}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be between 1 and 65535, got {self.port}")
        for flag, value in (("--queue-size", self.queue_size), ("--max-frames", self.max_frames)):
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        for flag, value in (("--max-file-mb", self.max_file_mb), ("--max-minutes", self.max_minutes)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{flag} must be a positive number, got {value}")
        if not (math.isfinite(self.interval) and self.interval > 0):
            raise ValueError(f"--interval must be a positive number of seconds, got {self.interval}")
        check_range("--seed", self.seed, 0)  # torch takes no negative seed: every request would fail
        check_range("--threads", self.threads, 1, os.cpu_count() or 1)  # at most this machine's cores
        if self.threads is None:
            self.threads = max(1, (os.cpu_count() or 2) // 2)
        self.temp_root = Path(self.temp_root) if self.temp_root else default_temp_root()
        if self.temp_root.exists() and not self.temp_root.is_dir():
            raise ValueError(f"--temp-root {self.temp_root} is a file, not a folder")
        self.examples_dir = Path(self.examples_dir)

    @property
    def max_duration_s(self) -> float:
        return self.max_minutes * 60

    def overrides(self) -> dict[str, str]:
        """The components named on the command line (hub id or folder)."""
        return {c: str(getattr(self, c)) for c in COMPONENTS if getattr(self, c)}

    def preset_choices(self) -> list[str]:
        return ([CUSTOM] if len(self.overrides()) == len(COMPONENTS) else []) + available_presets()

    def example_clips(self) -> list[Path]:
        return sorted(self.examples_dir.glob("*.mp4")) if self.examples_dir.is_dir() else []

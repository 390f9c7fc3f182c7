"""Time the video rollout stage by stage, and its memory, on CPU.

    python -m pipeline.bench [--preset tiny|offline] [--seconds 10] [--size 640x360] [--steps 5] [--json OUT]
    python -m pipeline.bench --real-size [--device cpu|cuda]   # the hub models' cost at full size (pipeline.real_size)

Writes a synthetic clip (moving shapes, OpenCV), runs the real `run_rollout` on it on CPU and prints
the time of each stage (sample_frames, caption, predict, render, write_outputs) in total and per frame
(per observed frame for sampling and captioning, per predicted frame for prediction and rendering, per
written frame for the outputs), each stage's share of the rollout time, and the peak memory.

Presets:
  tiny     tiny random-weight models of the real architectures (BLIP captioner, Stable Diffusion
           renderer) built on the spot by `pipeline.tiny_pack`, and as predictor the shipped checkpoint
           world_model/pretrained/rocstories-cpu when present, otherwise a randomly initialised CPU-sized
           4-tensor model (d_x 16, d_t 8, 4 heads, 2 layers). Measures the pipeline's own cost (decoding,
           plumbing, the predictor, writing) with model costs shrunk to almost nothing.
  offline  the offline model pack (configs/pipeline/offline.yaml); exits 2 while the pack is not built.

The rollout time is the sum of the five stages; loading the models (a one-off cost, cached across runs
in one process) is shown separately and is not part of the shares.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import math
import os
import resource
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from pipeline.presets import PROJECT_ROOT, PresetError, choose_preset, load_preset, missing_offline_models
from world_model.utils.cli import UsageError, check_device, check_output
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main

STAGES = ("sample_frames", "caption", "predict", "render", "write_outputs")
# What each stage's per-frame time is divided by.
PER_FRAME_UNIT = {
    "sample_frames": "observed",
    "caption": "observed",
    "predict": "predicted",
    "render": "predicted",
    "write_outputs": "written",
}
SHIPPED_PREDICTOR = PROJECT_ROOT / "world_model" / "pretrained" / "rocstories-cpu"
CLIP_FPS = 25.0
MIB = 1024 * 1024


def write_shapes_clip(
    path: str | Path, seconds: float = 10.0, size: tuple[int, int] = (640, 360), fps: float = CLIP_FPS
) -> Path:
    """Write an MPEG-4 clip (OpenCV, mp4v) of three shapes moving over a dark background:
    a red disc sliding left to right, a green square bouncing up and down, a blue triangle on a diagonal."""
    path = Path(path)
    width, height = size
    count = max(1, round(seconds * fps))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    unit = max(2, min(width, height) // 8)
    try:
        for i in range(count):
            phase = i / max(count - 1, 1)
            frame = np.full((height, width, 3), 40, np.uint8)
            cx = round(unit + phase * (width - 2 * unit))
            cv2.circle(frame, (cx, height // 3), unit, (0, 0, 255), -1)  # BGR red
            y = round(abs(math.sin(math.pi * 2 * phase)) * (height - 2 * unit))
            cv2.rectangle(frame, (width // 2 - unit, y), (width // 2 + unit, y + 2 * unit), (0, 200, 0), -1)
            tx, ty = round(phase * (width - 2 * unit)), round(phase * (height - 2 * unit))
            triangle = np.array([[tx, ty + 2 * unit], [tx + 2 * unit, ty + 2 * unit], [tx + unit, ty]], np.int32)
            cv2.fillPoly(frame, [triangle], (255, 80, 0))
            writer.write(frame)
    finally:
        writer.release()
    return path


def current_rss() -> int | None:
    """Resident set size of this process now, in bytes (Linux /proc); None where unavailable."""
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class RssWatcher:
    """Track the largest RSS while a block runs: exact from getrusage when the process peak rises during the
    block, otherwise from sampling /proc every `period` seconds (the process peak was set earlier)."""

    def __init__(self, period: float = 0.01):
        self.period = period
        self.sampled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.sampled = max(self.sampled, current_rss() or 0)
            self._stop.wait(self.period)

    def __enter__(self) -> "RssWatcher":
        self.before = current_rss() or peak_rss()
        self.peak_before = peak_rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.after = current_rss() or peak_rss()
        grew = peak_rss() > self.peak_before
        self.run_peak = max(peak_rss() if grew else 0, self.sampled, self.before, self.after)
        # getrusage's high-water mark can lag the current RSS by a few pages: take whichever is higher.
        self.peak_after = max(peak_rss(), self.run_peak)


@contextmanager
def quiet_libraries():
    """Silence transformers' / diffusers' info warnings and save_pretrained progress bars; restore after."""
    import diffusers.utils.logging as diffusers_logging
    import transformers.utils.logging as transformers_logging

    saved = [
        (module, module.get_verbosity(), module.is_progress_bar_enabled())
        for module in (transformers_logging, diffusers_logging)
    ]
    for module, _, _ in saved:
        module.set_verbosity_error()
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module, verbosity, bars in saved:
            module.set_verbosity(verbosity)
            if bars:
                module.enable_progress_bar()


def build_tiny_models(folder: Path) -> tuple[dict[str, str], str]:
    """Tiny BLIP + tiny SD in `folder`, and the predictor; returns the component paths and what the predictor is."""
    from pipeline.tiny_pack import PREDICTOR_SENTENCES, make_tiny_blip, make_tiny_predictor, make_tiny_sd

    names = {"captioner": str(make_tiny_blip(folder / "captioner")), "renderer": str(make_tiny_sd(folder / "renderer"))}
    if SHIPPED_PREDICTOR.is_dir():
        names["predictor"] = str(SHIPPED_PREDICTOR)
        about = f"shipped checkpoint {SHIPPED_PREDICTOR.relative_to(PROJECT_ROOT)}"
    else:
        names["predictor"] = str(make_tiny_predictor(folder / "predictor", PREDICTOR_SENTENCES))
        from world_model.text.vocab import Vocabulary

        words = len(Vocabulary.load(names["predictor"]))
        about = (
            f"random CPU-sized 4-tensor model (d_x 16, d_t 8, H 4, L 2) over a {words}-word vocabulary from "
            f"{len(PREDICTOR_SENTENCES)} sentences; {SHIPPED_PREDICTOR.relative_to(PROJECT_ROOT)} not found"
        )
    return names, about


def offline_detail(error: PresetError) -> str:
    """The missing folders of the offline pack, or the preset error itself (its advice is for the rollout CLI)."""
    try:
        preset = load_preset("offline")
    except PresetError:
        return str(error)
    missing = missing_offline_models(preset)
    return f"missing: {', '.join(getattr(preset, c) for c in missing)}" if missing else str(error)


def stage_table(record: dict, steps: int) -> dict:
    """Per-stage totals, per-frame times and shares from a run's rollout.json content."""
    timings = record["timings_s"]
    observed = len(record["observed"])
    predicted = steps * len(record["predictions"])
    frames = {"observed": observed, "predicted": predicted, "written": observed + predicted}
    rollout = sum(timings[s] for s in STAGES)
    stages = {}
    for stage in STAGES:
        unit = PER_FRAME_UNIT[stage]
        stages[stage] = {
            "total_s": timings[stage],
            "per_frame_ms": round(1000 * timings[stage] / max(frames[unit], 1), 3),
            "per": f"{unit} frame",
            "share_pct": round(100 * timings[stage] / rollout, 2) if rollout > 0 else 0.0,
        }
    return {
        "observed_frames": observed,
        "predicted_frames": predicted,
        "stages": stages,
        "rollout_s": round(rollout, 3),
        "load_models_s": timings.get("load_models", 0.0),
        "predictor_share_pct": stages["predict"]["share_pct"],
    }


def format_report(result: dict) -> str:
    clip, mem = result["clip"], result["memory_mib"]
    lines = [
        f"preset: {result['preset']}   predictor: {result['predictor']}",
        f"clip: {clip['seconds']:g} s, {clip['width']}x{clip['height']} at {clip['fps']:g} fps; "
        f"{result['observed_frames']} observed frames, {result['steps']} steps -> {result['predicted_frames']} "
        f"predicted frames; device cpu, {result['torch_threads']} torch thread(s)",
        "",
        f"{'stage':<15}{'total s':>10}{'per frame ms':>15}  {'per':<17}{'share':>8}",
    ]
    for stage, row in result["stages"].items():
        lines.append(
            f"{stage:<15}{row['total_s']:>10.3f}{row['per_frame_ms']:>15.1f}  {row['per']:<17}{row['share_pct']:>7.1f}%"
        )
    lines += [
        f"{'rollout':<15}{result['rollout_s']:>10.3f}{'':>15}  {'(5 stages)':<17}{100:>7.1f}%",
        f"{'load_models':<15}{result['load_models_s']:>10.3f}{'':>15}  (one-off, not in the shares)",
        "",
        f"predictor share of the rollout time: {result['predictor_share_pct']:.1f}%",
        f"run_rollout wall time: {result['run_wall_s']:.3f} s",
        f"memory: process peak RSS {mem['peak_rss']:.1f} MiB (getrusage); during the run: RSS {mem['rss_before']:.1f}"
        f" -> peak {mem['run_peak_rss']:.1f} MiB (growth +{mem['rss_growth']:.1f} MiB), {mem['rss_after']:.1f} MiB after",
    ]
    return "\n".join(lines)


MAX_SIDE = 7680  # 8K UHD: the widest clip the bench writes


def parse_size(text: str) -> tuple[int, int]:
    """(width, height) of a WIDTHxHEIGHT text; a ValueError unless both are integers from 16 to `MAX_SIDE`."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size: expected WIDTHxHEIGHT, e.g. 640x360; got {text!r}") from None
    if width < 16 or height < 16:
        raise ValueError(f"--size: the clip must be at least 16x16; got {text!r}")
    if max(width, height) > MAX_SIDE:
        raise ValueError(f"--size: a side may be at most {MAX_SIDE} pixels (8K); got {text!r}")
    return width, height


@dataclass
class BenchSettings:
    """What the pipeline benchmark times: the models, the synthetic clip, the rollout and the threads."""

    preset: str = field(
        default="tiny", metadata={"choices": ("tiny", "offline"), "help": "models to time (default tiny)"}
    )
    seconds: float = field(default=10.0, metadata={"help": "length of the synthetic clip (default 10)"})
    size: str = field(default="640x360", metadata={"help": "clip WIDTHxHEIGHT (default 640x360)"})
    steps: int = field(default=5, metadata={"help": "predicted future states (default 5)"})
    interval: float = field(default=1.0, metadata={"help": "seconds between sampled frames (default 1)"})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's own choice)"})
    json: Path | None = field(default=None, metadata={"help": "also write the results to this JSON file"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --json file"})
    real_size: bool = field(
        default=False,
        metadata={"help": "time the hub preset's models at full size with random weights instead (no download)"},
    )
    device: str | None = field(
        default=None, metadata={"help": "with --real-size: cpu or cuda (default: cuda when present, else cpu)"}
    )

    def __post_init__(self) -> None:
        parse_size(self.size)
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise ValueError(f"--seconds must be positive, got {self.seconds}")
        if self.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {self.steps}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")


def main(argv: list[str] | None = None) -> int:
    return settings_main(BenchSettings, "pipeline.bench", __doc__.split("\n\n")[0], bench_or_real_size, argv)


def bench_or_real_size(settings: BenchSettings, command: str) -> int:
    """The command's work: `real_size_main` with --real-size, else `bench_command`; the exit code. --json is checked
    first, before any model is built."""
    if settings.json:
        check_output(settings.json, "--json", overwrite=settings.overwrite)
    return real_size_main(settings) if settings.real_size else bench_command(settings)


def bench_command(settings: BenchSettings) -> int:
    """Time one rollout of a generated clip (see the module docstring); 2 when the offline pack is missing."""
    if settings.preset == "tiny":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # only local folders are used: never wait on the hub
    import torch

    from pipeline.config import FrameSampling, ModelChoice
    from pipeline.rollout import run_rollout

    if settings.preset == "offline":
        try:
            choose_preset("offline")
        except PresetError as err:
            print(
                f"error: the offline model pack is not built yet, so there is nothing to time ({offline_detail(err)}); "
                "time the pipeline with --preset tiny instead",
                file=sys.stderr,
            )
            return 2
    threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp, quiet_libraries():
            tmp = Path(tmp)
            width, height = parse_size(settings.size)
            video = write_shapes_clip(tmp / "shapes.mp4", settings.seconds, (width, height))
            if settings.preset == "tiny":
                start = time.perf_counter()
                names, about = build_tiny_models(tmp / "models")
                print(f"built the tiny models in {time.perf_counter() - start:.1f} s", flush=True)
                kwargs = dict(names)
            else:
                about, kwargs = "offline pack", {}
            start = time.perf_counter()
            with RssWatcher() as memory:
                run = run_rollout(
                    video,
                    settings.steps,
                    ModelChoice(preset="offline" if settings.preset == "offline" else "auto", device="cpu", **kwargs),
                    FrameSampling(interval=settings.interval),
                    output=tmp / "run",
                )
            wall = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    result = {
        "preset": settings.preset,
        "predictor": about,
        "clip": {"seconds": settings.seconds, "width": width, "height": height, "fps": CLIP_FPS},
        "steps": settings.steps,
        "torch_threads": settings.threads or threads,
        **stage_table(run.record, settings.steps),
        "run_wall_s": round(wall, 3),
        "memory_mib": memory_figures(memory),
        "warnings": run.record["warnings"],
    }
    print(format_report(result))
    write_json_report(result, settings.json)
    return 0


def memory_figures(memory: RssWatcher) -> dict[str, float]:
    """The process's resident memory around the run, in MiB."""
    return {
        "peak_rss": round(memory.peak_after / MIB, 1),
        "rss_before": round(memory.before / MIB, 1),
        "run_peak_rss": round(memory.run_peak / MIB, 1),
        "rss_growth": round((memory.run_peak - memory.before) / MIB, 1),
        "rss_after": round(memory.after / MIB, 1),
    }


def write_json_report(result: dict, path: Path | None) -> None:
    """Write the figures to `path` as JSON (its folder created), when a path is given."""
    if path:
        write_json_atomic(path, result)
        print(f"wrote {path}")


def real_size_main(settings: BenchSettings) -> int:
    import torch

    from pipeline.real_size import format_result, measure

    check_device(settings.device)
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, got {device!r}")
    if settings.threads:
        torch.set_num_threads(settings.threads)
    with quiet_libraries():
        result = measure(device, memory=peak_rss)
    print(format_result(result))
    write_json_report(result, settings.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

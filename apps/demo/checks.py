"""Checks of a request before any model work, and the status lines they give; errors are `gr.Error`s a person reads."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import gradio as gr

from apps.demo.config import DEMO_MAX_STEPS, DemoConfig
from encoders.frames import VideoError, VideoInfo, probe_video
from world_model.models.generation_config import MAX_SEED

EMPTY_MESSAGE = "Upload a clip or pick an example first."
FAILED_MESSAGE = "**The rollout failed**: the error box (top right) says why. Nothing was kept from this run."
READY_MESSAGE = "Upload a clip (or pick an example) and press **Run rollout**."


def fail(message: str) -> gr.Error:
    """A message for the person at the browser: shown until closed, no traceback in the server log."""
    return gr.Error(message, duration=None, print_exception=False)


def md_escape(text: str) -> str:
    """Text shown literally inside Markdown (captions and sentences come from models)."""
    return re.sub(r"([\\`*_{}\[\]<>()#+\-!|~])", r"\\\1", text)


def check_clip(video: str | Path | None, config: DemoConfig) -> tuple[Path, VideoInfo]:
    """The upload as a path and its stream properties, or gr.Error saying why it cannot be used (missing,
    too big, too long, not a video, a single image)."""
    if video is None or (isinstance(video, str) and not video.strip()):
        raise fail(EMPTY_MESSAGE)
    path = Path(video)
    name = path.name
    max_mb = config.max_file_mb
    try:
        size = path.stat().st_size
    except OSError:
        raise fail(f"The upload {name} is no longer on the server; upload it again.") from None
    if size > max_mb * 1024 * 1024:
        raise fail(
            f"{name} is {size / 1024 / 1024:.1f} MB; the limit is {max_mb:g} MB. "
            "Trim or re-encode the clip and upload it again."
        )
    try:
        info = probe_video(path)
    except VideoError as err:
        raise fail(readable(err, path)) from None
    if info.frame_count < 2:  # an image (a PNG renamed .mp4) opens as a one-frame stream
        raise fail(f"{name} holds a single image, not a video; upload a video clip (MP4, MOV, AVI, WebM ...).")
    max_s = config.max_duration_s
    if info.duration > max_s:
        raise fail(
            f"{name} is {format_duration(info.duration)} long; the limit is {format_duration(max_s)}. "
            "Trim the clip and upload it again."
        )
    return path, info


def describe_clip(path: Path, info: VideoInfo) -> str:
    return f"{md_escape(path.name)}: {format_duration(info.duration)}, {info.width}×{info.height}, {info.fps:g} fps"


def on_upload(video: str | None, config: DemoConfig) -> str:
    """The status line right after an upload: the clip's properties, or why it cannot be used."""
    if video is None:
        return READY_MESSAGE
    try:
        return f"Clip {describe_clip(*check_clip(video, config))}. Press **Run rollout**."
    except gr.Error as err:
        return f"**Cannot use this clip:** {md_escape(err.message)}"


REFUSED = -1.0  # on_check's "time of the click" for a refused request: the run step then changes nothing


def on_check(
    video: str | None,
    steps: float,
    config: DemoConfig,
    seed: float = 0,
    expect: Callable[[VideoInfo], str] | None = None,
) -> tuple[str, str, float]:
    """The quick first step of a run: the status (with `expect(clip's info)`, how long the run should take), an empty
    out-of-world banner and the time of the click (the rollout may then wait in the queue, and its reported time
    counts that); for a bad request, the status says why (`error_status`) and the time is `REFUSED`."""
    try:
        if video is None:
            raise fail(EMPTY_MESSAGE)
        check_steps(steps)
        check_seed(seed)
        path, info = check_clip(video, config)
        expected = f" ({expect(info)})" if expect else ""
        return f"**Running** on {describe_clip(path, info)} …{expected}", "", time.time()
    except gr.Error as err:
        return error_status(err.message), "", REFUSED


def error_status(message: str) -> str:
    """The status area's words for a request that could not run (the next run's status replaces them)."""
    return f"**Could not run:** {message}"


def check_steps(steps) -> int:
    try:
        steps_int = int(steps)
    except (TypeError, ValueError):
        raise fail(f"Steps must be a whole number from 1 to {DEMO_MAX_STEPS}; got {steps!r}.") from None
    if steps_int != steps or not 1 <= steps_int <= DEMO_MAX_STEPS:
        raise fail(f"Steps must be a whole number from 1 to {DEMO_MAX_STEPS}; got {steps}.")
    return steps_int


def check_seed(seed) -> int:
    try:
        seed_int = int(seed or 0)
    except (TypeError, ValueError, OverflowError):
        raise fail(f"The seed must be a whole number from 0 to {MAX_SEED}; got {seed!r}.") from None
    if seed_int != (seed or 0) or not 0 <= seed_int <= MAX_SEED:
        raise fail(f"The seed must be a whole number from 0 to {MAX_SEED}; got {seed:g}.")
    return seed_int


def format_duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{seconds:.1f} s"
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


HUB_UNAVAILABLE = (
    "The hub models are not on this server and cannot be downloaded now. Choose **offline** under Model preset "
    "(the bundled models), or ask the server's owner to download them."
)


OFFLINE_MISSING = (
    "The offline model pack is not installed on this server. Choose **hub** under Model preset (the hub models), "
    "or ask the server's owner to install the pack."
)


def readable(err: BaseException, video: Path | None = None) -> str:
    """The error's message for a person at the browser: the server's upload path shortened to the file name, and a
    preset that cannot load said in the page's words (which control to change), with no server path."""
    message = str(err) or type(err).__name__
    if message.startswith("--preset hub:") or (
        message.startswith("auto:") and "neither cached nor reachable" in message
    ):
        return HUB_UNAVAILABLE
    if "offline model pack is not in this installation" in message:
        return OFFLINE_MISSING
    if video is not None:
        message = message.replace(str(video), video.name)
    return message

"""Sample RGB frames from a video file.

Decoding goes through OpenCV's FFmpeg backend.  Only the sampled frames are converted and
kept: the reader skips ahead with ``grab()`` (decode without colour conversion) for short gaps
and seeks with ``CAP_PROP_POS_FRAMES`` for long ones, and every kept frame is shrunk to
``max_side`` right away, so memory stays bounded even for long 4K clips.

Rotation metadata (phones store portrait video as landscape frames plus a display matrix) is
applied by OpenCV's auto-rotation (``CAP_PROP_ORIENTATION_AUTO``, set explicitly), so frames
come out as a player shows them; ``VideoInfo.rotation`` reports the angle that was applied.

Timing comes from the container: each frame's presentation timestamp (``CAP_PROP_POS_MSEC``), not
frame index / fps, so variable-frame-rate MP4s (as phones write) and AVIs whose index holds empty
repeat-frame entries are timed right; a sample at time t is the first frame shown at or after t (less
half a nominal frame), and its ``timestamp`` is that frame's own. Raw streams without timestamps are
timed as index / fps.

Errors: unusable input raises ``VideoError`` with the reason (missing, empty, not a video, no
video stream, frames smaller than ``MIN_SIDE``, no decodable frame).  A stream that breaks part-way (truncated download, corrupt
data) is not an error: the sampled frames decoded before the break are returned, minus the frame
right before it (its data may be cut short and patched by the decoder with older pixels), and
``SampledClip.warnings`` says what happened.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import imageio_ffmpeg
import numpy as np

logger = logging.getLogger(__name__)

# Gaps longer than this are seeked over rather than decoded through with grab(). A seek restarts
# decoding at the previous keyframe, so it only pays off for gaps longer than a typical GOP.
SEEK_GAP_SECONDS = 5.0
PLAN_PER_FRAME = 10  # sampling times planned per frame of the clip at most (intervals shorter than a frame)
MIN_SIDE = 16  # pixels: a smaller frame shows nothing a captioner could name


class VideoError(ValueError):
    """The file cannot be used as a video; the message says why."""


@dataclass(frozen=True)
class VideoInfo:
    """Stream properties; ``width``/``height`` are as displayed, i.e. after ``rotation``."""

    fps: float
    frame_count: int
    duration: float  # seconds, as the container says (frame_count / fps when it does not)
    width: int
    height: int
    rotation: int  # degrees clockwise applied to the stored frames: 0, 90, 180 or 270
    timed: bool = True  # frames carry presentation timestamps; False for raw streams (timed as index / fps)


@dataclass
class SampledFrame:
    image: np.ndarray  # (H, W, 3) uint8 RGB, rotated upright, longer side <= max_side
    timestamp: float  # seconds from the start of the stream: the frame's presentation timestamp
    index: int  # round(timestamp * fps): the frame index for constant-rate streams


@dataclass
class SampledClip(Sequence[SampledFrame]):
    """Frames sampled from one video in stream order; behaves like ``list[SampledFrame]``.

    ``warnings`` lists anything the caller should know: frames thinned to ``max_frames``, or a
    stream that stopped decoding before the last planned frame (truncated or corrupt file).
    """

    frames: list[SampledFrame]
    info: VideoInfo
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int | slice) -> SampledFrame | list[SampledFrame]:
        return self.frames[i]


def probe_video(path: str | Path) -> VideoInfo:
    """Read a video's properties without decoding its frames (except to count them when the
    container does not say, e.g. a raw H.264 stream).  Raises ``VideoError``."""
    capture, info = _open(Path(path))
    capture.release()
    return info


def sample_frames(
    path: str | Path,
    interval: float = 1.0,
    num_frames: int | None = None,
    max_frames: int = 64,
    max_side: int = 512,
    frames_per_state: int = 1,
) -> SampledClip:
    """Sample frames from ``path``.

    By default one frame every ``interval`` seconds starting at 0 (the first frame shown at or after
    each time, less half a nominal frame; ``timestamp`` is that frame's own presentation time).  With
    ``num_frames``, that many frames evenly spaced from the first to the last frame (fewer if the clip
    is shorter).  If more than ``max_frames`` would be taken, the plan is thinned evenly to
    ``max_frames`` (first and last kept) and a warning is recorded.  Frames are RGB, upright, and
    resized (aspect kept, never enlarged) so the longer side is at most ``max_side``.

    With ``frames_per_state`` K > 1 (interval sampling only) each sampled item is a *state strip*:
    the K frames ``state_offsets`` picks from ``[t, t + interval)``, each resized as above and
    tiled left to right into one (h, K * w, 3) image, so a single image shows the motion of that
    span (the input the synthetic world's captioner reads).  ``timestamp``/``index`` are those of
    the strip's first frame; a trailing span the clip does not cover in full is not sampled.

    Raises ``VideoError`` if the file is unusable or no frame decodes at all.
    """
    if interval <= 0 or max_frames < 1 or max_side < 1 or (num_frames is not None and num_frames < 1):
        raise ValueError("interval, num_frames, max_frames and max_side must be positive")
    if frames_per_state < 1 or (frames_per_state > 1 and num_frames is not None):
        raise ValueError(f"frames_per_state must be >= 1, and 1 with num_frames; got {frames_per_state}")
    path = Path(path)
    capture, info = _open(path)
    try:
        if num_frames is None:
            check_interval(path, info, interval)
        offsets = [o / info.fps for o in state_offsets(info.fps, interval, frames_per_state)]  # seconds
        last = info.duration - 1 / info.fps  # nominal start of the last frame
        plan = [t for t in sample_times(info, interval, num_frames) if t + offsets[-1] <= last + 1e-6]
        if not plan:
            raise VideoError(f"{path} is {info.duration:.2f}s long, shorter than one {interval}s state")
        warnings = [_header_overstates(path, info)] if _header_overstates(path, info) else []
        if len(plan) > max_frames:
            warnings.append(f"{len(plan)} frames planned; evenly thinned to max_frames={max_frames}")
            plan = [plan[k] for k in np.linspace(0, len(plan) - 1, max_frames).round().astype(int)]
        wanted = sorted({_key(start + offset) for start in plan for offset in offsets})
        decoded, pts, ended = _decode_at(capture, wanted, info, max_side)
    finally:
        capture.release()
    # Broken: the stream stopped well before the end of its own frames. A video stream that simply ends before the
    # container's declared duration (a longer audio track, rounding) has reached its last frame and is not broken.
    stream_end = min(last, (info.frame_count - 1) / info.fps) if info.frame_count else last
    broken = ended and pts < stream_end - max(interval, 1.0)
    if broken and decoded:
        decoded = {t: f for t, f in decoded.items() if f[1] < pts}  # the frame before a break may be cut short
    frames = _assemble(plan, offsets, decoded, info.fps)
    if not frames:
        raise VideoError(
            f"No frame of {path} could be decoded (it claims {info.duration:.2f}s, {info.frame_count} frames)"
        )
    if len(frames) < len(plan):
        warnings.append(_shortfall(path, pts, info, len(frames), len(plan), broken))
    for message in warnings:
        logger.warning(message)
    return SampledClip(frames, info, warnings)


def _assemble(plan: list[float], offsets: list[float], decoded: dict, fps: float) -> list[SampledFrame]:
    """The sampled frames (or strips: the frames at each start + offset, tiled left to right) up to the first gap."""
    frames = []
    for start in plan:
        parts = [decoded.get(_key(start + offset)) for offset in offsets]
        if None in parts:
            break
        image = np.concatenate([part[0] for part in parts], axis=1)
        frames.append(SampledFrame(image, parts[0][1], round(parts[0][1] * fps)))
    return frames


def _shortfall(path: Path, pts: float, info: VideoInfo, got: int, planned: int, broken: bool) -> str:
    """The warning for a clip that gave fewer frames than planned: broken part-way, or a stream shorter than its
    container."""
    if broken:
        return (
            f"{path.name}: decoding stopped at {pts:.2f}s of {info.duration:.2f}s; returning {got} of "
            f"{planned} planned frames. The file is probably truncated or corrupt."
        )
    return (
        f"{path.name}: the video stream ends at {pts:.2f}s, before the {info.duration:.2f}s the container declares "
        f"(a longer audio track, or rounding); returning the {got} of {planned} planned frames it holds"
    )


def check_interval(path: Path, info: VideoInfo, interval: float) -> None:
    """A VideoError when sampling every `interval` seconds would plan far more times than the clip has frames (an
    interval much shorter than a frame: the plan would grow without bound in memory and time before it is thinned)."""
    planned = info.duration / interval
    if planned > PLAN_PER_FRAME * max(info.frame_count, info.duration * info.fps) + 100:
        raise VideoError(
            f"--interval {interval:g} is shorter than one frame of {path.name} ({1 / info.fps:.3g}s at {info.fps:g} "
            f"fps): it would plan {planned:.3g} samples of the clip's {info.frame_count} frames; use at least {1 / info.fps:.3g}"
        )


def _header_overstates(path: Path, info: VideoInfo) -> str:
    """The warning for a file whose header counts more frames than it holds (an AVI cut short keeps its header's
    frame count; the data, and the container's duration, end earlier), or "" when the two agree."""
    counted = info.frame_count / info.fps
    if not info.timed or counted <= info.duration + max(1.0, 0.05 * info.duration):
        return ""
    return (
        f"{path.name}: its header counts {info.frame_count} frames ({counted:.2f}s) but the file holds only "
        f"{info.duration:.2f}s of them; sampling that part. The file is probably truncated or corrupt."
    )


def _key(seconds: float) -> float:
    return round(seconds, 6)


def _decode_at(
    capture: cv2.VideoCapture, wanted: list[float], info: VideoInfo, max_side: int
) -> tuple[dict[float, tuple[np.ndarray, float]], float, bool]:
    """For each time in ``wanted`` (sorted seconds), the first frame whose presentation timestamp is at
    least ``time`` less half a nominal frame, as ``{time: ((h, w, 3) RGB, its timestamp)}``; also the timestamp of the
    last frame decoded and whether the stream ended before the last wanted time.

    Timestamps are the container's (``CAP_PROP_POS_MSEC``), not frame index / fps, so variable-frame-rate
    streams and indexes with empty repeat-frame entries (sparse AVIs) are timed right. Gaps longer than
    ``SEEK_GAP_SECONDS`` are seeked over; the frame a seek lands on is used only by its own timestamp.
    A raw stream (``info.timed`` False) has no timestamps: it is decoded through, frame n at n / fps.
    """
    decoded: dict[float, tuple[np.ndarray, float]] = {}
    tolerance = 0.5 / info.fps
    pts, current, count = -math.inf, None, 0  # timestamp, RGB image and number of the frames decoded
    for time in wanted:
        if info.timed and time - max(pts, 0.0) > SEEK_GAP_SECONDS:
            capture.set(cv2.CAP_PROP_POS_MSEC, time * 1000)
            pts, current = capture.get(cv2.CAP_PROP_POS_MSEC) / 1000, None
        while pts < time - tolerance:
            if not capture.grab():
                return decoded, pts, True
            count += 1
            pts = capture.get(cv2.CAP_PROP_POS_MSEC) / 1000 if info.timed else (count - 1) / info.fps
            current = None
        if current is None:
            ok, bgr = capture.retrieve()
            if not ok:
                return decoded, pts, True
            current = _to_rgb(bgr, max_side)
        decoded[time] = (current, pts)
    return decoded, pts, False


def state_offsets(fps: float, interval: float, frames_per_state: int) -> list[int]:
    """Frame offsets, from a state's first frame, of the ``frames_per_state`` frames of its strip:
    evenly spaced from the first to the last frame of ``interval`` seconds at ``fps`` (``[0]`` for 1)."""
    last = max(round(interval * fps) - 1, 0)
    return np.unique(np.linspace(0, last, frames_per_state).round().astype(int)).tolist()


def sample_times(info: VideoInfo, interval: float, num_frames: int | None = None) -> list[float]:
    """Sorted, distinct times (seconds) to sample, from 0 to the nominal start of the last frame."""
    last = max(info.duration - 1 / info.fps, 0.0)
    if num_frames is not None:
        points = np.linspace(0, last, num_frames)
    else:
        points = np.arange(int(last / interval + 1e-9) + 1) * interval
    return sorted({_key(p) for p in points})


def _to_rgb(bgr: np.ndarray, max_side: int) -> np.ndarray:
    """(H, W, 3) uint8 BGR -> (h, w, 3) uint8 RGB with max(h, w) <= max_side."""
    height, width = bgr.shape[:2]
    scale = max_side / max(height, width)
    if scale < 1:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def check_file_name(path: Path) -> None:
    """Raise ``VideoError`` when ``path`` is not valid UTF-8 (OpenCV's FFmpeg reader crashes the process on one)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise VideoError(
            f"The path {shown} is not valid UTF-8, which the video reader cannot open; rename it"
        ) from None


def _open(path: Path) -> tuple[cv2.VideoCapture, VideoInfo]:
    """Open ``path`` for decoding with auto-rotation on, or raise ``VideoError`` saying why not."""
    check_file_name(path)
    if not path.exists():
        raise VideoError(f"Video file not found: {path}")
    if path.is_dir():
        raise VideoError(f"Expected a video file, got a directory: {path}")
    if not path.is_file():
        raise VideoError(f"{path} is not a regular file ({file_kind(path)}); give a video file")
    if path.stat().st_size == 0:
        raise VideoError(f"Video file is empty (0 bytes): {path}")
    capture = _capture(path)
    if not capture.isOpened():
        raise VideoError(f"Cannot read {path} as a video: {_diagnose(path)}")
    fps = capture.get(cv2.CAP_PROP_FPS)
    if not fps > 0:
        capture.release()
        raise VideoError(f"{path} does not report a frame rate")
    frame_count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    duration = None
    if frame_count <= 0:  # container without a frame count (raw stream): count by decoding
        frame_count = _count_frames(capture)
        capture.release()
        capture = _capture(path)
    else:  # a raw stream's "duration" would be ffmpeg's guess from its bitrate
        duration = _container_duration(path)
    info = VideoInfo(
        fps=fps,
        frame_count=frame_count,
        duration=duration or frame_count / fps,
        width=int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        height=int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        rotation=round(capture.get(cv2.CAP_PROP_ORIENTATION_META)) % 360,
        timed=duration is not None,
    )
    if 0 < min(info.width, info.height) < MIN_SIDE:  # 0: not known before decoding
        capture.release()
        raise VideoError(
            f"{path} has {info.width}x{info.height} frames; at least {MIN_SIDE}x{MIN_SIDE} pixels are needed"
        )
    return capture, info


def file_kind(path: Path) -> str:
    """What a path that is not a regular file or folder is: a FIFO, a character device, ..."""
    mode = path.stat().st_mode
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    return next((name for test, name in kinds.items() if test(mode)), "a socket or other special file")


def _capture(path: Path) -> cv2.VideoCapture:
    with _opencv_errors_only():  # a file it cannot open gets our own error (`_diagnose`), not OpenCV's warning
        capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    capture.set(cv2.CAP_PROP_ORIENTATION_AUTO, 1)
    return capture


@contextlib.contextmanager
def _opencv_errors_only():
    """Lower OpenCV's log to errors for the block, then put back the level the caller had."""
    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    try:
        yield
    finally:
        cv2.utils.logging.setLogLevel(level)


def _count_frames(capture: cv2.VideoCapture) -> int:
    count = 0
    while capture.grab():
        count += 1
    return count


def _container_duration(path: Path) -> float | None:
    """The duration the container declares (``ffmpeg -i``'s report), or None when it declares none."""
    report = _ffmpeg_report(path)
    found = re.search(r"Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)", report)
    if not found:
        return None
    hours, minutes, seconds = found.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds) or None


def _ffmpeg_report(path: Path) -> str:
    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)]
    return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=60).stderr


def _diagnose(path: Path) -> str:
    """Explain, from ``ffmpeg -i``'s report, why OpenCV could not open ``path``."""
    report = _ffmpeg_report(path)
    streams = {kind.lower() for kind in re.findall(r"Stream #\d+:\d+\S*: (\w+):", report)}
    if "video" in streams:
        return "it has a video stream, but OpenCV's FFmpeg backend cannot decode it"
    if streams:
        return f"it has no video stream (only {', '.join(sorted(streams))})"
    found = re.search(r"Error opening input: (.+)", report)
    reason = found.group(1).strip() if found else "ffmpeg cannot open it"
    with path.open("rb") as file:
        if file.read(12)[4:8] == b"ftyp":
            return f"it is an MP4 whose header or index cannot be read ({reason}): it is probably truncated or corrupt"
    return f"it is not a video file ({reason})"

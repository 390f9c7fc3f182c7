"""The captions a predictor is fitted on: a folder of clips captioned as the rollout captions a clip (the same
sampling, captioner and merging of repeated captions), kept in a JSONL so that no clip is captioned twice; or
captions made elsewhere, a JSONL or CSV of (clip, time, sentence) rows.

`captions.jsonl` holds one line per clip: {"clip", "bytes", "mtime_ns", "captioner", "interval",
"frames_per_state", "times", "captions", "flagged"}; a clip is captioned again only when one of the first six
changed (the file was replaced, or another captioner or sampling was asked for).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from encoders.frames import VideoError, sample_frames
from encoders.grounding import clip_verdict
from pipeline.config import MAX_FRAMES
from pipeline.presets import available_presets, load_preset
from world_model.text.windows import caption_states
from world_model.utils.cli import UsageError
from world_model.utils.files import repo_path

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v")
TABLE_SUFFIXES = (".jsonl", ".csv")
TABLE_COLUMNS = ("clip", "time", "sentence")
CAPTIONS_FILE = "captions.jsonl"


@dataclass(frozen=True)
class Captioning:
    """Which captioner reads the clips, and how the rollout would sample them for it."""

    name: str  # as the user gave it: a preset (offline, hub), a hub id or a folder
    model: str  # the captioner's folder or hub id
    interval: float  # seconds between sampled states
    frames_per_state: int = 1  # frames tiled into one strip (the offline captioner reads 3)
    merge_repeats: bool = True  # consecutive identical captions are one state
    options: tuple = ()  # keyword arguments of HFCaptioner.from_pretrained

    @classmethod
    def named(cls, name: str, interval: float) -> Captioning:
        """A preset's captioner and sampling (`configs/pipeline/NAME.yaml`), or the hub id / folder `name` with one
        frame a state and repeats merged."""
        if name in available_presets() and name != "auto":
            preset = load_preset(name)
            options = tuple(sorted(preset.captioner_options.items()))
            return cls(name, preset.captioner, interval, preset.frames_per_state, preset.merge_repeats, options)
        return cls(name, name, interval)

    def key(self) -> dict:
        """What a cached clip's captions must have been made with to be reused (a folder inside the repository by
        its path from the repository's root)."""
        return {
            "captioner": repo_path(self.model),
            "interval": self.interval,
            "frames_per_state": self.frames_per_state,
        }


@dataclass
class ClipCaptions:
    """One clip's captions in time order, and how many of its frames lie outside the captioner's world."""

    clip: str  # the clip's name, relative to the folder
    times: list[float]
    captions: list[str]
    flagged: int = 0  # frames the captioner's grounding flags (0 when it gives no calibrated score)
    record: dict = field(default_factory=dict)  # the cache line it was read from or written as

    def states(self, merge: bool) -> list[str]:
        """The clip's sequence of states: its captions as state sentences, repeats merged when `merge`."""
        return [state.sentence for state in caption_states(self.captions, merge)]


def find_clips(folder: Path) -> list[Path]:
    """The video files directly in `folder` (by suffix), sorted by name; a UsageError when there are none."""
    clips = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
    if not clips:
        raise UsageError(f"{folder} holds no video files ({', '.join(VIDEO_SUFFIXES)})")
    return clips


def caption_clips(
    folder: Path, captioning: Captioning, cache: Path, device: str | None = None, progress: bool = True
) -> list[ClipCaptions]:
    """Every clip of `folder` captioned (`captioning`), reusing the lines of `cache` that match and appending a line
    for each clip captioned now, as soon as it is done. A clip that cannot be read is left out with a warning."""
    cached = read_cache(cache)
    out, todo = [], []
    for path in find_clips(folder):
        key = {"clip": path.name, "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
        key.update(captioning.key())
        hit = cached.get(path.name)
        if hit is not None and all(hit.get(k) == v for k, v in key.items()):
            out.append(from_record(hit))
        else:
            todo.append((path, key))
    if todo:
        from pipeline.components import load_captioner

        captioner = load_captioner(captioning.model, device, captioning.options)
        cache.parent.mkdir(parents=True, exist_ok=True)
        for path, key in tqdm(todo, desc="captioning clips", unit="clip", disable=not progress):
            try:
                made = caption_clip(captioner, path, captioning)
            except VideoError as err:
                print(f"warning: {path.name} left out: {err}", flush=True)
                continue
            record = {**key, "times": made.times, "captions": made.captions, "flagged": made.flagged}
            with open(cache, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            out.append(from_record(record))
    return sorted(out, key=lambda c: c.clip)


def caption_clip(captioner, path: Path, captioning: Captioning) -> ClipCaptions:
    """One clip sampled and captioned as the rollout does it."""
    clip = sample_frames(
        path, interval=captioning.interval, max_frames=MAX_FRAMES, frames_per_state=captioning.frames_per_state
    )
    for warning in clip.warnings:
        print(f"warning: {path.name}: {warning}", flush=True)
    from pipeline.rollout import caption

    captions, groundings = caption(captioner, [frame.image for frame in clip], lambda fraction, message: None)
    flagged = clip_verdict(groundings)["flagged"]  # 0 for a captioner that gives no grounding
    return ClipCaptions(path.name, [round(frame.timestamp, 3) for frame in clip], captions, flagged)


def read_cache(cache: Path) -> dict[str, dict]:
    """The cache's lines by clip name (the last line of a clip wins); {} without a cache. A damaged line (a run
    killed while writing it) is skipped: that clip is captioned again."""
    if not cache.is_file():
        return {}
    lines = {}
    for line in cache.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            lines[record["clip"]] = record
        except (ValueError, KeyError, TypeError):
            continue
    return lines


def from_record(record: dict) -> ClipCaptions:
    return ClipCaptions(record["clip"], record["times"], record["captions"], record.get("flagged", 0), record)


def read_caption_table(path: Path) -> list[ClipCaptions]:
    """Captions made elsewhere: a JSONL of {"clip", "time", "sentence"} objects or a CSV with those columns, one
    row per caption; each clip's rows ordered by time. A UsageError naming the row that is not one."""
    if path.suffix.lower() == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in TABLE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UsageError(f"{path}: the CSV needs the columns {', '.join(TABLE_COLUMNS)}; missing {missing}")
            rows = list(reader)
    else:
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as err:
                    raise UsageError(f"{path}, line {number}: not JSON ({err})") from None
    clips: dict[str, list[tuple[float, str]]] = {}
    for number, row in enumerate(rows, start=1):
        try:
            clip, time, sentence = str(row["clip"]), float(row["time"]), str(row["sentence"]).strip()
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{path}, row {number}: needs a clip, a numeric time and a sentence") from None
        if not sentence:
            raise UsageError(f"{path}, row {number}: the sentence is empty")
        clips.setdefault(clip, []).append((time, sentence))
    if not clips:
        raise UsageError(f"{path} holds no captions")
    out = []
    for clip, timed in sorted(clips.items()):
        timed.sort(key=lambda t: t[0])
        out.append(ClipCaptions(clip, [t for t, _ in timed], [s for _, s in timed]))
    return out


def is_caption_table(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in TABLE_SUFFIXES


def clip_source(path: Path) -> str:
    """What CLIPS is: "folder" or "table"; a UsageError otherwise."""
    if path.is_dir():
        return "folder"
    if is_caption_table(path):
        return "table"
    if not os.path.exists(path):
        raise UsageError(f"{path} not found: give a folder of clips or a captions file (.jsonl or .csv)")
    raise UsageError(f"{path} is neither a folder of clips nor a captions file ({', '.join(TABLE_SUFFIXES)})")

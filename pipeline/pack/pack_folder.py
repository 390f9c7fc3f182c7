"""A model pack on disk (the offline preset's captioner, renderer and predictor folders, plus ``baseline``) and the
held-out synthetic episodes it is evaluated on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.presets import load_preset, resolve_model_path
from world_model.data.rocstories import DataError
from world_model.data.synthetic.episodes import (
    read_episodes,
)
from world_model.data.synthetic.scenes import SCENE_TYPES

BASELINE_FOLDER = "baseline"
INDEX_FILES = {
    "captioner": "config.json",
    "renderer": "model_index.json",
    "predictor": "config.json",
    "baseline": "config.json",
}
MB = 1e6


class EvaluationError(ValueError):
    """The pack, the data or the settings cannot be evaluated; the message says what is missing or wrong."""


@dataclass
class Pack:
    """A model pack's component folders and the options the offline preset gives its captioner and renderer."""

    root: Path
    folders: dict[str, Path]  # captioner, renderer, predictor, baseline
    captioner_options: dict
    renderer_options: dict

    def size_mb(self) -> dict:
        """Bytes of every file under the pack and under each component, in MB (10^6 bytes)."""

        def size(folder: Path) -> float:
            return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB

        return {"total": round(size(self.root), 3), **{c: round(size(f), 3) for c, f in self.folders.items()}}


def resolve_pack(pack: str | Path) -> Pack:
    """The pack's folders: those the offline preset names (by their last path component) and ``baseline``.

    Raises ``EvaluationError`` listing every missing folder or index file.
    """
    root = Path(resolve_model_path(str(pack)))
    if not root.is_dir():
        raise EvaluationError(f"model pack {pack} not found (looked for the folder {root})")
    preset = load_preset("offline")
    names = {c: Path(getattr(preset, c)).name for c in ("captioner", "renderer", "predictor")}
    names["baseline"] = BASELINE_FOLDER
    folders = {c: root / name for c, name in names.items()}
    missing = [
        f"{c} ({folders[c]}: {'no folder' if not folders[c].is_dir() else f'no {INDEX_FILES[c]}'})"
        for c in folders
        if not (folders[c] / INDEX_FILES[c]).is_file()
    ]
    if missing:
        raise EvaluationError(f"model pack {root} is missing: {'; '.join(missing)}")
    return Pack(root, folders, dict(preset.captioner_options), dict(preset.renderer_options))


def read_heldout(data: str | Path, episodes: int, seconds: int) -> tuple[list[dict], list[str]]:
    """The first ``episodes`` records of the split folder ``data`` (each with its clip's ``path``) and the
    scene types they were generated with (``summary.json``, default all). Each must last ``seconds``."""
    data = Path(data)
    if not (data / "episodes.jsonl").is_file() and (data / "heldout" / "episodes.jsonl").is_file():
        raise EvaluationError(f"{data} is a data folder; pass its split folder {data / 'heldout'}")
    try:
        records = read_episodes(data)
    except DataError as err:
        raise EvaluationError(str(err)) from err
    if len(records) < episodes:
        raise EvaluationError(f"{data} holds {len(records)} episodes, fewer than --episodes {episodes}")
    records = records[:episodes]
    short = [r["id"] for r in records if len(r["sentences"]) < seconds]
    if short:
        raise EvaluationError(
            f"episode(s) {', '.join(short[:5])} of {data} last fewer than observe + steps = {seconds} seconds"
        )
    clips = [r["path"] for r in records if not Path(r["path"]).is_file()]
    if clips:
        raise EvaluationError(f"{len(clips)} clip(s) named in {data / 'episodes.jsonl'} are missing, e.g. {clips[0]}")
    summary = data / "summary.json"
    scenes = (
        json.loads(summary.read_text()).get("scene_types", list(SCENE_TYPES))
        if summary.is_file()
        else list(SCENE_TYPES)
    )
    return records, scenes


@dataclass
class WorldEvaluation:
    """Which pack is evaluated on which held-out episodes, and where the report goes."""

    data: Path = field(metadata={"help": "held-out split folder (with episodes.jsonl and clips)"})
    episodes: int = field(metadata={"help": "evaluate the first N episodes"})
    out: Path = field(metadata={"help": "output folder"})
    pack: str = field(default="offline_pack", metadata={"help": "model pack folder (default offline_pack)"})
    observe: int = field(default=3, metadata={"help": "observed seconds (default 3)"})
    steps: int = field(default=5, metadata={"help": "predicted seconds (default 5)"})
    seed: int = field(default=0, metadata={"help": "rendering seed (default 0)"})
    device: str | None = field(default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"})
    storyboard_episodes: int = field(default=4, metadata={"help": "episodes drawn in storyboard.png (default 4)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    progress: bool = field(default=True, metadata={"flag": False})  # progress bars (off in tests)

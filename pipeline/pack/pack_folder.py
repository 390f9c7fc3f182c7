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


def read_heldout(data: str | Path, episodes: int | None, seconds: int) -> tuple[list[dict], list[str]]:
    """The first ``episodes`` (None: all) held-out records of the data folder ``data`` (``train/`` and ``heldout/``;
    each record with its clip's ``path``) and the scene types they were generated with (``summary.json``, default
    all). Each must last ``seconds``."""
    data = Path(data)
    if (data / "episodes.jsonl").is_file():
        raise EvaluationError(f"{data} is a split folder; pass the data folder above it, {data.parent}")
    for split in ("train", "heldout"):
        if not (data / split / "episodes.jsonl").is_file():
            raise EvaluationError(
                f"{data / split} holds no episodes.jsonl: the data folder needs train/ (the floors are counted "
                "on it) and heldout/ (from `python -m world_model.data.synthetic.generator generate`)"
            )
    try:
        records = read_episodes(data / "heldout")
    except DataError as err:
        raise EvaluationError(str(err)) from err
    if episodes is not None and len(records) < episodes:
        raise EvaluationError(f"{data / 'heldout'} holds {len(records)} episodes, fewer than --episodes {episodes}")
    records = records[:episodes]
    short = [r["id"] for r in records if len(r["sentences"]) < seconds]
    if short:
        raise EvaluationError(
            f"episode(s) {', '.join(short[:5])} of {data / 'heldout'} last fewer than observe + steps = {seconds} "
            "seconds"
        )
    clips = [r["path"] for r in records if not Path(r["path"]).is_file()]
    if clips:
        raise EvaluationError(
            f"{len(clips)} clip(s) named in {data / 'heldout' / 'episodes.jsonl'} are missing, e.g. {clips[0]}"
        )
    summary = data / "heldout" / "summary.json"
    scenes = (
        json.loads(summary.read_text()).get("scene_types", list(SCENE_TYPES))
        if summary.is_file()
        else list(SCENE_TYPES)
    )
    return records, scenes


@dataclass
class WorldEvaluation:
    """Which pack is evaluated on which held-out episodes, and where the report goes."""

    data: Path = field(metadata={"help": "data folder with train/ (floors) and heldout/ (episodes and clips)"})
    out: Path = field(metadata={"help": "output folder"})
    pack: str = field(default="offline_pack", metadata={"help": "model pack folder (default offline_pack)"})
    episodes: int | None = field(
        default=None, metadata={"help": "evaluate the first N held-out episodes (default all)"}
    )
    steps: int = field(default=5, metadata={"help": "seconds ahead (default 5)"})
    observe: int = field(default=4, metadata={"help": "observed seconds before the rendered futures (default 4)"})
    render_episodes: int | None = field(
        default=None, metadata={"help": "render the futures of the first N evaluated episodes (default all)"}
    )
    four_tensor_seeds: tuple[str, ...] = field(
        default=(), metadata={"help": "more 4-tensor predictor folders (other training seeds) beside the pack's"}
    )
    flat_baseline_seeds: tuple[str, ...] = field(
        default=(), metadata={"help": "more flat baseline folders (other training seeds) beside the pack's"}
    )
    cache: Path | None = field(default=None, metadata={"help": "keep the predictors' forecasts here for a rerun"})
    strength: float = field(
        default=0.6, metadata={"help": "how far a render started from the last observed strip moves from it"}
    )
    seed: int = field(default=0, metadata={"help": "rendering seed (default 0)"})
    device: str | None = field(default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"})
    storyboard_episodes: int = field(default=4, metadata={"help": "episodes drawn in storyboard.png (default 4)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    progress: bool = field(default=True, metadata={"flag": False})  # progress bars (off in tests)

    def __post_init__(self) -> None:
        for name in ("episodes", "render_episodes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise EvaluationError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.steps < 1 or self.observe < 1 or self.storyboard_episodes < 0:
            raise EvaluationError(
                f"need --steps and --observe >= 1 and --storyboard-episodes >= 0; got {self.steps}, {self.observe}, "
                f"{self.storyboard_episodes}"
            )
        if not 0 < self.strength <= 1:
            raise EvaluationError(f"--strength must be in (0, 1], got {self.strength}")

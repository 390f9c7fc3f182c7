"""Writing the synthetic world to disk: seeded episodes as MP4 clips with their sentences and ceilings.

    python -m world_model.data.synthetic.generator generate --episodes N --seed S --out DIR [--split train|heldout]
                                                       [--scenes ball,box,...] [--seconds 14] [--fps 12] [--size 96]

Output of ``generate``: ``DIR/<split>/episode_00000.mp4`` (H.264, ``fps`` frames a second),
``DIR/<split>/episodes.jsonl`` (one record per episode, byte-identical for the same arguments) and
``DIR/<split>/summary.json`` (counts per scene type, sentence vocabulary, the one-step ceilings from the full state
and from the sentences alone, ``world_model.data.synthetic.ceilings``).
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from world_model.data.synthetic.ceilings import ceiling, sentence_ceiling
from world_model.data.synthetic.scenes import SCENE_TYPES
from world_model.data.synthetic.simulation import (
    DEFAULT_FPS,
    DEFAULT_SECONDS,
    DEFAULT_SIZE,
    MAX_EPISODES,
    MIN_SIZE,
    SPLITS,
    episode_seed,
    simulate,
)
from world_model.text.vocab import Vocabulary, tokenize
from world_model.utils.cli import check_output, check_range
from world_model.utils.files import replace_dir
from world_model.utils.flags import SettingsParser, add_verbose, settings_main
from world_model.utils.video import write_video


def _write_episodes(
    folder: Path, episodes: int, seed: int, split: str, scenes: Sequence[str], seconds: int, fps: int, size: int
) -> list[dict]:
    """Simulate episodes ``0..episodes-1`` of ``split``, write their clips and ``episodes.jsonl`` into
    ``folder`` and return their records."""
    records = []
    for i in range(episodes):
        episode = simulate(episode_seed(seed, i, split), scenes, seconds, fps)
        episode.id = f"{split}-{i:05d}"
        name = f"episode_{i:05d}.mp4"
        write_video(episode.frames(size), folder / name, fps=fps)
        records.append({**episode.record(), "video": name, "size": [size, size]})
    with open(folder / "episodes.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    return records


def _summary(
    records: list[dict], seed: int, split: str, scenes: Sequence[str], seconds: int, fps: int, size: int
) -> dict:
    """The split's summary.json: its arguments, episodes per scene type, sentence vocabulary and the one-step
    ceilings (from the full state, and from the sentences alone)."""
    counts = {k: 0 for k in scenes}
    for record in records:
        counts[record["scene"]] += 1
    sentences = [s["text"] for r in records for s in r["sentences"]]
    return {
        "split": split,
        "base_seed": seed,
        "episodes": len(records),
        "scene_types": list(scenes),
        "seconds": seconds,
        "fps": fps,
        "size": [size, size],
        "counts": counts,
        "episode_seeds": "2 * (base_seed * %d + index) + (0 train | 1 heldout)" % MAX_EPISODES,
        "vocabulary": Vocabulary.build(sentences).itos[2:],
        "distinct_sentences": len(set(sentences)),
        "max_tokens": max(len(tokenize(s)) for s in sentences),
        "ceiling": ceiling(records),
        "ceiling_from_sentences": sentence_ceiling(records, scenes),
    }


def generate(
    episodes: int,
    seed: int,
    out_dir: str | Path,
    split: str = "train",
    scenes: Sequence[str] = SCENE_TYPES,
    seconds: int = DEFAULT_SECONDS,
    fps: int = DEFAULT_FPS,
    size: int = DEFAULT_SIZE,
    overwrite: bool = False,
) -> dict:
    """Write ``episodes`` episodes of ``split`` to ``out_dir/<split>/`` (clips, episodes.jsonl,
    summary.json) and return the summary. The folder is built beside its destination and renamed
    into place when complete; an existing non-empty one is refused unless ``overwrite``."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    dest = Path(out_dir) / split
    empty_folder = dest.is_dir() and not any(dest.iterdir())  # nothing in it to lose
    check_output(dest, "--out", overwrite=overwrite or empty_folder)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{split}.partial-"))
    try:
        records = _write_episodes(staging, episodes, seed, split, scenes, seconds, fps, size)
        summary = _summary(records, seed, split, scenes, seconds, fps, size)
        (staging / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        replace_dir(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return summary


@dataclass
class GenerateSettings:
    """The `generate` command's settings: how many episodes of which scenes, and where they go."""

    episodes: int
    out: Path
    seed: int = 0
    split: str = field(default="train", metadata={"choices": SPLITS})
    scenes: str = field(default=",".join(SCENE_TYPES), metadata={"help": "comma-separated scene types"})
    seconds: int = DEFAULT_SECONDS
    fps: int = DEFAULT_FPS
    size: int = DEFAULT_SIZE
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_range("--episodes", self.episodes, 1, MAX_EPISODES)
        check_range("--seed", self.seed, 0)
        check_range("--seconds", self.seconds, 1, 600)
        check_range("--fps", self.fps, 1, 120)
        check_range("--size", self.size, MIN_SIZE, 1024)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status (2 on bad arguments)."""
    return settings_main(
        GenerateSettings,
        "world_model.data.synthetic.generator",
        __doc__.split("\n\n")[0],
        lambda settings, args, command: generate_command(settings),
        argv,
        arguments=add_subcommand,
    )


def add_subcommand(parser: SettingsParser) -> None:
    """The command's arguments beside its settings: the subcommand (generate) and --verbose."""
    parser.add_argument("command", choices=["generate"], help="generate: write clips, episodes.jsonl and summary.json")
    add_verbose(parser)


def generate_command(settings: GenerateSettings) -> None:
    """`generate`: write the episodes and print what was written."""
    summary = generate(
        settings.episodes,
        settings.seed,
        settings.out,
        settings.split,
        tuple(settings.scenes.split(",")),
        settings.seconds,
        settings.fps,
        settings.size,
        settings.overwrite,
    )
    full, said = summary["ceiling"], summary["ceiling_from_sentences"]
    per = ", ".join(f"{k} {v:.3f}/{said['per_scene'][k]:.3f}" for k, v in full["per_scene"].items())
    print(
        f"wrote {summary['episodes']} {settings.split} episodes to {settings.out / settings.split}: "
        f"{summary['counts']}; one-step ceiling from the full state / from the sentences "
        f"{full['overall']:.3f}/{said['overall']:.3f} ({per})"
    )


if __name__ == "__main__":
    sys.exit(main())

"""Fit the predictor to your own footage: a folder of clips (or captions made elsewhere) to a predictor folder
that the rollout, `predict` and the demo load like any other.

    python -m pipeline.fit CLIPS --out PREDICTOR [--captioner offline|hub|HUB_ID|DIR] [--interval S]
        [--val-fraction 0.2] [--seed 0] [--config YAML] [--max-epochs E] [--max-minutes M] [--resume] [--overwrite]

CLIPS is a folder of video files, captioned as the rollout captions a clip (`pipeline.fit_captions`; the captions
are kept in PREDICTOR/captions.jsonl, so a rerun never captions a clip twice), or a JSONL or CSV of (clip, time,
sentence) rows. Each clip becomes its sequence of states (repeated captions merged as the rollout merges them);
the clips are split into training and held-out ones by clip (`--val-fraction`, shuffled with `--seed`); the
4-tensor predictor is trained on the training clips (`world_model.training.train`, whose own validation is the last
tenth of them) with a config sized to the data (`--config` to give one); its best epoch is exported into PREDICTOR
and scored on the held-out clips against copy-last and Markov floors counted on the training clips
(`pipeline.fit_report`). PREDICTOR gets the predictor's files (config.json, model.safetensors, vocab.json,
known_sentences.txt), model_card.md, fit.json, captions.jsonl, data/ (the clips' states in the synthetic world's
layout) and run/ (the training run, which `--resume` continues).
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipeline.fit_captions import (
    CAPTIONS_FILE,
    Captioning,
    caption_clips,
    clip_source,
    read_caption_table,
)
from pipeline.fit_report import fit_report, markdown_table, warnings_of
from pipeline.presets import PROJECT_ROOT
from world_model.data.synthetic.episodes import read_episodes
from world_model.training.config import load_config
from world_model.utils.cli import UsageError, check_output, check_positive, check_range
from world_model.utils.files import claimed, repo_path, write_json_atomic, write_text_atomic
from world_model.utils.flags import SettingsParser, add_verbose, settings_main

BASE_CONFIG = PROJECT_ROOT / "configs" / "world_model" / "world.yaml"
FIT_MAX_STATES, FIT_MAX_TOKEN_SLOTS = 13, 32  # the default config's window and token slots at most
PREDICTOR_FILES = ("config.json", "model.safetensors", "vocab.json", "known_sentences.txt")
MADE = (*PREDICTOR_FILES, "model_card.md", "fit.json", "data", "run")  # what --overwrite replaces
SCENE = "clips"  # the scene name the held-out records carry (the world report's scoring groups by scene)


@dataclass
class FitSettings:
    """Which clips fit which predictor, how they are captioned and split, and how long training may take."""

    out: Path = field(metadata={"help": "predictor folder to write"})
    captioner: str = field(
        default="hub",
        metadata={"help": "offline or hub (the presets' captioners and sampling), or a hub id or folder (default hub)"},
    )
    interval: float = field(default=1.0, metadata={"help": "seconds between sampled states (default 1)"})
    val_fraction: float = field(default=0.2, metadata={"help": "share of the clips held out for the report"})
    seed: int = field(default=0, metadata={"help": "seed of the split and of training (default 0)"})
    config: Path | None = field(default=None, metadata={"help": "predictor config YAML (default: sized to the data)"})
    max_epochs: int | None = field(default=None, metadata={"help": "override the config's training.max_epochs"})
    max_minutes: float | None = field(default=None, metadata={"help": "stop training after this many minutes"})
    steps: int = field(default=3, metadata={"help": "states ahead the report scores (default 3)"})
    device: str | None = field(default=None, metadata={"help": "captioner device (default: cuda when available)"})
    resume: bool = field(default=False, metadata={"help": "continue a fit in --out (captions and training run)"})
    overwrite: bool = field(default=False, metadata={"help": "replace a fit in --out (its captions are reused)"})
    progress: bool = field(default=True, metadata={"help": "progress bars (--no-progress: none)"})

    def __post_init__(self) -> None:
        check_positive("--interval", self.interval)
        check_range("--val-fraction", self.val_fraction, 0.01, 0.9)
        check_range("--seed", self.seed, 0)
        check_range("--max-epochs", self.max_epochs, 1)
        check_positive("--max-minutes", self.max_minutes)
        check_range("--steps", self.steps, 1, 10)
        if self.resume and self.overwrite:
            raise ValueError("--resume and --overwrite exclude each other")


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        FitSettings,
        "pipeline.fit",
        __doc__.split("\n\n")[0],
        lambda settings, args, command: fit_command(args.clips, settings, command),
        argv,
        arguments=add_clips,
    )


def add_clips(parser: SettingsParser) -> None:
    """The command's arguments beside its settings: the clips and --verbose."""
    parser.add_argument("clips", type=Path, help="folder of clips, or a captions file (.jsonl or .csv)")
    add_verbose(parser)


def fit_command(clips: Path, settings: FitSettings, command: str) -> dict:
    """The command's work: check, caption, split, train, export, score, write the card; fit.json's record."""
    out = settings.out
    source = clip_source(clips)
    check_out(out, clips, settings.resume, settings.overwrite)
    with claimed(out):
        if settings.overwrite:
            for name in MADE:
                target = out / name
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        captioning = None
        if source == "folder":
            captioning = Captioning.named(settings.captioner, settings.interval)
            captioned = caption_clips(clips, captioning, out / CAPTIONS_FILE, settings.device, settings.progress)
        else:
            captioned = read_caption_table(clips)
        merge = captioning.merge_repeats if captioning else True
        sequences = {c.clip: c.states(merge) for c in captioned}
        short = sorted(name for name, states in sequences.items() if len(states) < 2)
        sequences = {name: states for name, states in sequences.items() if len(states) >= 2}
        train_clips, heldout_clips = split_clips(sorted(sequences), settings.val_fraction, settings.seed)
        write_split(out / "data" / "train", train_clips, sequences)
        write_split(out / "data" / "heldout", heldout_clips, sequences)
        config = load_config(settings.config) if settings.config else default_config(list(sequences.values()))
        summary = train_predictor(config, out, settings)
        for name in PREDICTOR_FILES:
            shutil.copy2(out / "run" / "best" / name, out / name)
        records = {split: read_episodes(out / "data" / split) for split in ("train", "heldout")}
        report = fit_report(out, records["train"], records["heldout"], settings.steps)
        frames = sum(len(c.captions) for c in captioned)
        flagged = sum(c.flagged for c in captioned)
        notes = warnings_of(report, flagged, frames, captioning.key()["captioner"] if captioning else "the captioner")
        if short:
            notes.append(f"{len(short)} clip(s) with fewer than 2 states left out: {', '.join(short[:5])}")
        record = {
            "command": command,
            "clips": repo_path(clips),
            "captioning": None if captioning is None else {**captioning.key(), "merge_repeats": merge},
            "splits": {"train": train_clips, "heldout": heldout_clips},
            "states": {"train": states_of(train_clips, sequences), "heldout": states_of(heldout_clips, sequences)},
            "frames": frames,
            "flagged_frames": flagged,
            "model": config["model"],
            "training": {k: summary.get(k) for k in ("best_epoch", "last_epoch", "stop_reason", "best_metrics")},
            "report": report,
            "warnings": notes,
        }
        write_json_atomic(out / "fit.json", record)
        write_text_atomic(out / "model_card.md", model_card(record))
    print("\n".join(summary_lines(record, out)))
    return record


def check_out(out: Path, clips: Path, resume: bool, overwrite: bool) -> None:
    """A UsageError unless `out` can be written (`check_output`: not the `clips` folder or inside it, not a link to
    nothing) and is new, empty, or a fit that --resume continues or --overwrite replaces."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    check_output(out, "--out", {"clips": clips}, overwrite=True)  # what it may hold is the rule below
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not (resume or overwrite):
        raise UsageError(
            f"--out {out} is not empty ({', '.join(held[:5])}); pass --resume, --overwrite or another --out"
        )
    if resume and held and not (out / CAPTIONS_FILE).exists() and not (out / "run").exists():
        raise UsageError(f"--out {out} holds no fit to resume ({', '.join(held[:5])})")


def split_clips(names: list[str], val_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(training clips, held-out clips), by clip: `names` shuffled with `seed`, the first `val_fraction` of them
    (at least one) held out; at least two stay for training (the trainer carves its validation out of them)."""
    if len(names) < 3:
        raise UsageError(f"need at least 3 clips with 2 or more states each to fit and report, got {len(names)}")
    order = sorted(names)
    random.Random(seed).shuffle(order)
    held = min(max(1, round(val_fraction * len(order))), len(order) - 2)
    return sorted(order[held:]), sorted(order[:held])


def write_split(folder: Path, clips: list[str], sequences: dict[str, list[str]]) -> None:
    """The clips' states as a synthetic-world split (episodes.jsonl: one record per clip, a state a "second")."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "id": clip,
                "video": clip,
                "scene": SCENE,
                "sentences": [{"second": i, "text": s} for i, s in enumerate(sequences[clip])],
            }
        )
        for clip in clips
    ]
    write_text_atomic(folder / "episodes.jsonl", "\n".join(lines) + "\n")


def default_config(sequences: list[list[str]]) -> dict:
    """The synthetic world's config (`configs/world_model/world.yaml`) with a window as long as the longest clip
    allows (at most `FIT_MAX_STATES`) and token slots for the longest state sentence (at most `FIT_MAX_TOKEN_SLOTS`)."""
    from world_model.text.vocab import tokenize

    config = load_config(BASE_CONFIG)
    longest = max(len(states) for states in sequences)
    tokens = max(len(tokenize(sentence)) for states in sequences for sentence in states)
    config["model"]["n_states"] = min(FIT_MAX_STATES, max(2, longest - 1))
    config["model"]["n_tokens"] = min(FIT_MAX_TOKEN_SLOTS, max(4, tokens))
    return config


def train_predictor(config: dict, out: Path, settings: FitSettings) -> dict:
    """Train (or continue) the run in OUT/run on OUT/data; its summary."""
    from world_model.training.train import train

    resume = settings.resume and (out / "run").exists()
    return train(
        config,
        out / "data",
        out / "run",
        resume=resume,
        max_epochs=settings.max_epochs,
        max_minutes=settings.max_minutes,
        seed=settings.seed,
        progress=settings.progress,
    )


def states_of(clips: list[str], sequences: dict[str, list[str]]) -> int:
    return sum(len(sequences[clip]) for clip in clips)


def model_card(record: dict) -> str:
    """PREDICTOR/model_card.md: what the predictor was fitted on, how, and how well it forecasts held-out clips."""
    m, t, report = record["model"], record["training"], record["report"]
    captioning = record["captioning"]
    made = (
        f"captioned by {captioning['captioner']} every {captioning['interval']:g} s "
        f"({captioning['frames_per_state']} frame(s) a state; repeated captions merged: {captioning['merge_repeats']})"
        if captioning
        else "captions given as a table"
    )
    metrics = t.get("best_metrics") or {}
    lines = [
        "# 4-tensor predictor fitted to your clips",
        "",
        f"Clips: `{record['clips']}`, {made}. {len(record['splits']['train'])} training clips "
        f"({record['states']['train']} states), {len(record['splits']['heldout'])} held-out clips "
        f"({record['states']['heldout']} states), split by clip.",
        "",
        f"Model: d_x {m['d_x']}, d_t {m['d_t']}, {m['n_heads']} heads, {m['n_layers']} layers, a window of "
        f"{m['n_states']} states of {m['n_tokens']} tokens. Best epoch {t.get('best_epoch')} of "
        f"{t.get('last_epoch')} ({t.get('stop_reason')}); validation L_S {metrics.get('val_last_ce', float('nan')):.4f}.",
        "",
        f"Held-out forecasts ({report['points']} predictions over {report['heldout_clips_scored']} clips; accuracy "
        "[95% interval over clips], log-loss over the known sentences):",
        "",
        *markdown_table(report),
        "",
    ]
    lines += [f"- warning: {w}" for w in record["warnings"]]
    lines += ["", f"Command: `{record['command']}`", ""]
    return "\n".join(lines)


def summary_lines(record: dict, out: Path) -> list[str]:
    return [
        f"fitted {out}: {len(record['splits']['train'])} training clips, {len(record['splits']['heldout'])} held out",
        *markdown_table(record["report"]),
        *[f"warning: {w}" for w in record["warnings"]],
        f"use it: python -m pipeline.rollout CLIP --predictor {out}",
    ]


if __name__ == "__main__":
    sys.exit(main())

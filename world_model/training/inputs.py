"""What a training run starts from: the command's settings (`TrainSettings`, whose fields are the flags of
`python -m world_model.training.train`), the config with the command line's overrides, and the data's windows."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from world_model.data.synthetic.episodes import data_kind, known_sentences
from world_model.models.precision import PRECISIONS
from world_model.text.vocab import Vocabulary
from world_model.training.batches import load_training_windows
from world_model.training.checkpoints import TrainingError
from world_model.training.config import load_config, validate_config


@dataclass
class TrainSettings:
    """A training command: the config, the data and output folders, and the overrides of the config."""

    config: Path = field(metadata={"help": "YAML config (configs/world_model/*.yaml)"})
    data: Path = field(
        metadata={
            "help": "folder with ROCStories*.csv and cloze_test_*.csv, or a synthetic world's folder holding "
            "train/episodes.jsonl"
        }
    )
    out: Path = field(metadata={"help": "output folder (must not hold a run unless --resume)"})
    resume: bool = field(default=False, metadata={"help": "continue the run in --out from its last completed epoch"})
    max_epochs: int | None = field(default=None, metadata={"help": "override training.max_epochs"})
    max_minutes: float | None = field(
        default=None, metadata={"help": "stop after the epoch in which this many minutes have passed"}
    )
    train_subset: int | None = field(
        default=None, metadata={"help": "train on the first K training stories (or episodes) only"}
    )
    seed: int | None = field(default=None, metadata={"help": "override training.seed"})
    precision: str | None = field(
        default=None,
        metadata={"choices": PRECISIONS, "help": "override training.precision (bf16: mixed precision, fp32 weights)"},
    )
    progress: bool = field(default=True, metadata={"help": "a progress bar (--no-progress: none)"})


@dataclass
class TrainingData:
    """The windows of a data folder: training (S, T+1, N) and validation (V, T+1, N), their vocabulary, the
    corpus statistics, and the known sentences of a synthetic world (None for ROCStories)."""

    vocab: Vocabulary
    stats: dict
    train_windows: torch.Tensor
    val_windows: torch.Tensor
    known: list[str] | None

    @classmethod
    def load(cls, data_dir: Path, model_section: dict, train_subset: int | None, holdout: int = 0) -> TrainingData:
        vocab, stats, train_windows, val_windows = load_training_windows(
            data_dir, model_section.get("n_states", 4), model_section.get("n_tokens", 16), train_subset, holdout
        )
        known = known_sentences(data_dir) if data_kind(data_dir) == "world" else None  # a closed world's sentences
        return cls(vocab, stats, train_windows, val_windows, known)


def resolved_config(
    config: dict | str | os.PathLike, max_epochs: int | None, seed: int | None, precision: str | None
) -> dict:
    """The normalised config of a dict or a YAML path, with the command line's overrides of its training section."""
    config = load_config(config) if isinstance(config, (str, os.PathLike)) else validate_config(config)
    overrides = {"max_epochs": max_epochs, "seed": seed, "precision": precision}
    config["training"].update({k: v for k, v in overrides.items() if v is not None})
    return validate_config(config, source="config with command-line overrides")


def check_budgets(train_subset: int | None, max_minutes: float | None) -> None:
    """A TrainingError for a --train-subset that is not a positive integer or a --max-minutes not a positive number."""
    if train_subset is not None and (
        isinstance(train_subset, bool) or not isinstance(train_subset, int) or train_subset < 1
    ):
        raise TrainingError(f"--train-subset must be a positive number of stories or episodes, got {train_subset!r}")
    if max_minutes is not None and not (
        isinstance(max_minutes, (int, float)) and max_minutes > 0 and math.isfinite(max_minutes)
    ):
        raise TrainingError(f"--max-minutes must be a positive number of minutes, got {max_minutes!r}")

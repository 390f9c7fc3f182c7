"""Training configuration files: YAML with a ``model:`` and a ``training:`` section.

    model:    {type, and the fields of the type's config class except vocab_size / padding_idx}
    training: the fields of TrainingConfig {lr, weight_decay, batch_size, max_epochs, patience, tolerance, seed,
              eval_batch_size, precision, lr_schedule, warmup_steps, schedule_epochs, final_lr_fraction,
              holdout_stories, target_sentences, adam_eps, label_smoothing, label_smoothing_prior}

``validate_config`` (``load_config`` for a file) checks every key, type and range of both sections against their
dataclasses and returns the normalised config dict with every default filled in, so two files that mean the same
run compare equal.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from world_model.models.registry import DATA_FIELDS, DEFAULT_MODEL_TYPE, MODEL_TYPES

SECTIONS = ("model", "training")
SMOOTHING_PRIORS = ("uniform", "counts", "counts_copy")  # training.label_smoothing_prior


class ConfigError(ValueError):
    """A configuration file or dict is malformed: unknown keys, wrong types or out-of-range values."""


def _coerce(value: Any, kind: type, where: str) -> Any:
    """`value` as `kind`, accepting an int for a float and a numeric string for a float (PyYAML reads 3e-4 as a string)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"{where} must be {kind.__name__}, got {type(value).__name__} {value!r}")


@dataclasses.dataclass
class TrainingConfig:
    """The ``training:`` section. AdamW (lr, weight_decay), batches, and the stopping rule of section 8.2 (stop once
    `patience` epochs have passed since the minimum validation loss and the loss is above `tolerance` times it, or
    after `max_epochs`); defaults are the paper's section 8.2 values. Not in section 8.2 (their defaults keep the
    paper's setting): bf16 mixed `precision` and a learning-rate schedule ("warmup_cosine": linear warm-up over
    `warmup_steps`, times a cosine from lr down to `final_lr_fraction` * lr over `schedule_epochs` epochs, 0 meaning
    max_epochs; the rate stays at its floor afterwards; see world_model.training.schedule), and `holdout_stories`:
    K > 0 validates on the last K training stories instead of the cloze stories and trains on the others, so that
    settings can be chosen without looking at the validation split (`world_model.benchmark.sweep`), and
    `target_sentences` (flat baseline only): "last" (section 7.4: a loss on S(T) alone) or "all", which trains on
    every sentence S(1..T) of a window, each written free-running behind the sentences before it
    (`world_model.training.batches.prefix_windows`), so the baseline gets a loss on the same target sentences as the
    4-tensor model; validation and the reported scores stay on S(T). `adam_eps` is AdamW's epsilon, the floor under
    the root-mean-square gradient that scales each update (default torch's 1e-8). `label_smoothing` e (default
    0: the paper's loss; not with the 4-tensor copy path) trains against (1 - e) gold + e uniform over the
    vocabulary, so that words the loss never asks for keep some mass; validation and the reported scores stay the
    plain cross-entropy. `label_smoothing_prior` "counts" smooths towards what counting predicts instead of
    uniform (the prior variant of Pereyra et al. 2017): the target is (1 - e) gold + e q, q the position unigram of
    the run's training windows at the token's slot, and for the flat baseline, which writes [EOS], with the chance
    that a sentence ends there (`world_model.evaluation.floors.count_prior`). "counts_copy" (flat baseline only)
    smooths towards the position-unigram + copy floor instead: the copy floor's weight w of every content step
    goes to the tokens of the window's context S(0..T-1) (`world_model.evaluation.floors.count_copy_prior`)."""

    lr: float = 3e-4
    weight_decay: float = 0.01
    batch_size: int = 32
    max_epochs: int = 100
    patience: int = 5
    tolerance: float = 1.01
    seed: int = 0
    eval_batch_size: int = 64
    precision: str = "fp32"
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    schedule_epochs: int = 0
    final_lr_fraction: float = 0.1
    holdout_stories: int = (
        0  # 0: validate on the cloze stories; K: on the last K training stories (trained on the rest)
    )
    target_sentences: str = "last"  # "last": S(T) only (section 7.4); "all": S(1..T), flat baseline only
    adam_eps: float = 1e-8  # AdamW's epsilon (torch's default)
    label_smoothing: float = 0.0  # 0: the paper's cross-entropy; e in (0, 1): (1 - e) gold + e uniform (or prior)
    label_smoothing_prior: str = "uniform"  # what e's share of the target is: "uniform", "counts" or "counts_copy"

    def __post_init__(self) -> None:
        """Coerce every field to its type (an int or a numeric string is a float) and check its range: a ConfigError
        naming the key and what it allows otherwise."""
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            setattr(self, f.name, _coerce(getattr(self, f.name), hints[f.name], f"training.{f.name}"))
        allowed = {  # name -> (holds, what the check wants)
            "lr": (self.lr > 0, "> 0"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "batch_size": (self.batch_size >= 1, ">= 1"),
            "max_epochs": (self.max_epochs >= 1, ">= 1"),
            "patience": (self.patience >= 0, ">= 0"),
            "tolerance": (self.tolerance >= 1.0, ">= 1.0"),
            "seed": (self.seed >= 0, ">= 0"),
            "eval_batch_size": (self.eval_batch_size >= 1, ">= 1"),
            "precision": (self.precision in ("fp32", "bf16"), "'fp32' or 'bf16'"),
            "lr_schedule": (self.lr_schedule in ("constant", "warmup_cosine"), "'constant' or 'warmup_cosine'"),
            "warmup_steps": (self.warmup_steps >= 0, ">= 0"),
            "schedule_epochs": (self.schedule_epochs >= 0, ">= 0 (0: max_epochs)"),
            "final_lr_fraction": (0 <= self.final_lr_fraction <= 1, "in [0, 1]"),
            "holdout_stories": (self.holdout_stories >= 0, ">= 0 (0: validate on the cloze stories)"),
            "target_sentences": (self.target_sentences in ("last", "all"), "'last' or 'all'"),
            "adam_eps": (self.adam_eps > 0, "> 0"),
            "label_smoothing": (0 <= self.label_smoothing < 1, "in [0, 1)"),
            "label_smoothing_prior": (
                self.label_smoothing_prior in SMOOTHING_PRIORS,
                "one of " + ", ".join(repr(p) for p in SMOOTHING_PRIORS),
            ),
        }
        for name, (holds, wants) in allowed.items():
            if not holds:
                raise ConfigError(f"training.{name} must be {wants}, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, data: dict) -> TrainingConfig:
        """The config of a ``training:`` mapping; a ConfigError for a key that is not a field."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in data if k not in names]
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} in 'training'; allowed: {names}")
        return cls(**data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _model_fields(model_type: str) -> dict[str, tuple[type, Any]]:
    """Settable fields of a model type's config dataclass: name -> (type, default)."""
    config_class, _ = MODEL_TYPES[model_type]
    hints = typing.get_type_hints(config_class)
    out = {}
    for f in dataclasses.fields(config_class):
        if f.name in DATA_FIELDS:
            continue
        kind = hints.get(f.name)
        default = f.default if f.default is not dataclasses.MISSING else None
        out[f.name] = (kind if kind in (int, float, str, bool) else object, default)
    return out


def _section(config: dict, name: str, source: str) -> dict:
    """The mapping of section `name` ({} when absent); a ConfigError when it is not a mapping."""
    section = config.get(name) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: '{name}' must be a mapping, got {type(section).__name__}")
    return section


# The largest model sizes a config may ask for (the paper's largest preset is d_x 64, d_t 32, L 3, N 16, T 4): a
# typo such as d_x 100000 is refused at once instead of running out of memory.
MODEL_LIMITS = {"d_x": 1024, "d_t": 1024, "n_heads": 256, "n_layers": 64, "n_tokens": 256, "n_states": 256}
MAX_WIDTH = 16384  # d_x * d_t


def _validate_model(model: dict, source: str) -> dict:
    """The normalised ``model:`` section: its type, and every field of the type's config class (defaults filled in,
    values coerced), checked by the config class itself (d_x >= 1, dropout in [0, 1], ...)."""
    model_type = model.get("type", DEFAULT_MODEL_TYPE)
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{source}: model.type {model_type!r} is not one of {sorted(MODEL_TYPES)}")
    fields = _model_fields(model_type)
    unknown = [k for k in model if k != "type" and k not in fields]
    if unknown:
        data = [k for k in unknown if k in DATA_FIELDS]
        hint = f" ({data} come from the vocabulary)" if data else ""
        raise ConfigError(
            f"{source}: unknown key(s) {unknown} in 'model' for type {model_type!r}{hint}; allowed: {['type', *fields]}"
        )
    out = {"type": model_type}
    for name, (kind, default) in fields.items():
        out[name] = _coerce(model[name], kind, f"{source}: model.{name}") if name in model else default
    for name, limit in MODEL_LIMITS.items():  # before anything is allocated at that size
        if isinstance(out.get(name), int) and out[name] > limit:
            raise ConfigError(f"{source}: model.{name} {out[name]:,} is above {limit:,}, the most this trainer builds")
    if isinstance(out.get("d_x"), int) and isinstance(out.get("d_t"), int) and out["d_x"] * out["d_t"] > MAX_WIDTH:
        raise ConfigError(f"{source}: model width d_x * d_t = {out['d_x'] * out['d_t']:,} is above {MAX_WIDTH:,}")
    config_class, _ = MODEL_TYPES[model_type]
    try:
        config_class.from_vocabulary(2, **{k: v for k, v in out.items() if k != "type"})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: bad model section: {err}") from err
    return out


def validate_config(config: Any, source: str = "config") -> dict:
    """Check a config dict and return a normalised deep copy with every default filled in: {"model": {"type", the
    model config's fields}, "training": TrainingConfig's fields}."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping with sections {list(SECTIONS)}, got {type(config).__name__}")
    unknown = [k for k in config if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; allowed: {list(SECTIONS)}")
    model = _validate_model(_section(config, "model", source), source)
    try:
        training = TrainingConfig.from_dict(_section(config, "training", source)).to_dict()
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    if training["target_sentences"] == "all" and model["type"] != "baseline":
        raise ConfigError(
            f"{source}: training.target_sentences 'all' is for the flat baseline; a {model['type']!r} model already "
            "receives a loss on every target sentence of a window"
        )
    if training["label_smoothing"] > 0 and model.get("copy_path"):
        raise ConfigError(
            f"{source}: training.label_smoothing is not defined for the copy path's mixture (model.copy_path)"
        )
    if training["label_smoothing_prior"] == "counts_copy" and model["type"] != "baseline":
        raise ConfigError(
            f"{source}: training.label_smoothing_prior 'counts_copy' is for the flat baseline; a {model['type']!r} "
            "model's targets S(1..T-1) are in its input, so copying the input would be copying the answer"
        )
    if training["label_smoothing_prior"] != "uniform" and training["label_smoothing"] == 0:
        raise ConfigError(
            f"{source}: training.label_smoothing_prior {training['label_smoothing_prior']!r} needs "
            "training.label_smoothing > 0 (it is the target of that share of the loss)"
        )
    return copy.deepcopy({"model": model, "training": training})


def load_config(path: str | os.PathLike) -> dict:
    """Read and validate a YAML config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from err
    if data is None:  # an empty file (or only comments) would silently be every default, 100 epochs included
        raise ConfigError(
            f"{path}: the config file is empty; give its model and training sections (configs/world_model/)"
        )
    return validate_config(data, source=str(path))

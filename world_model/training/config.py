"""Training configuration files: YAML with a ``model:`` and a ``training:`` section.

    model:    {type, and the fields of the type's config class except vocab_size / padding_idx}
    training: {lr, weight_decay, batch_size, max_epochs, patience, tolerance, seed, eval_batch_size,
               precision, lr_schedule, warmup_steps, schedule_epochs, final_lr_fraction}

``validate_config`` checks every key and type and returns the normalised config with every default
filled in, so two files that mean the same run compare equal.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from world_model.models.registry import DATA_FIELDS, DEFAULT_MODEL_TYPE, MODEL_TYPES

SECTIONS = ("model", "training")
# name -> (type, default, check, what the check wants); defaults are the paper's section 8.2 values.
TRAINING_FIELDS: dict[str, tuple[type, Any, Any, str]] = {
    "lr": (float, 3e-4, lambda v: v > 0, "> 0"),
    "weight_decay": (float, 0.01, lambda v: v >= 0, ">= 0"),
    "batch_size": (int, 32, lambda v: v >= 1, ">= 1"),
    "max_epochs": (int, 100, lambda v: v >= 1, ">= 1"),
    "patience": (int, 5, lambda v: v >= 0, ">= 0"),
    "tolerance": (float, 1.01, lambda v: v >= 1.0, ">= 1.0"),
    "seed": (int, 0, lambda v: v >= 0, ">= 0"),
    "eval_batch_size": (int, 64, lambda v: v >= 1, ">= 1"),
    # Not in section 8.2 (their defaults keep the paper's setting): bf16 mixed precision and a learning-rate
    # schedule (linear warm-up over warmup_steps, then a cosine from lr down to final_lr_fraction * lr over
    # schedule_epochs epochs, 0 meaning max_epochs; the rate stays at its floor afterwards).
    "precision": (str, "fp32", lambda v: v in ("fp32", "bf16"), "'fp32' or 'bf16'"),
    "lr_schedule": (str, "constant", lambda v: v in ("constant", "warmup_cosine"), "'constant' or 'warmup_cosine'"),
    "warmup_steps": (int, 0, lambda v: v >= 0, ">= 0"),
    "schedule_epochs": (int, 0, lambda v: v >= 0, ">= 0 (0: max_epochs)"),
    "final_lr_fraction": (float, 0.1, lambda v: 0 <= v <= 1, "in [0, 1]"),
}


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


def validate_config(config: Any, source: str = "config") -> dict:
    """Check a config dict and return a normalised deep copy with every default filled in."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a mapping with sections {list(SECTIONS)}, got {type(config).__name__}")
    unknown = [k for k in config if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; allowed: {list(SECTIONS)}")
    out: dict[str, dict] = {}

    model = config.get("model") or {}
    if not isinstance(model, dict):
        raise ConfigError(f"{source}: 'model' must be a mapping, got {type(model).__name__}")
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
    out["model"] = {"type": model_type}
    for name, (kind, default) in fields.items():
        out["model"][name] = _coerce(model[name], kind, f"{source}: model.{name}") if name in model else default

    training = config.get("training") or {}
    if not isinstance(training, dict):
        raise ConfigError(f"{source}: 'training' must be a mapping, got {type(training).__name__}")
    unknown = [k for k in training if k not in TRAINING_FIELDS]
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown} in 'training'; allowed: {list(TRAINING_FIELDS)}")
    out["training"] = {}
    for name, (kind, default, check, wants) in TRAINING_FIELDS.items():
        value = _coerce(training[name], kind, f"{source}: training.{name}") if name in training else default
        if not check(value):
            raise ConfigError(f"{source}: training.{name} must be {wants}, got {value!r}")
        out["training"][name] = value

    # Let the config class check its own ranges (d_x >= 1, dropout in [0, 1], ...) before any data is read.
    config_class, _ = MODEL_TYPES[model_type]
    try:
        config_class.from_vocabulary(2, **{k: v for k, v in out["model"].items() if k != "type"})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: bad model section: {err}") from err
    return copy.deepcopy(out)


def load_config(path: str | os.PathLike) -> dict:
    """Read and validate a YAML config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from err
    return validate_config(data if data is not None else {}, source=str(path))


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One command-line flag per field of the dataclass `cls` (field batch_size -> --batch-size), defaulting to the
    field's default: a bool becomes --x / --no-x, a tuple of ints takes one or more ints, and int, float, str or
    an optional int take one value. Fields named in `skip` get no flag."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        flag, kind = "--" + field.name.replace("_", "-"), hints[field.name]
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(flag, type=int, nargs="+", default=list(field.default))
        else:
            options = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]  # int | None -> int
            parser.add_argument(flag, type=options[0], default=field.default)


def dataclass_from_args(cls: type, args: argparse.Namespace, skip: tuple[str, ...] = ()):
    """An instance of the dataclass `cls` from the flags `add_dataclass_flags` added (tuples back as tuples); the
    fields in `skip` keep their defaults."""
    hints = typing.get_type_hints(cls)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip}
    return cls(**{k: tuple(v) if typing.get_origin(hints[k]) is tuple else v for k, v in values.items()})

"""Benchmark presets: reading and checking one, the run arguments checked against it, and the train() config of a run.

A preset (configs/benchmark/<name>.yaml, or the path of such a YAML file) names the (H, L) pairs and the settings
both models share: d_x, d_t, dropout, N, T, the optimizer, the batch, the seed, the stopping rule, and the budget
(training subset, epoch cap, minutes); optionally variants, seeds and the pairs run by default. load_preset returns
it checked as the spec

    {"name", "path", "pairs": {name: {"n_heads", "n_layers"}}, "model", "training",
     "budget": {"train_subset", "max_minutes"},
     "variants": {name: {"type", "pair", "model", "training", "versus", "seeds"}},
     "seeds": [int] | None, "reference_seeds": [int] | None, "default_pairs": [pair] | None, "reuse_runs": str | None}

Seeds. `seeds:` lists the seeds of every row (one run per seed, folders named ..._s<seed>); a row may have its own:
`reference_seeds:` for the pairs' own runs (the 4-tensor model and the baseline, every variant's reference) and
`seeds:` inside a variant, e.g. three seeds for the references and one row, seed 0 for the others. Both need the
preset's `seeds:` (so that every run folder carries its seed). `--seeds` replaces every row's list.

Reuse. `reuse_runs:` names a folder of finished run folders (e.g. results/benchmark/cpu/runs; relative paths are
taken from the repository root) whose runs this preset's runs may take over when their settings are identical
(world_model/benchmark/reuse.py).

The spec stays a plain mapping, not a dataclass like the model, training and pipeline settings: it is stored
verbatim in results.json ("preset") and read back from there by `--report-only` and by the report writers, so
the object in memory and the one on disk are the same thing; its "training" and "model" sections are checked by
the training's own dataclasses (`validate_config`) for every run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import yaml

from world_model.training.config import validate_config
from world_model.utils.files import repo_path

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "benchmark"
MODELS = ("four_tensor", "baseline")  # run order within a pair
MODEL_LABELS = {"four_tensor": "4-tensor", "baseline": "baseline"}
PRESET_SECTIONS = (
    "pairs",
    "model",
    "training",
    "budget",
    "variants",
    "seeds",
    "reference_seeds",
    "default_pairs",
    "reuse_runs",
)
VARIANT_FIELDS = ("type", "pair", "model", "training", "versus", "seeds")
BUDGET_FIELDS = ("train_subset", "max_minutes")
PAIR_FIELDS = ("n_heads", "n_layers")
SHARED_MODEL_KEYS = ("d_x", "d_t", "n_heads", "n_layers", "n_tokens", "n_states", "dropout")
VARIANT_TRAINING_KEYS = ("label_smoothing", "label_smoothing_prior", "target_sentences")  # the loss, not the optimiser


def row_label(row: dict) -> str:
    """A row's name in the reports: "h4_l2 4-tensor", "h4_l2 4-tensor causal" ..."""
    return f"{row['pair']} {MODEL_LABELS[row['model_type']]}" + (f" {row['variant']}" if row.get("variant") else "")


def seed_suffix(record: dict) -> str:
    """ " (seed 2)" for a run or pair record of a multi-seed benchmark, "" for one without a seed."""
    return f" (seed {record['seed']})" if record.get("seed") is not None else ""


class BenchmarkError(ValueError):
    """A benchmark that must not start: unknown preset or pair, bad budget, an output folder in use."""


def is_count(value: Any, least: int = 1) -> bool:
    """An int (not a bool) >= `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


# ----- reading a preset -----
def resolve_preset(preset: str | os.PathLike) -> Path:
    """configs/benchmark/<name>.yaml for a bare name, else the path itself; BenchmarkError if it is neither."""
    text = str(preset)
    known = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or os.sep in text or path.is_file():
        if not path.is_file():
            raise BenchmarkError(f"preset file {path} not found (named presets: {known})")
        return path
    named = PRESET_DIR / f"{text}.yaml"
    if not named.is_file():
        raise BenchmarkError(f"unknown preset {text!r}; named presets: {known}, or the path of a preset YAML file")
    return named


def read_sections(path: Path) -> dict:
    """The preset file's YAML mapping, with only known sections."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise BenchmarkError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise BenchmarkError(f"{path}: a preset is a mapping with sections {list(PRESET_SECTIONS)}")
    unknown = [k for k in data if k not in PRESET_SECTIONS]
    if unknown:
        raise BenchmarkError(f"{path}: unknown section(s) {unknown}; allowed: {list(PRESET_SECTIONS)}")
    return data


def check_pairs(pairs: Any, path: Path) -> None:
    if not isinstance(pairs, dict) or not pairs:
        raise BenchmarkError(f"{path}: 'pairs' must map pair names to {{n_heads, n_layers}}")
    for name, pair in pairs.items():
        if (
            not isinstance(pair, dict)
            or sorted(pair) != sorted(PAIR_FIELDS)
            or not all(is_count(pair[k]) for k in PAIR_FIELDS)
        ):
            raise BenchmarkError(
                f"{path}: pair {name!r} must be {{n_heads: int >= 1, n_layers: int >= 1}}, got {pair!r}"
            )


def check_settings(model: Any, training: Any, budget: Any, path: Path) -> None:
    """The 'model', 'training' and 'budget' sections (each may be absent)."""
    if not isinstance(model, dict):
        raise BenchmarkError(f"{path}: 'model' must be a mapping")
    fixed = [k for k in ("type", *PAIR_FIELDS) if k in model]
    if fixed:
        raise BenchmarkError(f"{path}: 'model' must not set {fixed}: the type is set per run and heads/layers per pair")
    if not isinstance(training, dict):
        raise BenchmarkError(f"{path}: 'training' must be a mapping")
    if not isinstance(budget, dict) or any(k not in BUDGET_FIELDS for k in budget):
        raise BenchmarkError(f"{path}: 'budget' may only set {list(BUDGET_FIELDS)}")


def is_seed_list(seeds: Any) -> bool:
    """A non-empty list of distinct integers >= 0."""
    return (
        isinstance(seeds, list)
        and bool(seeds)
        and len(set(seeds)) == len(seeds)
        and all(is_count(x, least=0) for x in seeds)
    )


def check_seeds_and_defaults(data: dict, pairs: dict, path: Path) -> None:
    """The optional 'seeds', 'reference_seeds', 'default_pairs' and 'reuse_runs' sections."""
    seeds, default_pairs = data.get("seeds"), data.get("default_pairs")
    if seeds is not None and not is_seed_list(seeds):
        raise BenchmarkError(f"{path}: 'seeds' must be a list of distinct integers >= 0, got {seeds!r}")
    check_row_seeds(data.get("reference_seeds"), seeds, f"{path}: 'reference_seeds'")
    reuse = data.get("reuse_runs")
    if reuse is not None and (not isinstance(reuse, str) or not reuse.strip()):
        raise BenchmarkError(f"{path}: 'reuse_runs' must be the path of a folder of run folders, got {reuse!r}")
    if default_pairs is not None and (
        not isinstance(default_pairs, list) or not default_pairs or any(p not in pairs for p in default_pairs)
    ):
        raise BenchmarkError(
            f"{path}: 'default_pairs' must list pairs of the preset ({', '.join(map(str, pairs))}), "
            f"got {default_pairs!r}"
        )


def check_row_seeds(row_seeds: Any, seeds: Any, where: str) -> None:
    """A row's own seed list ('reference_seeds', a variant's 'seeds'): distinct integers >= 0, in a preset with
    'seeds:'."""
    if row_seeds is None:
        return
    if not is_seed_list(row_seeds):
        raise BenchmarkError(f"{where} must be a list of distinct integers >= 0, got {row_seeds!r}")
    if seeds is None:
        raise BenchmarkError(
            f"{where} needs the preset's 'seeds:' section (the seeds of every other row), so that every run folder "
            "is named by its seed"
        )


def load_preset(preset: str | os.PathLike) -> dict:
    """Read and check a preset: the spec of the module docstring."""
    path = resolve_preset(preset)
    data = read_sections(path)
    pairs = data.get("pairs")
    check_pairs(pairs, path)
    model, training, budget = data.get("model") or {}, data.get("training") or {}, data.get("budget") or {}
    check_settings(model, training, budget, path)
    check_seeds_and_defaults(data, pairs, path)
    seeds = data.get("seeds")
    spec = {
        "name": path.stem,
        "path": repo_path(path),
        "pairs": {str(k): dict(v) for k, v in pairs.items()},
        "model": dict(model),
        "training": dict(training),
        "budget": {k: budget.get(k) for k in BUDGET_FIELDS},
        "variants": check_variants(data.get("variants") or {}, pairs, seeds, path),
        "seeds": seeds,
        "reference_seeds": data.get("reference_seeds"),
        "default_pairs": data.get("default_pairs"),
        "reuse_runs": data.get("reuse_runs"),
    }
    for name, variant in spec["variants"].items():
        run_config(
            spec, variant["pair"], variant["type"], variant=name
        )  # a bad override is an error here, before any data
    return spec


def check_variant(name: Any, v: Any, pairs: dict, seeds: list[int] | None, path: Path) -> dict:
    """One entry of the `variants:` section, checked: {"type", "pair", "model": overrides, "training": overrides,
    "versus": rows, "seeds": its own seeds or None (the preset's)}.

    A variant changes its model or its training loss, never what it shares with its reference run: the model's
    widths, heads and layers, and the optimiser, batch, schedule, stopping rule and seed (every training setting
    outside VARIANT_TRAINING_KEYS)."""
    where = f"{path}: variant {name!r}"
    if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "_-." for ch in name):
        raise BenchmarkError(f"{where}: a variant name is letters, digits, '_', '-' and '.' (it names the run folder)")
    if (
        not isinstance(v, dict)
        or sorted(k for k in v if k not in ("model", "training", "versus", "seeds")) != ["pair", "type"]
        or any(k not in VARIANT_FIELDS for k in v)
    ):
        raise BenchmarkError(f"{where} must be {{type, pair, model, training, versus, seeds}}, got {v!r}")
    if v["type"] not in MODELS:
        raise BenchmarkError(f"{where}: type {v['type']!r} is not one of {list(MODELS)}")
    if v["pair"] not in pairs:
        raise BenchmarkError(f"{where}: pair {v['pair']!r} is not a pair of the preset ({', '.join(map(str, pairs))})")
    overrides = v.get("model") or {}
    if not isinstance(overrides, dict):
        raise BenchmarkError(f"{where}: 'model' must be a mapping of model settings")
    fixed = [k for k in ("type", *SHARED_MODEL_KEYS) if k in overrides]
    if fixed:
        raise BenchmarkError(f"{where}: 'model' must not set {fixed}: a variant shares them with its reference")
    training = v.get("training") or {}
    if not isinstance(training, dict):
        raise BenchmarkError(f"{where}: 'training' must be a mapping of training settings")
    shared = [k for k in training if k not in VARIANT_TRAINING_KEYS]
    if shared:
        raise BenchmarkError(
            f"{where}: 'training' may only set {list(VARIANT_TRAINING_KEYS)}, not {shared}: a variant shares the "
            "optimiser, batch, schedule, stopping rule and seed with its reference"
        )
    versus = v.get("versus") or []
    if not isinstance(versus, list) or not all(isinstance(row, str) for row in versus):
        raise BenchmarkError(f"{where}: 'versus' must be a list of row names (a model type or another variant)")
    check_row_seeds(v.get("seeds"), seeds, f"{where}: 'seeds'")
    return {
        "type": v["type"],
        "pair": v["pair"],
        "model": dict(overrides),
        "training": dict(training),
        "versus": list(versus),
        "seeds": v.get("seeds"),
    }


def check_variants(variants: Any, pairs: dict, seeds: list[int] | None, path: Path) -> dict:
    """The preset's `variants:` section, checked: {name: {"type", "pair", "model", "training": overrides,
    "versus": rows, "seeds"}}. `versus` names further rows of the variant's pair (a model type, or another variant) that
    the report pairs it with by seed, beside its reference: e.g. a 4-tensor variant against a baseline variant
    trained with the same loss."""
    if not isinstance(variants, dict):
        raise BenchmarkError(
            f"{path}: 'variants' must map variant names to {{type, pair, model, training, versus, seeds}}"
        )
    checked = {name: check_variant(name, v, pairs, seeds, path) for name, v in variants.items()}
    for name, v in checked.items():
        for row in v["versus"]:
            other = checked.get(row)
            if row == name or (row not in MODELS and (other is None or other["pair"] != v["pair"])):
                raise BenchmarkError(
                    f"{path}: variant {name!r}: versus {row!r} is not another row of pair {v['pair']!r} "
                    f"(a model type {list(MODELS)} or a variant of that pair)"
                )
    return checked


# ----- the run arguments, checked against the spec -----
def choose_pairs(spec: dict, pairs: Sequence[str] | None) -> list[str]:
    """The pairs to run: `pairs` (names of the preset, each once), else the preset's default pairs, else all."""
    known = list(spec["pairs"])
    if pairs is None:
        return spec["default_pairs"] or known
    chosen = [p.strip() for p in pairs if p.strip()]
    unknown = [p for p in chosen if p not in spec["pairs"]]
    if unknown or not chosen:
        raise BenchmarkError(
            f"unknown pair(s) {unknown or pairs!r} for preset {spec['name']!r}; known pairs: {','.join(known)}"
        )
    if len(set(chosen)) != len(chosen):
        raise BenchmarkError(f"--pairs names a pair twice: {','.join(chosen)}")
    return chosen


def choose_rows(spec: dict, rows: Sequence[str] | None) -> list[str] | None:
    """The rows to run: `rows` (model types and variant names of the preset, each once), else None (every row).

    A row is one model of every chosen pair and seed: "four_tensor", "baseline", or a variant's name; naming rows
    lets several processes share a long benchmark (e.g. one trains the baselines, another the variants).
    """
    if rows is None:
        return None
    known = list(MODELS) + list(spec["variants"])
    chosen = [r.strip() for r in rows if r.strip()]
    unknown = [r for r in chosen if r not in known]
    if unknown or not chosen:
        raise BenchmarkError(
            f"unknown row(s) {unknown or list(rows)!r} for preset {spec['name']!r}; known rows: {','.join(known)}"
        )
    if len(set(chosen)) != len(chosen):
        raise BenchmarkError(f"--rows names a row twice: {','.join(chosen)}")
    return chosen


def choose_budget(
    spec: dict, max_epochs: int | None, max_minutes: float | None, train_subset: int | None
) -> tuple[int | None, float | None]:
    """(training subset K, time budget M in minutes): the preset's budget with the arguments' overrides, checked."""
    budget = dict(spec["budget"])
    if max_minutes is not None:
        budget["max_minutes"] = max_minutes
    if train_subset is not None:
        budget["train_subset"] = train_subset
    if max_epochs is not None and not is_count(max_epochs):
        raise BenchmarkError(f"--max-epochs must be a positive number of epochs, got {max_epochs!r}")
    k = budget["train_subset"]
    if k is not None and not is_count(k):
        raise BenchmarkError(f"the training subset must be a positive number of stories, got {k!r}")
    m = budget["max_minutes"]
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
        raise BenchmarkError(f"the time budget must be a positive number of minutes, got {m!r}")
    if m is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise BenchmarkError(
            "a time budget is not supported with several processes: each process would stop on its own clock; "
            "use --max-epochs (the paper preset has no time budget)"
        )
    return k, m


def choose_seeds(spec: dict, seeds: Sequence[int] | None) -> dict[str, list[int] | None]:
    """The seeds of every row (model types and variant names): `seeds` for all of them, else each row's own list
    (`reference_seeds` for the pairs' runs, a variant's `seeds`), else the preset's `seeds`; None: a single run per
    cell with the training section's seed."""
    if seeds is not None:
        if not is_seed_list(list(seeds)):
            raise BenchmarkError(f"--seeds must be distinct integers >= 0, got {list(seeds)!r}")
        return {row: list(seeds) for row in (*MODELS, *spec["variants"])}
    rows = {mt: spec.get("reference_seeds") or spec["seeds"] for mt in MODELS}
    return rows | {name: v.get("seeds") or spec["seeds"] for name, v in spec["variants"].items()}


def all_seeds(row_seeds: dict[str, list[int] | None]) -> list[int] | None:
    """Every seed some row runs, in order of first appearance (None: single runs without a seed)."""
    seeds = list(dict.fromkeys(seed for lst in row_seeds.values() for seed in lst or []))
    return seeds or None


# ----- one run -----
def run_config(
    preset: dict,
    pair: str,
    model_type: str,
    max_epochs: int | None = None,
    variant: str | None = None,
    seed: int | None = None,
) -> dict:
    """The validated train() config of one run: the preset's shared settings plus the pair's H, L (and a variant's
    model and training overrides, and the seed of a multi-seed preset)."""
    spec = preset["variants"][variant] if variant else {}
    config = {
        "model": {"type": model_type, **preset["model"], **preset["pairs"][pair], **spec.get("model", {})},
        "training": {**preset["training"], **spec.get("training", {})},
    }
    if max_epochs is not None:
        config["training"]["max_epochs"] = max_epochs
    if seed is not None:
        config["training"]["seed"] = seed
    return validate_config(
        config,
        source=f"preset {preset['name']}, pair {pair}, {model_type}" + (f", variant {variant}" if variant else ""),
    )


def run_name(pair: str, model_type: str, variant: str | None = None, seed: int | None = None) -> str:
    """The run folder's name: <pair>_<type>[_<variant>][_s<seed>] (the seed only in a preset with `seeds:`)."""
    return f"{pair}_{model_type}" + (f"_{variant}" if variant else "") + (f"_s{seed}" if seed is not None else "")

"""The Table 5 benchmark: the 4-tensor model against the flat baseline at matched settings (paper, sections 7-9).

    python -m world_model.benchmark --preset cpu --data DATA_DIR --out OUT_DIR \
        [--max-epochs E] [--max-minutes M] [--train-subset K] [--pairs h2_l2,h4_l2,h4_l3] [--resume] [--no-progress]
    python -m world_model.benchmark --preset attention --data DATA_DIR --out OUT_DIR     # issue 7: low-rank attention
    accelerate launch -m world_model.benchmark --preset paper --data DATA_DIR --out OUT_DIR     # GPUs

A preset (`--preset cpu`, `--preset paper`, i.e. configs/benchmark/<name>.yaml, or the path of such a YAML
file) names the (H, L) pairs and the settings both models share: d_x, d_t, dropout, N, T, the optimizer,
the batch, the seed, the stopping rule, and the budget (training subset, epoch cap, minutes). For every pair
the 4-tensor model and the baseline are trained by `world_model.training.train.train` into OUT/runs/<pair>_<model>/,
one after the other, on the same training windows and the same validation windows; each run selects its
checkpoint with its own selection loss and stops by the rule of section 8.2 (or by the budget, which is
then reported as such).

Variants (issue 7). A preset may add a `variants:` section: name -> {type, pair, model}, one more run of
the pair's model `type` with the `model` overrides (its attention form: the 4-tensor's qkv_form tucker and
tucker_ranks, the baseline's attention gqa / mla / tucker and their sizes; the settings every run shares
cannot be overridden). It trains after the pair's two runs into OUT/runs/<pair>_<type>_<name>/ and is
compared with the pair's run of the same type, its reference; see world_model/benchmark/attention.py.

OUT receives
    runs/<pair>_<model>/   the training runs (see world_model/training/train.py)
    results.json           everything: per-run metrics and per-epoch histories, per-pair differences and time
                           ratios, the paper-preset parameter check, the command, the corpus, the machine, the count
                           floors (world_model/evaluation/floors.py, fitted on the runs' training windows) and the Story Cloze
                           accuracy of every run's selected checkpoint and of every floor (world_model/evaluation/story_cloze.py)
    results.md             the tables (the layout of the paper's Table 5), the floors, Story Cloze and notes
    ls4_per_epoch.png      the paper's Figure 2: L_S(4) per epoch of both models, one panel per pair, floors as lines
    ls4_vs_attention_params.png   with variants only: L_S(4) against attention parameters, the Pareto front

Budget. `--max-minutes M` (or the preset's budget.max_minutes) is the time of the whole command. Before
any training, one epoch of every run is estimated from a quick timing of a few optimizer steps and a few
validation batches (the validation pass is a full one every epoch), plus EPOCH_OVERHEAD_S for the files
written after each epoch. If the minutes left after that, split equally across the runs this invocation
trains, are below any run's estimated epoch, the command stops with an error before any training. Each run
then gets an equal share of what is left of the budget when it starts (so time an early run leaves unused
goes to the later ones) and is handed `share - its estimated epoch` as train()'s max_minutes: it stops at
the end of the first epoch after which another epoch could overrun its share, and is reported as stopped by
the time budget. A time budget is refused under several processes (each would stop on its own clock).

`--resume` skips runs whose summary.json exists and resumes the others from their last completed epoch, so a long
benchmark runs in pieces. `--report-only` trains nothing and writes the reports from the runs that have finished.
A finished run needs only its light files (run.json, summary.json, metrics.jsonl, story_cloze.json) to be skipped
and reported; its checkpoints may be removed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml

from world_model.benchmark import attention as attn
from world_model.data.rocstories import (
    CLOZE_PATTERN,
    DataError,
    build_vocabulary,
    corpus_statistics,
    encode_windows,
    find_split_files,
    load_cloze_halves,
    load_corpus,
)
from world_model.evaluation import seed_stats
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.floors import FLOORS, floor_report
from world_model.models.checkpoint import WEIGHTS_NAME, CheckpointError
from world_model.models.registry import build_model, count_parameters, load_model, model_vocab_size
from world_model.text.vocab import Vocabulary
from world_model.training import train as train_mod
from world_model.training.checkpoints import (
    BEST_DIR,
    METRICS_FILE,
    RUN_FILE,
    RUN_MARKERS,
    SUMMARY_FILE,
    TrainingError,
    config_differences,
)
from world_model.training.config import ConfigError, validate_config
from world_model.utils.files import write_json_atomic

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "benchmark"
MODELS = ("four_tensor", "baseline")  # run order within a pair
MODEL_LABELS = {"four_tensor": "4-tensor", "baseline": "baseline"}
PRESET_SECTIONS = ("pairs", "model", "training", "budget", "variants", "seeds", "default_pairs")
VARIANT_FIELDS = ("type", "pair", "model")
BUDGET_FIELDS = ("train_subset", "max_minutes")
PAIR_FIELDS = ("n_heads", "n_layers")
SHARED_MODEL_KEYS = ("d_x", "d_t", "n_heads", "n_layers", "n_tokens", "n_states", "dropout")
RESULTS_JSON, RESULTS_MD, FIGURE = "results.json", "results.md", "ls4_per_epoch.png"
RUNS_DIR = "runs"
STORY_CLOZE_FILE = "story_cloze.json"  # in a run folder: its selected checkpoint's Story Cloze accuracy
EPOCH_OVERHEAD_S = 2.0  # per epoch: best/ and last/ checkpoints, metrics.jsonl, curves.png
STOPPED_BY = {
    "patience": "rule (8.2)",
    "max_epochs": "epoch cap",
    "time_budget": "time budget",
    "non_finite_loss": "non-finite loss",
}

# Section 8.1 and section 9 of the paper: the vocabulary, and what the text reports for each pair
# (Table 5 as quoted in the text: parameters in millions, L_S(4) and perplexity at the selected checkpoint,
# the lowest L_S(4) over all logged epochs, the minimum validation selection loss).
PAPER_VOCAB_SIZE = 36_711
PAPER_REPORTED = {
    "h2_l2": {
        "parameters_m": {"four_tensor": 122.2, "baseline": 175.9},
        "last_ce": {"four_tensor": 5.562, "baseline": 5.873},
        "perplexity": {"four_tensor": 260, "baseline": 355},
        "lowest_last_ce": {"four_tensor": 5.562, "baseline": 5.845},
        "selection_loss": {"four_tensor": 1.305, "baseline": 5.481},
    },
    "h4_l2": {
        "parameters_m": {"four_tensor": 172.5, "baseline": 175.9},
        "last_ce": {"four_tensor": 5.554, "baseline": 5.701},
        "perplexity": {"four_tensor": 258, "baseline": 299},
        "lowest_last_ce": {"four_tensor": 5.554, "baseline": 5.694},
        "selection_loss": {"four_tensor": 1.305, "baseline": 5.310},
        "hours": {"four_tensor": 2.4, "baseline": 45.2},
    },
    "h4_l3": {
        "parameters_m": {"four_tensor": 256.4, "baseline": 226.2},
        "last_ce": {"four_tensor": 5.531, "baseline": 5.667},
        "perplexity": {"four_tensor": 252, "baseline": 289},
        "lowest_last_ce": {"four_tensor": 5.531, "baseline": 5.667},
        "selection_loss": {"four_tensor": 1.314, "baseline": 5.297},
        "epochs": {"baseline": "29/35"},
    },
}


class BenchmarkError(ValueError):
    """A benchmark that must not start: unknown preset or pair, bad budget, an output folder in use."""


# ----- presets -----
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


def load_preset(preset: str | os.PathLike) -> dict:
    """Read and check a preset: {"name", "path", "pairs": {name: {n_heads, n_layers}}, "model", "training", "budget"}."""
    path = resolve_preset(preset)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise BenchmarkError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise BenchmarkError(f"{path}: a preset is a mapping with sections {list(PRESET_SECTIONS)}")
    unknown = [k for k in data if k not in PRESET_SECTIONS]
    if unknown:
        raise BenchmarkError(f"{path}: unknown section(s) {unknown}; allowed: {list(PRESET_SECTIONS)}")
    pairs = data.get("pairs")
    if not isinstance(pairs, dict) or not pairs:
        raise BenchmarkError(f"{path}: 'pairs' must map pair names to {{n_heads, n_layers}}")
    for name, pair in pairs.items():
        if (
            not isinstance(pair, dict)
            or sorted(pair) != sorted(PAIR_FIELDS)
            or not all(isinstance(pair[k], int) and not isinstance(pair[k], bool) and pair[k] >= 1 for k in PAIR_FIELDS)
        ):
            raise BenchmarkError(
                f"{path}: pair {name!r} must be {{n_heads: int >= 1, n_layers: int >= 1}}, got {pair!r}"
            )
    model = data.get("model") or {}
    if not isinstance(model, dict):
        raise BenchmarkError(f"{path}: 'model' must be a mapping")
    fixed = [k for k in ("type", *PAIR_FIELDS) if k in model]
    if fixed:
        raise BenchmarkError(f"{path}: 'model' must not set {fixed}: the type is set per run and heads/layers per pair")
    training = data.get("training") or {}
    if not isinstance(training, dict):
        raise BenchmarkError(f"{path}: 'training' must be a mapping")
    budget = data.get("budget") or {}
    if not isinstance(budget, dict) or any(k not in BUDGET_FIELDS for k in budget):
        raise BenchmarkError(f"{path}: 'budget' may only set {list(BUDGET_FIELDS)}")
    seeds = data.get("seeds")
    if seeds is not None and (
        not isinstance(seeds, list)
        or not seeds
        or len(set(seeds)) != len(seeds)
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds)
    ):
        raise BenchmarkError(f"{path}: 'seeds' must be a list of distinct integers >= 0, got {seeds!r}")
    default_pairs = data.get("default_pairs")
    if default_pairs is not None and (
        not isinstance(default_pairs, list) or not default_pairs or any(p not in pairs for p in default_pairs)
    ):
        raise BenchmarkError(
            f"{path}: 'default_pairs' must list pairs of the preset ({', '.join(map(str, pairs))}), got {default_pairs!r}"
        )
    spec = {
        "name": path.stem,
        "path": str(path),
        "pairs": {str(k): dict(v) for k, v in pairs.items()},
        "model": dict(model),
        "training": dict(training),
        "budget": {k: budget.get(k) for k in BUDGET_FIELDS},
        "variants": check_variants(data.get("variants") or {}, pairs, path),
        "seeds": seeds,
        "default_pairs": default_pairs,
    }
    for name, variant in spec["variants"].items():
        run_config(
            spec, variant["pair"], variant["type"], variant=name
        )  # a bad override is an error here, before any data
    return spec


def check_variants(variants: Any, pairs: dict, path: Path) -> dict:
    """The preset's `variants:` section, checked: {name: {"type", "pair", "model": overrides}}."""
    if not isinstance(variants, dict):
        raise BenchmarkError(f"{path}: 'variants' must map variant names to {{type, pair, model}}")
    out = {}
    for name, v in variants.items():
        where = f"{path}: variant {name!r}"
        if not isinstance(name, str) or not name or not all(ch.isalnum() or ch in "_-." for ch in name):
            raise BenchmarkError(
                f"{where}: a variant name is letters, digits, '_', '-' and '.' (it names the run folder)"
            )
        if (
            not isinstance(v, dict)
            or sorted(k for k in v if k != "model") != ["pair", "type"]
            or any(k not in VARIANT_FIELDS for k in v)
        ):
            raise BenchmarkError(f"{where} must be {{type, pair, model}}, got {v!r}")
        if v["type"] not in MODELS:
            raise BenchmarkError(f"{where}: type {v['type']!r} is not one of {list(MODELS)}")
        if v["pair"] not in pairs:
            raise BenchmarkError(
                f"{where}: pair {v['pair']!r} is not a pair of the preset ({', '.join(map(str, pairs))})"
            )
        overrides = v.get("model") or {}
        if not isinstance(overrides, dict):
            raise BenchmarkError(f"{where}: 'model' must be a mapping of model settings")
        fixed = [k for k in ("type", *SHARED_MODEL_KEYS) if k in overrides]
        if fixed:
            raise BenchmarkError(f"{where}: 'model' must not set {fixed}: a variant shares them with its reference")
        out[name] = {"type": v["type"], "pair": v["pair"], "model": dict(overrides)}
    return out


def run_config(
    preset: dict,
    pair: str,
    model_type: str,
    max_epochs: int | None = None,
    variant: str | None = None,
    seed: int | None = None,
) -> dict:
    """The validated train() config of one run: the preset's shared settings plus the pair's H, L (and a variant's
    overrides, and the seed of a multi-seed preset)."""
    overrides = preset["variants"][variant]["model"] if variant else {}
    config = {
        "model": {"type": model_type, **preset["model"], **preset["pairs"][pair], **overrides},
        "training": dict(preset["training"]),
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


# ----- the paper-preset parameter check (meta device: nothing is allocated) -----
def meta_parameter_count(model: torch.nn.Module) -> int:
    if not all(p.is_meta for p in model.parameters()):
        raise RuntimeError("the parameter check must build its models on the meta device")
    return count_parameters(model)


def paper_parameter_check(vocab_size: int = PAPER_VOCAB_SIZE) -> list[dict]:
    """Both models of every pair of the paper preset, built on the meta device with the paper's vocabulary,
    against the totals the paper reports (millions, one decimal)."""
    preset = load_preset("paper")
    rows = []
    for pair in preset["pairs"]:
        for model_type in MODELS:
            section = run_config(preset, pair, model_type)["model"]
            with torch.device("meta"):
                model = build_model(section, vocab_size)  # the baseline adds [BOS] and [EOS] itself
            parameters = meta_parameter_count(model)
            reported = PAPER_REPORTED.get(pair, {}).get("parameters_m", {}).get(model_type)
            rows.append(
                {
                    "pair": pair,
                    "model_type": model_type,
                    "n_heads": section["n_heads"],
                    "n_layers": section["n_layers"],
                    "parameters": parameters,
                    "parameters_m": round(parameters / 1e6, 1),
                    "paper_m": reported,
                    "match": reported is not None and round(parameters / 1e6, 1) == reported,
                }
            )
    return rows


# ----- the budget -----
def estimate_epoch_seconds(
    config: dict,
    vocab_size: int,
    train_windows: torch.Tensor,
    val_windows: torch.Tensor,
    device: torch.device,
    world_size: int = 1,
    steps: int = 3,
    eval_batches: int = 3,
) -> float:
    """Seconds of one epoch of a run: `steps` timed AdamW steps (after one warm-up step) and `eval_batches` timed
    validation batches, scaled to the batches of an epoch (all full, so a little high), plus EPOCH_OVERHEAD_S
    for the checkpoints and the curves written after every epoch."""
    tc, mc = config["training"], config["model"]
    torch.manual_seed(tc["seed"])
    model = build_model(mc, vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc["lr"], weight_decay=tc["weight_decay"])
    batches = train_windows[: tc["batch_size"] * (steps + 1)].to(device).split(tc["batch_size"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(i: int) -> None:
        stats = model.training_step(batches[i % len(batches)])
        optimizer.zero_grad(set_to_none=True)
        stats.loss.backward()
        optimizer.step()

    try:
        model.train()
        step(0)
        sync()
        start = time.perf_counter()
        for i in range(1, steps + 1):
            step(i)
        sync()
        per_step = (time.perf_counter() - start) / steps
        model.eval()
        val_batches = val_windows[: tc["eval_batch_size"] * eval_batches].to(device).split(tc["eval_batch_size"])
        with torch.no_grad():
            start = time.perf_counter()
            for batch in val_batches:
                model.training_step(batch)
            sync()
            per_eval = (time.perf_counter() - start) / len(val_batches)
    finally:
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    n_steps = math.ceil(len(train_windows) / (tc["batch_size"] * world_size))
    n_eval = math.ceil(len(val_windows) / (tc["eval_batch_size"] * world_size))
    return n_steps * per_step + n_eval * per_eval + EPOCH_OVERHEAD_S


# ----- reading the runs back -----
def read_run(folder: Path) -> dict | None:
    """summary.json, run.json and the per-epoch history of a finished run folder, or None."""
    if not (folder / SUMMARY_FILE).is_file():
        return None
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    history = (
        [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines() if line.strip()]
        if (folder / METRICS_FILE).is_file()
        else []
    )
    return {"summary": summary, "history": history}


def run_record(pair: str, model_type: str, folder: Path, out: Path, extra: dict) -> dict | None:
    """One row of the results: the run's own summary and history, and what is derived from them."""
    found = read_run(folder)
    if found is None:
        return None
    s, history = found["summary"], found["history"]
    best = s["best_metrics"]
    train_seconds = sum(h.get("train_seconds", 0.0) for h in history)
    lowest = min(history, key=lambda h: h["val_last_ce"]) if history else {}
    mc = s["config"]["model"]
    return {
        "pair": pair,
        "model_type": model_type,
        "n_heads": mc["n_heads"],
        "n_layers": mc["n_layers"],
        "run_dir": str(folder.relative_to(out)) if folder.is_relative_to(out) else str(folder),
        "parameters": s["parameters"],
        "attention_parameters": attn.config_attention_parameters(mc, s["corpus_statistics"]["vocab_size"]),
        "best_epoch": s["best_epoch"],
        "last_epoch": s["last_epoch"],
        "max_epochs": s["config"]["training"]["max_epochs"],
        "stop_reason": s["stop_reason"],
        "stopped_by": STOPPED_BY.get(s["stop_reason"], str(s["stop_reason"])),
        "val_last_ce": best.get("val_last_ce"),
        "val_token_accuracy": best.get("val_token_accuracy"),
        "val_perplexity": best.get("val_perplexity"),
        "val_window_loss": best.get("val_window_loss"),
        "wall_seconds_to_best": s["wall_seconds_to_best"],
        "wall_seconds_total": s["wall_seconds_total"],
        "train_windows": s["train_windows"],
        "validation_windows": s["validation_windows"],
        "train_windows_per_second": (s["train_windows"] * len(history) / train_seconds) if train_seconds > 0 else None,
        "mean_validation_seconds": (sum(h.get("eval_seconds", 0.0) for h in history) / len(history))
        if history
        else None,
        "lowest_val_last_ce": lowest.get("val_last_ce"),
        "lowest_val_last_ce_epoch": lowest.get("epoch"),
        "resumed_from_epoch": s.get("resumed_from_epoch"),
        "config": s["config"],
        "train_subset": s.get("train_subset"),
        "vocab_size": s["corpus_statistics"]["vocab_size"],
        "story_cloze": run_story_cloze(folder, s["data_dir"]),
        "history": history,
        **extra,
    }


def run_story_cloze(folder: Path, data_dir: str) -> dict | None:
    """Story Cloze accuracy {half: {"summed", "per_token", "stories"}} of a run's selected checkpoint, or None when it
    has none or `data_dir` holds no Story Cloze file. Computed once and kept in the run folder (STORY_CLOZE_FILE, newer
    than the checkpoint), so a finished run's row needs no checkpoint: the benchmark's light files suffice."""
    cached, weights = folder / STORY_CLOZE_FILE, folder / BEST_DIR / WEIGHTS_NAME
    if cached.is_file() and (not weights.is_file() or cached.stat().st_mtime_ns >= weights.stat().st_mtime_ns):
        return json.loads(cached.read_text())
    if not weights.is_file() or not any(Path(data_dir).glob(CLOZE_PATTERN)):
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(folder / BEST_DIR, device=device)
    result = sc.story_cloze(
        sc.model_scorer(model),
        load_cloze_halves(data_dir),
        Vocabulary.load(folder / BEST_DIR),
        getattr(model.config, "n_tokens", 16),
    )
    write_json_atomic(cached, result)
    return result


def floor_records(results: dict) -> dict:
    """The count floors of the benchmark: fitted on the runs' training windows (their settings chosen on the last
    10% of them), measured on the validation windows, with their Story Cloze accuracy.

    {"train_windows", "selection", "rows": [{"floor", "alpha", "copy_weight", "heldout_last_ce", "val_last_ce",
    "val_token_accuracy", "last_tokens", "story_cloze"}]}."""
    data_dir, k = results["data_dir"], results["settings"]["train_subset"]
    spec = results["preset"]
    n_tokens = run_config(spec, next(iter(spec["pairs"])), MODELS[0])["model"]["n_tokens"]
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    train_windows = encode_windows(corpus.train[:k] if k else corpus.train, vocab, n_tokens)
    floors, report = floor_report(train_windows, encode_windows(corpus.validation, vocab, n_tokens), len(vocab))
    halves = load_cloze_halves(data_dir)
    return {
        "train_windows": report["train_windows"],
        "selection": report["selection"],
        "rows": [
            {
                "floor": name,
                **report[name],
                "story_cloze": sc.story_cloze(sc.floor_scorer(floors[name]), halves, vocab, n_tokens),
            }
            for name in FLOORS
        ],
    }


def difference(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def run_mismatches(a: dict, b: dict) -> list[str]:
    """What differs between two run records that must be matched: training settings, shared model settings, data."""
    mismatches = config_differences(a["config"]["training"], b["config"]["training"])
    mismatches += [
        f"model.{k}: {a['config']['model'][k]!r} -> {b['config']['model'][k]!r}"
        for k in SHARED_MODEL_KEYS
        if a["config"]["model"][k] != b["config"]["model"][k]
    ]
    for key in ("train_subset", "train_windows", "validation_windows", "vocab_size"):
        if a[key] != b[key]:
            mismatches.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    return mismatches


def pair_record(pair: str, rows: dict[str, dict | None]) -> dict:
    """Δ L_S(4) = baseline - 4-tensor, the time ratios baseline / 4-tensor, and the matching check of one pair."""
    four, base = rows.get("four_tensor"), rows.get("baseline")
    record: dict[str, Any] = {"pair": pair, "complete": four is not None and base is not None}
    if not record["complete"]:
        return record
    mismatches = run_mismatches(four, base)
    record.update(
        {
            "n_heads": four["n_heads"],
            "n_layers": four["n_layers"],
            "delta_last_ce": difference(base["val_last_ce"], four["val_last_ce"]),
            "delta_lowest_last_ce": difference(base["lowest_val_last_ce"], four["lowest_val_last_ce"]),
            "time_to_best_ratio": ratio(base["wall_seconds_to_best"], four["wall_seconds_to_best"]),
            "total_time_ratio": ratio(base["wall_seconds_total"], four["wall_seconds_total"]),
            "parameter_ratio": ratio(base["parameters"], four["parameters"]),
            "matched": not mismatches,
            "mismatches": mismatches,
        }
    )
    return record


# ----- reports -----
def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def fmt_parameters(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 100_000 else f"{n:,} parameters"


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def notes_for(results: dict) -> list[str]:
    notes = []
    preset, rows, pairs = results["preset"], results["runs"], results["pairs"]
    settings = results["settings"]
    if preset["name"] != "paper":
        notes.append(
            f"Scaled-down preset '{preset['name']}': d_x = {preset['model'].get('d_x')}, d_t = {preset['model'].get('d_t')}, "
            f"at most {settings['max_epochs']} epoch(s)"
            + (f", the first {settings['train_subset']} training stories" if settings["train_subset"] else "")
            + ". Absolute numbers are not comparable with the paper's Table 5; the comparison is between the two models "
            "of each pair, trained on the same windows at the same settings."
        )
    vocab = results["corpus_statistics"].get("vocab_size")
    if vocab is not None and vocab != PAPER_VOCAB_SIZE:
        notes.append(
            f"The vocabulary here has {vocab:,} tokens (the paper's {PAPER_VOCAB_SIZE:,} come from the full 101,671-story pool); "
            f"a uniform guess scores ln {vocab:,} = {math.log(vocab):.2f} nats."
        )
    for r in rows:
        label = f"{r['pair']} {MODEL_LABELS[r['model_type']]}"
        if r["stop_reason"] == "time_budget":
            notes.append(
                f"{label}: stopped by the time budget after epoch {r['last_epoch']}, before the section 8.2 rule fired; "
                f"its selected epoch {r['best_epoch']} is the minimum so far, not necessarily the rule's checkpoint."
            )
        elif r["stop_reason"] == "max_epochs":
            notes.append(
                f"{label}: stopped by the epoch cap ({r['max_epochs']}) before the section 8.2 rule fired; "
                f"its selected epoch {r['best_epoch']} is the minimum so far"
                + (" (the last epoch: still improving)." if r["best_epoch"] == r["last_epoch"] else ".")
            )
        elif r["stop_reason"] == "non_finite_loss":
            notes.append(f"{label}: stopped on a non-finite loss after epoch {r['last_epoch']}.")
        if (
            r["model_type"] == "four_tensor"
            and r["lowest_val_last_ce_epoch"] is not None
            and r["lowest_val_last_ce_epoch"] != r["best_epoch"]
        ):
            notes.append(
                f"{label}: the epoch of minimum L_S(4) ({r['lowest_val_last_ce_epoch']}) differs from the selected epoch "
                f"({r['best_epoch']}, minimum window loss); the paper reports that they coincide at its settings."
            )
        if r.get("resumed_from_epoch"):
            notes.append(
                f"{label}: resumed after epoch {r['resumed_from_epoch']}; its wall times add the time before and after the interruption."
            )
    for p in pairs:
        if not p["complete"]:
            notes.append(f"{p['pair']}: incomplete, only one of the two runs has finished.")
            continue
        if p["delta_last_ce"] is None:
            notes.append(f"{p['pair']}: no Δ L_S(4): a run has no finite validation epoch.")
        else:
            lead = (
                "4-tensor ahead" if p["delta_last_ce"] > 0 else "baseline ahead" if p["delta_last_ce"] < 0 else "a tie"
            )
            notes.append(
                f"{p['pair']}: Δ L_S(4) = {p['delta_last_ce']:+.4f} nats at the selected checkpoints ({lead}); "
                f"over all logged epochs {fmt(p['delta_lowest_last_ce'], '+.4f')}."
            )
        if not p["matched"]:
            notes.append(f"{p['pair']}: the two runs are NOT matched: " + "; ".join(p["mismatches"]))
    earlier = [f"{r['pair']} {MODEL_LABELS[r['model_type']]}" for r in rows if r.get("skipped_by_resume")]
    if earlier:
        notes.append(
            f"Trained by an earlier invocation and skipped by --resume: {', '.join(earlier)}; their times were measured "
            "then, under that invocation's machine load."
        )
    ranked = [p for p in pairs if p["complete"] and p["parameter_ratio"] and p["delta_last_ce"] is not None]
    if ranked:
        close = min(ranked, key=lambda p: abs(math.log(p["parameter_ratio"])))
        verdict = "the 4-tensor model is ahead" if close["delta_last_ce"] > 0 else "the 4-tensor model is NOT ahead"
        notes.append(
            f"Closest parameter match here: {close['pair']} (baseline / 4-tensor parameters {close['parameter_ratio']:.3f}); "
            f"there {verdict} (Δ L_S(4) {close['delta_last_ce']:+.4f}). In the paper it is h4_l2 (175.9M / 172.5M), "
            "Δ +0.147."
        )
    notes += attn.notes(results)
    m = results["machine"]
    notes.append(
        f"Times are this machine's ({m['cpu_count']} CPU(s), torch {m['torch']} with {m['torch_threads']} thread(s), "
        f"device {m['device']}; load average {m['load_average_start']} at the start, {m.get('load_average_end')} at the end). "
        "Wall times are train()'s epoch clock (training and validation, not process start-up); "
        "windows/s is training windows over training time. "
        + (
            f"Seeds: {', '.join(map(str, settings['seeds']))} (mean ± sd over them and paired 95% intervals under 'Over seeds')."
            if settings.get("seeds")
            else "A single seed per cell."
        )
    )
    return notes


def row_label(row: dict) -> str:
    """A row's name in the reports: "h4_l2 4-tensor", "h4_l2 4-tensor causal" ..."""
    return f"{row['pair']} {MODEL_LABELS[row['model_type']]}" + (f" {row['variant']}" if row.get("variant") else "")


def fmt_mean_sd(stats: dict, spec: str) -> str:
    if stats.get("mean") is None:
        return "—"
    return format(stats["mean"], spec) + (f" ± {format(stats['sd'], spec)}" if stats.get("sd") is not None else "")


def seed_lines(results: dict) -> list[str]:
    """The 'Over seeds' section: mean ± sd per row and the paired differences (only with several seeds)."""
    if not (results["settings"].get("seeds") and results.get("seed_summary")):
        return []
    lines = [
        "",
        "## Over seeds",
        "",
        "Mean ± sample standard deviation over the seeds that have finished (each seed changes the initial weights, "
        "the batch order and dropout; the windows are the same).",
        "",
        "| row | seeds | L_S(4) | per seed | token acc. | epochs (selected/last) | stopped by |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for row in results["seed_summary"]:
        ce = row["val_last_ce"]
        lines.append(
            f"| {row_label(row)} | {', '.join(map(str, row['seeds']))} | {fmt_mean_sd(ce, '.4f')} | "
            f"{', '.join(fmt(v, '.4f') for v in ce['values'])} | {fmt_mean_sd(row['val_token_accuracy'], '.4f')} | "
            f"{', '.join(row['epochs'])} | {', '.join(sorted(set(row['stopped_by'])))} |"
        )
    lines += [
        "",
        "Paired differences of L_S(4) by seed (positive: the second-named row is lower), with the 95% Student-t "
        "interval of their mean:",
        "",
        "| pair | difference | seeds | per seed | mean | 95% interval |",
        "|---|---|---|---|---:|---|",
    ]
    for p in results["paired"]:
        ci = p["ci95"]
        lines.append(
            f"| {p['pair']} | {p['comparison']} | {', '.join(map(str, p['seeds']))} | "
            f"{', '.join(f'{d:+.4f}' for d in p['differences'])} | {fmt(p['mean'], '+.4f')} | "
            f"{f'[{ci[0]:+.4f}, {ci[1]:+.4f}]' if ci else '— (one seed)'} |"
        )
    return lines


def write_markdown(results: dict, path: Path) -> None:
    rows, pairs = results["runs"], results["pairs"]
    s = results["settings"]
    lines = [
        f"# Table 5 benchmark: 4-tensor model vs flat baseline (preset `{results['preset']['name']}`)",
        "",
        f"Command: `{results['command']}`",
        "",
        "Settings shared by every run: "
        + ", ".join(f"{k} {v}" for k, v in results["preset"]["model"].items())
        + "; "
        + ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in {**results["preset"]["training"], "max_epochs": s["max_epochs"]}.items()
        )
        + f"; training subset: {s['train_subset'] or 'all'} stories "
        f"({results.get('train_windows')} windows); validation: {results.get('validation_windows')} windows; "
        f"time budget: {fmt(s['max_minutes'], '.1f') + ' min for the command' if s['max_minutes'] else 'none'}"
        + (f" ({s['share_minutes']:.2f} min per run)" if s.get("share_minutes") else "")
        + ".",
        "",
        "## Runs at the selected checkpoint (layout of the paper's Table 5)",
        "",
        "Epoch is selected/last; the checkpoint is the minimum of each model's own validation selection loss "
        "(4-tensor: window cross-entropy on S(1..4); baseline: free-running cross-entropy of S(4) + [EOS]). "
        "L_S(4) is the mean cross-entropy on the non-padding tokens of the last sentence; accuracy is the argmax "
        "match rate on the same tokens; perplexity = exp(L_S(4)).",
        "",
        "| pair | H | L | model | parameters | epoch | stopped by | L_S(4) | token acc. | perplexity | time to selected | total time | train windows/s |",
        "|---|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    attention_variants = {a["run_dir"] for a in results.get("attention", [])}
    for r in rows + [v for v in results.get("variants", []) if v["run_dir"] not in attention_variants]:
        seed = f" (seed {r['seed']})" if r.get("seed") is not None else ""
        lines.append(
            f"| {r['pair']}{seed} | {r['n_heads']} | {r['n_layers']} | {row_label(r).split(' ', 1)[1]} | {r['parameters']:,} | "
            f"{r['best_epoch']}/{r['last_epoch']} | {r['stopped_by']} | {fmt(r['val_last_ce'], '.4f')} | "
            f"{fmt(r['val_token_accuracy'], '.4f')} | {fmt(r['val_perplexity'], '.1f')} | {fmt_seconds(r['wall_seconds_to_best'])} | "
            f"{fmt_seconds(r['wall_seconds_total'])} | {fmt(r['train_windows_per_second'], '.1f')} |"
        )
    lines += [
        "",
        "## Per pair",
        "",
        "Δ L_S(4) = baseline − 4-tensor (positive: the 4-tensor model is lower). Time ratio = baseline / 4-tensor, "
        "wall time to the selected checkpoint, measured in this run.",
        "",
        "| pair | Δ L_S(4) | lowest L_S(4) over all epochs, 4-tensor / baseline (Δ) | time-to-selected ratio | total-time ratio | parameters, baseline / 4-tensor | matched |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    by = {(r["pair"], r.get("seed"), r["model_type"]): r for r in rows}
    for p in pairs:
        name = p["pair"] + (f" (seed {p['seed']})" if p.get("seed") is not None else "")
        if not p["complete"]:
            lines.append(f"| {name} | — | — | — | — | — | incomplete |")
            continue
        f4, fb = by[(p["pair"], p.get("seed"), "four_tensor")], by[(p["pair"], p.get("seed"), "baseline")]
        lines.append(
            f"| {name} | {fmt(p['delta_last_ce'], '+.4f')} | {fmt(f4['lowest_val_last_ce'], '.4f')} (ep {f4['lowest_val_last_ce_epoch']}) / "
            f"{fmt(fb['lowest_val_last_ce'], '.4f')} (ep {fb['lowest_val_last_ce_epoch']}) ({fmt(p['delta_lowest_last_ce'], '+.4f')}) | "
            f"{fmt(p['time_to_best_ratio'], '.2f')} | {fmt(p['total_time_ratio'], '.2f')} | {fmt(p['parameter_ratio'], '.3f')} | "
            f"{'yes' if p['matched'] else 'NO'} |"
        )
    lines += seed_lines(results) + floor_markdown_lines(results) + story_cloze_markdown_lines(results)
    lines += ["", f"![L_S(4) per epoch]({FIGURE})"]
    if results.get("attention"):
        lines += attn.markdown_lines(results)
    lines += [
        "",
        f"## Check: parameter totals of the paper preset (meta device, vocabulary {PAPER_VOCAB_SIZE:,})",
        "",
        "| pair | model | parameters (exact) | millions | paper | match |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in results["paper_parameter_check"]:
        lines.append(
            f"| {c['pair']} | {MODEL_LABELS[c['model_type']]} | {c['parameters']:,} | {c['parameters_m']:.1f}M | "
            f"{fmt(c['paper_m'], '.1f')}M | {'yes' if c['match'] else 'NO'} |"
        )
    lines += [
        "",
        "## The paper's reported numbers (section 9), for reference",
        "",
        "| pair | L_S(4) 4-tensor / baseline | Δ | perplexity | lowest L_S(4) over all epochs |",
        "|---|---|---:|---|---|",
    ]
    for pair, rep in PAPER_REPORTED.items():
        lc, pp, lo = rep["last_ce"], rep["perplexity"], rep["lowest_last_ce"]
        lines.append(
            f"| {pair} | {lc['four_tensor']:.3f} / {lc['baseline']:.3f} | {lc['baseline'] - lc['four_tensor']:+.3f} | "
            f"{pp['four_tensor']} / {pp['baseline']} | {lo['four_tensor']:.3f} / {lo['baseline']:.3f} |"
        )
    c = results["corpus_statistics"]
    lines += (
        [
            "",
            "## Corpus",
            "",
            ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in c.items()),
            "",
            "## Notes",
            "",
        ]
        + [f"- {n}" for n in results["notes"]]
        + [""]
    )
    path.write_text("\n".join(lines), encoding="utf-8")


def floor_markdown_lines(results: dict) -> list[str]:
    """The count floors' table: what a predictor that learns nothing about stories scores on the same tokens."""
    floors = results.get("floors")
    if not floors:
        return []
    sel = floors["selection"]
    lines = [
        "",
        "## Count floors (training data only)",
        "",
        f"Count predictors of S(4)'s tokens fitted on the same {floors['train_windows']} training windows as the runs; "
        f"smoothing and copy weight chosen on the last {sel['heldout_windows']} of them (held out, {sel['heldout_fraction']:g}), "
        "then refitted on all; scored on the validation tokens of the table above (world_model/evaluation/floors.py).",
        "",
        "| floor | alpha | copy weight | held-out L_S(4) | L_S(4) | token acc. | perplexity |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in floors["rows"]:
        lines.append(
            f"| {f['floor']} | {f['alpha']:g} | {f['copy_weight']:g} | {f['heldout_last_ce']:.4f} | {f['val_last_ce']:.4f} | "
            f"{f['val_token_accuracy']:.4f} | {math.exp(f['val_last_ce']):.1f} |"
        )
    return lines


def story_cloze_markdown_lines(results: dict) -> list[str]:
    """Story Cloze accuracy of every run's selected checkpoint and of the floors, beside the published points."""
    rows = [
        (
            f"{r['pair']} {MODEL_LABELS[r['model_type']]}" + (f" {r['variant']}" if r.get("variant") else ""),
            r.get("story_cloze"),
        )
        for r in results["runs"] + results.get("variants", [])
    ]
    rows += [(f"floor: {f['floor']}", f["story_cloze"]) for f in (results.get("floors") or {}).get("rows", [])]
    halves = next((list(c) for _, c in rows if c), [])
    if not halves:
        return []
    lines = [
        "",
        "## Story Cloze accuracy",
        "",
        "The right one of the two endings, picked by its S(4) log-likelihood given S(0..3): summed over its tokens, or "
        "per token (world_model/evaluation/story_cloze.py). Published: "
        + ", ".join(f"{k} {v:.1%}" for k, v in sc.REFERENCES.items())
        + ".",
        "",
        "| model | " + " | ".join(f"{h} summed | {h} per token" for h in halves) + " |",
        "|---|" + "---:|---:|" * len(halves),
    ]
    for label, c in rows:
        lines.append(
            f"| {label} | "
            + " | ".join(f"{c[h]['summed']:.1%} | {c[h]['per_token']:.1%}" if c and h in c else "— | —" for h in halves)
            + " |"
        )
    return lines


def plot_ls4(results: dict, path: Path) -> None:
    """The paper's Figure 2: L_S(4) per logged epoch of both models, one panel per pair, selected epochs marked,
    the count floors as horizontal lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    pairs = [p["pair"] for p in results["pairs"]]
    fig = Figure(figsize=(4.5 * max(len(pairs), 1), 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(pairs), 1), squeeze=False)[0]
    attention_runs = {a["run_dir"] for a in results.get("attention", [])}
    shown = results["runs"] + [v for v in results.get("variants", []) if v["run_dir"] not in attention_runs]
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    colors = {
        key: palette[i % len(palette)]
        for i, key in enumerate(dict.fromkeys((r["model_type"], r.get("variant")) for r in shown))
    }  # one colour per row, the same for every seed
    for ax, pair in zip(axes, pairs):
        for r in (r for r in shown if r["pair"] == pair):
            color = colors[(r["model_type"], r.get("variant"))]
            seed = f", seed {r['seed']}" if r.get("seed") is not None else ""
            epochs = [h["epoch"] for h in r["history"]]
            ax.plot(
                epochs,
                [h["val_last_ce"] for h in r["history"]],
                "o-",
                markersize=3,
                color=color,
                label=f"{row_label(r).split(' ', 1)[1]} ({fmt_parameters(r['parameters'])}{seed})",
            )
            if r["best_epoch"] is not None:
                ax.plot(
                    [r["best_epoch"]],
                    [r["val_last_ce"]],
                    "*",
                    markersize=14,
                    color=color,
                    markeredgecolor="black",
                    label=f"selected epoch {r['best_epoch']} ({r['stopped_by']})",
                )
            ax.set_title(f"{pair}: H = {r['n_heads']}, L = {r['n_layers']}")
        for f, style in zip((results.get("floors") or {}).get("rows", []), (":", "--", "-.")):
            ax.axhline(
                f["val_last_ce"],
                color="gray",
                linestyle=style,
                linewidth=1,
                label=f"floor: {f['floor']} ({f['val_last_ce']:.2f})",
            )
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("validation $L_{S(4)}$ (nats / token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Last-sentence cross-entropy per epoch (preset {results['preset']['name']})")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def write_reports(results: dict, out: Path) -> None:
    if "floors" not in results:  # fitted once, the first time the reports are written
        results["floors"] = floor_records(results)
    results["notes"] = notes_for(results)
    write_json_atomic(out / RESULTS_JSON, results)
    write_markdown(results, out / RESULTS_MD)
    plot_ls4(results, out / FIGURE)
    if results.get("attention"):
        attn.plot_pareto(results, out / attn.PARETO_FIGURE)


def machine_info(device: torch.device) -> dict:
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "device": str(device),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "load_average_start": load_average(),
    }
    try:
        info["accelerate"] = __import__("accelerate").__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["cuda"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


# ----- the benchmark -----
@dataclass
class Run:
    pair: str
    model_type: str
    config: dict
    folder: Path
    variant: str | None = None  # None: one of the pair's two runs
    seed: int | None = None  # the run's seed in a preset with `seeds:`, else None (the training section's seed)
    done: bool = False
    estimate_seconds: float | None = None
    max_minutes: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return run_name(self.pair, self.model_type, self.variant, self.seed)


def run_benchmark(
    preset: str | os.PathLike,
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    max_epochs: int | None = None,
    max_minutes: float | None = None,
    train_subset: int | None = None,
    pairs: Sequence[str] | None = None,
    resume: bool = False,
    progress: bool = True,
    command: str | None = None,
    seeds: Sequence[int] | None = None,
    report_only: bool = False,
) -> dict:
    """Check everything, then train every (pair, model) run and write the reports; returns results.json's dict.

    Every check (preset, pairs, budgets, data folder, output folder, time budget) runs before any training.
    """
    t_start = time.monotonic()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    spec = load_preset(preset)
    known = list(spec["pairs"])
    if pairs is None:
        chosen = spec["default_pairs"] or known
    else:
        chosen = [p.strip() for p in pairs if p.strip()]
        unknown = [p for p in chosen if p not in spec["pairs"]]
        if unknown or not chosen:
            raise BenchmarkError(
                f"unknown pair(s) {unknown or pairs!r} for preset {spec['name']!r}; known pairs: {','.join(known)}"
            )
        if len(set(chosen)) != len(chosen):
            raise BenchmarkError(f"--pairs names a pair twice: {','.join(chosen)}")
    budget = dict(spec["budget"])
    if max_minutes is not None:
        budget["max_minutes"] = max_minutes
    if train_subset is not None:
        budget["train_subset"] = train_subset
    if max_epochs is not None and (isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1):
        raise BenchmarkError(f"--max-epochs must be a positive number of epochs, got {max_epochs!r}")
    k = budget["train_subset"]
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise BenchmarkError(f"the training subset must be a positive number of stories, got {k!r}")
    m = budget["max_minutes"]
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
        raise BenchmarkError(f"the time budget must be a positive number of minutes, got {m!r}")

    if m is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise BenchmarkError(
            "a time budget is not supported with several processes: each process would stop on its own clock; "
            "use --max-epochs (the paper preset has no time budget)"
        )

    seed_list = list(seeds) if seeds is not None else spec["seeds"]
    if seed_list is not None and (
        not seed_list
        or len(set(seed_list)) != len(seed_list)
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seed_list)
    ):
        raise BenchmarkError(f"--seeds must be distinct integers >= 0, got {seed_list!r}")
    out = Path(out_dir)
    runs = []
    for seed in seed_list or [None]:  # seed by seed, so that a partial benchmark has whole seeds
        for pair in chosen:  # the pair's two runs, then its variants
            runs += [
                Run(
                    pair,
                    mt,
                    run_config(spec, pair, mt, max_epochs, seed=seed),
                    out / RUNS_DIR / run_name(pair, mt, seed=seed),
                    seed=seed,
                )
                for mt in MODELS
            ]
            runs += [
                Run(
                    pair,
                    v["type"],
                    run_config(spec, pair, v["type"], max_epochs, variant=name, seed=seed),
                    out / RUNS_DIR / run_name(pair, v["type"], name, seed),
                    variant=name,
                    seed=seed,
                )
                for name, v in spec["variants"].items()
                if v["pair"] == pair
            ]

    find_split_files(data_dir)  # DataError (no training or no validation file) before anything else reads the data
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    n_tokens = runs[0].config["model"]["n_tokens"]
    stats = corpus_statistics(corpus, vocab, n_tokens)
    train_windows = encode_windows(corpus.train[:k] if k else corpus.train, vocab, n_tokens)
    val_windows = encode_windows(corpus.validation, vocab, n_tokens)

    if out.exists() and not out.is_dir():
        raise BenchmarkError(f"--out {out} is a file, not a folder")
    for run in runs:
        found = [name for name in RUN_MARKERS if (run.folder / name).exists()]
        if found and not (resume or report_only):
            raise BenchmarkError(
                f"{run.folder} already holds a training run ({', '.join(found)}); pass --resume to continue "
                "the benchmark, or choose another --out"
            )
        run.done = (resume or report_only) and (run.folder / SUMMARY_FILE).is_file()
        if found and (resume or report_only) and (run.folder / RUN_FILE).is_file():
            saved = json.loads((run.folder / RUN_FILE).read_text())
            wanted = {"config": run.config, "train_subset": k}
            diffs = [
                d
                for d in config_differences({key: saved.get(key) for key in wanted}, wanted)
                if not d.startswith("config.training.max_epochs:")
            ]
            if diffs:
                raise BenchmarkError(
                    f"--resume: the run in {run.folder} differs from the requested one: " + "; ".join(diffs)
                )
    if not (resume or report_only) and (out / RESULTS_JSON).exists():
        raise BenchmarkError(f"{out} already holds a benchmark ({RESULTS_JSON}); pass --resume or choose another --out")

    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    is_main = int(os.environ.get("RANK", "0")) == 0
    if report_only:
        m = None  # nothing is trained, so there is no budget to split
    todo = [run for run in runs if not run.done and not report_only]
    share = None
    if m is not None and todo:
        for run in todo:
            run.estimate_seconds = estimate_epoch_seconds(
                run.config, model_vocab_size(run.model_type, vocab), train_windows, val_windows, device, world_size
            )
        share = (60 * m - (time.monotonic() - t_start)) / len(todo)
        short = [run for run in todo if run.estimate_seconds > share]
        if short:
            raise BenchmarkError(
                f"--max-minutes {m:g} is too small: after the set-up it leaves {max(share, 0):.1f} s per run for {len(todo)} run(s), "
                "below one estimated epoch of "
                + ", ".join(f"{r.name} ({r.estimate_seconds:.1f} s)" for r in short)
                + f". One epoch of every run needs about {sum(r.estimate_seconds for r in todo) / 60 + (time.monotonic() - t_start) / 60:.1f} "
                "minutes in all; raise --max-minutes or lower --train-subset."
            )

    settings = {
        "pairs": chosen,
        "seeds": seed_list,
        "max_epochs": runs[0].config["training"]["max_epochs"],
        "train_subset": k,
        "max_minutes": m,
        "share_minutes": share / 60 if share is not None else None,  # the equal share at the start
        "resume": resume,
        "estimated_epoch_seconds": {r.name: r.estimate_seconds for r in todo if r.estimate_seconds is not None},
    }
    results: dict[str, Any] = {
        "preset": spec,
        "command": command or "python -m world_model.benchmark " + shlex.join(sys.argv[1:]),
        "settings": settings,
        "data_dir": str(data_dir),
        "corpus_statistics": stats,
        "train_windows": len(train_windows),
        "validation_windows": len(val_windows),
        "machine": machine_info(device),
        "paper_parameter_check": paper_parameter_check(),
        "started_at": started_at,
        "complete": False,
    }

    def collect() -> None:
        rows = [
            run_record(
                r.pair,
                r.model_type,
                r.folder,
                out,
                {
                    "skipped_by_resume": r.done,
                    "estimated_epoch_seconds": r.estimate_seconds,
                    "max_minutes_given": r.max_minutes,
                    "seed": r.seed,
                    **r.extra,
                },
            )
            for r in runs
        ]
        results["runs"] = [row for row, r in zip(rows, runs) if row is not None and r.variant is None]
        by_pair: dict[tuple, dict] = {}  # (pair, seed) -> model type -> row
        for row in results["runs"]:
            by_pair.setdefault((row["pair"], row["seed"]), {})[row["model_type"]] = row
        results["pairs"] = [{**pair_record(pair, found), "seed": seed} for (pair, seed), found in by_pair.items()]
        if spec["variants"]:
            results["variants"] = []
            for row, r in zip(rows, runs):
                if row is not None and r.variant is not None:
                    reference = by_pair.get((r.pair, r.seed), {}).get(r.model_type)
                    results["variants"].append(
                        {
                            **row,
                            "variant": r.variant,
                            "mismatches": run_mismatches(reference, row) if reference else None,
                        }
                    )
            attention = [
                v for v in results["variants"] if attn.is_attention_variant(spec["variants"][v["variant"]]["model"])
            ]
            if attention:
                results["attention"] = attn.attention_rows(results["runs"], attention)
                results["attention_target"] = attn.target_check(results["attention"])
        every_run = results["runs"] + results.get("variants", [])
        results["seed_summary"] = seed_stats.summarise_rows(every_run)
        results["paired"] = seed_stats.paired_rows(every_run)
        results["elapsed_seconds"] = time.monotonic() - t_start
        results["machine"]["load_average_end"] = load_average()

    if is_main:
        (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    for i, run in enumerate(runs, 1):
        name = run.name
        if run.done:
            print(f"[{i}/{len(runs)}] {name}: finished before ({run.folder / SUMMARY_FILE}); skipped", flush=True)
            continue
        if report_only:
            print(
                f"[{i}/{len(runs)}] {name}: not finished; left out of the report (--report-only trains nothing)",
                flush=True,
            )
            continue
        t_run = time.monotonic()
        if m is not None:
            # What is left of the command's budget, split equally across the runs still to train (time a run
            # leaves unused goes to the later ones); the run stops once another epoch would overrun its share.
            left = sum(1 for r in runs[i - 1 :] if not r.done)
            run.extra["share_seconds"] = (60 * m - (t_run - t_start)) / left
            run.max_minutes = max(run.extra["share_seconds"] - run.estimate_seconds, 1.0) / 60
        print(
            f"[{i}/{len(runs)}] {name}: H {run.config['model']['n_heads']}, L {run.config['model']['n_layers']} -> {run.folder}"
            + (
                f" (budget {run.max_minutes:.2f} min, estimated epoch {run.estimate_seconds:.1f} s)"
                if run.max_minutes
                else ""
            ),
            flush=True,
        )
        train_mod.train(
            run.config,
            data_dir,
            run.folder,
            resume=resume,
            max_minutes=run.max_minutes,
            train_subset=k,
            progress=progress,
        )
        run.extra["call_seconds"] = time.monotonic() - t_run
        if is_main:
            collect()
            write_reports(results, out)
    if is_main:
        collect()
        results["complete"] = (
            all(p["complete"] for p in results["pairs"])
            and len(results["pairs"]) == len(chosen)
            and len(results.get("variants", [])) == sum(r.variant is not None for r in runs)
        )
        results["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        out.mkdir(parents=True, exist_ok=True)
        write_reports(results, out)
        print_summary(results, out)
    return results


def print_summary(results: dict, out: Path) -> None:
    print(
        f"\nresults: {out / RESULTS_MD}, {out / RESULTS_JSON}, {out / FIGURE}"
        + (f", {out / attn.PARETO_FIGURE}" if results.get("attention") else "")
    )
    for r in results["runs"]:
        print(
            f"  {r['pair']:>6} {MODEL_LABELS[r['model_type']]:>8}: {r['parameters']:>12,} parameters, epoch {r['best_epoch']}/{r['last_epoch']} "
            f"({r['stopped_by']}), L_S(4) {fmt(r['val_last_ce'], '.4f')}, acc {fmt(r['val_token_accuracy'], '.4f')}, "
            f"to selected {fmt_seconds(r['wall_seconds_to_best'])}, {fmt(r['train_windows_per_second'], '.1f')} windows/s"
        )
    for p in results["pairs"]:
        if p["complete"]:
            print(
                f"  {p['pair']:>6}: Δ L_S(4) (baseline - 4-tensor) {fmt(p['delta_last_ce'], '+.4f')}, "
                f"time-to-selected ratio (baseline / 4-tensor) {fmt(p['time_to_best_ratio'], '.2f')}"
            )
    for a in results.get("attention", []):
        print(
            f"  {a['pair']:>6} {MODEL_LABELS[a['model_type']]:>8} {a['variant']}: {a['attention']}, {a['attention_parameters']:,} attention "
            f"parameters ({fmt(a['attention_ratio'], '.2f')}x fewer than the reference), L_S(4) {fmt(a['val_last_ce'], '.4f')} "
            f"(Δ {fmt(a['delta_percent'], '+.2f')}%)" + (", Pareto" if a.get("pareto") else "")
        )
    for note in attn.target_notes(results.get("attention_target", [])):
        print(f"  {note}")
    for f in (results.get("floors") or {}).get("rows", []):
        print(f"  floor {f['floor']}: L_S(4) {f['val_last_ce']:.4f}, acc {f['val_token_accuracy']:.4f}")
    for c in results["paper_parameter_check"]:
        print(
            f"  paper preset {c['pair']:>6} {MODEL_LABELS[c['model_type']]:>8}: {c['parameters']:,} = {c['parameters_m']:.1f}M "
            f"(paper {c['paper_m']}M) {'ok' if c['match'] else 'MISMATCH'}"
        )


def parse_seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchmarkError(f"--seeds must be comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The paper's Table 5 benchmark: 4-tensor model vs flat baseline at matched settings."
    )
    parser.add_argument(
        "--preset",
        required=True,
        help="cpu, attention, paper (configs/benchmark/<name>.yaml) or the path of a preset YAML file",
    )
    parser.add_argument("--data", required=True, type=Path, help="folder with ROCStories*.csv and cloze_test_*.csv")
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder (must not hold a benchmark unless --resume)"
    )
    parser.add_argument("--max-epochs", type=int, help="override the preset's epoch cap (every run)")
    parser.add_argument(
        "--max-minutes", type=float, help="time budget of the whole command, split equally across the runs it trains"
    )
    parser.add_argument("--train-subset", type=int, help="train on the first K training stories (every run)")
    parser.add_argument(
        "--pairs", help="comma-separated pair names of the preset (default: all, e.g. h2_l2,h4_l2,h4_l3)"
    )
    parser.add_argument("--seeds", help="comma-separated seeds (default: the preset's seeds, or its training seed)")
    parser.add_argument("--resume", action="store_true", help="skip finished runs and resume interrupted ones")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the reports from the runs in --out that have finished (a benchmark run in pieces)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    launcher = "accelerate launch -m" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "python -m"
    try:
        run_benchmark(
            args.preset,
            args.data,
            args.out,
            max_epochs=args.max_epochs,
            max_minutes=args.max_minutes,
            train_subset=args.train_subset,
            pairs=args.pairs.split(",") if args.pairs is not None else None,
            resume=args.resume,
            progress=not args.no_progress,
            seeds=parse_seeds(args.seeds),
            report_only=args.report_only,
            command=f"{launcher} world_model.benchmark.table5 " + shlex.join(argv_list),
        )
    except (BenchmarkError, ConfigError, DataError, TrainingError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; continue with the same command and --resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

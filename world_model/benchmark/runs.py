"""The runs of a benchmark: the output folder's layout, the plan (one Run per seed, pair and model or variant, each
in OUT/runs/<name>/), the data every run shares, the checks of run folders before training, the time estimate of
an epoch, and a finished run read back as a record (one row of results.json)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from world_model.benchmark import attention as attn
from world_model.benchmark.preset import MODELS, BenchmarkError, all_seeds, run_config, run_name
from world_model.data.rocstories import (
    CLOZE_PATTERN,
    RocStoriesCorpus,
    build_vocabulary,
    encode_windows,
    load_cloze_halves,
    load_corpus,
)
from world_model.evaluation import coherence as coh
from world_model.evaluation import story_cloze as sc
from world_model.models.checkpoint import WEIGHTS_NAME
from world_model.models.registry import build_model, load_model
from world_model.text.vocab import Vocabulary
from world_model.training.checkpoints import (
    BEST_DIR,
    METRICS_FILE,
    RUN_FILE,
    RUN_MARKERS,
    SUMMARY_FILE,
    config_differences,
)
from world_model.training.config import validate_config
from world_model.utils.files import write_json_atomic

RUNS_DIR = "runs"  # OUT/runs/<name>/: the training runs
RESULTS_JSON, RESULTS_MD, FIGURE = "results.json", "results.md", "ls4_per_epoch.png"  # OUT's reports
DECODE_TIMING_JSON = "decode_timing.json"  # in OUT: the attention rows' decode times (attention_decode.py)
STORY_CLOZE_FILE = "story_cloze.json"  # in a run folder: its selected checkpoint's Story Cloze accuracy
COHERENCE_FILE = "coherence.json"  # in a run folder: its selected checkpoint's coherence report
REUSED_FILE = "reused_from.json"  # in a run folder taken over from another benchmark (reuse.py): where from
EPOCH_OVERHEAD_S = 2.0  # per epoch: best/ and last/ checkpoints, metrics.jsonl, curves.png
STOPPED_BY = {
    "patience": "rule (8.2)",
    "max_epochs": "epoch cap",
    "time_budget": "time budget",
    "non_finite_loss": "non-finite loss",
}


# ----- the plan -----
@dataclass
class Run:
    """One training run of the benchmark and what the command learns about it on the way."""

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

    @property
    def row(self) -> str:
        """The row the run belongs to: its variant's name, else its model type."""
        return self.variant or self.model_type


def plan_runs(
    spec: dict,
    pairs: list[str],
    row_seeds: dict[str, list[int] | None],
    max_epochs: int | None,
    out: Path,
    rows: list[str] | None = None,
) -> list[Run]:
    """Every run of the chosen `rows` (None: all), in training order: seed by seed (so that a partial benchmark
    has whole seeds), pair by pair, the pair's two runs and then its variants; a row runs the seeds `row_seeds`
    gives it (preset.choose_seeds; None: one run with the training section's seed)."""
    runs = []
    for seed in all_seeds(row_seeds) or [None]:
        for pair in pairs:
            runs += [
                Run(
                    pair,
                    mt,
                    run_config(spec, pair, mt, max_epochs, seed=seed),
                    out / RUNS_DIR / run_name(pair, mt, seed=seed),
                    seed=seed,
                )
                for mt in MODELS
                if seed in (row_seeds[mt] or [None])
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
                if v["pair"] == pair and seed in (row_seeds[name] or [None])
            ]
    return [run for run in runs if rows is None or run.row in rows]


def load_windows(
    data_dir: str | Path, n_tokens: int, train_subset: int | None
) -> tuple[RocStoriesCorpus, Vocabulary, torch.Tensor, torch.Tensor]:
    """(corpus, vocabulary, training windows, validation windows) of every run: the windows of the first
    `train_subset` training stories (all when None) and of every validation story."""
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    k = train_subset
    train_windows = encode_windows(corpus.train[:k] if k else corpus.train, vocab, n_tokens)
    return corpus, vocab, train_windows, encode_windows(corpus.validation, vocab, n_tokens)


def check_run_folders(runs: list[Run], train_subset: int | None, resume: bool, report_only: bool) -> None:
    """Refuse a run folder in use unless resuming (or reporting), and a resumed run that differs from the requested
    one (its epoch cap aside); mark the finished runs done."""
    continuing = resume or report_only
    for run in runs:
        found = [name for name in RUN_MARKERS if (run.folder / name).exists()]
        if found and not continuing:
            raise BenchmarkError(
                f"{run.folder} already holds a training run ({', '.join(found)}); pass --resume to continue "
                "the benchmark, or choose another --out"
            )
        run.done = continuing and (run.folder / SUMMARY_FILE).is_file()
        if found and continuing and (run.folder / RUN_FILE).is_file():
            saved = json.loads((run.folder / RUN_FILE).read_text())
            if isinstance(saved.get("config"), dict):  # fields added since the run started take their defaults
                saved["config"] = validate_config(saved["config"], source=str(run.folder / RUN_FILE))
            wanted = {"config": run.config, "train_subset": train_subset}
            diffs = [
                d
                for d in config_differences({key: saved.get(key) for key in wanted}, wanted)
                if not d.startswith("config.training.max_epochs:")
            ]
            if diffs:
                raise BenchmarkError(
                    f"--resume: the run in {run.folder} differs from the requested one: " + "; ".join(diffs)
                )


# ----- the time estimate -----
def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    stats = model.training_step(batch)
    optimizer.zero_grad(set_to_none=True)
    stats.loss.backward()
    optimizer.step()


def seconds_per_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: tuple[torch.Tensor, ...],
    steps: int,
    sync: Callable[[], None],
) -> float:
    """Seconds of one optimizer step: one warm-up step, then the mean of `steps` timed ones."""
    model.train()
    optimizer_step(model, optimizer, batches[0])
    sync()
    start = time.perf_counter()
    for i in range(1, steps + 1):
        optimizer_step(model, optimizer, batches[i % len(batches)])
    sync()
    return (time.perf_counter() - start) / steps


def seconds_per_eval_batch(
    model: torch.nn.Module, batches: tuple[torch.Tensor, ...], sync: Callable[[], None]
) -> float:
    """Seconds of one validation batch: the mean over `batches`."""
    model.eval()
    with torch.no_grad():
        start = time.perf_counter()
        for batch in batches:
            model.training_step(batch)
        sync()
        return (time.perf_counter() - start) / len(batches)


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
    try:
        per_step = seconds_per_step(model, optimizer, batches, steps, sync)
        val_batches = val_windows[: tc["eval_batch_size"] * eval_batches].to(device).split(tc["eval_batch_size"])
        per_eval = seconds_per_eval_batch(model, val_batches, sync)
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
    config = validate_config(s["config"], source=str(folder / SUMMARY_FILE))  # settings added since take defaults
    best = s["best_metrics"]
    train_seconds = sum(h.get("train_seconds", 0.0) for h in history)
    lowest = min(history, key=lambda h: h["val_last_ce"]) if history else {}
    mc = config["model"]
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
        "max_epochs": config["training"]["max_epochs"],
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
        "config": config,
        "train_subset": s.get("train_subset"),
        "vocab_size": s["corpus_statistics"]["vocab_size"],
        "story_cloze": run_story_cloze(folder, s["data_dir"]),
        "coherence": run_coherence(folder, s["data_dir"]),
        "reused_from": json.loads((folder / REUSED_FILE).read_text())["source"]
        if (folder / REUSED_FILE).is_file()
        else None,
        "history": history,
        **extra,
    }


def run_story_cloze(folder: Path, data_dir: str) -> dict | None:
    """Story Cloze accuracy {half: {"summed", "per_token", "stories"}} of a run's selected checkpoint, or None when it
    has none or `data_dir` holds no Story Cloze file. Computed once and kept in the run folder (STORY_CLOZE_FILE, newer
    than the checkpoint), so a finished run's row needs no checkpoint: the benchmark's light files suffice."""
    return cached_checkpoint_report(folder, data_dir, STORY_CLOZE_FILE, sc.story_cloze)


def run_coherence(folder: Path, data_dir: str) -> dict | None:
    """The coherence report of a run's selected checkpoint (`world_model.evaluation.coherence.coherence_report`:
    Story Cloze with the rule chosen on the val half, retrieval recall@1/@10 and MRR), kept as COHERENCE_FILE like
    `run_story_cloze`'s; None when the run has no checkpoint and no kept report (a run finished before it existed)."""
    return cached_checkpoint_report(folder, data_dir, COHERENCE_FILE, coh.coherence_report)


def cached_checkpoint_report(folder: Path, data_dir: str, name: str, report) -> dict | None:
    """report(scorer, halves, vocab, n_tokens) of a run's selected checkpoint, kept in the run folder as `name`
    (recomputed when the checkpoint is newer); None without a checkpoint or a Story Cloze file."""
    cached, weights = folder / name, folder / BEST_DIR / WEIGHTS_NAME
    if cached.is_file() and (not weights.is_file() or cached.stat().st_mtime_ns >= weights.stat().st_mtime_ns):
        return json.loads(cached.read_text())
    if not weights.is_file() or not any(Path(data_dir).glob(CLOZE_PATTERN)):
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(folder / BEST_DIR, device=device)
    result = report(
        sc.model_scorer(model),
        load_cloze_halves(data_dir),
        Vocabulary.load(folder / BEST_DIR),
        getattr(model.config, "n_tokens", 16),
    )
    write_json_atomic(cached, result)
    return result

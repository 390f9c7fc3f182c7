"""The Table 5 benchmark: the 4-tensor model against the flat baseline at matched settings (paper, sections 7-9).

    python -m world_model.benchmark --preset cpu --data DATA_DIR --out OUT_DIR \
        [--max-epochs E] [--max-minutes M] [--train-subset K] [--pairs h2_l2,h4_l2,h4_l3] [--seeds 0,1,2]
        [--rows four_tensor,baseline,VARIANT] [--resume] [--report-only] [--no-progress]
    python -m world_model.benchmark --preset attention --data DATA_DIR --out OUT_DIR --resume [--rows ...]
    accelerate launch -m world_model.benchmark --preset paper --data DATA_DIR --out OUT_DIR     # GPUs

A preset (`--preset cpu`, `--preset paper`, i.e. configs/benchmark/<name>.yaml, or the path of such a YAML
file) names the (H, L) pairs and the settings both models share: d_x, d_t, dropout, N, T, the optimizer,
the batch, the seed, the stopping rule, and the budget (training subset, epoch cap, minutes). For every pair
the 4-tensor model and the baseline are trained by `world_model.training.train.train` into OUT/runs/<pair>_<model>/,
one after the other, on the same training windows and the same validation windows; each run selects its
checkpoint with its own selection loss and stops by the rule of section 8.2 (or by the budget, which is
then reported as such).

Variants. A preset may add a `variants:` section: name -> {type, pair, model, training, versus}, one
more run of the pair's model `type` with the `model` overrides (e.g. its attention form: the 4-tensor's qkv_form
tucker and tucker_ranks, the baseline's attention gqa / mla / tucker and their sizes) and `training` overrides of
its loss only (the settings every run shares cannot be overridden). It trains after the pair's two runs into
OUT/runs/<pair>_<type>_<name>/ and is compared with the pair's run of the same type, its reference (see
world_model/benchmark/attention.py), and, paired by seed, with each row its `versus` list names (a model type or
another variant of the pair).

OUT receives
    runs/<pair>_<model>/   the training runs (see world_model/training/train.py)
    results.json           everything: per-run metrics and per-epoch histories, per-pair differences and time
                           ratios, the paper-preset parameter check, the command, the corpus, the machine, the count
                           floors (world_model/evaluation/floors/, fitted on the runs' training windows) and the Story Cloze
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

`--resume` skips runs whose summary.json exists (after checking that the run.json there records the requested run,
its epoch cap aside) and resumes the others from their last completed epoch, so a long benchmark runs in pieces.
Seeds: a preset's `seeds:` (or a row's own list, `reference_seeds:` / a variant's `seeds:`; preset.py) gives each
row one run per seed, OUT/runs/<name>_s<seed>/; `--seeds` replaces every row's list. A preset's `reuse_runs:`
folder gives finished runs of another benchmark that are the same runs as some of this one's: they are copied into
OUT/runs/ (light files only) and not trained again (world_model/benchmark/reuse.py). `--report-only` trains
nothing and writes the reports from the runs that have finished. A finished run needs only its light files
(run.json, summary.json, metrics.jsonl, story_cloze.json, coherence.json) to be skipped and reported; its
checkpoints may be removed.

The modules: world_model/benchmark/preset.py (the preset and the arguments checked against it), runs.py (the
runs, their folders, the epoch estimate, a finished run's record), report.py (results.json's dict, the figure),
markdown.py and notes.py (results.md), paper.py (the paper's numbers), attention.py, attention_verdict.py and
attention_report.py (the attention variants' rows, verdict and report), reuse.py (runs taken over).
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from world_model.benchmark.preset import (
    BenchmarkError,
    all_seeds,
    choose_budget,
    choose_pairs,
    choose_rows,
    choose_seeds,
    load_preset,
)
from world_model.benchmark.report import collect_results, load_average, print_summary, results_header, write_reports
from world_model.benchmark.reuse import reuse_folder, reuse_runs
from world_model.benchmark.runs import (
    RESULTS_JSON,
    REUSED_FILE,
    RUNS_DIR,
    Run,
    check_run_folders,
    estimate_epoch_seconds,
    load_windows,
    plan_runs,
)
from world_model.benchmark.settings import BenchmarkSettings
from world_model.data.rocstories import corpus_statistics, find_split_files
from world_model.models.precision import check_precision
from world_model.models.registry import model_vocab_size
from world_model.text.vocab import Vocabulary
from world_model.training import train as train_mod
from world_model.training.checkpoints import SUMMARY_FILE
from world_model.utils.cli import check_writable
from world_model.utils.flags import settings_main


def run_benchmark(settings: BenchmarkSettings, command: str | None = None) -> dict:
    """Check everything, then train every (pair, model) run and write the reports; returns results.json's dict.

    Every check (preset, pairs, budgets, data folder, output folder, time budget) runs before any training.
    `settings.precision` (fp32 or bf16) overrides the preset's `training.precision` for every run; `settings.rows`
    (model types and variant names) restricts the runs to those rows, so that several processes can share one
    benchmark. `command` is the command line recorded in results.json (default: this process's).
    """
    t_start = time.monotonic()
    started_at = utc_now()
    spec = load_preset(settings.preset)
    if settings.precision is not None:
        spec["training"]["precision"] = check_precision(settings.precision)
    chosen = choose_pairs(spec, settings.pair_list())
    k, m = choose_budget(spec, settings.max_epochs, settings.max_minutes, settings.train_subset)
    row_seeds = choose_seeds(spec, settings.seed_list())
    out, data_dir, report_only = Path(settings.out), settings.data, settings.report_only
    runs = plan_runs(spec, chosen, row_seeds, settings.max_epochs, out, choose_rows(spec, settings.row_list()))
    if not runs:
        raise BenchmarkError(f"--rows {settings.rows} has no run in the pairs {','.join(chosen)}")
    check_output(out, runs, k, settings.resume, report_only, spec["name"])
    find_split_files(data_dir)  # DataError (no training or no validation file) before anything else reads the data
    n_tokens = runs[0].config["model"]["n_tokens"]
    corpus, vocab, train_windows, val_windows = load_windows(data_dir, n_tokens, k)
    device, world_size, is_main = device_and_ranks()
    reuse = None
    if spec.get("reuse_runs"):
        data = {"train_windows": len(train_windows), "validation_windows": len(val_windows), "vocab_size": len(vocab)}
        reuse = reuse_runs(runs, reuse_folder(spec["reuse_runs"]), k, data, copy=is_main)
        for name in reuse["reused"]:
            print(f"{name}: taken over from {reuse['source']}/{name} (the same run; not trained again)", flush=True)
    if report_only:
        m = None  # nothing is trained, so there is no budget to split
    todo = [run for run in runs if not run.done and not report_only]
    share = None
    if m is not None and todo:
        share = allot_budget(todo, m, t_start, vocab, train_windows, val_windows, device, world_size)
    record = settings_record(chosen, row_seeds, runs, todo, k, m, share, settings.resume)
    results = results_header(
        spec,
        record,
        command or "python -m world_model.benchmark " + shlex.join(sys.argv[1:]),
        data_dir,
        corpus_statistics(corpus, vocab, n_tokens),
        train_windows,
        val_windows,
        device,
        started_at,
    )
    if report_only:  # nothing is timed here: the tables' times are those of the machine that trained the runs
        results["machine"] = earlier_machine(out) or results["machine"]
    if reuse is not None:
        results["reuse"] = reuse
    if is_main:
        (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    for i, run in enumerate(runs, 1):
        if run.done or report_only:
            print(f"[{i}/{len(runs)}] {run.name}: " + skip_reason(run), flush=True)
            continue
        train_run(run, i, runs, data_dir, k, m, t_start, settings.resume, settings.progress)
        if is_main:
            collect(results, runs, out, t_start)
            write_reports(results, out)
    if is_main:
        finish(results, runs, len(chosen), out, t_start, timed=not report_only)
    return results


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def check_output(
    out: Path, runs: list[Run], train_subset: int | None, resume: bool, report_only: bool, preset: str
) -> None:
    """Refuse an --out that is a file, run folders in use (see check_run_folders), a finished benchmark unless
    resuming (or reporting), and a report of another preset (which --report-only would replace)."""
    if out.exists() and not out.is_dir():
        raise BenchmarkError(f"--out {out} is a file, not a folder")
    check_writable(out)
    check_run_folders(runs, train_subset, resume, report_only)
    if not (resume or report_only) and (out / RESULTS_JSON).exists():
        raise BenchmarkError(f"{out} already holds a benchmark ({RESULTS_JSON}); pass --resume or choose another --out")
    earlier = earlier_preset(out)
    if earlier is not None and earlier != preset:
        raise BenchmarkError(
            f"{out} holds the report of preset {earlier!r}, not {preset!r}; --resume and --report-only rewrite a "
            "folder's own report: choose another --out"
        )


def device_and_ranks() -> tuple[torch.device, int, bool]:
    """(this process's device, the number of processes, whether this is the main one) under accelerate or alone."""
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    return device, int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")) == 0


def allot_budget(
    todo: list[Run],
    m: float,
    t_start: float,
    vocab: Vocabulary,
    train_windows: torch.Tensor,
    val_windows: torch.Tensor,
    device: torch.device,
    world_size: int,
) -> float:
    """Estimate one epoch of every run to train; the equal share (seconds) of the `m` minutes left after the set-up,
    or BenchmarkError when it is below any run's estimated epoch."""
    for run in todo:
        run.estimate_seconds = estimate_epoch_seconds(
            run.config, model_vocab_size(run.model_type, vocab), train_windows, val_windows, device, world_size
        )
    share = (60 * m - (time.monotonic() - t_start)) / len(todo)
    short = [run for run in todo if run.estimate_seconds > share]
    if short:
        raise BenchmarkError(
            f"--max-minutes {m:g} is too small: after the set-up it leaves {max(share, 0):.1f} s per run "
            f"for {len(todo)} run(s), below one estimated epoch of "
            + ", ".join(f"{r.name} ({r.estimate_seconds:.1f} s)" for r in short)
            + ". One epoch of every run needs about "
            f"{sum(r.estimate_seconds for r in todo) / 60 + (time.monotonic() - t_start) / 60:.1f} "
            "minutes in all; raise --max-minutes or lower --train-subset."
        )
    return share


def settings_record(
    pairs: list[str],
    row_seeds: dict[str, list[int] | None],
    runs: list[Run],
    todo: list[Run],
    k: int | None,
    m: float | None,
    share: float | None,
    resume: bool,
) -> dict:
    """results.json["settings"]: what this invocation runs (its seeds: every seed some row runs, and each row's),
    and its budget."""
    return {
        "pairs": pairs,
        "seeds": all_seeds(row_seeds),
        "row_seeds": row_seeds,
        "max_epochs": runs[0].config["training"]["max_epochs"],
        "train_subset": k,
        "max_minutes": m,
        "share_minutes": share / 60 if share is not None else None,  # the equal share at the start
        "resume": resume,
        "estimated_epoch_seconds": {r.name: r.estimate_seconds for r in todo if r.estimate_seconds is not None},
    }


def skip_reason(run: Run) -> str:
    """Why the loop passes over a run: finished before, or --report-only."""
    if run.done and (run.folder / REUSED_FILE).is_file():
        return f"taken over from {json.loads((run.folder / REUSED_FILE).read_text())['source']}; skipped"
    if run.done:
        return f"finished before ({run.folder / SUMMARY_FILE}); skipped"
    return "not finished; left out of the report (--report-only trains nothing)"


def train_run(
    run: Run,
    i: int,
    runs: list[Run],
    data_dir: str | os.PathLike,
    k: int | None,
    m: float | None,
    t_start: float,
    resume: bool,
    progress: bool,
) -> None:
    """Train the i-th (from 1) of `runs` with its share of what is left of the budget."""
    t_run = time.monotonic()
    if m is not None:
        # What is left of the command's budget, split equally across the runs still to train (time a run
        # leaves unused goes to the later ones); the run stops once another epoch would overrun its share.
        left = sum(1 for r in runs[i - 1 :] if not r.done)
        run.extra["share_seconds"] = (60 * m - (t_run - t_start)) / left
        run.max_minutes = max(run.extra["share_seconds"] - run.estimate_seconds, 1.0) / 60
    print(
        f"[{i}/{len(runs)}] {run.name}: H {run.config['model']['n_heads']}, L {run.config['model']['n_layers']} "
        f"-> {run.folder}"
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


def collect(results: dict, runs: list[Run], out: Path, t_start: float, timed: bool = True) -> None:
    """Refill results from the run folders (report.collect_results), with the time so far and, when this invocation
    trained (`timed`), the load average now."""
    collect_results(results, runs, out)
    results["elapsed_seconds"] = time.monotonic() - t_start
    if timed:
        results["machine"]["load_average_end"] = load_average()


def earlier_machine(out: Path) -> dict | None:
    """The machine record of the results.json already in `out` (None without a readable one): --report-only keeps
    it, since the run times in the reports were measured on that machine, under that load."""
    try:
        return json.loads((out / RESULTS_JSON).read_text()).get("machine")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None


def earlier_preset(out: Path) -> str | None:
    """The preset name in the results.json already in `out` (None without a readable one)."""
    try:
        return json.loads((out / RESULTS_JSON).read_text())["preset"]["name"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None


def finish(results: dict, runs: list[Run], n_pairs: int, out: Path, t_start: float, timed: bool = True) -> None:
    """The final reports: complete when every pair and every variant asked for has finished."""
    collect(results, runs, out, t_start, timed)
    results["complete"] = (
        all(p["complete"] for p in results["pairs"])
        and len(results["pairs"]) == n_pairs
        and len(results.get("variants", [])) == sum(r.variant is not None for r in runs)
    )
    results["finished_at"] = utc_now()
    out.mkdir(parents=True, exist_ok=True)
    write_reports(results, out)
    print_summary(results, out)


# ----- the command -----
def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        BenchmarkSettings,
        "world_model.benchmark",
        "The paper's Table 5 benchmark: 4-tensor model vs flat baseline at matched settings.",
        benchmark_command,
        argv,
        on_interrupt="continue with the same command and --resume",
    )


def benchmark_command(settings: BenchmarkSettings, command: str) -> dict:
    """The command's work: `run_benchmark`, its record saying the command as launched (`accelerate launch -m`
    when several processes run it)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        command = command.replace("python -m", "accelerate launch -m", 1)
    return run_benchmark(settings, command)


if __name__ == "__main__":
    sys.exit(main())

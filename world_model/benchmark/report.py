"""The benchmark's results: results.json's dict (filled from the run folders), the per-pair comparisons, the count
floors, and the files written from it (results.json, results.md, the per-epoch figure ls4_per_epoch.png).

results.json holds: "preset" (the spec), "command", "settings", "data_dir", "corpus_statistics", "train_windows",
"validation_windows", "machine", "paper_parameter_check", "started_at", "complete"; then, filled by collect_results
after every run: "runs" (run records, world_model/benchmark/runs.py), "pairs" (pair_record), with variants
"variants" and "attention", "attention_target" (world_model/benchmark/attention.py), "decode_timing" (when
OUT/decode_timing.json has been measured, world_model/benchmark/attention_decode.py), "seed_summary", "paired"
(world_model/evaluation/seed_stats.py), "elapsed_seconds"; and, by write_reports, "floors", "attention_verdict"
(world_model/benchmark/attention_verdict.py) and "notes"; "reuse" (world_model/benchmark/reuse.py) with a preset's
`reuse_runs:`.
print_summary prints the gist at the end of the command.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Sequence

import torch

from world_model.benchmark import attention as attn
from world_model.benchmark import attention_report
from world_model.benchmark.attention_verdict import attention_verdict
from world_model.benchmark.markdown import (
    fmt,
    fmt_interval,
    fmt_mean_sd,
    fmt_parameters,
    fmt_seconds,
    table_runs,
    write_markdown,
)
from world_model.benchmark.notes import notes_for
from world_model.benchmark.paper import paper_parameter_check
from world_model.benchmark.preset import MODEL_LABELS, MODELS, SHARED_MODEL_KEYS, row_label, run_config, seed_suffix
from world_model.benchmark.runs import (
    DECODE_TIMING_JSON,
    FIGURE,
    RESULTS_JSON,
    RESULTS_MD,
    Run,
    load_windows,
    run_record,
)
from world_model.data.rocstories import load_cloze_halves
from world_model.evaluation import coherence as coh
from world_model.evaluation import seed_stats
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.floors import FLOORS, floor_report
from world_model.training.checkpoints import config_differences
from world_model.utils.files import write_json_atomic

# The rows' colours: tab20's ten dark shades (matplotlib's default cycle), then its ten light ones, each without its
# gray (the floors' colour), so that 18 rows get colours of their own before any repeats.
ROW_PALETTE = [f"tab:{c}" for c in ("blue", "orange", "green", "red", "purple", "brown", "pink", "olive", "cyan")] + [
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
]


# ----- results.json's dict -----
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


def results_header(
    spec: dict,
    settings: dict,
    command: str,
    data_dir: str | os.PathLike,
    corpus_statistics: dict,
    train_windows: torch.Tensor,
    val_windows: torch.Tensor,
    device: torch.device,
    started_at: str,
) -> dict[str, Any]:
    """results.json's dict before any run is collected: what was asked, on which data, on which machine."""
    return {
        "preset": spec,
        "command": command,
        "settings": settings,
        "data_dir": str(data_dir),
        "corpus_statistics": corpus_statistics,
        "train_windows": len(train_windows),
        "validation_windows": len(val_windows),
        "machine": machine_info(device),
        "paper_parameter_check": paper_parameter_check(),
        "started_at": started_at,
        "complete": False,
    }


def run_rows(runs: list[Run], out: Path) -> list[dict | None]:
    """The record of every run in `runs` (None for one not finished)."""
    return [
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


def variant_records(rows: list[dict | None], runs: list[Run], by_pair: dict[tuple, dict], spec: dict) -> list[dict]:
    """The finished variants' records, each with its mismatches against its reference (the pair's run of its type
    and seed; None while that has not finished), less the training settings the variant itself changes."""
    variants = []
    for row, r in zip(rows, runs):
        if row is not None and r.variant is not None:
            reference = by_pair.get((r.pair, r.seed), {}).get(r.model_type)
            intended = spec["variants"][r.variant].get("training", {})
            mismatches = run_mismatches(reference, row, intended) if reference else None
            variants.append({**row, "variant": r.variant, "mismatches": mismatches})
    return variants


def collect_results(results: dict, runs: list[Run], out: Path) -> None:
    """(Re)fill results' "runs", "pairs", "variants", "attention", "attention_target", "seed_summary" and "paired"
    from the run folders."""
    spec = results["preset"]
    rows = run_rows(runs, out)
    results["runs"] = [row for row, r in zip(rows, runs) if row is not None and r.variant is None]
    by_pair: dict[tuple, dict] = {}  # (pair, seed) -> model type -> row
    for row in results["runs"]:
        by_pair.setdefault((row["pair"], row["seed"]), {})[row["model_type"]] = row
    results["pairs"] = [{**pair_record(pair, found), "seed": seed} for (pair, seed), found in by_pair.items()]
    if spec["variants"]:
        results["variants"] = variant_records(rows, runs, by_pair, spec)
        attention = [
            v for v in results["variants"] if attn.is_attention_variant(spec["variants"][v["variant"]]["model"])
        ]
        if attention:
            results["attention"] = attn.attention_rows(results["runs"], attention)
            results["attention_target"] = attn.target_check(results["attention"])
            if (out / DECODE_TIMING_JSON).is_file():
                results["decode_timing"] = json.loads((out / DECODE_TIMING_JSON).read_text())
    every_run = results["runs"] + results.get("variants", [])
    results["seed_summary"] = seed_stats.summarise_rows(every_run)
    versus = {name: v["versus"] for name, v in spec["variants"].items()}
    results["paired"] = seed_stats.paired_rows(every_run, versus)


def difference(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def run_mismatches(a: dict, b: dict, intended: Sequence[str] = ()) -> list[str]:
    """What differs between two run records that must be matched: training settings (but the `intended` ones),
    shared model settings, data."""
    differences = config_differences(a["config"]["training"], b["config"]["training"])
    mismatches = [d for d in differences if d.split(":")[0] not in intended]
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


def floor_records(results: dict) -> dict:
    """The count floors of the benchmark: fitted on the runs' training windows (their settings chosen on the last
    10% of them), measured on the validation windows, with their Story Cloze accuracy.

    {"train_windows", "selection", "end_cost", "last_sentence", "rows": [{"floor", "alpha", "copy_weight",
    "heldout_last_ce", "val_last_ce", "val_token_accuracy", "last_tokens", "story_cloze", "coherence"}]}."""
    data_dir, k = results["data_dir"], results["settings"]["train_subset"]
    spec = results["preset"]
    n_tokens = run_config(spec, next(iter(spec["pairs"])), MODELS[0])["model"]["n_tokens"]
    _, vocab, train_windows, val_windows = load_windows(data_dir, n_tokens, k)
    floors, report = floor_report(train_windows, val_windows, len(vocab))
    halves = load_cloze_halves(data_dir)
    return {
        "train_windows": report["train_windows"],
        "selection": report["selection"],
        "end_cost": report["end_cost"],
        "last_sentence": report["last_sentence"],
        "rows": [
            {
                "floor": name,
                **report[name],
                "story_cloze": sc.story_cloze(sc.floor_scorer(floors[name]), halves, vocab, n_tokens),
                "coherence": coh.coherence_report(sc.floor_scorer(floors[name]), halves, vocab, n_tokens),
            }
            for name in FLOORS
        ],
    }


# ----- the files -----
def write_reports(results: dict, out: Path) -> None:
    if "floors" not in results:  # fitted once, the first time the reports are written
        results["floors"] = floor_records(results)
    if results.get("attention"):
        results["attention_verdict"] = attention_verdict(results["attention"], results["floors"])
    results["notes"] = notes_for(results)
    write_json_atomic(out / RESULTS_JSON, results)
    write_markdown(results, out / RESULTS_MD)
    plot_ls4(results, out / FIGURE)
    if results.get("attention"):
        attention_report.plot_pareto(results, out / attention_report.PARETO_FIGURE)


def print_summary(results: dict, out: Path) -> None:
    """The end of the command's output: the files written, each run (variants too, with its seed), pair, mean over
    seeds and paired difference, attention variant and floor, and the paper-preset check."""
    print(
        f"\nresults: {out / RESULTS_MD}, {out / RESULTS_JSON}, {out / FIGURE}"
        + (f", {out / attention_report.PARETO_FIGURE}" if results.get("attention") else "")
    )
    for r in table_runs(results):
        print(
            f"  {row_label(r)}{seed_suffix(r)}: {r['parameters']:,} parameters, "
            f"epoch {r['best_epoch']}/{r['last_epoch']} ({r['stopped_by']}), L_S(4) {fmt(r['val_last_ce'], '.4f')}, "
            f"acc {fmt(r['val_token_accuracy'], '.4f')}, to selected {fmt_seconds(r['wall_seconds_to_best'])}, "
            f"{fmt(r['train_windows_per_second'], '.1f')} windows/s"
        )
    for p in results["pairs"]:
        if p["complete"]:
            print(
                f"  {p['pair']}{seed_suffix(p)}: Δ L_S(4) (baseline - 4-tensor) {fmt(p['delta_last_ce'], '+.4f')}, "
                f"time-to-selected ratio (baseline / 4-tensor) {fmt(p['time_to_best_ratio'], '.2f')}"
            )
    if results["settings"].get("seeds"):
        for row in results.get("seed_summary", []):
            print(
                f"  {row_label(row)}, seeds {', '.join(map(str, row['seeds']))}: L_S(4) {fmt_mean_sd(row['val_last_ce'], '.4f')}"
            )
        for p in results.get("paired", []):
            interval = fmt_interval(p["ci95"])
            print(
                f"  {p['pair']} {p['comparison']}, seeds {', '.join(map(str, p['seeds']))}: mean {fmt(p['mean'], '+.4f')}, "
                + (f"95% interval {interval}" if interval else "no interval (one seed)")
            )
    for line in attention_report.summary_lines(results):
        print(f"  {line}")
    for f in (results.get("floors") or {}).get("rows", []):
        print(f"  floor {f['floor']}: L_S(4) {f['val_last_ce']:.4f}, acc {f['val_token_accuracy']:.4f}")
    for c in results["paper_parameter_check"]:
        print(
            f"  paper preset {c['pair']:>6} {MODEL_LABELS[c['model_type']]:>8}: {c['parameters']:,} = "
            f"{c['parameters_m']:.1f}M (paper {c['paper_m']}M) {'ok' if c['match'] else 'MISMATCH'}"
        )


def plot_ls4(results: dict, path: Path) -> None:
    """The paper's Figure 2: L_S(4) per logged epoch of both models, one panel per pair, selected epochs marked,
    the count floors as horizontal lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pairs = list(dict.fromkeys(p["pair"] for p in results["pairs"]))  # one panel per pair, every seed in it
    fig = Figure(figsize=(4.5 * max(len(pairs), 1) + 3.5, 4.5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(pairs), 1), squeeze=False)[0]
    attention_runs = {a["run_dir"] for a in results.get("attention", [])}
    shown = results["runs"] + [v for v in results.get("variants", []) if v["run_dir"] not in attention_runs]
    colors = row_colors(shown)
    floors = (results.get("floors") or {}).get("rows", [])
    for ax, pair in zip(axes, pairs):
        plot_ls4_panel(ax, pair, [r for r in shown if r["pair"] == pair], colors, floors)
    fig.suptitle(f"Last-sentence cross-entropy per epoch (preset {results['preset']['name']}; stars: selected epochs)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def row_colors(runs: list[dict]) -> dict[tuple, str]:
    """One colour per row (model type, variant) of `runs`, in order of first appearance, the same for every seed."""
    rows = dict.fromkeys((r["model_type"], r.get("variant")) for r in runs)
    return {key: ROW_PALETTE[i % len(ROW_PALETTE)] for i, key in enumerate(rows)}


def plot_ls4_panel(ax: Any, pair: str, rows: list[dict], colors: dict[tuple, str], floors: list[dict]) -> None:
    """One pair's panel of plot_ls4: a curve per row (colour by (model type, variant)), the floors as lines."""
    from matplotlib.ticker import MaxNLocator

    seeds: dict[tuple, list] = {}  # (model type, variant) -> the seeds of its runs in this panel
    for r in rows:
        seeds.setdefault((r["model_type"], r.get("variant")), []).append(r.get("seed"))
    for r in rows:
        key = (r["model_type"], r.get("variant"))
        plot_ls4_curve(ax, r, colors[key], seeds.pop(key, None))  # the row's first curve names it in the legend
        ax.set_title(f"{pair}: H = {r['n_heads']}, L = {r['n_layers']}")
    for f, style in zip(floors, (":", "--", "-.", (0, (5, 1, 1, 1, 1, 1)))):
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
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))


def plot_ls4_curve(ax: Any, r: dict, color: str, seeds: list | None) -> None:
    """A run record's L_S(4) per logged epoch, its selected epoch starred; the legend names its row once, with the
    row's `seeds`, and leaves the curve out when `seeds` is None (another seed of a row already named)."""
    named = [s for s in seeds or [] if s is not None]
    seed = f", seed{'s' if len(named) > 1 else ''} {', '.join(map(str, named))}" if named else ""
    ax.plot(
        [h["epoch"] for h in r["history"]],
        [h["val_last_ce"] for h in r["history"]],
        "o-",
        markersize=3,
        color=color,
        label=f"{row_label(r).split(' ', 1)[1]} ({fmt_parameters(r['parameters'])}{seed})" if seeds else "_nolegend_",
    )
    if r["best_epoch"] is not None:
        ax.plot(
            [r["best_epoch"]],
            [r["val_last_ce"]],
            "*",
            markersize=14,
            color=color,
            markeredgecolor="black",
        )

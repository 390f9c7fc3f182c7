"""Coherence rows of the cpu benchmark: one row's predictors, seed by seed, alone and with a coherence head.

    python -m world_model.benchmark.coherence_rows --runs RUNS_DIR [RUNS_DIR ...] --row causal_copy \
        --data DATA_DIR --out results/benchmark/cpu_coherence [--seeds 0 1 2] [--reference results/benchmark/cpu]

For each seed, the row's run `{pair}_four_tensor_{row}_s{seed}` (a folder in one of RUNS_DIR, holding the
selected checkpoint in `best/`) is scored as it is and with a coherence head trained on it with the same seed
(the predictor frozen; `world_model.training.coherence`, which also writes the head into `best/`): Story Cloze
with the decision rule chosen on the val half, the test half reported, and next-sentence retrieval
(`world_model.evaluation.coherence`). Each seed's figures are written to OUT/seeds/{row}_s{seed}.json as soon as
they exist, and a later call skips them, so the seeds can be done in pieces. The report (OUT/results.json and
OUT/results.md) gives every seed, the mean with its 95% interval, and paired differences by seed: the head
against its own predictor, and both against the paper's 4-tensor row of the reference benchmark, whose Story
Cloze comes from its committed story_cloze.json, read with the rule of higher val accuracy (summed or per token).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from world_model.benchmark.markdown import fmt_interval
from world_model.data.rocstories import load_cloze_halves
from world_model.evaluation import coherence as coh
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.seed_stats import mean_interval, paired_difference
from world_model.models.registry import load_predictor
from world_model.training.coherence import train_coherence_heads
from world_model.utils.cli import check_output
from world_model.utils.files import write_json_atomic, write_text_atomic
from world_model.utils.flags import settings_main

FIGURES = ("test", "val", "recall_at_1", "recall_at_10", "mrr")  # per scorer, in the report's column order


def run_folder(runs: list[Path], name: str) -> Path:
    """The first folder RUNS_DIR/name of `runs` that holds a selected checkpoint (best/config.json)."""
    for root in runs:
        if (root / name / "best" / "config.json").is_file():
            return root / name
    raise FileNotFoundError(
        f"no run {name} with a selected checkpoint (best/config.json) under {', '.join(map(str, runs))}"
    )


def figures(report: dict) -> dict:
    """A coherence report's figures: Story Cloze test and val under its rule, the rule, recall@1/@10 and MRR."""
    return {
        "rule": report["rule"],
        "test": report["test"],
        "val": report["val"],
        **{k: report["retrieval"][k] for k in ("recall_at_1", "recall_at_10", "mrr")},
    }


def seed_record(folder: Path, data: str, seed: int) -> dict:
    """One seed's record: the run's L_S(4), its predictor's coherence figures and those of a head trained on it."""
    checkpoint = folder / "best"
    model, vocab, _ = load_predictor(checkpoint)
    report = coh.coherence_report(sc.model_scorer(model), load_cloze_halves(data), vocab, model.config.n_tokens)
    ((_, head_report),) = train_coherence_heads(checkpoint, data, (seed,), checkpoint)
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "seed": seed,
        "run": folder.name,
        "ls4": summary["best_metrics"]["val_last_ce"],
        "best_epoch": summary["best_epoch"],
        "predictor": figures(report),
        "head": {**figures(head_report), **{k: head_report["head"][k] for k in ("epoch", "likelihood_weight")}},
    }


def reference_cloze(reference: Path, pair: str, seed: int) -> dict | None:
    """The reference benchmark's paper 4-tensor run of `seed`: its Story Cloze test and val under the rule of
    higher val accuracy, and its L_S(4); None when the run is not there."""
    folder = reference / "runs" / f"{pair}_four_tensor_s{seed}"
    if not (folder / "story_cloze.json").is_file():
        return None
    cloze = json.loads((folder / "story_cloze.json").read_text())
    rule = max(("summed", "per_token"), key=lambda r: cloze["val"][r])
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "rule": rule,
        "test": cloze["test"][rule],
        "val": cloze["val"][rule],
        "ls4": summary["best_metrics"]["val_last_ce"],
    }


def summarise(records: list[dict], references: dict[int, dict]) -> dict:
    """Means with intervals of every figure, and the paired differences by seed (module docstring)."""
    by_seed = {r["seed"]: r for r in records}
    means = {
        scorer: {k: mean_interval([r[scorer][k] for r in records]) for k in FIGURES} for scorer in ("predictor", "head")
    }
    means["ls4"] = mean_interval([r["ls4"] for r in records])

    def paired(first, second, keys):
        return {k: paired_difference(first(k), second(k)) for k in keys}

    def of(scorer):
        return lambda k: {s: r[scorer][k] for s, r in by_seed.items()}

    def paper(k):
        return {s: ref[k] for s, ref in references.items()}

    return {
        "means": means,
        "paired": {
            "head - predictor": paired(of("head"), of("predictor"), FIGURES),
            "predictor - paper 4-tensor": paired(of("predictor"), paper, ("test", "val")),
            "head - paper 4-tensor": paired(of("head"), paper, ("test", "val")),
        },
    }


def with_interval(stats: dict, spec: str, scale: float = 1.0) -> str:
    """A mean and its 95% interval (when it has one), each scaled and formatted with `spec`: "m [lo, hi]"."""
    ci = stats["ci95"]
    interval = fmt_interval(None if ci is None else [scale * c for c in ci], spec)
    mean = format(scale * stats["mean"], spec)
    return mean if interval is None else f"{mean} {interval}"


def percent(stats: dict) -> str:
    return with_interval(stats, ".1%")


def number(stats: dict) -> str:
    return with_interval(stats, ".3f")


def difference(stats: dict, as_percent: bool) -> str:
    """A paired difference: mean [interval] over its seeds, in points or plain units."""
    if not stats["n"]:
        return "-"
    return with_interval(stats, "+.1f", 100) + " pts" if as_percent else with_interval(stats, "+.3f")


def markdown(results: dict) -> str:
    row, records, summary = results["row"], results["seeds"], results["summary"]
    lines = [
        f"# Coherence rows: `{row}` with and without a coherence head",
        "",
        f"Command: `{results['command']}`",
        "",
        "Story Cloze: the test half, read with the rule chosen on the val half (val in brackets). "
        "Retrieval: the right ending among 100 candidates, over the stories of both halves. The head is trained on the "
        "frozen predictor with the run's seed (`world_model.training.coherence`). L_S(4) is the predictor's and is "
        "not changed by the head.",
        "",
        "| seed | L_S(4) | predictor: Story Cloze test (val), rule | R@1 | R@10 | MRR | + head: test (val) | R@1 | R@10 | MRR |",
        "|---:|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in records:
        p, h = r["predictor"], r["head"]
        lines.append(
            f"| {r['seed']} | {r['ls4']:.3f} | {p['test']:.1%} ({p['val']:.1%}), {p['rule']} | {p['recall_at_1']:.3f} | "
            f"{p['recall_at_10']:.3f} | {p['mrr']:.3f} | {h['test']:.1%} ({h['val']:.1%}) | {h['recall_at_1']:.3f} | "
            f"{h['recall_at_10']:.3f} | {h['mrr']:.3f} |"
        )
    m = summary["means"]
    p, h = m["predictor"], m["head"]
    lines += [
        f"| mean [95% interval] | {number(m['ls4'])} | {percent(p['test'])} ({percent(p['val'])}) | "
        f"{number(p['recall_at_1'])} | {number(p['recall_at_10'])} | {number(p['mrr'])} | {percent(h['test'])} "
        f"({percent(h['val'])}) | {number(h['recall_at_1'])} | {number(h['recall_at_10'])} | {number(h['mrr'])} |",
        "",
        "Paired differences by seed (mean [95% interval]):",
        "",
        "| comparison | Story Cloze test | val | R@1 | R@10 | MRR |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, d in summary["paired"].items():
        cells = [difference(d[k], k in ("test", "val")) if k in d else "" for k in FIGURES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    refs = results["references"]
    if refs:
        lines += [
            "",
            "The paper's 4-tensor row (reference benchmark, by seed): "
            + "; ".join(
                f"seed {s}: {r['test']:.1%} test ({r['val']:.1%} val, {r['rule']}), L_S(4) {r['ls4']:.3f}"
                for s, r in sorted(refs.items())
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class CoherenceRowSettings:
    """Which benchmark runs get coherence figures and a head, and where the report goes."""

    runs: tuple[str, ...] = field(metadata={"help": "folders holding the benchmark's run folders (searched in order)"})
    data: str = field(metadata={"help": "ROCStories folder (training stories and the cloze halves)"})
    out: str = field(metadata={"help": "report folder: seeds/*.json, results.json, results.md"})
    row: str = field(default="causal_copy", metadata={"help": "the 4-tensor variant (or four_tensor) of the runs"})
    pair: str = field(default="h4_l2", metadata={"help": "the benchmark pair of the runs"})
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={"help": "seeds to score (finished ones are skipped)"})
    reference: str = field(
        default="results/benchmark/cpu", metadata={"help": "benchmark folder with the paper's 4-tensor runs"}
    )


def run_name(pair: str, row: str, seed: int) -> str:
    return f"{pair}_four_tensor_s{seed}" if row == "four_tensor" else f"{pair}_four_tensor_{row}_s{seed}"


def coherence_rows_command(settings: CoherenceRowSettings, command: str) -> dict:
    """The command's work: check --out, score the seeds not yet scored, then write and print the report."""
    out = Path(settings.out)
    inputs = {"data folder": settings.data, **{f"runs folder {i + 1}": runs for i, runs in enumerate(settings.runs)}}
    check_output(out, "--out", inputs, overwrite=True)  # a report folder that a rerun continues (seeds/ are kept)
    (out / "seeds").mkdir(parents=True, exist_ok=True)
    records = []
    for seed in settings.seeds:
        path = out / "seeds" / f"{settings.row}_s{seed}.json"
        if not path.is_file():
            folder = run_folder([Path(r) for r in settings.runs], run_name(settings.pair, settings.row, seed))
            write_json_atomic(path, seed_record(folder, settings.data, seed))
        records.append(json.loads(path.read_text()))
    references = {
        s: ref for s in settings.seeds if (ref := reference_cloze(Path(settings.reference), settings.pair, s))
    }
    results = {
        "command": command,
        "row": settings.row,
        "seeds": records,
        "references": references,
        "summary": summarise(records, references),
    }
    write_json_atomic(out / "results.json", results)
    report = markdown(results)
    write_text_atomic(out / "results.md", report)
    print(report, end="")
    return results


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        CoherenceRowSettings,
        "world_model.benchmark.coherence_rows",
        __doc__.split("\n\n")[0],
        coherence_rows_command,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())

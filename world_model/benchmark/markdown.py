"""results.md: the benchmark's tables in the layout of the paper's Table 5, per pair, over seeds, the count floors,
Story Cloze, the paper-preset check and the paper's reported numbers, then the notes; and the formatting helpers
the reports share."""

from __future__ import annotations

import math
from pathlib import Path

from world_model.benchmark import attention_report
from world_model.benchmark.paper import PAPER_REPORTED, PAPER_VOCAB_SIZE
from world_model.benchmark.preset import MODEL_LABELS, row_label, seed_suffix
from world_model.benchmark.runs import FIGURE
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.floors import floor_settings
from world_model.utils.files import write_text_atomic


# ----- formatting -----
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


def fmt_mean_sd(stats: dict, spec: str) -> str:
    if stats.get("mean") is None:
        return "—"
    return format(stats["mean"], spec) + (f" ± {format(stats['sd'], spec)}" if stats.get("sd") is not None else "")


def fmt_interval(ci: list[float] | None, spec: str = "+.4f") -> str | None:
    """A 95% interval as "[lo, hi]", or None when there is none (one seed)."""
    return None if ci is None else f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"


def table_runs(results: dict) -> list[dict]:
    """The run records listed one per line: the pairs' runs and the variants, less the attention variants (they
    have their own table)."""
    attention_variants = {a["run_dir"] for a in results.get("attention", [])}
    return results["runs"] + [v for v in results.get("variants", []) if v["run_dir"] not in attention_variants]


# ----- results.md -----
def write_markdown(results: dict, path: Path) -> None:
    lines = settings_lines(results) + runs_table_lines(results) + pairs_table_lines(results)
    lines += seed_lines(results) + floor_markdown_lines(results) + story_cloze_markdown_lines(results)
    lines += coherence_markdown_lines(results)
    lines += ["", f"![L_S(4) per epoch]({FIGURE})"]
    if results.get("attention"):
        lines += attention_report.markdown_lines(results)
    lines += paper_lines(results)
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
    write_text_atomic(path, "\n".join(lines))


def settings_lines(results: dict) -> list[str]:
    """The title, the command and the settings every run shares."""
    s = results["settings"]
    return [
        f"# Table 5 benchmark: 4-tensor model vs flat baseline (preset `{results['preset']['name']}`)",
        "",
        f"Command: `{results['command']}`",
        "",
        "Settings shared by every run: "
        + ", ".join(f"{k} {v}" for k, v in results["preset"]["model"].items())
        + "; "
        + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in shared_training(results).items())
        + f"; training subset: {s['train_subset'] or 'all'} stories "
        f"({results.get('train_windows')} windows); validation: {results.get('validation_windows')} windows; "
        f"time budget: {fmt(s['max_minutes'], '.1f') + ' min for the command' if s['max_minutes'] else 'none'}"
        + (f" ({s['share_minutes']:.2f} min per run)" if s.get("share_minutes") else "")
        + ".",
    ]


def shared_training(results: dict) -> dict:
    """The preset's training settings as run: the command's epoch cap, and its seeds (when it ran a list of seeds)
    in place of the single seed."""
    training = {**results["preset"]["training"], "max_epochs": results["settings"]["max_epochs"]}
    seeds = results["settings"]["seeds"]
    if not seeds:
        return training
    return {**{k: v for k, v in training.items() if k != "seed"}, "seeds": seeds_text(results["settings"])}


def seeds_text(settings: dict) -> str:
    """The seeds run: "0, 1, 2", or, when rows run different seeds, the most common list and the rows that differ,
    e.g. "0 (0, 1, 2: four_tensor, baseline, tucker_4_11_11)"."""
    lists = {row: ", ".join(map(str, seeds)) for row, seeds in (settings.get("row_seeds") or {}).items() if seeds}
    if len(set(lists.values())) <= 1:
        return ", ".join(str(seed) for seed in settings["seeds"])
    texts = list(lists.values())
    common = max(dict.fromkeys(texts), key=texts.count)
    others: dict[str, list[str]] = {}
    for row, text in lists.items():
        if text != common:
            others.setdefault(text, []).append(row)
    return common + " (" + "; ".join(f"{text}: {', '.join(rows)}" for text, rows in others.items()) + ")"


def runs_table_lines(results: dict) -> list[str]:
    """One row per run (and per variant that is not an attention variant) at its selected checkpoint."""
    lines = [
        "",
        "## Runs at the selected checkpoint (layout of the paper's Table 5)",
        "",
        "Epoch is selected/last; the checkpoint is the minimum of each model's own validation selection loss "
        "(4-tensor: window cross-entropy on S(1..4); baseline: free-running cross-entropy of S(4) + [EOS]). "
        "L_S(4) is the mean cross-entropy on the non-padding tokens of the last sentence; accuracy is the argmax "
        "match rate on the same tokens; perplexity = exp(L_S(4)).",
        "",
        "| pair | H | L | model | parameters | epoch | stopped by | L_S(4) | token acc. | perplexity "
        "| time to selected | total time | train windows/s |",
        "|---|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table_runs(results):
        lines.append(
            f"| {r['pair']}{seed_suffix(r)} | {r['n_heads']} | {r['n_layers']} | {row_label(r).split(' ', 1)[1]} | "
            f"{r['parameters']:,} | {r['best_epoch']}/{r['last_epoch']} | {r['stopped_by']} | "
            f"{fmt(r['val_last_ce'], '.4f')} | {fmt(r['val_token_accuracy'], '.4f')} | {fmt(r['val_perplexity'], '.1f')} | "
            f"{fmt_seconds(r['wall_seconds_to_best'])} | {fmt_seconds(r['wall_seconds_total'])} | "
            f"{fmt(r['train_windows_per_second'], '.1f')} |"
        )
    return lines


def pairs_table_lines(results: dict) -> list[str]:
    """One row per pair (and seed): Δ L_S(4), the lowest L_S(4) over all epochs, the time and parameter ratios."""
    lines = [
        "",
        "## Per pair",
        "",
        "Δ L_S(4) = baseline − 4-tensor (positive: the 4-tensor model is lower). Time ratio = baseline / 4-tensor, "
        "wall time to the selected checkpoint, measured in this run.",
        "",
        "| pair | Δ L_S(4) | lowest L_S(4) over all epochs, 4-tensor / baseline (Δ) | time-to-selected ratio "
        "| total-time ratio | parameters, baseline / 4-tensor | matched |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    by = {(r["pair"], r.get("seed"), r["model_type"]): r for r in results["runs"]}
    for p in results["pairs"]:
        name = p["pair"] + seed_suffix(p)
        if not p["complete"]:
            lines.append(f"| {name} | — | — | — | — | — | incomplete |")
            continue
        f4, fb = by[(p["pair"], p.get("seed"), "four_tensor")], by[(p["pair"], p.get("seed"), "baseline")]
        lines.append(
            f"| {name} | {fmt(p['delta_last_ce'], '+.4f')} | "
            f"{fmt(f4['lowest_val_last_ce'], '.4f')} (ep {f4['lowest_val_last_ce_epoch']}) / "
            f"{fmt(fb['lowest_val_last_ce'], '.4f')} (ep {fb['lowest_val_last_ce_epoch']}) "
            f"({fmt(p['delta_lowest_last_ce'], '+.4f')}) | "
            f"{fmt(p['time_to_best_ratio'], '.2f')} | {fmt(p['total_time_ratio'], '.2f')} | "
            f"{fmt(p['parameter_ratio'], '.3f')} | {'yes' if p['matched'] else 'NO'} |"
        )
    return lines


def paper_lines(results: dict) -> list[str]:
    """The parameter check of the paper preset, and the paper's reported numbers for reference."""
    lines = [
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
    return lines


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
        lines.append(
            f"| {p['pair']} | {p['comparison']} | {', '.join(map(str, p['seeds']))} | "
            f"{', '.join(f'{d:+.4f}' for d in p['differences'])} | {fmt(p['mean'], '+.4f')} | "
            f"{fmt_interval(p['ci95']) or '— (one seed)'} |"
        )
    return lines


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
        f"their settings chosen on the last {sel['heldout_windows']} of them (held out, {sel['heldout_fraction']:g}), "
        "then refitted on all; scored on the validation tokens of the table above (world_model/evaluation/floors/).",
        "",
        "| floor | settings | held-out L_S(4) | L_S(4) | token acc. | perplexity |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for f in floors["rows"]:
        lines.append(
            f"| {f['floor']} | {floor_settings(f)} | {f['heldout_last_ce']:.4f} | {f['val_last_ce']:.4f} | "
            f"{f['val_token_accuracy']:.4f} | {math.exp(f['val_last_ce']):.1f} |"
        )
    position = next(f["val_last_ce"] for f in floors["rows"] if f["floor"] == "position_unigram")
    last = floors["last_sentence"]
    return lines + [
        "",
        "The floors, like the 4-tensor readout, are scored on live slots only, so they are told for free that S(4) has "
        "not ended. The free-running baseline is not: its L_S(4) includes the mass it gives [EOS] at every step. A count "
        f"of where the training sentences end pays {floors['end_cost']:.4f} nats a token for that, so the "
        f"position-unigram floor of a writer that must say where S(4) ends is {position + floors['end_cost']:.4f} "
        "(`python -m world_model.evaluation.evaluate` prints a baseline checkpoint's own end cost).",
        "",
        "The floors count all five sentences of every training window; the flat baseline is trained on the tokens of "
        "S(4) alone (section 7.4). The position unigram counted on the training S(4) slots only (alpha "
        f"{last['alpha']:g}, chosen on the same held-out slice) scores {last['val_last_ce']:.4f}, and "
        f"{last['val_last_ce'] + floors['end_cost']:.4f} with the end cost: what counting learns from the baseline's "
        "own training tokens.",
    ]


def story_cloze_markdown_lines(results: dict) -> list[str]:
    """Story Cloze accuracy of every run's selected checkpoint and of the floors, beside the published points."""
    rows = [
        (row_label(r) + seed_suffix(r), r.get("story_cloze")) for r in results["runs"] + results.get("variants", [])
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


def coherence_markdown_lines(results: dict) -> list[str]:
    """Story Cloze with the decision rule chosen on the val half, and next-sentence retrieval, of every run and floor
    that has a coherence report (`world_model.evaluation.coherence`); runs finished before the report existed are
    listed with a dash."""
    rows = [(row_label(r) + seed_suffix(r), r.get("coherence")) for r in results["runs"] + results.get("variants", [])]
    rows += [(f"floor: {f['floor']}", f.get("coherence")) for f in (results.get("floors") or {}).get("rows", [])]
    if not any(c for _, c in rows):
        return []
    lines = [
        "",
        "## Coherence: Story Cloze by a rule chosen on val, and retrieval",
        "",
        "The decision rule (summed, per token, or either as a ratio against the scorer's own blank-context estimate) "
        "is the one of highest accuracy on the val half; the test half read with it is the result. Retrieval ranks "
        "the right ending among 100 candidates (its wrong ending and 98 other stories' right endings) for every "
        "cloze story (world_model/evaluation/coherence.py; chance: R@1 0.01, R@10 0.10, MRR about 0.05).",
        "",
        "| model | rule | Story Cloze test | val | R@1 | R@10 | MRR |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, c in rows:
        if not c:
            lines.append(f"| {label} | — | — | — | — | — | — |")
            continue
        r = c["retrieval"]
        lines.append(
            f"| {label} | {c['rule']} | {c['test']:.1%} | {c['val']:.1%} | {r['recall_at_1']:.3f} | "
            f"{r['recall_at_10']:.3f} | {r['mrr']:.3f} |"
        )
    return lines

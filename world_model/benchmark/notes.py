"""The notes of results.md (and results.json["notes"]): what a reader needs to read the tables right: the preset's
scale, the vocabulary, why each run stopped, each pair's verdict, the closest parameter match, and the machine."""

from __future__ import annotations

import math

from world_model.benchmark import attention_report
from world_model.benchmark.markdown import fmt
from world_model.benchmark.paper import PAPER_VOCAB_SIZE
from world_model.benchmark.preset import row_label, seed_suffix
from world_model.benchmark.reuse import reuse_notes


def notes_for(results: dict) -> list[str]:
    """Every note, in the order results.md lists them."""
    notes = setting_notes(results)
    runs = results["runs"] + results.get("variants", [])
    for r in runs:
        notes += run_notes(r)
    for p in results["pairs"]:
        notes += pair_notes(p)
    earlier = [row_label(r) + seed_suffix(r) for r in runs if r.get("skipped_by_resume") and not r.get("reused_from")]
    if earlier:
        notes.append(
            f"Trained by an earlier invocation (found finished in the out folder by --resume or --report-only, not "
            f"trained again): {', '.join(earlier)}; their times were measured then, under that invocation's machine "
            "load."
        )
    notes += closest_match_notes(results["pairs"])
    notes += attention_report.notes(results)
    notes += reuse_notes(results)
    notes.append(machine_note(results))
    return notes


def setting_notes(results: dict) -> list[str]:
    """A scaled-down preset, and a vocabulary other than the paper's."""
    notes = []
    preset, settings = results["preset"], results["settings"]
    if preset["name"] != "paper":
        notes.append(
            f"Scaled-down preset '{preset['name']}': d_x = {preset['model'].get('d_x')}, "
            f"d_t = {preset['model'].get('d_t')}, at most {settings['max_epochs']} epoch(s)"
            + (f", the first {settings['train_subset']} training stories" if settings["train_subset"] else "")
            + ". Absolute numbers are not comparable with the paper's Table 5; the comparison is between the two models "
            "of each pair, trained on the same windows at the same settings."
        )
    vocab = results["corpus_statistics"].get("vocab_size")
    if vocab is not None and vocab != PAPER_VOCAB_SIZE:
        notes.append(
            f"The vocabulary here has {vocab:,} tokens (the paper's {PAPER_VOCAB_SIZE:,} come from the full "
            f"101,671-story pool); a uniform guess scores ln {vocab:,} = {math.log(vocab):.2f} nats."
        )
    return notes


def run_notes(r: dict) -> list[str]:
    """One run or variant record's notes: a stop other than the rule's, a minimum of L_S(4) off the selected epoch,
    a resume."""
    notes = []
    label = row_label(r) + seed_suffix(r)
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
            f"{label}: resumed after epoch {r['resumed_from_epoch']}; its wall times add the time before and after "
            "the interruption."
        )
    return notes


def pair_notes(p: dict) -> list[str]:
    """One pair record's notes: incomplete, or its Δ L_S(4) and whether its runs are matched."""
    name = p["pair"] + seed_suffix(p)
    if not p["complete"]:
        return [f"{name}: incomplete, only one of the two runs has finished."]
    notes = []
    if p["delta_last_ce"] is None:
        notes.append(f"{name}: no Δ L_S(4): a run has no finite validation epoch.")
    else:
        lead = "4-tensor ahead" if p["delta_last_ce"] > 0 else "baseline ahead" if p["delta_last_ce"] < 0 else "a tie"
        notes.append(
            f"{name}: Δ L_S(4) = {p['delta_last_ce']:+.4f} nats at the selected checkpoints ({lead}); "
            f"over all logged epochs {fmt(p['delta_lowest_last_ce'], '+.4f')}."
        )
    if not p["matched"]:
        notes.append(f"{name}: the two runs are NOT matched: " + "; ".join(p["mismatches"]))
    return notes


def closest_match_notes(pairs: list[dict]) -> list[str]:
    """The verdict at the pair whose two models' parameter counts are closest, as the paper's h4_l2."""
    ranked = [p for p in pairs if p["complete"] and p["parameter_ratio"] and p["delta_last_ce"] is not None]
    if not ranked:
        return []
    close = min(ranked, key=lambda p: abs(math.log(p["parameter_ratio"])))
    verdict = "the 4-tensor model is ahead" if close["delta_last_ce"] > 0 else "the 4-tensor model is NOT ahead"
    return [
        f"Closest parameter match here: {close['pair']}{seed_suffix(close)} (baseline / 4-tensor parameters "
        f"{close['parameter_ratio']:.3f}); there {verdict} (Δ L_S(4) {close['delta_last_ce']:+.4f}). "
        "In the paper it is h4_l2 (175.9M / 172.5M), Δ +0.147."
    ]


def machine_note(results: dict) -> str:
    """Where the times come from, and the seeds."""
    m, settings = results["machine"], results["settings"]
    return (
        f"Times are this machine's ({m['cpu_count']} CPU(s), torch {m['torch']} with {m['torch_threads']} thread(s), "
        f"device {m['device']}; load average {m['load_average_start']} at the start, "
        f"{m.get('load_average_end')} at the end). "
        "Wall times are train()'s epoch clock (training and validation, not process start-up); "
        "windows/s is training windows over training time. "
        + (
            f"Seeds: {', '.join(map(str, settings['seeds']))} (mean ± sd over them and paired 95% intervals "
            "under 'Over seeds')."
            if settings.get("seeds")
            else "A single seed per cell."
        )
    )

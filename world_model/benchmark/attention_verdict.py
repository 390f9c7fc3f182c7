"""The verdict of the attention rows (world_model/benchmark/attention.py) on the Tucker Attention paper's claim:
Tucker Attention needs an order of magnitude fewer attention parameters than GQA and MLA for comparable quality.

For this task, "comparable" is: within WITHIN_PERCENT (1%) of the reference's L_S(4) (the baseline's MHA, the
4-tensor model's dense Q/K/V), judged by the 95% interval of the per-seed Δ% paired by seed where a row has two or
more seeds in common with its reference (its upper end at most 1%), by the Δ% of the one common seed (seed 0)
otherwise. Per pair and family (GQA, MLA, Tucker for the baseline; Tucker for the 4-tensor model) the verdict is
the largest attention-parameter ratio (reference / row) of a row of the family within 1%; only rows with fewer
attention parameters than the reference count (the MHA-equivalent Tucker row is a check that it matches MHA, not
a compression). The claim holds at a pair when Tucker's largest ratio is at least ORDER_OF_MAGNITUDE (10) times
GQA's and MLA's; a family with no row within 1% counts at 1x (comparable quality only at the reference's size:
MHA is GQA with n_KV = n_H), and is said so.

Seed noise: for each reference with two or more seeds, the sample standard deviation of its per-seed L_S(4) as a
percent of their mean, the scale against which a one-seed Δ% (and the 1% line) is read.

Findings flagged on the rows: not below the position-unigram count floor (world_model/evaluation/floors/; the
mean L_S(4) of the row is not lower than that floor's, for the baseline too, whose fairer floor adds the end cost
and is only named), and not converged (a seed whose run stopped on the epoch
cap at its best epoch, still improving).
"""

from __future__ import annotations

from world_model.benchmark.attention import REFERENCE
from world_model.benchmark.preset import MODEL_LABELS
from world_model.evaluation.seed_stats import mean_sd

WITHIN_PERCENT = 1.0
ORDER_OF_MAGNITUDE = 10.0
FAMILIES = (("baseline", "gqa"), ("baseline", "mla"), ("baseline", "tucker"), ("four_tensor", "tucker"))
FAMILY_LABELS = {"gqa": "GQA", "mla": "MLA", "tucker": "Tucker"}
POSITION_FLOOR = "position_unigram"


def within(row: dict) -> tuple[bool | None, str]:
    """(whether `row` is within WITHIN_PERCENT of its reference's L_S(4), on what basis); None without a Δ%."""
    if row["delta_percent"] is None:
        return None, "no finished reference run of the same seed"
    seeds, delta = ", ".join(str(s) for s in row["delta_seeds"]), row["delta_percent"]
    if row["delta_percent_ci95"] is not None:
        low, high = row["delta_percent_ci95"]
        basis = f"mean Δ {delta:+.2f}%, paired 95% interval [{low:+.2f}%, {high:+.2f}%] over seeds {seeds}"
        return high <= WITHIN_PERCENT, basis
    return delta <= WITHIN_PERCENT, f"seed-{seeds} Δ {delta:+.2f}%"


def row_findings(row: dict, position_floor: float | None) -> list[str]:
    """The row's flags: not below the position-unigram floor, not converged (with the seeds)."""
    flags = []
    if position_floor is not None and row["val_last_ce"] is not None and row["val_last_ce"] >= position_floor:
        flags.append("not below the position-unigram floor")
    if row["not_converged_seeds"]:
        flags.append("not converged (seed " + ", ".join(str(s) for s in row["not_converged_seeds"]) + ")")
    return flags


def family_verdict(rows: list[dict], pair: str, model_type: str, kind: str) -> dict:
    """One family's verdict at one pair: its compressing rows with their test, the largest ratio within 1%."""
    tested = []
    for r in rows:
        if (r["pair"], r["model_type"], r["kind"], r["variant"] == REFERENCE) != (pair, model_type, kind, False):
            continue
        if r["attention_ratio"] is None or r["attention_ratio"] <= 1:
            continue
        ok, basis = within(r)
        tested.append({"variant": r["variant"], "attention_ratio": r["attention_ratio"], "within": ok, "basis": basis})
    passing = [t for t in tested if t["within"]]
    best = max(passing, key=lambda t: t["attention_ratio"]) if passing else None
    return {
        "pair": pair,
        "model_type": model_type,
        "family": kind,
        "rows": tested,
        "largest_ratio": best and best["attention_ratio"],
        "at": best and best["variant"],
        "basis": best and best["basis"],
    }


def claim_check(families: list[dict], pair: str) -> dict | None:
    """Does baseline Tucker stay within 1% at >= 10x the ratio GQA and MLA reach? None while a family is untested."""
    by_kind = {f["family"]: f for f in families if f["pair"] == pair and f["model_type"] == "baseline"}
    if any(not by_kind.get(k, {}).get("rows") for k in ("gqa", "mla", "tucker")):
        return None
    tucker = by_kind["tucker"]["largest_ratio"]
    others = {k: by_kind[k]["largest_ratio"] or 1.0 for k in ("gqa", "mla")}
    return {
        "pair": pair,
        "tucker_ratio": tucker,
        "gqa_ratio": others["gqa"],
        "mla_ratio": others["mla"],
        "none_within": [k for k in ("gqa", "mla") if by_kind[k]["largest_ratio"] is None],
        "factor_needed": ORDER_OF_MAGNITUDE,
        "met": tucker is not None and all(tucker >= ORDER_OF_MAGNITUDE * r for r in others.values()),
    }


def seed_noise(rows: list[dict]) -> list[dict]:
    """Per reference row with two or more seeds: {"pair", "model_type", "seeds", "sd_percent"}, the sample standard
    deviation of its per-seed L_S(4) in percent of their mean."""
    noise = []
    for r in rows:
        stats = mean_sd(r.get("val_last_ce_per_seed") or [])
        if r["variant"] == REFERENCE and stats["sd"] is not None:
            noise.append(
                {
                    "pair": r["pair"],
                    "model_type": r["model_type"],
                    "seeds": r["seeds"],
                    "sd_percent": 100 * stats["sd"] / stats["mean"],
                }
            )
    return noise


def attention_verdict(rows: list[dict], floors: dict | None) -> dict:
    """results.json["attention_verdict"]: {"within_percent", "position_floor", "families", "claims", "checks"
    (MHA-equivalent rows against MHA), "seed_noise" (`seed_noise`), "findings": {row label: [flags]}}."""
    floor_rows = {f["floor"]: f for f in (floors or {}).get("rows", [])}
    position = floor_rows[POSITION_FLOOR]["val_last_ce"] if POSITION_FLOOR in floor_rows else None
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    families = [
        family_verdict(rows, pair, model_type, kind)
        for pair in pairs
        for model_type, kind in FAMILIES
        if any(r["pair"] == pair and r["model_type"] == model_type and r["kind"] == kind for r in rows)
    ]
    checks = []
    for r in rows:
        if r["mha_equivalent"]:
            ok, basis = within(r)
            checks.append(
                {
                    "pair": r["pair"],
                    "variant": r["variant"],
                    "delta_percent": r["delta_percent"],
                    "within": ok,
                    "basis": basis,
                }
            )
    findings = {label(r): row_findings(r, position) for r in rows}
    return {
        "within_percent": WITHIN_PERCENT,
        "position_floor": position,
        "end_cost": (floors or {}).get("end_cost"),
        "families": families,
        "claims": [c for c in (claim_check(families, pair) for pair in pairs) if c is not None],
        "checks": checks,
        "seed_noise": seed_noise(rows),
        "findings": {k: v for k, v in findings.items() if v},
    }


def label(row: dict) -> str:
    """An attention row's name in the verdict: "h4_l2 baseline tucker_4_11_11"."""
    return f"{row['pair']} {MODEL_LABELS[row['model_type']]} {row['variant']}"


def verdict_lines(verdict: dict) -> list[str]:
    """The verdict in plain sentences, for results.md."""
    pct = f"{verdict['within_percent']:g}%"
    lines = [
        "",
        f"### Verdict: the largest ratio within {pct} of the reference's L_S(4)",
        "",
        f"Within {pct}: the upper end of the 95% interval of Δ% paired by seed is at most {pct} where a row has two "
        f"or more seeds in common with its reference, else its seed-0 Δ% is (the basis is named). Only rows with "
        "fewer attention parameters than their reference count.",
        "",
    ]
    for f in verdict["families"]:
        who = f"{f['pair']} {MODEL_LABELS[f['model_type']]} {FAMILY_LABELS[f['family']]}"
        tested = "; ".join(
            f"{t['variant']} {t['attention_ratio']:.2f}x: "
            + {True: "within", False: "NOT within", None: "untested"}[t["within"]]
            + f" ({t['basis']})"
            for t in f["rows"]
        )
        if f["largest_ratio"] is None:
            lines.append(f"- {who}: no row within {pct} ({tested or 'no finished row'}).")
        else:
            lines.append(
                f"- {who}: within {pct} up to {f['largest_ratio']:.2f}x fewer attention parameters, at {f['at']} ({tested})."
            )
    for c in verdict["claims"]:
        counted = "".join(
            f" {FAMILY_LABELS[k]} has no row within {pct}: counted at 1x (the reference's size)."
            for k in c["none_within"]
        )
        tucker = "no Tucker row within " + pct if c["tucker_ratio"] is None else f"Tucker {c['tucker_ratio']:.2f}x"
        lines.append(
            f"- **The Tucker paper's claim at {c['pair']}** (Tucker within {pct} at >= {c['factor_needed']:g}x the "
            f"ratio of GQA and MLA): {'MET' if c['met'] else 'NOT met'}: {tucker}, GQA {c['gqa_ratio']:.2f}x, "
            f"MLA {c['mla_ratio']:.2f}x.{counted}"
        )
    for c in verdict["checks"]:
        state = {True: "matches MHA within " + pct, False: "does NOT match MHA within " + pct, None: "not compared yet"}
        delta = "" if c["delta_percent"] is None else f" ({c['basis']})"
        lines.append(
            f"- Check: {c['pair']} baseline {c['variant']} can represent MHA exactly; it {state[c['within']]}{delta}."
        )
    for n in verdict.get("seed_noise", []):
        seeds = ", ".join(str(s) for s in n["seeds"])
        lines.append(
            f"- Seed noise: the {n['pair']} {MODEL_LABELS[n['model_type']]} reference's L_S(4) has a standard deviation "
            f"of {n['sd_percent']:.2f}% of its mean over seeds {seeds}; a one-seed Δ% is a single draw against it."
        )
    if verdict["position_floor"] is not None:
        lines.append(
            f"- Position-unigram count floor: L_S(4) {verdict['position_floor']:.4f}, the line the flag below uses for "
            "both models"
            + (
                f" (a free-running baseline also pays for where S(4) ends: {verdict['position_floor'] + verdict['end_cost']:.4f} "
                "with the end cost, see the count floors above)."
                if verdict.get("end_cost") is not None
                else "."
            )
        )
    by_flag: dict[str, list[str]] = {}
    for name, flags in verdict["findings"].items():
        for flag in flags:
            by_flag.setdefault(flag.split(" (")[0], []).append(
                name + (f" ({flag.split(' (')[1]}" if " (" in flag else "")
            )
    for flag, names in by_flag.items():
        lines.append(f"- Finding, {flag}: {', '.join(names)}.")
    return lines

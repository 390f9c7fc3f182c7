"""Statistics over the seeds of a benchmark: mean ± standard deviation per row, paired differences with a
95% Student-t interval.

A benchmark row is one model (a pair's 4-tensor model or baseline, or a variant of one of them) trained
once per seed on the same windows; the seeds change the initial weights, the batch order and dropout.
Differences are paired by seed (the same seed gives both runs of a pair the same batch order), so the
interval is that of the mean of the per-seed differences: mean ± t(0.975, n-1) sd / sqrt(n).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

# Two-sided 95% quantiles of Student's t, t(0.975, df), for df = 1..30; 1.96 beyond.
T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
METRICS = ("val_last_ce", "val_token_accuracy")  # summarised for every row


def t_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom, got {df}")
    return T_975[df - 1] if df <= len(T_975) else 1.96


def mean_sd(values: Sequence[float]) -> dict:
    """{"n", "mean", "sd"} of finite values (sd is the sample standard deviation; None below two values)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None}
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": mean, "sd": sd}


def mean_interval(values: Sequence[float]) -> dict:
    """`mean_sd` of the values with "ci95", the Student-t 95% interval of the mean (None below two values)."""
    stats = mean_sd(values)
    if stats["n"] < 2:
        return {**stats, "ci95": None}
    half = t_975(stats["n"] - 1) * stats["sd"] / math.sqrt(stats["n"])
    return {**stats, "ci95": [stats["mean"] - half, stats["mean"] + half]}


def paired_difference(first: dict[int, float], second: dict[int, float]) -> dict:
    """first - second over the seeds both have: {"seeds", "differences", "n", "mean", "sd", "ci95"} (ci95 None below two)."""
    seeds = sorted(s for s in first if s in second and first[s] is not None and second[s] is not None)
    differences = [first[s] - second[s] for s in seeds]
    return {"seeds": seeds, "differences": differences, **mean_interval(differences)}


def row_key(run: dict) -> tuple[str, str, str | None]:
    return run["pair"], run["model_type"], run.get("variant")


def summarise_rows(runs: Iterable[dict]) -> list[dict]:
    """One summary per (pair, model type, variant) in first-seen order: the seeds, each metric's per-seed values and
    mean ± sd, how the runs stopped. `runs` are benchmark run records carrying "seed"."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(row_key(run), []).append(run)
    out = []
    for (pair, model_type, variant), members in groups.items():
        row = {
            "pair": pair,
            "model_type": model_type,
            "variant": variant,
            "seeds": [m.get("seed") for m in members],
            "stopped_by": [m["stopped_by"] for m in members],
            "epochs": [f"{m['best_epoch']}/{m['last_epoch']}" for m in members],
        }
        for metric in METRICS + tuple(k for k in members[0] if k.startswith("cloze_")):
            values = [m.get(metric) for m in members]
            row[metric] = {"values": values, **mean_sd(values)}
        out.append(row)
    return out


def named_row(by_key: dict[tuple, dict], pair: str, name: str) -> tuple | None:
    """The key (pair, model type, variant) of `pair`'s row `name` in `by_key`: a model type names the pair's own
    run of that type, anything else a variant; None while it has no finished run."""
    if name in ("four_tensor", "baseline"):
        return (pair, name, None) if (pair, name, None) in by_key else None
    return next((key for key in by_key if key[0] == pair and key[2] == name), None)


def paired_rows(runs: Sequence[dict], versus: dict[str, Sequence[str]] | None = None) -> list[dict]:
    """The paired comparisons of L_S(4), each "positive: the second-named row is lower":
    per pair, baseline - 4-tensor (the paper's comparison); per variant, its reference (the pair's run of the same
    type) - the variant, then each row that `versus` names for it (a model type or another variant's name) - the
    variant."""
    by_key: dict[tuple, dict[int, float]] = {}
    for run in runs:
        by_key.setdefault(row_key(run), {})[run.get("seed")] = run.get("val_last_ce")
    versus = versus or {}
    out = []
    for pair in dict.fromkeys(run["pair"] for run in runs):
        four, base = by_key.get((pair, "four_tensor", None)), by_key.get((pair, "baseline", None))
        if four and base:
            out.append(
                {
                    "pair": pair,
                    "comparison": "baseline - 4-tensor",
                    "first": "baseline",
                    "second": "four_tensor",
                    **paired_difference(base, four),
                }
            )
        for (p, model_type, variant), values in by_key.items():
            if p != pair or variant is None:
                continue
            for name in dict.fromkeys([model_type, *versus.get(variant, [])]):  # its reference first
                first = named_row(by_key, pair, name)
                if first is None:
                    continue
                comparison = (
                    f"{model_type} reference - {variant}"
                    if name == model_type
                    else f"{first[1]} {first[2] or 'reference'} - {model_type} {variant}"
                )
                out.append(
                    {
                        "pair": pair,
                        "comparison": comparison,
                        "first": name,
                        "second": variant,
                        **paired_difference(by_key[first], values),
                    }
                )
    return out

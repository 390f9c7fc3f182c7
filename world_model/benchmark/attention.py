"""L_S(4) against attention parameters: the low-rank attention rows of the benchmark.

The Tucker Attention paper's Figure 3 plots quality against the total attention parameter count of MHA,
GQA, MLA and Tucker Attention and reads off the Pareto front. This module does the same for a benchmark
preset with a `variants:` section (configs/benchmark/attention.yaml): every variant is one more run of a
pair of the preset, with its own attention form, and is compared with the pair's own run of the same
model type, its reference (the 4-tensor model with dense Q/K/V weights, the baseline with MHA).

Attention parameters are the weights of the query, key, value and output maps of every attention layer,
nothing else (no embeddings, norms or MLPs), as the Tucker paper's Table 1 counts them. Per layer:

    4-tensor, dense       3 H (d_x d_t)^2                     w_qkv; the heads are summed, no output map
    4-tensor, tucker      3 H r_m r_p r_n r_q                 cores
                          + 3 H (d_x r_m + d_t r_p + d_x r_n + d_t r_q)   factors, one set per map and head,
                            or (d_x r_m + d_t r_p + d_x r_n + d_t r_q) once with tucker_shared_factors
    baseline              FamilyAttention.parameter_count (Table 1): MHA 4 d^2, GQA 2 d^2 + 2 n_KV d_H d,
                          MLA d d_c^Q + d_c^Q d + 2 d d_c + 2 d_c d + d^2, Tucker sum over W and W~ of
                          n_H r_1 + d r_2 + d r_3 + r_1 r_2 r_3

KV cache per token (Table 1's "KV Cache" column over N): what a baseline's decoder keeps for every token it has
read, summed over layers, at fp32 (FP32_BYTES a number): MHA 2 n_H d_H, GQA 2 n_KV d_H, MLA 2 d_c (separated
latents; d_c with shared KV; this MLA has no decoupled RoPE part), Tucker r_3 + r~_2 (k~ and v~, 2r at ranks
(r_1, r, r)) numbers per layer (FamilyAttention.kv_cache_size). The 4-tensor model reads a window of states at
once and keeps no per-token cache: None.

OUT receives, next to the Table 5 reports (world_model/benchmark/report.py, markdown.py): results.json["attention"]
(one row per attention row of a pair, over its seeds: attention parameters, ratio to the reference, KV cache per
token, L_S(4), Δ% against the reference paired by seed, Story Cloze, Pareto flag), results.json["attention_target"],
["attention_verdict"] (attention_verdict.py), a section of results.md and ls4_vs_attention_params.png
(attention_report.py); the decode timing of world_model/benchmark/attention_decode.py when it has been measured.
"""

from __future__ import annotations

import torch
from torch import nn

from world_model.evaluation.seed_stats import mean_interval, mean_sd, paired_difference
from world_model.models.registry import build_model

REFERENCE = "reference"  # the variant name of a pair's own run in the rows below
TARGET_RATIO, TARGET_DELTA_PERCENT = 5.0, 1.0  # a Tucker 4-tensor predictor >= 5x smaller attention, within 1%
FP32_BYTES = 4  # bytes of one cached number


# ----- counting -----
def attention_parameter_count(model: nn.Module) -> int:
    """Parameters of the Q/K/V (and output) maps of all attention layers (see the module docstring)."""
    try:
        modules = model.attention_modules()
    except AttributeError:
        raise TypeError(
            f"no attention-parameter count for {type(model).__name__}; known: FourTensorModel, BaselineModel"
        ) from None
    return sum(p.numel() for module in modules for p in module.parameters())


def config_attention_parameters(model_section: dict, vocab_size: int) -> int:
    """attention_parameter_count of the model a config's `model:` section builds, on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = build_model(model_section, vocab_size)
    return attention_parameter_count(model)


def kv_cache_bytes_per_token(model_section: dict, vocab_size: int) -> int | None:
    """Bytes a baseline's KV cache holds per token read, all layers, at fp32 (see the module docstring); None for
    the 4-tensor model. Built on the meta device."""
    if model_section["type"] != "baseline":
        return None
    with torch.device("meta"):
        model = build_model(model_section, vocab_size)
    return FP32_BYTES * model.kv_cache_size(1)


def mha_equivalent(model_section: dict) -> bool:
    """True for a baseline Tucker whose ranks of W and W~ reach (n_H, d, d): it can represent MHA exactly
    (attention_conversions.tucker_from_grouped), so it checks the Tucker form rather than compressing."""
    m = model_section
    if m["type"] != "baseline" or attention_kind(m) != "tucker":
        return False
    full = (m["n_heads"], m["d_x"] * m["d_t"], m["d_x"] * m["d_t"])
    return all(
        all(r >= f for r, f in zip(ranks, full))
        for ranks in (m["tucker_ranks"], m.get("tucker_ranks_out") or m["tucker_ranks"])
    )


def attention_kind(model_section: dict) -> str:
    """ "dense" or "tucker" for the 4-tensor model, the `attention` kind ("mha", "gqa", "mla", "tucker") for the baseline."""
    if model_section["type"] == "four_tensor":
        return model_section.get("qkv_form") or "dense"
    return model_section.get("attention") or "mha"


def attention_form(model_section: dict) -> str:
    """A short description of a run's attention, e.g. "Tucker (10, 5, 10, 5)" or "GQA n_KV 1"."""
    kind, m = attention_kind(model_section), model_section
    if kind == "dense":
        text = "dense"
    elif kind == "mha":
        text = "MHA"
    elif kind == "gqa":
        text = f"GQA n_KV {m['n_kv_heads']}"
    elif kind == "mla":
        text = (
            f"MLA d_c {m['mla_kv_rank']}"
            + (f", d_c^Q {m['mla_q_rank']}" if m.get("mla_q_rank") else "")
            + (", shared KV" if m.get("mla_shared_kv") else "")
        )
    else:
        ranks = m["tucker_ranks"]
        text = f"Tucker ({', '.join(str(r) for r in ranks)})"
        if m.get("tucker_ranks_out") and tuple(m["tucker_ranks_out"]) != tuple(ranks):
            text += f" / ({', '.join(str(r) for r in m['tucker_ranks_out'])})"
        if m.get("tucker_shared_factors"):
            text += ", shared factors"
    return text + (", BitLinear" if m.get("bitlinear") else "")


# ----- the rows -----
ATTENTION_KEYS = (
    "qkv_form",
    "tucker_ranks",
    "tucker_shared_factors",
    "attention",
    "n_kv_heads",
    "mla_kv_rank",
    "mla_q_rank",
    "mla_shared_kv",
    "tucker_ranks_out",
    "bitlinear",
)


def is_attention_variant(overrides: dict) -> bool:
    """True when a variant's model overrides change the attention form (the rows this module reports)."""
    return any(k in overrides for k in ATTENTION_KEYS)


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """For (cost, loss) points: True where no other point has cost <= and loss <= with one of them strictly lower."""
    return [
        not any(c2 <= cost and l2 <= loss and (c2 < cost or l2 < loss) for c2, l2 in points) for cost, loss in points
    ]


def attention_rows(runs: list[dict], variants: list[dict]) -> list[dict]:
    """One row per attention row of a pair that has variants, over its seeds: the pair's reference rows first, then
    its variants.

    `runs` and `variants` are benchmark run records (world_model.benchmark.runs.run_record) carrying
    "attention_parameters" and "seed"; a variant record also carries "variant" and "mismatches" (against its
    reference). See row_record for the fields; the Pareto flag is over the rows of the pair, at their mean L_S(4).
    """
    rows = []
    for pair in dict.fromkeys(v["pair"] for v in variants):
        groups: dict[tuple, list[dict]] = {}  # (model type, variant) -> its runs, in seed order
        for r in [r for r in runs if r["pair"] == pair] + [v for v in variants if v["pair"] == pair]:
            groups.setdefault((r["model_type"], r.get("variant") or REFERENCE), []).append(r)
        pair_rows = [
            row_record(variant, members, groups.get((model_type, REFERENCE)))
            for (model_type, variant), members in groups.items()
        ]
        scored = [row for row in pair_rows if row["val_last_ce"] is not None]
        for row, on_front in zip(
            scored, pareto_front([(row["attention_parameters"], row["val_last_ce"]) for row in scored])
        ):
            row["pareto"] = on_front
        rows += pair_rows
    return rows


def row_record(variant: str, members: list[dict], reference: list[dict] | None) -> dict:
    """One attention row from its runs (one per seed) and its reference's runs (None while none has finished).

    L_S(4) is the mean over the row's seeds. Δ% = 100 (L_S(4) - reference L_S(4)) / reference L_S(4) per seed,
    paired by seed (positive: the variant is worse), then its mean and, over two or more seeds, the 95% Student-t
    interval; the ratio is reference attention parameters / the row's. Not converged: the seeds whose run stopped
    on the epoch cap at its best epoch (still improving)."""
    first, mc = members[0], members[0]["config"]["model"]
    ce = {m["seed"]: m["val_last_ce"] for m in members}
    ref_ce = {m["seed"]: m["val_last_ce"] for m in reference or []}
    paired = paired_difference(ce, ref_ce) if reference else {"seeds": [], "differences": []}
    delta = mean_interval([100 * d / ref_ce[s] for s, d in zip(paired["seeds"], paired["differences"])])
    ref_params = reference[0]["attention_parameters"] if reference else None
    return {
        "pair": first["pair"],
        "variant": variant,
        "model_type": first["model_type"],
        "seeds": [m["seed"] for m in members],
        "run_dir": first["run_dir"],
        "run_dirs": [m["run_dir"] for m in members],
        "kind": attention_kind(mc),
        "attention": attention_form(mc),
        "mha_equivalent": mha_equivalent(mc),
        "attention_parameters": first["attention_parameters"],
        "parameters": first["parameters"],
        "reference_attention_parameters": ref_params,
        "attention_ratio": ref_params / first["attention_parameters"] if ref_params else None,
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(mc, first["vocab_size"]),
        "val_last_ce": mean_sd(list(ce.values()))["mean"],
        "val_last_ce_per_seed": list(ce.values()),
        "reference_val_last_ce": mean_sd([ref_ce[s] for s in paired["seeds"]])["mean"],
        "delta_percent": delta["mean"],
        "delta_percent_ci95": delta["ci95"],
        "delta_seeds": paired["seeds"],
        "story_cloze": mean_story_cloze([m.get("story_cloze") for m in members]),
        "epochs": [f"{m['best_epoch']}/{m['last_epoch']}" for m in members],
        "stopped_by": sorted({m["stopped_by"] for m in members}),
        "not_converged_seeds": [
            m["seed"] for m in members if m["stop_reason"] == "max_epochs" and m["best_epoch"] == m["last_epoch"]
        ],
        "mismatches": sorted({x for m in members for x in m.get("mismatches") or []}),
    }


def mean_story_cloze(results: list[dict | None]) -> dict | None:
    """{half: {"summed", "per_token"}}: the mean Story Cloze accuracy over the runs that have one (None if none)."""
    found = [r for r in results if r]
    if not found:
        return None
    halves = dict.fromkeys(h for r in found for h in r)
    return {
        h: {k: mean_sd([r[h][k] for r in found if h in r])["mean"] for k in ("summed", "per_token")} for h in halves
    }


def target_check(rows: list[dict]) -> list[dict]:
    """Per pair: is there a Tucker 4-tensor run with >= TARGET_RATIO times fewer attention parameters than the dense
    reference within TARGET_DELTA_PERCENT of its L_S(4)? The best such candidate (lowest Δ%) is named."""
    out = []
    for pair in dict.fromkeys(r["pair"] for r in rows):
        candidates = [
            r
            for r in rows
            if r["pair"] == pair
            and r["model_type"] == "four_tensor"
            and r["kind"] == "tucker"
            and r["attention_ratio"] is not None
            and r["attention_ratio"] >= TARGET_RATIO
            and r["delta_percent"] is not None
        ]
        best = min(candidates, key=lambda r: r["delta_percent"]) if candidates else None
        out.append(
            {
                "pair": pair,
                "ratio_at_least": TARGET_RATIO,
                "delta_percent_at_most": TARGET_DELTA_PERCENT,
                "candidates": [r["variant"] for r in candidates],
                "best": best and best["variant"],
                "best_attention_ratio": best and best["attention_ratio"],
                "best_delta_percent": best and best["delta_percent"],
                "met": None if best is None else best["delta_percent"] <= TARGET_DELTA_PERCENT,
            }
        )
    return out

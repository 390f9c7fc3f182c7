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

OUT receives, next to the Table 5 reports (world_model/benchmark/report.py, markdown.py): results.json["attention"]
(one row per run: attention parameters, ratio to the reference, L_S(4), Δ% against the reference, Pareto flag),
results.json["attention_target"], a section of results.md, and ls4_vs_attention_params.png.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from world_model.benchmark.preset import MODEL_LABELS, row_label, seed_suffix
from world_model.models.baseline import BaselineModel
from world_model.models.four_tensor import FourTensorModel
from world_model.models.registry import build_model

PARETO_FIGURE = "ls4_vs_attention_params.png"
REFERENCE = "reference"  # the variant name of a pair's own run in the rows below
TARGET_RATIO, TARGET_DELTA_PERCENT = 5.0, 1.0  # a Tucker 4-tensor predictor >= 5x smaller attention, within 1%
FAMILY_MARKERS = {"four_tensor": "o", "baseline": "s"}
KIND_COLORS = {"dense": "tab:gray", "mha": "tab:gray", "gqa": "tab:green", "mla": "tab:purple", "tucker": "tab:red"}
KIND_LABELS = {
    "dense": "dense / MHA (reference)",
    "mha": "dense / MHA (reference)",
    "gqa": "GQA",
    "mla": "MLA",
    "tucker": "Tucker",
}


# ----- counting -----
def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every layer of a 4-tensor model or a baseline."""
    if isinstance(model, FourTensorModel):
        return [layer.attention for layer in model.layers]
    if isinstance(model, BaselineModel):
        return [block.attention for block in model.blocks]
    raise TypeError(f"no attention-parameter count for {type(model).__name__}; known: FourTensorModel, BaselineModel")


def attention_parameter_count(model: nn.Module) -> int:
    """Parameters of the Q/K/V (and output) maps of all attention layers (see the module docstring)."""
    return sum(p.numel() for module in attention_modules(model) for p in module.parameters())


def config_attention_parameters(model_section: dict, vocab_size: int) -> int:
    """attention_parameter_count of the model a config's `model:` section builds, on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = build_model(model_section, vocab_size)
    return attention_parameter_count(model)


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
    """One row per finished run of a pair that has variants: its reference runs first, then its variants.

    `runs` and `variants` are benchmark run records (world_model.benchmark.runs.run_record) carrying
    "attention_parameters"; a variant record also carries "variant" and "mismatches" (against its reference).
    Δ% = 100 (L_S(4) - reference L_S(4)) / reference L_S(4) (positive: the variant is worse); the ratio is
    reference attention parameters / the run's. The Pareto flag is over all rows of the pair.
    """
    references = {(r["pair"], r["model_type"]): r for r in runs}
    rows = []
    for pair in dict.fromkeys(v["pair"] for v in variants):
        chosen = [r for r in runs if r["pair"] == pair] + [v for v in variants if v["pair"] == pair]
        pair_rows = []
        for r in chosen:
            ref = references.get((pair, r["model_type"]))
            ref_params = ref["attention_parameters"] if ref else None
            ref_ce = ref["val_last_ce"] if ref else None
            ce = r["val_last_ce"]
            pair_rows.append(
                {
                    "pair": pair,
                    "variant": r.get("variant") or REFERENCE,
                    "model_type": r["model_type"],
                    "run_dir": r["run_dir"],
                    "kind": attention_kind(r["config"]["model"]),
                    "attention": attention_form(r["config"]["model"]),
                    "attention_parameters": r["attention_parameters"],
                    "parameters": r["parameters"],
                    "reference_attention_parameters": ref_params,
                    "attention_ratio": ref_params / r["attention_parameters"] if ref_params else None,
                    "val_last_ce": ce,
                    "reference_val_last_ce": ref_ce,
                    "delta_percent": 100 * (ce - ref_ce) / ref_ce if ce is not None and ref_ce else None,
                    "best_epoch": r["best_epoch"],
                    "last_epoch": r["last_epoch"],
                    "stopped_by": r["stopped_by"],
                    "mismatches": r.get("mismatches", []),
                }
            )
        scored = [row for row in pair_rows if row["val_last_ce"] is not None]
        for row, on_front in zip(
            scored, pareto_front([(row["attention_parameters"], row["val_last_ce"]) for row in scored])
        ):
            row["pareto"] = on_front
        rows += pair_rows
    return rows


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


# ----- reports -----
def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown_lines(results: dict) -> list[str]:
    """The results.md section: the L_S(4)-vs-attention-parameters table and the target check."""
    lines = [
        "",
        "## L_S(4) against attention parameters (the Tucker paper's Figure 3, for this task)",
        "",
        "Attention parameters: the Q/K/V (and output) weights of all attention layers (Table 1 of the Tucker paper; the "
        "4-tensor model has no output map). Ratio = reference attention parameters / the run's (× fewer); "
        "Δ% = 100 (L_S(4) − reference) / reference, positive: worse than the reference of the same model type "
        "(4-tensor: dense Q/K/V; baseline: MHA). Pareto: on the front of all runs of the pair (fewer attention "
        "parameters and lower L_S(4)).",
        "",
        "| pair | variant | model | attention | attention params | × fewer | total params | epoch | stopped by | L_S(4) "
        "| Δ% vs reference | Pareto |",
        "|---|---|---|---|---:|---:|---:|---|---|---:|---:|---|",
    ]
    for r in results["attention"]:
        lines.append(
            f"| {r['pair']} | {r['variant']} | {MODEL_LABELS[r['model_type']]} | {r['attention']} | "
            f"{r['attention_parameters']:,} | {_fmt(r['attention_ratio'], '.2f')} | {r['parameters']:,} | "
            f"{r['best_epoch']}/{r['last_epoch']} | {r['stopped_by']} | {_fmt(r['val_last_ce'], '.4f')} | "
            f"{_fmt(r['delta_percent'], '+.2f')} | {'yes' if r.get('pareto') else ''} |"
        )
    lines += ["", f"![L_S(4) against attention parameters]({PARETO_FIGURE})"]
    return lines


def notes(results: dict) -> list[str]:
    """Notes on the variant runs' matching with their references, and on the issue's target (how each run stopped is
    in world_model/benchmark/notes.py, for the pairs' runs and the variants alike)."""
    out = []
    for v in results.get("variants", []):
        label = row_label(v) + seed_suffix(v)
        if v.get("mismatches"):
            out.append(f"{label}: NOT matched with its reference: " + "; ".join(v["mismatches"]))
        elif v.get("mismatches") is None:
            out.append(f"{label}: its reference run has not finished; no ratio or Δ%.")
    return out + target_notes(results.get("attention_target", []))


def target_notes(targets: list[dict]) -> list[str]:
    """One line per pair on the issue's target (see target_check)."""
    out = []
    for t in targets:
        goal = (
            f"target: a Tucker 4-tensor run with >= {t['ratio_at_least']:g}x fewer attention parameters than the dense "
            f"one within {t['delta_percent_at_most']:g}% of its L_S(4)"
        )
        if t["met"] is None:
            out.append(f"{t['pair']}: {goal}: no such run finished.")
        else:
            out.append(
                f"{t['pair']}: {goal}: {'MET' if t['met'] else 'NOT met'}; best candidate {t['best']} "
                f"({t['best_attention_ratio']:.2f}x fewer, Δ {t['best_delta_percent']:+.2f}%)."
            )
    return out


def plot_pareto(results: dict, path: Path) -> None:
    """L_S(4) against attention parameters (log x), one panel per pair: marker by model type, colour by attention
    kind, every point labelled, the Pareto front drawn as a step line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in results["attention"] if r["val_last_ce"] is not None]
    pairs = list(dict.fromkeys(r["pair"] for r in results["attention"]))
    fig = Figure(figsize=(7 * max(len(pairs), 1), 5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(pairs), 1), squeeze=False)[0]
    for ax, pair in zip(axes, pairs):
        plot_pareto_panel(ax, pair, [r for r in rows if r["pair"] == pair])
    axes[-1].legend(handles=pareto_legend_handles(), fontsize=7, loc="best")
    fig.suptitle(f"L_S(4) against attention parameters (preset {results['preset']['name']}; bottom-left is best)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def plot_pareto_panel(ax: Any, pair: str, points: list[dict]) -> None:
    """One pair's panel of plot_pareto: its attention rows with an L_S(4), and their Pareto front."""
    for r in points:
        ax.scatter(
            [r["attention_parameters"]],
            [r["val_last_ce"]],
            marker=FAMILY_MARKERS[r["model_type"]],
            s=60,
            color=KIND_COLORS[r["kind"]],
            edgecolors="black" if r.get("pareto") else "none",
            zorder=3,
        )
        label = f"{MODEL_LABELS[r['model_type']]} {r['attention']}" + (
            " (reference)" if r["variant"] == REFERENCE else ""
        )
        ax.annotate(
            label,
            (r["attention_parameters"], r["val_last_ce"]),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=7,
        )
    front = sorted((r["attention_parameters"], r["val_last_ce"]) for r in points if r.get("pareto"))
    if front:
        ax.step(
            [x for x, _ in front],
            [y for _, y in front],
            where="post",
            linestyle="--",
            color="black",
            alpha=0.6,
            zorder=2,
        )
    ax.set_xscale("log")
    ax.set_xlabel("attention parameters (Q/K/V/O weights, all layers)")
    ax.set_ylabel("validation $L_{S(4)}$ (nats / token, lower is better)")
    ax.set_title(f"{pair}")
    ax.grid(alpha=0.3, which="both")


def pareto_legend_handles() -> list:
    """The legend of plot_pareto: the model types' markers, the attention kinds' colours, the front's line."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], linestyle="", marker=m, color="black", label=MODEL_LABELS[t]) for t, m in FAMILY_MARKERS.items()
    ]
    handles += [
        Line2D([], [], linestyle="", marker="o", color=KIND_COLORS[k], label=KIND_LABELS[k])
        for k in ("dense", "gqa", "mla", "tucker")
    ]
    handles.append(Line2D([], [], linestyle="--", color="black", label="Pareto front (outlined points)"))
    return handles

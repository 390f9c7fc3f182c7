"""The attention rows in the reports: the results.md section (the table of L_S(4) against attention parameters with
the KV cache, decode time, Story Cloze and flags of every row, the count floors, the verdict), the notes, and the
figure ls4_vs_attention_params.png (the Tucker paper's Figure 3 for this task, the count floors as horizontal lines).
The rows are world_model/benchmark/attention.py's, the verdict attention_verdict.py's, the decode timing
attention_decode.py's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from world_model.benchmark.attention import REFERENCE
from world_model.benchmark.attention_verdict import label, verdict_lines
from world_model.benchmark.preset import MODEL_LABELS, row_label, seed_suffix

PARETO_FIGURE = "ls4_vs_attention_params.png"
FAMILY_MARKERS = {"four_tensor": "o", "baseline": "s"}
KIND_COLORS = {
    "dense": "tab:gray",
    "mha": "tab:gray",
    "gqa": "tab:green",
    "mla": "tab:purple",
    "tucker": "tab:red",
    "tucker_listing": "tab:orange",
}
KIND_LABELS = {
    "dense": "dense / MHA (reference)",
    "mha": "dense / MHA (reference)",
    "gqa": "GQA",
    "mla": "MLA",
    "tucker": "Tucker",
    "tucker_listing": "Tucker (reference listing's form)",
}
FLOOR_STYLES = (":", "--", "-.", (0, (5, 1, 1, 1, 1, 1)))
# Where a point's label may go, in points from the point (x, y), in the order tried: beside it, then further out.
LABEL_OFFSETS = tuple((dx, dy) for dy in (5, -11, 15, -21, 25, -31) for dx in (5, -6))
MARKER_HALF_WIDTH = 6  # display pixels either side of a point that no other point's label may cover


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def fmt_delta(row: dict) -> str:
    """Δ% with its paired 95% interval when there is one, and the seeds it is over."""
    if row["variant"] == REFERENCE:
        return "reference"
    if row["delta_percent"] is None:
        return "—"
    ci = row["delta_percent_ci95"]
    text = f"{row['delta_percent']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
    return text + (f" (seeds {', '.join(map(str, row['delta_seeds']))})" if len(row["delta_seeds"]) > 1 else "")


def fmt_cloze(cloze: dict | None) -> str:
    return "—" if not cloze else ", ".join(f"{half} {c['summed']:.1%}" for half, c in cloze.items())


def decode_lookup(results: dict) -> dict[tuple, dict]:
    """(pair, model type, variant) -> its decode timing row (attention_decode.py, baseline rows), when measured."""
    return {(d["pair"], "baseline", d["variant"]): d for d in (results.get("decode_timing") or {}).get("rows", [])}


def markdown_lines(results: dict) -> list[str]:
    """The results.md section: the L_S(4)-vs-attention-parameters table, the floors, the verdict and the figure."""
    decode, verdict = decode_lookup(results), results.get("attention_verdict") or {}
    findings = verdict.get("findings", {})
    lines = [
        "",
        "## L_S(4) against attention parameters (the Tucker paper's Figure 3, for this task)",
        "",
        "Attention parameters: the Q/K/V (and output) weights of all attention layers (Table 1 of the Tucker paper; the "
        "4-tensor model has no output map). Ratio = reference attention parameters / the row's (× fewer). KV cache: "
        "bytes a decoder keeps per token read, all layers, at fp32 (Table 1's column; the 4-tensor model keeps none). "
        "Decode: ms per generated token at batch 1 with the KV cache, median over rounds "
        "(`python -m world_model.benchmark.attention_decode`). L_S(4): mean over the row's seeds. "
        "Δ% = 100 (L_S(4) − reference) / reference per seed, paired by seed with the reference of the same model type "
        "(4-tensor: dense Q/K/V; baseline: MHA), positive: worse; its mean, with the 95% interval over two or more "
        "seeds. Story Cloze: summed log-likelihood accuracy, mean over seeds. Pareto: on the front of the pair's rows "
        "(fewer attention parameters and lower mean L_S(4)).",
        "",
        "| pair | variant | model | attention | attention params | × fewer | KV cache B/token | decode ms/token | seeds "
        "| epochs | L_S(4) | Δ% vs reference | Story Cloze | flags | Pareto |",
        "|---|---|---|---|---:|---:|---:|---:|---|---|---:|---|---|---|---|",
    ]
    for r in results["attention"]:
        timing = decode.get((r["pair"], r["model_type"], r["variant"]))
        lines.append(
            f"| {r['pair']} | {r['variant']} | {MODEL_LABELS[r['model_type']]} | {r['attention']} | "
            f"{r['attention_parameters']:,} | {_fmt(r['attention_ratio'], '.2f')} | "
            f"{_fmt(r['kv_cache_bytes_per_token'], ',')} | {_fmt(timing and timing['ms_per_token'], '.3f')} | "
            f"{', '.join(str(s) for s in r['seeds'])} | {', '.join(r['epochs'])} | {_fmt(r['val_last_ce'], '.4f')} | "
            f"{fmt_delta(r)} | {fmt_cloze(r['story_cloze'])} | {'; '.join(findings.get(label(r), []))} | "
            f"{'yes' if r.get('pareto') else ''} |"
        )
    floors = (results.get("floors") or {}).get("rows", [])
    if floors:
        lines += [
            "",
            "Count floors (the figure's horizontal lines; the section above): "
            + ", ".join(f"{f['floor']} {f['val_last_ce']:.4f}" for f in floors)
            + ".",
        ]
    lines += decode_lines(results.get("decode_timing"))
    if verdict:
        lines += verdict_lines(verdict)
    return lines + ["", f"![L_S(4) against attention parameters]({PARETO_FIGURE})"]


def decode_lines(timing: dict | None) -> list[str]:
    """How the decode times were measured, or that they were not."""
    if not timing:
        return [
            "",
            "Decode time: not measured (`python -m world_model.benchmark.attention_decode --out OUT` measures it).",
        ]
    s = timing["settings"]
    random = [f"{d['pair']} {d['variant']}" for d in timing["rows"] if not d["trained_weights"]]
    return [
        "",
        f"Decode time: {s['rounds']} rounds in one process, every baseline row once a round in a rotating order, each "
        f"time a prefill of {s['prefix_tokens']} tokens then {s['steps']} cached greedy steps at batch 1 "
        f"({s['threads']} torch thread(s), {s['device']}, measured {timing['measured_at']}); the median of the rounds' "
        "per-step times."
        + (
            f" Built from the config with random weights (no best/ checkpoint in OUT; the time does not depend on the "
            f"weights): {', '.join(random)}."
            if random
            else ""
        ),
    ]


def notes(results: dict) -> list[str]:
    """Notes on the variant runs' matching with their references, and on the issue's target (how each run stopped is
    in world_model/benchmark/notes.py, for the pairs' runs and the variants alike)."""
    out = []
    for v in results.get("variants", []):
        name = row_label(v) + seed_suffix(v)
        if v.get("mismatches"):
            out.append(f"{name}: NOT matched with its reference: " + "; ".join(v["mismatches"]))
        elif v.get("mismatches") is None:
            out.append(f"{name}: its reference run has not finished; no ratio or Δ%.")
    return out + target_notes(results.get("attention_target", []))


def target_notes(targets: list[dict]) -> list[str]:
    """One line per pair on the issue's target (see attention.target_check)."""
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


def summary_lines(results: dict) -> list[str]:
    """The attention rows, the verdict on the Tucker paper's claim and the issue's target, for the command's output."""
    lines = [
        f"{a['pair']:>6} {MODEL_LABELS[a['model_type']]:>8} {a['variant']}: {a['attention']}, "
        f"{a['attention_parameters']:,} attention parameters ({_fmt(a['attention_ratio'], '.2f')}x fewer than the "
        f"reference), seeds {', '.join(map(str, a['seeds']))}: L_S(4) {_fmt(a['val_last_ce'], '.4f')} "
        f"(Δ {_fmt(a['delta_percent'], '+.2f')}%)" + (", Pareto" if a.get("pareto") else "")
        for a in results.get("attention", [])
    ]
    lines += [
        f"Tucker paper's claim at {c['pair']}: {'MET' if c['met'] else 'NOT met'} (results.md)"
        for c in (results.get("attention_verdict") or {}).get("claims", [])
    ]
    return lines + target_notes(results.get("attention_target", []))


def plot_pareto(results: dict, path: Path) -> None:
    """Mean L_S(4) against attention parameters (log x), one panel per pair: marker by model type, colour by
    attention kind, every point labelled (a bar of ± one sd over several seeds), the Pareto front as a step line,
    the count floors as horizontal lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in results["attention"] if r["val_last_ce"] is not None]
    pairs = list(dict.fromkeys(r["pair"] for r in results["attention"]))
    fig = Figure(figsize=(7 * max(len(pairs), 1) + 2, 5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(pairs), 1), squeeze=False)[0]
    floors = (results.get("floors") or {}).get("rows", [])
    labels = [
        plot_pareto_panel(ax, pair, [r for r in rows if r["pair"] == pair], floors) for ax, pair in zip(axes, pairs)
    ]
    listing = any(r.get("kind") == "tucker_listing" for r in rows)
    kinds = ("dense", "gqa", "mla", "tucker") + (("tucker_listing",) if listing else ())
    axes[-1].legend(
        handles=pareto_legend_handles(floors, kinds), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0)
    )
    fig.suptitle(f"L_S(4) against attention parameters (preset {results['preset']['name']}; bottom-left is best)")
    fig.tight_layout()
    for ax, panel_labels in zip(axes, labels):
        place_labels(ax, panel_labels)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def plot_pareto_panel(ax: Any, pair: str, points: list[dict], floors: list[dict]) -> list[tuple[str, tuple]]:
    """One pair's panel of plot_pareto: its attention rows with an L_S(4), their Pareto front and the floors.

    Returns each point's label and position, (text, (attention parameters, L_S(4))), for `place_labels` once the
    figure's layout is final; the marker names the model type, so a label names only the attention.
    """
    labels = []
    for r in sorted(points, key=lambda r: r["attention_parameters"]):
        values = [v for v in r["val_last_ce_per_seed"] if v is not None]
        spread = (sum((v - r["val_last_ce"]) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0
        ax.errorbar(
            [r["attention_parameters"]],
            [r["val_last_ce"]],
            yerr=[spread] if spread else None,
            marker=FAMILY_MARKERS[r["model_type"]],
            markersize=8,
            color=KIND_COLORS[r["kind"]],
            markeredgecolor="black" if r.get("pareto") else KIND_COLORS[r["kind"]],
            linestyle="",
            zorder=3,
        )
        text = r["attention"] + (" (reference)" if r["variant"] == REFERENCE else "")
        labels.append((text, (r["attention_parameters"], r["val_last_ce"])))
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
    for f, style in zip(floors, FLOOR_STYLES):
        ax.axhline(f["val_last_ce"], color="gray", linestyle=style, linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("attention parameters (Q/K/V/O weights, all layers)")
    ax.set_ylabel("validation $L_{S(4)}$ (nats / token, lower is better)")
    ax.set_title(f"{pair}")
    ax.grid(alpha=0.3, which="both")
    return labels


def place_labels(ax: Any, labels: list[tuple[str, tuple]]) -> None:
    """Annotate each (text, (x, y)) of `labels` at the first of LABEL_OFFSETS where its text stays inside the axes
    and clear of the other points and of the labels placed before it; where no offset is clear, at the one that
    overlaps least. Call once the axes' limits and the figure's layout are final (positions are in display pixels)."""
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    centres = [ax.transData.transform(xy) for _, xy in labels]
    markers = [
        Bbox.from_extents(x - MARKER_HALF_WIDTH, y - MARKER_HALF_WIDTH, x + MARKER_HALF_WIDTH, y + MARKER_HALF_WIDTH)
        for x, y in centres
    ]
    placed = []
    for i, (text, xy) in enumerate(labels):
        obstacles = placed + markers[:i] + markers[i + 1 :]
        best = None
        for dx, dy in LABEL_OFFSETS:
            note = ax.annotate(
                text, xy, textcoords="offset points", xytext=(dx, dy), ha="left" if dx > 0 else "right", fontsize=7
            )
            box = note.get_window_extent(renderer)
            outside = box.width * box.height - _overlap(box, frame)
            cost = outside + sum(_overlap(box, other) for other in obstacles)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, note, box)
            else:
                note.remove()
            if cost == 0:
                break
        placed.append(best[2])


def _overlap(a: Any, b: Any) -> float:
    """The area two display boxes share (0 when they are apart)."""
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


def pareto_legend_handles(floors: list[dict], kinds: tuple[str, ...]) -> list:
    """The legend of plot_pareto: the model types' markers, the colours of the attention `kinds`, the front's line,
    the floors' lines."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], linestyle="", marker=m, color="black", label=MODEL_LABELS[t]) for t, m in FAMILY_MARKERS.items()
    ]
    handles += [Line2D([], [], linestyle="", marker="o", color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in kinds]
    handles.append(Line2D([], [], linestyle="--", color="black", label="Pareto front (outlined points)"))
    handles += [
        Line2D([], [], linestyle=style, color="gray", label=f"floor: {f['floor']} ({f['val_last_ce']:.2f})")
        for f, style in zip(floors, FLOOR_STYLES)
    ]
    return handles

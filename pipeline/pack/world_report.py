"""The world-model evaluation's report: results.md (tables a person reads) and storyboard.png (observed strips and
captions, then predicted sentences and their renders, one row per episode)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from matplotlib.figure import Figure

from world_model.text.vocab import same_sentence

PREDICTORS = {
    "four_tensor": "4-tensor",
    "four_tensor_tokens": "4-tensor, per-slot readout",
    "baseline": "flat baseline",
    "baseline_tokens": "flat baseline, token readout",
    "copy_last": "copy-last",
}
CONTEXTS = {"captions": "captions (full loop)", "truth": "true sentences (oracle)"}


def storyboard_rows(records: list[dict], count: int) -> list[int]:
    """Indices of ``count`` episodes to draw, in order: the first of each scene type, then the earliest others."""
    firsts = sorted({r["scene"]: i for i, r in reversed(list(enumerate(records)))}.values())
    rest = [i for i in range(len(records)) if i not in firsts]
    return sorted((firsts + rest)[:count])


def write_storyboard(path: Path, rows: list[tuple], observe: int) -> None:
    """One row per episode: the observed strips with their captions, then the predicted sentences with
    their rendered strips; a red label and frame mark a caption or prediction that is not the true sentence.
    ``rows``: (record, observed strips, captions, true sentences, predicted sentences, rendered strips)."""
    columns = observe + len(rows[0][4])
    figure = Figure(figsize=(2.6 * columns, 1.9 * len(rows)), dpi=100, layout="constrained")
    axes = figure.subplots(len(rows), columns, squeeze=False)
    for r, (record, observed, captions, truths, predicted, rendered) in enumerate(rows):
        cells = [(img, f"t={t} caption", c, truths[t]) for t, (img, c) in enumerate(zip(observed, captions))]
        cells += [
            (img, f"+{k + 1} predicted", p, truths[observe + k]) for k, (img, p) in enumerate(zip(rendered, predicted))
        ]
        for c, (ax, (image, what, text, truth)) in enumerate(zip(axes[r], cells)):
            wrong = not same_sentence(text, truth)
            ax.imshow(image)
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_edgecolor("firebrick" if wrong else "0.75")
                spine.set_linewidth(2.5 if wrong else 1)
            lines = textwrap.wrap(f"{what}: {text}", 34) + (textwrap.wrap(f"true: {truth}", 34) if wrong else [])
            ax.set_xlabel("\n".join(lines), fontsize=7, color="firebrick" if wrong else "black")
            if r == 0:
                ax.set_title("observed" if c < observe else "predicted, rendered", fontsize=9)
        axes[r, 0].set_ylabel(f"{record['id']}\n{record['scene']}", fontsize=8)
    figure.suptitle(
        "held-out episodes: captions of the observed seconds, then the predicted sentences rendered "
        "(red: differs from the true sentence)",
        fontsize=10,
    )
    figure.savefig(path, format="png")


def markdown(results: dict) -> str:
    """results.json as tables a person reads."""
    sections = (header_lines, next_state_lines, round_trip_lines, timing_lines)
    return "\n".join(line for section in sections for line in section(results)) + "\n"


def header_lines(results: dict) -> list[str]:
    """The command, the pack and data, and the caption accuracy."""
    s = results["settings"]
    size = results["pack"]["size_mb"]
    data = results["data"]
    return [
        "# World-model evaluation",
        "",
        "```",
        results["command"],
        "```",
        "",
        f"Pack `{results['pack']['path']}`: **{size['total']:.2f} MB** ("
        + ", ".join(f"{c} {v:.2f}" for c, v in size.items() if c != "total")
        + "). "
        f"Data `{data['path']}`: the first {data['episodes']} episodes ("
        + ", ".join(f"{k} {v}" for k, v in data["scene_counts"].items())
        + f"). Observe seconds 0-{s['observe'] - 1}, "
        f"predict the next {s['steps']}; device {s['device']}, seed {s['seed']}.",
        "",
        "## Caption accuracy",
        "",
        "Captions of the held-out state strips that are exactly the true sentence.",
        "",
        "| scene | accuracy |",
        "|---|---:|",
        f"| all ({results['caption_accuracy']['strips']} strips) | **{results['caption_accuracy']['overall']:.4f}** |",
        *(f"| {k} | {v:.4f} |" for k, v in results["caption_accuracy"]["per_scene"].items()),
    ]


def next_state_lines(results: dict) -> list[str]:
    """Next-state accuracy k seconds ahead beside the ceiling, overall and per scene."""
    s = results["settings"]
    steps = range(1, s["steps"] + 1)
    ceiling = results["ceiling"]["per_step"]
    lines = [
        "",
        "## Next-state accuracy k seconds ahead",
        "",
        f"Exact match of the predicted sentence of second {s['observe']} + k - 1 (greedy rollout). The ceiling is the "
        "accuracy of the Bayes-optimal predictor that knows the simulator's full state after the observed seconds; "
        "in brackets, the accuracy as a fraction of it. Readout: "
        + "; ".join(f"{PREDICTORS[n]}: {r}" for n, r in results["readout"].items())
        + " (with known sentences, each "
        "predicted state is the known sentence the model scores highest, `world_model.models.decoding`; the rows marked "
        "per-slot / token readout are the same models reading tokens off freely).",
        "",
        "| predictor | context | " + " | ".join(f"k={k}" for k in steps) + " |",
        "|---|---|" + "---:|" * len(steps),
        "| ceiling | | " + " | ".join(f"{c:.4f}" for c in ceiling) + " |",
    ]
    for name in results["next_state"]:
        for context, context_label in CONTEXTS.items():
            row, label = results["next_state"][name][context], PREDICTORS[name]
            cells = [f"{a:.4f} ({f:.0%})" for a, f in zip(row["accuracy"], row["fraction_of_ceiling"])]
            lines.append(f"| {label} | {context_label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per scene:",
        "",
        "| scene | predictor | context | " + " | ".join(f"k={k}" for k in steps) + " |",
        "|---|---|---|" + "---:|" * len(steps),
    ]
    for kind, values in results["ceiling"]["per_scene"].items():
        lines.append(f"| {kind} | ceiling | | " + " | ".join(f"{v:.4f}" for v in values) + " |")
        for name in results["next_state"]:
            for context, context_label in CONTEXTS.items():
                values, label = results["next_state"][name][context]["per_scene"][kind], PREDICTORS[name]
                lines.append(f"| {kind} | {label} | {context_label} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    return lines


def round_trip_lines(results: dict) -> list[str]:
    """Rendered strips captioned back to their sentence."""
    s = results["settings"]
    trip = results["round_trip"]
    scenes = list(results["caption_accuracy"]["per_scene"])
    lines = [
        "",
        "## Round trip",
        "",
        "Rendered strips captioned back to exactly the sentence they were rendered from (each distinct sentence "
        f"is rendered once, seed {s['seed']}, and counted as often as it occurs).",
        "",
        "| rendered from | strips | captioned back exactly | " + " | ".join(scenes) + " | distinct sentences "
        "| of those, exactly |",
        "|---|---:|---:|" + "---:|" * len(scenes) + "---:|---:|",
    ]
    for key, label in (
        ("true_sentences", "true held-out sentences"),
        ("predicted_sentences", "predicted sentences (4-tensor, full loop)"),
    ):
        t = trip[key]
        lines.append(
            f"| {label} | {t['strips']} | **{t['overall']:.4f}** | "
            + " | ".join(f"{t['per_scene'][k]:.4f}" if k in t["per_scene"] else "" for k in scenes)
            + f" | {t['distinct_sentences']} | {t['distinct_accuracy']:.4f} |"
        )
    return lines


def timing_lines(results: dict) -> list[str]:
    """Seconds per stage, and the storyboard."""
    lines = ["", "## Timings", "", "| stage | seconds | items | ms per item |", "|---|---:|---:|---:|"]
    lines += [
        f"| {k} | {t['seconds']:.2f} | {t['items']} {t['unit']} | {t['ms_per_item']:.1f} |"
        for k, t in results["timings"].items()
    ]
    if results["storyboard"]:
        lines += [
            "",
            "## Storyboard",
            "",
            f"Episodes {', '.join(results['storyboard'])}.",
            "",
            "![storyboard](storyboard.png)",
        ]
    return lines

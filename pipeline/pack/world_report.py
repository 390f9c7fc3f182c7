"""The world-model evaluation's report: results.md (tables a person reads) and storyboard.png (observed strips and
captions, then predicted sentences and their renders, one row per episode)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from matplotlib.figure import Figure

from world_model.evaluation.world_report_view import forecast_lines
from world_model.text.vocab import same_sentence

# Scenes a storyboard shows first: those that need memory, where a copier fails and the world model should not.
STORYBOARD_ORDER = ("counting", "occlusion", "blocks", "doors", "elevator", "ball", "box")
VARIANT_WORDS = {
    "as_rendered": "as the renderer draws it",
    "from_last_strip": "image-to-image from the last observed strip",
    "without_context": "from noise, not reading the last strip",
    "last_frame_held": "the last observed frame held (no render)",
}


def storyboard_rows(records: list[dict], count: int) -> list[int]:
    """Indices of ``count`` episodes to draw: the first of each scene type, in ``STORYBOARD_ORDER``, then the
    earliest others."""
    first = {}
    for i, r in enumerate(records):
        first.setdefault(r["scene"], i)
    rank = {kind: n for n, kind in enumerate(STORYBOARD_ORDER)}
    firsts = [first[k] for k in sorted(first, key=lambda k: rank.get(k, len(rank)))]
    rest = [i for i in range(len(records)) if i not in firsts]
    return (firsts + rest)[:count]


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
    """results.json as a report a person reads."""
    sections = (header_lines, caption_lines, lambda r: forecast_lines(r, level=3), render_lines, timing_lines)
    return "\n".join(line for section in sections for line in section(results)) + "\n"


def header_lines(results: dict) -> list[str]:
    """The command, the pack and the data."""
    s, size, data = results["settings"], results["pack"]["size_mb"], results["data"]
    return [
        "# World-model evaluation: the full video loop on the synthetic world",
        "",
        "```",
        results["command"],
        "```",
        "",
        f"Pack `{results['pack']['path']}`: **{size['total']:.2f} MB** ("
        + ", ".join(f"{c} {v:.2f}" for c, v in size.items() if c != "total")
        + f"). Data `{data['path']}`: the first {data['episodes']} held-out episodes ("
        + ", ".join(f"{k} {v}" for k, v in data["scene_counts"].items())
        + f"). Every forecaster reads the captions of the clips (the full loop), never the true sentences; the "
        f"ceilings are those of the true sentences. Renders: the next {s['steps']} seconds after the first "
        f"{s['observe']}, for the first {results['renders']['all']['episodes']} episodes; device {s['device']}, "
        f"seed {s['seed']}.",
    ]


def caption_lines(results: dict) -> list[str]:
    """Captions of the held-out strips that are exactly the true sentence."""
    captions = results["caption_accuracy"]
    return [
        "",
        "## Captions",
        "",
        "| scene | exact |",
        "|---|---:|",
        f"| all ({captions['strips']} strips) | **{captions['overall']:.4f}** |",
        *(f"| {k} | {v:.4f} |" for k, v in captions["per_scene"].items()),
        "",
        "## Forecasts from the captions",
        "",
    ]


def render_lines(results: dict) -> list[str]:
    """Renders against the simulator's drawing, and the first strip's ways of starting."""
    renders = results["renders"]
    lines = [
        "",
        "## Renders",
        "",
        "Each true future sentence rendered (each strip continuing the one before when the renderer reads it), its "
        "frames' objects counted against the simulator's own drawing of that second (`pipeline/pack/render_scores.py`); "
        "position error: pixels (of a 96-pixel frame) between the centres of same-coloured objects; round trip: "
        "renders captioned back to exactly their sentence (true, and the full loop's predicted ones).",
        "",
        "| scene | episodes | renders | object count right | position error (px) | round trip | round trip, "
        "predicted |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in renders.items():
        position = "" if r["position_error"] is None else f"{r['position_error']:.2f}"
        lines.append(
            f"| {name} | {r['episodes']} | {r['renders']} | {r['object_count_accuracy']:.4f} | {position} | "
            f"{r['round_trip']:.4f} | {r['round_trip_predicted']:.4f} |"
        )
    lines += [
        "",
        "The first predicted strip against the true one (all scenes): where it starts from the last observed strip.",
        "",
        "| first strip | object count right | position error (px) | first frame's pixel error |",
        "|---|---:|---:|---:|",
    ]
    for variant, words in VARIANT_WORDS.items():
        f = renders["all"]["first_strip"][variant]
        position = "" if f["position_error"] is None else f"{f['position_error']:.2f}"
        lines.append(f"| {words} | {f['object_count_accuracy']:.4f} | {position} | {f['pixel_error']:.4f} |")
    return lines


def timing_lines(results: dict) -> list[str]:
    """Seconds per stage, and the storyboard."""
    lines = ["", "## Timings", "", "| stage | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in results["timings"].items()]
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

"""The demo's view of why each future was predicted and how sure (rollout.json's per-step records,
`world_model.generation.explain`).

The predicted-sentences table gets three columns, written as inline HTML inside the Markdown table (Gradio keeps
details, summary, meter, mark and span with their class and title):

- **p**: the chosen sentence's probability under the readout (`span.p-chosen`) and, for a sampled step, the
  probability it was drawn with at the temperature used (`span.p-drawn`);
- **alternatives**: a collapsed `details` listing the likeliest other sentences with theirs (`span.p-alt`);
- **attention**: one small bar (`meter.attention`, 0 to 1) per slice of the window the step read, labelled with the
  caption's time (or the earlier step), the caption in its tooltip.

Words that came mostly through the copy path (`world_model.generation.explain.COPIED`) are highlighted with `mark.copied`.
"""

from __future__ import annotations

import html

from pipeline.record import ObservedFrame, Prediction
from world_model.generation.explain import COPIED, probability_text

HEADER = ["| step | predicted sentence | p | alternatives | attention (per window slice) |", "|---:|---|---:|---|---|"]
LEGEND = (
    "*p*: the probability the predictor gave the sentence it chose (for known sentences or a sentence bank, a softmax "
    "over their scores; read off word by word, the product of its words' probabilities); *drawn*, when sampling, the "
    "probability it had at the temperature used. The bars show where the "
    "attention of the slots that predicted it went, per slice of the window it read; "
    "<mark>highlighted</mark> words were copied from the window."
)


def cell_text(text: str) -> str:
    """Model text inside an HTML span of a Markdown table cell: escaped for HTML, and for Markdown's | * _ ` \\."""
    escaped = html.escape(text, quote=True)
    for char in "|*_`\\[]":
        escaped = escaped.replace(char, f"&#{ord(char)};")
    return escaped


def sentence_cell(sentence: str, step: dict | None) -> str:
    """The sentence, with copied words marked when the step records the copy path."""
    copy = (step or {}).get("copy")
    if not copy:
        return cell_text(sentence) or "*(empty)*"
    return " ".join(
        f'<mark class="copied" title="pointer {w["pointer_mass"]:.2f}, gate {w["gate"]:.2f}">{cell_text(w["word"])}</mark>'
        if w["share"] >= COPIED
        else cell_text(w["word"])
        for w in copy
    )


def alternatives_cell(step: dict) -> str:
    """A collapsed list of the alternatives with their probabilities."""
    if not step["alternatives"]:
        return "—"
    items = "<br>".join(
        f'<span class="p-alt">{probability_text(a["probability"])}</span> {cell_text(a["sentence"])}'
        for a in step["alternatives"]
    )
    return f"<details><summary>{len(step['alternatives'])} more</summary>{items}</details>"


def slice_label(source: dict, observed: list[ObservedFrame]) -> str:
    """A window slice's short label: the caption's time, the earlier step, or "empty"."""
    if source["source"] == "observed":
        return f"t={observed[source['index']].timestamp_s:.1f}s"
    if source["source"] == "predicted":
        return f"step {source['index'] + 1}"
    return "empty"


def attention_cell(step: dict, observed: list[ObservedFrame]) -> str:
    """One labelled bar per window slice, oldest first."""
    if not step["attention"]:
        return "—"
    return "<br>".join(
        f'<span title="{cell_text(s["text"])}">{slice_label(s, observed)}</span> '
        f'<meter class="attention" min="0" max="1" value="{s["mass"]:.4f}" title="{s["mass"]:.0%}"></meter>'
        for s in step["attention"]
    )


def predicted_rows(prediction: Prediction, observed: list[ObservedFrame]) -> list[str]:
    """The table rows of one future: step, sentence, probability, alternatives, attention."""
    steps = prediction.explanations or [None] * len(prediction.sentences)
    rows = []
    for s, (sentence, step) in enumerate(zip(prediction.sentences, steps)):
        if step is None:
            rows.append(f"| {s + 1} | {sentence_cell(sentence, None)} | — | — | — |")
            continue
        p = f'<span class="p-chosen">{probability_text(step["probability"])}</span>'
        if "draw_probability" in step:
            p += f'<br><span class="p-drawn">drawn {probability_text(step["draw_probability"])}</span>'
        rows.append(
            f"| {s + 1} | {sentence_cell(sentence, step)} | {p} | {alternatives_cell(step)} | "
            f"{attention_cell(step, observed)} |"
        )
    return rows

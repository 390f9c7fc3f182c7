"""A rollout's explanations as records (pipeline.rollout's rollout.json, world_model.generation.predict's JSON) and
as the lines `--explain` prints.

Each predicted step of a future gets (from `world_model.models.explanations.StepExplanation`, whose docstring defines
every quantity):

    {"probability": p,                                  # the chosen sentence's, under the readout
     "draw_probability": q,                             # only when sampled: drawn with q at that temperature
     "alternatives": [{"sentence", "probability"}],     # likeliest first
     "attention": [{"source", "index", "text", "mass"}] # one per window slice, oldest first; sums to 1
     "drew_on": {"source", "index", "text", "mass"},    # the slice with the most attention
     "copy": None | [{"slot", "word", "gate", "pointer_mass", "share"}]}  # copy-path models: the chosen words

A slice's source is "observed" (index: the observed sentence's position, in the video rollout the caption's in
rollout.json's "observed"), "predicted" (index: the earlier step, 0-based) or "empty" (left padding of a window with
fewer states than the predictor reads).
"""

from __future__ import annotations

from typing import Callable

import torch

from world_model.models.explanations import StepExplanation
from world_model.text.vocab import PAD_ID, Vocabulary

ROUND = 4  # digits kept in rollout.json (significant ones for probabilities)
COPIED = 0.5  # a word counts as copied when at least this share of its probability came through the pointer


def significant(p: float) -> float:
    """A probability kept to `ROUND` significant digits (a runner-up of 3e-7 stays distinguishable from 0)."""
    return float(f"{p:.{ROUND}g}")


def window_sources(window_states: list[str], captions: int) -> list[dict]:
    """What each slice of the first window holds: {"source", "index", "text"}, oldest first; the window's last
    slices are the last `captions` captions' states (`world_model.text.windows.caption_window`)."""
    T = len(window_states)
    return [
        {"source": "observed", "index": captions - T + t, "text": text}
        if captions - T + t >= 0
        else {"source": "empty", "index": None, "text": ""}
        for t, text in enumerate(window_states)
    ]


def step_records(
    explanations: list[StepExplanation],
    states: torch.Tensor,
    window_states: list[str],
    captions: int,
    vocab: Vocabulary,
) -> list[dict]:
    """One record per predicted step (module docstring) of one future: its explanations (batch row 0), its states
    (steps, N), the first window's states and the number of captions."""
    sources = window_sources(window_states, captions)
    T = len(sources)
    records = []
    for step, (seen, state) in enumerate(zip(explanations, states)):
        row = seen.row(0)
        drawn = row["draw_probability"]
        record = {
            "probability": significant(row["probability"]),
            **({} if drawn is None else {"draw_probability": significant(drawn)}),
            "alternatives": [
                {"sentence": vocab.decode(ids), "probability": significant(p)} for ids, p in row["alternatives"]
            ],
            "attention": None,
            "drew_on": None,
            "copy": None,
        }
        if row["slice_mass"] is not None:
            record["attention"] = [{**s, "mass": round(m, ROUND)} for s, m in zip(sources, row["slice_mass"])]
            record["drew_on"] = max(record["attention"], key=lambda s: s["mass"])
        if row["copy"] is not None:
            record["copy"] = copied_words(row["copy"], state, vocab)
        records.append(record)
        sources = (sources + [{"source": "predicted", "index": step, "text": vocab.decode(state)}])[-T:]
    return records


def copied_words(copy: dict, state: torch.Tensor, vocab: Vocabulary) -> list[dict]:
    """The copy path at each word of a chosen state (N,): its slot, the word, the gate, the pointer's mass on that
    word and the share of the word's probability that came through the pointer."""
    return [
        {
            "slot": n,
            "word": vocab.itos[int(token)],
            "gate": round(copy["gate"][n], ROUND),
            "pointer_mass": round(copy["mass"][n], ROUND),
            "share": round(copy["share"][n], ROUND),
        }
        for n, token in enumerate(state.tolist())
        if token != PAD_ID
    ]


def explain_lines(step: dict, describe: Callable[[dict], str], indent: str = "      ") -> list[str]:
    """The lines `--explain` prints under a predicted step: its alternatives, the window slice it drew on most (in
    the words of `describe`) and the words it copied."""
    lines = [f"{indent}or {probability_text(a['probability'])}  {a['sentence']}" for a in step["alternatives"]]
    if "draw_probability" in step:
        lines.insert(
            0, f"{indent}drawn with p={probability_text(step['draw_probability'])} at the sampling temperature"
        )
    if step["drew_on"] is not None:
        lines.append(
            f"{indent}drew on most: {describe(step['drew_on'])} ({step['drew_on']['mass']:.0%} of the attention)"
        )
    copied = [w for w in step["copy"] or [] if w["share"] >= COPIED]
    if copied:
        lines.append(f"{indent}copied: " + ", ".join(f"{w['word']} (pointer {w['pointer_mass']:.2f})" for w in copied))
    return lines


def describe_slice(source: dict, observed: Callable[[int], str] = lambda i: f"observed sentence {i + 1}") -> str:
    """A window slice for a person: the observed sentence (named by `observed(index)`), the earlier predicted step,
    or the window's empty padding."""
    if source["source"] == "observed":
        return f'{observed(source["index"])} "{source["text"]}"'
    if source["source"] == "predicted":
        return f'predicted step {source["index"] + 1} "{source["text"]}"'
    return "an empty slot of the window"


def probability_text(p: float) -> str:
    """A probability in three decimals, or in scientific notation below 0.001 (so that it does not read as 0)."""
    return f"{p:.3f}" if p >= 1e-3 or p == 0 else f"{p:.1e}"

"""Multi-step scoring of predictors on the synthetic world's held-out episodes (read by
`world_model.data.synthetic.episodes`).

Scoring a checkpoint on held-out episodes, observing seconds 0-2 and predicting seconds 3-7:

    contexts, futures = observed_and_future(read_episodes("DATA_DIR/heldout"), observed=3, steps=5)
    predictions = predict_ahead(model, vocab, contexts, steps=5)     # greedy rollout, any registered model
    known = load_known_sentences(CHECKPOINT, vocab, model.config.n_tokens)     # the world's sentences, (C, N)
    predict_ahead(model, vocab, contexts, steps=5, candidates=known)   # closed-set readout
    next_state_accuracy(predictions, futures)                          # exact match per step ahead
    next_state_accuracy(copy_last_predictions(contexts, 5), futures)   # the copy-the-last-state baseline

or, for whole checkpoints beside copy-last and the simulator's ceiling (a Markdown table; `--json FILE` too):

    python -m world_model.data.synthetic.sentences --checkpoint offline_pack/predictor offline_pack/baseline \
        --data DATA_DIR/heldout --episodes 300 --observe 3 --steps 5 [--readout auto|sentences|tokens]
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import os
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from world_model.data.synthetic.episodes import episode_sentences, read_episodes
from world_model.models.decoding import READOUTS
from world_model.models.generation_config import GenerationConfig
from world_model.text.vocab import Vocabulary, same_sentence
from world_model.text.windows import caption_window, decode_states
from world_model.utils.cli import check_output
from world_model.utils.eval_mode import eval_mode
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main


def observed_and_future(records: Sequence[dict], observed: int, steps: int) -> tuple[list[list[str]], list[list[str]]]:
    """(contexts, futures): the sentences of seconds 0..observed-1 and of the `steps` seconds after, per episode."""
    if observed < 1 or steps < 1:
        raise ValueError(f"need observed >= 1 and steps >= 1, got {observed} and {steps}")
    contexts, futures = [], []
    for record in records:
        sentences = episode_sentences(record)
        if len(sentences) < observed + steps:
            raise ValueError(
                f"episode {record.get('id', '?')} has {len(sentences)} seconds, fewer than "
                f"observed + steps = {observed + steps}"
            )
        contexts.append(sentences[:observed])
        futures.append(sentences[observed : observed + steps])
    return contexts, futures


@torch.no_grad()
def predict_ahead(
    model: nn.Module,
    vocab: Vocabulary,
    contexts: Sequence[Sequence[str]],
    steps: int,
    batch_size: int = 256,
    candidates: torch.Tensor | None = None,
) -> list[list[str]]:
    """Greedy rollout of `steps` sentences after each context, with any registered predictor (its `rollout`);
    with `candidates` (C, N), the closed-set readout (`world_model.models.decoding`): every sentence is one of them.

    The window is the context's last n_states sentences, left-padded with empty states when it is shorter
    (as `world_model.text.windows.caption_window` builds it from captions); words outside `vocab` become the unknown
    id. Returns one list of `steps` sentences per context. The model runs in eval mode; its mode is restored.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    empty = [i for i, context in enumerate(contexts) if not context]
    if empty:
        raise ValueError(f"context(s) {empty[:5]} hold no sentence; a rollout needs at least one observed state")
    if not contexts:
        return []
    c = model.config
    windows = torch.cat(
        [caption_window(list(context), vocab, c.n_states, c.n_tokens).token_ids for context in contexts]
    )
    device = next(model.parameters()).device
    generation = GenerationConfig(end_ids=vocab.end_ids)
    predictions = []
    with eval_mode(model):
        for start in range(0, len(windows), batch_size):
            ids = model.rollout(
                windows[start : start + batch_size].to(device), steps, generation, candidates=candidates
            )  # (b, steps, N)
            predictions += [decode_states(rows, vocab) for rows in ids.cpu()]
    return predictions


def copy_last_predictions(contexts: Sequence[Sequence[str]], steps: int) -> list[list[str]]:
    """The copy-the-last-state baseline: each context's last sentence, repeated for `steps` steps."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if any(not context for context in contexts):
        raise ValueError("every context needs at least one sentence to copy")
    return [[context[-1]] * steps for context in contexts]


def next_state_accuracy(predictions: Sequence[Sequence[str]], truths: Sequence[Sequence[str]]) -> list[float]:
    """Exact-match accuracy per step ahead: element k is the fraction of rows whose k-th predicted sentence equals
    the k-th true one after `world_model.text.vocab.tokenize` (case, spacing). Every row must have the same number of steps."""
    if len(predictions) != len(truths):
        raise ValueError(f"{len(predictions)} prediction rows but {len(truths)} truth rows")
    if not predictions:
        raise ValueError("no rows to score")
    steps = len(truths[0])
    bad = [i for i, (p, t) in enumerate(zip(predictions, truths)) if len(p) != steps or len(t) != steps]
    if bad:
        raise ValueError(f"row(s) {bad[:5]} do not hold {steps} predicted and {steps} true sentences")
    hits = [0] * steps
    for predicted, true in zip(predictions, truths):
        for k in range(steps):
            hits[k] += same_sentence(predicted[k], true[k])
    return [h / len(truths) for h in hits]


def rounded(values: dict[str, list[float]]) -> dict[str, list[float]]:
    """Lists of rates per key (scene), sorted by key, each rate to 4 decimals."""
    return {kind: [round(v, 4) for v in vs] for kind, vs in sorted(values.items())}


def score_predictions(
    predictions: list[list[str]], futures: list[list[str]], kinds: list[str], ceilings: list[float]
) -> dict:
    """Next-state accuracy per step ahead, overall and per scene, and as a fraction of the ceiling."""
    accuracy = next_state_accuracy(predictions, futures)
    by_scene = {}
    for kind in sorted(set(kinds)):
        rows = [i for i, k in enumerate(kinds) if k == kind]
        by_scene[kind] = next_state_accuracy([predictions[i] for i in rows], [futures[i] for i in rows])
    return {
        "accuracy": [round(a, 4) for a in accuracy],
        "fraction_of_ceiling": [round(a / c, 4) for a, c in zip(accuracy, ceilings)],
        "per_scene": rounded(by_scene),
    }


def score_checkpoints(
    checkpoints: Sequence[str | os.PathLike],
    split_dir: str | os.PathLike,
    episodes: int,
    observed: int,
    steps: int,
    readout: str = "auto",
) -> dict:
    """Next-state accuracy per step ahead of each predictor checkpoint on the first `episodes` episodes of a
    held-out split, from the true sentences of the first `observed` seconds, beside copy-the-last-state and
    the simulator's k-step ceiling (overall and per scene); `readout` as in `readout_candidates`."""
    from world_model.data.synthetic.ceilings import k_step_ceilings
    from world_model.models.decoding import readout_candidates, readout_name
    from world_model.models.registry import load_predictor

    records = read_episodes(split_dir)[:episodes]
    contexts, futures = observed_and_future(records, observed, steps)
    kinds = [r["scene"] for r in records]
    ceilings = [k_step_ceilings(r, observed, steps) for r in records]  # (episodes, steps)
    ceiling = [sum(c[k] for c in ceilings) / len(records) for k in range(steps)]
    by_scene = {
        s: [sum(c[k] for c, x in zip(ceilings, kinds) if x == s) / kinds.count(s) for k in range(steps)]
        for s in set(kinds)
    }
    results = {
        "data": str(split_dir),
        "episodes": len(records),
        "observed": observed,
        "steps": steps,
        "ceiling": {"accuracy": ceiling, "per_scene": rounded(by_scene)},
        "predictors": {},
    }
    for checkpoint in checkpoints:
        model, vocab, known = load_predictor(checkpoint)
        candidates = readout_candidates(known, readout, checkpoint)
        entry = score_predictions(
            predict_ahead(model, vocab, contexts, steps, candidates=candidates), futures, kinds, ceiling
        )
        results["predictors"][str(checkpoint)] = {**entry, "readout": readout_name(candidates)}
    copy_last = score_predictions(copy_last_predictions(contexts, steps), futures, kinds, ceiling)
    results["predictors"]["copy the last state"] = {**copy_last, "readout": "-"}
    return results


def markdown_table(results: dict) -> str:
    """`score_checkpoints` results as two Markdown tables: per step ahead, then per scene one step ahead."""
    steps = range(1, results["steps"] + 1)
    lines = [
        "| | readout | " + " | ".join(f"k={k}" for k in steps) + " |",
        "|---|---|" + "---:|" * len(steps),
        "| ceiling | | " + " | ".join(f"{a:.3f}" for a in results["ceiling"]["accuracy"]) + " |",
    ]
    lines += [
        f"| {name} | {p['readout']} | " + " | ".join(f"{a:.3f}" for a in p["accuracy"]) + " |"
        for name, p in results["predictors"].items()
    ]
    scenes = list(results["ceiling"]["per_scene"])
    lines += [
        "",
        "| k=1 | " + " | ".join(scenes) + " |",
        "|---|" + "---:|" * len(scenes),
        "| ceiling | " + " | ".join(f"{results['ceiling']['per_scene'][s][0]:.3f}" for s in scenes) + " |",
    ]
    lines += [
        f"| {name} | " + " | ".join(f"{p['per_scene'][s][0]:.3f}" for s in scenes) + " |"
        for name, p in results["predictors"].items()
    ]
    return "\n".join(lines) + "\n"


@dataclass
class ScoreSettings:
    """Which checkpoints are scored on which held-out episodes, and how."""

    checkpoint: list[str] = field(metadata={"help": "predictor folder(s)"})
    data: str = field(metadata={"help": "held-out split folder (with episodes.jsonl)"})
    episodes: int = field(default=300, metadata={"help": "score the first N episodes (default 300)"})
    observe: int = field(default=3, metadata={"help": "observed seconds (default 3)"})
    steps: int = field(default=5, metadata={"help": "predicted seconds (default 5)"})
    readout: str = field(
        default="auto", metadata={"choices": READOUTS, "help": "as in pipeline.rollout (default auto)"}
    )
    json: str | None = field(default=None, metadata={"help": "also write the results to this JSON file"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --json file"})


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        ScoreSettings,
        "world_model.data.synthetic.sentences",
        "Next-state accuracy of predictor checkpoints on held-out synthetic-world episodes, from the true sentences "
        "(no video), beside copy-the-last-state and the simulator's ceiling.",
        lambda settings, _: score_command(settings),
        argv,
    )


def score_command(settings: ScoreSettings) -> None:
    """The command's work: score the checkpoints, print the table (and write the JSON)."""
    if settings.json:
        inputs = {"data folder": settings.data, **{f"checkpoint {i + 1}": c for i, c in enumerate(settings.checkpoint)}}
        check_output(settings.json, "--json", inputs, settings.overwrite)
    results = score_checkpoints(
        settings.checkpoint, settings.data, settings.episodes, settings.observe, settings.steps, settings.readout
    )
    print(markdown_table(results), end="")
    if settings.json:
        write_json_atomic(settings.json, results)


if __name__ == "__main__":
    raise SystemExit(main())

"""The synthetic world's sentence sequences as predictor data, and multi-step scoring of predictors on them.

A data folder written by ``python -m world_model.data.synthetic.generator generate`` holds ``train/episodes.jsonl``
(and ``heldout/episodes.jsonl``): one record per episode with one sentence per second. Training reads it as

    python -m world_model.training.train --config configs/world_model/synthetic.yaml --data DATA_DIR --out OUT_DIR

Every second t >= 1 of an episode is the target of one training window (T = n_states of the model config):
the T sentences before it, then sentence t, so every run of T + 1 consecutive sentences is a window, and
the first seconds, with fewer than T sentences before them, are left-padded with empty states exactly as
`world_model.text.windows.caption_window` pads a short clip. An episode of S seconds gives S - 1 windows of shape
(T + 1, N). The last ``VALIDATION_FRACTION`` of the training episodes (at least one) is the validation
split, and the vocabulary is built over every sentence of the training split.

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
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from world_model.data.rocstories import CLOZE_PATTERN, EXPECTED_FILES, TRAIN_PATTERN, DataError
from world_model.models.decoding import READOUTS
from world_model.models.generation_config import GenerationConfig
from world_model.text.vocab import PAD_ID, Vocabulary, same_sentence
from world_model.text.windows import caption_window, decode_states
from world_model.utils.cli import SettingsParser, add_verbose, check_writable, run_command
from world_model.utils.eval_mode import eval_mode

EPISODES_FILE = "episodes.jsonl"
TRAIN_SPLIT = "train"
VALIDATION_FRACTION = 0.1
GENERATE_HINT = "python -m world_model.data.synthetic.generator generate --episodes N --seed S --out DATA_DIR"


def read_records(split_dir: str | Path, limit: int | None = None) -> list[dict]:
    """The episode records of ``split_dir/episodes.jsonl`` (the first ``limit``), each with its clip's path."""
    split_dir = Path(split_dir)
    index = split_dir / "episodes.jsonl"
    if not index.is_file():
        raise FileNotFoundError(
            f"{index} not found: generate episodes with `python -m world_model.data.synthetic.generator generate --out DIR`"
        )
    with open(index, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    for record in records[:limit]:
        record["path"] = str(split_dir / record["video"])
    return records[:limit]


def data_kind(data_dir: str | os.PathLike) -> str:
    """ "world" when `data_dir` holds train/episodes.jsonl, "rocstories" when it holds ROCStories or Story Cloze
    CSVs; a DataError naming both layouts otherwise (or when it holds both)."""
    data_dir = Path(data_dir)
    layouts = (
        f"either a synthetic world ({TRAIN_SPLIT}/{EPISODES_FILE}, written by `{GENERATE_HINT}`) "
        f"or ROCStories CSVs ({EXPECTED_FILES})"
    )
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such folder; expected it to hold {layouts}")
    world = (data_dir / TRAIN_SPLIT / EPISODES_FILE).is_file()
    rocstories = any(data_dir.glob(TRAIN_PATTERN)) or any(data_dir.glob(CLOZE_PATTERN))
    if world and rocstories:
        raise DataError(
            f"{data_dir} holds both {TRAIN_SPLIT}/{EPISODES_FILE} and ROCStories CSVs; keep one kind of data per folder"
        )
    if world:
        return "world"
    if rocstories:
        return "rocstories"
    if (data_dir / EPISODES_FILE).is_file():
        raise DataError(
            f"{data_dir} is a split folder ({EPISODES_FILE} directly inside); pass its parent, "
            f"which holds {TRAIN_SPLIT}/{EPISODES_FILE}"
        )
    raise DataError(f"{data_dir} holds no training data; expected {layouts}")


def read_episodes(split_dir: str | os.PathLike) -> list[dict]:
    """The episode records of `split_dir`/episodes.jsonl, in file order; each record's "sentences" are checked
    to be one {"second", "text"} entry per second, in order (DataError otherwise)."""
    try:
        records = read_records(split_dir)
    except FileNotFoundError as err:
        raise DataError(str(err)) from err
    except ValueError as err:  # a line that is not JSON
        raise DataError(f"{Path(split_dir) / EPISODES_FILE}: not valid JSON lines ({err})") from err
    if not records:
        raise DataError(f"{Path(split_dir) / EPISODES_FILE} holds no episodes")
    for line, record in enumerate(records, start=1):
        entries = record.get("sentences") if isinstance(record, dict) else None
        if (
            not isinstance(entries, list)
            or not entries
            or not all(
                isinstance(e, dict) and e.get("second") == t and isinstance(e.get("text"), str) and e["text"].strip()
                for t, e in enumerate(entries)
            )
        ):
            raise DataError(
                f"{Path(split_dir) / EPISODES_FILE}, line {line}: 'sentences' must be a non-empty list of "
                '{"second": 0, 1, ..., "text": non-empty} entries in order'
            )
    return records


def episode_sentences(record: dict) -> list[str]:
    """The sentences of one episode record, second by second."""
    return [entry["text"] for entry in record["sentences"]]


def split_validation(records: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(training, validation) episodes: the last VALIDATION_FRACTION of `records` (at least one) is validation."""
    if len(records) < 2:
        raise DataError(f"need at least 2 training episodes to carve a validation split, got {len(records)}")
    n_val = max(1, math.floor(VALIDATION_FRACTION * len(records)))
    return list(records[:-n_val]), list(records[-n_val:])


def known_sentences(data_dir: str | os.PathLike) -> list[str]:
    """The distinct sentences of `data_dir`/train (the vocabulary's pool), in order of first appearance: the
    closed set a predictor trained on this world can choose its next state from (`world_model.models.decoding`)."""
    records = read_episodes(Path(data_dir) / TRAIN_SPLIT)
    return list(dict.fromkeys(s for record in records for s in episode_sentences(record)))


def sentence_windows(
    episodes: Sequence[Sequence[str]], vocab: Vocabulary, n_states: int, n_tokens: int
) -> torch.Tensor:
    """One window per second t >= 1 of every episode, episode by episode and in time order: the `n_states`
    sentences before t (left-padded with empty states when fewer) and sentence t. LongTensor
    (S, n_states + 1, n_tokens); an episode of L sentences gives max(0, L - 1) windows."""
    windows = []
    for sentences in episodes:
        ids = vocab.encode_batch(list(sentences), n_tokens)  # (L, N)
        padded = torch.cat([ids.new_full((n_states, n_tokens), PAD_ID), ids])  # sentence j at row n_states + j
        windows += [padded[t : t + n_states + 1] for t in range(1, len(sentences))]
    return torch.stack(windows) if windows else torch.zeros(0, n_states + 1, n_tokens, dtype=torch.long)


def load_world_windows(
    data_dir: str | os.PathLike, n_states: int, n_tokens: int, train_subset: int | None = None
) -> tuple[Vocabulary, dict, torch.Tensor, torch.Tensor]:
    """(vocabulary, statistics, training windows, validation windows) of a synthetic-world folder.

    The vocabulary covers every sentence of `data_dir`/train; `train_subset` keeps the first K training
    episodes (after the validation split is carved off, so validation does not change with it).
    """
    records = read_episodes(Path(data_dir) / TRAIN_SPLIT)
    train_records, val_records = split_validation(records)
    all_sentences = [s for record in records for s in episode_sentences(record)]
    vocab = Vocabulary.build(all_sentences)
    used = train_records[:train_subset] if train_subset else train_records
    train_windows = sentence_windows([episode_sentences(r) for r in used], vocab, n_states, n_tokens)
    val_windows = sentence_windows([episode_sentences(r) for r in val_records], vocab, n_states, n_tokens)
    if not len(train_windows) or not len(val_windows):
        raise DataError(
            f"{data_dir}: the episodes need at least 2 seconds each to give windows "
            f"(training windows {len(train_windows)}, validation windows {len(val_windows)})"
        )
    _, encoding = vocab.encode_with_stats(all_sentences, n_tokens)
    pool = torch.cat([train_windows, val_windows])
    stats = {
        "data": "synthetic_world",
        "vocab_size": len(vocab),
        "train_episodes": len(train_records),
        "validation_episodes": len(val_records),
        "distinct_sentences": len(set(all_sentences)),
        "pad_fraction": float((pool == PAD_ID).double().mean()),
        "truncated_sentences": encoding["truncated"],
        "validation_last_sentence_tokens": int((val_windows[:, -1] != PAD_ID).sum()),
        "uniform_cross_entropy": math.log(len(vocab)),
    }
    return vocab, stats, train_windows, val_windows


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = SettingsParser(
        ScoreSettings,
        prog="python -m world_model.data.synthetic.sentences",
        description="Next-state accuracy of predictor checkpoints on held-out synthetic-world episodes, from the "
        "true sentences (no video), beside copy-the-last-state and the simulator's ceiling.",
    )
    add_verbose(parser)
    settings, args = parser.parse(argv)
    return run_command(lambda: score_command(settings), verbose=args.verbose)


def score_command(settings: ScoreSettings) -> None:
    """The command's work: score the checkpoints, print the table (and write the JSON)."""
    if settings.json:
        check_writable(settings.json, "--json")
    results = score_checkpoints(
        settings.checkpoint, settings.data, settings.episodes, settings.observe, settings.steps, settings.readout
    )
    print(markdown_table(results), end="")
    if settings.json:
        Path(settings.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())

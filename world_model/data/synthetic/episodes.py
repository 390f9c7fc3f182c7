"""The synthetic world's sentence sequences as predictor data.

A data folder written by ``python -m world_model.data.synthetic.generator generate`` holds ``train/episodes.jsonl``
(and ``heldout/episodes.jsonl``): one record per episode with one sentence per second. Training reads it as

    python -m world_model.training.train --config configs/world_model/synthetic.yaml --data DATA_DIR --out OUT_DIR

Every second t >= 1 of an episode is the target of one training window (T = n_states of the model config):
the T sentences before it, then sentence t, so every run of T + 1 consecutive sentences is a window, and
the first seconds, with fewer than T sentences before them, are left-padded with empty states exactly as
`world_model.text.windows.caption_window` pads a short clip. An episode of S seconds gives S - 1 windows of shape
(T + 1, N). The last ``VALIDATION_FRACTION`` of the training episodes (at least one) is the validation
split, and the vocabulary is built over every sentence of the training split. Scoring predictors on these
episodes is `world_model.data.synthetic.sentences`.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import math
import os
from pathlib import Path
from typing import Sequence

import torch

from world_model.data.rocstories import CLOZE_PATTERN, EXPECTED_FILES, TRAIN_PATTERN, DataError
from world_model.text.vocab import PAD_ID, Vocabulary

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

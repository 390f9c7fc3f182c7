"""Closed-set readout: choose the next sentence from a fixed set of known sentences.

Where every state of a world is one of a known set of sentences (the synthetic world has 132), a predictor
can score each known sentence as the next state and pick one, instead of reading tokens off freely. For the
4-tensor model this matters: its readout gives each token slot x its own distribution p_xv (section 3.7), so where
the next state is a random draw between sentences of different shapes the per-slot winners can come from
different sentences and form none. Scoring whole sentences picks the most likely of them.

A candidate set is a (C, N) tensor of token ids, one known sentence per row, right-padded with the padding id.
A predictor folder that holds known_sentences.txt (one sentence per line, written by `world_model.training.train` for
synthetic-world data) offers it; the pipeline then uses the closed-set readout unless told otherwise.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterable

import torch

from world_model.models.generation_config import sample_ids
from world_model.text.vocab import UnknownWordError, Vocabulary, tokenize

KNOWN_SENTENCES_NAME = "known_sentences.txt"  # in a predictor folder: one known sentence per line
CALIBRATION_NAME = "calibration.json"  # in a predictor folder: {"temperature": tau, ...} of its known-sentence readout
READOUTS = ("auto", "sentences", "tokens")  # how a predictor reads its next sentence off (`readout_candidates`)


def check_candidates(candidates: torch.Tensor, n_tokens: int, padding_idx: int, vocab_size: int) -> None:
    """Raise ValueError unless `candidates` is a (C, N) integer tensor of in-vocabulary ids, C >= 1, each row
    holding at least one content token."""
    if candidates.dim() != 2 or candidates.shape[1] != n_tokens or candidates.shape[0] == 0:
        raise ValueError(f"candidates must be (C, N={n_tokens}) with C >= 1, got shape {tuple(candidates.shape)}")
    if candidates.dtype.is_floating_point or candidates.dtype == torch.bool:
        raise ValueError(f"candidates must hold integer token ids, got dtype {candidates.dtype}")
    if candidates.min() < 0 or candidates.max() >= vocab_size:
        raise ValueError(
            f"candidate ids must lie in [0, {vocab_size}), got {int(candidates.min())}..{int(candidates.max())}"
        )
    empty = (candidates == padding_idx).all(dim=1).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"candidate row(s) {empty[:5]} hold only padding; every candidate must be a sentence")


def slot_log_likelihood(log_probs: torch.Tensor, candidates: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """Score each candidate under per-slot distributions: log_probs (B, N, V), candidates (C, N) -> (B, C).

    A candidate's score is the sum over its content slots n of log_probs[b, n, candidates[c, n]]; padding
    slots are not scored, as padding is never a training target.
    """
    n_tokens = candidates.shape[1]
    picked = log_probs[:, torch.arange(n_tokens, device=log_probs.device)[None, :], candidates]  # (B, C, N)
    return picked.masked_fill(candidates == padding_idx, 0.0).sum(dim=-1)  # padding may be -inf: not a product


def choose_candidates(
    scores: torch.Tensor,
    candidates: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One candidate per row: scores (B, C) log-likelihoods, candidates (C, N) -> token ids (B, N).

    The choice follows `sample_ids`: the highest score at temperature 0, else a draw from
    softmax(scores / temperature) within the top_k candidates, using `generator` for reproducible futures.
    """
    choice = sample_ids(scores, temperature, top_k, generator)  # (B,)
    return candidates[choice.to(candidates.device)]


def write_known_sentences(folder: str | os.PathLike, sentences: Iterable[str]) -> Path:
    """Write the distinct `sentences` (first occurrence kept, in order), one per line, to FOLDER/known_sentences.txt."""
    distinct = list(dict.fromkeys(" ".join(s.split()) for s in sentences))
    if not distinct or any(not s or "\n" in s for s in distinct):
        raise ValueError("known sentences must be a non-empty list of non-empty one-line sentences")
    path = Path(folder) / KNOWN_SENTENCES_NAME
    path.write_text("".join(f"{s}\n" for s in distinct), encoding="utf-8")
    return path


def load_known_sentences(folder: str | os.PathLike, vocab: Vocabulary, n_tokens: int) -> torch.Tensor | None:
    """The candidate set (C, N) of a predictor folder's known_sentences.txt, or None when the folder has none.

    Raises ValueError, naming the file and line, for an empty file, a word outside `vocab` or a sentence
    longer than `n_tokens` tokens (it could never be predicted whole)."""
    path = Path(folder) / KNOWN_SENTENCES_NAME
    if not path.is_file():
        return None
    lines = [
        (i, line.strip()) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()
    ]
    if not lines:
        raise ValueError(f"{path} lists no sentences; delete it to use the model's own readout")
    rows = []
    for number, sentence in lines:
        try:
            rows.append(vocab.encode(sentence, n_tokens, strict=True))
        except UnknownWordError as err:
            raise ValueError(f"{path}, line {number}: {err}") from err
        if len(tokenize(sentence)) > n_tokens:
            raise ValueError(
                f"{path}, line {number}: {len(tokenize(sentence))} tokens, more than the model's {n_tokens} slots"
            )
    return torch.tensor(rows, dtype=torch.long).unique(dim=0)


def load_confidence_temperature(folder: str | os.PathLike) -> float:
    """The temperature tau that calibrates a folder's known-sentence probabilities softmax(score / tau)
    (`world_model.evaluation.calibration --save`), from FOLDER/calibration.json; 1.0 when the folder has none.
    ValueError naming the file when it holds no positive "temperature"."""
    path = Path(folder) / CALIBRATION_NAME
    if not path.is_file():
        return 1.0
    try:
        temperature = float(json.loads(path.read_text(encoding="utf-8"))["temperature"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} must be JSON with a number 'temperature': {err}") from err
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"{path}: 'temperature' must be a positive number, got {temperature}")
    return temperature


def readout_name(candidates: torch.Tensor | None) -> str:
    """How a rollout with these candidates reads its sentences off, for records and tables."""
    return "tokens" if candidates is None else f"sentences ({len(candidates)} known)"


def readout_candidates(known: torch.Tensor | None, readout: str, folder: str | os.PathLike) -> torch.Tensor | None:
    """The candidate set to decode with, given a predictor folder's known sentences (or None): `auto` uses them
    when there are some, `sentences` requires them, `tokens` reads tokens off freely (the model's own readout)."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {', '.join(READOUTS)}, got {readout!r}")
    if readout == "sentences" and known is None:
        raise ValueError(
            f"readout 'sentences' needs {KNOWN_SENTENCES_NAME} in the predictor folder {folder}, which "
            "has none; use readout 'tokens'"
        )
    return None if readout == "tokens" else known

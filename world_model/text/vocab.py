"""Word-level tokenizer and vocabulary for the semantic layer.

A sentence is encoded as a row of ``N`` token ids (default ``N = 16``): truncated when longer,
right-padded with ``PAD_ID = 0`` when shorter. Id 1 is the unknown word. A window of ``T + 1``
sentences is therefore a ``LongTensor`` of shape ``(T + 1, N)``; a batch of texts encodes to
shape ``(len(texts), N)``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import torch

PAD_ID = 0
UNK_ID = 1
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
SENTENCE_END_TOKENS = (".", "!", "?")
VOCAB_FILE = "vocab.json"
FORMAT = "word-level"

_TOKEN_RE = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*|[^\w\s]|_")
_ATTACH_LEFT = frozenset(".,!?;:%)]}")
_ATTACH_RIGHT = frozenset("([{$")
_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-case word and punctuation tokens.

    The text is lower-cased; a word is a run of letters and digits (any script, so "café" stays one
    word) that keeps internal apostrophes and hyphens ("didn't", "ice-cream"), and every other
    non-space character is a token of its own. Whitespace is dropped; nothing else is.

    >>> tokenize("Tom didn't go home, did he?")
    ['tom', "didn't", 'go', 'home', ',', 'did', 'he', '?']
    """
    return _TOKEN_RE.findall(text.lower())


def same_sentence(a: str, b: str) -> bool:
    """Whether two texts are the same sentence up to case and spacing (equal ``tokenize`` tokens).

    >>> same_sentence("The ball falls.", "the ball falls .")
    True
    """
    return tokenize(a) == tokenize(b)


def detokenize(tokens: Iterable[str]) -> str:
    """Join tokens with spaces, attaching closing punctuation (``. , ! ? ; : % )``) to the word
    before it and opening marks (``( $``) to the word after it.

    >>> detokenize(["tom", "went", "home", "."])
    'tom went home.'
    """
    text = ""
    glue_next = True
    for token in tokens:
        if not (glue_next or token in _ATTACH_LEFT):
            text += " "
        text += token
        glue_next = token in _ATTACH_RIGHT
    return text


class UnknownWordError(KeyError, ValueError):
    """A strict encoding met words that are not in the vocabulary."""

    def __init__(self, words: Sequence[str]):
        self.words = tuple(words)
        super().__init__(f"word(s) not in vocabulary: {', '.join(map(repr, self.words))}")

    def __str__(self) -> str:
        return str(self.args[0])


class Vocabulary:
    """Bidirectional token <-> id map; id 0 is ``PAD_TOKEN``, id 1 is ``UNK_TOKEN``."""

    def __init__(self, itos: Sequence[str]):
        itos = list(itos)
        if itos[:2] != [PAD_TOKEN, UNK_TOKEN]:
            raise ValueError(f"vocabulary must start with {PAD_TOKEN!r}, {UNK_TOKEN!r}; got {itos[:2]}")
        stoi = {token: i for i, token in enumerate(itos)}
        if len(stoi) != len(itos):
            duplicates = sorted(token for token, count in Counter(itos).items() if count > 1)
            raise ValueError(f"vocabulary has duplicate tokens: {duplicates[:10]}")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = stoi

    @classmethod
    def build(cls, sentences: Iterable[str], min_freq: int = 1) -> "Vocabulary":
        """Vocabulary of the tokens seen at least ``min_freq`` times, by descending frequency,
        ties broken alphabetically, after ``PAD_TOKEN`` and ``UNK_TOKEN``."""
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        counts = Counter(token for sentence in sentences for token in tokenize(sentence))
        words = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        return cls([PAD_TOKEN, UNK_TOKEN, *words])

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)})"

    def token_to_id(self, token: str) -> int:
        """Id of ``token``, or ``UNK_ID`` when it is not in the vocabulary."""
        return self.stoi.get(token, UNK_ID)

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Ids of the sentence-end marks (``SENTENCE_END_TOKENS``) that are in the vocabulary."""
        return tuple(self.stoi[t] for t in SENTENCE_END_TOKENS if t in self.stoi)

    def _row(self, tokens: list[str], n: int) -> list[int]:
        ids = [self.stoi.get(t, UNK_ID) for t in tokens[:n]]
        return ids + [PAD_ID] * (n - len(ids))

    def encode(self, text: str, n: int = 16, strict: bool = False) -> list[int]:
        """Exactly ``n`` ids for ``text``: truncated, or right-padded with ``PAD_ID``.

        Unknown words become ``UNK_ID``; with ``strict=True`` they raise ``UnknownWordError``.
        """
        _check_n(n)
        tokens = tokenize(text)
        if strict:
            unknown = sorted({t for t in tokens if t not in self.stoi})
            if unknown:
                raise UnknownWordError(unknown)
        return self._row(tokens, n)

    def encode_batch(self, texts: Sequence[str], n: int = 16) -> torch.Tensor:
        """``LongTensor`` of shape ``(len(texts), n)``, one padded row per text."""
        return self.encode_with_stats(texts, n)[0]

    def encode_with_stats(self, texts: Sequence[str], n: int = 16) -> tuple[torch.Tensor, dict]:
        """Encode like ``encode_batch`` and count what the encoding lost.

        Returns the ``(len(texts), n)`` ids and ``{"tokens", "unknown", "oov_rate",
        "truncated"}``: ``tokens`` are the non-padding ids kept, ``unknown`` those of them that
        are ``UNK_ID``, ``oov_rate = unknown / tokens`` (0.0 when there are none), and
        ``truncated`` the number of texts with more than ``n`` tokens.
        """
        _check_n(n)
        token_lists = [tokenize(text) for text in texts]
        rows = [self._row(tokens, n) for tokens in token_lists]
        ids = torch.tensor(rows, dtype=torch.long).reshape(len(rows), n)
        kept = int((ids != PAD_ID).sum())
        unknown = int((ids == UNK_ID).sum())
        stats = {
            "tokens": kept,
            "unknown": unknown,
            "oov_rate": unknown / kept if kept else 0.0,
            "truncated": sum(len(tokens) > n for tokens in token_lists),
        }
        return ids, stats

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Readable text for a list or 1-D tensor of ids; padding is skipped, ``UNK_ID`` reads
        ``<unk>``."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.dtype not in _INT_DTYPES:
                raise ValueError(f"decode expects a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
            ids = ids.tolist()
        size = len(self.itos)
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside [0, {size})")
        return detokenize([self.itos[i] for i in ids if i != PAD_ID])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary atomically and return the file written.

        ``path`` is either a ``*.json`` file or a directory, which receives ``vocab.json``.
        """
        path = Path(path)
        if path.suffix != ".json":
            path.mkdir(parents=True, exist_ok=True)
            path = path / VOCAB_FILE
        payload = {"format": FORMAT, "itos": self.itos, "pad_id": PAD_ID, "unk_id": UNK_ID}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, ensure_ascii=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        """Read a vocabulary written by ``save``; ``path`` is the file or its directory.

        Raises ``FileNotFoundError`` when there is no file and ``ValueError`` naming the file
        when it is not valid JSON, lacks a key, has the wrong format, pad/unk ids other than
        0/1, or duplicate tokens.
        """
        path = Path(path)
        if path.is_dir():
            path = path / VOCAB_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no vocabulary file at {path}")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a valid JSON vocabulary ({e})") from e
        if not isinstance(payload, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(payload).__name__}")
        missing = [k for k in ("format", "itos", "pad_id", "unk_id") if k not in payload]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        if payload["format"] != FORMAT:
            raise ValueError(f"{path}: format is {payload['format']!r}, expected {FORMAT!r}")
        if payload["pad_id"] != PAD_ID or payload["unk_id"] != UNK_ID:
            raise ValueError(
                f"{path}: pad_id/unk_id are {payload['pad_id']}/{payload['unk_id']}, expected {PAD_ID}/{UNK_ID}"
            )
        itos = payload["itos"]
        if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
            raise ValueError(f"{path}: 'itos' must be a list of strings")
        try:
            return cls(itos)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"sentence length n must be >= 1, got {n}")

"""The sentence bank a predictor reads whole sentences from: its sentences encoded for one vocabulary
(`SentenceBank`, with where their person names sit), its file in a predictor folder (sentence_bank.json.gz:
`save_bank`, `load_bank`) and building one from ROCStories training stories (`write_rocstories_bank`). How a
predictor picks from it is `world_model.generation.sentence_bank`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from world_model.text.vocab import PAD_ID, UnknownWordError, Vocabulary, tokenize
from world_model.utils.files import replacing_file

BANK_NAME = "sentence_bank.json.gz"  # in a predictor folder: {"sentences": [...], "names": [...], "source": ...}
_WORD = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")
_VERB_LIKE = frozenset(
    "was had went got is did took made saw felt knew told said gave ran came thought found bought "
    "could would and".split()
)  # a person's name is often followed by one, or by an -ed word


def find_names(
    sentences: Sequence[str], min_count: int = 3, capitalised: float = 0.9, verb_after: float = 0.3
) -> list[str]:
    """Person names in cased text, lower-cased, most frequent first.

    A name is an alphabetic word of two letters or more, seen at least `min_count` times past the first word of
    a sentence and capitalised there at least a `capitalised` share of the time (a proper noun), that is followed
    by a verb-like word (`_VERB_LIKE` or a word ending in -ed) at least a `verb_after` share of all its
    occurrences (a person rather than a place, a day or a language). The thresholds were set by reading the
    lists they give on the ROCStories training stories.
    """
    mid, mid_capitalised, total, before_verb = Counter(), Counter(), Counter(), Counter()
    for sentence in sentences:
        words = _WORD.findall(sentence)
        lower = [w.lower() for w in words]
        for i, (word, low) in enumerate(zip(words, lower)):
            total[low] += 1
            if i + 1 < len(lower) and (lower[i + 1] in _VERB_LIKE or lower[i + 1].endswith("ed")):
                before_verb[low] += 1
            if i > 0:
                mid[low] += 1
                mid_capitalised[low] += word[0].isupper()
    names = [
        w
        for w, n in mid.items()
        if n >= min_count
        and w.isalpha()
        and len(w) > 1
        and w != "i"
        and mid_capitalised[w] >= capitalised * n
        and before_verb[w] >= verb_after * total[w]
    ]
    return sorted(names, key=lambda w: (-total[w], w))


def distinct_sentences(sentences: Sequence[str], n_tokens: int) -> list[str]:
    """The sentences, first occurrence of each token sequence kept, without those longer than `n_tokens` tokens
    (they could never be predicted whole)."""
    kept: dict[tuple[str, ...], str] = {}
    for sentence in sentences:
        tokens = tuple(tokenize(sentence))
        if 0 < len(tokens) <= n_tokens:
            kept.setdefault(tokens, " ".join(sentence.split()))
    return list(kept.values())


def save_bank(folder: str | os.PathLike, sentences: Sequence[str], names: Sequence[str], source: str) -> Path:
    """Write FOLDER/sentence_bank.json.gz (gzip with a fixed time stamp, so equal banks are equal files)."""
    if not sentences:
        raise ValueError("a sentence bank needs at least one sentence")
    path = Path(folder) / BANK_NAME
    payload = json.dumps({"source": source, "names": list(names), "sentences": list(sentences)}, ensure_ascii=False)
    with replacing_file(path) as staged, open(staged, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(payload.encode("utf-8"))
    return path


@dataclass
class SentenceBank:
    """A bank encoded for one vocabulary: candidates (C, N) and where their person names sit.

    Name slots are listed as parallel (E,) tensors: the candidate row, the slot, the rank of the name within its
    sentence (0 for the first distinct name, 1 for the next, ...) and whether the slot is the possessive ("anna's").
    """

    candidates: torch.Tensor  # (C, N) token ids, right-padded with PAD_ID
    name_row: torch.Tensor  # (E,)
    name_slot: torch.Tensor  # (E,)
    name_rank: torch.Tensor  # (E,)
    name_possessive: torch.Tensor  # (E,) bool
    name_ids: dict[int, int]  # id of a name or its possessive -> id of the name
    possessive_ids: dict[int, int]  # id of a name -> id of its possessive, where the vocabulary has one

    def __post_init__(self) -> None:
        """A hash (C,) of every candidate row, to find the rows equal to a window's states fast, and room for the
        sentence vectors (C, dim) of a coherence head (`CoherentRanking.for_bank`)."""
        self.coherence_vectors: dict[tuple, torch.Tensor] = {}
        generator = torch.Generator().manual_seed(0)
        self.hash_weights = torch.randint(1, 2**40, (self.candidates.shape[1],), generator=generator)  # (N,)
        self.hashes = (self.candidates * self.hash_weights).sum(dim=1)

    @classmethod
    def encode(
        cls, sentences: Sequence[str], names: Sequence[str], vocab: Vocabulary, n_tokens: int, where: str = "the bank"
    ) -> "SentenceBank":
        """Encode `sentences` with `vocab`; ValueError naming the sentence for an unknown word or one longer than
        `n_tokens` tokens, and for an empty bank."""
        if not sentences:
            raise ValueError(f"{where} holds no sentences; a bank readout needs at least one")
        rows, stoi = [], vocab.stoi
        for number, sentence in enumerate(sentences, 1):
            tokens = tokenize(sentence)
            row = [stoi.get(t, -1) for t in tokens]
            if not tokens or len(tokens) > n_tokens:
                raise ValueError(
                    f"{where}, sentence {number} ({sentence!r}): {len(tokens)} tokens, expected 1 to "
                    f"the model's {n_tokens} slots"
                )
            if -1 in row:
                unknown = sorted({t for t in tokens if t not in stoi})
                raise ValueError(
                    f"{where}, sentence {number} ({sentence!r}): {UnknownWordError(unknown)}; was the bank "
                    "built for this checkpoint's vocabulary?"
                )
            rows.append(row + [PAD_ID] * (n_tokens - len(row)))
        candidates = torch.tensor(rows, dtype=torch.long)
        name_ids = {stoi[w]: stoi[w] for w in names if w in stoi}
        possessive_ids = {stoi[w]: stoi[f"{w}'s"] for w in names if w in stoi and f"{w}'s" in stoi}
        name_ids.update({p: n for n, p in possessive_ids.items()})
        with_names = torch.isin(candidates, torch.tensor(list(name_ids), dtype=torch.long)).any(dim=1)
        found = []  # (row, slot, rank, possessive)
        for row in with_names.nonzero().flatten().tolist():
            ranks: dict[int, int] = {}
            for slot, token in enumerate(rows[row]):
                if token in name_ids:
                    base = name_ids[token]
                    found.append((row, slot, ranks.setdefault(base, len(ranks)), token != base))
        table = torch.tensor(found, dtype=torch.long).reshape(-1, 4)
        return cls(candidates, *table[:, :3].T, table[:, 3].bool(), name_ids, possessive_ids)

    def context_names(self, window: torch.Tensor) -> list[int]:
        """Distinct name ids of a window (T, N), possessives read as their name, in order of first appearance."""
        return list(dict.fromkeys(self.name_ids[t] for t in window.flatten().tolist() if t in self.name_ids))

    def name_edits(self, names: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The edits that put `names` into the bank (rank r -> names[r], where there is one): rows (E',),
        slots (E',) and new ids (E',). A possessive the vocabulary lacks keeps the bank's own name."""
        use = self.name_rank < len(names)
        if not names or not use.any():
            return self.name_row[:0], self.name_slot[:0], self.name_row[:0]
        rank = self.name_rank[use]
        possessives = torch.tensor([self.possessive_ids.get(n, -1) for n in names])
        new = torch.where(self.name_possessive[use], possessives[rank], torch.tensor(names)[rank])
        keep = new >= 0
        return self.name_row[use][keep], self.name_slot[use][keep], new[keep]

    def substitute_edits(self, edits: tuple[torch.Tensor, ...], rows: torch.Tensor | None = None) -> torch.Tensor:
        """The candidates (C, N), or those of `rows` (R,) -> (R, N), with `edits` (`name_edits`) applied."""
        edit_rows, slots, new = edits
        if rows is None:
            out = self.candidates.clone()
            out[edit_rows, slots] = new
            return out
        out = self.candidates[rows]  # (R, N), a copy
        for r, row in enumerate(rows.tolist()):
            hit = edit_rows == row
            out[r, slots[hit]] = new[hit]
        return out


def load_bank(folder: str | os.PathLike, vocab: Vocabulary, n_tokens: int) -> SentenceBank | None:
    """The bank of a predictor folder's sentence_bank.json.gz, or None when the folder has none; ValueError
    naming the file when it is unreadable or does not fit `vocab` and `n_tokens`."""
    path = Path(folder) / BANK_NAME
    if not path.is_file():
        return None
    try:
        payload = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
        sentences, names = payload["sentences"], payload["names"]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a sentence bank (gzip JSON with 'sentences' and 'names'): {err}") from err
    return SentenceBank.encode(sentences, names, vocab, n_tokens, where=str(path))


def write_rocstories_bank(folder: str | os.PathLike, data_dir: str | os.PathLike, stories: int | None = None) -> Path:
    """Write a predictor folder's bank from the training stories of a ROCStories folder (the first `stories` of
    them, or all): their distinct sentences that fit the model's slots and the names found in them."""
    from world_model.data.rocstories import load_corpus

    config = json.loads((Path(folder) / "config.json").read_text())
    vocab = Vocabulary.load(folder)
    train = load_corpus(data_dir).train[:stories]
    sentences = distinct_sentences([s for story in train for s in story.sentences], config["n_tokens"])
    names = find_names(sentences)
    SentenceBank.encode(sentences, names, vocab, config["n_tokens"])  # fails now, not when a rollout loads it
    return save_bank(folder, sentences, names, source=f"{len(train)} training stories of {data_dir}")

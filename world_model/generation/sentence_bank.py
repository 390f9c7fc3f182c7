"""Sentence-bank readout: predict whole sentences of open text, picked from a bank of corpus sentences.

The 4-tensor model reads each word slot of the next sentence off its own distribution p_xv (section 3.7); on
open-ended stories the per-slot winners come from different sentences and read as none ("he he to kitchen.").
The bank readout scores every sentence of a bank (the training stories' sentences, about 100,000) as the next
state with the model's per-slot log-likelihood (`world_model.models.decoding.slot_log_likelihood`, one gather per
candidate), divided by the candidate's length to the power `length_power` (the summed score alone favours the
shortest sentences), and takes the best. Two rules keep the result about the story being told:

- **Names.** A bank sentence about "Anna" is scored and returned about the window's own people: the person
  names of a bank sentence, in order of first appearance, are replaced by those of the window, in order of
  first appearance ("Anna's" by "Tom's" when the vocabulary has it). Names are the words the bank's own text
  capitalises mid-sentence and follows with a verb (`find_names`).
- **Repeat guard.** A sentence already in the window is never predicted again, so a rollout does not loop.

Opt-in, with a predictor folder's coherence head (`world_model.models.coherence_head`, `--coherence` of the
commands): each sentence's score gains `COHERENCE_WEIGHT` times the head's score of it as the next sentence (the
head's similarity of the window and the sentence, plus its weight times the predictor's per-token likelihood ratio
against a blank window), so the pick follows what the head learned comes next rather than what restates the window.

A predictor folder carries its bank as sentence_bank.json.gz (`save_bank`, `python -m world_model.generation.sentence_bank`);
any folder with one reads its states off the bank unless told otherwise (`resolve_readout`).

    python -m world_model.generation.sentence_bank --data ../shared/data/rocstories --out world_model/pretrained/rocstories-cpu
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import gzip
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch

from world_model.models.checkpoint import CheckpointError, resolve_folder
from world_model.models.coherence_head import HEAD_CONFIG, CoherenceHead, load_coherence_head, pooled_state
from world_model.models.decoding import KNOWN_SENTENCES_NAME, choose_candidates, load_confidence_temperature
from world_model.models.explanations import ALTERNATIVES, LastSliceProbe, StepExplanation, closed_set_choice
from world_model.models.four_tensor import FourTensorModel
from world_model.models.generation_config import READOUT_CHOICES, GenerationConfig
from world_model.models.precision import autocast
from world_model.models.rollout import slide_rollout
from world_model.text.vocab import PAD_ID, UNK_ID, UnknownWordError, Vocabulary, tokenize
from world_model.utils.cli import SettingsParser, add_verbose, run_command

BANK_NAME = "sentence_bank.json.gz"  # in a predictor folder: {"sentences": [...], "names": [...], "source": ...}
SAMPLE_TOP_K = 20  # sampling draws among this many best sentences unless top_k is given: over the whole bank,
# length-normalised scores are nearly flat and a draw is any sentence at all
# score = summed slot log-likelihood / length ** LENGTH_POWER, chosen in results/readout/selection.md
LENGTH_POWER = 1.5
# weight of the coherence head's score beside the length-normalised likelihood, chosen on held-out training stories
# (results/coherence/readout/coherence_selection.md: highest content-word F1)
COHERENCE_WEIGHT = 0.1
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
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
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


def slot_log_probs(model, window: torch.Tensor) -> torch.Tensor | None:
    """Per-slot log-probabilities (B, N, V) of the next state for the 4-tensor model, padding and the unknown
    word excluded as in its own readout; None for a model with `score_sentences` (the flat baseline)."""
    if hasattr(model, "score_sentences"):
        return None
    logits = model.last_slice_logits(window).float().clone()
    logits[..., [PAD_ID, UNK_ID]] = float("-inf")
    return logits.log_softmax(dim=-1)


def bank_scores(
    bank: SentenceBank,
    edits: tuple[torch.Tensor, ...],
    log_probs: torch.Tensor | None = None,
    model=None,
    window: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-likelihood (C,) of every bank sentence, with `edits` (`name_edits`) applied, as the next state.

    For the 4-tensor model, from its per-slot `log_probs` (N, V) of one window: the sum over content slots
    of log_probs[n, candidate[n]] (`slot_log_likelihood`), computed as one gather over the bank and a correction
    at the edited slots, so the substituted bank is never written. Otherwise `model.score_sentences` on the
    window (1, T, N) and the substituted bank (the flat baseline).
    """
    if log_probs is None:
        return model.score_sentences(window, bank.substitute_edits(edits))[0].cpu()
    n_tokens, vocab_size = log_probs.shape
    table = log_probs.masked_fill(torch.arange(vocab_size) == PAD_ID, 0.0).flatten()  # a padding slot adds 0
    offsets = torch.arange(n_tokens) * vocab_size  # slot n's row of the flattened (N, V) table
    scores = table[bank.candidates + offsets].sum(dim=1)  # (C,)
    rows, slots, new = edits
    old = bank.candidates[rows, slots]
    return scores.index_add_(0, rows, table[offsets[slots] + new] - table[offsets[slots] + old])


def seen_in_window(bank: SentenceBank, edits: tuple[torch.Tensor, ...], window: torch.Tensor) -> torch.Tensor:
    """Which bank sentences (C,) bool, with `edits` applied, equal a state of the window (T, N): a hash of each
    row narrows the search, an exact comparison decides."""
    rows, slots, new = edits
    weights = bank.hash_weights
    hashes = bank.hashes.clone().index_add_(0, rows, (new - bank.candidates[rows, slots]) * weights[slots])
    maybe = torch.isin(hashes, (window * weights).sum(dim=1)).nonzero().flatten()
    seen = torch.zeros(len(hashes), dtype=torch.bool)
    if len(maybe):
        rows_now = bank.substitute_edits(edits, maybe)  # (M, N)
        seen[maybe] = (rows_now[:, None, :] == window[None]).all(dim=-1).any(dim=-1)
    return seen


@dataclass
class CoherentRanking:
    """What the coherence head adds to the bank scores of one step: the head, its sentence vectors of the bank
    (C, dim), the window's context vectors (B, dim) and the predictor's per-slot log-probabilities after a blank
    window (N, V)."""

    head: CoherenceHead
    sentences: torch.Tensor
    context: torch.Tensor | None = None
    blank: torch.Tensor | None = None

    @classmethod
    def for_bank(cls, head: CoherenceHead, bank: SentenceBank) -> "CoherentRanking":
        """The ranking of `bank` with `head`; the bank's sentence vectors are computed once per bank and head."""
        weight = head.sentence_encoder.embedding.weight
        key = (id(head), weight.data_ptr(), weight._version)
        if key not in bank.coherence_vectors:
            bank.coherence_vectors = {key: head.sentence_encoder(bank.candidates)}  # the latest head's only
        return cls(head, bank.coherence_vectors[key])

    def read(self, model, window: torch.Tensor) -> None:
        """Set the context vectors and the blank log-probabilities for the windows (B, T, N) of this step."""
        self.context = self.head.context_vectors(pooled_state(model.encode(window), window), window).cpu()
        self.blank = self.head.slot_log_probs(model, torch.zeros_like(window[:1]))[0].cpu()

    def scores(self, b: int, bank: SentenceBank, edits: tuple[torch.Tensor, ...], likelihood: torch.Tensor):
        """The head's score (C,) of every bank sentence after window b, given their summed log-likelihoods (C,)."""
        blank = bank_scores(bank, edits, self.blank)
        tokens = (bank.candidates != PAD_ID).sum(dim=1).clamp(min=1)
        ratio = (likelihood - blank) / tokens
        return self.head.scale * (self.sentences @ self.context[b]) + self.head.config.model_weight * ratio


@torch.no_grad()
def bank_rollout(
    model,
    window: torch.Tensor,
    steps: int,
    bank: SentenceBank,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    names: bool = True,
    guard: bool = True,
    length_power: float = LENGTH_POWER,
    coherence: CoherenceHead | None = None,
    coherence_weight: float = COHERENCE_WEIGHT,
    explanations: list[StepExplanation] | None = None,
    alternatives: int = ALTERNATIVES,
) -> torch.Tensor:
    """Predict `steps` states of each window (B, T, N) -> (B, steps, N), each a bank sentence.

    Each step scores the bank for every window (`bank_scores`), with the window's names put in when `names`,
    divides each score by the sentence's length ** `length_power`, excludes sentences already in the window
    when `guard` (unless that excludes them all), adds `coherence_weight` times the `coherence` head's score when a
    head is given (module docstring), takes the best (temperature 0) or samples from
    softmax(score / temperature) within the top_k (default `SAMPLE_TOP_K`), and slides the window as
    `model.rollout` does. The bank
    stays on the CPU; the model runs where its weights are, and the states come back on the window's device.
    Given a list, `explanations` receives each step's `StepExplanation` (on the CPU): probabilities are the softmax of
    the length-normalised scores over the bank (guarded sentences 0), with `alternatives` runner-ups.
    """
    device, top_k = window.device, top_k or SAMPLE_TOP_K
    index = torch.arange(len(bank.candidates))[:, None]  # (C, 1): `choose_candidates` then returns row numbers
    length = (bank.candidates != PAD_ID).sum(dim=1).float() ** length_power  # (C,)
    if coherence is not None and not hasattr(model, "last_slice_logits"):
        raise ValueError("a coherence head reads the 4-tensor predictor's state; this model has none")
    ranking = None if coherence is None else CoherentRanking.for_bank(coherence.cpu(), bank)

    def next_state(window: torch.Tensor) -> torch.Tensor:  # (B, T, N) on the CPU -> (B, N)
        with LastSliceProbe(model, active=explanations is not None) as probe:
            log_probs = slot_log_probs(model, window.to(device))
        if ranking is not None:
            ranking.read(model, window.to(device))
        states, choices = [], []
        for b in range(len(window)):
            edits = bank.name_edits(bank.context_names(window[b]) if names else [])
            likelihood = bank_scores(
                bank, edits, None if log_probs is None else log_probs[b].cpu(), model, window[b : b + 1].to(device)
            )
            scores = likelihood / length
            if ranking is not None:
                scores = scores + coherence_weight * ranking.scores(b, bank, edits, likelihood)
            if guard:
                seen = seen_in_window(bank, edits, window[b])
                if not seen.all():
                    scores = scores.masked_fill(seen, float("-inf"))
            row = choose_candidates(scores[None], index, temperature, top_k, generator)[0]  # (1,)
            states.append(bank.substitute_edits(edits, row)[0])
            if explanations is not None:
                p, rows, p_rows = closed_set_choice(scores[None], row, alternatives)
                choices.append((p, bank.substitute_edits(edits, rows[0])[None], p_rows))
        state = torch.stack(states)  # (B, N)
        if explanations is not None:
            p, alts, p_alts = (torch.cat(parts) for parts in zip(*choices))
            seen = {} if log_probs is None else probe.attribution(state.to(device), log_probs, PAD_ID)
            seen = {k: None if v is None else v.cpu() for k, v in seen.items()}
            explanations.append(StepExplanation(p, alts, p_alts, **seen))
        return state

    return slide_rollout(window.cpu(), steps, model.config.n_states, next_state).to(device)


def can_explain(model) -> bool:
    """Whether `model`'s rollouts record `StepExplanation`s (the 4-tensor predictor's do; the flat baseline's not)."""
    return isinstance(model, FourTensorModel)


@dataclass
class Readout:
    """How a predictor reads its states off: "tokens" (the paper's per-slot readout), "sentences" (a known
    closed set, `world_model.models.decoding`) or "bank" (this module)."""

    kind: str
    known: torch.Tensor | None = None  # (C, N) for "sentences"
    bank: SentenceBank | None = None  # for "bank"
    confidence_temperature: float = 1.0  # for "sentences": explanations report softmax(score / this)
    coherence: CoherenceHead | None = None  # for "bank": rank with the folder's coherence head

    @property
    def name(self) -> str:
        """For records and tables."""
        if self.kind == "tokens":
            return "tokens"
        if self.kind == "bank":
            return f"bank ({len(self.bank.candidates)} sentences)"
        calibrated = (
            "" if self.confidence_temperature == 1 else f", confidence temperature {self.confidence_temperature:g}"
        )
        return f"sentences ({len(self.known)} known{calibrated})"

    def rollout(
        self,
        model,
        window: torch.Tensor,
        steps: int,
        generation: GenerationConfig,
        generator: torch.Generator | None,
        explanations: list[StepExplanation] | None = None,
    ) -> torch.Tensor:
        """Predicted states (B, steps, N) of windows (B, T, N); `generation.end_ids` end a sentence of the tokens
        readout, its temperature and top_k apply to every readout. Given a list (and a model that `can_explain`),
        `explanations` receives each step's `world_model.models.explanations.StepExplanation`."""
        explain = (
            {} if explanations is None else {"explanations": explanations, "alternatives": generation.alternatives}
        )
        generation = replace(generation, confidence_temperature=self.confidence_temperature)
        if self.kind == "bank":
            return bank_rollout(
                model,
                window,
                steps,
                self.bank,
                generation.temperature,
                generation.top_k,
                generator,
                coherence=self.coherence,
                **explain,
            )
        return model.rollout(window, steps, generation, generator, candidates=self.known, **explain)

    def futures(
        self,
        model,
        vocab: Vocabulary,
        window: torch.Tensor,
        steps: int,
        generation: GenerationConfig,
        explanations: list[list[StepExplanation]] | None = None,
    ) -> list[torch.Tensor]:
        """`generation.futures` rollouts of `steps` states from one window (1, T, N), drawn in turn from one generator
        seeded with `generation.seed`, under its precision, a sentence ending at the vocabulary's end tokens; each a
        (steps, N) tensor of ids on the CPU. Given a list, `explanations` receives one list of `steps`
        StepExplanations per future (for a model that `can_explain`)."""
        generation = replace(generation, end_ids=vocab.end_ids)
        generator = generation.generator()
        futures = []
        for _ in range(generation.futures):
            steps_seen = [] if explanations is not None and can_explain(model) else None
            with autocast(generation.precision, window.device):
                futures.append(self.rollout(model, window, steps, generation, generator, steps_seen)[0].cpu())
            if explanations is not None:
                explanations.append(steps_seen)
        return futures


def resolve_readout(
    folder: str | os.PathLike,
    known: torch.Tensor | None,
    readout: str,
    vocab: Vocabulary,
    n_tokens: int,
    coherence_for=None,
) -> Readout:
    """The readout a predictor folder gets: `auto` takes its known sentences, else its sentence bank, else
    tokens; `sentences` and `bank` require the file; `tokens` reads tokens off freely. With `coherence_for`, the
    folder's predictor, its bank readout ranks with the folder's coherence head, which it then must have."""
    if coherence_for is not None:
        return coherent_readout(folder, coherence_for, resolve_readout(folder, known, readout, vocab, n_tokens))
    if readout not in READOUT_CHOICES:
        raise ValueError(f"readout must be one of {', '.join(READOUT_CHOICES)}, got {readout!r}")
    if readout == "tokens":
        return Readout("tokens")
    if readout == "sentences" or (readout == "auto" and known is not None):
        if known is None:
            raise ValueError(
                f"readout 'sentences' needs {KNOWN_SENTENCES_NAME} in the predictor folder {folder}, "
                "which has none; use readout 'tokens'"
            )
        return Readout(
            "sentences", known=known, confidence_temperature=load_confidence_temperature(resolve_folder(folder))
        )
    bank = load_bank(resolve_folder(folder), vocab, n_tokens)
    if bank is None and readout == "bank":
        raise ValueError(
            f"readout 'bank' needs {BANK_NAME} in the predictor folder {folder}, which has none; build "
            "one with python -m world_model.generation.sentence_bank, or use readout 'tokens'"
        )
    return Readout("tokens") if bank is None else Readout("bank", bank=bank)


def coherent_readout(folder: str | os.PathLike, model, readout: Readout) -> Readout:
    """`readout` ranking its bank with the folder's coherence head; ValueError unless it is a bank readout and the
    folder holds a head that fits `model`."""
    if readout.kind != "bank":
        raise ValueError(f"coherence ranks the sentences of a bank readout; this one reads {readout.name}")
    try:
        head = load_coherence_head(resolve_folder(folder), model)
    except CheckpointError as err:
        raise ValueError(str(err)) from err
    if head is None:
        raise ValueError(
            f"coherence needs {HEAD_CONFIG} in the predictor folder {folder}, which has none; train one with "
            "python -m world_model.training.coherence"
        )
    return replace(readout, coherence=head)


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


@dataclass
class BankSettings:
    """Which stories make the bank and which predictor folder receives it."""

    data: str = field(metadata={"help": "ROCStories folder (its training stories make the bank)"})
    out: str = field(metadata={"help": "predictor folder (gets sentence_bank.json.gz)"})
    stories: int | None = field(default=None, metadata={"help": "only the first K training stories"})


def main(argv: list[str] | None = None) -> int:
    parser = SettingsParser(
        BankSettings,
        prog="python -m world_model.generation.sentence_bank",
        description="Write a predictor folder's sentence bank from ROCStories training stories.",
    )
    add_verbose(parser)
    settings, args = parser.parse(argv)

    def work() -> None:
        path = write_rocstories_bank(settings.out, settings.data, settings.stories)
        print(f"{path}: {path.stat().st_size / 1e6:.2f} MB")

    return run_command(work, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())

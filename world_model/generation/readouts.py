"""Readouts: how a predictor's next states become sentences, one interface chosen by configuration.

A readout is an object with a `kind` (the value of `GenerationConfig.readout` and of a pipeline config's
`readout:` that picks it), a `name` for records, `rollout` (predicted states of a batch of windows) and
`futures` (the request's alternative futures, shared by all). `from_folder` builds it from what a predictor
folder holds, or returns None when the folder lacks what it reads (then `auto` tries the next kind).

    tokens     the paper's per-slot readout: each word slot read off its own distribution
    sentences  one of the folder's known sentences per step (`world_model.models.decoding`)
    bank       one of the folder's sentence bank's sentences, with the window's names
               (`world_model.generation.sentence_bank`), optionally ranked with the coherence head

`auto` takes the first of `AUTO_ORDER` the folder supports. A new readout is one subclass decorated with
`register_readout`; its `kind` is then a valid config value everywhere. Readouts ask the model only what it
declares (`scores_slots`, `scores_sentences`, `explains` on the model classes), never probe it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from world_model.generation.bank_file import BANK_NAME, SentenceBank, load_bank
from world_model.generation.sentence_bank import BankRanking, bank_rollout
from world_model.models.checkpoint import CheckpointError, resolve_folder
from world_model.models.coherence_head import HEAD_CONFIG, CoherenceHead, load_coherence_head
from world_model.models.decoding import KNOWN_SENTENCES_NAME, load_confidence_temperature
from world_model.models.explanations import StepExplanation
from world_model.models.generation_config import AUTO_READOUT, GenerationConfig
from world_model.models.precision import autocast
from world_model.text.vocab import Vocabulary

READOUTS: dict[str, type[Readout]] = {}  # kind -> class, filled by `register_readout`
AUTO_ORDER = ("sentences", "bank", "tokens")  # what `auto` tries, in turn


def register_readout(cls: type[Readout]) -> type[Readout]:
    """Class decorator: make `cls.kind` a readout every command and config accepts."""
    if cls.kind == AUTO_READOUT or cls.kind in READOUTS:
        raise ValueError(f"readout kind {cls.kind!r} is taken")
    READOUTS[cls.kind] = cls
    return cls


def readout_class(kind: str) -> type[Readout]:
    """The registered readout of `kind`; a ValueError naming the choices otherwise."""
    if kind not in READOUTS:
        raise ValueError(f"readout must be one of {', '.join((AUTO_READOUT, *READOUTS))}, got {kind!r}")
    return READOUTS[kind]


class Readout:
    """One way of reading predicted states off a predictor; subclasses set `kind` and implement `rollout` and
    `from_folder` (and `name` when the kind alone does not say enough)."""

    kind: ClassVar[str]

    @property
    def name(self) -> str:
        """For records and tables."""
        return self.kind

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, known: torch.Tensor | None, vocab: Vocabulary, n_tokens: int):
        """This readout for the predictor `folder` (its known sentences (C, N) or None already loaded, its
        vocabulary and slot count), or None when the folder lacks what the readout reads."""
        raise NotImplementedError

    @classmethod
    def missing(cls, folder: str | os.PathLike) -> str:
        """Why `from_folder` gave None for `folder`, for the error of an explicitly chosen readout."""
        return f"readout {cls.kind!r} cannot read the predictor folder {folder}"

    def rollout(
        self,
        model,
        window: torch.Tensor,
        steps: int,
        generation: GenerationConfig,
        generator: torch.Generator | None,
        explanations: list[StepExplanation] | None = None,
    ) -> torch.Tensor:
        """Predicted states (B, steps, N) of windows (B, T, N); `generation` gives the temperature, top_k, end ids
        and alternatives. Given a list (and a model that `explains`), `explanations` receives each step's
        `world_model.models.explanations.StepExplanation`."""
        raise NotImplementedError

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
        StepExplanations per future (None for a model that does not explain)."""
        generation = replace(generation, end_ids=vocab.end_ids)
        generator = generation.generator()
        futures = []
        for _ in range(generation.futures):
            steps_seen = [] if explanations is not None and model.explains else None
            with autocast(generation.precision, window.device):
                futures.append(self.rollout(model, window, steps, generation, generator, steps_seen)[0].cpu())
            if explanations is not None:
                explanations.append(steps_seen)
        return futures


def explain_options(explanations: list[StepExplanation] | None, generation: GenerationConfig) -> dict:
    """The keyword arguments that make a model's rollout record its explanations (none when not asked)."""
    return {} if explanations is None else {"explanations": explanations, "alternatives": generation.alternatives}


@register_readout
@dataclass
class TokenReadout(Readout):
    """The paper's per-slot readout (section 3.7): each word slot of the next state read off its own distribution;
    a sentence ends at `generation.end_ids`."""

    kind: ClassVar[str] = "tokens"

    @classmethod
    def from_folder(cls, folder, known, vocab, n_tokens) -> TokenReadout:
        return cls()

    def rollout(self, model, window, steps, generation, generator, explanations=None) -> torch.Tensor:
        return model.rollout(window, steps, generation, generator, **explain_options(explanations, generation))


@register_readout
@dataclass
class KnownSentencesReadout(Readout):
    """One of the predictor's known sentences (C, N) per step, the closed-set readout of
    `world_model.models.decoding`; explanations report softmax(score / `confidence_temperature`)."""

    known: torch.Tensor
    confidence_temperature: float = 1.0
    kind: ClassVar[str] = "sentences"

    @property
    def name(self) -> str:
        calibrated = (
            "" if self.confidence_temperature == 1 else f", confidence temperature {self.confidence_temperature:g}"
        )
        return f"sentences ({len(self.known)} known{calibrated})"

    @classmethod
    def from_folder(cls, folder, known, vocab, n_tokens) -> KnownSentencesReadout | None:
        if known is None:
            return None
        return cls(known, load_confidence_temperature(resolve_folder(folder)))

    @classmethod
    def missing(cls, folder) -> str:
        return (
            f"readout 'sentences' needs {KNOWN_SENTENCES_NAME} in the predictor folder {folder}, "
            "which has none; use readout 'tokens'"
        )

    def rollout(self, model, window, steps, generation, generator, explanations=None) -> torch.Tensor:
        generation = replace(generation, confidence_temperature=self.confidence_temperature)
        explain = explain_options(explanations, generation)
        return model.rollout(window, steps, generation, generator, candidates=self.known, **explain)


@register_readout
@dataclass
class BankReadout(Readout):
    """One sentence of the folder's sentence bank per step (`world_model.generation.sentence_bank.bank_rollout`),
    ranked by the predictor's likelihood and, with a `coherence` head, by the head as well."""

    bank: SentenceBank
    coherence: CoherenceHead | None = None
    kind: ClassVar[str] = "bank"

    @property
    def name(self) -> str:
        return f"bank ({len(self.bank.candidates)} sentences)"

    @classmethod
    def from_folder(cls, folder, known, vocab, n_tokens) -> BankReadout | None:
        bank = load_bank(resolve_folder(folder), vocab, n_tokens)
        return None if bank is None else cls(bank)

    @classmethod
    def missing(cls, folder) -> str:
        return (
            f"readout 'bank' needs {BANK_NAME} in the predictor folder {folder}, which has none; build "
            "one with python -m world_model.generation.sentence_bank, or use readout 'tokens'"
        )

    def rollout(self, model, window, steps, generation, generator, explanations=None) -> torch.Tensor:
        ranking = BankRanking(coherence=self.coherence)
        return bank_rollout(model, window, steps, self.bank, ranking, generation, generator, explanations)


def resolve_readout(
    folder: str | os.PathLike,
    known: torch.Tensor | None,
    readout: str,
    vocab: Vocabulary,
    n_tokens: int,
    coherence_for=None,
) -> Readout:
    """The readout a predictor folder gets: `auto` takes the first kind of `AUTO_ORDER` the folder supports (its
    known sentences, else its sentence bank, else tokens); a named kind must be supported (a ValueError saying what
    is missing otherwise). With `coherence_for`, the folder's predictor, its bank readout ranks with the folder's
    coherence head, which it then must have."""
    kinds = AUTO_ORDER if readout == AUTO_READOUT else (readout_class(readout).kind,)
    for kind in kinds:
        chosen = READOUTS[kind].from_folder(folder, known, vocab, n_tokens)
        if chosen is not None:
            return chosen if coherence_for is None else coherent_readout(folder, coherence_for, chosen)
    raise ValueError(READOUTS[readout].missing(folder))


def coherent_readout(folder: str | os.PathLike, model, readout: Readout) -> BankReadout:
    """`readout` ranking its bank with the folder's coherence head; ValueError unless it is a bank readout, the
    model has the per-slot state the head reads, and the folder holds a head that fits `model`."""
    if not isinstance(readout, BankReadout):
        raise ValueError(f"coherence ranks the sentences of a bank readout; this one reads {readout.name}")
    if not model.scores_slots:
        raise ValueError("a coherence head reads the 4-tensor predictor's state; this model has none")
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

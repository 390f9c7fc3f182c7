"""How a predictor reads its next sentences off: one `GenerationConfig` for both models, and the two rules
every readout shares, written once: temperature / top-k sampling (`sample_ids`) and the slots after the first
stop token (`after_first`).

`FourTensorModel.decode_state` / `rollout` and `BaselineModel.generate` / `rollout` take a GenerationConfig
(default: greedy, no stop or banned ids), a `torch.Generator` for reproducible draws and, for the closed-set
readout of `world_model.models.decoding`, a candidate set. samples, seed and readout are read by the callers
that draw several futures (`world_model.generation.predict`, `pipeline.rollout`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import torch

from world_model.models.explanations import ALTERNATIVES
from world_model.models.precision import PRECISIONS, check_precision

AUTO_READOUT = "auto"  # `readout`: the first readout the predictor folder supports (`world_model.generation.readouts`)
MAX_SEED = 2**32 - 1
HIDDEN = {"help": argparse.SUPPRESS}  # set by code (from the vocabulary), not a command-line flag


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding options of a rollout (defaults: greedy, one future), for every model and command.

    Greedy when `temperature` is 0 (then one future is all there is); else `samples` alternative futures, each token
    (or known sentence) drawn at `temperature` among the `top_k` likeliest, from a generator seeded with `seed`.
    `readout`: sentences (one of the predictor's known sentences), bank (one of its sentence bank's), tokens (read
    off freely; the paper's per-slot readout for the 4-tensor model) or auto (known sentences, else the bank, else
    tokens). `coherence` ranks a bank's sentences with the predictor folder's coherence head as well
    (`world_model.generation.sentence_bank`). `precision` bf16 runs the predictor's matrix products under bf16
    autocast (`world_model.models.precision`).
    The fields with help are the commands' flags (`world_model.utils.flags.SettingsParser`)."""

    flag_group = "generation"
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (default); > 0 samples"})
    top_k: int | None = field(default=None, metadata={"help": "sample only among the k likeliest words or sentences"})
    end_ids: tuple[int, ...] = field(default=(), metadata=HIDDEN)  # a sentence ends after the first of these tokens
    banned_ids: tuple[int, ...] = field(default=(), metadata=HIDDEN)  # never chosen (beyond each model's exclusions)
    # explanations report the known-sentence probabilities as softmax(score / this) (the folder's calibration.json)
    confidence_temperature: float = field(default=1.0, metadata=HIDDEN)
    samples: int = field(default=1, metadata={"help": "alternative futures (needs --temperature > 0)"})
    seed: int = field(default=0, metadata={"help": "seed for sampling (and for rendering, in the video rollout)"})
    readout: str = field(
        default="auto",
        metadata={
            "help": "sentences: pick each state from the predictor's known sentences; bank: from its sentence bank; "
            "tokens: read tokens off freely (the paper's per-slot readout); auto (default): known sentences, else "
            "the bank, else tokens",
        },
    )
    coherence: bool = field(
        default=False,
        metadata={
            "help": "bank readout: rank its sentences with the predictor folder's coherence head "
            "(coherence_head.safetensors, python -m world_model.training.coherence)"
        },
    )
    precision: str = field(
        default="fp32",
        metadata={"choices": PRECISIONS, "help": "the predictor's arithmetic: fp32 (default) or bf16 autocast"},
    )
    explanations: bool = field(
        default=True,
        metadata={
            "help": "record each predicted state's probability, its likeliest alternatives and where the attention "
            "went (default on; world_model.models.explanations)"
        },
    )
    alternatives: int = field(default=ALTERNATIVES, metadata={"help": "alternatives recorded per predicted state"})

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"--temperature must be 0 (greedy) or positive, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"--top-k must be at least 1, got {self.top_k}")
        if self.samples < 1:
            raise ValueError(f"--samples must be at least 1, got {self.samples}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed must be between 0 and {MAX_SEED}, got {self.seed}")
        if not self.readout.isidentifier():
            raise ValueError(f"--readout must name a readout (auto, sentences, bank, tokens), got {self.readout!r}")
        check_precision(self.precision)
        if not (math.isfinite(self.confidence_temperature) and self.confidence_temperature > 0):
            raise ValueError(f"confidence_temperature must be positive, got {self.confidence_temperature}")
        if self.alternatives < 0:
            raise ValueError(f"--alternatives must be 0 or more, got {self.alternatives}")
        object.__setattr__(self, "end_ids", tuple(int(i) for i in self.end_ids))  # lists and vocab tuples alike
        object.__setattr__(self, "banned_ids", tuple(int(i) for i in self.banned_ids))

    @property
    def futures(self) -> int:
        """How many futures a request draws: `samples` when sampling, one when greedy (they would all agree)."""
        return self.samples if self.temperature > 0 else 1

    def generator(self) -> torch.Generator:
        """A CPU generator seeded with `seed`; draw every future of one request from it in turn."""
        return torch.Generator().manual_seed(self.seed)


GREEDY = GenerationConfig()  # the default of every generate / rollout: argmax, no stop or banned ids


def sample_ids(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One id per row of scores: logits (..., V) -> ids (...).

    temperature 0 is the argmax; temperature > 0 samples from softmax(logits / temperature), restricted to the
    top_k entries of each row when top_k is given (ties with the k-th entry stay in), using `generator`.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = draw_distribution(logits, temperature, top_k)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])


def draw_distribution(logits: torch.Tensor, temperature: float, top_k: int | None = None) -> torch.Tensor:
    """What `sample_ids` draws from at `temperature` (> 0): softmax(logits / temperature) within the top_k entries of
    each row (ties with the k-th entry stay in); logits (..., V) -> probabilities (..., V)."""
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(dim=-1)


def draw_probability(
    logits: torch.Tensor, chosen: torch.Tensor, temperature: float, top_k: int | None = None
) -> torch.Tensor:
    """The probability (...) with which `sample_ids` at `temperature` (> 0) and `top_k` draws the ids `chosen` (...)
    from logits (..., V)."""
    return draw_distribution(logits, temperature, top_k).gather(-1, chosen.long()[..., None])[..., 0]


def after_first(is_stop: torch.Tensor) -> torch.Tensor:
    """The slots after the first stop along the last axis: is_stop (..., L) bool -> (..., L) bool.

    The first stop itself is not included, so a sentence keeps its end token and loses what follows it.
    """
    stops = is_stop.long()
    return (stops.cumsum(dim=-1) - stops) > 0

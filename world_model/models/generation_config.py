"""How a predictor reads its next sentences off: one `GenerationConfig` for both models, and the two rules
every readout shares, written once: temperature / top-k sampling (`sample_ids`) and the slots after the first
stop token (`after_first`).

`FourTensorModel.decode_state` / `rollout` and `BaselineModel.generate` / `rollout` take a GenerationConfig
(default: greedy, no stop or banned ids), a `torch.Generator` for reproducible draws and, for the closed-set
readout of `world_model.models.decoding`, a candidate set. samples, seed and readout are read by the callers
that draw several futures (`world_model.generation.predict`, `pipeline.rollout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding options of a rollout (defaults: greedy, one future)."""

    temperature: float = 0.0  # 0: argmax; > 0: sample from softmax(logits / temperature)
    top_k: int | None = None  # sample only among the top_k ids (or candidates); None: all of them
    end_ids: tuple[int, ...] = ()  # a sentence ends after the first of these tokens (its sentence-final marks)
    banned_ids: tuple[int, ...] = ()  # ids never chosen (on top of each model's own exclusions)
    samples: int = 1  # futures drawn per request when sampling; greedy decoding draws one
    seed: int = 0  # seed of the generator the futures are drawn with (`generator`)
    readout: str = "auto"  # which readout a predictor folder uses (`world_model.generation.sentence_bank`)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # NaN too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
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
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])


def after_first(is_stop: torch.Tensor) -> torch.Tensor:
    """The slots after the first stop along the last axis: is_stop (..., L) bool -> (..., L) bool.

    The first stop itself is not included, so a sentence keeps its end token and loses what follows it.
    """
    stops = is_stop.long()
    return (stops.cumsum(dim=-1) - stops) > 0

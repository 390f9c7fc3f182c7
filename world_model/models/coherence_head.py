"""An opt-in coherence head beside a frozen 4-tensor predictor: how well a candidate fits as the next sentence.

The predictor's per-slot likelihood prefers endings that reuse the story's words; the head is trained to pick the
true next sentence among other stories' sentences and the story's own other sentences (`world_model.training.
coherence`), with the predictor frozen. Two unit vectors meet in a cosine:

    context   the predictor's final state X = encode(window) (B, N, T, d), averaged over the non-padding slots of
              the last sentence and over those of the whole window -> (B, 2 d), through LayerNorm and a two-layer
              MLP (tanh), plus a bag of the window's words (`BagEncoder` without its normalisation)
    sentence  a bag of the candidate's words (`BagEncoder`)

    head score  scale * cos(context, sentence)
    score       head score + model_weight * the predictor's per-token likelihood ratio of the candidate,
                (log p(c | window) - log p(c | blank window)) / tokens(c), a blank window being all padding,
                + likelihood_weight * the predictor's per-token log-likelihood log p(c | window) / tokens(c)

Both weights are chosen on the Story Cloze val half when the head is trained (`world_model.training.coherence`);
a head saved before `likelihood_weight` existed reads it as 0. The head lives in a predictor folder as
coherence_head.safetensors and coherence_head.json (`save_coherence_head`, `load_coherence_head`); the paper's
model is untouched and the head is read only when asked for.

Shapes: B windows (B, T, N) ids, K candidates a window (B, K, N), or C candidates shared by every window (C, N).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from world_model.models.checkpoint import CheckpointError, check_state_dict
from world_model.text.vocab import PAD_ID, UNK_ID
from world_model.utils.files import replacing_file, write_json_atomic

HEAD_CONFIG = "coherence_head.json"
HEAD_WEIGHTS = "coherence_head.safetensors"


class BagEncoder(nn.Module):
    """Token ids (B, L) -> unit vectors (B, dim): mean word embedding over non-padding ids, then an MLP (tanh)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, dim, mode="sum", padding_idx=PAD_ID)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))

    def unnormalised(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        count = (ids != PAD_ID).sum(1, keepdim=True).clamp(min=1)
        return self.mlp(self.embedding(ids) / count)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.unnormalised(ids), dim=-1)


@dataclass
class CoherenceHeadConfig:
    """The head's sizes and the weights of the predictor's likelihood ratio and likelihood in its score."""

    vocab_size: int
    d_state: int  # 2 d of the predictor
    dim: int = 64
    model_weight: float = 0.0
    likelihood_weight: float = 0.0
    extra: dict | None = None  # provenance (seed, chosen epoch, selection)


def readout_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Logits (B, N, V) -> fp32 log-probabilities with padding and the unknown word excluded, as the readouts do."""
    logits = logits.float().clone()
    logits[..., [PAD_ID, UNK_ID]] = float("-inf")
    return logits.log_softmax(-1)


def pooled_state(X: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """X (B, N, T, d) and the window (B, T, N) -> (B, 2 d): the mean over the non-padding slots of the last
    sentence, then over those of every sentence (a window without any gives zeros)."""
    live = (token_ids != PAD_ID).permute(0, 2, 1)[..., None].to(X.dtype)  # (B, N, T, 1)
    summed = (X * live).sum(1)  # (B, T, d)
    counts = live.sum(1)  # (B, T, 1)
    last = summed[:, -1] / counts[:, -1].clamp(min=1)
    every = summed.sum(1) / counts.sum(1).clamp(min=1)
    return torch.cat([last, every], dim=-1)


def token_log_likelihood(log_probs: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Per-token log-likelihood of candidates (B, K, N) under per-slot log_probs (B, N, V): (B, K). Padding slots are
    not scored, nor are unknown words: the readouts exclude them (log-probability -inf), so they say nothing of the
    window."""
    slots = torch.arange(candidates.shape[-1], device=candidates.device)
    rows = torch.arange(len(candidates), device=candidates.device)[:, None, None]
    live = (candidates != PAD_ID) & (candidates != UNK_ID)
    return torch.where(live, log_probs[rows, slots, candidates], 0.0).sum(-1) / live.sum(-1).clamp(min=1)


def likelihood_ratio(log_probs: torch.Tensor, blank_log_probs: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Per-token log-likelihood ratio of candidates (B, K, N) under per-slot log_probs (B, N, V) against
    blank_log_probs (N, V): (B, K), both read by `token_log_likelihood` (padding and unknown words not scored)."""
    blank = blank_log_probs.expand(len(candidates), *blank_log_probs.shape)
    return token_log_likelihood(log_probs, candidates) - token_log_likelihood(blank, candidates)


class CoherenceHead(nn.Module):
    """The head (module docstring); `score(model, window, candidates)` -> (B, K)."""

    def __init__(self, config: CoherenceHeadConfig):
        super().__init__()
        self.config = config
        c = config
        self.state_mlp = nn.Sequential(
            nn.LayerNorm(c.d_state), nn.Linear(c.d_state, c.dim), nn.Tanh(), nn.Linear(c.dim, c.dim)
        )
        self.context_words = BagEncoder(c.vocab_size, c.dim)
        self.sentence_encoder = BagEncoder(c.vocab_size, c.dim)
        self.scale = nn.Parameter(torch.tensor(10.0))

    def context_vectors(self, state: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
        """pooled_state (B, 2 d) and the window (B, T, N) -> unit vectors (B, dim)."""
        bag = self.context_words.unnormalised(window.reshape(len(window), -1))
        return F.normalize(self.state_mlp(state) + bag, dim=-1)

    def head_scores(self, context: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """scale * cos: context vectors (B, dim), candidates (B, K, N) -> (B, K)."""
        sentences = self.sentence_encoder(candidates.reshape(-1, candidates.shape[-1]))
        return self.scale * (sentences.view(*candidates.shape[:2], -1) @ context[:, :, None])[..., 0]

    @staticmethod
    def slot_log_probs(model, window: torch.Tensor) -> torch.Tensor:
        """The predictor's per-slot log-probabilities (B, N, V) of the next sentence, padding and the unknown word
        excluded as in its readouts."""
        return readout_log_probs(model.last_slice_logits(window))

    def context_and_log_probs(self, model, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(context vectors (B, dim), per-slot log-probabilities (B, N, V) after the window, and (N, V) after a
        blank window) in one pass of the frozen predictor."""
        window = window.long()
        X = model.encode(window)  # (B, N, T, d): the context's states and, at the last slice, the next sentence's
        log_probs = readout_log_probs(model.slice_logits(X, window, X.shape[2] - 1))
        blank = self.slot_log_probs(model, torch.zeros_like(window[:1]))[0]
        return self.context_vectors(pooled_state(X, window), window), log_probs, blank

    @torch.no_grad()
    def score(self, model, window: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """The head's score (module docstring) of candidates (B, K, N) after windows (B, T, N): (B, K)."""
        context, log_probs, blank = self.context_and_log_probs(model, window)
        candidates = candidates.long().clamp(min=0)
        ratio = likelihood_ratio(log_probs, blank, candidates)
        return self.combined(self.head_scores(context, candidates), ratio, token_log_likelihood(log_probs, candidates))

    def combined(self, head_scores: torch.Tensor, ratio: torch.Tensor, likelihood: torch.Tensor) -> torch.Tensor:
        """The score from its parts (any one shape): head score + model_weight ratio + likelihood_weight likelihood
        (per-token, as `likelihood_ratio` and `token_log_likelihood` give them)."""
        return head_scores + self.config.model_weight * ratio + self.config.likelihood_weight * likelihood


def save_coherence_head(head: CoherenceHead, folder: str | os.PathLike) -> Path:
    """Write HEAD_WEIGHTS and HEAD_CONFIG into a predictor folder."""
    folder = Path(folder)
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    with replacing_file(folder / HEAD_WEIGHTS) as staged:
        save_file(tensors, staged, metadata={"format": "pt"})
    write_json_atomic(folder / HEAD_CONFIG, asdict(head.config))
    return folder / HEAD_WEIGHTS


def load_coherence_head(folder: str | os.PathLike, model=None) -> CoherenceHead | None:
    """The coherence head of a predictor folder, or None when it has none. CheckpointError naming the file when it
    is unreadable or does not fit its config or the predictor `model` (vocabulary, state width)."""
    folder = Path(folder)
    config_path, weights_path = folder / HEAD_CONFIG, folder / HEAD_WEIGHTS
    if not config_path.is_file():
        return None
    try:
        config = CoherenceHeadConfig(**json.loads(config_path.read_text()))
    except (json.JSONDecodeError, TypeError) as err:
        raise CheckpointError(f"{config_path} does not describe a coherence head: {err}") from err
    if model is not None and (config.vocab_size, config.d_state) != (model.config.vocab_size, 2 * model.config.d):
        raise CheckpointError(
            f"{config_path}: the head reads a vocabulary of {config.vocab_size} and states of width {config.d_state}, "
            f"the predictor has {model.config.vocab_size} and {2 * model.config.d}"
        )
    head = CoherenceHead(config)
    try:
        state = load_file(weights_path)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{weights_path} is missing, truncated or corrupt: {err}") from err
    check_state_dict(head.state_dict(), state, weights_path)
    head.load_state_dict(state)
    return head.eval()

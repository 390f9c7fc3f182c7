"""The bag-of-words dual encoder: a coherence floor that knows no word order and no 4-tensor state.

Two encoders map a bag of token ids to a unit vector: the mean of learned word embeddings (padding left out),
then a two-layer MLP (tanh). One reads the story so far, S(0..k-1), the other a candidate next sentence; the score
of a candidate is scale * cos(context, candidate), scale learned. It is trained on every S(0..k-1) -> S(k),
k = 1..4, of the training windows with in-batch negatives (every other pair's S(k) in the batch), and with
`same_story` also against the other sentences of the pair's own story (earlier ones it would restate, later ones
out of order). Training runs for at most `epochs` passes over the fit windows; the weights kept are those of the
epoch with the lowest loss on the held-out slice of the training windows (`split_heldout`), so nothing of the
Story Cloze stories is read.

Shapes: S windows, each (5, N) ids; a context (S, 4, N) or (S, L) ids; candidates (S, K, N).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from world_model.evaluation.floors.counts import CONTEXT, check_windows, split_heldout
from world_model.models.coherence_head import BagEncoder
from world_model.text.vocab import PAD_ID


@dataclass(frozen=True)
class DualEncoderSettings:
    """How the floor is fitted: width, passes, batch, learning rate, same-story negatives, seed. The width is the
    one of highest Story Cloze val accuracy of those tried on the shipped predictor's vocabulary (docs/coherence.md,
    `results/coherence/dual_encoder_settings.json`)."""

    dim: int = 256
    epochs: int = 8
    batch_size: int = 256
    lr: float = 3e-3
    same_story: bool = False
    seed: int = 0


class DualEncoder(nn.Module):
    """The floor: `score(context, candidates)` = scale * cos(context bag, candidate bag), (S, K)."""

    def __init__(self, vocab_size: int, dim: int = 64):
        super().__init__()
        self.context_encoder = BagEncoder(vocab_size, dim)
        self.sentence_encoder = BagEncoder(vocab_size, dim)
        self.scale = nn.Parameter(torch.tensor(10.0))

    def score(self, context: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """context (S, 4, N) or (S, L), candidates (S, K, N) -> scores (S, K)."""
        c = self.context_encoder(context.reshape(len(context), -1))  # (S, dim)
        e = self.sentence_encoder(candidates.reshape(-1, candidates.shape[-1])).view(*candidates.shape[:2], -1)
        return self.scale * (e @ c[:, :, None])[..., 0]


def training_pairs(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every S(0..k-1) -> S(k), k = 1..4, of windows (S, 5, N): contexts (4 S, 4 N) (the sentences from k on
    padding), the story index (4 S,) and k (4 S,), ordered k-major."""
    S, _, n = windows.shape
    contexts, stories, positions = [], [], []
    for k in range(1, CONTEXT + 1):
        context = torch.full((S, CONTEXT * n), PAD_ID, dtype=torch.long)
        context[:, : k * n] = windows[:, :k].reshape(S, -1)
        contexts.append(context)
        stories.append(torch.arange(S))
        positions.append(torch.full((S,), k))
    return torch.cat(contexts), torch.cat(stories), torch.cat(positions)


def batch_loss(
    model: DualEncoder,
    windows: torch.Tensor,
    contexts: torch.Tensor,
    stories: torch.Tensor,
    positions: torch.Tensor,
    same_story: bool,
) -> torch.Tensor:
    """Mean cross-entropy of picking each pair's S(k) among the batch's next sentences (B,) and, with `same_story`,
    the four other sentences of its own story: contexts (B, 4 N), stories and positions (B,) index `windows`."""
    c = model.context_encoder(contexts)  # (B, dim)
    targets = windows[stories, positions]  # (B, N)
    logits = c @ model.sentence_encoder(targets).T  # (B, B)
    if same_story:
        others = torch.arange(CONTEXT + 1)[None, :] != positions[:, None]  # (B, 5)
        own = windows[stories][others].view(len(stories), CONTEXT, -1)  # (B, 4, N)
        e = model.sentence_encoder(own.flatten(0, 1)).view(len(stories), CONTEXT, -1)
        logits = torch.cat([logits, (e @ c[:, :, None])[..., 0]], dim=1)  # (B, B + 4)
    return F.cross_entropy(model.scale * logits, torch.arange(len(stories)))


def heldout_loss(model: DualEncoder, windows: torch.Tensor, settings: DualEncoderSettings) -> float:
    """The training loss on every pair of `windows`, in fixed batches, without gradients."""
    contexts, stories, positions = training_pairs(windows)
    order = torch.randperm(len(contexts), generator=torch.Generator().manual_seed(0))
    losses = []
    with torch.no_grad():
        for start in range(0, len(order), settings.batch_size):
            b = order[start : start + settings.batch_size]
            losses.append(float(batch_loss(model, windows, contexts[b], stories[b], positions[b], settings.same_story)))
    return sum(losses) / len(losses)


def fit_dual_encoder(
    train_windows: torch.Tensor, vocab_size: int, settings: DualEncoderSettings = DualEncoderSettings()
) -> tuple[DualEncoder, dict]:
    """Train the floor on the fit part of `train_windows` (S, 5, N) and keep the epoch of lowest held-out loss:
    (model in eval mode, {"epoch", "heldout_loss", "losses" per epoch, and the settings})."""
    check_windows(train_windows, vocab_size, "training windows")
    fit, held = split_heldout(train_windows)
    torch.manual_seed(settings.seed)
    model = DualEncoder(vocab_size, settings.dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    contexts, stories, positions = training_pairs(fit)
    losses, best = [], None
    for _ in range(settings.epochs):
        model.train()
        for b in torch.randperm(len(contexts)).split(settings.batch_size):
            loss = batch_loss(model, fit, contexts[b], stories[b], positions[b], settings.same_story)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        losses.append(heldout_loss(model, held, settings))
        if losses[-1] == min(losses):
            best = copy.deepcopy(model.state_dict())
    model.load_state_dict(best)
    epoch = losses.index(min(losses)) + 1
    return model.eval(), {"epoch": epoch, "heldout_loss": min(losses), "losses": losses, **vars(settings)}


def dual_encoder_scorer(model: DualEncoder):
    """A Story Cloze scorer (`world_model.evaluation.story_cloze.Scorer`) of the floor: (scores (S, K), ones (S, K)),
    the score standing where a log-likelihood would."""

    @torch.no_grad()
    def score(context: torch.Tensor, endings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = model.score(context, endings).double()
        return scores, torch.ones_like(scores)

    return score

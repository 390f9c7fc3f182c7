"""What the probe scripts share: a checkpoint with its windows and floors, and its per-token L_S(4) cross-entropy."""

from dataclasses import dataclass
from pathlib import Path

import torch

from world_model.data.rocstories import encode_windows, load_corpus
from world_model.evaluation.evaluate import encode_stories, load_validation_stories
from world_model.evaluation.floors import select_floors
from world_model.models.baseline import BaselineModel
from world_model.models.baseline_packing import gold_steps
from world_model.models.registry import load_model
from world_model.text.vocab import PAD_ID, Vocabulary


@dataclass
class Probe:
    """A checkpoint (eval mode) trained on all but the last `holdout` training stories, with its vocabulary, the
    training stories it saw and their windows (S, 5, N), the windows to score (S, 5, N) by name ("cloze", and
    "heldout" when holdout > 0), and the count floors fitted on its training windows (`select_floors`)."""

    model: torch.nn.Module
    vocab: Vocabulary
    train_stories: int
    train_windows: torch.Tensor
    windows: dict
    floors: dict

    @classmethod
    def load(cls, checkpoint: str, data_dir: str, holdout: int) -> "Probe":
        vocab = Vocabulary.load(Path(checkpoint))
        train, held = load_corpus(data_dir).split(holdout)
        train_windows = encode_windows(train, vocab, 16)
        windows = {"heldout": encode_windows(held, vocab, 16)} if holdout > 0 else {}
        windows["cloze"] = encode_stories(load_validation_stories(data_dir), vocab, 16)[0]
        floors = select_floors(train_windows, len(vocab))["floors"]
        model = load_model(checkpoint, device="cpu").eval()
        return cls(model, vocab, len(train), train_windows, windows, floors)


@torch.no_grad()
def token_ce(model, windows: torch.Tensor, batch: int = 128) -> torch.Tensor:
    """(S, N) cross-entropy of every S(4) token of `windows` (S, 5, N), 0 at padding: free-running for the flat
    baseline (the model's own argmax prefix), the last slice's for the 4-tensor model."""
    out = torch.zeros(windows.shape[0], windows.shape[2])
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        if isinstance(model, BaselineModel):
            run = model.free_run(w)
            _, content = gold_steps(run.packed, model.config.eos_id)  # content tokens of S(4), in order
            lp = torch.log_softmax(run.logits.float(), -1).gather(-1, run.packed.gold[..., None])[..., 0]
            n = min(content.shape[1], w.shape[2])
            out[i : i + batch, :n] = torch.where(content, -lp, 0.0)[:, :n]
        else:
            lp = torch.log_softmax(model.last_slice_logits(w[:, :4]).float(), -1)  # (B, N, V)
            out[i : i + batch] = -lp.gather(-1, w[:, 4, :, None])[..., 0]
    return torch.where(windows[:, 4] != PAD_ID, out, 0.0)

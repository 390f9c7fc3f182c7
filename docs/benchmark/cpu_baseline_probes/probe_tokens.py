"""The paper's per-token L_S(4) cross-entropy of a checkpoint, token by token, shared by the probe scripts."""

import torch

from world_model.models.baseline import BaselineModel, gold_steps
from world_model.text.vocab import PAD_ID


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

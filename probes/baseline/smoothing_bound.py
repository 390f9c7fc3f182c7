"""How far mixing a checkpoint's output with a count model could move its L_S(4): a bound for label smoothing.

Usage: python smoothing_bound.py CHECKPOINT DATA_DIR HOLDOUT OUT.json
The checkpoint was trained on all but the last HOLDOUT training stories; those are the held-out slice. For each
mixture partner f (a uniform guess over the vocabulary, and the three count floors fitted on the checkpoint's own
training stories), the gold token's probability becomes (1 - w) p_model + w f, with w chosen on the held-out slice
from a grid and then applied to the cloze stories. The model's trajectory is held fixed (its own argmax prefix for
the flat baseline), so the mixture with a uniform guess is exactly what the same network would score with that mass
spread over the vocabulary, the fixed point that label smoothing at w trains towards; with a count floor it is a
different model (a mixture), reported for comparison.
"""

import json
import math
import sys
from pathlib import Path

import torch
from probe_tokens import Probe, token_ce

from world_model.text.vocab import PAD_ID

WEIGHTS = (0.0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)


def mixed_ce(log_p: torch.Tensor, log_f: torch.Tensor, w: float) -> float:
    """Mean -log((1 - w) p + w f) over the live tokens (1-D log-probabilities of the gold tokens)."""
    if w == 0.0:
        return -log_p.mean().item()
    return -torch.logaddexp(log_p + math.log1p(-w), log_f + math.log(w)).mean().item()


ckpt, data, holdout, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
torch.set_num_threads(1)
probe = Probe.load(ckpt, data, holdout)
sets, floors = probe.windows, probe.floors
log_p, log_f = {}, {}
for name, W in sets.items():
    live = W[:, 4] != PAD_ID
    log_p[name] = -token_ce(probe.model, W)[live]
    log_f[name] = {"uniform": torch.full_like(log_p[name], -math.log(len(probe.vocab)))}
    for fname, f in floors.items():
        log_f[name][fname] = f.token_log_probs(W[:, :4], W[:, 4]).float()[live]
result = {
    "checkpoint": ckpt,
    "train_stories": probe.train_stories,
    "heldout_stories": holdout,
    "model": {},
    "mixtures": {},
}
for name in sets:
    result["model"][name] = round(-log_p[name].mean().item(), 4)
for partner in log_f["heldout"]:
    held_curve = {w: mixed_ce(log_p["heldout"], log_f["heldout"][partner], w) for w in WEIGHTS}
    w = min(held_curve, key=held_curve.get)
    result["mixtures"][partner] = {
        "partner_heldout": round(-log_f["heldout"][partner].mean().item(), 4),
        "partner_cloze": round(-log_f["cloze"][partner].mean().item(), 4),
        "weight": w,
        "heldout": round(held_curve[w], 4),
        "cloze": round(mixed_ce(log_p["cloze"], log_f["cloze"][partner], w), 4),
        "heldout_by_weight": {str(k): round(v, 4) for k, v in held_curve.items()},
    }
out_path.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))

"""Where a checkpoint's cloze L_S(4) gap to the position-unigram floor sits, by how the training windows saw each token.

Usage: python tail_breakdown.py CHECKPOINT DATA_DIR HOLDOUT OUT.json
HOLDOUT is the number of last training stories the checkpoint was not trained on (0 for a benchmark run); the floor is
fitted on the same training stories as the model (`select_floors`). The cloze S(4) tokens are grouped by their counts
in those training windows: never seen; seen only in S(0) (a target of neither model); a target of the 4-tensor model
(S(1..3)) but never in S(4), the baseline's only target sentence; in S(4) 1-4 times; 5 times or more. For each group:
its share of the tokens, the model's and the floor's mean cross-entropy, and its share of the gap (model - floor,
summed over the group's tokens and divided by all tokens, so the groups add up to the whole gap). The model's
cross-entropy is the paper's number: free-running for the flat baseline, the last slice's for the 4-tensor model.
"""

import json
import sys
from pathlib import Path

import torch
from probe_tokens import Probe, token_ce

from world_model.text.vocab import PAD_ID

ckpt, data, holdout, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
probe = Probe.load(ckpt, data, holdout)
model, vocab, W_tr, W = probe.model, probe.vocab, probe.train_windows, probe.windows["cloze"]
target = W[:, 4]
live = target != PAD_ID
ce_model = token_ce(model, W)
floor = probe.floors["position_unigram"]
ce_floor = -floor.token_log_probs(W[:, :4], target).float()


def counts(sentences: torch.Tensor) -> torch.Tensor:
    """How often each S(4) target id of the cloze windows occurs in the given training sentences."""
    return torch.bincount(sentences.flatten(), minlength=len(vocab))[target]


anywhere, targets_4t, last = counts(W_tr), counts(W_tr[:, 1:]), counts(W_tr[:, 4])
groups = {
    "never in training": anywhere == 0,
    "only in S(0)": (anywhere > 0) & (targets_4t == 0),
    "in S(1..3), never in S(4)": (targets_4t > 0) & (last == 0),
    "in S(4) 1-4 times": (last >= 1) & (last < 5),
    "in S(4) 5+ times": last >= 5,
}
n = int(live.sum())
result = {
    "checkpoint": ckpt,
    "model_type": type(model).__name__,
    "train_stories": probe.train_stories,
    "cloze_tokens": n,
    "model_last_ce": round(ce_model[live].mean().item(), 4),
    "floor_last_ce": round(ce_floor[live].mean().item(), 4),
    "floor_alpha": floor.alpha,
    "groups": {},
}
for name, mask in groups.items():
    m = mask & live
    result["groups"][name] = {
        "share": round(int(m.sum()) / n, 4),
        "model_ce": round(ce_model[m].mean().item(), 3),
        "floor_ce": round(ce_floor[m].mean().item(), 3),
        "gap_share": round((ce_model[m] - ce_floor[m]).sum().item() / n, 4),
    }
out_path.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))

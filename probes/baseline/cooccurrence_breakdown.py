"""Where a checkpoint beats (or loses to) the co-occurrence floor on the cloze S(4) tokens, by kind of token.

Usage: python cooccurrence_breakdown.py CHECKPOINT DATA_DIR HOLDOUT OUT.json
HOLDOUT as in tail_breakdown.py (0 for a checkpoint trained on all the training stories). The floors are fitted on
the same training stories as the model (`select_floors`). The cloze S(4) tokens are grouped three ways: whether the
token occurs in its window's context S(0..3) (what copying can reach); whether it is one of the 100 ids most frequent
in the training windows (mostly function words and punctuation) or not; and its slot (the first, the sentence's
last, any other). For each group: its share of the tokens, the mean cross-entropy of the model, of the
co-occurrence floor and of the copy floor, and the group's share of the model's gap to the co-occurrence floor
(summed over its tokens and divided by all tokens, so the groups of one grouping add up to the whole gap).
"""

import json
import sys
from pathlib import Path

import torch
from probe_tokens import Probe, token_ce

from world_model.text.vocab import PAD_ID

ckpt, data, holdout, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
probe = Probe.load(ckpt, data, holdout)
W = probe.windows["cloze"]
context, target = W[:, :4], W[:, 4]
live = target != PAD_ID
ce = {
    "model": token_ce(probe.model, W),
    "cooccurrence_copy": -probe.floors["cooccurrence_copy"].token_log_probs(context, target).float(),
    "position_unigram_copy": -probe.floors["position_unigram_copy"].token_log_probs(context, target).float(),
}
in_context = (target[:, :, None] == context.reshape(len(W), 1, -1)).any(-1)
frequency = torch.bincount(probe.train_windows.flatten(), minlength=len(probe.vocab))
frequency[PAD_ID] = 0
common = torch.isin(target, frequency.topk(100).indices)
slot = torch.arange(target.shape[1])[None, :].expand_as(target)
last = slot == live.sum(1, keepdim=True) - 1
groupings = {
    "context": {"in S(0..3)": in_context, "not in S(0..3)": ~in_context},
    "frequency": {"100 most frequent ids": common, "the rest": ~common},
    "slot": {"first": slot == 0, "last": last & (slot > 0), "other": ~last & (slot > 0)},
}
n = int(live.sum())
result = {
    "checkpoint": ckpt,
    "train_stories": probe.train_stories,
    "cloze_tokens": n,
    **{f"{name}_last_ce": round(c[live].mean().item(), 4) for name, c in ce.items()},
    "groupings": {},
}
for grouping, groups in groupings.items():
    result["groupings"][grouping] = {}
    for name, mask in groups.items():
        m = mask & live
        result["groupings"][grouping][name] = {
            "share": round(int(m.sum()) / n, 4),
            **{f"{k}_ce": round(c[m].mean().item(), 3) for k, c in ce.items()},
            "gap_share": round((ce["model"][m] - ce["cooccurrence_copy"][m]).sum().item() / n, 4),
        }
out_path.parent.mkdir(parents=True, exist_ok=True)
out_path.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))

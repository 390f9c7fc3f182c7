"""Probe: the coherence head's score plus w times the predictor's per-token log-likelihood (not a ratio), for a grid of
w: Story Cloze on each half, and retrieval on the val half alone (to choose w) and on all cloze stories.

    python probes/coherence/probe_head_plus_likelihood.py runs/cpu-causal-copy/h4_l2_four_tensor_causal_copy_s0/best \
        results/coherence/head_plus_likelihood_s0.json

The folder is a predictor with its coherence head (`python -m world_model.benchmark.coherence_rows` writes one).
"""

import json
import sys

import torch

from world_model.data.rocstories import encode_cloze, load_cloze_halves
from world_model.evaluation import coherence as coh
from world_model.evaluation import story_cloze as sc
from world_model.models.coherence_head import load_coherence_head
from world_model.models.registry import load_predictor

folder, out = sys.argv[1], sys.argv[2]
model, vocab, _ = load_predictor(folder)
model.eval()
head = load_coherence_head(folder, model)
halves = load_cloze_halves("../shared/data/rocstories")
W = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def parts(context, endings):
    h = coh.head_parts(head, model, context, endings)[0]
    sums, tokens = sc.four_tensor_scores(model, context, endings)
    return h, sums / tokens


res = {"folder": folder, "w": W, "cloze": {}, "retrieval": {}}
enc = {}
with torch.no_grad():
    for half, items in halves.items():
        context, endings, answer = encode_cloze(items, vocab, model.config.n_tokens)
        h, p = parts(context, endings)
        res["cloze"][half] = [sc.choice_accuracy(h + w * p, answer) for w in W]
        res["cloze"][half + "_predictor"] = sc.choice_accuracy(p, answer)
        enc[half] = (context, endings, answer)
    for name, parts_ in (("val", [enc["val"]]), ("all", list(enc.values()))):
        context, endings, answer = (torch.cat(x) for x in zip(*parts_))
        cands = coh.retrieval_endings(endings, answer, coh.retrieval_others(len(context)))
        h, p = parts(context, cands)
        res["retrieval"][name] = [coh.retrieval_metrics(h + w * p) for w in W]
        res["retrieval"][name + "_predictor"] = coh.retrieval_metrics(p)
json.dump(res, open(out, "w"), indent=1)
for i, w in enumerate(W):
    print(
        w,
        "val %.3f test %.3f" % (res["cloze"]["val"][i], res["cloze"]["test"][i]),
        "valMRR %.3f allMRR %.3f allR1 %.3f"
        % (
            res["retrieval"]["val"][i]["mrr"],
            res["retrieval"]["all"][i]["mrr"],
            res["retrieval"]["all"][i]["recall_at_1"],
        ),
    )
print(
    "predictor",
    res["cloze"]["val_predictor"],
    res["cloze"]["test_predictor"],
    res["retrieval"]["val_predictor"]["mrr"],
    res["retrieval"]["all_predictor"]["mrr"],
)

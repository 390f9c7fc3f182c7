"""Per-slot and per-context-length breakdown of a baseline checkpoint against the count floors.
Floors fitted on the first 18,000 training stories (the probe's training stories); held-out = last 2,000.

Beside the free-running cross-entropy of each S(4) token (the paper's number) it gives the teacher-forced one (gold
tokens before it on the input side, `BaselineModel.teacher_forced_ce`), on the last token of S(4) and on the others,
and the last token's free-running cross-entropy by where the model's own greedy sentence ended ([EOS] argmax) against
the gold one: before it, at it, or later."""

import json
import sys
from pathlib import Path

import torch
from probe_tokens import Probe

from world_model.models.baseline_packing import gold_steps


def by_length(ce_model, ce_floor, live, lengths, edges):
    """(lo, hi, windows, model CE, floor CE) over the live S(4) tokens of the windows with lo <= length < hi."""
    rows = []
    for lo, hi in edges:
        m = ((lengths >= lo) & (lengths < hi))[:, None] & live
        if m.sum():
            rows.append(
                (lo, hi, int(m.any(1).sum()), round(ce_model[m].mean().item(), 3), round(ce_floor[m].mean().item(), 3))
            )
    return rows


ckpt, data = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
probe = Probe.load(ckpt, data, 2000)
model, sets, floors = probe.model, probe.windows, probe.floors
out = {}
for name, W in sets.items():
    ce_model, ce_forced = torch.zeros(W.shape[0], 16), torch.zeros(W.shape[0], 16)
    own_end = torch.zeros(W.shape[0], dtype=torch.long)  # first step whose argmax is [EOS] (G if none)
    with torch.no_grad():
        for i in range(0, len(W), 128):
            run = model.free_run(W[i : i + 128])
            _, content = gold_steps(run.packed, model.config.eos_id)
            lp = torch.log_softmax(run.logits.float(), -1).gather(-1, run.packed.gold[..., None])[..., 0]
            G = content.shape[1]
            ce_model[i : i + 128, : min(G, 16)] = torch.where(content, -lp, 0.0)[:, :16]
            ce_forced[i : i + 128, : min(G, 16)] = model.teacher_forced_ce(W[i : i + 128])[0][:, :16].float()
            ended = run.tokens == model.config.eos_id
            own_end[i : i + 128] = torch.where(ended.any(1), ended.float().argmax(1), G)
    target = W[:, 4]
    live = target != 0
    ctx_len = (W[:, :4] != 0).sum((1, 2))
    s4_len = live.sum(1)
    res = {"model": (ce_model[live].mean().item())}
    fl = {}
    for fname, f in floors.items():
        fl[fname] = -f.token_log_probs(W[:, :4], target).float()
        res[fname] = fl[fname][live].mean().item()
    last = torch.zeros_like(live)
    last[torch.arange(len(W)), s4_len - 1] = True  # the last live slot of S(4) (its "." in most stories)
    for key, m in (("last_token", last & live), ("other_tokens", live & ~last)):
        res[key] = {
            "tokens": int(m.sum()),
            "free_running": round(ce_model[m].mean().item(), 3),
            "teacher_forced": round(ce_forced[m].mean().item(), 3),
            "position_unigram": round(fl["position_unigram"][m].mean().item(), 3),
        }
    res["teacher_forced"] = ce_forced[live].mean().item()
    res["last_token_by_own_end"] = {}
    for key, ends in (  # s4_len is the step of the gold [EOS]
        ("own_ends_sooner", own_end < s4_len),
        ("own_ends_with_gold", own_end == s4_len),
        ("own_ends_later", own_end > s4_len),
    ):
        m = last & live & ends[:, None]
        res["last_token_by_own_end"][key] = {
            "stories": int(ends.sum()),
            "free_running": round(ce_model[m].mean().item(), 3),
            "position_unigram": round(fl["position_unigram"][m].mean().item(), 3),
        }
    res["by_slot"] = []  # per slot
    for k in range(12):
        m = live[:, k]
        res["by_slot"].append(
            (
                k,
                int(m.sum()),
                round(ce_model[:, k][m].mean().item(), 3),
                round(fl["position_unigram"][:, k][m].mean().item(), 3),
                round(fl["position_unigram_copy"][:, k][m].mean().item(), 3),
            )
        )
    for key, lengths, edges in (
        ("by_ctx", ctx_len, [(0, 30), (30, 35), (35, 40), (40, 45), (45, 50), (50, 65)]),
        ("by_s4len", s4_len, [(1, 7), (7, 9), (9, 11), (11, 13), (13, 17)]),
    ):
        res[key] = by_length(ce_model, fl["position_unigram"], live, lengths, edges)
    out[name] = res
    print(name, json.dumps(res, indent=None))
Path(sys.argv[3]).write_text(json.dumps(out, indent=1))

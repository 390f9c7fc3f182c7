"""Probe (section 10): train the flat baseline with its output smoothed towards the counts, not towards uniform.

Label smoothing with a prior (Pereyra et al. 2017, "Regularizing neural networks by penalizing confident output
distributions", the unigram variant): the training loss is the cross-entropy against (1 - e) gold + e q_k, where
q_k is what a count predicts at step k of S(4) -- the position unigram of the floors (fitted on the run's training
windows, its alpha chosen on a held-out slice of them by `select_floors`) times the chance that a training sentence
goes on past slot k, and [EOS] with the chance that it ends there. e is the config's `training.label_smoothing`;
validation, selection and every reported number stay the plain cross-entropy. Everything else is
`python -m world_model.training.train`, whose arguments this script takes:

    python docs/benchmark/cpu_baseline_probes/count_smoothing_probe.py --config CFG --data DATA --out RUN ...

A probe, not a setting of the package: it replaces BaselineModel.training_step for this process only.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from world_model.evaluation.floors import select_floors
from world_model.models import baseline
from world_model.text.vocab import PAD_ID
from world_model.training import train as train_module


def count_prior(train_windows: torch.Tensor, vocab_size: int, model_vocab: int, eos_id: int) -> torch.Tensor:
    """(N + 1, model_vocab) float32: q_k for the gold steps k = 0..N of a sentence (row N is [EOS] alone)."""
    n = train_windows.shape[2]
    table = select_floors(train_windows, vocab_size)["floors"]["position_unigram"].table  # (N, V)
    lengths = (train_windows != PAD_ID).sum(-1).reshape(-1)  # every sentence of every window
    reach = torch.stack([(lengths >= k).sum() for k in range(n + 1)]).double()  # sentences with >= k tokens
    ends = torch.stack([(lengths == k).sum() for k in range(n + 1)]).double()
    end = ends / reach.clamp(min=1)  # (N + 1,) p(the sentence ends at k | it reached k)
    prior = torch.zeros(n + 1, model_vocab, dtype=torch.float64)
    prior[:n, :vocab_size] = (1 - end[:n, None]) * table
    prior[:, eos_id] = end
    prior[n, eos_id] = 1.0
    return prior.float()


PRIOR: dict = {}
load_data = train_module.TrainingData.load.__func__


def load_and_fit(cls, data_dir, model_section, train_subset, holdout=0):
    data = load_data(cls, data_dir, model_section, train_subset, holdout)
    PRIOR["windows"], PRIOR["vocab"] = data.train_windows, len(data.vocab)
    return data


def training_step(self, token_ids_full, use_cache=True, label_smoothing=0.0):
    """BaselineModel.training_step with the smoothing target e q_k instead of e uniform."""
    if label_smoothing == 0:
        return plain_step(self, token_ids_full, use_cache)
    if "table" not in PRIOR:
        PRIOR["table"] = count_prior(PRIOR["windows"], PRIOR["vocab"], self.config.vocab_size, self.config.eos_id)
    run = self.free_run(token_ids_full, use_cache)
    gold = run.packed.gold  # (B, G)
    active, content = baseline.gold_steps(run.packed, self.config.eos_id)
    logits = run.logits[active]  # (K, V)
    ce = F.cross_entropy(logits, gold[active], reduction="none")  # (K,)
    steps = torch.arange(gold.shape[1], device=gold.device).expand_as(gold)[active]  # (K,) step k of each row
    q = PRIOR["table"].to(logits.device)[steps.clamp(max=PRIOR["table"].shape[0] - 1)]  # (K, V)
    prior_ce = logits.logsumexp(-1) - (q * logits).sum(-1)  # cross-entropy against q_k
    window_tokens = active.sum()
    loss_sum = (1 - label_smoothing) * ce.sum() + label_smoothing * prior_ce.sum()
    return baseline.StepStats(
        loss=loss_sum / window_tokens,
        window_ce_sum=ce.sum().detach(),
        window_tokens=window_tokens,
        last_ce_sum=ce[content[active]].sum().detach(),
        last_correct=baseline.aligned_correct(run.tokens, gold, content, self.config.eos_id).sum(),
        last_tokens=content.sum(),
    )


plain_step = baseline.BaselineModel.training_step

if __name__ == "__main__":
    train_module.TrainingData.load = classmethod(load_and_fit)
    baseline.BaselineModel.training_step = training_step
    sys.exit(train_module.main(sys.argv[1:]))

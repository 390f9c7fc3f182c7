"""Probe (section 10): train the flat baseline with its output smoothed towards the counts, not towards uniform.

Label smoothing with a prior (Pereyra et al. 2017, "Regularizing neural networks by penalizing confident output
distributions", the unigram variant): the training loss is the cross-entropy against (1 - e) gold + e q_k, where
q_k is what a count predicts at step k of S(4) -- the position unigram of the floors (fitted on the run's training
windows, its alpha chosen on a held-out slice of them by `select_floors`) times the chance that a training sentence
goes on past slot k, and [EOS] with the chance that it ends there. e is the config's `training.label_smoothing`;
validation, selection and every reported number stay the plain cross-entropy. Everything else is
`python -m world_model.training.train`, whose arguments this script takes:

    python docs/benchmark/cpu_baseline_probes/count_smoothing_probe.py --config CFG --data DATA --out RUN ...

A probe, not a setting of the package: it replaces BaselineModel.smoothing_cross_entropy for this process only.
"""

from __future__ import annotations

import sys

import torch

from world_model.evaluation.floors import select_floors, sentence_end_counts
from world_model.models import baseline
from world_model.training import train as train_module


def count_prior(train_windows: torch.Tensor, vocab_size: int, model_vocab: int, eos_id: int) -> torch.Tensor:
    """(N + 1, model_vocab) float32: q_k for the gold steps k = 0..N of a sentence (row N is [EOS] alone)."""
    n = train_windows.shape[2]
    table = select_floors(train_windows, vocab_size)["floors"]["position_unigram"].table  # (N, V)
    ends, reaching = sentence_end_counts(train_windows)
    end = ends / reaching.clamp(min=1)  # (N + 1,) p(the sentence ends at k | it reached k)
    prior = torch.zeros(n + 1, model_vocab, dtype=torch.float64)
    prior[:n, :vocab_size] = (1 - end[:n, None]) * table
    prior[:, eos_id] = end
    prior[n, eos_id] = 1.0
    return prior.float()


PRIOR: dict = {}
load_data = train_module.TrainingData.load.__func__


def load_and_keep_windows(cls, data_dir, model_section, train_subset, holdout=0):
    """TrainingData.load, keeping the training windows and vocabulary size the prior is fitted on."""
    data = load_data(cls, data_dir, model_section, train_subset, holdout)
    PRIOR["windows"], PRIOR["vocab"] = data.train_windows, len(data.vocab)
    return data


def prior_cross_entropy(self, logits: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """BaselineModel.smoothing_cross_entropy against q_k instead of uniform: logits (K, V), steps (K,) -> (K,)."""
    if "table" not in PRIOR:
        PRIOR["table"] = count_prior(PRIOR["windows"], PRIOR["vocab"], self.config.vocab_size, self.config.eos_id)
    table = PRIOR["table"].to(logits.device)
    q = table[steps.clamp(max=len(table) - 1)]  # (K, V)
    return logits.logsumexp(-1) - (q * logits).sum(-1)


if __name__ == "__main__":
    train_module.TrainingData.load = classmethod(load_and_keep_windows)
    baseline.BaselineModel.smoothing_cross_entropy = prior_cross_entropy
    sys.exit(train_module.main(sys.argv[1:]))

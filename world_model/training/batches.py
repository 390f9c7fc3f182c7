"""The training and validation windows of a data folder, and the batches of an epoch on each process.

A window is one training example: (T+1, N) token ids, T context sentences and the sentence to predict, each
of N tokens; a set of S windows is a tensor (S, T+1, N).
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from world_model.data.rocstories import DataError, build_vocabulary, corpus_statistics, encode_windows, load_corpus
from world_model.data.synthetic.episodes import data_kind, load_world_windows
from world_model.text.vocab import PAD_ID, Vocabulary


def derived_seed(*parts: Any) -> int:
    """A 31-bit seed from `parts`, stable across runs, processes and platforms."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "little") & 0x7FFFFFFF


def load_training_windows(
    data_dir: str | os.PathLike, n_states: int, n_tokens: int, train_subset: int | None = None, holdout: int = 0
) -> tuple[Vocabulary, dict, torch.Tensor, torch.Tensor]:
    """(vocabulary, data statistics, training windows (S, T+1, N), validation windows) of a ROCStories or a
    synthetic-world folder; `train_subset` keeps the first K training stories or episodes. With `holdout` H > 0
    (ROCStories only) the validation windows are the last H training stories', and the training windows come from
    the stories before them (the vocabulary still covers the whole pool)."""
    if data_kind(data_dir) == "world":
        if holdout:
            raise DataError("training.holdout_stories is for ROCStories; a synthetic world has its own held-out split")
        return load_world_windows(data_dir, n_states, n_tokens, train_subset)
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    stats = corpus_statistics(corpus, vocab, n_tokens)
    pool, validation = corpus.split(holdout)
    if holdout:
        stats["validation"] = f"the last {holdout} training stories (held out)"
    train_stories = pool[:train_subset] if train_subset else pool
    return vocab, stats, encode_windows(train_stories, vocab, n_tokens), encode_windows(validation, vocab, n_tokens)


def prefix_windows(windows: torch.Tensor, padding_idx: int = PAD_ID) -> torch.Tensor:
    """Windows (S, T+1, N) -> (S T, T+1, N): for each window s and t = 1..T (rows s T + t - 1) the window whose last
    sentence is S(t) and whose input is S(0..t-1), right-aligned behind T - t empty (all-padding) sentences.

    A flat baseline packs only the live tokens of its input sentences, so on these windows it writes S(t) behind
    [BOS] + S(0..t-1): every sentence after the first becomes a target, with only the sentences before it as input.
    """
    S, T1, N = windows.shape
    out = windows.new_full((S, T1 - 1, T1, N), padding_idx)  # (S, t - 1, T+1, N)
    for t in range(1, T1):
        out[:, t - 1, T1 - 1 - t :] = windows[:, : t + 1]
    return out.reshape(S * (T1 - 1), T1, N)


class WindowDataset(Dataset):
    """Stored windows (S, T+1, N); a list of indices is fetched as one tensor."""

    def __init__(self, windows: torch.Tensor):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows[index]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.windows[torch.as_tensor(indices, dtype=torch.long)]


def stack_batch(batch: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """The batch (B, T+1, N): as fetched by `WindowDataset.__getitems__`, or stacked from single windows."""
    return batch if isinstance(batch, torch.Tensor) else torch.stack(batch)


class EpochOrderSampler(Sampler[int]):
    """A permutation drawn from a generator seeded with (seed, epoch): the order of an epoch does not
    depend on what ran before it, so a resumed run sees the same batches. Set `.epoch` before iterating."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 1

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(derived_seed("order", self.seed, self.epoch))
        return iter(torch.randperm(self.size, generator=g).tolist())


class ProcessBatches(Sampler[list[int]]):
    """The batches of one of `num_processes` processes, cut from the epoch order of `order`.

    Global step k takes the windows order[k G : (k+1) G], G = batch_size x num_processes, and process p
    trains on its p-th share of them: the shards of an epoch are disjoint, cover every window exactly once,
    and one step of P processes x B sees the windows of one step of 1 process x P B (with one process this
    is the plain batching of `order`). The last, short global step is split as evenly as possible; a process
    may get an empty share when fewer windows than processes are left (it then steps with weight 0, see
    `world_model.training.loop.optimizer_step`). Every process yields the same number of batches, so none waits
    on a collective that the others never reach. (accelerate's own sharding of a DataLoader would instead fill
    the last step with windows from the start of the epoch, training and counting them twice.)"""

    def __init__(self, order: Sampler[int], batch_size: int, num_processes: int = 1, process_index: int = 0):
        self.order, self.batch_size = order, batch_size
        self.num_processes, self.process_index = num_processes, process_index

    def __len__(self) -> int:
        return math.ceil(len(self.order) / (self.batch_size * self.num_processes))

    def __iter__(self):
        indices, size = list(self.order), self.batch_size * self.num_processes
        for start in range(0, len(indices), size):
            chunk = indices[start : start + size]
            share, extra = divmod(len(chunk), self.num_processes)
            lo = self.process_index * share + min(self.process_index, extra)
            yield chunk[lo : lo + share + (self.process_index < extra)]

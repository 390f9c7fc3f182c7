"""Train a predictor on sentence windows with the optimisation and checkpoint rule of section 8.2.

    python -m world_model.training.train --config configs/world_model/cpu.yaml --data DATA_DIR --out OUT_DIR \
        [--resume] [--max-epochs E] [--max-minutes M] [--train-subset K] [--seed S]
    accelerate launch -m world_model.training.train ...        # several GPUs; batch_size is per device

DATA_DIR is either a ROCStories folder (ROCStories*.csv for training, cloze_test_*.csv for validation; one
window of 5 sentences per story) or a synthetic-world folder holding train/episodes.jsonl
(configs/world_model/synthetic.yaml; one window per second t >= 1 of an episode: the T sentences before it,
left-padded at the start, then sentence t; see world_model.data.synthetic.sentences). The kind is read off the
folder's contents.

OUT_DIR receives
    run.json        the normalised config and training subset (what --resume checks), corpus statistics
    metrics.jsonl   one JSON line per epoch
    curves.png      train / validation window loss and L_S(4) per epoch, the best epoch marked
    best/           the checkpoint of the minimum validation window loss (save_pretrained + vocab.json)
    last/           everything needed to resume after the last completed epoch (written atomically)
    summary.json    written when training stops

Stopping rule (section 8.2): stop once at least `patience` (5) epochs have passed since the minimum
validation selection loss and the current loss is above `tolerance` (1.01) times that minimum, or when
the epoch budget is exhausted. Nothing here unpickles: the resume state is safetensors + JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from world_model.data.rocstories import DataError, build_vocabulary, corpus_statistics, encode_windows, load_corpus
from world_model.data.synthetic.sentences import data_kind, known_sentences, load_world_windows
from world_model.evaluation.evaluate import evaluation_sums, metrics_from_sums
from world_model.models.checkpoint import CheckpointError, check_state_dict, read_state_dict
from world_model.models.precision import autocast
from world_model.models.registry import build_model, count_parameters, model_vocab_size
from world_model.text.vocab import Vocabulary
from world_model.training.config import ConfigError, load_config, validate_config
from world_model.training.schedule import warmup_cosine
from world_model.utils.files import replace_dir, write_json_atomic

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
SUMMARY_FILE = "summary.json"
BEST_DIR = "best"
LAST_DIR = "last"
RUN_MARKERS = (RUN_FILE, LAST_DIR, BEST_DIR, METRICS_FILE, SUMMARY_FILE)
# Budgets a resumed run may change: they decide when to stop, not what an epoch computes.
RESUME_MAY_CHANGE = ("training.max_epochs",)
TIMING_KEYS = ("epoch_seconds", "train_seconds", "eval_seconds", "wall_seconds", "train_windows_per_second")


class TrainingError(ValueError):
    """A run that must not start: bad arguments, an output folder in use, or a resume that does not match."""


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM during training (handled like Ctrl-C)."""


# ----- the stopping rule of section 8.2 -----
def best_epoch_index(losses: Sequence[float]) -> int | None:
    """Index of the first minimum of `losses` (a later epoch must be strictly lower to replace it)."""
    best = None
    for i, loss in enumerate(losses):
        if math.isfinite(loss) and (best is None or loss < losses[best]):
            best = i
    return best


def should_stop(losses: Sequence[float], patience: int = 5, tolerance: float = 1.01) -> bool:
    """Section 8.2: True once at least `patience` epochs have passed since the minimum of `losses` and
    the last loss is above `tolerance` times that minimum. `losses` are the per-epoch validation
    selection losses so far, in order."""
    best = best_epoch_index(losses)
    if best is None:
        return False
    return (len(losses) - 1) - best >= patience and losses[-1] > tolerance * losses[best]


def stop_reason(history: Sequence[dict], max_epochs: int, patience: int, tolerance: float) -> str | None:
    """Why training must stop after the last epoch of `history` ("patience", "max_epochs", "non_finite_loss"), or None."""
    if not history:
        return None
    last = history[-1]
    if not (math.isfinite(last["train_loss"]) and math.isfinite(last["val_window_loss"])):
        return "non_finite_loss"
    if should_stop([h["val_window_loss"] for h in history], patience, tolerance):
        return "patience"
    if last["epoch"] >= max_epochs:
        return "max_epochs"
    return None


def derived_seed(*parts: Any) -> int:
    """A 31-bit seed from `parts`, stable across runs, processes and platforms."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "little") & 0x7FFFFFFF


# ----- data -----
def load_training_windows(
    data_dir: str | os.PathLike, n_states: int, n_tokens: int, train_subset: int | None = None
) -> tuple[Vocabulary, dict, torch.Tensor, torch.Tensor]:
    """(vocabulary, data statistics, training windows (S, T+1, N), validation windows) of a ROCStories or a
    synthetic-world folder; `train_subset` keeps the first K training stories or episodes."""
    if data_kind(data_dir) == "world":
        return load_world_windows(data_dir, n_states, n_tokens, train_subset)
    corpus = load_corpus(data_dir)
    vocab = build_vocabulary(corpus)
    stats = corpus_statistics(corpus, vocab, n_tokens)
    train_stories = corpus.train[:train_subset] if train_subset else corpus.train
    return (
        vocab,
        stats,
        encode_windows(train_stories, vocab, n_tokens),
        encode_windows(corpus.validation, vocab, n_tokens),
    )


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


def stack_batch(batch):
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
    `train`). Every process yields the same number of batches, so none waits on a collective that the others
    never reach. (accelerate's own sharding of a DataLoader would instead fill the last step with windows
    from the start of the epoch, training and counting them twice.)"""

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


class StepModule(nn.Module):
    """Routes forward() to `model.training_step`, so DistributedDataParallel sees the call that builds the graph."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, windows: torch.Tensor):
        return self.model.training_step(windows)


# ----- resume state: safetensors + JSON, no pickle -----
def flatten_optimizer_state(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, meta = {}, {"param_groups": state_dict["param_groups"], "state": {}}
    for index, entries in state_dict["state"].items():
        plain = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                plain[key] = value
        meta["state"][str(index)] = plain
    return tensors, meta


def unflatten_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {int(i): dict(plain) for i, plain in meta["state"].items()}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda.{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(keys.astype(np.int64))
    version, internal, gauss_next = random.getstate()
    meta = {"numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": [version, list(internal), gauss_next]}
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, tensors["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def save_training_state(
    out: Path, model: nn.Module, optimizer, vocab: Vocabulary, state: dict, known_sentences: Sequence[str] | None = None
) -> Path:
    """Write OUT/last atomically: model/ (save_pretrained + vocab + known sentences), optimizer.safetensors +
    optimizer.json, rng.safetensors, and state.json (epoch, best, history, RNG non-tensor parts)."""
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f".{LAST_DIR}.tmp-"))
    try:
        model.save_pretrained(tmp / "model", vocab=vocab, known_sentences=known_sentences)
        opt_tensors, opt_meta = flatten_optimizer_state(optimizer.state_dict())
        save_file(opt_tensors, tmp / "optimizer.safetensors")
        write_json_atomic(tmp / "optimizer.json", opt_meta)
        rng_tensors, rng_meta = capture_rng()
        save_file(rng_tensors, tmp / "rng.safetensors")
        write_json_atomic(
            tmp / "state.json", {**state, "rng": rng_meta}
        )  # state.json last: its presence marks a complete folder
        replace_dir(tmp, out / LAST_DIR)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / LAST_DIR


def find_state_dir(out: Path) -> Path | None:
    """OUT/last, or, when a kill landed between the two renames of replace_dir, the complete folder it moved aside."""
    if (out / LAST_DIR / "state.json").is_file():
        return out / LAST_DIR
    aside = sorted(out.glob(f".{LAST_DIR}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((p for p in aside if (p / "state.json").is_file()), None)


def load_training_state(folder: Path) -> tuple[dict[str, torch.Tensor], dict, tuple[dict, dict], dict]:
    """(model weights, optimizer state_dict, (rng tensors, rng meta), state) of a folder from save_training_state."""
    try:
        state = json.loads((folder / "state.json").read_text())
        opt_meta = json.loads((folder / "optimizer.json").read_text())
        opt = unflatten_optimizer_state(load_file(folder / "optimizer.safetensors"), opt_meta)
        rng = (load_file(folder / "rng.safetensors"), state.pop("rng"))
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{folder} is not a complete resume state: {err}") from err
    return read_state_dict(folder / "model"), opt, rng, state


# ----- outputs -----
def write_metrics(path: Path, history: Sequence[dict]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        for record in history:
            f.write(json.dumps(record) + "\n")
    os.replace(tmp, path)


def plot_curves(history: Sequence[dict], best_epoch: int | None, path: Path) -> None:
    """curves.png: train loss and validation window loss (left), L_S(4) (right); the best epoch marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = [h["epoch"] for h in history]
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.plot(epochs, [h["train_loss"] for h in history], "o-", label="train window loss")
    left.plot(epochs, [h["val_window_loss"] for h in history], "s-", label="validation window loss (selection)")
    right.plot(epochs, [h["val_last_ce"] for h in history], "o-", color="tab:green", label="validation $L_{S(4)}$")
    if best_epoch is not None:
        best = history[best_epoch - 1]
        for ax in (left, right):
            ax.axvline(best_epoch, color="grey", linestyle=":", label=f"best epoch {best_epoch}")
        left.plot([best_epoch], [best["val_window_loss"]], "k*", markersize=12)
        right.plot([best_epoch], [best["val_last_ce"]], "k*", markersize=12)
    left.set_title("window cross-entropy, S(1..4)")
    right.set_title("last-sentence cross-entropy, S(4)")
    for ax in (left, right):
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("nats / token")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)


def config_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += config_differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [f"{prefix[:-1]}: {a!r} -> {b!r}"]


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside the block SIGTERM raises TrainingInterrupted (only in the main thread, where handlers can be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise TrainingInterrupted(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for the block, the previous setting restored afterwards.

    Without the fill of new tensors with NaN that the setting also turns on: that fill only exposes kernels
    that read memory they never wrote (none here; the tests compare runs bit for bit), and it cost about
    5% of a training step."""
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def schedule_follows_max_epochs(training: dict) -> bool:
    """True when the learning-rate schedule's length is max_epochs (so a resume must keep max_epochs)."""
    return training["lr_schedule"] == "warmup_cosine" and training["schedule_epochs"] == 0


def learning_rate(training: dict, step: int, steps_per_epoch: int) -> float:
    """The rate of optimizer step `step` (0-based over the whole run) under the config's schedule."""
    if training["lr_schedule"] == "constant":
        return training["lr"]
    horizon = (training["schedule_epochs"] or training["max_epochs"]) * steps_per_epoch
    return warmup_cosine(
        training["lr"], step, step / max(horizon, 1), training["warmup_steps"], training["final_lr_fraction"]
    )


# ----- training -----
def train(
    config: dict | str | os.PathLike,
    data_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    resume: bool = False,
    max_epochs: int | None = None,
    max_minutes: float | None = None,
    train_subset: int | None = None,
    seed: int | None = None,
    precision: str | None = None,
    progress: bool = True,
    step_delay: float = 0.0,
) -> dict:
    """Train, write OUT_DIR (see the module docstring) and return the summary dict.

    `config` is a config dict or a YAML path; `max_epochs`, `seed` and `precision` override its training section.
    `train_subset` keeps the first K training stories or episodes (the vocabulary still covers the whole pool).
    `step_delay` sleeps after every optimizer step (used by tests to interrupt a run mid-epoch).
    """
    t_start = time.monotonic()
    config = load_config(config) if isinstance(config, (str, os.PathLike)) else validate_config(config)
    if max_epochs is not None:
        config["training"]["max_epochs"] = max_epochs
    if seed is not None:
        config["training"]["seed"] = seed
    if precision is not None:
        config["training"]["precision"] = precision
    config = validate_config(config, source="config with command-line overrides")
    if train_subset is not None and (
        isinstance(train_subset, bool) or not isinstance(train_subset, int) or train_subset < 1
    ):
        raise TrainingError(f"--train-subset must be a positive number of stories or episodes, got {train_subset!r}")
    if max_minutes is not None and not (
        isinstance(max_minutes, (int, float)) and max_minutes > 0 and math.isfinite(max_minutes)
    ):
        raise TrainingError(f"--max-minutes must be a positive number of minutes, got {max_minutes!r}")
    tc, mc = config["training"], config["model"]
    run_record = {"config": config, "train_subset": train_subset}

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--out {out} is a file, not a folder")
    found = [name for name in RUN_MARKERS if (out / name).exists()]
    state_dir = find_state_dir(out) if out.is_dir() else None
    if found and not resume:
        raise TrainingError(
            f"{out} already holds a training run ({', '.join(found)}); pass --resume to continue it, or choose another --out"
        )
    if resume and found:
        if not (out / RUN_FILE).is_file():
            raise TrainingError(
                f"{out} holds {', '.join(found)} but no {RUN_FILE}; it is not a run this trainer can resume"
            )
        saved = json.loads((out / RUN_FILE).read_text())
        saved = {k: saved.get(k) for k in run_record}  # the requested run: config and training subset
        try:  # fields added to the configs since the run started take their defaults
            saved["config"] = validate_config(saved["config"], source=f"{out / RUN_FILE}")
        except ConfigError as err:
            raise TrainingError(f"--resume: {err}") from err
        may_change = RESUME_MAY_CHANGE if not schedule_follows_max_epochs(tc) else ()
        diffs = [
            d
            for d in config_differences(saved, run_record)
            if not d.startswith(tuple(f"config.{k}:" for k in may_change))
        ]
        if diffs:
            raise TrainingError(f"--resume: the requested run differs from the one in {out}: " + "; ".join(diffs))

    vocab, stats, train_windows, val_windows = load_training_windows(  # DataError before any training
        data_dir, mc.get("n_states", 4), mc.get("n_tokens", 16), train_subset
    )
    known = known_sentences(data_dir) if data_kind(data_dir) == "world" else None  # a closed world: its sentences

    from accelerate import Accelerator
    from accelerate.utils import set_seed

    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # cpu=True without CUDA lets torchrun / accelerate launch on CPU hosts form a gloo process group.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise TrainingError(
            f"launched as {launched} processes but accelerate set up {accelerator.num_processes}; "
            "the processes would overwrite each other's output"
        )
    is_main = accelerator.is_main_process

    def say(*args) -> None:
        accelerator.print(*args, flush=True)

    say("corpus: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()))
    unit = "episodes" if "train_episodes" in stats else "stories"
    if train_subset and train_subset > stats[f"train_{unit}"]:
        say(
            f"note: --train-subset {train_subset} exceeds the {stats[f'train_{unit}']} training {unit}; using all of them"
        )
    say(
        f"windows: train {tuple(train_windows.shape)}, validation {tuple(val_windows.shape)}; "
        f"{accelerator.num_processes} process(es) on {accelerator.device}, batch {tc['batch_size']} per process"
    )

    with deterministic_algorithms(), sigterm_as_interrupt():
        set_seed(tc["seed"])
        model = build_model(mc, model_vocab_size(mc["type"], vocab))
        parameters = count_parameters(model)
        history: list[dict] = []
        wall_offset, resumed_from = 0.0, None
        opt_state = rng = None
        if resume and state_dir is not None:
            weights, opt_state, rng, saved_state = load_training_state(state_dir)
            saved_vocab = Vocabulary.load(state_dir / "model")
            if saved_vocab.itos != vocab.itos or saved_state.get("train_windows") != len(train_windows):
                raise TrainingError(
                    f"--resume: the data in {data_dir} differ from the data the run in {out} was trained on "
                    "(vocabulary or number of training windows)"
                )
            check_state_dict(model.state_dict(), weights, state_dir / "model")
            model.load_state_dict(weights)
            history = saved_state["history"]
            wall_offset = saved_state["wall_seconds"]
            resumed_from = saved_state["epoch"]
            say(f"resuming {out} after epoch {resumed_from}")
            before = json.loads((out / RUN_FILE).read_text()).get("num_processes")
            if before not in (None, accelerator.num_processes):
                say(
                    f"note: the run used {before} process(es), this one {accelerator.num_processes}: the effective batch changes"
                )
        elif resume:
            say(f"note: {out} holds no completed epoch to resume; starting a new run")
        if accelerator.num_processes > 1:  # a process that read no state (its own copy of --out) would train apart
            starts = accelerator.gather(torch.tensor([resumed_from or 0], device=accelerator.device)).tolist()
            if len(set(starts)) > 1:
                raise TrainingError(
                    f"--resume: the processes found different states in {out} (epochs {starts}); "
                    "--out must be one folder that every process sees (a shared filesystem)"
                )

        optimizer = torch.optim.AdamW(model.parameters(), lr=tc["lr"], weight_decay=tc["weight_decay"])
        sampler = EpochOrderSampler(len(train_windows), tc["seed"])
        n_proc = accelerator.num_processes
        # Sharded here, not by accelerator.prepare (see ProcessBatches); batches are moved to the device in the loop.
        loader = DataLoader(
            WindowDataset(train_windows),
            collate_fn=stack_batch,
            batch_sampler=ProcessBatches(sampler, tc["batch_size"], n_proc, accelerator.process_index),
        )
        step_module, optimizer = accelerator.prepare(StepModule(model), optimizer)
        if opt_state is not None:
            optimizer.load_state_dict(opt_state)
            restore_rng(*rng)
        inner = accelerator.unwrap_model(step_module).model
        val_shard = val_windows[accelerator.process_index :: accelerator.num_processes]

        if is_main:
            out.mkdir(parents=True, exist_ok=True)
            for stale in out.glob(f".{LAST_DIR}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            write_json_atomic(
                out / RUN_FILE,
                {
                    **run_record,
                    "data_dir": str(data_dir),
                    "corpus_statistics": stats,
                    "train_windows": len(train_windows),
                    "validation_windows": len(val_windows),
                    "parameters": parameters,
                    "num_processes": accelerator.num_processes,
                },
            )
            if history:
                write_metrics(out / METRICS_FILE, history)
        accelerator.wait_for_everyone()

        reason = stop_reason(history, tc["max_epochs"], tc["patience"], tc["tolerance"])
        epoch = saved_epoch = history[-1]["epoch"] if history else 0
        t_loop = time.monotonic()
        try:
            while reason is None:
                epoch += 1
                t_epoch = time.monotonic()
                set_seed(derived_seed("epoch", tc["seed"], epoch), device_specific=True)  # dropout stream of this epoch
                sampler.epoch = epoch
                step_module.train()
                sums = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
                bar = loader
                if progress and is_main:
                    from tqdm.auto import tqdm

                    bar = tqdm(loader, desc=f"epoch {epoch}/{tc['max_epochs']}", leave=False, dynamic_ncols=True)
                for step, batch in enumerate(bar):
                    for group in optimizer.param_groups:
                        group["lr"] = learning_rate(tc, (epoch - 1) * len(loader) + step, len(loader))
                    live = len(batch) > 0  # False only for an empty share of the last, short step
                    batch = (batch if live else train_windows[:1]).to(accelerator.device)
                    with autocast(tc["precision"], accelerator.device):
                        stats_step = step_module(batch)
                    loss = stats_step.loss
                    if n_proc > 1:
                        # DDP averages the processes' gradients; weighting each process's mean by its share of the
                        # step's target tokens makes that average the gradient of the mean over all of them, as one
                        # process with the whole step's windows would compute (shares may differ in tokens or size).
                        tokens = stats_step.window_tokens.double() * live
                        total = accelerator.reduce(tokens.reshape(1).clone(), reduction="sum")[0]
                        loss = loss * (tokens * n_proc / total.clamp(min=1)).to(loss.dtype)
                    optimizer.zero_grad(set_to_none=True)
                    accelerator.backward(loss)
                    optimizer.step()
                    if live:
                        sums += torch.stack([stats_step.window_ce_sum.double(), stats_step.window_tokens.double()])
                    if bar is not loader and step % 10 == 0:
                        bar.set_postfix(loss=f"{float(sums[0] / sums[1].clamp(min=1)):.4f}")
                    if step_delay:
                        time.sleep(step_delay)
                if bar is not loader:
                    bar.close()
                sums = accelerator.reduce(sums, reduction="sum")
                train_loss = float(sums[0] / sums[1]) if float(sums[1]) > 0 else float("nan")
                t_train = time.monotonic()

                val_sums = accelerator.reduce(
                    evaluation_sums(inner, val_shard, tc["eval_batch_size"], accelerator.device, tc["precision"]),
                    reduction="sum",
                )
                metrics = metrics_from_sums(val_sums)
                t_eval = time.monotonic()
                record = {
                    "epoch": epoch,
                    "train_loss": train_loss,
                    "val_window_loss": metrics["val_window_loss"],
                    "val_last_ce": metrics["val_last_ce"],
                    "val_token_accuracy": metrics["val_token_accuracy"],
                    "val_perplexity": metrics["val_perplexity"],
                    "train_seconds": t_train - t_epoch,
                    "eval_seconds": t_eval - t_train,
                    "epoch_seconds": t_eval - t_epoch,
                    "wall_seconds": wall_offset + (t_eval - t_loop),
                    "train_windows_per_second": len(train_windows) / max(t_train - t_epoch, 1e-9),
                }
                history.append(record)
                best = best_epoch_index([h["val_window_loss"] for h in history])
                best_epoch = None if best is None else best + 1
                reason = stop_reason(history, tc["max_epochs"], tc["patience"], tc["tolerance"])
                if reason is None and max_minutes is not None:
                    # one decision for all processes (their clocks differ): a process that stopped alone would leave
                    # the others waiting in the next epoch's first collective
                    over = torch.tensor(
                        [float(time.monotonic() - t_start >= 60 * max_minutes)], device=accelerator.device
                    )
                    if float(accelerator.reduce(over, reduction="sum")[0]) > 0:
                        reason = "time_budget"
                if is_main:
                    if best_epoch == epoch:
                        inner.save_pretrained(
                            out / BEST_DIR,
                            vocab=vocab,
                            known_sentences=known,
                            **{k: v for k, v in record.items() if k not in TIMING_KEYS},
                        )
                    save_training_state(
                        out,
                        inner,
                        optimizer,
                        vocab,
                        {
                            "epoch": epoch,
                            "best_epoch": best_epoch,
                            "history": history,
                            "wall_seconds": record["wall_seconds"],
                            "train_windows": len(train_windows),
                            "stop_reason": reason,
                        },
                        known_sentences=known,
                    )
                    saved_epoch = epoch
                    write_metrics(out / METRICS_FILE, history)
                    plot_curves(history, best_epoch, out / CURVES_FILE)
                accelerator.wait_for_everyone()
                say(
                    f"epoch {epoch}: train_loss {train_loss:.4f}  val_window_loss {record['val_window_loss']:.4f}  "
                    f"L_S(4) {record['val_last_ce']:.4f}  acc {record['val_token_accuracy']:.4f}  ppl {record['val_perplexity']:.1f}  "
                    f"| train {record['train_seconds']:.1f}s ({record['train_windows_per_second']:.0f} windows/s), "
                    f"validation {record['eval_seconds']:.1f}s, epoch {record['epoch_seconds']:.1f}s"
                    + ("  *best*" if best_epoch == epoch else "")
                )
        except KeyboardInterrupt:
            # (a signal after the save of an epoch, while the processes wait for each other, finds that epoch saved)
            say(
                f"\ninterrupted {'after' if saved_epoch == epoch else 'during'} epoch {epoch}; "
                f"{out / LAST_DIR} holds epoch {saved_epoch}; continue with --resume"
            )
            raise

    best = best_epoch_index([h["val_window_loss"] for h in history])
    best_record = history[best] if best is not None else {}
    summary = {
        "config": config,
        "train_subset": train_subset,
        "data_dir": str(data_dir),
        "corpus_statistics": stats,
        "train_windows": len(train_windows),
        "validation_windows": len(val_windows),
        "model_type": mc["type"],
        "parameters": parameters,
        "best_epoch": best_record.get("epoch"),
        "last_epoch": history[-1]["epoch"] if history else 0,
        "stop_reason": reason,
        "best_metrics": {k: v for k, v in best_record.items() if k not in TIMING_KEYS and k != "epoch"},
        "wall_seconds_to_best": best_record.get("wall_seconds"),
        "wall_seconds_total": history[-1]["wall_seconds"] if history else 0.0,
        "resumed_from_epoch": resumed_from,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "versions": {"torch": torch.__version__, "accelerate": __import__("accelerate").__version__},
    }
    if is_main:
        write_json_atomic(out / SUMMARY_FILE, summary)
    say(
        f"stopped ({reason}) after epoch {summary['last_epoch']}; best epoch {summary['best_epoch']}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in summary["best_metrics"].items())
    )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train the world-model predictor on ROCStories or synthetic-world sentences (paper, section 8.2)."
    )
    parser.add_argument("--config", required=True, type=Path, help="YAML config (configs/world_model/*.yaml)")
    parser.add_argument(
        "--data",
        required=True,
        type=Path,
        help="folder with ROCStories*.csv and cloze_test_*.csv, or a synthetic world's folder holding train/episodes.jsonl",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder (must not hold a run unless --resume)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last completed epoch")
    parser.add_argument("--max-epochs", type=int, help="override training.max_epochs")
    parser.add_argument("--max-minutes", type=float, help="stop after the epoch in which this many minutes have passed")
    parser.add_argument("--train-subset", type=int, help="train on the first K training stories (or episodes) only")
    parser.add_argument("--seed", type=int, help="override training.seed")
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="override training.precision (bf16: mixed precision, fp32 weights)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--step-delay", type=float, default=0.0, help=argparse.SUPPRESS
    )  # tests: slow a run down to interrupt it
    args = parser.parse_args(argv)
    try:
        train(
            args.config,
            args.data,
            args.out,
            resume=args.resume,
            max_epochs=args.max_epochs,
            max_minutes=args.max_minutes,
            train_subset=args.train_subset,
            seed=args.seed,
            precision=args.precision,
            progress=not args.no_progress,
            step_delay=args.step_delay,
        )
    except (ConfigError, DataError, TrainingError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

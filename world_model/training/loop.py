"""One epoch of training and validation on each process, and the stopping rule of section 8.2.

`prepare` builds the run's pieces (`Trainer`) on the processes accelerate set up; `run_epoch` trains one epoch
(one `optimizer_step` per batch), validates, and returns the epoch's record (a line of metrics.jsonl).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from world_model.evaluation.evaluate import evaluation_sums, metrics_from_sums
from world_model.models.precision import autocast
from world_model.training.batches import EpochOrderSampler, ProcessBatches, WindowDataset, derived_seed, stack_batch
from world_model.training.config import TrainingConfig
from world_model.training.schedule import learning_rate
from world_model.utils.cli import Interrupted, handled_signals

if TYPE_CHECKING:
    from accelerate import Accelerator


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


# ----- the process-wide settings of a run -----
@contextlib.contextmanager
def signals_held():
    """Inside the block the stop signals (SIGINT, SIGTERM, SIGHUP; not those the process ignores) wait: the first
    one that arrives is raised as the block ends (what the handler outside the block raises, else `Interrupted`), so
    the block's work, such as the save of an epoch, is never cut in half. An exception raised at an arbitrary point
    can also land inside an import, where Python turns it into a RuntimeError. Only in the main thread, where
    handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: arrived.append(signum)) for signum in handled_signals()
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if arrived:
        handler = previous[arrived[0]]
        if callable(handler):
            handler(arrived[0], None)
        raise Interrupted(arrived[0])


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


# ----- the pieces of a run on one process -----
class StepModule(nn.Module):
    """Routes forward() to `model.training_step`, so DistributedDataParallel sees the call that builds the graph.
    A `label_smoothing` above 0 is passed on with its `smoothing_prior` ((N + 1, V) for the flat baseline, (N, V)
    for the 4-tensor model, None for uniform; see TrainingConfig) and, for the flat baseline's "counts_copy" prior,
    its `smoothing_copy` ((N + 1,): each step's share for copying the context); both are buffers, so they move to
    the model's device."""

    def __init__(
        self,
        model: nn.Module,
        label_smoothing: float = 0.0,
        smoothing_prior: torch.Tensor | None = None,
        smoothing_copy: torch.Tensor | None = None,
    ):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.register_buffer("smoothing_prior", smoothing_prior, persistent=False)
        self.register_buffer("smoothing_copy", smoothing_copy, persistent=False)

    def forward(self, windows: torch.Tensor):
        if self.label_smoothing == 0:
            return self.model.training_step(windows)
        smoothing = {"label_smoothing": self.label_smoothing, "smoothing_prior": self.smoothing_prior}
        if self.smoothing_copy is not None:
            smoothing["smoothing_copy"] = self.smoothing_copy
        return self.model.training_step(windows, **smoothing)


@dataclass
class Trainer:
    """What one process trains with: `step_module` and `optimizer` as prepared by accelerate, the batches of this
    process (`loader`, ordered by `sampler`), the training windows (S, T+1, N) and this process's share of the
    validation windows (V / num_processes, T+1, N)."""

    accelerator: Accelerator
    config: TrainingConfig
    step_module: nn.Module
    optimizer: torch.optim.Optimizer
    sampler: EpochOrderSampler
    loader: DataLoader
    train_windows: torch.Tensor
    val_shard: torch.Tensor

    @property
    def model(self) -> nn.Module:
        """The model itself (its weights are the ones trained), outside any DistributedDataParallel wrapper."""
        return self.accelerator.unwrap_model(self.step_module).model


def prepare(
    accelerator: Accelerator,
    model: nn.Module,
    config: TrainingConfig,
    train_windows: torch.Tensor,
    val_windows: torch.Tensor,
    smoothing_prior: torch.Tensor | None = None,
    smoothing_copy: torch.Tensor | None = None,
) -> Trainer:
    """AdamW on `model`, and the batches of this process (sharded here, not by accelerator.prepare: see
    ProcessBatches; batches are moved to the device in `run_epoch`). `smoothing_prior` and `smoothing_copy`: the
    target of label smoothing with training.label_smoothing_prior "counts" or "counts_copy" (see StepModule and
    `world_model.training.train.smoothing_prior`; None: uniform)."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, eps=config.adam_eps
    )
    sampler = EpochOrderSampler(len(train_windows), config.seed)
    batches = ProcessBatches(sampler, config.batch_size, accelerator.num_processes, accelerator.process_index)
    loader = DataLoader(WindowDataset(train_windows), collate_fn=stack_batch, batch_sampler=batches)
    step_module, optimizer = accelerator.prepare(
        StepModule(model, config.label_smoothing, smoothing_prior, smoothing_copy), optimizer
    )
    val_shard = val_windows[accelerator.process_index :: accelerator.num_processes]
    return Trainer(accelerator, config, step_module, optimizer, sampler, loader, train_windows, val_shard)


def optimizer_step(trainer: Trainer, batch: torch.Tensor, live: bool):
    """One AdamW step on `batch` (B, T+1, N), on the device; returns the model's StepStats of the batch.

    `live` is False only for the empty share of a last, short step (`batch` is then a stand-in window that the
    loss gives weight 0). With several processes DDP averages their gradients; weighting each process's mean by
    its share of the step's target tokens makes that average the gradient of the mean over all of them, as one
    process with the whole step's windows would compute (shares may differ in tokens or size)."""
    accelerator, n_proc = trainer.accelerator, trainer.accelerator.num_processes
    with autocast(trainer.config.precision, accelerator.device):
        stats = trainer.step_module(batch)
    loss = stats.loss
    if n_proc > 1:
        tokens = stats.window_tokens.double() * live
        total = accelerator.reduce(tokens.reshape(1).clone(), reduction="sum")[0]
        loss = loss * (tokens * n_proc / total.clamp(min=1)).to(loss.dtype)
    trainer.optimizer.zero_grad(set_to_none=True)
    accelerator.backward(loss)
    trainer.optimizer.step()
    return stats


def train_epoch(trainer: Trainer, epoch: int, progress: bool) -> float:
    """Train epoch `epoch` (1-based) at the schedule's learning rates; the mean training window loss over all
    processes (nan if no target token was seen)."""
    from accelerate.utils import set_seed

    accelerator, config, loader = trainer.accelerator, trainer.config, trainer.loader
    set_seed(derived_seed("epoch", config.seed, epoch), device_specific=True)  # the dropout stream of this epoch
    trainer.sampler.epoch = epoch
    trainer.step_module.train()
    sums = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # (window CE sum, window tokens)
    bar = loader
    if progress and accelerator.is_main_process:
        from tqdm.auto import tqdm

        bar = tqdm(loader, desc=f"epoch {epoch}/{config.max_epochs}", leave=False, dynamic_ncols=True)
    for step, batch in enumerate(bar):
        for group in trainer.optimizer.param_groups:
            group["lr"] = learning_rate(config, (epoch - 1) * len(loader) + step, len(loader))
        live = len(batch) > 0
        stats = optimizer_step(trainer, (batch if live else trainer.train_windows[:1]).to(accelerator.device), live)
        if live:
            sums += torch.stack([stats.window_ce_sum.double(), stats.window_tokens.double()])
        if bar is not loader and step % 10 == 0:
            bar.set_postfix(loss=f"{float(sums[0] / sums[1].clamp(min=1)):.4f}")
    if bar is not loader:
        bar.close()
    sums = accelerator.reduce(sums, reduction="sum")
    return float(sums[0] / sums[1]) if float(sums[1]) > 0 else float("nan")


def validate(trainer: Trainer) -> dict[str, float]:
    """The validation metrics (val_window_loss, val_last_ce, val_token_accuracy, val_perplexity) over the
    validation windows of all processes."""
    config, accelerator = trainer.config, trainer.accelerator
    sums = evaluation_sums(
        trainer.model, trainer.val_shard, config.eval_batch_size, accelerator.device, config.precision
    )
    return metrics_from_sums(accelerator.reduce(sums, reduction="sum"))


def run_epoch(trainer: Trainer, epoch: int, wall_start: float, progress: bool) -> dict[str, Any]:
    """Train and validate epoch `epoch`; its record: the losses and metrics, and the seconds spent (wall_seconds
    counts from `wall_start`, a time.monotonic() value, which a resumed run moves back by the time already spent)."""
    t_epoch = time.monotonic()
    train_loss = train_epoch(trainer, epoch, progress)
    t_train = time.monotonic()
    metrics = validate(trainer)
    t_eval = time.monotonic()
    return {
        "epoch": epoch,
        "train_loss": train_loss,
        "val_window_loss": metrics["val_window_loss"],
        "val_last_ce": metrics["val_last_ce"],
        "val_token_accuracy": metrics["val_token_accuracy"],
        "val_perplexity": metrics["val_perplexity"],
        "train_seconds": t_train - t_epoch,
        "eval_seconds": t_eval - t_train,
        "epoch_seconds": t_eval - t_epoch,
        "wall_seconds": t_eval - wall_start,
        "train_windows_per_second": len(trainer.train_windows) / max(t_train - t_epoch, 1e-9),
    }

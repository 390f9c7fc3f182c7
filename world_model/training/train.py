"""Train a predictor on sentence windows with the optimisation and checkpoint rule of section 8.2.

    python -m world_model.training.train --config configs/world_model/cpu.yaml --data DATA_DIR --out OUT_DIR \
        [--resume] [--max-epochs E] [--max-minutes M] [--train-subset K] [--seed S]
    accelerate launch -m world_model.training.train ...        # several GPUs; batch_size is per device

DATA_DIR is either a ROCStories folder (ROCStories*.csv for training, cloze_test_*.csv for validation; one
window of 5 sentences per story) or a synthetic-world folder holding train/episodes.jsonl
(configs/world_model/synthetic.yaml; one window per second t >= 1 of an episode: the T sentences before it,
left-padded at the start, then sentence t; see world_model.data.synthetic.episodes). The kind is read off the
folder's contents.

OUT_DIR receives run.json, metrics.jsonl, curves.png, best/, last/ and summary.json (see
world_model.training.checkpoints); --resume continues from last/.

Stopping rule (section 8.2): stop once at least `patience` (5) epochs have passed since the minimum
validation selection loss and the current loss is above `tolerance` (1.01) times that minimum, or when
the epoch budget is exhausted. One epoch of training is world_model.training.loop.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import contextlib
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import torch

from world_model.evaluation.floors import count_copy_prior, count_prior
from world_model.models.registry import build_model, count_parameters, model_vocab_size
from world_model.training import checkpoints
from world_model.training.batches import prefix_windows
from world_model.training.checkpoints import LAST_DIR, TIMING_KEYS, Resumed, TrainingError
from world_model.training.config import TrainingConfig
from world_model.training.inputs import TrainingData, TrainSettings, check_budgets, resolved_config
from world_model.training.loop import (
    Trainer,
    best_epoch_index,
    deterministic_algorithms,
    prepare,
    run_epoch,
    signals_held,
    stop_reason,
)
from world_model.utils.cli import as_interrupted, check_writable, stop_signals_raise
from world_model.utils.files import claimed
from world_model.utils.flags import settings_main


def start_accelerator():
    """The accelerate Accelerator of this process (CPU when there is no GPU); a TrainingError when it did not
    join every process the launcher started."""
    from accelerate import Accelerator

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
    return accelerator


def describe_data(data: TrainingData, train_subset: int | None, accelerator, batch_size: int, say: Callable) -> None:
    """Print the corpus statistics and the window counts."""
    stats = data.stats
    say("corpus: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()))
    unit = "episodes" if "train_episodes" in stats else "stories"
    if train_subset and train_subset > stats[f"train_{unit}"]:
        say(
            f"note: --train-subset {train_subset} exceeds the {stats[f'train_{unit}']} training {unit}; using all of them"
        )
    say(
        f"windows: train {tuple(data.train_windows.shape)}, validation {tuple(data.val_windows.shape)}; "
        f"{accelerator.num_processes} process(es) on {accelerator.device}, batch {batch_size} per process"
    )


def resume_run(
    out: Path, state_dir: Path | None, model, data: TrainingData, data_dir: Path, accelerator, say: Callable
) -> Resumed | None:
    """The state to continue from (its weights loaded into `model`), or None for a new run; a TrainingError when
    the processes found different states (an --out that is not shared)."""
    resumed = None
    if state_dir is not None:
        resumed = checkpoints.resume_from(state_dir, model, data.vocab, len(data.train_windows), data_dir)
        say(f"resuming {out} after epoch {resumed.epoch}")
        record = checkpoints.read_run_record(out)
        before = record.get("num_processes")
        if before not in (None, accelerator.num_processes):
            say(
                f"note: the run used {before} process(es), this one {accelerator.num_processes}: the effective batch changes"
            )
        threads = record.get("torch_threads")
        if threads not in (None, torch.get_num_threads()):
            say(
                f"note: the run used {threads} thread(s), this one {torch.get_num_threads()}: sums are taken in another "
                "order, so the epochs from here on will not repeat an uninterrupted run's to the last decimal"
            )
    if accelerator.num_processes > 1:  # a process that read no state (its own copy of --out) would train apart
        starts = accelerator.gather(torch.tensor([resumed.epoch if resumed else 0], device=accelerator.device))
        if len(set(starts.tolist())) > 1:
            raise TrainingError(
                f"--resume: the processes found different states in {out} (epochs {starts.tolist()}); "
                "--out must be one folder that every process sees (a shared filesystem)"
            )
    return resumed


def over_time(accelerator, deadline: float | None) -> bool:
    """Whether time.monotonic() has reached `deadline` (None: no time budget): one decision for all processes (their
    clocks differ), as a process that stopped alone would leave the others waiting in the next epoch's first
    collective."""
    if deadline is None:
        return False
    over = torch.tensor([float(time.monotonic() >= deadline)], device=accelerator.device)
    return float(accelerator.reduce(over, reduction="sum")[0]) > 0


def train_epochs(
    trainer: Trainer,
    out: Path,
    data: TrainingData,
    history: list[dict],
    wall_offset: float,
    deadline: float | None,
    progress: bool,
    say: Callable,
) -> str:
    """Train the epochs after those of `history` (appending their records), saving the run folder after each,
    until the stopping rule, the epoch cap or the `deadline` (a time.monotonic() value) stops the run; why it
    stopped. `wall_offset` is the training time of the epochs in `history`. On Ctrl-C or SIGTERM, say which epoch
    last/ holds (in the `Interrupted` raised)."""
    config, accelerator = trainer.config, trainer.accelerator
    reason = stop_reason(history, config.max_epochs, config.patience, config.tolerance)
    epoch = saved_epoch = history[-1]["epoch"] if history else 0
    wall_start = time.monotonic() - wall_offset
    try:
        while reason is None:
            epoch += 1
            record = run_epoch(trainer, epoch, wall_start, progress)
            history.append(record)
            best = best_epoch_index([h["val_window_loss"] for h in history])
            best_epoch = None if best is None else best + 1
            reason = stop_reason(history, config.max_epochs, config.patience, config.tolerance)
            if reason is None and over_time(accelerator, deadline):
                reason = "time_budget"
            if accelerator.is_main_process:
                state = {"train_windows": len(data.train_windows), "stop_reason": reason}
                model, optimizer = trainer.model, trainer.optimizer
                with signals_held():  # a signal during the save is raised once the epoch is saved
                    checkpoints.save_epoch(out, model, optimizer, data.vocab, data.known, history, best_epoch, state)
                    saved_epoch = epoch
            accelerator.wait_for_everyone()
            say(epoch_line(record) + ("  *best*" if best_epoch == epoch else ""))
    except KeyboardInterrupt as err:
        # (a signal after the save of an epoch, while the processes wait for each other, finds that epoch saved)
        where = f"{'after' if saved_epoch == epoch else 'during'} epoch {epoch}"
        if saved_epoch == 0:
            note = f"stopped {where}, before any epoch was saved; start again with --resume"
        else:
            note = f"stopped {where}; {out / LAST_DIR} holds epoch {saved_epoch}; continue with --resume"
        raise as_interrupted(err, note) from None
    return reason


def smoothing_prior(
    tc: TrainingConfig, windows: torch.Tensor, vocab_size: int, model
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The target of label smoothing, fitted on the training `windows` (S, T+1, N) alone: (prior, copy_mass).

    training.label_smoothing_prior "counts": prior = `count_prior`, (N + 1, V) for the flat baseline, whose steps
    include [EOS], (N, V) for the 4-tensor model's token slots; "counts_copy" (flat baseline): `count_copy_prior`,
    whose copy_mass (N + 1,) is each step's share for copying the window's context. (None, None) for no smoothing
    or uniform smoothing; copy_mass is None but for "counts_copy"."""
    if tc.label_smoothing == 0 or tc.label_smoothing_prior == "uniform":
        return None, None
    if tc.label_smoothing_prior == "counts_copy":
        return count_copy_prior(windows, vocab_size, model.config.vocab_size, model.config.eos_id)
    return count_prior(windows, vocab_size, model.config.vocab_size, getattr(model.config, "eos_id", None)), None


def epoch_line(record: dict) -> str:
    """The progress line of an epoch's record."""
    return (
        f"epoch {record['epoch']}: train_loss {record['train_loss']:.4f}  val_window_loss {record['val_window_loss']:.4f}  "
        f"L_S(4) {record['val_last_ce']:.4f}  acc {record['val_token_accuracy']:.4f}  ppl {record['val_perplexity']:.1f}  "
        f"| train {record['train_seconds']:.1f}s ({record['train_windows_per_second']:.0f} windows/s), "
        f"validation {record['eval_seconds']:.1f}s, epoch {record['epoch_seconds']:.1f}s"
    )


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
) -> dict:
    """Train, write OUT_DIR (see the module docstring) and return the summary dict.

    `config` is a config dict or a YAML path; `max_epochs`, `seed` and `precision` override its training section.
    `train_subset` keeps the first K training stories or episodes (the vocabulary still covers the whole pool).
    """
    config = resolved_config(config, max_epochs, seed, precision)
    check_budgets(train_subset, max_minutes)
    run_record = {"config": config, "train_subset": train_subset}
    out = Path(out_dir)
    check_writable(out)
    with claimed(out) if launched_first() else contextlib.nullcontext():
        return train_claimed(config, Path(data_dir), out, run_record, resume, max_minutes, train_subset, progress)


def launched_first() -> bool:
    """Whether this is the first (or only) process of the launch: the one that holds --out."""
    return os.environ.get("RANK", "0") == "0"


def train_claimed(
    config: dict,
    data_dir: Path,
    out: Path,
    run_record: dict,
    resume: bool,
    max_minutes: float | None,
    train_subset: int | None,
    progress: bool,
) -> dict:
    """`train` once --out is held by this process."""
    t_start = time.monotonic()
    tc, mc = TrainingConfig.from_dict(config["training"]), config["model"]
    state_dir = checkpoints.check_run_folder(out, run_record, resume)
    data = TrainingData.load(data_dir, mc, train_subset, tc.holdout_stories)  # DataError before any training
    story_windows = data.train_windows  # (S, T+1, N): what a count prior is fitted on
    if tc.target_sentences == "all":  # every sentence S(1..T) a target behind the ones before it (flat baseline)
        data.train_windows = prefix_windows(data.train_windows)

    from accelerate.utils import set_seed

    accelerator = start_accelerator()

    def say(*args) -> None:
        accelerator.print(*args, flush=True)

    describe_data(data, train_subset, accelerator, tc.batch_size, say)
    with deterministic_algorithms(), stop_signals_raise():
        set_seed(tc.seed)
        model = build_model(mc, model_vocab_size(mc["type"], data.vocab))
        parameters = count_parameters(model)
        if resume and state_dir is None:
            say(f"note: {out} holds no completed epoch to resume; starting a new run")
        resumed = resume_run(out, state_dir if resume else None, model, data, data_dir, accelerator, say)
        prior, copy_mass = smoothing_prior(tc, story_windows, len(data.vocab), model)
        trainer = prepare(accelerator, model, tc, data.train_windows, data.val_windows, prior, copy_mass)
        if resumed is not None:
            trainer.optimizer.load_state_dict(resumed.optimizer_state)
            checkpoints.restore_rng(*resumed.rng)
        history = resumed.history if resumed else []
        run_facts = {
            "data_dir": str(data_dir),
            "corpus_statistics": data.stats,
            "train_windows": len(data.train_windows),
            "validation_windows": len(data.val_windows),
            "torch_threads": torch.get_num_threads(),
        }
        if accelerator.is_main_process:
            facts = {**run_facts, "parameters": parameters, "num_processes": accelerator.num_processes}
            checkpoints.start_run_folder(out, {**run_record, **facts}, history)
        accelerator.wait_for_everyone()
        deadline = None if max_minutes is None else t_start + 60 * max_minutes
        wall_offset = resumed.wall_seconds if resumed else 0.0
        reason = train_epochs(trainer, out, data, history, wall_offset, deadline, progress, say)
    summary = summarise(run_record, run_facts, mc["type"], parameters, history, reason, resumed, accelerator)
    if accelerator.is_main_process:
        checkpoints.write_summary(out, summary)
    say(
        f"stopped ({reason}) after epoch {summary['last_epoch']}; best epoch {summary['best_epoch']}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in summary["best_metrics"].items())
    )
    return summary


def summarise(
    run_record: dict,
    run_facts: dict,
    model_type: str,
    parameters: int,
    history: Sequence[dict],
    reason: str,
    resumed: Resumed | None,
    accelerator,
) -> dict:
    """summary.json: the run (config, subset, data, model size), its best epoch and metrics, why and when it stopped."""
    best = best_epoch_index([h["val_window_loss"] for h in history])
    best_record = history[best] if best is not None else {}
    return {
        **run_record,
        **run_facts,
        "model_type": model_type,
        "parameters": parameters,
        "best_epoch": best_record.get("epoch"),
        "last_epoch": history[-1]["epoch"] if history else 0,
        "stop_reason": reason,
        "best_metrics": {k: v for k, v in best_record.items() if k not in TIMING_KEYS and k != "epoch"},
        "wall_seconds_to_best": best_record.get("wall_seconds"),
        "wall_seconds_total": history[-1]["wall_seconds"] if history else 0.0,
        "resumed_from_epoch": resumed.epoch if resumed else None,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "versions": {"torch": torch.__version__, "accelerate": __import__("accelerate").__version__},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line of `python -m world_model.training.train` (and `wm-train`)."""
    return settings_main(
        TrainSettings,
        "world_model.training.train",
        "Train the world-model predictor on ROCStories or synthetic-world sentences (paper, section 8.2).",
        train_command,
        argv,
    )


def train_command(settings: TrainSettings, command: str) -> dict:
    """The command's work: `train` with the settings; its summary."""
    options = asdict(settings)
    return train(options.pop("config"), options.pop("data"), options.pop("out"), **options)


if __name__ == "__main__":
    sys.exit(main())

"""The run folder of a training run: what is written after every epoch, what --resume reads back and checks.

    run.json        the normalised config and training subset (what --resume checks), corpus statistics, the
                    process and thread counts of the latest invocation
    metrics.jsonl   one JSON line per epoch
    curves.png      train / validation window loss and L_S(4) per epoch, the best epoch marked
    best/           the checkpoint of the minimum validation window loss (save_pretrained + vocab.json)
    last/           everything needed to resume after the last completed epoch (written atomically)
    summary.json    written when training stops

Nothing here unpickles: the resume state is safetensors + JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from world_model.models.checkpoint import CheckpointError, check_state_dict, read_state_dict
from world_model.text.vocab import Vocabulary
from world_model.training.config import ConfigError, TrainingConfig, validate_config
from world_model.training.schedule import schedule_follows_max_epochs
from world_model.utils.cli import one_line
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
# The keys of an epoch's record that measure time: left out of best/'s config.json and of the summary's metrics.
TIMING_KEYS = ("epoch_seconds", "train_seconds", "eval_seconds", "wall_seconds", "train_windows_per_second")


class TrainingError(ValueError):
    """A run that must not start: bad arguments, an output folder in use, or a resume that does not match."""


# ----- resume state: safetensors + JSON, no pickle -----
def flatten_optimizer_state(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer state_dict as (tensors named "state.<param index>.<key>", the JSON-able rest)."""
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
    """The optimizer state_dict that `flatten_optimizer_state` split into `tensors` and `meta`."""
    state: dict[int, dict] = {int(i): dict(plain) for i, plain in meta["state"].items()}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def capture_rng() -> tuple[dict[str, torch.Tensor], dict]:
    """The torch (CPU and CUDA), numpy and Python RNG states as (tensors, JSON-able rest)."""
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
    """Set the RNG states that `capture_rng` returned (the CUDA ones only on as many devices)."""
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
        write_json_atomic(tmp / "state.json", {**state, "rng": rng_meta})  # last: its presence marks a complete folder
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
    """(model weights, optimizer state_dict, (rng tensors, rng meta), state) of a folder from save_training_state;
    a CheckpointError naming the file that is missing or damaged."""

    def read(name: str, load: Callable[[Path], object]):
        try:
            return load(folder / name)
        except (OSError, ValueError, SafetensorError) as err:
            raise CheckpointError(
                f"{folder / name} is missing or damaged, so {folder} is not a complete resume state: {err}"
            ) from err

    state = read("state.json", lambda path: json.loads(path.read_text()))
    opt_meta = read("optimizer.json", lambda path: json.loads(path.read_text()))
    try:
        opt = unflatten_optimizer_state(read("optimizer.safetensors", load_file), opt_meta)
        rng = (read("rng.safetensors", load_file), state.pop("rng"))
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"{folder} is not a complete resume state (optimizer.json or state.json): {err}") from err
    return read_state_dict(folder / "model"), opt, rng, state


def read_run_record(out: Path) -> dict:
    """OUT/run.json, or a TrainingError naming it when it is unreadable or not a JSON object."""
    path = out / RUN_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TrainingError(f"{path} is damaged ({one_line(err)}); this run cannot be resumed") from err
    if not isinstance(record, dict):
        raise TrainingError(f"{path} is damaged (not a JSON object); this run cannot be resumed")
    return record


@dataclass
class Resumed:
    """What a resumed run continues from: the epochs done, the optimizer and RNG states to restore after
    accelerate prepared the optimizer, and the training time already spent."""

    history: list[dict]
    epoch: int
    wall_seconds: float
    optimizer_state: dict
    rng: tuple[dict[str, torch.Tensor], dict]


def resume_from(state_dir: Path, model: nn.Module, vocab: Vocabulary, train_windows: int, data_dir: Path) -> Resumed:
    """Load the weights of `state_dir` (a run's last/) into `model` and return the rest of its state; a
    TrainingError when the data (vocabulary or number of training windows) are not the run's."""
    weights, opt_state, rng, saved = load_training_state(state_dir)
    if Vocabulary.load(state_dir / "model").itos != vocab.itos or saved.get("train_windows") != train_windows:
        raise TrainingError(
            f"--resume: the data in {data_dir} differ from the data the run in {state_dir.parent} was trained on "
            "(vocabulary or number of training windows)"
        )
    check_state_dict(model.state_dict(), weights, state_dir / "model")
    model.load_state_dict(weights)
    return Resumed(saved["history"], saved["epoch"], saved["wall_seconds"], opt_state, rng)


# ----- checks before a run starts -----
def config_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += config_differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [f"{prefix[:-1]}: {a!r} -> {b!r}"]


def check_run_folder(out: Path, run_record: dict, resume: bool) -> Path | None:
    """Refuse an `out` that holds a run unless `resume`, one that holds other files, and a resume whose run differs
    from `run_record` ({"config": normalised config, "train_subset": K}) in more than the budgets of
    RESUME_MAY_CHANGE; the folder of the state to resume from, or None."""
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--out {out} is a file, not a folder")
    found = [name for name in RUN_MARKERS if (out / name).exists()]
    state_dir = find_state_dir(out) if out.is_dir() else None
    if found and not resume:
        raise TrainingError(
            f"{out} already holds a training run ({', '.join(found)}); pass --resume to continue it, or choose another --out"
        )
    others = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
    if others and not found:
        raise TrainingError(
            f"--out {out} holds files that are not a training run ({', '.join(others[:5])}); choose another --out"
        )
    if not (resume and found):
        return state_dir
    if not (out / RUN_FILE).is_file():
        raise TrainingError(
            f"{out} holds {', '.join(found)} but no {RUN_FILE}; it is not a run this trainer can resume"
        )
    saved = read_run_record(out)
    saved = {k: saved.get(k) for k in run_record}  # the requested run: config and training subset
    try:  # fields added to the configs since the run started take their defaults
        saved["config"] = validate_config(saved["config"], source=f"{out / RUN_FILE}")
    except ConfigError as err:
        raise TrainingError(f"--resume: {err}") from err
    requested = TrainingConfig.from_dict(run_record["config"]["training"])
    may_change = () if schedule_follows_max_epochs(requested) else RESUME_MAY_CHANGE
    skip = tuple(f"config.{k}:" for k in may_change)
    diffs = [d for d in config_differences(saved, run_record) if not d.startswith(skip)]
    if diffs:
        raise TrainingError(f"--resume: the requested run differs from the one in {out}: " + "; ".join(diffs))
    return state_dir


# ----- writing the folder (on the main process only) -----
def start_run_folder(out: Path, record: dict, history: Sequence[dict]) -> None:
    """Create `out`, drop temporary folders a kill left behind, write run.json (`record`) and, on a resume,
    metrics.jsonl of the epochs done."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f".{LAST_DIR}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    write_json_atomic(out / RUN_FILE, record)
    if history:
        write_metrics(out / METRICS_FILE, history)


def save_epoch(
    out: Path,
    model: nn.Module,
    optimizer,
    vocab: Vocabulary,
    known_sentences: Sequence[str] | None,
    history: Sequence[dict],
    best_epoch: int | None,
    state: dict,
) -> None:
    """After the last epoch of `history`: best/ when it is `best_epoch`, last/ (with `state`: train_windows and
    stop_reason; the epoch, best epoch, history and wall time are added), metrics.jsonl and curves.png."""
    record = history[-1]
    if best_epoch == record["epoch"]:
        extra = {k: v for k, v in record.items() if k not in TIMING_KEYS}
        model.save_pretrained(out / BEST_DIR, vocab=vocab, known_sentences=known_sentences, **extra)
    progress = {"epoch": record["epoch"], "best_epoch": best_epoch, "history": list(history)}
    state = {**progress, "wall_seconds": record["wall_seconds"], **state}
    save_training_state(out, model, optimizer, vocab, state, known_sentences=known_sentences)
    write_metrics(out / METRICS_FILE, history)
    plot_curves(history, best_epoch, out / CURVES_FILE)


def write_summary(out: Path, summary: dict) -> None:
    """summary.json, written when training stops."""
    write_json_atomic(out / SUMMARY_FILE, summary)


def write_metrics(path: Path, history: Sequence[dict]) -> None:
    """metrics.jsonl: one JSON line per epoch record, replaced atomically."""
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

"""What the renderer trainer keeps across steps and stops: the weights' moving average, the stop request, and the
resume state, everything a stopped run needs to go on as if it had not stopped.

``OUT/last/`` (written whole and renamed into place at every checkpoint; safetensors and JSON, no pickle):

    weights.safetensors    the UNet's and the text encoder's float32 weights ("unet.*", "text_encoder.*"), the
                           moving average of them ("ema.<i>", in the trainer's parameter order) and the noise
                           generator's state ("generator")
    optimizer.safetensors  AdamW's moments (``world_model.training.checkpoints.flatten_optimizer_state``)
    state.json             step, minutes trained, the batch sampler's state, the average's counters, the optimizer's
                           other fields, the settings the run was started with and its log so far
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers.training_utils import EMAModel
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from world_model.models.checkpoint import CheckpointError
from world_model.training.checkpoints import flatten_optimizer_state, unflatten_optimizer_state
from world_model.utils.files import atomic_dir, write_json_atomic

STATE_DIR = "last"
BUDGETS = ("max_minutes", "max_steps", "sample_minutes", "save_minutes")  # settings a resumed run may change
EMA_FIELDS = ("decay", "optimization_step")


class EMAWeights:
    """An exponential moving average of a pipeline's trainable weights, swapped in to sample or save."""

    def __init__(self, parameters: list[torch.nn.Parameter], max_decay: float):
        self.parameters = parameters
        self.ema = EMAModel(parameters, decay=max_decay, use_ema_warmup=True, power=2 / 3)

    def update(self) -> None:
        self.ema.step(self.parameters)

    def __enter__(self):
        self.ema.store(self.parameters)
        self.ema.copy_to(self.parameters)

    def __exit__(self, *exc):
        self.ema.restore(self.parameters)


class StopRequest:
    """Set by SIGINT / SIGTERM; the training loop stops after its current step and saves."""

    def __init__(self):
        self.requested = False
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.requested:  # a second signal: stop now, without saving
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nsignal {signum}: stopping after this step and saving", file=sys.stderr)

    def close(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


@dataclass
class RendererState:
    """Where a renderer run is: its step, training minutes, smoothed loss (None before the first step) and log."""

    step: int
    minutes: float
    running_loss: float | None
    log: dict


def save_state(folder: Path, run, where: RendererState) -> None:
    """Write ``folder`` (a run's ``last/``) from ``run`` (a ``RendererRun``) at ``where``."""
    pipe = run.pipe
    tensors = {f"unet.{k}": v.contiguous() for k, v in pipe.unet.state_dict().items()}
    tensors |= {f"text_encoder.{k}": v.contiguous() for k, v in pipe.text_encoder.state_dict().items()}
    tensors |= {f"ema.{i}": p.detach().contiguous() for i, p in enumerate(run.ema.ema.shadow_params)}
    tensors["generator"] = run.generator.get_state()
    optimizer_tensors, optimizer_meta = flatten_optimizer_state(run.optimizer.state_dict())
    state = {
        "step": where.step,
        "minutes": where.minutes,
        "running_loss": where.running_loss,
        "batches": run.rng.bit_generator.state,
        "ema": {k: getattr(run.ema.ema, k) for k in EMA_FIELDS},
        "optimizer": optimizer_meta,
        "log": where.log,
    }
    with atomic_dir(folder) as tmp:
        save_file(tensors, tmp / "weights.safetensors")
        save_file(optimizer_tensors, tmp / "optimizer.safetensors")
        write_json_atomic(tmp / "state.json", state)


def load_state(folder: Path, run, train: dict, model: dict) -> RendererState:
    """Load ``folder`` (from ``save_state``) into ``run``, whose pipeline was built the same way; the run's
    settings ``train`` and ``model`` (as dicts) must be the saved ones but for ``BUDGETS``. A ``CheckpointError``
    names a missing or damaged file or a setting that differs."""
    try:
        state = json.loads((folder / "state.json").read_text())
        tensors = load_file(folder / "weights.safetensors")
        optimizer = unflatten_optimizer_state(load_file(folder / "optimizer.safetensors"), state["optimizer"])
    except (OSError, ValueError, KeyError, SafetensorError) as err:
        raise CheckpointError(f"{folder} is not a complete renderer resume state: {err}") from err
    saved = state["log"]
    differ = [f"--{k.replace('_', '-')}" for k in train if k not in BUDGETS and saved["train"].get(k) != train[k]]
    differ += [f"--{k.replace('_', '-')}" for k in model if json.dumps(saved["model"].get(k)) != json.dumps(model[k])]
    if differ:
        raise CheckpointError(
            f"--resume: {', '.join(differ)} differ from the run in {folder.parent} (only {', '.join(BUDGETS)} "
            "may change)"
        )
    pipe = run.pipe
    for prefix, module in (("unet.", pipe.unet), ("text_encoder.", pipe.text_encoder)):
        module.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
    shadow = [tensors[f"ema.{i}"] for i in range(len(run.parameters))]
    run.ema.ema.load_state_dict({**state["ema"], "shadow_params": shadow})
    run.optimizer.load_state_dict(optimizer)
    run.generator.set_state(tensors["generator"])
    run.rng.bit_generator.state = state["batches"]
    return RendererState(state["step"], state["minutes"], state["running_loss"], saved)


def has_state(out: Path) -> bool:
    """Whether ``out`` holds a renderer run's resume state."""
    return (out / STATE_DIR / "state.json").is_file()

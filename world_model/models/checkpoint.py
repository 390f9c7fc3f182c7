"""Saving and loading models as a folder: config.json + model.safetensors (+ vocab.json).

The folder follows the huggingface_hub / transformers convention, so `from_pretrained` takes a local
folder or a hub repository id. Weights are read with safetensors only: nothing a user hands in is
unpickled. A folder is written beside its destination and renamed into place, so an interrupted save
never leaves a half-written checkpoint under the final name.

Why not huggingface_hub's PyTorchModelHubMixin: its from_pretrained unpickles pytorch_model.bin (torch.load)
for a hub repository without model.safetensors, loads with strict=False (missing or unexpected tensors pass
silently; a wrong shape or a truncated file raises a bare RuntimeError / SafetensorError, not a CheckpointError
naming the file) and prints to stdout, where `world_model.generation.predict --json` writes its result. Its
save_pretrained writes asdict(config) without the model_type that `registry.load_model` dispatches on, without
the vocabulary, known sentences or dtype cast, straight into the destination (no atomic rename), plus a
README.md model card; overriding _save_pretrained and _from_pretrained to keep all of this would leave the
mixin nothing of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from world_model.models.decoding import write_known_sentences
from world_model.utils.files import atomic_dir, write_json_atomic

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint folder is missing, truncated, corrupt, or does not fit the model."""


def resolve_folder(name_or_path: str | os.PathLike) -> Path:
    """A local folder as is; otherwise a hub repository id fetched (or read from the cache) by huggingface_hub."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; a checkpoint is a folder holding {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path)))
    except Exception as err:  # offline, unknown repository, invalid id
        raise CheckpointError(
            f"cannot load checkpoint {str(name_or_path)!r}: it is not a local folder and could not be fetched "
            f"from the model hub ({type(err).__name__}: {err})"
        ) from err


def read_config_dict(folder: Path) -> dict:
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{folder} holds no {CONFIG_NAME}; is it a checkpoint folder?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); the checkpoint is corrupt") from err


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    path = folder / WEIGHTS_NAME
    if not path.is_file():
        raise CheckpointError(f"{folder} holds no {WEIGHTS_NAME}")
    try:  # a file that cannot be opened is not a damaged one
        with open(path, "rb"):
            pass
    except OSError as err:
        raise CheckpointError(f"{path} cannot be opened ({err.strerror}); check its permissions") from err
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is truncated or corrupt and cannot be read: {err}") from err


def check_state_dict(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], where: Path) -> None:
    """Name every missing, unexpected or wrongly shaped tensor."""
    problems = [f"missing {k}" for k in expected if k not in found]
    problems += [f"unexpected {k}" for k in found if k not in expected]
    problems += [
        f"{k} has shape {tuple(found[k].shape)}, the config wants {tuple(v.shape)}"
        for k, v in expected.items()
        if k in found and found[k].shape != v.shape
    ]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise CheckpointError(f"the weights in {where} do not match its config: {shown}")


class PretrainedMixin:
    """`save_pretrained` / `from_pretrained` for an nn.Module with `config` and a `config_class`."""

    config_class: type

    def save_pretrained(
        self,
        folder: str | os.PathLike,
        vocab=None,
        dtype: torch.dtype | None = None,
        known_sentences: Sequence[str] | None = None,
        **extra: Any,
    ) -> Path:
        """Write config.json, model.safetensors (cast to `dtype` if given), the vocabulary and the known
        sentences (known_sentences.txt, for the closed-set readout of `world_model.models.decoding`) into `folder`.

        `extra` entries are stored in config.json under "extra" (e.g. training provenance).
        """
        folder = Path(folder)
        with atomic_dir(folder) as tmp:
            tensors = {
                k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu().contiguous()
                for k, v in self.state_dict().items()
            }
            save_file(tensors, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
            config = self.config.to_dict()
            if extra:
                config["extra"] = extra
            write_json_atomic(tmp / CONFIG_NAME, config)
            if vocab is not None:
                vocab.save(tmp)
            if known_sentences is not None:
                write_known_sentences(tmp, known_sentences)
        return folder

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, device: str | torch.device = "cpu"):
        """Load a model saved by `save_pretrained` (a folder or hub id); weights come back as float32."""
        folder = resolve_folder(name_or_path)
        config_dict = read_config_dict(folder)
        try:
            config = cls.config_class.from_dict(config_dict)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{folder / CONFIG_NAME} does not describe a {cls.__name__}: {err}") from err
        model = cls(config)
        state = read_state_dict(folder)
        check_state_dict(model.state_dict(), state, folder)
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
        return model.to(device).eval()

"""Loading models by folder or hub id: which files a load reads (the fp16 variant where it exists, the local
cache without the network when it holds them), the error that says why a load failed, and the default device."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open

FP16 = "fp16"
PIPELINE_INDEX = "model_index.json"  # a diffusers pipeline folder's index; a transformers model folder has config.json
WEIGHT_SUFFIXES = (".safetensors", ".bin")  # a model repository ships one or both (BLIP base: only the .bin)
# `hf download --include` patterns for the files a load reads: configs, tokenizer vocabularies and the weights.
DOWNLOAD_PATTERNS = {
    PIPELINE_INDEX: ("*.json", "*/*.txt", f"*/*.{FP16}.safetensors"),
    "config.json": ("*.json", "*.txt", "model*.safetensors", "pytorch_model*.bin"),
}
NO_CONVERSION = "DISABLE_SAFETENSORS_CONVERSION"  # transformers' switch for its background .bin conversion
Loaded = TypeVar("Loaded")


class ModelLoadError(OSError):
    """A model id or folder could not be loaded; the message names it and says why."""


def load_model_files(load: Callable[[str | None, bool], Loaded], source: str | Path, index_file: str) -> Loaded:
    """Call ``load(variant, local_files_only)`` with the files ``source`` should load from.

    A folder, or a hub id whose cached snapshot holds every weight file, loads without the network
    (``local_files_only`` for a hub id): the fp16 variant when every weighted part has one, else the default
    files. A hub id not (fully) cached is downloaded: the fp16 variant first, the default files when the
    repository has none. ``index_file`` is the folder's index (``config.json`` or ``model_index.json``).
    """
    folder = model_folder(source, index_file)
    with no_conversion_thread():
        if folder is not None:
            variant = FP16 if FP16 in weight_variants(folder, index_file) else None
            return load(variant, not Path(source).expanduser().is_dir())
        try:
            return load(FP16, False)
        except (OSError, ValueError) as error:
            if FP16 not in str(error):  # not the missing variant: a real failure
                raise
        return load(None, False)


@contextmanager
def no_conversion_thread() -> Iterator[None]:
    """While it lasts, transformers starts no background thread converting a repository's ``.bin`` weights to
    safetensors (a second download of the weights, and a wait at exit)."""
    before = os.environ.get(NO_CONVERSION)
    os.environ[NO_CONVERSION] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NO_CONVERSION, None)
        else:
            os.environ[NO_CONVERSION] = before


def model_folder(source: str | Path, index_file: str) -> Path | None:
    """The folder ``source`` loads from without the network: itself when it is a folder, else its snapshot in
    the hub cache when that holds ``index_file`` and a complete set of weights; None otherwise."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    try:
        index = try_to_load_from_cache(str(source), index_file)
    except ValueError:  # not a valid repo id
        return None
    if not isinstance(index, str):
        return None
    snapshot = Path(index).parent
    return snapshot if weight_variants(snapshot, index_file) else None


def weight_variants(folder: Path, index_file: str) -> list[str | None]:
    """The weight sets complete in ``folder``: ``"fp16"`` when every weighted part has fp16 weights, ``None``
    when every one has default weights (``model.safetensors``, ``pytorch_model.bin``,
    ``diffusion_pytorch_model.safetensors``, or their shards); fp16 first."""
    parts = weighted_parts(folder, index_file)
    if not parts:
        return []
    complete = [v for v in (FP16, None) if all(_has_weights(folder / part, v) for part in parts)]
    return complete


def weighted_parts(folder: Path, index_file: str) -> list[str]:
    """The subfolders of a pipeline folder whose component is a torch module (UNet, VAE, text encoder; not the
    scheduler or tokenizer), or ``["."]`` for a model folder; [] when the index is missing or unreadable."""
    try:
        index = json.loads((folder / index_file).read_text())
    except (OSError, ValueError):
        return []
    if index_file != PIPELINE_INDEX:
        return ["."]
    return [
        name
        for name, entry in index.items()
        if isinstance(entry, list) and len(entry) == 2 and None not in entry and _is_module_class(*entry)
    ]


def _is_module_class(library: str, class_name: str) -> bool:
    try:
        cls = getattr(importlib.import_module(library), class_name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)


def _has_weights(part: Path, variant: str | None) -> bool:
    """Whether ``part`` holds weights (safetensors, or the ``.bin`` transformers reads without unpickling code) of
    ``variant`` (``name.fp16.safetensors``, shards ``name.fp16-00001-of-00002.safetensors``) or, for None, default
    ones (``name.safetensors``, ``pytorch_model.bin``, ``name-00001-of-00002.safetensors``)."""
    names = [p.name.removesuffix(p.suffix) for p in part.iterdir() if p.suffix in WEIGHT_SUFFIXES]
    if variant is None:
        return any("." not in name for name in names)
    return any(name.rsplit(".", 1)[-1].split("-")[0] == variant for name in names if "." in name)


def download_command(source: str | Path, index_file: str) -> str:
    """The ``hf download`` command that fetches only the files a load of hub id ``source`` reads."""
    patterns = " ".join(f'"{p}"' for p in DOWNLOAD_PATTERNS[index_file])
    return f"hf download {source} --include {patterns}"


def explain_load_failure(source: str | Path, index_file: str, error: Exception) -> str:
    """Say why ``source`` failed to load: a folder that lacks files, a missing folder, or a hub id
    that is not cached.  ``index_file`` is the file a loadable folder must have (e.g. config.json)."""
    path = Path(source).expanduser()
    if path.is_dir() and (damaged := unreadable_weights(path)):
        return damaged
    if path.is_dir():
        contents = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
        lacks = f"it has no {index_file}; " if not (path / index_file).exists() else ""
        return f"Cannot load a model from folder {path}: {lacks}it contains: {contents}. Cause: {error}"
    if path.is_file():
        return f"Expected a model folder (with {index_file}) or a hub id, got a file: {path}"
    if str(source).startswith(("/", ".", "~")) or str(source).count("/") > 1:
        return f"Model folder not found: {path}"
    try:
        cached = isinstance(try_to_load_from_cache(str(source), index_file), str)
    except ValueError:  # not a valid repo id either
        return f"{source!r} is neither an existing folder nor a valid Hugging Face Hub id"
    fetch = f"`{download_command(source, index_file)}`"
    if cached:
        return (
            f"Hub model {source!r} is in the local cache but failed to load (its weights may be missing: "
            f"{fetch} fetches them): {error}"
        )
    return (
        f"{source!r} is not a local folder, so it was treated as a Hugging Face Hub id, but it is not in the "
        f"local cache ({hub_constants.HF_HUB_CACHE}) and could not be downloaded. Download it where "
        f"the hub is reachable ({fetch}) and copy the cache, or pass a local folder (without network, "
        f"HF_HUB_OFFLINE=1 skips the download retries). Cause: {error}"
    )


def unreadable_weights(folder: Path) -> str:
    """What is wrong with the first .safetensors file of `folder` that cannot be read (cut short, or not
    safetensors at all), or "" when every one reads."""
    for path in sorted(folder.rglob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError) as err:
            return f"{path} is truncated or corrupt and cannot be read ({err}); copy the model folder again"
    return ""


def default_device(device: str | torch.device | None) -> torch.device:
    """``device`` if given, else CUDA when available, else CPU."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

"""Loading models by folder or hub id: the error that says why one failed, and the default device."""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from safetensors import SafetensorError, safe_open


class ModelLoadError(OSError):
    """A model id or folder could not be loaded; the message names it and says why."""


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
    if cached:
        return f"Hub model {source!r} is in the local cache but failed to load: {error}"
    return (
        f"{source!r} is not a local folder, so it was treated as a Hugging Face Hub id, but it is not in the "
        f"local cache ({hub_constants.HF_HUB_CACHE}) and could not be downloaded. Download it where "
        f"the hub is reachable (`hf download {source}`) and copy the cache, or pass a local folder (without network, "
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

"""The floors `python -m world_model.evaluation.evaluate` reports, fitted once per data folder and kept in a cache.

Fitting and scoring the floors takes minutes (the co-occurrence floor and the bag-of-words dual encoder most), and
none of it depends on the checkpoint, only on the data and the vocabulary. So what evaluate reports of them (the
floor rows, their Story Cloze and coherence reports) is kept, one JSON file an entry: {"key": ..., "report": ...},
named by the SHA-256 of its key. The key holds what the floors read (digests of the training windows, the validation
windows, the encoded Story Cloze halves and the vocabulary), their settings (the grids they are chosen on, the dual
encoder's settings) and a digest of the source of the modules that fit and score them, so that an edit there refits
too. The count floors and the dual encoder are separate entries (`--floors counts` reuses what `all` kept).

An entry that cannot be read or whose key differs from the one asked for is refitted with a one-line warning, and a
cache that cannot be written only warns: the cache never stops an evaluation. Nothing is unpickled, and entries are
written atomically (`write_json_atomic`). The folder is `--floors-cache DIR`, by default the `floors` folder of
`user_cache_dir()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from world_model.data.rocstories import ClozeStory, encode_cloze
from world_model.evaluation import coherence as coh
from world_model.evaluation import floors as floor_package
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.evaluate_report import DUAL_ENCODER
from world_model.evaluation.floors import floor_report
from world_model.evaluation.floors.dual_encoder import DualEncoderSettings, dual_encoder_scorer, fit_dual_encoder
from world_model.models import coherence_head
from world_model.text.vocab import Vocabulary
from world_model.utils.files import write_json_atomic

PROJECT = "semantic-world-model"  # the project's folder in the user's cache
FLOOR_CHOICES = ("none", "counts", "all")  # --floors: none, the count floors, and the dual encoder too
FORMAT = 1  # of an entry; raised when what an entry holds changes
COUNT_SETTINGS = {
    "heldout_fraction": floor_package.HELDOUT_FRACTION,
    "alphas": floor_package.ALPHAS,
    "copy_weights": floor_package.COPY_WEIGHTS,
    "betas": floor_package.BETAS,
    "strengths": floor_package.STRENGTHS,
}
SOURCES = (  # the code that fits and scores the floors: an edit to it refits them
    *sorted(Path(floor_package.__file__).parent.glob("*.py")),
    Path(sc.__file__),
    Path(coh.__file__),
    Path(coherence_head.__file__),
)


def user_cache_dir() -> Path:
    """The project's folder in the user's cache: $XDG_CACHE_HOME/semantic-world-model, or ~/.cache/... when the
    variable is unset, empty or not an absolute path (the XDG Base Directory specification)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / PROJECT


def default_floors_cache() -> Path:
    """Where evaluate keeps the floors without --floors-cache."""
    return user_cache_dir() / "floors"


def tensor_digest(*tensors: torch.Tensor) -> str:
    """SHA-256 of the tensors' dtypes, shapes and values."""
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def json_digest(value) -> str:
    """SHA-256 of `value` as canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def source_digest() -> str:
    """SHA-256 of the source files of SOURCES."""
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def halves_digest(halves: dict[str, list[ClozeStory]], vocab: Vocabulary, n: int) -> str:
    """SHA-256 of the Story Cloze halves as the floors read them: each half's name and encoded items."""
    return json_digest({half: tensor_digest(*encode_cloze(items, vocab, n)) for half, items in halves.items()})


def warn(message: str) -> None:
    """One line on stderr."""
    print(f"warning: {message}", file=sys.stderr)


def read_entry(path: Path, key: dict, fields: dict[str, type]) -> dict | None:
    """The report of the entry `path` when it is there, reads as JSON and was made under `key`, with every field of
    `fields` of its type; else None (with a warning when the file is there but does not qualify)."""
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        warn(f"the floors cache entry {path} cannot be read ({e}); refitting")
        return None
    report = entry.get("report") if isinstance(entry, dict) else None
    if (
        not isinstance(report, dict)
        or entry.get("key") != key
        or not all(isinstance(report.get(name), kind) for name, kind in fields.items())
    ):
        warn(f"the floors cache entry {path} does not match this data and these settings; refitting")
        return None
    return report


def cached_report(folder: Path, name: str, key: dict, fields: dict[str, type], compute: Callable[[], dict]) -> dict:
    """The JSON report `compute()` makes under `key`, with `fields` ({name: type}): read from `folder` when it holds it
    (`read_entry`), else computed and kept there. A fresh report is returned as it reads back from JSON, so that a
    kept and a fresh one are equal."""
    key = json.loads(json.dumps({"format": FORMAT, **key}))
    path = Path(folder) / f"{name}-{json_digest(key)[:32]}.json"
    report = read_entry(path, key, fields)
    if report is not None:
        return report
    report = json.loads(json.dumps(compute()))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"key": key, "report": report})
    except OSError as e:
        warn(f"the floors could not be kept in {path} ({e})")
    return report


def count_floor_results(
    train_windows: torch.Tensor, val_windows: torch.Tensor, halves: dict, vocab: Vocabulary, n: int
) -> dict:
    """The count floors fitted on `train_windows` (S, 5, N): {"floors": their rows (`floor_report` on
    `val_windows`), "story_cloze" and "coherence": {name: report} on the Story Cloze `halves`}."""
    floors, rows = floor_report(train_windows, val_windows, len(vocab))
    return {
        "floors": rows,
        "story_cloze": {name: sc.story_cloze(sc.floor_scorer(f), halves, vocab, n) for name, f in floors.items()},
        "coherence": {name: coh.coherence_report(sc.floor_scorer(f), halves, vocab, n) for name, f in floors.items()},
    }


def dual_encoder_coherence(train_windows: torch.Tensor, halves: dict, vocab: Vocabulary, n: int) -> dict:
    """The coherence report of the bag-of-words dual encoder fitted on `train_windows`, with its fit ("fit")."""
    encoder, fitted = fit_dual_encoder(train_windows, len(vocab))
    report = coh.coherence_report(dual_encoder_scorer(encoder), halves, vocab, n, coh.LIKELIHOOD_FREE_RULES)
    return {**report, "fit": fitted}


def floor_results(
    train_windows: torch.Tensor | None,
    val_windows: torch.Tensor,
    halves: dict,
    vocab: Vocabulary,
    n: int,
    which: str = "all",
    cache: Path | None = None,
) -> dict:
    """What evaluate reports of the floors `which` (FLOOR_CHOICES) fitted on `train_windows` (S, 5, N):
    {"floors": the count floors' rows or None, "story_cloze": {floor: report}, "coherence": {floor: report, and
    the dual encoder's with "all"}}; no floor without training windows. Kept in the folder `cache` (default
    `default_floors_cache()`) and read from it when fitted on the same inputs before (module docstring)."""
    if which not in FLOOR_CHOICES:
        raise ValueError(f"floors must be one of {list(FLOOR_CHOICES)}, got {which!r}")
    if train_windows is None or which == "none":
        return {"floors": None, "story_cloze": {}, "coherence": {}}
    folder = default_floors_cache() if cache is None else cache
    inputs = {
        "train_windows": tensor_digest(train_windows),
        "halves": halves_digest(halves, vocab, n),
        "vocab": json_digest(vocab.itos),
        "source": source_digest(),
    }
    key = {**inputs, "val_windows": tensor_digest(val_windows), "settings": COUNT_SETTINGS}
    fit = partial(count_floor_results, train_windows, val_windows, halves, vocab, n)
    results = cached_report(folder, "counts", key, {"floors": dict, "story_cloze": dict, "coherence": dict}, fit)
    if which == "all":
        key = {**inputs, "settings": vars(DualEncoderSettings())}
        fit = partial(dual_encoder_coherence, train_windows, halves, vocab, n)
        results["coherence"][DUAL_ENCODER] = cached_report(
            folder, "dual_encoder", key, {"retrieval": dict, "fit": dict}, fit
        )
    return results

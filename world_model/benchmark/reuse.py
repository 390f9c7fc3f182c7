"""Finished runs taken over from another benchmark: the run folders of a preset's `reuse_runs:` folder (e.g. the cpu
benchmark's results/benchmark/cpu/runs) that this benchmark would otherwise train again.

A run is taken over only when it is the same run: a folder of the same name (<pair>_<type>[_<variant>]_s<seed>) in
the reuse folder that has finished (summary.json) and whose run.json records an identical run (the model and
training sections, epoch cap and seed included, after `validate_config` has filled the settings added since; the
training subset), trained on as many training and validation windows with as large a vocabulary as this
benchmark's data gives. That is stricter than `--resume`, which lets the epoch cap differ and reads no data. Its
light files (LIGHT_FILES) are copied into OUT/runs/<name>/ with REUSED_FILE naming the source; checkpoints are not
copied (the reports need none: Story Cloze comes from story_cloze.json). A run whose folder in OUT already holds a
run is left to `--resume`; one that differs is not copied, and is trained as usual.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

from world_model.benchmark.runs import COHERENCE_FILE, REUSED_FILE, STORY_CLOZE_FILE, Run
from world_model.training.checkpoints import METRICS_FILE, RUN_FILE, RUN_MARKERS, SUMMARY_FILE, config_differences
from world_model.training.config import ConfigError, validate_config
from world_model.utils.files import REPO_ROOT, repo_path, write_json_atomic

LIGHT_FILES = (RUN_FILE, SUMMARY_FILE, METRICS_FILE, STORY_CLOZE_FILE, COHERENCE_FILE, "curves.png")


def reuse_folder(path: str) -> Path:
    """The folder a preset's `reuse_runs:` names: as given when absolute, else from the repository root."""
    folder = Path(path)
    return folder if folder.is_absolute() else REPO_ROOT / folder


def reuse_differences(source: Path, run: Run, train_subset: int | None, data: dict) -> list[str]:
    """Why the run folder `source` is not `run` trained on `data` ({"train_windows", "validation_windows",
    "vocab_size"} of this benchmark) with `train_subset`: [] when it is the same finished run."""
    if not (source / SUMMARY_FILE).is_file() or not (source / RUN_FILE).is_file():
        return [f"not finished (no {SUMMARY_FILE} or {RUN_FILE})"]
    saved = json.loads((source / RUN_FILE).read_text())
    summary = json.loads((source / SUMMARY_FILE).read_text())
    try:
        config = validate_config(saved["config"], source=str(source / RUN_FILE))
    except (ConfigError, KeyError, TypeError) as err:
        return [f"unreadable config ({err})"]
    found = {
        "config": config,
        "train_subset": saved.get("train_subset"),
        "train_windows": summary.get("train_windows"),
        "validation_windows": summary.get("validation_windows"),
        "vocab_size": summary.get("corpus_statistics", {}).get("vocab_size"),
    }
    return config_differences(found, {"config": run.config, "train_subset": train_subset, **data})


def reuse_runs(runs: list[Run], folder: Path, train_subset: int | None, data: dict, copy: bool = True) -> dict:
    """Take over the finished runs of `folder` that equal runs of `runs` not yet started in OUT (see the module
    docstring): copy their light files (when `copy`: the main process) and mark them done.

    Returns {"source": folder, "reused": [run names], "refused": {run name: [differences]}} for results.json and
    the notes; a run with no folder of its name in `folder` is in neither list."""
    reused, refused = [], {}
    for run in runs:
        source = folder / run.name
        if run.done or any((run.folder / name).exists() for name in RUN_MARKERS) or not source.is_dir():
            continue
        differences = reuse_differences(source, run, train_subset, data)
        if differences:
            refused[run.name] = differences
            continue
        if copy:
            run.folder.mkdir(parents=True, exist_ok=True)
            for name in LIGHT_FILES:
                if (source / name).is_file():
                    shutil.copy2(source / name, run.folder / name)
            write_json_atomic(
                run.folder / REUSED_FILE,
                {"source": repo_path(source), "copied_at": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            )
        run.done = True
        reused.append(run.name)
    return {"source": repo_path(folder), "reused": reused, "refused": refused}


def reuse_notes(results: dict) -> list[str]:
    """The notes on runs taken over (from every run's REUSED_FILE, whichever invocation copied it) and on runs of the
    reuse folder this invocation refused."""
    notes = []
    taken = [r for r in results["runs"] + results.get("variants", []) if r.get("reused_from")]
    if taken:
        notes.append(
            "Taken over from another benchmark, not trained here (identical run config, epoch cap and seed included, "
            "training subset, window counts and vocabulary; world_model/benchmark/reuse.py): "
            + ", ".join(f"{r['run_dir']} from {r['reused_from']}" for r in taken)
            + "."
        )
    for name, differences in ((results.get("reuse") or {}).get("refused") or {}).items():
        notes.append(
            f"{name}: NOT taken over from {results['reuse']['source']}, its run differs: "
            + "; ".join(differences[:5])
            + (f" (and {len(differences) - 5} more)" if len(differences) > 5 else "")
            + "."
        )
    return notes

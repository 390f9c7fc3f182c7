"""What the synthetic world asks of a predictor, and how far predictors get: ceilings, count floors and trained
predictors on held-out episodes, per scene and k = 1..steps seconds ahead, from the sentences (no video).

    python -m world_model.evaluation.world_report --data DATA --out DIR [--episodes N] [--steps 5]
        [--four-tensor DIR [DIR ...]] [--flat-baseline DIR [DIR ...]] [--cache DIR] [--overwrite]

``DATA`` holds ``train/`` and ``heldout/`` (``python -m world_model.data.synthetic.generator generate``). The floors
are counted on the training episodes' sentences; every cut of every held-out episode is a prediction point
(``world_model.evaluation.world_scores``). Predictor folders (with known sentences), one per training seed, are
scored on their k-step marginals (``world_model.evaluation.model_forecasts``), the two kinds paired seed by seed.
``DIR`` gets ``results.json``, ``results.md`` and ``accuracy.png``:

    results.json  {"command", "settings" (with each predictor's "temperatures"), "points", "train_episodes",
                   "targets": {NAME: {"fraction_of_ceiling", "log_loss_minus_entropy"}},
                   "scenes": {SCENE or "all": {"episodes", "points", "needs_memory",
                   "k": {"1".."5": {"ceiling_full_state", "ceiling_from_sentences", "entropy_from_sentences",
                   "predictors": {NAME: {"accuracy", "accuracy_ci95", "log_loss", "ece"}},
                   "four_tensor_minus_flat_baseline": {"accuracy", "log_loss"}}}}}}

NAME is copy_last, markov1, markov2, markov3 (a number each; copy-last's log-loss and ECE are null: it gives no
distribution) and four_tensor, flat_baseline (each ``{"mean", "lo", "hi"}`` over seeds, with "seeds").

A scene *needs memory* ("needs_memory", null for "all") when its Markov-2 floor is at least ``MEMORY_GAP`` below
its from-sentences ceiling one second ahead: counting what followed the last two sentences is then far from the best
a sentence reader can do.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from world_model.data.synthetic.episodes import TRAIN_SPLIT, read_episodes
from world_model.evaluation.world_report_view import PAIR, markdown, plot, value
from world_model.evaluation.world_scores import (
    ALL,
    Forecast,
    Point,
    ceiling_table,
    ceilings_at,
    copy_last_forecasts,
    fit_markov_floors,
    markov_forecasts,
    paired_scores,
    prediction_points,
    score,
    seed_scores,
)
from world_model.utils.cli import UsageError, check_output
from world_model.utils.files import atomic_dir, repo_path, write_json_atomic
from world_model.utils.flags import settings_main

MEMORY_GAP = 0.15
HELDOUT_SPLIT = "heldout"


def scene_types(split: Path) -> list[str]:
    """The scene types a split was generated with (its summary.json), which the from-sentences posterior needs."""
    summary = split / "summary.json"
    if not summary.is_file():
        raise UsageError(
            f"{summary} not found: the split must come from `python -m world_model.data.synthetic.generator`"
        )
    return json.loads(summary.read_text())["scene_types"]


def forecast_checkpoint(
    folder: str | Path,
    points: list,
    steps: int,
    progress: bool,
    cache: Path | None,
    contexts: Sequence[Sequence[str]] | None = None,
) -> list:
    """A predictor folder's k-step forecasts at every point (its known sentences, at its confidence temperature), from
    the points' observed sentences or from ``contexts`` (one list of sentences per point, e.g. their captions); with a
    ``cache`` folder, read from or kept in it under a key of the folder's files, the points, the contexts that differ
    from them and the settings. A forecast depends only on what the model reads, so from ``contexts`` only the
    points whose context differs from their observed sentences are forecast anew."""
    truth = forecasts_from(folder, points, None, steps, progress, cache)
    if contexts is None:
        return truth
    differ = [i for i, (p, c) in enumerate(zip(points, contexts, strict=True)) if list(c) != p.observed]
    if not differ:
        return truth
    fresh = forecasts_from(folder, [points[i] for i in differ], [contexts[i] for i in differ], steps, progress, cache)
    merged = list(truth)
    for i, forecast in zip(differ, fresh):
        merged[i] = forecast
    return merged


def forecasts_from(
    folder: str | Path,
    points: list,
    contexts: Sequence[Sequence[str]] | None,
    steps: int,
    progress: bool,
    cache: Path | None,
) -> list:
    """``forecast_checkpoint``'s work for one set of points and contexts (None: their observed sentences)."""
    from world_model.evaluation import model_forecasts
    from world_model.models.decoding import load_confidence_temperature
    from world_model.models.registry import load_predictor

    folder = Path(folder)
    key = hashlib.sha256()
    for name in ("model.safetensors", "known_sentences.txt", "calibration.json", "vocab.json"):
        if (folder / name).is_file():
            key.update(name.encode() + (folder / name).read_bytes())
    key.update(json.dumps([[p.record["id"], len(p.observed)] for p in points]).encode())
    if contexts is not None:
        key.update(json.dumps([list(c) for c in contexts]).encode())
    settings = [steps] + [getattr(model_forecasts, n) for n in ("EXPAND_MIN", "BEAM", "PRUNE", "TRIE_DEPTH")]
    key.update(json.dumps(settings).encode())
    stored = None if cache is None else cache / f"{key.hexdigest()[:24]}.json"
    if stored is not None and stored.is_file():
        return [Forecast(*row) for row in json.loads(stored.read_text())]
    model, vocab, known = load_predictor(folder)
    if known is None:
        raise UsageError(f"{folder} has no known_sentences.txt: the world report scores a predictor's known sentences")
    temperature = load_confidence_temperature(folder)
    forecasts = model_forecasts.k_step_forecasts(
        model, vocab, known, points, steps, contexts=contexts, temperature=temperature, progress=progress
    )
    if stored is not None:
        cache.mkdir(parents=True, exist_ok=True)
        write_json_atomic(stored, [[f.predicted, f.confidence, f.truth_prob] for f in forecasts])
    return forecasts


def world_report(
    data: str | Path,
    steps: int = 5,
    episodes: int | None = None,
    predictors: dict[str, Sequence[str | Path]] | None = None,
    progress: bool = True,
    cache: Path | None = None,
    contexts: dict[str, Sequence[str]] | None = None,
) -> dict:
    """The ceilings, floors and (optionally) predictors of ``data``'s held-out episodes (the first ``episodes``), per
    scene and over all. ``predictors`` maps a name to its checkpoint folders, one per training seed; their forecasts
    are kept in ``cache`` when given (``forecast_checkpoint``). With ``contexts`` (episode id -> one sentence a
    second, e.g. the captions of its clip) every forecaster, floors included, reads those instead of the true
    sentences; the ceilings stay those of the true sentences."""
    data = Path(data)
    train, heldout = read_episodes(data / TRAIN_SPLIT), read_episodes(data / HELDOUT_SPLIT)[:episodes]
    scenes = scene_types(data / HELDOUT_SPLIT)
    if scene_types(data / TRAIN_SPLIT) != scenes:
        raise UsageError(f"{data}: train and heldout were generated with different --scenes")
    points = prediction_points(heldout, steps)
    table = ceiling_table(points, ceilings_at(points, steps, scenes), steps)
    read = points if contexts is None else read_points(points, contexts)
    forecasts = {"copy_last": copy_last_forecasts(read, steps)}
    for name, floor in fit_markov_floors(train).items():
        forecasts[name] = markov_forecasts(floor, read, steps)
    scores = {name: score(points, f, steps) for name, f in forecasts.items()}
    seen = None if contexts is None else [p.observed for p in read]
    runs = {
        name: [forecast_checkpoint(folder, points, steps, progress, cache, seen) for folder in folders]
        for name, folders in (predictors or {}).items()
        if folders
    }
    scores.update({name: seed_scores(points, r, steps) for name, r in runs.items()})
    paired = paired_scores(points, runs[PAIR[0]], runs[PAIR[1]], steps) if all(n in runs for n in PAIR) else None
    result = {"points": len(points), "train_episodes": len(train), "scenes": {}}
    for group, by_k in table.items():
        members = [p for p in points if group == ALL or p.scene == group]
        entry = {
            "episodes": len({p.record["id"] for p in members}),
            "points": len(members),
            "k": {k: {**row, "predictors": {n: scores[n][group][k] for n in scores}} for k, row in by_k.items()},
        }
        if paired is not None:
            for k in entry["k"]:
                entry["k"][k][f"{PAIR[0]}_minus_{PAIR[1]}"] = paired[group][k]
        one = entry["k"]["1"]
        gap = one["ceiling_from_sentences"] - one["predictors"]["markov2"]["accuracy"]
        entry["needs_memory"] = None if group == ALL else gap >= MEMORY_GAP
        result["scenes"][group] = entry
    result["targets"] = targets(result)
    return result


def read_points(points: Sequence[Point], contexts: dict[str, Sequence[str]]) -> list[Point]:
    """The points with what a forecaster reads in place of their observed sentences: the first as many sentences of
    their episode's ``contexts`` (a UsageError names an episode without one, or with too few)."""
    read = []
    for p in points:
        context = contexts.get(p.record["id"])
        if context is None or len(context) < len(p.observed):
            raise UsageError(f"episode {p.record['id']}: no context of {len(p.observed)} sentences to read")
        read.append(Point(p.record, list(context[: len(p.observed)]), p.future))
    return read


def targets(result: dict) -> dict:
    """For every forecaster, averaged over the scenes (not "all") and k: its accuracy as a fraction of the
    from-sentences ceiling, and its log-loss minus the from-sentences entropy (nats a sentence)."""
    cells = [cell for group, e in result["scenes"].items() if group != ALL for cell in e["k"].values()]
    out = {}
    for name in cells[0]["predictors"]:
        ratios = [value(c["predictors"][name]["accuracy"]) / c["ceiling_from_sentences"] for c in cells]
        losses = [value(c["predictors"][name]["log_loss"]) for c in cells]
        excess = [loss - c["entropy_from_sentences"] for loss, c in zip(losses, cells)] if None not in losses else None
        out[name] = {
            "fraction_of_ceiling": sum(ratios) / len(ratios),
            "log_loss_minus_entropy": sum(excess) / len(excess) if excess else None,
        }
    return out


@dataclass
class WorldReportSettings:
    """Which world is measured, and where the report goes."""

    data: Path = field(metadata={"help": "folder with train/ and heldout/ (from world_model.data.synthetic.generator)"})
    out: Path = field(metadata={"help": "output folder (results.json, results.md, accuracy.png)"})
    episodes: int | None = field(default=None, metadata={"help": "use the first N held-out episodes (default all)"})
    steps: int = field(default=5, metadata={"help": "seconds ahead (default 5)"})
    four_tensor: tuple[str, ...] = field(
        default=(), metadata={"help": "4-tensor predictor folders, one per training seed (paired with the baseline's)"}
    )
    flat_baseline: tuple[str, ...] = field(
        default=(), metadata={"help": "flat baseline predictor folders, one per training seed"}
    )
    cache: Path | None = field(
        default=None, metadata={"help": "keep each predictor's forecasts here, so that a rerun reuses them"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if self.episodes is not None and self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {self.episodes}")


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        WorldReportSettings,
        "world_model.evaluation.world_report",
        __doc__.split("\n\n")[0],
        report_command,
        argv,
    )


def report_command(settings: WorldReportSettings, command: str) -> None:
    """The command's work: check the output, measure, write the three files, print the summary table."""
    out = settings.out
    empty_folder = out.is_dir() and not any(out.iterdir())  # nothing in it to lose
    inputs = {"data folder": settings.data, "cache": settings.cache}
    predictor_folders = (*settings.four_tensor, *settings.flat_baseline)
    inputs.update({f"predictor folder {i + 1}": folder for i, folder in enumerate(predictor_folders)})
    check_output(out, "--out", inputs, settings.overwrite or empty_folder)
    predictors = {"four_tensor": settings.four_tensor, "flat_baseline": settings.flat_baseline}
    for folder in (*settings.four_tensor, *settings.flat_baseline):
        if not Path(folder).is_dir():
            raise UsageError(f"predictor folder {folder} not found")
    from world_model.models.decoding import load_confidence_temperature

    temperatures = {name: [load_confidence_temperature(f) for f in folders] for name, folders in predictors.items()}
    result = world_report(settings.data, settings.steps, settings.episodes, predictors, cache=settings.cache)
    record = {
        "command": command,
        "settings": {
            "data": repo_path(settings.data),
            "steps": settings.steps,
            "episodes": settings.episodes,
            **{name: [repo_path(f) for f in folders] for name, folders in predictors.items()},
            "temperatures": {name: taus for name, taus in temperatures.items() if taus},
        },
        **result,
    }
    with atomic_dir(out) as staging:
        (staging / "results.json").write_text(json.dumps(record, indent=2) + "\n")
        (staging / "results.md").write_text(markdown(record, command))
        plot(record, staging / "accuracy.png")
    lines = markdown(record, command).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| scene |"))
    print("\n".join(lines[start : start + 2 + len(record["scenes"])]))
    print(f"wrote {out}/results.json, results.md, accuracy.png")


if __name__ == "__main__":
    raise SystemExit(main())

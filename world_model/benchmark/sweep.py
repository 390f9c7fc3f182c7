"""Choose a benchmark preset's learning rate on held-out training stories, never on the validation split.

    python -m world_model.benchmark.sweep --preset cpu --data DIR --out DIR [--lrs 1e-3,2e-3,4e-3] [--pair h4_l2]
        [--holdout 2000] [--train-subset 8000] [--max-epochs 4] [--seed 0] [--resume]

For every learning rate and both model types of the pair, one run with the preset's other settings, validated on
the last `--holdout` training stories (`training.holdout_stories`) and trained on the first `--train-subset` of
the others; the warm-up + cosine schedule spans the run (schedule_epochs = max_epochs). The chosen rate is the one
with the lowest mean, over the two models, of the held-out L_S(4) at each run's selected epoch: one rate for both
models, as the benchmark needs. The count floors (world_model/evaluation/floors/), fitted on the runs' training
stories and measured on the same held-out tokens, are reported beside them. OUT gets runs/<model>_lr<rate>/
(training runs; `--resume` skips finished ones and continues interrupted ones), results.json and results.md.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from world_model.benchmark.preset import MODELS, BenchmarkError, load_preset, run_config
from world_model.evaluation.floors import FLOORS, floor_report
from world_model.training import train as train_mod
from world_model.training.batches import load_training_windows
from world_model.training.checkpoints import SUMMARY_FILE
from world_model.training.config import validate_config
from world_model.utils.cli import check_output
from world_model.utils.files import write_json_atomic, write_text_atomic
from world_model.utils.flags import settings_main


def sweep_config(spec: dict, pair: str, model_type: str, lr: float, holdout: int, max_epochs: int, seed: int) -> dict:
    """The preset's run config of `model_type` with learning rate `lr`, validated on the `holdout` held-out training
    stories, its schedule spanning `max_epochs`."""
    config = run_config(spec, pair, model_type, max_epochs=max_epochs, seed=seed)
    config["training"].update(lr=lr, holdout_stories=holdout, schedule_epochs=max_epochs)
    return validate_config(config, source=f"sweep of preset {spec['name']}, {model_type}, lr {lr:g}")


@dataclass
class SweepSettings:
    """A learning-rate sweep: the preset, the data and output folders, the rates and the runs' shared settings."""

    preset: str = field(metadata={"help": "benchmark preset name or YAML path (its other settings)"})
    data: Path = field(metadata={"help": "ROCStories folder"})
    out: Path = field(metadata={"help": "output folder"})
    lrs: str = field(
        default="1e-3,2e-3,4e-3", metadata={"help": "comma-separated learning rates (default 1e-3,2e-3,4e-3)"}
    )
    pair: str = field(default="h4_l2", metadata={"help": "the preset's pair (default h4_l2)"})
    holdout: int = field(default=2000, metadata={"help": "training stories held out for validation"})
    train_subset: int | None = field(default=8000, metadata={"help": "train on the first K of the others"})
    max_epochs: int = field(default=4, metadata={"help": "epochs per run (the schedule spans them)"})
    seed: int = 0
    resume: bool = field(default=False, metadata={"help": "skip finished runs, continue interrupted ones"})
    progress: bool = field(default=True, metadata={"help": "progress bars (--no-progress: none)"})

    def lr_list(self) -> list[float]:
        """The learning rates of --lrs; a BenchmarkError unless they are positive numbers."""
        try:
            lrs = [float(x) for x in self.lrs.split(",") if x.strip()]
        except ValueError:
            raise BenchmarkError(f"--lrs must be comma-separated numbers, got {self.lrs!r}") from None
        if not lrs or any(lr <= 0 for lr in lrs):
            raise BenchmarkError(f"--lrs must be positive learning rates, got {lrs}")
        return lrs


def run_sweep(settings: SweepSettings, command: str | None = None) -> dict:
    """Train every (learning rate, model) run, then write and return results.json's dict (`command`: the command
    line it records)."""
    preset, data_dir, pair, holdout = settings.preset, settings.data, settings.pair, settings.holdout
    train_subset, max_epochs, seed, resume = settings.train_subset, settings.max_epochs, settings.seed, settings.resume
    lrs = settings.lr_list()
    spec = load_preset(preset)
    if pair not in spec["pairs"]:
        raise BenchmarkError(f"unknown pair {pair!r} for preset {spec['name']!r}; known: {sorted(spec['pairs'])}")
    out = Path(settings.out)
    check_output(out, "--out", {"data folder": data_dir}, overwrite=True)  # its runs/ refuse a rerun unless --resume
    rows = []
    for lr in lrs:
        for model_type in MODELS:
            config = sweep_config(spec, pair, model_type, lr, holdout, max_epochs, seed)
            folder = out / "runs" / f"{model_type}_lr{lr:g}"
            if not (resume and (folder / SUMMARY_FILE).is_file()):
                train_mod.train(
                    config, data_dir, folder, resume=resume, train_subset=train_subset, progress=settings.progress
                )
            summary = json.loads((folder / SUMMARY_FILE).read_text())
            rows.append(
                {
                    "lr": lr,
                    "model_type": model_type,
                    "heldout_last_ce": summary["best_metrics"]["val_last_ce"],
                    "best_epoch": summary["best_epoch"],
                    "last_epoch": summary["last_epoch"],
                    "stop_reason": summary["stop_reason"],
                }
            )
    means = {lr: sum(r["heldout_last_ce"] for r in rows if r["lr"] == lr) / len(MODELS) for lr in lrs}
    model = config["model"]
    vocab, _, train_windows, heldout_windows = load_training_windows(
        data_dir, model["n_states"], model["n_tokens"], train_subset, holdout
    )
    _, floors = floor_report(train_windows, heldout_windows, len(vocab))
    results = {
        "command": command,
        "preset": spec["name"],
        "pair": pair,
        "holdout_stories": holdout,
        "train_subset": train_subset,
        "max_epochs": max_epochs,
        "seed": seed,
        "runs": rows,
        "mean_heldout_last_ce": {f"{lr:g}": means[lr] for lr in lrs},
        "chosen_lr": min(lrs, key=means.__getitem__),
        "floors": {"train_windows": floors["train_windows"], **{name: floors[name] for name in FLOORS}},
    }
    write_json_atomic(out / "results.json", results)
    write_text_atomic(out / "results.md", markdown(results))
    return results


def markdown(results: dict) -> str:
    """results.json as a table: held-out L_S(4) per learning rate and model, their mean, the chosen rate."""
    lines = [
        f"# Learning-rate sweep of preset {results['preset']} ({results['pair']}), on held-out training stories",
        "",
        "```",
        str(results["command"]),
        "```",
        "",
        f"Validated on the last {results['holdout_stories']} training stories (never the cloze validation split), "
        f"trained on {results['train_subset'] or 'all'} of the others for at most {results['max_epochs']} epochs "
        f"(seed {results['seed']}). L_S(4) at each run's selected epoch.",
        "",
        "| lr | " + " | ".join(MODELS) + " | mean |",
        "|---:|" + "---:|" * (len(MODELS) + 1),
    ]
    for lr, mean in results["mean_heldout_last_ce"].items():
        cells = [
            f"{r['heldout_last_ce']:.4f} (ep {r['best_epoch']}/{r['last_epoch']})"
            for m in MODELS
            for r in results["runs"]
            if f"{r['lr']:g}" == lr and r["model_type"] == m
        ]
        chosen = float(lr) == results["chosen_lr"]
        lines.append(f"| {lr} | " + " | ".join(cells) + (f" | **{mean:.4f}** |" if chosen else f" | {mean:.4f} |"))
    floors = results["floors"]
    lines += [
        "",
        f"Count floors on the same held-out tokens (fitted on the runs' {floors['train_windows']} training stories, "
        "settings chosen on a held-out slice of them): "
        + ", ".join(f"{name} {floors[name]['val_last_ce']:.4f}" for name in FLOORS)
        + ".",
    ]
    return "\n".join(lines + ["", f"Chosen: lr {results['chosen_lr']:g} for both models." + edge_note(results), ""])


def edge_note(results: dict) -> str:
    """A warning when the chosen rate is the grid's largest or smallest: the best rate may lie beyond the grid."""
    lrs = sorted(float(lr) for lr in results["mean_heldout_last_ce"])
    chosen = results["chosen_lr"]
    if len(lrs) < 2 or lrs[0] < chosen < lrs[-1]:
        return ""
    side = "largest" if chosen == lrs[-1] else "smallest"
    return f" It is the grid's {side} rate, so the best one may lie beyond the grid: widen --lrs to check."


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        SweepSettings,
        "world_model.benchmark.sweep",
        __doc__.split("\n\n")[0],
        lambda settings, command: print(markdown(run_sweep(settings, command))),
        argv,
        on_interrupt="continue with the same command and --resume",
    )


if __name__ == "__main__":
    sys.exit(main())

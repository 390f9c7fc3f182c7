"""A predictor fitted with `pipeline.fit` beside the shipped pack predictor, on the same held-out clips' captions.

    python probes/fit/pack_comparison.py FIT_DIR --out results/fit/world300 [--pack-predictor offline_pack/predictor]

Both are scored by `pipeline.fit_report.fit_report` on the held-out clips of FIT_DIR (the same prediction points,
captions as context and as truth), with copy-last and Markov-1/-2 floors counted on its training clips; writes
results.json and results.md (with FIT_DIR's fit.json command and the fit's wall time when `FIT_DIR/time.txt`
holds `/usr/bin/time -v` output).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from pipeline.fit_report import FLOORS, fit_report
from world_model.data.synthetic.episodes import read_episodes
from world_model.utils.files import repo_path, write_json_atomic, write_text_atomic

NAMES = {"fitted": "fitted (pipeline.fit)", "shipped": "shipped pack predictor"}


def wall_time(path: Path) -> str | None:
    """The elapsed wall-clock time `/usr/bin/time -v` printed into `path`, if it did."""
    if not path.is_file():
        return None
    found = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", path.read_text())
    return found.group(1) if found else None


def compare(fit_dir: Path, pack_predictor: Path) -> dict:
    """Both predictors' reports on FIT_DIR's held-out clips, with the fit's record."""
    record = json.loads((fit_dir / "fit.json").read_text())
    steps = max(int(k) for k in record["report"]["k"])
    splits = {split: read_episodes(fit_dir / "data" / split) for split in ("train", "heldout")}
    reports = {
        "fitted": fit_report(fit_dir, splits["train"], splits["heldout"], steps),
        "shipped": fit_report(pack_predictor, splits["train"], splits["heldout"], steps),
    }
    return {
        "fit_command": record["command"],
        "fit_wall_time": wall_time(fit_dir / "time.txt"),
        "clips": {split: len(names) for split, names in record["splits"].items()},
        "states": record["states"],
        "training": record["training"],
        "pack_predictor": repo_path(pack_predictor),
        "points": reports["fitted"]["points"],
        "k": {
            k: {
                **{name: reports[name]["k"][k]["four_tensor"] for name in NAMES},
                **{floor: reports["fitted"]["k"][k][floor] for floor in FLOORS},
            }
            for k in reports["fitted"]["k"]
        },
    }


def markdown(result: dict, command: str) -> str:
    lines = [
        "# A predictor fitted to captioned clips, beside the shipped pack predictor",
        "",
        f"Made by `{command}` after `{result['fit_command']}`"
        + (f" (wall time {result['fit_wall_time']})." if result["fit_wall_time"] else "."),
        "",
        f"Clips: {result['clips']['train']} training, {result['clips']['heldout']} held out "
        f"({result['states']['train']} and {result['states']['heldout']} states); {result['points']} held-out "
        f"prediction points. Training: best epoch {result['training']['best_epoch']} of "
        f"{result['training']['last_epoch']} ({result['training']['stop_reason']}).",
        "",
        "Exact-sentence accuracy k states ahead on the held-out clips' captions (95% interval over clips), log-loss "
        "in nats:",
        "",
        "| k | " + " | ".join([*NAMES.values(), *FLOORS]) + " |",
        "|---:|" + "---|" * (len(NAMES) + len(FLOORS)),
    ]
    for k, row in result["k"].items():
        cells = [
            f"{s['accuracy']:.3f} [{s['accuracy_ci95'][0]:.3f}, {s['accuracy_ci95'][1]:.3f}]"
            + ("" if s["log_loss"] is None else f", {s['log_loss']:.2f}")
            for s in (row[name] for name in [*NAMES, *FLOORS])
        ]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fit_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pack-predictor", type=Path, default=Path("offline_pack/predictor"))
    args = parser.parse_args(argv)
    command = "python probes/fit/pack_comparison.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"command": command, **compare(args.fit_dir, args.pack_predictor)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "results.json", result)
    write_text_atomic(args.out / "results.md", markdown(result, command))
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())

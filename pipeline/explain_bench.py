"""What the explanations cost: the rollout's predict stage with and without them, on CPU.

    python -m pipeline.explain_bench [--steps 5] [--repeats 30] [--out results/explanations]

Times `pipeline.rollout.predict` (the predict stage of `run_rollout`: the readout's rollout and the records it
returns) on fixed observed sentences, for each predictor and readout the pipeline ships: the offline pack's
predictor with its known sentences and per slot, and the ROCStories predictor with its sentence bank. Runs with
explanations on and off come in pairs, back to back in a random order (so that load on a shared machine falls on
both alike); the median time of `repeats` runs each is reported, and the overhead is the median over pairs of
on / off - 1. Times are the process's CPU time
(`time.process_time`), which the other processes of a shared machine do not inflate as they do wall time; run it
with one thread (OMP_NUM_THREADS=1). Writes overhead.json and overhead.md.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from pipeline.components import load_predictor, load_readout
from pipeline.presets import PROJECT_ROOT
from pipeline.rollout import predict
from world_model.generation.predict import check_horizon
from world_model.models.generation_config import GenerationConfig
from world_model.text.windows import caption_states, caption_window
from world_model.utils.cli import check_output, check_range
from world_model.utils.files import write_json_atomic, write_text_atomic
from world_model.utils.flags import settings_main

OFFLINE = PROJECT_ROOT / "offline_pack" / "predictor"
ROCSTORIES = PROJECT_ROOT / "world_model" / "pretrained" / "rocstories-cpu"
CASES = (  # (name, predictor folder, readout, observed sentences)
    (
        "offline pack, known sentences",
        OFFLINE,
        "sentences",
        [
            "the elevator opens its doors on floor one with a person inside.",
            "the elevator closes its doors on floor one.",
        ],
    ),
    ("offline pack, per-slot tokens", OFFLINE, "tokens", ["the large red ball falls toward the floor."]),
    ("ROCStories, sentence bank", ROCSTORIES, "bank", ["Tom was hungry.", "He went to the kitchen."]),
)


def time_predict(folder: Path, readout_kind: str, sentences: list[str], steps: int, repeats: int) -> dict:
    """CPU seconds of `predict` with explanations off and on: `repeats` pairs of runs, the two of a pair back to back
    in a random order, after one warm-up pair. The overhead is the median over pairs of on / off - 1, so that load
    that changes over the minutes of a run falls on both halves of a pair alike."""
    predictor = load_predictor(str(folder), "cpu")
    readout = load_readout(str(folder), "cpu", readout_kind)
    c = predictor.model.config
    states = caption_states(sentences)
    window = caption_window([s.caption for s in states], predictor.vocab, c.n_states, c.n_tokens)
    settings = {flag: replace(GenerationConfig(), explanations=flag) for flag in (False, True)}
    order = random.Random(0)
    pairs = []
    with torch.no_grad():
        for k in range(repeats + 1):
            seconds = {}
            for flag in order.sample([False, True], 2):
                start = time.process_time()
                predict(predictor, readout, window, states, steps, settings[flag], "cpu")
                seconds[flag] = time.process_time() - start
            if k:  # the first pair warms caches up
                pairs.append((seconds[False], seconds[True]))
    off, on = zip(*pairs)
    return {
        "readout": readout.name,
        "off_s": statistics.median(off),
        "on_s": statistics.median(on),
        "overhead": statistics.median(b / a for a, b in pairs) - 1,
        "min_off_s": min(off),
        "min_on_s": min(on),
    }


def markdown(results: dict) -> str:
    lines = [
        "# What the explanations cost",
        "",
        f"Command: `{results['command']}` ({results['threads']} torch thread(s), CPU).",
        "",
        f"Median CPU time of the rollout's predict stage (`pipeline.rollout.predict`, {results['steps']} steps, "
        f"{results['repeats']} pairs of runs) without and with the explanations of `world_model.generation.explain`.",
        "",
        "| predictor, readout | without (ms) | with (ms) | overhead (median of pairs) | least without / with (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {name} | {r['off_s'] * 1e3:.2f} | {r['on_s'] * 1e3:.2f} | {r['overhead']:+.1%} | "
        f"{r['min_off_s'] * 1e3:.2f} / {r['min_on_s'] * 1e3:.2f} |"
        for name, r in results["cases"].items()
    ]
    return "\n".join(lines) + "\n"


@dataclass
class OverheadSettings:
    """How long the timed rollouts are, how many are timed, and where the report goes."""

    steps: int = field(default=5, metadata={"help": "predicted steps per rollout (default 5)"})
    repeats: int = field(default=30, metadata={"help": "timed runs with and without (default 30)"})
    out: Path | None = field(default=None, metadata={"help": "folder for overhead.json and overhead.md"})

    def __post_init__(self) -> None:
        check_horizon(self.steps)
        check_range("--repeats", self.repeats, 1)


def main(argv: list[str] | None = None) -> int:
    return settings_main(OverheadSettings, "pipeline.explain_bench", __doc__.split("\n\n")[0], overhead_command, argv)


def overhead_command(settings: OverheadSettings, command: str) -> None:
    """The command's work: time every installed case with and without explanations, print (and write) the report."""
    if settings.out:  # a report folder: its two files are replaced
        inputs = {f"{name} predictor": folder for name, folder, _, _ in CASES}
        check_output(settings.out, "--out", inputs, overwrite=True)
    cases = {}
    for name, folder, kind, sentences in CASES:
        if not (folder / "config.json").is_file():
            print(f"skipped {name}: {folder} is not in this installation", file=sys.stderr)
            continue
        cases[name] = time_predict(folder, kind, sentences, settings.steps, settings.repeats)
    results = {
        "command": command,
        "threads": torch.get_num_threads(),
        "steps": settings.steps,
        "repeats": settings.repeats,
        "cases": cases,
    }
    report = markdown(results)
    print(report, end="")
    if settings.out:
        write_json_atomic(settings.out / "overhead.json", results)
        write_text_atomic(settings.out / "overhead.md", report)


if __name__ == "__main__":
    sys.exit(main())

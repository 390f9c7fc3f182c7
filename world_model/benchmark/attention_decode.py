"""Decode time per token at batch 1 of a benchmark's baseline attention rows (the decode latency of the Tucker
paper's Table 3, for this task).

    python -m world_model.benchmark.attention_decode --out OUT [--rounds 20] [--steps S] [--threads 1]

OUT is a benchmark folder with attention rows (results.json["attention"], world_model/benchmark/attention.py).
Every baseline row's model is built from its first run's selected checkpoint OUT/<run_dir>/best/ when present, else
from the run's config with random weights (said so in the report: a step's time does not depend on the weights).
Then, in this one process, round by round, every row once a round in an order that rotates by one each round
(so that no row always runs first, after the same neighbour), each time: a prefill of the longest packed prefix
(1 + T N random content ids after [BOS], the same for every row) and S greedy steps of the cached decoder
(`extend`, the KV cache of world_model/models/kv_cache.py), batch 1, under torch.inference_mode. A row's time per
token is the median over the rounds of its mean step time (one untimed warm-up round first).

Writes OUT/decode_timing.json ({"measured_at", "settings", "rows": [{"pair", "variant", "run_dir", "trained_weights",
"ms_per_token", "ms_per_token_quartiles", "ms_per_round"}]}), then rewrites results.json (as "decode_timing") and
results.md; later benchmark reports read the file back.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from world_model.benchmark.report import write_reports
from world_model.benchmark.runs import DECODE_TIMING_JSON, RESULTS_JSON
from world_model.models.checkpoint import WEIGHTS_NAME
from world_model.models.registry import build_model, load_model
from world_model.training.checkpoints import BEST_DIR
from world_model.utils.cli import UsageError, check_output
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main


@dataclass
class DecodeSettings:
    """Which benchmark folder, and how long to time each row."""

    out: Path = field(metadata={"help": "benchmark folder with attention rows (its results.json)"})
    rounds: int = field(default=20, metadata={"help": "timed rounds (every row once a round)"})
    steps: int | None = field(
        default=None, metadata={"help": "cached greedy steps a round (default: N + 1, a sentence and its [EOS])"}
    )
    threads: int = field(default=1, metadata={"help": "torch threads (one per run, as the benchmark trains)"})


def decode_models(results: dict, out: Path) -> list[tuple[dict, nn.Module]]:
    """(timing row, model in eval mode) of every baseline attention row: its first run's best/ checkpoint, else its
    config with random weights (seeded 0)."""
    records = {r["run_dir"]: r for r in results["runs"] + results.get("variants", [])}
    built = []
    for row in results["attention"]:
        if row["model_type"] != "baseline":
            continue
        best = out / row["run_dir"] / BEST_DIR
        trained = (best / WEIGHTS_NAME).is_file()
        if trained:
            model = load_model(best)
        else:
            record = records[row["run_dir"]]
            torch.manual_seed(0)
            model = build_model(record["config"]["model"], record["vocab_size"])
        entry = {"pair": row["pair"], "variant": row["variant"], "run_dir": row["run_dir"], "trained_weights": trained}
        built.append((entry, model.eval()))
    if not built:
        raise UsageError(f"{out / RESULTS_JSON} has no baseline attention row to time")
    return built


def step_seconds(model: nn.Module, prefix: torch.Tensor, steps: int, sync) -> float:
    """Mean seconds of one cached greedy step at batch 1 after a prefill of `prefix` (1, Lp)."""
    logits, cache = model.prefill(prefix, torch.tensor([prefix.shape[1]], device=prefix.device))
    token = logits.argmax(dim=-1)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        token = model.extend(cache, token).argmax(dim=-1)
    sync()
    return (time.perf_counter() - start) / steps


def measure(settings: DecodeSettings) -> dict:
    """Time every baseline attention row of settings.out (see the module docstring); the decode_timing.json dict."""
    out = Path(settings.out)
    if settings.rounds < 1 or settings.threads < 1 or (settings.steps is not None and settings.steps < 1):
        raise UsageError("--rounds, --steps and --threads must be >= 1")
    if not (out / RESULTS_JSON).is_file():
        raise UsageError(f"--out {out} holds no {RESULTS_JSON}: run the benchmark first")
    check_output(out / DECODE_TIMING_JSON, "--out", overwrite=True)  # writable before minutes of timing
    results = json.loads((out / RESULTS_JSON).read_text())
    if not results.get("attention"):
        raise UsageError(f"{out / RESULTS_JSON} has no attention rows (a preset with attention variants)")
    torch.set_num_threads(settings.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    models = [(entry, model.to(device)) for entry, model in decode_models(results, out)]
    c = models[0][1].config
    prefix_len = 1 + c.n_states * c.n_tokens
    steps = min(settings.steps or c.n_tokens + 1, c.max_len - prefix_len)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(1, c.content_vocab_size, (1, prefix_len), generator=generator)
    prefix[0, 0] = c.bos_id
    prefix = prefix.to(device)
    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for r in range(settings.rounds + 1):  # round 0 warms up, untimed
            for i in [(r + j) % len(models) for j in range(len(models))]:
                seconds = step_seconds(models[i][1], prefix, steps, sync)
                if r:
                    times[i].append(1000 * seconds)
    rows = []
    for (entry, _), ms in zip(models, times):
        quartiles = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
        rows.append(
            {
                **entry,
                "ms_per_token": statistics.median(ms),
                "ms_per_token_quartiles": [quartiles[0], quartiles[2]],
                "ms_per_round": ms,
            }
        )
    return {
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {
            "rounds": settings.rounds,
            "steps": steps,
            "prefix_tokens": prefix_len,
            "threads": settings.threads,
            "device": str(device),
            "torch": torch.__version__,
        },
        "rows": rows,
    }


def decode_command(settings: DecodeSettings, command: str) -> dict:
    """Measure, write OUT/decode_timing.json and rewrite results.json and results.md with it."""
    out = Path(settings.out)
    threads = torch.get_num_threads()
    try:
        timing = {**measure(settings), "command": command}
    finally:
        torch.set_num_threads(threads)  # measure sets its own count; the caller's process keeps its own
    write_json_atomic(out / DECODE_TIMING_JSON, timing)
    results = json.loads((out / RESULTS_JSON).read_text())
    results["decode_timing"] = timing
    write_reports(results, out)
    for row in timing["rows"]:
        print(
            f"  {row['pair']} baseline {row['variant']}: {row['ms_per_token']:.3f} ms/token"
            + ("" if row["trained_weights"] else " (random weights: no best/ checkpoint)")
        )
    return timing


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        DecodeSettings, "world_model.benchmark.attention_decode", __doc__.split("\n\n")[0], decode_command, argv
    )


if __name__ == "__main__":
    sys.exit(main())

"""Speed benchmark of the 4-tensor predictor: training windows/s in fp32 and bf16, achieved GFLOP/s against
this machine's measured matmul peak, peak memory, and the rollout step.

    python -m world_model.benchmark.speed [--config configs/world_model/cpu.yaml] [--vocab-size 23256]
                                      [--data DIR] [--steps 20] [--rounds 3] [--json OUT]

With --data the vocabulary size and the windows come from the ROCStories folder; otherwise random
windows with the corpus's padding fraction (0.40) are used. fp32 and bf16 are timed in alternating rounds
of `--steps` steps (so a change in the machine's load hits both alike) and the median round is reported.
The FLOPs of a step are counted once with torch's FlopCounterMode (forward and backward, every matrix
product, the chunked readout included); the matmul peak is measured here with 1024 x 1024 products in fp32
and in bf16, and each precision's achieved GFLOP/s is reported as a fraction of the larger of the two (the
most this machine's matrix units do). The CPU's name and the instruction set PyTorch uses are printed: bf16
is fast only where the CPU multiplies bf16 natively (AMX, AVX512-BF16) or on CUDA. This is a benchmark, not a test:
the numbers depend on the machine and its load.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.precision import PRECISIONS, autocast
from world_model.utils.cli import add_verbose, run_command

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "world_model" / "cpu.yaml"


def random_windows(
    count: int, vocab_size: int, n_states: int, n_tokens: int, pad_fraction: float, seed: int = 0
) -> torch.Tensor:
    """(count, T+1, N) ids: each sentence a random length with the given mean padding fraction."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab_size, (count, n_states + 1, n_tokens), generator=g)
    mean_len = n_tokens * (1 - pad_fraction)
    lengths = (mean_len + torch.randn(count, n_states + 1, generator=g) * 3).round().clamp(1, n_tokens)
    ids[torch.arange(n_tokens)[None, None, :] >= lengths[..., None]] = 0
    return ids


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_capability() -> str:
    """The vector instruction set PyTorch's CPU kernels use here (e.g. AVX2, AVX512), and the CPU's name."""
    name = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown CPU",
        )
        if Path("/proc/cpuinfo").is_file()
        else "unknown CPU"
    )
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


def matmul_peak_gflops(size: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """GFLOP/s of the best of `repeats` square (size x size) products in `dtype` on the CPU."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


class Trainer:
    """One model and optimizer, stepping through `windows` in batches, in a given precision."""

    def __init__(self, model: FourTensorModel, windows: torch.Tensor, batch_size: int):
        self.model, self.batches = model.train(), windows.split(batch_size)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        self.position = 0

    def step(self, precision: str) -> None:
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        with autocast(precision, "cpu"):
            loss = self.model.training_step(batch).loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def flops_per_step(self, precision: str) -> int:
        with FlopCounterMode(display=False) as counter:
            self.step(precision)
        return counter.get_total_flops()

    def windows_per_second(self, precision: str, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.step(precision)
        return steps * len(self.batches[0]) / (time.perf_counter() - start)


@torch.no_grad()
def rollout_step_ms(model: FourTensorModel, window: torch.Tensor, precision: str, repeats: int) -> float:
    """Median milliseconds of one rollout step (window (1, T, N) -> next state) at batch 1."""
    model.eval()
    with autocast(precision, "cpu"):
        model.rollout(window, steps=1)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.rollout(window, steps=1)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="model preset (YAML with a model: section)")
    parser.add_argument("--vocab-size", type=int, default=23256, help="vocabulary size when --data is not given")
    parser.add_argument("--data", type=Path, help="ROCStories folder: use its vocabulary and windows")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per round and precision")
    parser.add_argument("--rounds", type=int, default=3, help="alternating fp32 / bf16 rounds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--attention", choices=["fused", "reference"], default="fused")
    parser.add_argument(
        "--peak-size", type=int, default=1024, help="side of the square products that measure the matmul peak"
    )
    parser.add_argument("--rollout-repeats", type=int, default=50, help="timed rollout steps per precision")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    add_verbose(parser)
    args = parser.parse_args(argv)
    for name in ("steps", "rounds", "batch_size", "peak_size", "rollout_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def load_inputs(args: argparse.Namespace) -> tuple[dict, int, torch.Tensor]:
    """(the preset's FourTensorConfig settings, the vocabulary size, the (count, T+1, N) windows to train on)."""
    section = yaml.safe_load(args.config.read_text())["model"]
    settings = {k: v for k, v in section.items() if k in FourTensorConfig.__dataclass_fields__ and k != "vocab_size"}
    if args.data is not None:
        from world_model.data.rocstories import build_vocabulary, encode_windows, load_corpus

        corpus = load_corpus(args.data)
        vocab = build_vocabulary(corpus)
        vocab_size = len(vocab)
        windows = encode_windows(corpus.train[: args.batch_size * args.steps], vocab)
    else:
        vocab_size = args.vocab_size
        windows = random_windows(
            args.batch_size * args.steps, vocab_size, settings.get("n_states", 4), settings.get("n_tokens", 16), 0.40
        )
    return settings, vocab_size, windows


def precision_figures(rounds: dict[str, list[float]], flops: float, peak: dict[str, float]) -> dict:
    """Per precision: windows/s (median round, and every round), achieved GFLOP/s, the matmul peak, and the
    fraction of the larger peak (the most this machine's matrix units do, in either dtype)."""
    best_peak = max(peak.values())
    figures = {}
    for p in PRECISIONS:
        per_second = statistics.median(rounds[p])
        achieved = per_second * flops / 1e9
        figures.update(
            {
                f"train_windows_per_second_{p}": round(per_second, 1),
                f"train_windows_per_second_{p}_rounds": [round(r, 1) for r in rounds[p]],
                f"achieved_gflops_{p}": round(achieved, 1),
                f"matmul_peak_gflops_{p}": round(peak[p], 1),
                f"fraction_of_machine_peak_{p}": round(achieved / best_peak, 3),
            }
        )
    return figures


def measure(model: FourTensorModel, windows: torch.Tensor, vocab_size: int, args: argparse.Namespace) -> dict:
    """Every figure the command prints, in order."""
    trainer = Trainer(model, windows, args.batch_size)
    rss_before = peak_rss_mib()
    flops = trainer.flops_per_step("fp32") / args.batch_size  # the work of a window, the same in either precision
    trainer.step("bf16")  # warm-up of the bf16 kernels
    rounds: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for _ in range(args.rounds):
        for precision in PRECISIONS:
            rounds[precision].append(trainer.windows_per_second(precision, args.steps))
    peak = {p: matmul_peak_gflops(args.peak_size, torch.float32 if p == "fp32" else torch.bfloat16) for p in PRECISIONS}
    figures: dict = {
        "config": str(args.config),
        "vocab_size": vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "cpu": cpu_capability(),
        "attention": args.attention,
        "batch_size": args.batch_size,
        "gflop_per_window": float(f"{flops / 1e9:.4g}"),
    }
    figures.update(precision_figures(rounds, flops, peak))
    figures["bf16_speedup"] = round(
        figures["train_windows_per_second_bf16"] / figures["train_windows_per_second_fp32"], 2
    )
    figures["peak_rss_mib"] = round(peak_rss_mib(), 1)
    figures["peak_rss_growth_during_training_mib"] = round(peak_rss_mib() - rss_before, 1)
    for p in PRECISIONS:
        figures[f"rollout_step_ms_batch1_{p}"] = round(
            rollout_step_ms(model, windows[:1, 1:], p, repeats=args.rollout_repeats), 2
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(lambda: time_model(args), verbose=args.verbose)


def time_model(args: argparse.Namespace) -> None:
    """The command's work: build the model, time it, print (and write) the figures."""
    settings, vocab_size, windows = load_inputs(args)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.utils.deterministic.fill_uninitialized_memory = False  # as in training; restored below
    torch.manual_seed(0)
    model = FourTensorModel(FourTensorConfig(vocab_size=vocab_size, **{**settings, "attention": args.attention}))
    figures = measure(model, windows, vocab_size, args)
    for key, value in figures.items():
        print(f"{key:>42}: {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    torch.utils.deterministic.fill_uninitialized_memory = fill


if __name__ == "__main__":
    sys.exit(main())

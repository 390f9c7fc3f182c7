"""Speed benchmark of the 4-tensor predictor: training windows/s in fp32 and bf16, achieved GFLOP/s against
this machine's measured matmul peak, peak memory, and the rollout step; optionally side by side with another
checkout of the project, and with the profile's top operators.

    python -m world_model.benchmark.speed [--config configs/world_model/cpu.yaml] [--vocab-size 23256]
                                      [--data DIR] [--steps 20] [--rounds 3] [--precisions fp32,bf16]
                                      [--compare REV_OR_DIR] [--profile] [--json OUT]

With --data the vocabulary size and the windows come from the ROCStories folder; otherwise random
windows with the corpus's padding fraction (0.40) are used. Each checkout is timed in a process of its own
(`speed_worker.py`, with that checkout first on its path); the precisions (and, with --compare, the two
checkouts) take turns in alternating rounds of `--steps` steps, so a change in the machine's load hits them
alike, and the median round is reported. --compare REV_OR_DIR times another checkout the same way: a
directory holding the project, or a git revision of this repository, checked out into a temporary worktree
that is removed afterwards; the ratios printed are this checkout over the other (the median of the per-round
ratios for windows/s, the other's rollout milliseconds over this one's for the rollout). Windows per second
of each worker's CPU time are reported beside those of wall time: with one thread (OMP_NUM_THREADS=1) they
are the figure least moved by other processes on a shared machine.

The FLOPs of a step are counted once on this checkout with torch's FlopCounterMode (forward and backward,
every matrix product, in-place ones included, the chunked readout too); the matmul peak is measured here with
1024 x 1024 products in fp32 and in bf16 (once a round, in this process, the best round kept), and each
precision's achieved GFLOP/s is reported as a fraction of its own peak and of the larger of the two (the most
this machine's matrix units do). The CPU's name, the
instruction set PyTorch uses and whether the CPU multiplies bf16 natively (AMX, AVX512-BF16) are printed:
bf16 is fast only there or on CUDA. --profile prints torch.profiler's top operators (self CPU time) of fp32
training steps and of rollout steps of this checkout. This is a benchmark, not a test: the numbers depend on
the machine and its load.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.precision import PRECISIONS
from world_model.utils.cli import UsageError, check_output
from world_model.utils.files import repo_path, write_json_atomic
from world_model.utils.flags import settings_main

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("speed_worker.py")
DEFAULT_CONFIG = ROOT / "configs" / "world_model" / "cpu.yaml"


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


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return set()
    line = next((line for line in info.read_text().splitlines() if line.startswith("flags")), "flags:")
    return set(line.split(":", 1)[1].split())


def cpu_capability() -> str:
    """The CPU's name, the vector instruction set PyTorch's CPU kernels use here (e.g. AVX2, AVX512), and the
    native bf16 matrix instructions the CPU has (AMX, AVX512-BF16), or that it has none."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")
    flags = cpu_flags()
    native = [label for flag, label in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")) if flag in flags]
    bf16 = "native bf16: " + (", ".join(native) if native else "none")
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}, {bf16}"


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


class WorkerProcess:
    """A `speed_worker.py` process timing the checkout at `root` (first on its PYTHONPATH)."""

    def __init__(self, root: Path, inputs: Path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        self.root = root
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(inputs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=root,
        )
        hello = self.request(op="hello")
        self.module, self.parameters = hello["module"], hello["parameters"]
        if not Path(self.module).resolve().is_relative_to(root.resolve()):
            raise RuntimeError(f"the speed worker for {root} imported world_model from {self.module}")

    def request(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the speed worker for {self.root} stopped (exit status {self.process.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
            self.process.wait()


@dataclass
class SpeedSettings:
    """What the speed benchmark times, and how often."""

    config: Path = field(default=DEFAULT_CONFIG, metadata={"help": "model preset (YAML with a model: section)"})
    vocab_size: int = field(default=23256, metadata={"help": "vocabulary size when --data is not given"})
    data: Path | None = field(default=None, metadata={"help": "ROCStories folder: use its vocabulary and windows"})
    steps: int = field(default=20, metadata={"help": "timed training steps per round and precision"})
    rounds: int = field(default=3, metadata={"help": "alternating rounds (precisions, checkouts)"})
    batch_size: int = field(default=32, metadata={"help": "windows per training step"})
    attention: str = field(default="fused", metadata={"choices": ["fused", "reference"], "help": "attention kernel"})
    precisions: str = field(default="fp32,bf16", metadata={"help": "comma-separated subset of fp32,bf16 to time"})
    peak_size: int = field(default=1024, metadata={"help": "side of the square products that measure the matmul peak"})
    rollout_repeats: int = field(default=50, metadata={"help": "timed rollout steps per round and precision"})
    compare: str | None = field(
        default=None, metadata={"metavar": "REV_OR_DIR", "help": "also time this checkout of the project, side by side"}
    )
    profile: bool = field(default=False, metadata={"help": "print the top operators of fp32 training and rollout"})
    profile_steps: int = field(default=5, metadata={"help": "training steps (and 20x rollout steps) profiled"})
    json: Path | None = field(default=None, metadata={"help": "also write the figures to this JSON file"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --json file"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "steps", "rounds", "batch_size", "peak_size", "rollout_repeats", "profile_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if not self.timed_precisions or any(p not in PRECISIONS for p in self.timed_precisions):
            raise ValueError(f"--precisions must name some of {', '.join(PRECISIONS)}, got {self.precisions!r}")
        if not Path(self.config).is_file():
            raise ValueError(f"--config {self.config} is not a file")

    @property
    def timed_precisions(self) -> list[str]:
        """The precisions --precisions names, in its order."""
        return [p.strip() for p in self.precisions.split(",") if p.strip()]


def load_inputs(settings: SpeedSettings) -> dict:
    """What a worker builds its model from: the preset's FourTensorConfig settings, the vocabulary size, the
    (count, T+1, N) windows to train on, the batch size."""
    section = yaml.safe_load(settings.config.read_text())["model"]
    model = {k: v for k, v in section.items() if k in FourTensorConfig.__dataclass_fields__ and k != "vocab_size"}
    model["attention"] = settings.attention
    if settings.data is not None:
        from world_model.data.rocstories import build_vocabulary, encode_windows, load_corpus

        corpus = load_corpus(settings.data)
        vocab = build_vocabulary(corpus)
        vocab_size = len(vocab)
        windows = encode_windows(corpus.train[: settings.batch_size * settings.steps], vocab)
    else:
        vocab_size = settings.vocab_size
        windows = random_windows(
            settings.batch_size * settings.steps,
            vocab_size,
            model.get("n_states", 4),
            model.get("n_tokens", 16),
            0.40,
        )
    return {"settings": model, "vocab_size": vocab_size, "windows": windows, "batch_size": settings.batch_size}


def checkout_to_compare(rev_or_dir: str, stack: contextlib.ExitStack) -> Path:
    """The root of the checkout --compare names: the directory itself, or a temporary git worktree of the
    revision (removed when `stack` closes)."""
    path = Path(rev_or_dir)
    if path.is_dir():
        if not (path / "world_model" / "__init__.py").is_file():
            raise UsageError(f"--compare {rev_or_dir}: the directory holds no world_model package")
        return path.resolve()
    git = ["git", "-C", str(ROOT)]
    found = subprocess.run([*git, "rev-parse", "--verify", "--quiet", f"{rev_or_dir}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        raise UsageError(f"--compare {rev_or_dir}: neither a directory nor a git revision of {ROOT}")
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="speed-compare-"))) / "checkout"
    subprocess.run([*git, "worktree", "add", "--detach", str(folder), rev_or_dir], check=True, capture_output=True)
    stack.callback(subprocess.run, [*git, "worktree", "remove", "--force", str(folder)], capture_output=True)
    return folder


def timed_rounds(workers: dict[str, WorkerProcess], settings: SpeedSettings) -> dict:
    """{checkout: {precision: [per round]}} of windows per wall second ("train"), per CPU second of the worker
    ("train_cpu"), rollout ms of wall and CPU time ("rollout", "rollout_cpu"), the checkouts taking turns (the
    first one alternating), and every precision inside each turn; each worker's peak RSS ("rss"); the matmul peak
    of each precision ("peak", GFLOP/s, the best of one measurement per round)."""
    names = list(workers)
    train = {n: {p: [] for p in settings.timed_precisions} for n in names}
    train_cpu = {n: {p: [] for p in settings.timed_precisions} for n in names}
    rollout = {n: {p: [] for p in settings.timed_precisions} for n in names}
    rollout_cpu = {n: {p: [] for p in settings.timed_precisions} for n in names}
    rss = {n: 0.0 for n in names}
    peak = {p: 0.0 for p in PRECISIONS}
    for r in range(settings.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for precision in settings.timed_precisions:
                answer = workers[name].request(op="train", precision=precision, steps=settings.steps)
                train[name][precision].append(answer["windows_per_second"])
                train_cpu[name][precision].append(answer["windows_per_cpu_second"])
                rss[name] = max(rss[name], answer["peak_rss_mib"])
        for p in PRECISIONS:  # once a round, the best of them: a busy moment of the machine lowers one round's
            peak[p] = max(
                peak[p], matmul_peak_gflops(settings.peak_size, torch.float32 if p == "fp32" else torch.bfloat16)
            )
    for r in range(settings.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for precision in settings.timed_precisions:
                answer = workers[name].request(op="rollout", precision=precision, repeats=settings.rollout_repeats)
                rollout[name][precision].append(answer["ms"])
                rollout_cpu[name][precision].append(answer["cpu_ms"])
    return {
        "train": train,
        "train_cpu": train_cpu,
        "rollout": rollout,
        "rollout_cpu": rollout_cpu,
        "rss": rss,
        "peak": peak,
    }


def precision_figures(rounds: dict[str, list[float]], flops: float, peak: dict[str, float]) -> dict:
    """Per precision: windows/s (median round, and every round), achieved GFLOP/s, the matmul peak, and the
    fraction of its own peak and of the larger peak (the most this machine's matrix units do, in either dtype)."""
    best_peak = max(peak.values())
    figures = {}
    for p, per_round in rounds.items():
        per_second = statistics.median(per_round)
        achieved = per_second * flops / 1e9
        figures.update(
            {
                f"train_windows_per_second_{p}": round(per_second, 1),
                f"train_windows_per_second_{p}_rounds": [round(r, 1) for r in per_round],
                f"achieved_gflops_{p}": round(achieved, 1),
                f"matmul_peak_gflops_{p}": round(peak[p], 1),
                f"fraction_of_own_peak_{p}": round(achieved / peak[p], 3),
                f"fraction_of_machine_peak_{p}": round(achieved / best_peak, 3),
            }
        )
    return figures


def compare_figures(timings: dict, flops: float, peak: dict[str, float], settings: SpeedSettings) -> dict:
    """The other checkout's windows/s, fraction of the matmul peak (at this checkout's FLOPs per window, the same
    function) and rollout ms, and this checkout's ratios to them (> 1: this is faster)."""
    figures: dict = {"compared_with": settings.compare}
    for p in settings.timed_precisions:
        mine, theirs = timings["train"]["this"][p], timings["train"]["other"][p]
        ratios = [a / b for a, b in zip(mine, theirs)]
        figures[f"other_train_windows_per_second_{p}"] = round(statistics.median(theirs), 1)
        figures[f"other_fraction_of_own_peak_{p}"] = round(statistics.median(theirs) * flops / 1e9 / peak[p], 3)
        figures[f"other_train_windows_per_second_{p}_rounds"] = [round(r, 1) for r in theirs]
        figures[f"train_speedup_{p}"] = round(statistics.median(ratios), 3)
        figures[f"train_speedup_{p}_rounds"] = [round(r, 3) for r in ratios]
        cpu_ratios = [a / b for a, b in zip(timings["train_cpu"]["this"][p], timings["train_cpu"]["other"][p])]
        other_per_cpu_second = statistics.median(timings["train_cpu"]["other"][p])
        figures[f"other_train_windows_per_cpu_second_{p}"] = round(other_per_cpu_second, 1)
        figures[f"other_fraction_of_own_peak_per_cpu_second_{p}"] = round(
            other_per_cpu_second * flops / 1e9 / peak[p], 3
        )
        figures[f"train_speedup_cpu_time_{p}"] = round(statistics.median(cpu_ratios), 3)
        figures[f"train_speedup_cpu_time_{p}_rounds"] = [round(r, 3) for r in cpu_ratios]
        mine_ms, theirs_ms = timings["rollout"]["this"][p], timings["rollout"]["other"][p]
        figures[f"other_rollout_step_ms_batch1_{p}"] = round(statistics.median(theirs_ms), 2)
        figures[f"rollout_speedup_{p}"] = round(statistics.median([b / a for a, b in zip(mine_ms, theirs_ms)]), 3)
        mine_cpu, theirs_cpu = timings["rollout_cpu"]["this"][p], timings["rollout_cpu"]["other"][p]
        figures[f"other_rollout_step_cpu_ms_batch1_{p}"] = round(statistics.median(theirs_cpu), 2)
        figures[f"rollout_speedup_cpu_time_{p}"] = round(
            statistics.median([b / a for a, b in zip(mine_cpu, theirs_cpu)]), 3
        )
    return figures


def measure(workers: dict[str, WorkerProcess], inputs: dict, settings: SpeedSettings) -> dict:
    """Every figure the command prints, in order."""
    load_before = os.getloadavg()  # 1, 5 and 15 minute load averages: how busy the machine was
    flops = workers["this"].request(op="flops")["flops_per_step"] / settings.batch_size  # the work of a window
    timings = timed_rounds(workers, settings)
    peak = timings["peak"]
    figures: dict = {
        "config": repo_path(settings.config),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "vocab_size": inputs["vocab_size"],
        "parameters": workers["this"].parameters,
        "threads": torch.get_num_threads(),
        "cpu": cpu_capability(),
        "attention": settings.attention,
        "batch_size": settings.batch_size,
        "gflop_per_window": float(f"{flops / 1e9:.4g}"),
    }
    figures.update(precision_figures(timings["train"]["this"], flops, peak))
    for p in settings.timed_precisions:
        per_cpu_second = statistics.median(timings["train_cpu"]["this"][p])
        figures[f"train_windows_per_cpu_second_{p}"] = round(per_cpu_second, 1)
        # GFLOP per second of the process's CPU time over the peak: the fraction that descheduling does not dilute
        figures[f"fraction_of_own_peak_per_cpu_second_{p}"] = round(per_cpu_second * flops / 1e9 / peak[p], 3)
    if {"fp32", "bf16"} <= set(settings.timed_precisions):
        figures["bf16_speedup"] = round(
            figures["train_windows_per_second_bf16"] / figures["train_windows_per_second_fp32"], 2
        )
    figures["peak_rss_mib"] = round(timings["rss"]["this"], 1)
    for p in settings.timed_precisions:
        figures[f"rollout_step_ms_batch1_{p}"] = round(statistics.median(timings["rollout"]["this"][p]), 2)
        figures[f"rollout_step_cpu_ms_batch1_{p}"] = round(statistics.median(timings["rollout_cpu"]["this"][p]), 2)
    if "other" in workers:
        figures.update(compare_figures(timings, flops, peak, settings))
    return figures


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        SpeedSettings,
        "world_model.benchmark.speed",
        __doc__,
        lambda settings, command: time_checkouts(settings),
        argv,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def time_checkouts(settings: SpeedSettings) -> None:
    """The command's work: time this checkout (and `--compare`'s) in worker processes, print (and write) the
    figures, and the profile's top operators with `--profile`."""
    if settings.json:  # before minutes of timing, not after
        if settings.json.is_dir():
            raise UsageError(f"--json {settings.json} is a folder; give the JSON file's path")
        check_output(settings.json, "--json", {"data folder": settings.data}, settings.overwrite)
    inputs = load_inputs(settings)
    with contextlib.ExitStack() as stack:
        roots = {"this": ROOT}
        if settings.compare:
            roots["other"] = checkout_to_compare(settings.compare, stack)
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="speed-inputs-")))
        torch.save(inputs, folder / "inputs.pt")
        workers = {}
        for name, root in roots.items():
            workers[name] = WorkerProcess(root, folder / "inputs.pt")
            stack.callback(workers[name].close)
        figures = measure(workers, inputs, settings)
        for key, value in figures.items():
            print(f"{key:>42}: {value}")
        if settings.json:
            write_json_atomic(settings.json, figures)
        if settings.profile:
            tables = workers["this"].request(op="profile", steps=settings.profile_steps, rows=15)
            print(f"\nfp32 training, {settings.profile_steps} steps:\n{tables['train']}")
            print(f"rollout at batch 1, {20 * settings.profile_steps} steps:\n{tables['rollout']}")


if __name__ == "__main__":
    sys.exit(main())

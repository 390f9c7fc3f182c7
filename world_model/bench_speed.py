"""Speed benchmark of the 4-tensor predictor: training windows/s, peak memory, rollout-step latency.

    python -m world_model.bench_speed [--config configs/world_model/cpu.yaml] [--vocab-size 23256]
                                      [--data DIR] [--steps 20] [--json OUT]

With --data the vocabulary size and the windows come from the ROCStories folder; otherwise random
windows with the corpus's padding fraction (0.40) are used. Figures are printed and optionally
written as JSON. This is a benchmark, not a test: the numbers depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from world_model.four_tensor import FourTensorConfig, FourTensorModel

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "world_model" / "cpu.yaml"


def random_windows(count: int, vocab_size: int, n_states: int, n_tokens: int, pad_fraction: float, seed: int = 0) -> torch.Tensor:
    """(count, T+1, N) ids: each sentence a random length with the given mean padding fraction."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab_size, (count, n_states + 1, n_tokens), generator=g)
    mean_len = n_tokens * (1 - pad_fraction)
    lengths = (mean_len + torch.randn(count, n_states + 1, generator=g) * 3).round().clamp(1, n_tokens)
    ids[torch.arange(n_tokens)[None, None, :] >= lengths[..., None]] = 0
    return ids


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_training(model: FourTensorModel, windows: torch.Tensor, batch_size: int, steps: int) -> float:
    """Training windows per second over `steps` AdamW steps (after two warm-up steps)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    model.train()
    batches = windows.split(batch_size)

    def step(batch: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        model.training_step(batch).loss.backward()
        optimizer.step()

    for batch in batches[:2]:
        step(batch)
    start = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    return steps * batch_size / (time.perf_counter() - start)


@torch.no_grad()
def bench_rollout_step(model: FourTensorModel, window: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of one rollout step (window (1, T, N) -> next state) at batch 1."""
    model.eval()
    model.rollout(window, steps=1)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.rollout(window, steps=1)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="model preset (YAML with a model: section)")
    parser.add_argument("--vocab-size", type=int, default=23256, help="vocabulary size when --data is not given")
    parser.add_argument("--data", type=Path, help="ROCStories folder: use its vocabulary and windows")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--attention", choices=["fused", "reference"], default="fused")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    section = yaml.safe_load(args.config.read_text())["model"]
    settings = {k: section[k] for k in ("d_x", "d_t", "n_heads", "n_layers", "dropout", "n_tokens", "n_states") if k in section}
    if args.data is not None:
        from world_model.rocstories import build_vocabulary, encode_windows, load_corpus

        corpus = load_corpus(args.data)
        vocab = build_vocabulary(corpus)
        vocab_size = len(vocab)
        windows = encode_windows(corpus.train[: args.batch_size * args.steps], vocab)
    else:
        vocab_size = args.vocab_size
        windows = random_windows(args.batch_size * args.steps, vocab_size, settings.get("n_states", 4), settings.get("n_tokens", 16), 0.40)
    torch.manual_seed(0)
    model = FourTensorModel(FourTensorConfig(vocab_size=vocab_size, attention=args.attention, **settings))
    rss_before = peak_rss_mib()
    per_second = bench_training(model, windows, args.batch_size, args.steps)
    figures = {
        "config": str(args.config),
        "vocab_size": vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "attention": args.attention,
        "train_windows_per_second": round(per_second, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "peak_rss_growth_during_training_mib": round(peak_rss_mib() - rss_before, 1),
        "rollout_step_ms_batch1": round(bench_rollout_step(model, windows[:1, 1:], repeats=50), 2),
    }
    for key, value in figures.items():
        print(f"{key:>38}: {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

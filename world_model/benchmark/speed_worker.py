"""The timing half of `world_model.benchmark.speed`: one checkout's 4-tensor model, trained and rolled out on
request, in a process of its own.

    python world_model/benchmark/speed_worker.py INPUTS.pt      (started by speed.py, with the checkout under
                                                                  test first on PYTHONPATH)

INPUTS.pt (torch.save of a dict) holds the model settings, the vocabulary size, the training windows
(S, T+1, N), the batch size and the attention kernel. The worker builds the model with seed 0, then answers
one JSON request per stdin line with one JSON line on stdout:

    {"op": "hello"}                                 -> {"module": world_model.__file__, "parameters": count}
    {"op": "train", "precision": p, "steps": n}     -> {"windows_per_second": ..., "windows_per_cpu_second": ...,
                                                        "peak_rss_mib": ...}
    {"op": "rollout", "precision": p, "repeats": n} -> {"ms": ..., "cpu_ms": ...}: median wall and CPU ms of one
                                                        rollout step at batch 1
    {"op": "flops"}                                 -> {"flops_per_step": one fp32 step, counted}
    {"op": "profile", "steps": n, "rows": r}        -> {"train": table, "rollout": table}
    {"op": "quit"}

It imports only `world_model.models` from the checkout under test (the model, its config and the autocast
helper), never `world_model.benchmark`, so this file times any checkout that has those. This is a benchmark
helper, not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import world_model
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.precision import autocast

aten = torch.ops.aten


def in_place_addmm_flops(bias_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of C.addmm_(A, B), C (m, n) += A (m, k) @ B (k, n): 2 m k n, as FlopCounterMode counts addmm."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


# FlopCounterMode counts the out-of-place products (and mm's out= form); the in-place addmm_ does the same work.
IN_PLACE_FLOPS = {aten.addmm_: in_place_addmm_flops}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Trainer:
    """One model and AdamW, stepping through `windows` (S, T+1, N) in batches, in a given precision."""

    def __init__(self, model: FourTensorModel, windows: torch.Tensor, batch_size: int):
        self.model, self.batches = model, windows.split(batch_size)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        self.position = 0

    def step(self, precision: str) -> None:
        self.model.train()
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        with autocast(precision, "cpu"):
            loss = self.model.training_step(batch).loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def flops_per_step(self, precision: str) -> int:
        with FlopCounterMode(display=False, custom_mapping=IN_PLACE_FLOPS) as counter:
            self.step(precision)
        return counter.get_total_flops()

    def windows_per_second(self, precision: str, steps: int) -> tuple[float, float]:
        """Windows per second of wall time and per second of this process's CPU time, over `steps` steps."""
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.step(precision)
        windows = steps * len(self.batches[0])
        return windows / (time.perf_counter() - wall), windows / (time.process_time() - cpu)


@torch.no_grad()
def rollout_step_ms(model: FourTensorModel, window: torch.Tensor, precision: str, repeats: int) -> tuple[float, float]:
    """Median milliseconds of one rollout step (window (1, T, N) -> next state) at batch 1: of wall time, and of
    this process's CPU time."""
    model.eval()
    with autocast(precision, "cpu"):
        model.rollout(window, steps=1)
        wall, cpu = [], []
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            model.rollout(window, steps=1)
            wall.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - start_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def profile_table(run, rows: int) -> str:
    """torch.profiler's table of the `rows` operators with the most self CPU time while `run()` runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


class Worker:
    """Answers the requests of the module docstring for one model."""

    def __init__(self, inputs: dict):
        torch.utils.deterministic.fill_uninitialized_memory = False  # as in training
        torch.manual_seed(0)
        config = FourTensorConfig(vocab_size=inputs["vocab_size"], **inputs["settings"])
        self.model = FourTensorModel(config)
        self.windows = inputs["windows"]
        self.trainer = Trainer(self.model, self.windows, inputs["batch_size"])
        self.warm: set[str] = set()

    def train(self, precision: str, steps: int) -> dict:
        if precision not in self.warm:  # the first step of a precision pays one-off costs
            self.trainer.step(precision)
            self.warm.add(precision)
        wall, cpu = self.trainer.windows_per_second(precision, steps)
        return {"windows_per_second": wall, "windows_per_cpu_second": cpu, "peak_rss_mib": peak_rss_mib()}

    def rollout(self, precision: str, repeats: int) -> dict:
        wall, cpu = rollout_step_ms(self.model, self.windows[:1, 1:], precision, repeats)
        return {"ms": wall, "cpu_ms": cpu}

    def profile(self, steps: int, rows: int) -> dict:
        self.trainer.step("fp32")
        window = self.windows[:1, 1:]

        def rollout_steps():
            with torch.no_grad():
                for _ in range(20 * steps):
                    self.model.eval().rollout(window, steps=1)

        return {
            "train": profile_table(lambda: [self.trainer.step("fp32") for _ in range(steps)], rows),
            "rollout": profile_table(rollout_steps, rows),
        }

    def answer(self, request: dict) -> dict:
        op = request["op"]
        if op == "hello":
            return {"module": world_model.__file__, "parameters": sum(p.numel() for p in self.model.parameters())}
        if op == "train":
            return self.train(request["precision"], request["steps"])
        if op == "rollout":
            return self.rollout(request["precision"], request["repeats"])
        if op == "flops":
            return {"flops_per_step": self.trainer.flops_per_step("fp32")}
        if op == "profile":
            return self.profile(request["steps"], request["rows"])
        raise ValueError(f"speed_worker: unknown request {op!r}")


def main() -> int:
    worker = Worker(torch.load(sys.argv[1], weights_only=True))
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        print(json.dumps(worker.answer(request)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

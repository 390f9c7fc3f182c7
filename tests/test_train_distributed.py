"""`accelerate launch -m world_model.training.train` with two processes (gloo, on CPU) on a tiny ROCStories fixture.

The launches use `--multi_gpu` with CUDA hidden: accelerate's `--cpu --num_processes N` starts a single
process unless it is given an MPI host file, while `--multi_gpu` starts N processes through
torch.distributed.run, and world_model.training.train, finding no GPU, joins them in a gloo process group on CPU.
Each launch costs the start of three Python processes, so the module launches three times in all: one
uninterrupted run (the shards, the writers, the validation reduction, the comparison with one process at
twice the batch) and a killed run with its resumption.

Every launch goes through a small wrapper of world_model.training.train.main that records, per process, the window
indices of every batch it fetched and every call of the functions that write the output folder, and that sleeps
after every optimizer step when STEP_DELAY is set (so that a run can be interrupted mid-epoch).
"""

import contextlib
import copy
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from tests.test_train import TEST_NAME, TRAIN_NAME, VAL_NAME, write_csv
from world_model.data.rocstories import CLOZE_COLUMNS, TRAIN_COLUMNS
from world_model.evaluation.evaluate import evaluation_sums, metrics_from_sums
from world_model.models.registry import load_model
from world_model.training.batches import EpochOrderSampler, ProcessBatches, load_training_windows
from world_model.training.checkpoints import TIMING_KEYS
from world_model.training.train import train

REPO = Path(__file__).resolve().parents[1]
PROCESSES = 2
N_TRAIN, N_CLOZE = (
    41,
    7,
)  # 41 = 5 x (2 x 4) + 1: the last step leaves process 1 an empty share; 7 validation windows split 4 / 3
B = 4
CONFIG = {  # no dropout: the comparison with one process at batch 2B needs the same function in every step
    "model": {"type": "four_tensor", "d_x": 4, "d_t": 2, "n_heads": 1, "n_layers": 1, "dropout": 0.0},
    "training": {
        "batch_size": B,
        "eval_batch_size": 1,
        "max_epochs": 3,
        "seed": 5,
        "lr": 0.01,
        "lr_schedule": "warmup_cosine",
        "warmup_steps": 3,
    },
}
STEPS_PER_EPOCH = math.ceil(N_TRAIN / (B * PROCESSES))
WRITERS = {"save_training_state", "write_metrics", "plot_curves", "write_json_atomic", "save_pretrained"}
OUTPUTS = {"run.json", "metrics.jsonl", "curves.png", "best", "last", "summary.json"}

WRAPPER = """
import json, os, sys
from pathlib import Path
import time
from world_model.training import batches, checkpoints, loop
from world_model.training import train as t
from world_model.models.four_tensor import FourTensorModel

log = {"batches": [], "writes": []}
fetch = batches.WindowDataset.__getitems__
step = loop.optimizer_step

def slow_step(*args, **kwargs):
    stats = step(*args, **kwargs)
    time.sleep(float(os.environ["STEP_DELAY"]))
    return stats

def getitems(self, indices):
    log["batches"].append([int(i) for i in indices])
    return fetch(self, indices)

def spy(name, fn):
    def wrapped(*args, **kwargs):
        log["writes"].append(name)
        return fn(*args, **kwargs)
    return wrapped

batches.WindowDataset.__getitems__ = getitems
for name in ("save_training_state", "write_metrics", "plot_curves", "write_json_atomic"):
    setattr(checkpoints, name, spy(name, getattr(checkpoints, name)))
if float(os.environ.get("STEP_DELAY", 0)):  # slow the run down, to interrupt it
    loop.optimizer_step = slow_step
FourTensorModel.save_pretrained = spy("save_pretrained", FourTensorModel.save_pretrained)
code = 1
try:
    code = t.main(sys.argv[1:])
finally:
    Path(os.environ["SPY_DIR"], "rank%s.json" % os.environ["RANK"]).write_text(json.dumps(log))
sys.exit(code)
"""


def make_data(root: Path) -> Path:
    """ROCStories and cloze CSVs whose sentences have 2 to 7 tokens, so that the windows of a batch (and the
    two processes' shares of a step) hold different numbers of target tokens."""
    rng = random.Random(3)
    words = ["tom", "ann", "ran", "sat", "ate", "home", "fast", "cake", "late", "then", "slowly"]

    def sentence():
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 6))).capitalize() + "."

    root.mkdir(parents=True, exist_ok=True)
    write_csv(
        root / TRAIN_NAME, TRAIN_COLUMNS, [[f"t{i}", "T"] + [sentence() for _ in range(5)] for i in range(N_TRAIN)]
    )
    cloze = [[f"c{i}"] + [sentence() for _ in range(6)] + [str(1 + i % 2)] for i in range(N_CLOZE)]
    write_csv(root / VAL_NAME, CLOZE_COLUMNS, cloze[:4])
    write_csv(root / TEST_NAME, CLOZE_COLUMNS, cloze[4:])
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    tmp: Path, data: Path, out: Path, spy: Path, *extra: str, config: dict = CONFIG, step_delay: float = 0.0
) -> subprocess.Popen:
    """`accelerate launch` of two training processes on CPU (in a session of its own, so that it can be ended whole),
    each sleeping `step_delay` seconds after every optimizer step."""
    spy.mkdir(parents=True, exist_ok=True)
    (tmp / "wrapper.py").write_text(WRAPPER)
    (tmp / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "SPY_DIR": str(spy),
        "STEP_DELAY": str(step_delay),
        "HF_HOME": str(tmp / "hf"),
    }  # no accelerate config of the user's
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        "--multi_gpu",
        "--num_processes",
        str(PROCESSES),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(tmp / "wrapper.py"),
        "--config",
        str(tmp / "config.yaml"),
        "--data",
        str(data),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    """The launch's output once it has ended (the timeout only guards against a hang; a run takes seconds)."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        end_launch(proc)
    return output


def end_launch(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of a launch this test started: the launcher and its workers, found while the
    launcher lives (torch.distributed.run starts each worker in a session of its own)."""
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
    proc.kill()
    proc.wait()


def spies(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(PROCESSES)]


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def untimed(history):
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


def tensors(path: Path) -> dict:
    return load_file(path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("rocstories"))


@pytest.fixture(scope="module")
def launched(data_dir, tmp_path_factory):
    """An uninterrupted two-process run at batch B, and, trained in this process while it runs, the same run
    with one process at batch 2B: (two-process out folder, per-process spy records, one-process out folder)."""
    tmp = tmp_path_factory.mktemp("two")
    proc = start(tmp, data_dir, tmp / "run", tmp / "spy")
    try:
        config = copy.deepcopy(CONFIG)
        config["training"]["batch_size"] = PROCESSES * B
        train(config, data_dir, tmp / "one", progress=False)
    finally:
        output = finish(proc)
    assert proc.returncode == 0, output
    assert f"{PROCESSES} process(es) on cpu" in output, output
    return tmp / "run", spies(tmp / "spy"), tmp / "one"


# ----- the sharding, as a pure function -----
@pytest.mark.parametrize(
    "size, batch, processes", [(41, 4, 2), (40, 4, 2), (3, 4, 2), (1, 2, 2), (17, 3, 4), (10, 5, 1)]
)
def test_process_batches_are_disjoint_and_match_one_process_at_the_total_batch(size, batch, processes):
    order = EpochOrderSampler(size, seed=0)
    order.epoch = 3
    shards = [list(ProcessBatches(order, batch, processes, p)) for p in range(processes)]
    single = list(ProcessBatches(order, batch * processes))  # one process x (processes x batch)
    assert all(len(s) == len(single) == math.ceil(size / (batch * processes)) for s in shards)  # no process waits alone
    for step, whole in enumerate(single):
        parts = [s[step] for s in shards]
        assert sum(parts, []) == whole  # the step's windows, in order, each once
        assert max(map(len, parts)) <= batch and max(map(len, parts)) - min(map(len, parts)) <= 1
    assert sorted(sum(single, [])) == list(range(size))
    assert list(ProcessBatches(order, batch)) == [list(order)[i : i + batch] for i in range(0, size, batch)]


# ----- one uninterrupted two-process run -----
@pytest.mark.slow
def test_each_process_trains_on_a_disjoint_shard(launched):
    out, spy, _ = launched
    epochs = CONFIG["training"]["max_epochs"]
    for rank in spy:
        assert len(rank["batches"]) == epochs * STEPS_PER_EPOCH
    for epoch in range(1, epochs + 1):
        steps = slice((epoch - 1) * STEPS_PER_EPOCH, epoch * STEPS_PER_EPOCH)
        shard = [sum(rank["batches"][steps], []) for rank in spy]
        assert not set(shard[0]) & set(shard[1])
        assert sorted(shard[0] + shard[1]) == list(range(N_TRAIN))  # every window once: none dropped, none repeated
        order = EpochOrderSampler(N_TRAIN, CONFIG["training"]["seed"])
        order.epoch = epoch
        assert sum((a + b for a, b in zip(*(rank["batches"][steps] for rank in spy))), []) == list(order)
        assert [len(b) for b in spy[1]["batches"][steps]][-1] == 0  # the lone last window went to process 0
    history = read_metrics(out)
    assert [h["epoch"] for h in history] == list(range(1, epochs + 1))


@pytest.mark.slow
def test_only_the_main_process_writes(launched):
    out, spy, _ = launched
    assert spy[1]["writes"] == []
    assert set(spy[0]["writes"]) == WRITERS
    assert {p.name for p in out.iterdir()} == OUTPUTS  # no stray temporary folders either
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_processes"], summary["last_epoch"], summary["stop_reason"]) == (PROCESSES, 3, "max_epochs")
    assert json.loads((out / "run.json").read_text())["num_processes"] == PROCESSES


@pytest.mark.slow
def test_validation_metrics_are_reduced_over_processes(launched, data_dir):
    """The 7 validation windows are split 4 / 3 between the processes; the reduced metrics equal one process's
    evaluation of the same weights over all of them (batch 1 on both sides, so only the float64 order of
    summation differs)."""
    out, _, _ = launched
    _, _, _, val_windows = load_training_windows(data_dir, 4, 16)
    assert len(val_windows) == N_CLOZE
    last = read_metrics(out)[-1]
    single = metrics_from_sums(evaluation_sums(load_model(out / "last/model"), val_windows, 1, "cpu"))
    for key in ("val_window_loss", "val_last_ce", "val_token_accuracy", "val_perplexity"):
        assert last[key] == pytest.approx(single[key], rel=1e-12, abs=0), key


@pytest.mark.slow
def test_two_processes_at_batch_b_match_one_process_at_batch_2b(launched):
    """Each step of 2 processes x B sees the windows of one step of 1 process x 2B (ProcessBatches), and each
    process weights its mean loss by its share of the step's target tokens, so the averaged gradient is that of
    the 2B-window mean (the shares here differ in tokens, and in the last step in size: 1 window and none).

    They agree to rounding, not bit for bit: the two processes' gradients are summed by the all-reduce instead of
    inside one backward pass, the mean is rescaled, and AdamW divides by sqrt(v) (small where a gradient is small),
    which can magnify a difference in the last bits. After 3 epochs (18 steps, lr 0.01) the weights must agree to
    1e-5 absolute and the losses to 1e-6 relative. Measured here: 2.4e-7 and 3e-8. With the processes' means
    averaged unweighted the weights differ by 0.037 and the losses by up to 5e-3 relative; with accelerate's
    sharding of the DataLoader (a last step padded with windows from the start of the epoch) by 0.043 and 1e-2."""
    out, _, one = launched
    a, b = tensors(out / "last/model/model.safetensors"), tensors(one / "last/model/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=0, atol=1e-5), (key, float((a[key] - b[key]).abs().max()))
    for two_run, one_run in zip(read_metrics(out), read_metrics(one), strict=True):
        for key in ("train_loss", "val_window_loss", "val_last_ce"):
            assert two_run[key] == pytest.approx(one_run[key], rel=1e-6), (two_run["epoch"], key)


# ----- killed and resumed -----
@pytest.mark.slow
def test_a_killed_two_process_run_resumes_to_the_uninterrupted_result(launched, data_dir, tmp_path):
    ref, _, _ = launched
    out = tmp_path / "killed"
    proc = start(tmp_path, data_dir, out, tmp_path / "spy-killed", step_delay=0.2)
    state = out / "last/state.json"
    deadline = time.monotonic() + 600
    try:
        while True:  # SIGTERM to the launcher once epoch 1 is saved: it ends both workers, in epoch 2
            try:
                if json.loads(state.read_text())["epoch"] >= 1:
                    break
            except (OSError, ValueError):
                pass
            assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[0]
            assert time.monotonic() < deadline, "no last/ for epoch 1"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        output = finish(proc)
    finally:
        end_launch(proc)
    assert proc.returncode != 0, output
    saved = json.loads(state.read_text())["epoch"]
    assert saved < CONFIG["training"]["max_epochs"] and not (out / "summary.json").exists()
    # (whether each worker leaves through the trainer's SIGTERM handler or through the error of a collective whose
    # peer has already gone depends on where the signal lands, so the output is not checked)

    proc = start(tmp_path, data_dir, out, tmp_path / "spy-resumed", "--resume")
    output = finish(proc)
    assert proc.returncode == 0, output
    assert "resuming" in output
    for name in ("last/model/model.safetensors", "best/model.safetensors", "last/optimizer.safetensors"):
        a, b = tensors(ref / name), tensors(out / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert untimed(read_metrics(ref)) == untimed(read_metrics(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_epoch"] >= 1 and summary["last_epoch"] == CONFIG["training"]["max_epochs"]
    assert {p.name for p in out.iterdir()} == OUTPUTS

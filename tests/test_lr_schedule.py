import math
from pathlib import Path

import pytest
import yaml

from world_model.training.config import TrainingConfig
from world_model.training.schedule import learning_rate, warmup_cosine


def test_warms_up_linearly_then_decays_on_a_cosine_to_the_final_fraction():
    lr = [warmup_cosine(1e-3, step, progress=0.0, warmup_steps=100) for step in range(0, 200, 50)]
    assert lr == pytest.approx([1e-5, 5.1e-4, 1e-3, 1e-3])
    assert warmup_cosine(1e-3, 500, progress=0.5, warmup_steps=100) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert warmup_cosine(1e-3, 900, progress=1.0, warmup_steps=100, final_fraction=0.2) == pytest.approx(2e-4)
    assert warmup_cosine(1e-3, 999, progress=1.7, warmup_steps=100) == pytest.approx(1e-4)  # over budget: the floor
    decay = [warmup_cosine(1.0, 100, p / 10, warmup_steps=10) for p in range(11)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    assert not math.isnan(warmup_cosine(1.0, 0, 0.0, warmup_steps=0))


CPU_PRESET = Path(__file__).resolve().parents[1] / "configs" / "benchmark" / "cpu.yaml"


def test_the_rate_of_every_step_of_the_cpu_preset():
    """lr x min(1, (k+1) / warm-up) x (floor + (1 - floor) x cosine), the cosine over schedule_epochs x steps per
    epoch from step 0, at the floor afterwards; to 1e-12 relative at every step of max_epochs (those past the
    decay window included). With the constant schedule every step gets lr."""
    training = yaml.safe_load(CPU_PRESET.read_text())["training"]
    config = TrainingConfig.from_dict(training)
    assert (config.lr_schedule, config.warmup_steps, config.schedule_epochs, config.final_lr_fraction) == (
        "warmup_cosine",
        300,
        8,
        0.05,
    )
    steps_per_epoch = math.ceil(20000 / config.batch_size)  # the preset's 20000 training windows
    horizon = config.schedule_epochs * steps_per_epoch
    steps = range(config.max_epochs * steps_per_epoch)
    assert len(steps) > horizon + config.warmup_steps  # the floor is reached and held
    for step in steps:
        cosine = 0.5 * (1 + math.cos(math.pi * min(step / horizon, 1.0)))
        expected = config.lr * min(1.0, (step + 1) / 300) * (0.05 + 0.95 * cosine)
        assert learning_rate(config, step, steps_per_epoch) == pytest.approx(expected, rel=1e-12, abs=0), step
    constant = TrainingConfig.from_dict({**training, "lr_schedule": "constant"})
    assert all(learning_rate(constant, step, steps_per_epoch) == config.lr for step in steps)

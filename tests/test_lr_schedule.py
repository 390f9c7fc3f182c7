import math

import pytest

from world_model.training.schedule import warmup_cosine


def test_warms_up_linearly_then_decays_on_a_cosine_to_the_final_fraction():
    lr = [warmup_cosine(1e-3, step, progress=0.0, warmup_steps=100) for step in range(0, 200, 50)]
    assert lr == pytest.approx([1e-5, 5.1e-4, 1e-3, 1e-3])
    assert warmup_cosine(1e-3, 500, progress=0.5, warmup_steps=100) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert warmup_cosine(1e-3, 900, progress=1.0, warmup_steps=100, final_fraction=0.2) == pytest.approx(2e-4)
    assert warmup_cosine(1e-3, 999, progress=1.7, warmup_steps=100) == pytest.approx(1e-4)  # over budget: the floor
    decay = [warmup_cosine(1.0, 100, p / 10, warmup_steps=10) for p in range(11)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    assert not math.isnan(warmup_cosine(1.0, 0, 0.0, warmup_steps=0))

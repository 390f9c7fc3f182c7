"""Mean ± sd and paired 95% intervals over seeds, against values worked out by hand."""

import math

import pytest

from world_model.evaluation.seed_stats import mean_sd, paired_difference, paired_rows, t_975


def test_mean_and_sample_sd():
    stats = mean_sd([5.0, 6.0, 7.0])
    assert (stats["n"], stats["mean"], stats["sd"]) == (3, 6.0, 1.0)
    assert mean_sd([5.0]) == {"n": 1, "mean": 5.0, "sd": None}
    assert mean_sd([None, float("nan")])["n"] == 0


def test_paired_interval_by_hand():
    first, second = {0: 6.0, 1: 6.2, 2: 6.1, 7: 1.0}, {0: 5.9, 1: 6.0, 2: 6.0}  # seed 7 has no partner
    d = paired_difference(first, second)
    assert d["seeds"] == [0, 1, 2] and d["differences"] == pytest.approx([0.1, 0.2, 0.1])
    mean, sd = 0.4 / 3, math.sqrt(((0.1 - 0.4 / 3) ** 2 * 2 + (0.2 - 0.4 / 3) ** 2) / 2)
    half = 4.303 * sd / math.sqrt(3)  # t(0.975, 2)
    assert d["mean"] == pytest.approx(mean) and d["ci95"] == pytest.approx([mean - half, mean + half])
    assert paired_difference({0: 1.0}, {0: 0.5})["ci95"] is None  # one seed: no interval


def test_t_quantiles():
    assert (t_975(1), t_975(2), t_975(30), t_975(500)) == (12.706, 4.303, 2.042, 1.96)
    with pytest.raises(ValueError):
        t_975(0)


def test_paired_rows_name_the_comparisons():
    runs = [
        {"pair": "p", "model_type": m, "variant": v, "seed": s, "val_last_ce": ce}
        for m, v, s, ce in [("four_tensor", None, 0, 6.0), ("baseline", None, 0, 6.5), ("four_tensor", "copy", 0, 5.5)]
    ]
    rows = {r["comparison"]: r for r in paired_rows(runs)}
    assert rows["baseline - 4-tensor"]["differences"] == [0.5]
    assert rows["four_tensor reference - copy"]["differences"] == [0.5]


def test_versus_pairs_a_variant_with_the_rows_it_names():
    runs = [
        {"pair": "p", "model_type": m, "variant": v, "seed": s, "val_last_ce": ce}
        for m, v, s, ce in [
            ("four_tensor", None, 0, 6.0),
            ("four_tensor", None, 1, 6.2),
            ("baseline", "smooth", 0, 5.9),
            ("baseline", "smooth", 1, 6.4),
            ("four_tensor", "smooth_4t", 0, 5.6),
            ("four_tensor", "smooth_4t", 1, 5.7),
        ]
    ]
    versus = {"smooth_4t": ["smooth", "baseline", "four_tensor"]}  # the baseline has no run: no row for it
    rows = paired_rows(runs, versus)
    assert [r["comparison"] for r in rows] == [
        "four_tensor reference - smooth_4t",  # named twice (its own type), paired once
        "baseline smooth - four_tensor smooth_4t",
    ]
    assert rows[1]["differences"] == pytest.approx([0.3, 0.7]) and (rows[1]["first"], rows[1]["second"]) == (
        "smooth",
        "smooth_4t",
    )
    assert rows[0]["differences"] == pytest.approx([0.4, 0.5])

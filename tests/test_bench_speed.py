"""The speed benchmark runs end to end on a tiny vocabulary: both precisions, --compare against another checkout,
--profile, and a FLOP count that includes in-place products (no timing is asserted)."""

import json

import pytest

from world_model.benchmark import speed as bench_speed


def test_bench_speed_reports_both_precisions_and_the_flop_rate(tmp_path, capsys):
    out = tmp_path / "speed.json"
    config = tmp_path / "tiny.yaml"
    config.write_text("model: {d_x: 4, d_t: 2, n_heads: 1, n_layers: 1}\n")
    assert (
        bench_speed.main(
            [
                "--config",
                str(config),
                "--vocab-size",
                "60",
                "--steps",
                "1",
                "--rounds",
                "1",
                "--batch-size",
                "2",
                "--peak-size",
                "32",
                "--rollout-repeats",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    for p in ("fp32", "bf16"):
        assert (
            figures[f"train_windows_per_second_{p}"] > 0 and len(figures[f"train_windows_per_second_{p}_rounds"]) == 1
        )
        best_peak = max(figures["matmul_peak_gflops_fp32"], figures["matmul_peak_gflops_bf16"])
        # GFLOP/s figures are rounded to within 0.05 and the fraction to 0.0005: they agree within those roundings
        # (multiplied out, not divided: on a loaded machine the 32 x 32 peak can round to 0.0)
        fraction = figures[f"fraction_of_machine_peak_{p}"]
        assert abs(fraction * best_peak - figures[f"achieved_gflops_{p}"]) <= 6e-4 * (best_peak + 0.05) + 0.05 * (
            fraction + 1
        )
        assert figures[f"rollout_step_ms_batch1_{p}"] > 0
    assert figures["gflop_per_window"] > 0 and figures["cpu"]
    assert "train_windows_per_second_bf16" in capsys.readouterr().out


def test_flop_count_includes_in_place_products():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from world_model.benchmark.speed_worker import IN_PLACE_FLOPS

    C, A, B = torch.zeros(3, 5), torch.ones(3, 4), torch.ones(4, 5)
    with FlopCounterMode(display=False, custom_mapping=IN_PLACE_FLOPS) as counter:
        C.addmm_(A, B)
        torch.mm(A, B, out=C)
    assert counter.get_total_flops() == 2 * (2 * 3 * 4 * 5)


@pytest.mark.slow  # three worker processes
def test_compare_times_another_checkout_in_alternating_rounds_and_profiles(tmp_path, capsys):
    out = tmp_path / "speed.json"
    config = tmp_path / "tiny.yaml"
    config.write_text("model: {d_x: 4, d_t: 2, n_heads: 1, n_layers: 1}\n")
    common = ["--config", str(config), "--vocab-size", "60", "--steps", "1", "--batch-size", "2", "--peak-size", "32"]
    common += ["--rollout-repeats", "1", "--precisions", "fp32"]
    assert (
        bench_speed.main(
            [
                *common,
                "--rounds",
                "2",
                "--compare",
                str(bench_speed.ROOT),
                "--profile",
                "--profile-steps",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    assert figures["compared_with"] == str(bench_speed.ROOT)
    assert len(figures["train_speedup_fp32_rounds"]) == len(figures["other_train_windows_per_second_fp32_rounds"]) == 2
    assert figures["train_speedup_fp32"] > 0 and figures["rollout_speedup_fp32"] > 0
    assert "train_windows_per_second_bf16" not in figures
    printed = capsys.readouterr().out
    assert "fp32 training, 1 steps" in printed and "aten::" in printed  # the profile's operator table
    assert bench_speed.main([*common, "--rounds", "1", "--compare", "no-such-revision-or-folder"]) == 2
    assert "neither a directory nor a git revision" in capsys.readouterr().err
    assert bench_speed.main([*common, "--rounds", "1", "--compare", str(tmp_path)]) == 2
    assert "holds no world_model package" in capsys.readouterr().err


def test_an_unwritable_json_is_refused_before_any_timing(tmp_path, capsys, monkeypatch):
    from world_model.benchmark import speed

    monkeypatch.setattr(speed, "load_inputs", lambda settings: pytest.fail("timed before refusing"))
    (tmp_path / "a_file").write_text("")
    assert speed.main(["--json", str(tmp_path / "a_file" / "s.json")]) == 2
    assert "--json" in capsys.readouterr().err
    assert speed.main(["--json", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err

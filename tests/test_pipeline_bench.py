"""`python -m pipeline.bench` on a small clip: every stage timed, shares that add up, memory reported."""

import json

import pytest

from pipeline import bench
from pipeline.presets import load_preset, missing_offline_models
from tests.model_factories import one_torch_thread


@pytest.mark.slow
def test_bench_times_every_stage_and_the_shares_add_up(tmp_path, capsys):
    out = tmp_path / "bench.json"
    with one_torch_thread():
        code = bench.main(["--seconds", "2", "--size", "160x96", "--steps", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(out.read_text())
    assert {
        "preset",
        "predictor",
        "clip",
        "steps",
        "torch_threads",
        "observed_frames",
        "predicted_frames",
        "stages",
        "rollout_s",
        "load_models_s",
        "predictor_share_pct",
        "run_wall_s",
        "memory_mib",
    } <= set(result)
    assert result["preset"] == "tiny" and result["clip"]["width"] == 160 and result["clip"]["height"] == 96
    assert "random CPU-sized 4-tensor model" in result["predictor"] or result["predictor"].startswith(
        "shipped checkpoint"
    )
    assert result["observed_frames"] == 2 and result["predicted_frames"] == 2  # 2 s at 1 s intervals; 2 steps
    assert list(result["stages"]) == list(bench.STAGES)
    frames = {"observed": 2, "predicted": 2, "written": 4}
    for stage, row in result["stages"].items():
        assert set(row) == {"total_s", "per_frame_ms", "per", "share_pct"}
        assert row["total_s"] >= 0 and 0 <= row["share_pct"] <= 100
        unit = row["per"].split()[0]
        assert row["per_frame_ms"] == pytest.approx(1000 * row["total_s"] / frames[unit], abs=1e-3)
        assert stage in printed
    assert sum(r["share_pct"] for r in result["stages"].values()) == pytest.approx(100, abs=0.1)
    assert result["rollout_s"] == pytest.approx(sum(r["total_s"] for r in result["stages"].values()), abs=1e-3)
    assert result["predictor_share_pct"] == result["stages"]["predict"]["share_pct"]
    assert result["run_wall_s"] >= result["rollout_s"]
    memory = result["memory_mib"]
    assert set(memory) == {"peak_rss", "rss_before", "run_peak_rss", "rss_growth", "rss_after"}
    assert memory["peak_rss"] >= memory["run_peak_rss"] >= memory["rss_before"] > 0
    assert memory["rss_growth"] == pytest.approx(memory["run_peak_rss"] - memory["rss_before"], abs=0.2)
    assert f"predictor share of the rollout time: {result['predictor_share_pct']:.1f}%" in printed
    assert "peak RSS" in printed and "load_models" in printed and result["predictor"] in printed


def test_write_shapes_clip_has_the_requested_size_and_length(tmp_path):
    from encoders.frames import probe_video

    info = probe_video(bench.write_shapes_clip(tmp_path / "shapes.mp4", seconds=2, size=(64, 48)))
    assert (info.width, info.height, info.frame_count) == (64, 48, 2 * bench.CLIP_FPS)


def test_offline_preset_without_the_pack_says_it_is_not_built(capsys, offline_pack_absent):
    assert missing_offline_models(load_preset("offline"))
    assert bench.main(["--preset", "offline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the offline model pack is not built yet") and "--preset tiny" in err
    assert "Traceback" not in err

"""The attention rows at convergence (issue 56): the KV cache per token, the verdict on the Tucker paper's claim, the
rows paired over seeds with the floors and flags in the attention report, and the decode timing; on the tiny
ROCStories fixture of tests/test_train.py with toy presets (per-row seeds and reuse: tests/test_benchmark_reuse.py)."""

import json
import math
import shutil

import pytest
import torch

from tests.test_benchmark import TINY_ATTENTION_PRESET, TINY_SHAPE, write_preset
from tests.test_train import make_data
from world_model.benchmark import attention as attn
from world_model.benchmark import attention_decode
from world_model.benchmark import attention_verdict as verdict
from world_model.benchmark import table5 as bench
from world_model.benchmark.preset import MODELS, choose_seeds, load_preset, run_config
from world_model.models.registry import build_model


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("rocstories"))


# ----- the preset -----
def test_the_attention_preset_is_the_cpu_presets_h4_l2_with_the_rows_the_issue_asks_for():
    cpu, spec = load_preset("cpu"), load_preset("attention")
    assert spec["pairs"] == {"h4_l2": cpu["pairs"]["h4_l2"]}
    assert (spec["model"], spec["training"], spec["budget"]) == (cpu["model"], cpu["training"], cpu["budget"])
    seeds = choose_seeds(spec, None)
    for model_type in MODELS:  # the references are the cpu benchmark's runs, seed for seed
        assert seeds[model_type] == cpu["seeds"] == [0, 1, 2]
        for seed in seeds[model_type]:
            assert run_config(spec, "h4_l2", model_type, seed=seed) == run_config(cpu, "h4_l2", model_type, seed=seed)
    assert spec["reuse_runs"] == "results/benchmark/cpu/runs"

    def section(name):
        return run_config(spec, "h4_l2", spec["variants"][name]["type"], variant=name)["model"]

    mha = attn.config_attention_parameters(run_config(spec, "h4_l2", "baseline")["model"], 100)
    dense = attn.config_attention_parameters(run_config(spec, "h4_l2", "four_tensor")["model"], 100)
    ratios: dict[tuple, dict[str, float]] = {}
    for name, v in spec["variants"].items():
        kind = attn.attention_kind(section(name))
        reference = mha if v["type"] == "baseline" else dense
        ratios.setdefault((v["type"], kind), {})[name] = reference / attn.config_attention_parameters(
            section(name), 100
        )
        assert seeds[name] == (v["seeds"] or [0]) and 0 in seeds[name]
    assert sorted(ratios) == [
        ("baseline", "gqa"),
        ("baseline", "mla"),
        ("baseline", "tucker"),
        ("baseline", "tucker_listing"),
        ("four_tensor", "tucker"),
    ]
    assert sorted(section(n)["n_kv_heads"] for n in ratios[("baseline", "gqa")]) == [1, 2]
    assert len({section(n)["mla_kv_rank"] for n in ratios[("baseline", "mla")]}) == 2
    tucker = ratios[("baseline", "tucker")]
    [equivalent] = [n for n in tucker if attn.mha_equivalent(section(n))]
    compressing = {n: r for n, r in tucker.items() if n != equivalent}
    assert len(compressing) >= 3 and min(compressing.values()) <= 2.1 and max(compressing.values()) >= 18
    nearest_ten = min(compressing, key=lambda n: abs(math.log(compressing[n] / 10)))
    # the listing's form keeps a dense W_O (d^2 of MHA's 4 d^2 a layer): about 2x at most 4x; its most compressing row
    # stands in for the 6x and 10x it cannot reach, with three seeds
    listing = ratios[("baseline", "tucker_listing")]
    assert len(listing) == 3 and min(listing.values()) == pytest.approx(2, abs=0.1) and max(listing.values()) < 4
    most = max(listing, key=listing.get)
    assert [n for n, v in spec["variants"].items() if v["seeds"]] == [nearest_ten, most]
    assert seeds[nearest_ten] == seeds[most] == [0, 1, 2]
    four = sorted(ratios[("four_tensor", "tucker")].values())
    assert len(four) == 3 and four[0] == pytest.approx(2, abs=0.3) and four[1] == pytest.approx(5, abs=1)
    assert four[2] == pytest.approx(10, abs=0.5)


# ----- the KV cache per token -----
@pytest.mark.parametrize(
    "extra, per_layer",
    [
        ({}, 2 * 8),  # MHA: K and V, n_H d_H = d each
        ({"attention": "gqa", "n_kv_heads": 1}, 2 * 1 * 4),  # GQA: 2 n_KV d_H
        ({"attention": "mla", "mla_kv_rank": 3, "mla_q_rank": 2}, 2 * 3),  # MLA, separated latents: 2 d_c
        ({"attention": "mla", "mla_kv_rank": 3, "mla_shared_kv": True}, 3),  # MLA, shared latent: d_c
        ({"attention": "tucker", "tucker_ranks": [2, 3, 5]}, 5 + 3),  # Tucker: k~ (r_3) and v~ (r~_2)
        ({"attention": "tucker", "tucker_ranks": [2, 3, 5], "tucker_ranks_out": [1, 6, 2]}, 5 + 6),
    ],
)
def test_kv_cache_bytes_per_token_by_hand_and_as_cached(extra, per_layer):
    section = {**TINY_SHAPE, "type": "baseline", **extra}  # d 8, H 2, d_H 4, 2 layers
    assert attn.kv_cache_bytes_per_token(section, 30) == 4 * 2 * per_layer  # fp32, both layers
    model = build_model(section, 30).eval()
    with torch.no_grad():
        _, cache = model.prefill(torch.tensor([[30, 1, 2]]), torch.tensor([3]))  # [BOS] and two tokens
        numbers = sum(t.numel() for layer in cache.kv for t in layer)
    assert 4 * numbers == 3 * attn.kv_cache_bytes_per_token(section, 30)  # what the decoder really keeps


def test_the_4_tensor_model_has_no_kv_cache_and_full_tucker_ranks_are_mha_equivalent():
    assert attn.kv_cache_bytes_per_token({**TINY_SHAPE, "type": "four_tensor"}, 30) is None
    full = {**TINY_SHAPE, "type": "baseline", "attention": "tucker", "tucker_ranks": [2, 8, 8]}
    assert attn.mha_equivalent(full) and not attn.mha_equivalent({**full, "tucker_ranks": [2, 8, 7]})
    assert not attn.mha_equivalent({**full, "tucker_ranks_out": [2, 4, 8]})


# ----- the verdict -----
def row(variant, model_type, kind, ratio, delta, ci=None, seeds=(0,), ce=5.0, **extra):
    return {
        "pair": "p",
        "variant": variant,
        "model_type": model_type,
        "kind": kind,
        "attention_ratio": ratio,
        "delta_percent": delta,
        "delta_percent_ci95": ci,
        "delta_seeds": list(seeds),
        "seeds": list(seeds),
        "val_last_ce": ce,
        "mha_equivalent": False,
        "not_converged_seeds": [],
        **extra,
    }


FLOORS = {
    "rows": [{"floor": "unigram", "val_last_ce": 6.0}, {"floor": "position_unigram", "val_last_ce": 5.5}],
    "end_cost": 0.25,
}


def hand_rows(tucker_ci):
    return [
        row("reference", "baseline", "mha", 1.0, 0.0, ce=5.2, seeds=(0, 1, 2), val_last_ce_per_seed=[5.1, 5.2, 5.3]),
        row("gqa1", "baseline", "gqa", 1.6, 0.5),  # within at 1.6x (seed-0 point)
        row("mla32", "baseline", "mla", 1.6, 0.9),
        row("mla8", "baseline", "mla", 2.9, 1.5),  # outside
        row("t_full", "baseline", "tucker", 0.33, 0.1, mha_equivalent=True),  # a check, not a compression
        row("t6", "baseline", "tucker", 6.4, 0.2),
        row("t10", "baseline", "tucker", 9.9, 0.3, ci=[-0.4, 0.9], seeds=(0, 1, 2)),
        row("t19", "baseline", "tucker", 19.3, 0.8, ci=tucker_ci, seeds=(0, 1, 2), ce=5.6, not_converged_seeds=[1]),
        row("reference", "four_tensor", "dense", 1.0, 0.0, ce=5.0),
        row("t4_5", "four_tensor", "tucker", 5.6, -2.0),
        row("t4_10", "four_tensor", "tucker", 9.9, 1.01),
    ]


def test_the_verdict_takes_the_largest_ratio_within_one_percent_and_checks_the_order_of_magnitude():
    result = verdict.attention_verdict(hand_rows(tucker_ci=[0.1, 1.2]), FLOORS)  # t19's interval reaches 1.2%
    families = {(f["model_type"], f["family"]): f for f in result["families"]}
    assert (families[("baseline", "gqa")]["largest_ratio"], families[("baseline", "gqa")]["basis"]) == (
        1.6,
        "seed-0 Δ +0.50%",
    )
    assert families[("baseline", "mla")]["at"] == "mla32"
    tucker = families[("baseline", "tucker")]
    assert [t["variant"] for t in tucker["rows"]] == ["t6", "t10", "t19"]  # the MHA-equivalent check is left out
    assert tucker["at"] == "t10"
    assert tucker["basis"] == "mean Δ +0.30%, paired 95% interval [-0.40%, +0.90%] over seeds 0, 1, 2"
    assert families[("four_tensor", "tucker")]["at"] == "t4_5"  # 1.01% is not within 1%
    [claim] = result["claims"]
    assert (claim["tucker_ratio"], claim["gqa_ratio"], claim["mla_ratio"], claim["met"]) == (9.9, 1.6, 1.6, False)
    [check] = result["checks"]
    assert check["variant"] == "t_full" and check["within"]
    assert result["position_floor"] == 5.5
    assert result["findings"] == {"p baseline t19": ["not below the position-unigram floor", "not converged (seed 1)"]}
    text = "\n".join(verdict.verdict_lines(result))
    assert "The Tucker paper's claim at p** (Tucker within 1% at >= 10x the ratio of GQA and MLA): NOT met" in text
    assert "t19 19.30x: NOT within (mean Δ +0.80%, paired 95% interval [+0.10%, +1.20%] over seeds 0, 1, 2)" in text
    assert "Check: p baseline t_full can represent MHA exactly; it matches MHA within 1% (seed-0 Δ +0.10%)." in text
    assert "Finding, not below the position-unigram floor: p baseline t19." in text
    assert "Position-unigram count floor: L_S(4) 5.5000" in text and "5.7500 with the end cost" in text
    assert "Finding, not converged: p baseline t19 (seed 1)." in text
    [noise] = result["seed_noise"]  # only the baseline reference has several seeds
    assert noise["model_type"] == "baseline" and noise["sd_percent"] == pytest.approx(100 * 0.1 / 5.2)
    assert "baseline reference's L_S(4) has a standard deviation of 1.92% of its mean over seeds 0, 1, 2" in text

    met = verdict.attention_verdict(hand_rows(tucker_ci=[0.2, 0.95]), FLOORS)  # now t19 is within
    assert met["claims"][0]["tucker_ratio"] == 19.3 and met["claims"][0]["met"]  # 19.3 >= 10 x 1.6
    hand = [r for r in hand_rows(tucker_ci=[0.2, 0.95]) if r["variant"] != "gqa1"] + [
        row("gqa1", "baseline", "gqa", 1.6, 3.0)
    ]
    [claim] = verdict.attention_verdict(hand, FLOORS)["claims"]  # no GQA row within: GQA counts at 1x
    assert claim["none_within"] == ["gqa"] and claim["gqa_ratio"] == 1.0 and claim["met"]
    assert "GQA has no row within 1%: counted at 1x" in "\n".join(
        verdict.verdict_lines(verdict.attention_verdict(hand, FLOORS))
    )


# ----- the report, end to end on the toy preset -----
@pytest.fixture(scope="module")
def attention_out(data_dir, tmp_path_factory):
    """The toy attention preset with a second seed for the references and one variant: (out folder, results)."""
    preset = {**TINY_ATTENTION_PRESET, "seeds": [0], "reference_seeds": [0, 1]}
    preset["variants"] = {**preset["variants"], "gqa_kv1": {**preset["variants"]["gqa_kv1"], "seeds": [0, 1]}}
    path = write_preset(tmp_path_factory.mktemp("preset") / "attention_seeds.yaml", preset)
    out = tmp_path_factory.mktemp("bench") / "attention_seeds"
    assert bench.main(["--preset", str(path), "--data", str(data_dir), "--out", str(out), "--no-progress"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_attention_rows_pair_their_seeds_and_report_floors_kv_cache_and_verdict(attention_out):
    out, results = attention_out
    rows = {(r["model_type"], r["variant"]): r for r in results["attention"]}
    base, gqa = rows[("baseline", "reference")], rows[("baseline", "gqa_kv1")]
    assert base["seeds"] == [0, 1] and gqa["seeds"] == [0, 1] and rows[("baseline", "mla_dc2")]["seeds"] == [0]
    ce = {
        (r["model_type"], r.get("variant"), r["seed"]): r["val_last_ce"] for r in results["runs"] + results["variants"]
    }
    per_seed = [
        100 * (ce[("baseline", "gqa_kv1", s)] - ce[("baseline", None, s)]) / ce[("baseline", None, s)] for s in (0, 1)
    ]
    assert gqa["delta_percent"] == pytest.approx(sum(per_seed) / 2) and gqa["delta_percent_ci95"] is not None
    assert gqa["val_last_ce"] == pytest.approx((ce[("baseline", "gqa_kv1", 0)] + ce[("baseline", "gqa_kv1", 1)]) / 2)
    assert gqa["kv_cache_bytes_per_token"] == 4 * 2 * 4 and base["kv_cache_bytes_per_token"] == 4 * 2 * 8  # L 1
    assert rows[("four_tensor", "reference")]["kv_cache_bytes_per_token"] is None
    halves = results["runs"][0]["story_cloze"]
    assert halves and set(gqa["story_cloze"]) == set(halves)
    assert results["settings"]["row_seeds"]["gqa_kv1"] == [0, 1] and results["settings"]["seeds"] == [0, 1]
    floor = {f["floor"]: f["val_last_ce"] for f in results["floors"]["rows"]}["position_unigram"]
    v = results["attention_verdict"]
    assert v["position_floor"] == floor
    for r in results["attention"]:  # one epoch: every row stopped on the cap at its best epoch, and is flagged
        flags = v["findings"][f"h2_l1 {'4-tensor' if r['model_type'] == 'four_tensor' else 'baseline'} {r['variant']}"]
        assert f"not converged (seed {', '.join(map(str, r['seeds']))})" in flags
        assert ("not below the position-unigram floor" in flags) == (r["val_last_ce"] >= floor)
    md = (out / "results.md").read_text()
    assert "### Verdict: the largest ratio within 1% of the reference's L_S(4)" in md
    assert f"position_unigram {floor:.4f}" in md and "Decode time: not measured" in md
    assert "seeds 0 (0, 1: four_tensor, baseline, gqa_kv1)" in md
    assert (out / "ls4_vs_attention_params.png").read_bytes()[:4] == b"\x89PNG"


def test_decode_timing_alternates_the_baseline_rows_and_lands_in_the_reports(attention_out, tmp_path):
    out = tmp_path / "timed"
    shutil.copytree(attention_out[0], out)
    shutil.rmtree(out / "runs" / "h2_l1_baseline_mla_dc2_s0" / "best")  # this row is built with random weights
    threads = torch.get_num_threads()
    assert (
        attention_decode.main(["--out", str(out), "--rounds", "3", "--steps", "2", "--threads", str(threads + 1)]) == 0
    )
    assert torch.get_num_threads() == threads, "the caller's thread count is restored"
    timing = json.loads((out / "decode_timing.json").read_text())
    assert [r["variant"] for r in timing["rows"]] == ["reference", "gqa_kv1", "mla_dc2", "tucker_2_3_3"]
    assert [r["trained_weights"] for r in timing["rows"]] == [True, True, False, True]
    for r in timing["rows"]:
        assert len(r["ms_per_round"]) == 3 and r["ms_per_token"] > 0
    assert timing["settings"]["steps"] == 2 and timing["settings"]["prefix_tokens"] == 1 + 4 * 16
    results = json.loads((out / "results.json").read_text())
    assert results["decode_timing"]["rows"] == timing["rows"]
    md = (out / "results.md").read_text()
    assert f"| {timing['rows'][1]['ms_per_token']:.3f} |" in md and "random weights" in md and "h2_l1 mla_dc2" in md
    assert "| h2_l1 | reference | 4-tensor | dense | 384 | 1.00 | — | — |" in md  # no KV cache, not timed
    # a later report of the benchmark keeps the measurement (read back from decode_timing.json)
    args = ["--preset", results["preset"]["path"], "--data", results["data_dir"], "--out", str(out), "--report-only"]
    assert bench.main([*args, "--no-progress"]) == 0
    assert json.loads((out / "results.json").read_text())["decode_timing"]["rows"] == timing["rows"]
    assert attention_decode.main(["--out", str(tmp_path / "nothing")]) == 2

"""The shipped offline pack (offline_pack/), loaded and run through the world-model evaluation on a few
held-out episodes of the synthetic world, generated here (seed 0, held-out split: never trained on).

With n scored items, a rate measured on the full evaluation can come out lower here by sampling error
alone; each floor below is the level minus three standard errors, sqrt(p (1 - p) / n), of the small sample.
"""
import math

import pytest

from pipeline.evaluate_world import evaluate_world
from pipeline.presets import load_preset, missing_offline_models
from tests.model_factories import one_torch_thread
from world_model.synthetic_world import generate

EPISODES = 4
CAPTION_TARGET = 0.95  # issue 5: exact sentence match on held-out strips
ROUND_TRIP_MEASURED = 0.56  # docs/world_eval/results.md (100 episodes); below the 0.80 target


def floor(p: float, n: int) -> float:
    return p - 3 * math.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if missing_offline_models(load_preset("offline")):
        pytest.fail("the offline pack (offline_pack/) is part of the repository and must be present")
    root = tmp_path_factory.mktemp("pack_eval")
    generate(EPISODES, seed=0, out_dir=root, split="heldout")
    with one_torch_thread():
        return evaluate_world("offline_pack", root / "heldout", EPISODES, root / "eval", storyboard_episodes=1,
                              progress=False)


def test_the_captioner_reads_held_out_strips(results):
    captions = results["caption_accuracy"]
    assert captions["strips"] == EPISODES * 8
    assert captions["overall"] >= floor(CAPTION_TARGET, captions["strips"])


def test_the_predictor_beats_copy_last_and_the_flat_baseline_through_the_full_loop(results):
    mean = {name: sum(results["next_state"][name]["captions"]["accuracy"]) / 5
            for name in ("four_tensor", "baseline", "copy_last")}
    assert mean["four_tensor"] > mean["copy_last"] and mean["four_tensor"] >= mean["baseline"], mean
    assert all(0 < c <= 1 for c in results["ceiling"]["per_step"])


def test_rendered_strips_are_captioned_back_to_their_sentence(results):
    trip = results["round_trip"]["true_sentences"]
    assert trip["strips"] == EPISODES * 8
    assert trip["overall"] >= floor(ROUND_TRIP_MEASURED, trip["strips"])


def test_the_pack_fits_the_size_budget(results):
    assert results["pack"]["size_mb"]["total"] <= 30

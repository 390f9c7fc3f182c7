"""The shipped offline pack (offline_pack/), loaded and run through the world-model evaluation on a few
held-out episodes of the synthetic world's first three scenes (the world it was trained on), generated here (seed 0,
held-out split: never trained on).

With n scored items, a rate measured on the full evaluation can come out lower here by sampling error
alone; each floor below is the level minus three standard errors, sqrt(p (1 - p) / n), of the small sample.
"""

import math
from pathlib import Path

import pytest

from pipeline.pack.evaluate_world import WorldEvaluation, evaluate_world
from pipeline.presets import load_preset, missing_offline_models
from tests.model_factories import one_torch_thread
from world_model.data.synthetic.generator import generate
from world_model.data.synthetic.scenes import FIRST_SCENE_TYPES
from world_model.data.synthetic.sentences import copy_last_predictions, next_state_accuracy, predict_ahead
from world_model.data.synthetic.simulation import episode_seed, simulate
from world_model.models.registry import load_predictor

EPISODES = 4
TRAIN_EPISODES = 30  # the count floors' episodes (sentences only matter: tiny clips)
SECONDS = 8  # the pack was trained on 8-second episodes of the first three scenes
SENTENCE_EPISODES = 300  # held-out episodes simulated without video, for the predictor alone
CAPTION_TARGET = 0.95  # exact sentence match on held-out strips
PREDICTOR_TARGET = 0.90  # next-state accuracy as a fraction of the simulator's ceiling
ROUND_TRIP_TARGET = 0.80  # rendered strips captioned back exactly


def floor(p: float, n: int) -> float:
    return p - 3 * math.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if missing_offline_models(load_preset("offline")):
        pytest.fail("the offline pack (offline_pack/) is part of the repository and must be present")
    root = tmp_path_factory.mktemp("pack_eval")
    data = root / "data"
    generate(TRAIN_EPISODES, seed=0, out_dir=data, split="train", scenes=FIRST_SCENE_TYPES, seconds=SECONDS, size=16)
    generate(EPISODES, seed=0, out_dir=data, split="heldout", scenes=FIRST_SCENE_TYPES, seconds=SECONDS)
    with one_torch_thread():
        settings = WorldEvaluation(
            data=data, out=root / "eval", episodes=EPISODES, observe=3, storyboard_episodes=1, progress=False
        )
        return evaluate_world(settings)


def test_the_captioner_reads_held_out_strips(results):
    captions = results["caption_accuracy"]
    assert captions["strips"] == EPISODES * SECONDS
    assert captions["overall"] >= floor(CAPTION_TARGET, captions["strips"])


def test_the_predictor_beats_copy_last_through_the_full_loop(results):
    """Four episodes, most of them a chance draw of the elevator, cannot tell the 4-tensor model from the flat
    baseline (a lucky call of the likeliest floor decides it); the committed evaluation compares them."""
    fraction = {name: t["fraction_of_ceiling"] for name, t in results["targets"].items()}
    assert fraction["four_tensor"] > fraction["copy_last"], fraction
    assert all(0 < cell["ceiling_from_sentences"] <= 1 for cell in results["scenes"]["all"]["k"].values())


def test_rendered_strips_are_captioned_back_to_their_sentence(results):
    renders = results["renders"]["all"]
    assert renders["renders"] == EPISODES * 5
    assert renders["round_trip"] >= floor(ROUND_TRIP_TARGET, renders["renders"])


def test_the_pack_fits_the_size_budget(results):
    assert results["pack"]["size_mb"]["total"] <= 30


def test_the_predictor_reaches_ninety_percent_of_the_ceiling_on_held_out_sentences():
    """Observe the true sentences of seconds 0-2 of the held-out episodes, predict second 3 (and on to 7), with the
    pack's readout (its known sentences). The ceiling is the mean largest probability of the true next-state
    distribution; the floor is the target minus three standard errors of the n-episode sample. (The comparison
    with the flat baseline runs through the full loop above; scoring its known sentences here would take a minute.)"""
    episodes = [simulate(episode_seed(0, i, "heldout"), FIRST_SCENE_TYPES, SECONDS) for i in range(SENTENCE_EPISODES)]
    contexts, futures = [e.sentences[:3] for e in episodes], [e.sentences[3:8] for e in episodes]
    ceiling = sum(max(p for _, p in e.next[2]) for e in episodes) / len(episodes)
    model, vocab, known = load_predictor("offline_pack/predictor")
    assert known is not None, "offline_pack/predictor ships its known sentences"
    with one_torch_thread():
        accuracy = next_state_accuracy(predict_ahead(model, vocab, contexts, 5, candidates=known), futures)
    assert accuracy[0] >= floor(PREDICTOR_TARGET * ceiling, SENTENCE_EPISODES), (accuracy, ceiling)
    copy_last = next_state_accuracy(copy_last_predictions(contexts, 5), futures)
    assert all(a > c for a, c in zip(accuracy, copy_last)), (accuracy, copy_last)


def test_the_renderer_trainers_defaults_build_the_shipped_renderers_architecture():
    """`python -m pipeline.pack.train_renderer --data DATA --out RUN` with no model flags builds the UNet and text encoder
    the pack ships: the same tensors, of the same shapes (so the documented command reproduces it)."""
    from safetensors import safe_open

    from renderers.pixel_pipeline import PixelPipelineConfig, build_pixel_pipeline

    sentences = [line for line in Path("offline_pack/predictor/known_sentences.txt").read_text().splitlines() if line]
    built = build_pixel_pipeline(sentences, PixelPipelineConfig())
    for name, weights in (("unet", "diffusion_pytorch_model.safetensors"), ("text_encoder", "model.safetensors")):
        with safe_open(f"offline_pack/renderer/{name}/{weights}", framework="pt") as shipped:
            shapes = {key: tuple(shipped.get_slice(key).get_shape()) for key in shipped.keys()}
        assert shapes == {k: tuple(v.shape) for k, v in getattr(built, name).state_dict().items()}, name

"""The world-model evaluation (pipeline.pack.evaluate_world) on a tiny world with a pack of tiny random models: what
it writes is what its parts compute."""

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from pipeline.pack import evaluate_world as ew
from pipeline.tiny_pack import make_tiny_blip
from renderers.pixel_pipeline import PixelPipelineConfig, build_pixel_pipeline
from tests.model_factories import make_tiny_world_predictor, one_torch_thread
from world_model.data.synthetic import generator
from world_model.data.synthetic.episodes import known_sentences
from world_model.text.vocab import tokenize

KINDS = ("counting", "occlusion")
SECONDS, STEPS, OBSERVE = 6, 2, 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(pack folder, data folder, a second 4-tensor seed): a tiny two-scene world and a pack of tiny random models."""
    root = tmp_path_factory.mktemp("world")
    small = dict(scenes=KINDS, seconds=SECONDS, fps=4, size=32)
    generator.generate(8, 0, root / "data", "train", **small)
    generator.generate(4, 0, root / "data", "heldout", **small)
    known = known_sentences(root / "data")
    pack = root / "pack"
    with one_torch_thread():
        make_tiny_blip(pack / "captioner")
        config = PixelPipelineConfig(
            sample_size=(16, 48),
            previous_strip=True,
            block_out_channels=(8, 16),
            attention_levels=1,
            head_channels=8,
            text_dim=16,
            text_layers=1,
            text_heads=2,
            num_inference_steps=2,
        )
        build_pixel_pipeline(known, config).save_pretrained(pack / "renderer")
        make_tiny_world_predictor(pack / "predictor", "four_tensor", known, 0, n_tokens=16, n_states=5)
        make_tiny_world_predictor(pack / "baseline", "baseline", known, 0, n_tokens=16, n_states=5)
        second = make_tiny_world_predictor(root / "four_tensor_s1", "four_tensor", known, 1, n_tokens=16, n_states=5)
    return pack, root / "data", second


@pytest.mark.slow
def test_full_loop_writes_what_its_parts_compute(world, tmp_path):
    pack, data, second = world
    out = tmp_path / "eval"
    argv = ["--pack", str(pack), "--data", str(data), "--steps", str(STEPS), "--observe", str(OBSERVE),
            "--render-episodes", "3", "--four-tensor-seeds", str(second), "--out", str(out), "--device", "cpu",
            "--storyboard-episodes", "2", "--cache", str(tmp_path / "cache")]  # fmt: skip
    with one_torch_thread():
        assert ew.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "storyboard.png"]
    results = json.loads((out / "results.json").read_text())
    records = [json.loads(line) for line in (data / "heldout" / "episodes.jsonl").read_text().splitlines()]
    episodes = results["episodes"]
    assert [e["id"] for e in episodes] == [r["id"] for r in records]
    same = lambda a, b: tokenize(a) == tokenize(b)  # noqa: E731
    truths = {r["id"]: [s["text"] for s in r["sentences"]] for r in records}

    captions = [(c, t) for e in episodes for c, t in zip(e["captions"], truths[e["id"]])]
    assert results["caption_accuracy"]["overall"] == pytest.approx(np.mean([same(c, t) for c, t in captions]), abs=1e-4)

    assert set(results["scenes"]) == {"all", *KINDS}
    for entry in results["scenes"].values():
        assert set(entry["k"]) == {"1", "2"}
        for cell in entry["k"].values():
            assert {"ceiling_full_state", "ceiling_from_sentences", "entropy_from_sentences"} <= set(cell)
            assert set(cell["predictors"]) == {"four_tensor", "flat_baseline", "copy_last", "markov1", "markov2",
                                               "markov3"}  # fmt: skip
            assert all("accuracy" in p and "log_loss" in p for p in cell["predictors"].values())
    four = results["scenes"]["all"]["k"]["1"]["predictors"]["four_tensor"]
    assert len(four["seeds"]) == 2 and four["accuracy"]["lo"] is not None  # the pack's seed and the one beside it
    # copy-last reads the captions: its hits are the last caption against the true next sentence, at every cut
    hits = [
        same(e["captions"][o - 1], truths[e["id"]][o + k - 1])
        for e in episodes
        for o in range(1, SECONDS - STEPS + 1)
        for k in (1,)
    ]
    assert results["scenes"]["all"]["k"]["1"]["predictors"]["copy_last"]["accuracy"] == pytest.approx(np.mean(hits))

    renders = results["renders"]
    assert set(renders) == {"all", *{e["scene"] for e in episodes[:3]}}
    assert renders["all"]["episodes"] == 3 and renders["all"]["renders"] == 3 * STEPS
    drawn = episodes[:3]
    backs = [(b, t) for e in drawn for b, t in zip(e["true_renders_captioned"], truths[e["id"]][OBSERVE:])]
    assert renders["all"]["round_trip"] == pytest.approx(np.mean([same(b, t) for b, t in backs]), abs=1e-4)
    assert renders["all"]["object_count_accuracy"] == pytest.approx(
        np.mean([x for e in drawn for x in e["objects_right"]]), abs=1e-4
    )
    assert all(len(e["predicted"]) == STEPS for e in drawn) and "predicted" not in episodes[3]
    first = renders["all"]["first_strip"]
    assert set(first) == {"as_rendered", "from_last_strip", "without_context", "last_frame_held"}
    assert all(0 <= v["pixel_error"] <= 1 for v in first.values())

    md = (out / "results.md").read_text()
    assert results["command"] in md and "## Renders" in md and "### counting" in md
    assert results["data"]["path"] == str(data) or not results["data"]["path"].startswith("/work")
    with Image.open(out / "storyboard.png") as image:
        assert image.format == "PNG" and image.width > image.height > 100
    assert len(results["storyboard"]) == 2


def test_missing_pieces_and_bad_settings_are_refused_before_any_work(world, tmp_path):
    pack, data, _ = world
    partial = tmp_path / "partial"
    shutil.copytree(pack, partial)
    shutil.rmtree(partial / "baseline")
    (partial / "renderer" / "model_index.json").unlink()
    settings = dict(data=data, out=tmp_path / "out", steps=STEPS, observe=OBSERVE)
    with pytest.raises(ew.EvaluationError, match=r"missing: renderer .*no model_index.json.*; baseline .*no folder"):
        ew.evaluate_world(ew.WorldEvaluation(pack=partial, **settings))
    with pytest.raises(ew.EvaluationError, match="holds 4 episodes, fewer than --episodes 5"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, episodes=5, **settings))
    with pytest.raises(ew.EvaluationError, match="fewer than observe \\+ steps = 7"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, **{**settings, "observe": 5}))
    with pytest.raises(ew.EvaluationError, match="is a split folder; pass the data folder above it"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, **{**settings, "data": data / "heldout"}))
    with pytest.raises(ew.EvaluationError, match="predictor folder .* not found"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, flat_baseline_seeds=(str(tmp_path / "nope"),), **settings))
    no_train = tmp_path / "no_train"
    shutil.copytree(data / "heldout", no_train / "heldout")
    with pytest.raises(ew.EvaluationError, match="train holds no episodes.jsonl"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, **{**settings, "data": no_train}))
    with pytest.raises(ew.EvaluationError, match="--strength must be in"):
        ew.WorldEvaluation(pack=pack, strength=0, **settings)
    assert not (tmp_path / "out").exists()

import json
import math
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.pack import evaluate_world as ew
from pipeline.tiny_pack import make_tiny_blip, make_tiny_predictor
from tests.model_factories import one_torch_thread
from world_model.data.synthetic import generator, scenes, simulation
from world_model.models.decoding import write_known_sentences
from world_model.models.registry import build_model, model_vocab_size
from world_model.text.vocab import Vocabulary, tokenize

OBSERVE, STEPS = 2, 3
KINDS = scenes.FIRST_SCENE_TYPES


def mixed_base_seed() -> int:
    """A base seed whose first three held-out episodes are one of each scene type."""
    return next(
        s
        for s in range(100)
        if {simulation.simulate(simulation.episode_seed(s, i, "heldout"), KINDS, seconds=1).kind for i in range(3)}
        == set(KINDS)
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(pack folder, held-out split folder): three tiny episodes and a pack of tiny random models."""
    from renderers.pixel_pipeline import PixelPipelineConfig, build_pixel_pipeline

    root = tmp_path_factory.mktemp("world")
    generator.generate(
        3, mixed_base_seed(), root / "data", split="heldout", scenes=KINDS, seconds=OBSERVE + STEPS, fps=6, size=48
    )
    split = root / "data" / "heldout"
    sentences = [
        s["text"] for line in (split / "episodes.jsonl").read_text().splitlines() for s in json.loads(line)["sentences"]
    ]
    pack = root / "pack"
    with one_torch_thread():
        make_tiny_blip(pack / "captioner")
        config = PixelPipelineConfig(
            sample_size=(16, 48),
            block_out_channels=(8, 16),
            attention_levels=1,
            head_channels=8,
            text_dim=16,
            text_layers=1,
            text_heads=2,
            num_inference_steps=2,
        )
        build_pixel_pipeline(sentences, config).save_pretrained(pack / "renderer")
        make_tiny_predictor(pack / "predictor", sentences)
        write_known_sentences(pack / "predictor", sentences)  # the 4-tensor reads known sentences; the baseline, tokens
        vocab = Vocabulary.build(sentences)
        torch.manual_seed(0)
        baseline = build_model(
            {"type": "baseline", "d_x": 4, "d_t": 4, "n_heads": 2, "n_layers": 1}, model_vocab_size("baseline", vocab)
        )
        baseline.save_pretrained(pack / "baseline", vocab=vocab)
    return pack, split


@pytest.mark.slow
def test_full_loop_writes_consistent_results(world, tmp_path):
    pack, split = world
    out = tmp_path / "eval"
    argv = [
        "--pack",
        str(pack),
        "--data",
        str(split),
        "--episodes",
        "3",
        "--observe",
        str(OBSERVE),
        "--steps",
        str(STEPS),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--storyboard-episodes",
        "2",
    ]
    with one_torch_thread():
        assert ew.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md", "storyboard.png"]
    assert not list(tmp_path.glob(".eval.partial-*"))
    results = json.loads((out / "results.json").read_text())
    records = [json.loads(line) for line in (split / "episodes.jsonl").read_text().splitlines()]
    episodes = results["episodes"]
    assert [e["id"] for e in episodes] == [r["id"] for r in records]
    same = lambda a, b: tokenize(a) == tokenize(b)  # noqa: E731

    captions = [c for e in episodes for c in e["captions"]]
    truths = [t for e in episodes for t in e["truths"]]
    assert truths == [s["text"] for r in records for s in r["sentences"]] and len(captions) == len(truths)
    assert results["caption_accuracy"]["strips"] == len(truths)
    assert math.isclose(
        results["caption_accuracy"]["overall"], np.mean([same(c, t) for c, t in zip(captions, truths)]), abs_tol=1e-4
    )

    ceiling = results["ceiling"]["per_step"]
    for e, record in zip(episodes, records):
        assert len(e["ceilings"]) == STEPS and all(0 < c <= 1 for c in e["ceilings"])
        assert math.isclose(e["ceilings"][0], record["next"][OBSERVE - 1]["best_p"], abs_tol=1e-4)
        if e["scene"] in ("ball", "box"):
            assert e["ceilings"] == [1.0] * STEPS and results["ceiling"]["per_scene"][e["scene"]] == [1.0] * STEPS
        else:
            assert min(e["ceilings"]) < 1
    assert ceiling == pytest.approx(np.mean([e["ceilings"] for e in episodes], axis=0), abs=1e-4)

    futures = [e["truths"][OBSERVE : OBSERVE + STEPS] for e in episodes]
    for context, last in (
        ("captions", [e["captions"][OBSERVE - 1] for e in episodes]),
        ("truth", [e["truths"][OBSERVE - 1] for e in episodes]),
    ):
        copy_last = [np.mean([same(x, f[k]) for x, f in zip(last, futures)]) for k in range(STEPS)]
        row = results["next_state"]["copy_last"][context]
        assert row["accuracy"] == pytest.approx(copy_last, abs=1e-4)
        assert row["fraction_of_ceiling"] == pytest.approx([a / c for a, c in zip(copy_last, ceiling)], abs=1e-3)
        for name in ("four_tensor", "baseline"):
            predicted = [e["predictions"][name][context] for e in episodes]
            assert all(len(p) == STEPS for p in predicted)
            expected = [np.mean([same(p[k], f[k]) for p, f in zip(predicted, futures)]) for k in range(STEPS)]
            assert results["next_state"][name][context]["accuracy"] == pytest.approx(expected, abs=1e-4)
    assert results["readout"] == {"four_tensor": f"sentences ({len(set(truths))} known)", "baseline": "tokens"}
    assert set(results["next_state"]) == {"four_tensor", "four_tensor_tokens", "baseline", "copy_last"}
    assert all(s in truths for e in episodes for c in ("captions", "truth") for s in e["predictions"]["four_tensor"][c])
    resting = [e for e in episodes if e["truths"][OBSERVE - 1] == e["truths"][-1]]
    assert resting and results["next_state"]["copy_last"]["truth"]["accuracy"][-1] >= len(resting) / 3 - 1e-4

    trip = results["round_trip"]
    back = {s: t for e in episodes for s, t in e["round_trip"].items()}
    assert trip["true_sentences"]["strips"] == len(truths)
    assert trip["true_sentences"]["distinct_sentences"] == len(set(truths))
    assert math.isclose(trip["true_sentences"]["overall"], np.mean([same(back[t], t) for t in truths]), abs_tol=1e-4)
    for e in episodes:
        assert math.isclose(
            trip["true_sentences"]["per_scene"][e["scene"]],  # one episode per scene
            np.mean([same(back[t], t) for t in e["truths"]]),
            abs_tol=1e-4,
        )
    loop = [s for e in episodes for s in e["predictions"]["four_tensor"]["captions"]]
    assert trip["predicted_sentences"]["strips"] == len(loop)
    assert math.isclose(trip["predicted_sentences"]["overall"], np.mean([same(back[s], s) for s in loop]), abs_tol=1e-4)

    sizes = {
        c: sum(f.stat().st_size for f in (pack / c).rglob("*") if f.is_file()) / 1e6
        for c in ("captioner", "renderer", "predictor", "baseline")
    }
    assert results["pack"]["size_mb"]["total"] == pytest.approx(sum(sizes.values()), abs=2e-3)
    timings = results["timings"]
    assert set(timings) >= {"load_models", "caption_strips", "render", "caption_renders"}
    assert timings["caption_strips"]["items"] == len(truths) and timings["render"]["items"] == len(
        set(truths) | set(loop)
    )

    md = (out / "results.md").read_text()
    assert results["command"] in md and results["command"].startswith("python -m pipeline.pack.evaluate_world --pack")
    rows = 2 * (1 + len(KINDS))
    assert md.count("| 4-tensor |") == md.count("| copy-last |") == md.count("| 4-tensor, per-slot readout |") == rows
    assert "flat baseline, token readout" not in md and "![storyboard](storyboard.png)" in md
    assert len(results["storyboard"]) == 2
    with Image.open(out / "storyboard.png") as image:
        assert image.format == "PNG" and image.width > image.height > 200


def test_missing_pieces_and_bad_settings_are_refused_before_any_work(world, tmp_path, capsys):
    pack, split = world
    partial = tmp_path / "partial"
    shutil.copytree(pack, partial)
    shutil.rmtree(partial / "baseline")
    (partial / "renderer" / "model_index.json").unlink()
    with pytest.raises(ew.EvaluationError, match=r"missing: renderer .*no model_index.json.*; baseline .*no folder"):
        ew.evaluate_world(ew.WorldEvaluation(pack=partial, data=split, episodes=3, out=tmp_path / "out"))
    with pytest.raises(ew.EvaluationError, match="holds 3 episodes, fewer than --episodes 4"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, data=split, episodes=4, out=tmp_path / "out"))
    with pytest.raises(ew.EvaluationError, match="fewer than observe \\+ steps = 6"):
        ew.evaluate_world(
            ew.WorldEvaluation(pack=pack, data=split, episodes=3, out=tmp_path / "out", observe=3, steps=3)
        )
    with pytest.raises(ew.EvaluationError, match="pass its split folder"):
        ew.evaluate_world(ew.WorldEvaluation(pack=pack, data=split.parent, episodes=3, out=tmp_path / "out"))
    missing_clip = tmp_path / "data"
    shutil.copytree(split, missing_clip)
    (missing_clip / "episode_00001.mp4").unlink()
    with pytest.raises(ew.EvaluationError, match="1 clip.* missing"):
        ew.evaluate_world(
            ew.WorldEvaluation(
                pack=pack, data=missing_clip, episodes=3, out=tmp_path / "out", observe=OBSERVE, steps=STEPS
            )
        )
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert (
        ew.main(
            [
                "--pack",
                str(pack),
                "--data",
                str(split),
                "--episodes",
                "3",
                "--out",
                str(taken),
                "--observe",
                "2",
                "--steps",
                "3",
            ]
        )
        == 2
    )
    assert "already holds files" in capsys.readouterr().err and (taken / "keep.txt").read_text() == "mine"
    assert (
        ew.main(
            [
                "--pack",
                str(tmp_path / "nowhere"),
                "--data",
                str(split),
                "--episodes",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert "model pack" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_renderer_round_trip_command_scores_every_render(world, tmp_path, capsys):
    from pipeline.pack import round_trip as rt

    pack, split = world
    sentences = list(
        dict.fromkeys(
            s["text"]
            for line in (split / "episodes.jsonl").read_text().splitlines()
            for s in json.loads(line)["sentences"]
        )
    )
    (tmp_path / "sentences.txt").write_text("\n".join(sentences) + "\n")
    argv = [
        "--renderer",
        str(pack / "renderer"),
        "--captioner",
        str(pack / "captioner"),
        "--sentences",
        str(tmp_path / "sentences.txt"),
        "--seeds",
        "0",
        "1",
        "--json",
        str(tmp_path / "rt.json"),
    ]
    with one_torch_thread():
        assert rt.main(argv) == 0
    result = json.loads((tmp_path / "rt.json").read_text())
    assert result["command"].startswith("python -m pipeline.pack.round_trip --renderer ")
    captions = result["captions"]
    assert set(captions) == {"0", "1"} and all(set(c) == set(sentences) for c in captions.values())
    hits = [tokenize(c[s]) == tokenize(s) for c in captions.values() for s in sentences]
    assert result["overall"]["strips"] == 2 * len(sentences)
    assert result["overall"]["overall"] == pytest.approx(np.mean(hits), abs=1e-4)
    assert set(result["overall"]["per_scene"]) == {scenes.scene_of(s) for s in sentences} <= set(KINDS)
    assert f"over {2 * len(sentences)} renders" in capsys.readouterr().out
    assert result["solver"] == "sde-dpmsolver++"  # the pipeline's own
    with one_torch_thread():
        assert rt.main(argv[:-1] + [str(tmp_path / "ode.json"), "--seeds", "0", "--solver", "dpmsolver++"]) == 0
    assert json.loads((tmp_path / "ode.json").read_text())["solver"] == "dpmsolver++"
    assert scenes.scene_of("a person walks into the elevator on floor two.") == "elevator"
    assert rt.main(argv[:4] + ["--sentences", str(tmp_path / "missing.txt")]) == 2

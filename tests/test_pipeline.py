"""The whole rollout command on a clip written by the test, with tiny models of the real architectures
saved locally (a BLIP captioner, a Stable Diffusion pipeline, a 4-tensor predictor)."""

import dataclasses
import json
import os
import stat

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from pipeline import rollout as rollout_module
from pipeline.config import FrameSampling, ModelChoice, make_plan
from pipeline.rollout import main, run_rollout
from pipeline.run_folder import RunFolderError
from pipeline.tiny_pack import make_tiny_blip, make_tiny_sd
from tests.model_factories import one_torch_thread, write_test_clip
from world_model.generation.readouts import Readout
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig
from world_model.text.vocab import Vocabulary, same_sentence
from world_model.text.windows import as_state_sentence, caption_window


def choice(models: dict) -> ModelChoice:
    """The tiny models as the rollout's model choice."""
    return ModelChoice(**{k: models[k] for k in ("captioner", "renderer", "predictor")})


WORDS = ["a red square moves to the right .", "the square stops at the wall .", "a ball falls down ."]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    with one_torch_thread():
        vocab = Vocabulary.build(WORDS)
        torch.manual_seed(0)
        predictor = FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1))
        predictor.save_pretrained(root / "predictor", vocab=vocab)
        yield {
            "captioner": str(make_tiny_blip(root / "blip")),
            "renderer": str(make_tiny_sd(root / "sd")),
            "predictor": str(root / "predictor"),
            "vocab": vocab,
        }


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_test_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=3.0, fps=10)


def cli_models(models):
    return ["--captioner", models["captioner"], "--renderer", models["renderer"], "--predictor", models["predictor"]]


def test_cli_writes_a_complete_run_folder(models, clip, tmp_path, capsys):
    out = tmp_path / "run"
    with one_torch_thread():
        code = main([str(clip), "--steps", "3", "--out", str(out), *cli_models(models)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    record = json.loads((out / "rollout.json").read_text())
    assert [o["timestamp_s"] for o in record["observed"]] == [0.0, 1.0, 2.0]
    assert all(isinstance(o["caption"], str) and o["caption"] for o in record["observed"])
    assert len(record["predictions"]) == 1 and len(record["predictions"][0]["sentences"]) == 3
    ids = np.array(record["predictions"][0]["token_ids"])
    assert ids.shape == (3, 16) and (ids != 1).all(), "the unknown word is never predicted"
    assert 0.0 <= record["oov"]["rate"] <= 1.0 and record["oov"]["tokens"] > 0
    assert record["models"]["captioner"] == models["captioner"] and record["preset"] == "custom"
    assert set(record["timings_s"]) == {"sample_frames", "load_models", "caption", "predict", "render", "write_outputs"}
    for entry in record["observed"]:
        assert iio.imread(out / entry["image"]).shape[:2] == (96, 160)
    rendered = [iio.imread(out / p) for p in record["predictions"][0]["images"]]
    assert all(img.ndim == 3 and img.shape[2] == 3 for img in rendered)
    frames = list(iio.imiter(out / "rollout.mp4"))
    assert len(frames) == 3 + 3 and frames[0].shape[:2] == (96, 160)
    assert len(list(iio.imiter(out / "rollout.gif"))) == 6
    board = iio.imread(out / "storyboard.png")
    assert board.shape[1] > 300 and board.std() > 0
    assert "step 3:" in printed and str(out) in printed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left"


def test_state_strips_are_captioned_one_per_interval(models, clip, tmp_path):
    with one_torch_thread():
        result = run_rollout(
            clip, 1, models=choice(models), frames=FrameSampling(frames_per_state=3), output=tmp_path / "run"
        )
    record = result.record
    assert record["sampling"]["frames_per_state"] == 3
    assert [o["timestamp_s"] for o in record["observed"]] == [0.0, 1.0, 2.0]
    assert all(img.shape == (96, 3 * 160, 3) for img in result.observed)
    assert iio.imread(result.run_dir / record["observed"][0]["image"]).shape[:2] == (96, 480)
    with pytest.raises(ValueError, match="--frames"):
        FrameSampling(num_frames=2, frames_per_state=3)


def test_sampling_gives_seeded_alternative_futures(models, clip, tmp_path):
    with one_torch_thread():
        runs = [
            run_rollout(
                clip,
                2,
                models=choice(models),
                generation=GenerationConfig(samples=3, temperature=1.5, seed=seed),
                output=tmp_path / name,
            )
            for name, seed in (("a", 7), ("b", 7), ("c", 8))
        ]
    a, b, c = (r.predicted_sentences for r in runs)
    assert len(a) == 3 and a == b, "same seed, same futures"
    assert a != c
    assert len({tuple(s) for s in a}) > 1, "the samples differ from each other"
    assert np.array_equal(runs[0].rendered[0][0], runs[1].rendered[0][0])


def test_window_left_pads_short_clips_and_counts_unknown_words(models):
    vocab = models["vocab"]
    window = caption_window(["a red square", "zebra quokka"], vocab, n_states=4, n_tokens=16)
    assert window.token_ids.shape == (1, 4, 16)
    assert (window.token_ids[0, :2] == 0).all(), "two empty states in front"
    assert window.states == ["", "", "a red square.", "zebra quokka."]
    assert window.unknown == 2 and window.tokens == 3 + 2
    assert window.unknown_words == ["zebra", "quokka"]
    assert window.token_ids[0, 3, :2].tolist() == [1, 1]
    assert as_state_sentence("  two   spaces ") == "two spaces." and as_state_sentence("done!") == "done!"


def test_caption_of_only_unknown_words_is_a_documented_warning(models, clip, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: lambda images: ["zebra quokka"] * len(images))
    with one_torch_thread():
        result = run_rollout(clip, 1, models=choice(models), output=tmp_path / "run")
    assert result.record["oov"]["rate"] == 1.0
    assert any("outside the predictor's vocabulary" in w for w in result.record["warnings"])


@pytest.mark.parametrize("kind", ["missing", "text", "empty", "audio"])
def test_bad_videos_give_a_clear_error_and_no_run_folder(models, tmp_path, capsys, kind):
    video = tmp_path / "video.mp4"
    if kind == "text":
        video.write_text("this is not a video")
    elif kind == "empty":
        video.write_bytes(b"")
    elif kind == "audio":
        from tests.model_factories import write_audio_only

        video = write_audio_only(tmp_path / "audio.m4a")
    out = tmp_path / "run"
    code = main([str(video), "--out", str(out), *cli_models(models)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]


def test_one_frame_clip_predicts_from_one_state(models, tmp_path):
    video = write_test_clip(tmp_path / "one.mp4", seconds=0.1, fps=10)
    with one_torch_thread():
        result = run_rollout(video, 2, models=choice(models), output=tmp_path / "run")
    assert len(result.record["observed"]) == 1
    assert result.record["window"]["states"][:3] == ["", "", ""]
    assert len(result.predicted_sentences[0]) == 2


def test_unwritable_output_folder_is_refused_before_any_work(models, clip, tmp_path, capsys, monkeypatch):
    if os.geteuid() == 0:  # root ignores permission bits: make the parent a file instead
        parent = tmp_path / "a_file"
        parent.write_text("")
    else:
        parent = tmp_path / "locked"
        parent.mkdir()
        parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    called = []
    monkeypatch.setattr(rollout_module, "sample_frames", lambda *a, **k: called.append(1))
    code = main([str(clip), "--out", str(parent / "run"), *cli_models(models)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: --out {parent / 'run'}") and err.count("\n") == 1
    assert not called


def test_existing_run_folder_is_kept_unless_overwrite(models, clip, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="--overwrite"):
        run_rollout(clip, 1, models=choice(models), output=out)
    assert (out / "keep.txt").read_text() == "mine"


def test_interrupted_run_leaves_no_half_written_folder(models, clip, tmp_path, monkeypatch):
    def broken_renderer(*args):
        def render(prompts, seed=0, init_images=None):
            raise KeyboardInterrupt

        render.continues = False
        return render

    monkeypatch.setattr(rollout_module, "load_renderer", broken_renderer)
    with pytest.raises(KeyboardInterrupt), one_torch_thread():
        run_rollout(clip, 1, models=choice(models), output=tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_offline_preset_without_the_pack_says_so(clip, tmp_path, capsys, offline_pack_absent):
    code = main([str(clip), "--preset", "offline", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "offline model pack is not in this installation" in err
    assert "Traceback" not in err


def test_unknown_preset_lists_the_known_ones(clip, tmp_path, capsys):
    assert main([str(clip), "--preset", "nope", "--out", str(tmp_path / "run")]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_auto_preset_without_hub_or_pack_explains_both(clip, tmp_path, capsys, offline_pack_absent):
    assert main([str(clip), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Salesforce/blip-image-captioning-base" in err and "neither cached nor reachable" in err
    assert "offline model pack is not in this installation" in err


def test_readout_picks_known_sentences_when_the_predictor_lists_them(models, clip, tmp_path, capsys):
    """A predictor folder with known_sentences.txt predicts only those (readout auto); `tokens` overrides it, and
    `sentences` without the file is refused before any model work."""
    known = WORDS[:2]
    folder = tmp_path / "predictor-known"
    with one_torch_thread():
        torch.manual_seed(0)
        model = FourTensorModel(FourTensorConfig(vocab_size=len(models["vocab"]), d_x=4, d_t=2, n_heads=1, n_layers=1))
        model.save_pretrained(folder, vocab=models["vocab"], known_sentences=known)
        parts = {"captioner": models["captioner"], "renderer": models["renderer"], "predictor": str(folder)}
        closed = run_rollout(
            clip,
            3,
            ModelChoice(**parts),
            generation=GenerationConfig(samples=4, temperature=3.0),
            output=tmp_path / "closed",
        )
        free = run_rollout(
            clip, 3, ModelChoice(**parts), generation=GenerationConfig(readout="tokens"), output=tmp_path / "free"
        )
    assert closed.record["sampling"]["readout"] == "sentences (2 known)"
    predicted = [s for sample in closed.predicted_sentences for s in sample]
    assert all(any(same_sentence(p, k) for k in known) for p in predicted), predicted
    assert free.record["sampling"]["readout"] == "tokens"
    code = main([str(clip), "--out", str(tmp_path / "refused"), "--readout", "sentences", *cli_models(models)])
    assert code == 2 and "known_sentences.txt" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_bf16_precision_runs_the_predictor_under_autocast(models, clip, tmp_path, monkeypatch):
    seen = []
    real = rollout_module.load_readout

    class Watching:
        def __init__(self, readout):
            self.readout, self.name = readout, readout.name

        def rollout(self, *args):
            seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
            return self.readout.rollout(*args)

        futures = Readout.futures  # the readout's own drawing, through this rollout

    monkeypatch.setattr(rollout_module, "load_readout", lambda *a: Watching(real(*a)))
    with one_torch_thread():
        bf16 = run_rollout(
            clip, 2, choice(models), generation=GenerationConfig(precision="bf16"), output=tmp_path / "a"
        )
        fp32 = run_rollout(clip, 2, choice(models), output=tmp_path / "b")
    assert seen == [True, False]
    assert bf16.record["sampling"]["precision"] == "bf16" and fp32.record["sampling"]["precision"] == "fp32"
    with pytest.raises(ValueError, match="precision"):
        GenerationConfig(precision="fp16")


def test_repeated_captions_are_one_state_with_its_time_span(models, tmp_path, monkeypatch):
    video = write_test_clip(tmp_path / "five.mp4", seconds=5.0, fps=10)
    captions = ["a red square", "A red square.", "the square  stops", "the square stops", "a red square"]
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: lambda images: captions[: len(images)])
    with one_torch_thread():
        result = run_rollout(video, 1, models=choice(models), output=tmp_path / "run")
    record = result.record
    assert len(record["observed"]) == 5
    assert record["states"] == [
        {"sentence": "a red square.", "observed": [0, 1], "start_s": 0.0, "end_s": 1.0},
        {"sentence": "the square stops.", "observed": [2, 3], "start_s": 2.0, "end_s": 3.0},
        {"sentence": "a red square.", "observed": [4, 4], "start_s": 4.0, "end_s": 4.0},
    ]
    assert "states: 3 of 5 captions (repeats merged)" in rollout_module.summary(result)
    n_states = len(record["window"]["states"])
    assert record["window"]["states"] == [""] * (n_states - 3) + ["a red square.", "the square stops.", "a red square."]


def test_repeated_captions_stay_states_of_their_own_when_merging_is_off(models, tmp_path, monkeypatch):
    video = write_test_clip(tmp_path / "three.mp4", seconds=3.0, fps=10)
    captions = ["a red square", "a red square", "the square stops"]
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: lambda images: captions[: len(images)])
    with one_torch_thread():
        result = run_rollout(
            video, 1, models=choice(models), frames=FrameSampling(merge_repeats=False), output=tmp_path / "run"
        )
    record = result.record
    assert record["sampling"]["merge_repeats"] is False
    assert [s["observed"] for s in record["states"]] == [[0, 0], [1, 1], [2, 2]]
    assert record["window"]["states"][-3:] == ["a red square.", "a red square.", "the square stops."]
    assert "states: 3 of 3 captions (repeats kept" in rollout_module.summary(result)


def test_the_offline_pack_reads_one_sentence_per_interval_and_other_presets_merge():
    from pipeline.presets import load_preset

    assert load_preset("offline").merge_repeats is False
    assert load_preset("hub").merge_repeats is True
    plan = make_plan(ModelChoice(preset="offline"), FrameSampling())
    assert plan.frames.merge_repeats is False
    assert make_plan(ModelChoice(preset="offline"), FrameSampling(merge_repeats=True)).frames.merge_repeats is True


def test_captions_cut_to_the_token_slots_are_warned_about(models, clip, tmp_path, monkeypatch):
    long = "a red square moves to the right of the wall and the square stops at the wall again"
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: lambda images: [long] * len(images))
    with one_torch_thread():
        record = run_rollout(clip, 1, models=choice(models), output=tmp_path / "run").record
    assert any("longer than the predictor's 16 token slots were cut" in w and long in w for w in record["warnings"])


def test_captioning_reports_progress_after_every_batch(models, clip, tmp_path):
    reports = []
    with one_torch_thread():
        run_rollout(
            clip,
            1,
            models=choice(models),
            frames=FrameSampling(num_frames=10),
            output=tmp_path / "run",
            progress=lambda fraction, message: reports.append(message),
        )
    assert [m for m in reports if m.startswith("captioned")] == [
        "captioned 8 of 10 frames",
        "captioned 10 of 10 frames",
    ]


def test_quiet_libraries_keeps_the_hub_download_bars():
    import huggingface_hub

    try:
        rollout_module.quiet_libraries()
        assert not huggingface_hub.utils.are_progress_bars_disabled()
    finally:
        huggingface_hub.utils.enable_progress_bars()


def test_renders_are_letterboxed_not_stretched_into_the_video():
    from pipeline.run_outputs import fit

    square = np.full((64, 64, 3), 255, np.uint8)
    frame = fit(square, (96, 160))
    assert frame.shape == (96, 160, 3)
    assert (frame[:, 32:128] == 255).all(), "the square kept whole and square in the middle"
    assert (frame[:, :32] == 0).all() and (frame[:, 128:] == 0).all(), "black bars either side"
    tall = fit(np.full((80, 40, 3), 255, np.uint8), (40, 40))
    assert (tall[:, 10:30] == 255).all() and (tall[:, :10] == 0).all()


def test_a_new_readout_is_one_class_and_one_config_value(models, clip, tmp_path, monkeypatch):
    """A readout registered by its class alone is chosen by `readout` in the generation settings and on the command
    line; the rollout predicts what it reads off, and an unregistered name is refused with the choices."""
    from world_model.generation import readouts

    monkeypatch.setattr(readouts, "READOUTS", dict(readouts.READOUTS))

    @readouts.register_readout
    @dataclasses.dataclass
    class Constant(readouts.Readout):
        state: torch.Tensor
        kind = "constant"

        @classmethod
        def from_folder(cls, folder, known, vocab, n_tokens):
            return cls(torch.tensor(vocab.encode(WORDS[2], n_tokens)))

        def rollout(self, model, window, steps, generation, generator, explanations=None):
            return self.state.expand(len(window), steps, -1).to(window.device)

    with one_torch_thread():
        result = run_rollout(
            clip, 2, choice(models), generation=GenerationConfig(readout="constant"), output=tmp_path / "constant"
        )
    assert [same_sentence(s, WORDS[2]) for s in result.predicted_sentences[0]] == [True, True]
    assert main([str(clip), "--out", str(tmp_path / "cli"), "--readout", "constant", *cli_models(models)]) == 0
    with pytest.raises(ValueError, match="readout must be one of auto, tokens, sentences, bank, constant, got .nope."):
        readouts.resolve_readout(models["predictor"], None, "nope", models["vocab"], 16)

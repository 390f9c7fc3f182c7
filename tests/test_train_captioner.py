import json

import numpy as np
import pytest
import torch

from encoders.captioner import HFCaptioner
from encoders.world_dataset import read_states
from pipeline.pack.captioner_model import build_captioner, save_captioner
from pipeline.pack.strip_images import augment, strip_image_processor, to_pixels, to_unit
from pipeline.pack.train_captioner import (
    BEST_DIR,
    METRICS_FILE,
    TrainConfig,
    caption_labels,
    main,
    train_step,
)
from tests.model_factories import one_torch_thread
from world_model.data.synthetic.generator import generate
from world_model.data.synthetic.scenes import FIRST_SCENE_TYPES
from world_model.data.synthetic.simulation import STRIP_SIZE
from world_model.text.vocab import tokenize
from world_model.text.word_tokenizer import build_word_tokenizer

TINY = TrainConfig(
    patch_size=12,
    encoder_hidden=32,
    encoder_layers=1,
    encoder_heads=2,
    decoder_hidden=32,
    decoder_layers=1,
    decoder_heads=2,
    batch_size=4,
    warmup_steps=1,
    val_episodes=1,
)
TINY_FLAGS = [
    "--patch-size",
    "12",
    "--encoder-hidden",
    "32",
    "--encoder-layers",
    "1",
    "--encoder-heads",
    "2",
    "--decoder-hidden",
    "32",
    "--decoder-layers",
    "1",
    "--decoder-heads",
    "2",
    "--batch-size",
    "4",
    "--warmup-steps",
    "1",
    "--val-episodes",
    "1",
]


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two training episodes (one becomes validation) and one held-out episode, 3 seconds of 48 x 48 frames."""
    root = tmp_path_factory.mktemp("world")
    generate(2, 0, root, split="train", scenes=FIRST_SCENE_TYPES, seconds=3, size=48)
    generate(1, 0, root, split="heldout", scenes=FIRST_SCENE_TYPES, seconds=3, size=48)
    return root


def test_training_run_saves_a_captioner_that_hfcaptioner_loads(world, tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "--data",
                str(world),
                "--out",
                str(out),
                "--max-steps",
                "3",
                "--eval-every",
                "2",
                "--no-progress",
                *TINY_FLAGS,
            ]
        )
        == 0
    )
    captioner = HFCaptioner.from_pretrained(out / BEST_DIR)
    heldout = read_states(world / "heldout", progress=False)
    captions = captioner(list(heldout.images))
    assert len(captions) == len(heldout) and all(isinstance(c, str) for c in captions)
    assert captioner.model.config.decoder_start_token_id == captioner.tokenizer.bos_token_id
    # an untrained decoder that never ends its caption stops at its position table, not past it
    assert captioner.max_new_tokens == captioner.model.config.decoder.n_positions - 1 < 30
    assert captioner.model.generation_config.eos_token_id == captioner.tokenizer.eos_token_id
    assert sorted(p.name for p in out.iterdir()) == [BEST_DIR, METRICS_FILE], "a temporary folder was left"

    metrics = json.loads((out / METRICS_FILE).read_text())
    assert metrics["steps"] == 3 and metrics["stop_reason"] == "max_steps"
    assert [h["step"] for h in metrics["history"]] == [2, 3]
    report = metrics["heldout"]
    assert report["strips"] == len(heldout) == 3
    assert set(report["per_scene"]) == {heldout.records[0]["scene"]}
    wrong = sum(c["count"] for c in report["confusions"])
    assert report["exact_match"] == pytest.approx(1 - wrong / 3)


def test_saved_weights_are_fp16_and_no_temporary_folder_is_left(tmp_path):
    from safetensors import safe_open

    tokenizer = build_word_tokenizer(["the red ball falls."])
    model = build_captioner(tokenizer, TINY)
    save_captioner(model, tokenizer, tmp_path / "m")
    with safe_open(tmp_path / "m" / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    assert all(f.stat().st_mode & 0o444 == 0o444 for f in (tmp_path / "m").iterdir()), "files must be world-readable"


def test_training_pixels_match_the_saved_image_processor():
    strips = np.random.default_rng(0).integers(0, 256, (2, *STRIP_SIZE, 3), dtype=np.uint8)
    processed = strip_image_processor()(images=list(strips), input_data_format="channels_last", return_tensors="pt")[
        "pixel_values"
    ]
    torch.testing.assert_close(to_pixels(to_unit(torch.from_numpy(strips))), processed)


def test_augment_perturbs_each_image_mildly_and_stays_in_range():
    strip = np.full((*STRIP_SIZE, 3), 235, np.uint8)
    strip[20:30, 10:20] = (220, 40, 40)  # a red square on the simulator's background
    unit = to_unit(torch.from_numpy(np.stack([strip] * 8)))
    out = augment(unit, torch.Generator().manual_seed(0))
    assert out.shape == unit.shape and 0 <= out.min() and out.max() <= 1
    change = (out - unit).abs().flatten(1).mean(1)
    assert (change > 0.002).all() and (change < 0.12).all()
    assert len({round(c, 4) for c in change.tolist()}) == 8, "every image should get its own perturbation"
    red = out[:, :, 22:28, 12:18].mean(dim=(2, 3))  # the square's inside stays clearly red
    assert (red[:, 0] > red[:, 1] + 0.4).all() and (red[:, 0] > red[:, 2] + 0.4).all()


def test_labels_end_with_eos_and_pad_with_the_ignore_index():
    tokenizer = build_word_tokenizer(["the ball falls.", "the box slides toward the wall."])
    labels = caption_labels(tokenizer, ["the ball falls.", "the box slides toward the wall."])
    eos = tokenizer.eos_token_id
    assert labels.shape == (2, 8)
    assert (
        tokenizer.decode(labels[0, :4]) == "the ball falls." and labels[0, 4] == eos and (labels[0, 5:] == -100).all()
    )
    assert tokenizer.decode(labels[1, :7]) == "the box slides toward the wall." and labels[1, 7] == eos


def test_overfit_captioner_reproduces_each_strips_exact_sentence(world, tmp_path):
    """Two strips with different sentences: after a short overfit the saved model, loaded through
    HFCaptioner, captions each with exactly its own sentence (catches label-shift, start/end-token and
    image-conditioning bugs)."""
    states = read_states(world / "train", progress=False)
    first, second = 0, next(i for i, s in enumerate(states.sentences) if tokenize(s) != tokenize(states.sentences[0]))
    sentences = [states.sentences[first], states.sentences[second]]
    tokenizer = build_word_tokenizer(states.sentences)
    model = build_captioner(tokenizer, TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pixels = to_pixels(to_unit(torch.from_numpy(states.images[[first, second]])))
    labels = caption_labels(tokenizer, sentences)
    for _ in range(150):
        loss = train_step(model, optimizer, pixels, labels)
    assert loss < 0.05
    save_captioner(model, tokenizer, tmp_path / "overfit")
    captioner = HFCaptioner.from_pretrained(tmp_path / "overfit")
    assert captioner([states.images[first], states.images[second]]) == sentences


def test_a_run_can_start_from_an_earlier_runs_weights_and_refuses_other_words(world, tmp_path, capsys, monkeypatch):
    import pipeline.pack.train_captioner as trainer

    first, second = tmp_path / "first", tmp_path / "second"
    flags = ["--data", str(world), "--max-steps", "2", "--eval-every", "2", "--no-progress", *TINY_FLAGS]
    assert main(["--out", str(first), *flags]) == 0
    started = {}
    fit = trainer.fit

    def recording_fit(model, *args, **kwargs):
        started.update({n: t.clone() for n, t in model.state_dict().items()})
        return fit(model, *args, **kwargs)

    monkeypatch.setattr(trainer, "fit", recording_fit)
    assert main(["--out", str(second), "--init-from", str(first / BEST_DIR), *flags]) == 0
    saved = HFCaptioner.from_pretrained(first / BEST_DIR).model.state_dict()
    assert started.keys() == saved.keys()
    assert all(torch.equal(started[n], saved[n].float()) for n in saved)  # it started where the first ended
    assert json.loads((second / METRICS_FILE).read_text())["init_from"] == str(first / BEST_DIR)

    other = tmp_path / "other"
    words = build_word_tokenizer(["a green box."])
    save_captioner(build_captioner(words, TINY), words, other)
    capsys.readouterr()
    assert main(["--out", str(tmp_path / "third"), "--init-from", str(other), *flags]) == 2
    assert "its words differ from those of the training sentences" in capsys.readouterr().err

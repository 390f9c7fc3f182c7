"""Synthetic-world sentence windows, training on them, multi-step rollouts and their accuracy."""

import copy
import json
from pathlib import Path

import pytest
import torch

from world_model.data.rocstories import DataError
from world_model.data.synthetic import generator
from world_model.data.synthetic.episodes import (
    data_kind,
    episode_sentences,
    known_sentences,
    load_world_windows,
    read_episodes,
    sentence_windows,
)
from world_model.data.synthetic.sentences import (
    copy_last_predictions,
    main,
    next_state_accuracy,
    observed_and_future,
    predict_ahead,
)
from world_model.models.registry import build_model, load_model, load_predictor
from world_model.text.vocab import Vocabulary, tokenize
from world_model.training.config import load_config
from world_model.training.train import train

REPO = Path(__file__).resolve().parents[1]
SECONDS = 6
TINY_MODEL = {"d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "dropout": 0.5, "n_tokens": 16, "n_states": 3}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world")
    generator.generate(3, 0, root, seconds=SECONDS, fps=2, size=32)
    generator.generate(2, 0, root, split="heldout", seconds=SECONDS, fps=2, size=32)
    return root


def tiny_model(model_type: str, vocab: Vocabulary, seed: int = 0):
    torch.manual_seed(seed)
    return build_model({"type": model_type, **TINY_MODEL}, len(vocab))


def test_one_window_per_predicted_second(world):
    records = read_episodes(world / "train")
    vocab, stats, train_windows, val_windows = load_world_windows(world, n_states=3, n_tokens=16)
    # 3 episodes: the last one is validation; seconds 1..5 of each are the targets of windows of 3 + 1 sentences
    assert train_windows.shape == (2 * (SECONDS - 1), 4, 16) and val_windows.shape == (SECONDS - 1, 4, 16)
    assert (stats["train_episodes"], stats["validation_episodes"], stats["vocab_size"]) == (2, 1, len(vocab))
    sentences = [episode_sentences(r) for r in records]
    assert set(vocab.itos[2:]) == {t for s in sentences for text in s for t in tokenize(text)}
    for i, window in enumerate(train_windows):
        episode, target = divmod(i, SECONDS - 1)
        target += 1
        expected = [""] * max(0, 3 - target) + sentences[episode][
            max(0, target - 3) : target + 1
        ]  # left-padded at the start
        assert [tokenize(vocab.decode(row)) for row in window] == [tokenize(s) for s in expected]
    assert tokenize(vocab.decode(val_windows[-1, -1])) == tokenize(sentences[2][-1])
    assert stats["validation_last_sentence_tokens"] == sum(len(tokenize(s)) for s in sentences[2][1:])
    # a subset keeps the first training episodes; validation does not move
    _, _, subset, val_again = load_world_windows(world, n_states=3, n_tokens=16, train_subset=1)
    assert torch.equal(subset, train_windows[: SECONDS - 1]) and torch.equal(val_again, val_windows)


def test_sentence_windows_pad_the_first_states_and_skip_one_sentence_episodes():
    vocab = Vocabulary.build(["a b.", "c d e.", "f."])
    windows = sentence_windows([["a b.", "c d e.", "f."], ["a b."]], vocab, n_states=2, n_tokens=4)
    assert windows.shape == (2, 3, 4)
    assert [vocab.decode(row) for row in windows.reshape(-1, 4)] == ["", "a b.", "c d e.", "a b.", "c d e.", "f."]
    assert (
        windows[0, 0].tolist() == [0, 0, 0, 0] and windows[0, 1].tolist()[3] == 0
    )  # empty state; "a b ." right-padded
    assert sentence_windows([["a b."]], vocab, n_states=2, n_tokens=4).shape == (0, 3, 4)


def test_data_kind_is_read_off_the_folder(world, tmp_path):
    assert data_kind(world) == "world"
    (tmp_path / "cloze_test_val.csv").write_text("x\n")
    assert data_kind(tmp_path) == "rocstories"
    with pytest.raises(DataError, match="pass its parent"):
        data_kind(world / "train")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="no training data.*episodes.jsonl.*ROCStories"):
        data_kind(tmp_path / "nothing")
    (world / "ROCStories_x.csv").touch()
    try:
        with pytest.raises(DataError, match="both"):
            data_kind(world)
    finally:
        (world / "ROCStories_x.csv").unlink()
    with pytest.raises(DataError, match="no such folder"):
        data_kind(tmp_path / "missing")


def test_bad_episode_files_are_refused(tmp_path):
    split = tmp_path / "train"
    split.mkdir()
    with pytest.raises(DataError, match="episodes.jsonl"):
        read_episodes(split)
    (split / "episodes.jsonl").write_text(
        json.dumps({"sentences": [{"second": 1, "text": "a."}], "video": "x.mp4"}) + "\n"
    )
    with pytest.raises(DataError, match="line 1"):
        read_episodes(split)
    (split / "episodes.jsonl").write_text(
        json.dumps({"sentences": [{"second": 0, "text": "a."}], "video": "x.mp4"}) + "\n"
    )
    with pytest.raises(DataError, match="at least 2 training episodes"):
        load_world_windows(tmp_path, n_states=3, n_tokens=16)


def test_accuracy_per_step_after_normalising():
    predictions = [["The ball falls.", "the ball rests on the floor."], ["the box slides.", "the box stops."]]
    truths = [["the ball  falls .", "the ball bounces off the floor."], ["the box slides.", "THE BOX STOPS."]]
    assert next_state_accuracy(predictions, truths) == [1.0, 0.5]
    assert next_state_accuracy([["a."]], [["b."]]) == [0.0]
    with pytest.raises(ValueError, match="truth rows"):
        next_state_accuracy(predictions, truths[:1])
    with pytest.raises(ValueError, match="row"):
        next_state_accuracy([["a.", "b."], ["a."]], [["a.", "b."], ["a.", "b."]])


def test_copy_last_and_observed_future(world):
    contexts, futures = observed_and_future(read_episodes(world / "heldout"), observed=3, steps=2)
    records = read_episodes(world / "heldout")
    assert contexts[1] == episode_sentences(records[1])[:3] and futures[1] == episode_sentences(records[1])[3:5]
    copies = copy_last_predictions(contexts, 2)
    assert copies[0] == [contexts[0][2]] * 2
    stays = [float(f[0] == c[-1]) for c, f in zip(contexts, futures)]
    assert next_state_accuracy(copies, futures)[0] == sum(stays) / len(stays)
    with pytest.raises(ValueError, match="fewer than"):
        observed_and_future(records, observed=3, steps=SECONDS)


@pytest.mark.parametrize("model_type", ["four_tensor", "baseline"])
def test_predict_ahead_rolls_out_every_context(world, model_type):
    vocab, _, _, _ = load_world_windows(world, n_states=3, n_tokens=16)
    model = tiny_model(model_type, vocab).train()
    contexts, _ = observed_and_future(read_episodes(world / "train"), observed=4, steps=1)
    contexts = contexts + [contexts[0][-1:]]  # a context shorter than the window is left-padded
    predictions = predict_ahead(model, vocab, contexts, steps=3, batch_size=2)
    assert len(predictions) == len(contexts) and all(len(p) == 3 for p in predictions)
    words = set(tokenize(" ".join(vocab.itos)))  # an untrained baseline may also end at once or emit <unk>
    assert all(isinstance(s, str) and set(tokenize(s)) <= words for p in predictions for s in p)
    assert model.training  # the mode is restored, and dropout was off: the same call gives the same rollout
    assert predict_ahead(model, vocab, contexts, steps=3) == predictions
    # only the last n_states = 3 sentences form the window; batching does not change a row
    assert predict_ahead(model, vocab, [contexts[0][1:]], steps=3) == predictions[:1]
    assert [predict_ahead(model, vocab, [c], steps=2)[0] for c in contexts] == [p[:2] for p in predictions]
    with pytest.raises(ValueError, match="hold no sentence"):
        predict_ahead(model, vocab, [[]], steps=1)


@pytest.mark.parametrize("name", ["synthetic", "synthetic_baseline"])
def test_train_runs_one_epoch_on_world_episodes(world, tmp_path, name):
    config = load_config(REPO / "configs" / "world_model" / f"{name}.yaml")
    small = copy.deepcopy(config)
    small["model"].update(d_x=4, d_t=2, n_heads=2, n_layers=1)
    small["training"].update(batch_size=4, eval_batch_size=4)
    summary = train(small, world, tmp_path / "run", max_epochs=1, progress=False)
    assert (summary["last_epoch"], summary["train_windows"], summary["validation_windows"]) == (1, 10, 5)
    model = load_model(tmp_path / "run" / "best")
    vocab = Vocabulary.load(tmp_path / "run" / "best")
    assert model.config.to_dict()["model_type"] == config["model"]["type"]
    assert vocab.itos == load_world_windows(world, n_states=3, n_tokens=16)[0].itos
    contexts, _ = observed_and_future(read_episodes(world / "heldout"), observed=3, steps=2)
    assert [len(p) for p in predict_ahead(model, vocab, contexts, steps=2)] == [2, 2]
    # The world's sentences travel with the checkpoint, and the closed-set readout predicts only them.
    train_sentences = {s for r in read_episodes(world / "train") for s in episode_sentences(r)}
    saved = load_predictor(tmp_path / "run" / "best")
    assert len(saved.known_sentences) == len(train_sentences) == len(known_sentences(world))
    assert load_predictor(tmp_path / "run" / "last" / "model").known_sentences.shape == saved.known_sentences.shape
    closed = predict_ahead(model, vocab, contexts, steps=2, candidates=saved.known_sentences)
    assert all(s in train_sentences for p in closed for s in p)


def test_train_names_both_layouts_when_the_folder_holds_neither(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match="synthetic world.*ROCStories"):
        train(
            load_config(REPO / "configs/world_model/synthetic.yaml"),
            tmp_path / "data",
            tmp_path / "out",
            progress=False,
        )
    assert not (tmp_path / "out").exists()


def test_scoring_command_reports_each_checkpoint_beside_copy_last_and_the_ceiling(world, tmp_path, capsys):
    vocab, _, _, _ = load_world_windows(world, n_states=3, n_tokens=16)
    model = tiny_model("four_tensor", vocab)
    model.save_pretrained(tmp_path / "known", vocab=vocab, known_sentences=known_sentences(world))
    model.save_pretrained(tmp_path / "free", vocab=vocab)
    argv = [
        "--checkpoint",
        str(tmp_path / "known"),
        str(tmp_path / "free"),
        "--data",
        str(world / "heldout"),
        "--episodes",
        "2",
        "--observe",
        "3",
        "--steps",
        "2",
        "--json",
        str(tmp_path / "scores.json"),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    scores = json.loads((tmp_path / "scores.json").read_text())
    records = read_episodes(world / "heldout")
    contexts, futures = observed_and_future(records, observed=3, steps=2)
    known = load_predictor(tmp_path / "known").known_sentences
    expected = next_state_accuracy(predict_ahead(model, vocab, contexts, 2, candidates=known), futures)
    assert scores["predictors"][str(tmp_path / "known")]["accuracy"] == expected
    assert scores["predictors"][str(tmp_path / "free")]["readout"] == "tokens"
    assert scores["predictors"]["copy the last state"]["accuracy"] == next_state_accuracy(
        copy_last_predictions(contexts, 2), futures
    )
    assert scores["ceiling"]["accuracy"][0] == pytest.approx(sum(r["next"][2]["best_p"] for r in records) / 2)
    assert f"| {tmp_path / 'known'} | sentences ({len(known)} known) |" in table and "| ceiling |" in table
    assert main(argv[:3] + ["--data", str(tmp_path / "nowhere")]) == 2

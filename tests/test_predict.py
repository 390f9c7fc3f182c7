"""The text-level prediction command on a tiny checkpoint saved by the test."""

import json

import pytest
import torch

from world_model.generation.predict import main, predict
from world_model.models.decoding import write_known_sentences
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig
from world_model.text.vocab import Vocabulary


def tiny_checkpoint(folder):
    vocab = Vocabulary.build(["tom was hungry .", "he went to the kitchen .", "he ate a sandwich !"])
    torch.manual_seed(0)
    FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
        folder, vocab=vocab
    )
    return folder


def test_predict_rolls_out_from_sentences(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    result = predict(["Tom was hungry.", "He went to the kitchen"], ckpt, steps=3)
    assert result["window"] == ["", "", "Tom was hungry.", "He went to the kitchen."]
    assert len(result["predictions"]) == 1 and len(result["predictions"][0]) == 3
    assert all(isinstance(s, str) and "<unk>" not in s for s in result["predictions"][0])
    sampled = predict(["Tom was hungry."], ckpt, 2, GenerationConfig(samples=4, temperature=2.0, seed=3))
    assert sampled == predict(["Tom was hungry."], ckpt, 2, GenerationConfig(samples=4, temperature=2.0, seed=3))
    assert len(sampled["predictions"]) == 4 and len({tuple(p) for p in sampled["predictions"]}) > 1


def test_predict_cli_json_and_errors(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    assert main(["--checkpoint", str(ckpt), "--json", "Tom ate a zebra."]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unknown_words"] == ["zebra"]
    assert main(["--checkpoint", str(tmp_path / "missing"), "Tom."]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_known_sentences_in_the_checkpoint_restrict_every_step(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    assert main(["--checkpoint", str(ckpt), "--readout", "sentences", "Tom was hungry."]) == 2
    assert "known_sentences.txt" in capsys.readouterr().err
    write_known_sentences(ckpt, ["he ate a sandwich !", "tom was hungry ."])
    result = predict(["Tom was hungry."], ckpt, 3, GenerationConfig(samples=6, temperature=5.0, seed=0))
    assert result["readout"] == "sentences"
    said = {s for p in result["predictions"] for s in p}
    assert said <= {"he ate a sandwich!", "tom was hungry."} and len(said) == 2, said
    assert predict(["Tom was hungry."], ckpt, 1, GenerationConfig(readout="tokens"))["readout"] == "tokens"


def test_empty_sentences_and_unbounded_steps_are_refused_before_loading(tmp_path, capsys):
    from world_model.generation.predict import MAX_SAMPLES, MAX_STEPS

    missing = str(tmp_path / "never-read")  # checked after the request: a refusal must not need it
    for args, says in (
        (["", "--steps", "1"], "sentence 1 is empty"),
        (["Tom.", " ,, "], "sentence 2 is empty"),
        (["Tom.", "--steps", str(MAX_STEPS + 1)], f"between 1 and {MAX_STEPS}"),
        (["Tom.", "--steps", "0"], f"between 1 and {MAX_STEPS}"),
        (["Tom.", "--samples", str(MAX_SAMPLES + 1)], f"between 1 and {MAX_SAMPLES}"),
    ):
        assert main(["--checkpoint", missing, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1


def test_a_sentence_longer_than_the_slots_is_truncated_with_a_warning(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    long = " ".join(["tom was hungry"] * 700) + "."  # 2,101 tokens
    assert main(["--checkpoint", str(ckpt), "Tom was hungry.", long]) == 0
    err = capsys.readouterr().err
    assert err == "warning: sentence 2 has 2101 tokens; the predictor reads only its first 16\n"
    assert predict(["Tom was hungry."], ckpt)["warnings"] == []


def test_explain_prints_probabilities_alternatives_and_the_sentence_drawn_on(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    write_known_sentences(ckpt, ["he ate a sandwich !", "tom was hungry .", "he went to the kitchen ."])
    sentences = ["Tom was hungry.", "He went to the kitchen.", "He ate a sandwich!", "Tom was hungry.", "Tom ate."]
    assert main(["--checkpoint", str(ckpt), "--steps", "2", "--explain", *sentences]) == 0
    printed = capsys.readouterr().out
    assert printed.count("  (p=") == 2 and printed.count("      or ") == 4, "two alternatives per step"
    assert printed.count("drew on most: ") == 2
    result = predict(sentences, ckpt, 2)
    first = result["explanations"][0][0]
    assert [s["index"] for s in first["attention"]] == [1, 2, 3, 4], "the last four of five observed sentences"
    named = first["drew_on"]
    assert f'drew on most: observed sentence {named["index"] + 1} "{named["text"]}"' in printed
    probabilities = [first["probability"]] + [a["probability"] for a in first["alternatives"]]
    assert probabilities[1] >= probabilities[2] and sum(probabilities) == pytest.approx(1, abs=1e-3), "all 3 listed"
    quiet = predict(sentences, ckpt, 2, GenerationConfig(explanations=False))
    assert quiet["explanations"] == [None] and quiet["predictions"] == result["predictions"]

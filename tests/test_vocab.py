"""Tokenizer and vocabulary: ids, padding, unknown words, decoding and the vocab.json file."""

import json

import pytest
import torch

from world_model.text.vocab import (
    PAD_ID,
    UNK_ID,
    UnknownWordError,
    Vocabulary,
    detokenize,
    tokenize,
)

SENTENCES = ["The dog ran.", "The cat sat!", "The dog sat?"]


@pytest.fixture
def vocab() -> Vocabulary:
    # counts: the 3, dog 2, sat 2, then cat . ! ? ran once each
    return Vocabulary.build(SENTENCES)


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("Tom didn't go.", ["tom", "didn't", "go", "."]),
        ("An ice-cream, please!", ["an", "ice-cream", ",", "please", "!"]),
        ('She said "hi" (twice)...', ["she", "said", '"', "hi", '"', "(", "twice", ")", ".", ".", "."]),
        ("It cost $5.50 at 3pm", ["it", "cost", "$", "5", ".", "50", "at", "3pm"]),
        ("Bob's  dog -- 'Rex'", ["bob's", "dog", "-", "-", "'", "rex", "'"]),
        ("   ", []),
    ],
)
def test_tokenize_examples(text, tokens):
    assert tokenize(text) == tokens


def test_detokenize_attaches_punctuation():
    assert detokenize(["tom", "went", "home", "."]) == "tom went home."
    assert detokenize(["yes", ",", "it", "costs", "$", "5", "(", "now", ")", "!"]) == "yes, it costs $5 (now)!"
    assert detokenize([]) == ""


def test_ids_are_ordered_by_frequency_then_alphabet(vocab):
    assert vocab.itos == ["<pad>", "<unk>", "the", "dog", "sat", "!", ".", "?", "cat", "ran"]
    assert all(vocab.stoi[t] == i for i, t in enumerate(vocab.itos))
    assert Vocabulary.build(reversed(SENTENCES)).itos == vocab.itos


def test_min_freq_drops_rare_words():
    assert Vocabulary.build(SENTENCES, min_freq=2).itos == ["<pad>", "<unk>", "the", "dog", "sat"]
    with pytest.raises(ValueError):
        Vocabulary.build(SENTENCES, min_freq=0)


def test_lookup_helpers(vocab):
    assert len(vocab) == 10
    assert "dog" in vocab and "cow" not in vocab
    assert vocab.token_to_id("dog") == 3
    assert vocab.token_to_id("cow") == UNK_ID
    assert vocab.end_ids == (6, 5, 7)  # ".", "!", "?"
    assert Vocabulary.build(["no end mark"]).end_ids == ()


def test_encode_pads_and_truncates_to_n(vocab):
    assert vocab.encode("The dog ran.", n=6) == [2, 3, 9, 6, PAD_ID, PAD_ID]
    assert vocab.encode("The dog ran.", n=2) == [2, 3]
    assert len(vocab.encode("the " * 40)) == 16
    with pytest.raises(ValueError):
        vocab.encode("the dog", n=0)


def test_unknown_words_map_to_unk_or_raise(vocab):
    assert vocab.encode("The cow ran.", n=5) == [2, UNK_ID, 9, 6, PAD_ID]
    with pytest.raises(UnknownWordError) as info:
        vocab.encode("The cow ate hay.", strict=True)
    assert info.value.words == ("ate", "cow", "hay")
    assert "'cow'" in str(info.value) and "'hay'" in str(info.value)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert vocab.encode("The dog ran.", n=4, strict=True) == [2, 3, 9, 6]


def test_encode_batch_shape_and_rows(vocab):
    ids = vocab.encode_batch(["the cat sat.", "dog"], n=5)
    assert ids.dtype == torch.long and ids.shape == (2, 5)
    assert ids.tolist() == [[2, 8, 4, 6, 0], [3, 0, 0, 0, 0]]
    assert vocab.encode_batch([], n=5).shape == (0, 5)


def test_encode_with_stats_counts_oov_and_truncation(vocab):
    ids, stats = vocab.encode_with_stats(["the cow sat.", "the dog the dog the dog", "hay"], n=4)
    assert ids.tolist()[2] == [UNK_ID, 0, 0, 0]
    # kept tokens: 4 + 4 (truncated from 6) + 1; unknown: cow, hay
    assert stats == {"tokens": 9, "unknown": 2, "oov_rate": pytest.approx(2 / 9), "truncated": 1}
    assert vocab.encode_with_stats([], n=4)[1]["oov_rate"] == 0.0


def test_decode_round_trip(vocab):
    text = "the dog sat!"
    assert vocab.decode(vocab.encode(text)) == text
    assert vocab.decode(torch.tensor(vocab.encode("The cow ran."))) == "the <unk> ran."
    assert vocab.decode([0, 2, 0, 3]) == "the dog"  # padding is skipped, not a stop


@pytest.mark.parametrize("bad", [[2, 10], [-1], torch.tensor([99])])
def test_decode_rejects_out_of_range_ids(vocab, bad):
    with pytest.raises(ValueError, match=r"-1|10|99"):
        vocab.decode(bad)


def test_decode_rejects_non_1d_or_float_tensors(vocab):
    with pytest.raises(ValueError):
        vocab.decode(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        vocab.decode(torch.tensor([2.0, 3.0]))


def test_save_load_round_trip(vocab, tmp_path):
    written = vocab.save(tmp_path / "model")
    assert written == tmp_path / "model" / "vocab.json"
    payload = json.loads(written.read_text())
    assert payload == {"format": "word-level", "itos": vocab.itos, "pad_id": 0, "unk_id": 1}
    for source in (tmp_path / "model", written):
        loaded = Vocabulary.load(source)
        assert loaded.itos == vocab.itos and loaded.stoi == vocab.stoi
    assert [p.name for p in written.parent.iterdir()] == ["vocab.json"]  # no temp file left


def test_save_to_json_path_replaces_existing_file(vocab, tmp_path):
    target = tmp_path / "custom.json"
    target.write_text("old")
    assert vocab.save(target) == target
    assert Vocabulary.load(target).itos == vocab.itos


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"format": "word-level", "itos": ["<pad>", "<unk>"], "pad_id": 0}', "unk_id"),
        ('{"format": "bpe", "itos": ["<pad>", "<unk>"], "pad_id": 0, "unk_id": 1}', "format"),
        ('{"format": "word-level", "itos": ["<pad>", "<unk>"], "pad_id": 1, "unk_id": 0}', "pad_id"),
        ('{"format": "word-level", "itos": ["<unk>", "<pad>", "a"], "pad_id": 0, "unk_id": 1}', "must start"),
        ('{"format": "word-level", "itos": ["<pad>", "<unk>", "a", "b", "a"], "pad_id": 0, "unk_id": 1}', "duplicate"),
        ('{"format": "word-level", "itos": ["<pad>", "<unk>", 3], "pad_id": 0, "unk_id": 1}', "list of strings"),
    ],
)
def test_load_rejects_corrupt_files(tmp_path, content, message):
    path = tmp_path / "vocab.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        Vocabulary.load(tmp_path)
    assert str(path) in str(info.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocab.json"):
        Vocabulary.load(tmp_path)


def test_same_sentence_ignores_case_and_spacing_only():
    from world_model.text.vocab import same_sentence

    assert same_sentence("The ball falls.", "the ball  falls .")
    assert not same_sentence("the ball falls.", "the ball falls!")
    assert not same_sentence("the ball falls.", "the ball rises.")

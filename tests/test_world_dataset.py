"""The offline pack's shared pieces: state strips decoded from generated clips, and the word-level tokenizer."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from encoders.world_dataset import read_states
from world_model.data.synthetic.generator import generate
from world_model.data.synthetic.simulation import STATE_FRAMES, simulate
from world_model.text.word_tokenizer import SPECIAL_TOKENS, build_word_tokenizer


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    generate(3, seed=4, out_dir=out, seconds=3, size=48)
    return out / "train"


def test_each_second_becomes_one_strip_of_its_three_frames(split):
    states = read_states(split, size=(48, 144), progress=False)
    assert states.images.shape == (9, 48, 144, 3) and states.images.dtype == np.uint8
    assert states.second.tolist() == [0, 1, 2] * 3 and states.episode.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    record = states.records[1]
    assert states.sentences[3:6] == [s["text"] for s in record["sentences"]]
    frames = simulate(record["seed"], seconds=3).frames(48)  # 12 fps: a strip shows frames 0, 6, 11 of its second
    expected = np.concatenate([frames[12 + k] for k in (0, 6, 11)], axis=1)
    assert STATE_FRAMES == 3
    assert np.abs(states.images[4].astype(int) - expected).mean() < 6  # only H.264 losses


def test_limit_and_a_missing_index_file(split, tmp_path):
    assert len(read_states(split, limit=1, progress=False)) == 3
    with pytest.raises(FileNotFoundError, match="episodes.jsonl"):
        read_states(tmp_path, progress=False)


def test_word_tokenizer_round_trips_and_survives_save_and_load(tmp_path):
    sentences = ["the large red ball falls toward the floor.", "a person walks into the elevator on floor two."]
    tokenizer = build_word_tokenizer(sentences)
    ids = tokenizer(sentences[0])["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "the",
        "large",
        "red",
        "ball",
        "falls",
        "toward",
        "the",
        "floor",
        ".",
    ]
    assert tokenizer.convert_ids_to_tokens(list(range(4))) == list(SPECIAL_TOKENS)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.decode([loaded.bos_token_id, *ids, loaded.eos_token_id], skip_special_tokens=True) == sentences[0]
    assert loaded("The Green ball")["input_ids"] == [ids[0], loaded.unk_token_id, ids[3]]

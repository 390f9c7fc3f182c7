"""ROCStories readers, folder discovery, windows and corpus statistics on tiny CSV fixtures."""

import csv
import json
import logging
import math
from pathlib import Path

import pytest
import torch

from world_model.data.rocstories import (
    CLOZE_COLUMNS,
    TRAIN_COLUMNS,
    DataError,
    RocStoriesCorpus,
    Story,
    build_vocabulary,
    corpus_statistics,
    encode_windows,
    find_split_files,
    load_corpus,
    main,
    read_cloze_csv,
    read_training_csv,
)
from world_model.text.vocab import PAD_ID

TRAIN_NAME = "ROCStories__spring2016 - ROCStories_spring2016.csv"
WINTER_NAME = "ROCStories_winter2017 - ROCStories_winter2017.csv"
VAL_NAME = "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
TEST_NAME = "cloze_test_test__spring2016 - cloze_test_ALL_test.csv"

TRAIN_ROWS = [
    ["t1", "Dogs", "Tom had a dog.", "The dog ran.", "Tom ran too.", "They sat.", "Tom was happy."],
    ["t2", "Cats", "Ann had a cat.", "The cat sat.", "Ann sat too.", "It rained.", "Ann was sad!"],
]
CLOZE_ROWS = [
    ["c1", "Bob went out.", "Bob saw a dog.", "The dog ran.", "Bob ran.", "Bob was happy.", "Bob ate fish.", "1"],
    ["c2", "Sue went out.", "Sue saw a cat.", "The cat sat.", "Sue sat.", "Sue flew away.", "Sue was calm.", "2"],
]


def write_csv(path: Path, header, rows, bom: bool = False) -> Path:
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def make_folder(root: Path) -> Path:
    write_csv(root / TRAIN_NAME, TRAIN_COLUMNS, TRAIN_ROWS)
    write_csv(root / VAL_NAME, CLOZE_COLUMNS, CLOZE_ROWS[:1])
    write_csv(root / TEST_NAME, CLOZE_COLUMNS, CLOZE_ROWS[1:])
    return root


def test_read_training_csv_official_layout(tmp_path):
    stories = read_training_csv(write_csv(tmp_path / TRAIN_NAME, TRAIN_COLUMNS, TRAIN_ROWS, bom=True))
    assert stories == [Story(row[0], tuple(row[2:])) for row in TRAIN_ROWS]


def test_read_training_csv_keeps_quoted_commas_and_strips_spaces(tmp_path):
    row = ["t9", "Title", " Tom, Ann and Bob met. ", "b.", "c.", "d.", "e."]
    (story,) = read_training_csv(write_csv(tmp_path / "r.csv", TRAIN_COLUMNS, [row]))
    assert story.sentences[0] == "Tom, Ann and Bob met."


def test_read_cloze_csv_picks_the_right_ending(tmp_path):
    stories = read_cloze_csv(write_csv(tmp_path / VAL_NAME, CLOZE_COLUMNS, CLOZE_ROWS, bom=True))
    assert [s.story_id for s in stories] == ["c1", "c2"]
    assert stories[0].sentences == ("Bob went out.", "Bob saw a dog.", "The dog ran.", "Bob ran.", "Bob was happy.")
    assert stories[1].sentences[:4] == ("Sue went out.", "Sue saw a cat.", "The cat sat.", "Sue sat.")
    assert stories[1].sentences[4] == "Sue was calm."


@pytest.mark.parametrize("answer", ["0", "3", "x"])
def test_read_cloze_csv_rejects_bad_answer(tmp_path, answer):
    rows = [CLOZE_ROWS[0], CLOZE_ROWS[1][:-1] + [answer]]
    path = write_csv(tmp_path / VAL_NAME, CLOZE_COLUMNS, rows)
    with pytest.raises(DataError, match=r"row 3.*AnswerRightEnding") as info:
        read_cloze_csv(path)
    assert VAL_NAME in str(info.value)


def test_missing_columns_are_named(tmp_path):
    header = [c for c in TRAIN_COLUMNS if c not in ("sentence3", "storyid")]
    path = write_csv(tmp_path / TRAIN_NAME, header, [row[1:4] + row[5:] for row in TRAIN_ROWS])
    with pytest.raises(DataError, match=r"missing column\(s\) \['storyid', 'sentence3'\]"):
        read_training_csv(path)
    # a training file is not a cloze file
    with pytest.raises(DataError, match="InputStoryid"):
        read_cloze_csv(write_csv(tmp_path / "t.csv", TRAIN_COLUMNS, TRAIN_ROWS))


def test_empty_and_header_only_files(tmp_path):
    empty = tmp_path / TRAIN_NAME
    empty.write_text("")
    with pytest.raises(DataError, match="empty") as info:
        read_training_csv(empty)
    assert str(empty) in str(info.value)
    with pytest.raises(DataError, match="no stories"):
        read_training_csv(write_csv(tmp_path / "h.csv", TRAIN_COLUMNS, []))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_training_csv(tmp_path / "nope.csv")


def test_empty_sentence_names_row_and_column(tmp_path):
    rows = [TRAIN_ROWS[0], TRAIN_ROWS[1][:4] + ["   "] + TRAIN_ROWS[1][5:]]
    with pytest.raises(DataError, match=r"row 3: empty value in column\(s\) \['sentence3'\]"):
        read_training_csv(write_csv(tmp_path / TRAIN_NAME, TRAIN_COLUMNS, rows))


def test_short_and_long_rows_are_rejected(tmp_path):
    with pytest.raises(DataError, match=r"row 2: empty value in column\(s\) \['sentence5'\]"):
        read_training_csv(write_csv(tmp_path / "a.csv", TRAIN_COLUMNS, [TRAIN_ROWS[0][:-1]]))
    with pytest.raises(DataError, match="row 2: more fields"):
        read_training_csv(write_csv(tmp_path / "b.csv", TRAIN_COLUMNS, [TRAIN_ROWS[0] + ["extra"]]))


def test_find_split_files_sorted(tmp_path):
    make_folder(tmp_path)
    write_csv(tmp_path / WINTER_NAME, TRAIN_COLUMNS, TRAIN_ROWS)
    (tmp_path / "notes.csv").write_text("x")
    files = find_split_files(tmp_path)
    assert [p.name for p in files["train"]] == [TRAIN_NAME, WINTER_NAME]
    assert [p.name for p in files["validation"]] == [TEST_NAME, VAL_NAME]


def test_find_split_files_errors_name_folder_and_expected_files(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        find_split_files(tmp_path / "absent")
    write_csv(tmp_path / TRAIN_NAME, TRAIN_COLUMNS, TRAIN_ROWS)
    with pytest.raises(DataError, match="no validation file") as info:
        find_split_files(tmp_path)
    assert str(tmp_path) in str(info.value) and VAL_NAME in str(info.value)
    (tmp_path / TRAIN_NAME).unlink()
    write_csv(tmp_path / VAL_NAME, CLOZE_COLUMNS, CLOZE_ROWS)
    with pytest.raises(DataError, match="no train file"):
        find_split_files(tmp_path)
    assert [p.name for p in find_split_files(tmp_path, ("validation",))["validation"]] == [
        VAL_NAME
    ]  # only what is asked for


def test_load_corpus_drops_duplicate_training_ids(tmp_path, caplog):
    make_folder(tmp_path)
    duplicate = ["t1", "Again", "x.", "x.", "x.", "x.", "x."]
    write_csv(tmp_path / WINTER_NAME, TRAIN_COLUMNS, [duplicate, ["t3", "New", "a.", "b.", "c.", "d.", "e."]])
    with caplog.at_level(logging.WARNING):
        corpus = load_corpus(tmp_path)
    assert [s.story_id for s in corpus.train] == ["t1", "t2", "t3"]
    assert corpus.train[0].sentences[0] == "Tom had a dog."  # first occurrence kept
    assert [s.story_id for s in corpus.validation] == ["c2", "c1"]  # test file sorts before val
    assert "dropped 1 duplicate" in caplog.text


def test_story_requires_five_sentences():
    with pytest.raises(ValueError, match="4 sentences"):
        Story("s", ("a", "b", "c", "d"))


def test_vocabulary_covers_validation_and_windows(tmp_path):
    corpus = load_corpus(make_folder(tmp_path))
    vocab = build_vocabulary(corpus)
    assert "fish" not in vocab  # wrong ending is not part of the pool
    assert "calm" in vocab and "happy" in vocab  # validation-only words are
    windows = encode_windows(corpus.train + corpus.validation, vocab)
    assert windows.dtype == torch.long and windows.shape == (4, 5, 16)
    assert vocab.decode(windows[0, 0]) == "tom had a dog."
    assert vocab.decode(windows[2, 4]) == "sue was calm."  # validation: c2 from the test file
    assert windows[0, 0, 5:].eq(PAD_ID).all() and windows[0, 0, :5].ne(PAD_ID).all()
    assert encode_windows(corpus.validation, vocab, n=3).shape == (2, 5, 3)


def test_corpus_statistics_hand_checked():
    train = [
        Story("a", ("one two three four five", "x", "x y", "x", "x")),
        Story("b", ("x", "x", "x", "x", "y y y")),
    ]
    validation = [Story("v", ("x", "x", "x", "x", "a b c d e f"))]
    corpus = RocStoriesCorpus(train=train, validation=validation)
    vocab = build_vocabulary(corpus)
    stats = corpus_statistics(corpus, vocab, n=4)
    # tokens kept per sentence (n=4): a: 4,1,2,1,1  b: 1,1,1,1,3  v: 1,1,1,1,4 -> 24 of 60 slots
    assert stats == {
        "vocab_size": 15,  # pad, unk + one..five, x, y, a..f
        "train_stories": 2,
        "validation_stories": 1,
        "pad_fraction": pytest.approx(36 / 60),
        "truncated_sentences": 2,
        "validation_last_sentence_tokens": 4,
        "uniform_cross_entropy": pytest.approx(math.log(15)),
    }


def test_cli_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "stats.json"
    assert main([str(make_folder(tmp_path)), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    stats = json.loads(out.read_text())
    assert stats["train_stories"] == 2 and stats["validation_stories"] == 2
    assert f"vocab_size: {stats['vocab_size']}" in printed
    assert main([str(tmp_path / "absent")]) == 2
    assert "no such folder" in capsys.readouterr().err

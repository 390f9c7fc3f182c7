"""Story Cloze: reading both endings, scoring them (4-tensor, baseline, floors) and the accuracy."""

import math

import pytest
import torch

from tests.test_train import TEST_NAME, VAL_NAME, write_csv
from world_model.data.rocstories import (
    CLOZE_COLUMNS,
    DataError,
    cloze_half,
    encode_cloze,
    load_cloze_halves,
    read_cloze_csv,
    read_cloze_endings,
)
from world_model.evaluation import floors as fl
from world_model.evaluation import story_cloze as sc
from world_model.models.registry import build_model
from world_model.text.vocab import Vocabulary

ROWS = [
    ["s1", "Tom ran.", "Ann sat.", "Bob ate.", "Sue sang.", "Tom sat home.", "Ann ran fast.", "2"],
    ["s2", "Bob sat.", "Sue ate.", "Tom sang.", "Ann ran.", "Bob ate cake.", "Sue sat.", "1"],
]


@pytest.fixture
def data_dir(tmp_path):
    write_csv(tmp_path / VAL_NAME, CLOZE_COLUMNS, ROWS)
    write_csv(tmp_path / TEST_NAME, CLOZE_COLUMNS, ROWS[:1])
    return tmp_path


def test_both_endings_and_the_answer_are_read(data_dir):
    items = read_cloze_endings(data_dir / VAL_NAME)
    assert [i.endings for i in items] == [("Tom sat home.", "Ann ran fast."), ("Bob ate cake.", "Sue sat.")]
    assert [i.answer for i in items] == [1, 0] and items[0].context == ("Tom ran.", "Ann sat.", "Bob ate.", "Sue sang.")
    assert [s.sentences[-1] for s in read_cloze_csv(data_dir / VAL_NAME)] == ["Ann ran fast.", "Bob ate cake."]
    halves = load_cloze_halves(data_dir)
    assert list(halves) == ["val", "test"] and len(halves["val"]) == 2 and len(halves["test"]) == 1
    assert cloze_half("cloze_test_test__spring2016 - cloze_test_ALL_test.csv") == "test"
    assert cloze_half("cloze_test_extra.csv") == "cloze_test_extra"


def test_a_bad_answer_is_a_clear_error(tmp_path):
    write_csv(tmp_path / VAL_NAME, CLOZE_COLUMNS, [ROWS[0][:-1] + ["3"]])
    with pytest.raises(DataError, match="row 2: AnswerRightEnding is '3'"):
        read_cloze_endings(tmp_path / VAL_NAME)


def test_accuracy_counts_a_tie_as_half_and_compares_per_token_means():
    sums = torch.tensor([[-2.0, -3.0], [-4.0, -3.0], [-6.0, -3.0], [-1.0, -1.0]], dtype=torch.float64)
    tokens = torch.tensor([[1.0, 1.0], [1.0, 1.0], [4.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    answer = torch.tensor([0, 0, 0, 1])
    # summed: right, wrong, wrong, tie -> 1.5 / 4; per token: right, wrong, right (-1.5 > -3), tie -> 2.5 / 4
    assert sc.accuracy(sums, tokens, answer) == {"summed": 1.5 / 4, "per_token": 2.5 / 4}


def vocab_and_items(data_dir):
    halves = load_cloze_halves(data_dir)
    vocab = Vocabulary.build(s for items in halves.values() for i in items for s in (*i.context, *i.endings))
    return vocab, halves


def test_floor_scores_sum_the_floors_log_probabilities(data_dir):
    vocab, halves = vocab_and_items(data_dir)
    context, endings, answer = encode_cloze(halves["val"], vocab)
    floor = fl.CountFloor.fit("unigram", fl.slot_counts(torch.cat([context, endings[:, :1]], 1), len(vocab)), 1.0)
    sums, tokens = sc.floor_scores(floor, context, endings)
    counts = fl.slot_counts(torch.cat([context, endings[:, :1]], 1), len(vocab)).sum(0)
    total = counts[1:].sum().item() + (len(vocab) - 1)  # add-1 over every id but padding
    p = lambda word: (counts[vocab.stoi[word]].item() + 1) / total
    assert sums[0, 1].item() == pytest.approx(sum(math.log(p(w)) for w in ("ann", "ran", "fast", ".")))
    assert tokens.tolist() == [[4, 4], [4, 3]]


def test_four_tensor_scores_are_the_last_slice_log_likelihoods(data_dir):
    vocab, halves = vocab_and_items(data_dir)
    context, endings, _ = encode_cloze(halves["val"], vocab)
    torch.manual_seed(0)
    model = build_model({"type": "four_tensor", "d_x": 4, "d_t": 2, "n_heads": 1, "n_layers": 1}, len(vocab))
    sums, tokens = sc.four_tensor_scores(model, context, endings, batch_size=1)
    with torch.no_grad():
        log_p = model.eval().last_slice_logits(context).log_softmax(-1)
    for s in range(2):
        for k in range(2):
            expected = sum(log_p[s, n, v].item() for n, v in enumerate(endings[s, k].tolist()) if v)
            assert sums[s, k].item() == pytest.approx(expected, rel=1e-5)


def test_baseline_scores_each_window_with_its_own_endings(data_dir):
    vocab, halves = vocab_and_items(data_dir)
    context, endings, _ = encode_cloze(halves["val"], vocab)
    torch.manual_seed(0)
    model = build_model({"type": "baseline", "d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1}, len(vocab)).eval()
    sums, tokens = sc.baseline_scores(model, context, endings)
    with torch.no_grad():
        for s in range(2):  # one window at a time, its endings as shared candidates
            torch.testing.assert_close(sums[s].float(), model.score_sentences(context[s : s + 1], endings[s])[0])
        torch.testing.assert_close(model.score_sentences(context, endings, chunk_rows=1), sums.float())
    assert tokens.tolist() == [[5, 5], [5, 4]]  # [EOS] counts
    with pytest.raises(ValueError, match="need B = 2 windows"):
        model.score_sentences(context, endings[:1])


def test_story_cloze_reports_every_half(data_dir):
    vocab, halves = vocab_and_items(data_dir)
    torch.manual_seed(0)
    model = build_model({"type": "four_tensor", "d_x": 4, "d_t": 2, "n_heads": 1, "n_layers": 1}, len(vocab))
    result = sc.story_cloze(sc.model_scorer(model), halves, vocab)
    assert list(result) == ["val", "test"] and result["val"]["stories"] == 2 and result["test"]["stories"] == 1
    for half, items in halves.items():
        context, endings, answer = encode_cloze(items, vocab)
        assert {k: result[half][k] for k in sc.VARIANTS} == sc.accuracy(
            *sc.four_tensor_scores(model, context, endings), answer
        )

    class ScoresNothing(torch.nn.Linear):
        scores_sentences = scores_slots = False

    with pytest.raises(ValueError, match="cannot score endings"):
        sc.model_scorer(ScoresNothing(2, 2))

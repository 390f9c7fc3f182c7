"""Coherence measures: Story Cloze with a rule fixed on the val half, retrieval among candidates, restatement."""

import pytest
import torch

from tests.test_story_cloze import data_dir, vocab_and_items  # noqa: F401 (the fixture)
from world_model.data.rocstories import encode_cloze
from world_model.evaluation import coherence as coh
from world_model.evaluation import floors as fl
from world_model.evaluation import story_cloze as sc
from world_model.text.vocab import tokenize


def test_retrieval_metrics_by_hand_with_a_tie_ranked_at_random():
    scores = torch.tensor([[3.0, 1.0, 2.0, 0.0], [1.0, 2.0, 3.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    # ranks: 1; 3; 1 or 2 with chance 1/2 each
    m = coh.retrieval_metrics(scores, recall_at=(1, 2))
    assert m["recall_at_1"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert m["recall_at_2"] == pytest.approx((1 + 0 + 1) / 3)
    assert m["mrr"] == pytest.approx((1 + 1 / 3 + (1 + 1 / 2) / 2) / 3)
    assert m["candidates"] == 4


def test_retrieval_candidates_are_other_stories_fixed_by_the_seed():
    others = coh.retrieval_others(12, seed=3, others=5)
    assert others.shape == (12, 5)
    assert all(i not in row.tolist() and len(set(row.tolist())) == 5 for i, row in enumerate(others))
    assert torch.equal(others, coh.retrieval_others(12, seed=3, others=5))
    assert not torch.equal(others, coh.retrieval_others(12, seed=4, others=5))
    with pytest.raises(ValueError, match="needs more than 5"):
        coh.retrieval_others(5, others=5)
    endings = torch.tensor([[[1], [2]], [[3], [4]], [[5], [6]]])  # (S=3, 2, N=1)
    answer = torch.tensor([1, 0, 0])
    candidates = coh.retrieval_endings(endings, answer, torch.tensor([[1], [2], [0]]))
    assert candidates[..., 0].tolist() == [[2, 1, 3], [3, 4, 5], [5, 6, 2]]


def test_rules_and_the_rule_is_chosen_on_the_val_half_only():
    sums = torch.tensor([[-4.0, -3.0]])
    tokens = torch.tensor([[4.0, 1.0]])
    blank = torch.tensor([[-8.0, -3.5]])
    scores = coh.rule_scores(sums, tokens, blank)
    assert {r: s.tolist() for r, s in scores.items()} == {
        "summed": [[-4.0, -3.0]],
        "per_token": [[-1.0, -3.0]],
        "ratio_summed": [[4.0, 0.5]],
        "ratio_per_token": [[1.0, 0.5]],
    }
    per_half = {
        "val": {"summed": 0.5, "per_token": 0.6, "ratio_summed": 0.6, "ratio_per_token": 0.4},
        "test": {"summed": 0.9, "per_token": 0.55, "ratio_summed": 0.7, "ratio_per_token": 0.3},
    }
    chosen = coh.cloze_with_rule(per_half)  # per_token and ratio_summed tie on val: the first in RULES order
    assert (chosen["rule"], chosen["val"], chosen["test"]) == ("per_token", 0.6, 0.55)
    with pytest.raises(ValueError, match="chosen on the val half"):
        coh.cloze_with_rule({"test": per_half["test"]})


def test_coherence_report_of_a_floor_by_hand(data_dir):  # noqa: F811
    vocab, halves = vocab_and_items(data_dir)
    context, endings, answer = encode_cloze(halves["val"], vocab)
    floor = fl.CountFloor.fit("unigram", fl.slot_counts(torch.cat([context, endings[:, :1]], 1), len(vocab)), 1.0)
    report = coh.coherence_report(sc.floor_scorer(floor), halves, vocab, others=1)
    for half, items in halves.items():
        c, e, a = encode_cloze(items, vocab)
        sums, tokens = sc.floor_scores(floor, c, e)
        blank = sc.floor_scores(floor, torch.zeros_like(c), e)[0]
        assert torch.allclose(blank, sums)  # a unigram ignores its context: the ratio rules score 0 everywhere
        expected = sc.accuracy(sums, tokens, a)
        assert report["rules"][half]["summed"] == expected["summed"]
        assert report["rules"][half]["per_token"] == expected["per_token"]
        assert report["rules"][half]["ratio_summed"] == 0.5  # every story a tie
    assert report["retrieval"]["candidates"] == 3
    assert report["val"] == max(report["rules"]["val"].values())


def test_restatement_by_hand():
    common = frozenset({"he", "the", "was", "to"})
    context = [tokenize("Tom went to the big store."), tokenize("He bought apples.")]
    assert coh.content_words(tokenize("He was at the store!"), common) == {"at", "store"}
    assert coh.restates(tokenize("Tom went to the store."), context, common)  # 3 of 3 content words in sentence 1
    assert not coh.restates(tokenize("Tom bought the store."), context, common)  # 2 of 3 in sentence 1, 1 in 2
    assert coh.restates(tokenize("Tom bought the store."), context, common, share=0.6)
    assert not coh.restates(tokenize("He was to the."), context, common)  # no content word
    predicted = [tokenize("Tom went to the store."), tokenize("She slept.")]
    assert coh.restatement_rate(predicted, [context, context], common) == 0.5
    with pytest.raises(ValueError, match="one context per predicted sentence"):
        coh.restatement_rate(predicted, [context], common)

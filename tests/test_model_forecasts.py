"""A predictor's k-step forecasts over known sentences: the one-step distribution is its closed-set readout, and the
k-step marginals are that distribution pushed forward."""

import pytest
import torch

from world_model.evaluation import model_forecasts
from world_model.evaluation.world_scores import Point
from world_model.models.registry import build_model, model_vocab_size
from world_model.text.vocab import PAD_ID, Vocabulary

SENTENCES = ["the ball falls.", "the ball bounces.", "the ball rests.", "the box slides."]
TINY = {"d_x": 4, "d_t": 2, "n_heads": 2, "n_layers": 1, "n_tokens": 5, "n_states": 3}


def setup(model_type):
    vocab = Vocabulary.build(SENTENCES)
    torch.manual_seed(3)
    model = build_model({"type": model_type, **TINY}, model_vocab_size(model_type, vocab)).eval()
    candidates = vocab.encode_batch(SENTENCES, TINY["n_tokens"])
    points = [
        Point({"id": "a", "scene": "ball"}, ["the ball falls."], ["the ball bounces.", "the ball rests."]),
        Point({"id": "b", "scene": "ball"}, SENTENCES[:3], ["the box slides.", "never said."]),
    ]
    return model, vocab, candidates, points


def distribution(model, vocab, candidates, sentences):
    """softmax of the closed-set scores after ``sentences`` (the last T of them, left-padded)."""
    rows = vocab.encode_batch(sentences[-TINY["n_states"] :], TINY["n_tokens"])
    window = torch.cat([rows.new_full((TINY["n_states"] - len(rows), TINY["n_tokens"]), PAD_ID), rows])
    return model_forecasts.candidate_scores(model, window[None], candidates)[0].double().softmax(-1)


@pytest.mark.parametrize("model_type", ["four_tensor", "baseline"])
def test_marginals_are_the_one_step_readout_pushed_forward(model_type, monkeypatch):
    model, vocab, candidates, points = setup(model_type)
    known = model_forecasts.known_sentences(candidates, vocab)
    assert known == SENTENCES
    monkeypatch.setattr(model_forecasts, "EXPAND_MIN", 0.0)  # follow every branch: the marginals are exact
    monkeypatch.setattr(model_forecasts, "BEAM", 100)
    forecasts = model_forecasts.k_step_forecasts(model, vocab, candidates, points, 2, batch_size=3)
    for point, forecast in zip(points, forecasts):
        one = distribution(model, vocab, candidates, point.observed)
        two = sum(one[j] * distribution(model, vocab, candidates, point.observed + [s]) for j, s in enumerate(known))
        for k, marginal in enumerate((one, two)):
            best = int(marginal.argmax())
            assert forecast.predicted[k] == known[best]
            assert forecast.confidence[k] == pytest.approx(float(marginal[best]))
            truth = point.future[k]
            expected = float(marginal[known.index(truth)]) if truth in known else 0.0
            assert forecast.truth_prob[k] == pytest.approx(expected)
        assert sum(two) == pytest.approx(1.0)
    cold = model_forecasts.k_step_forecasts(model, vocab, candidates, points, 1, temperature=100.0)
    assert cold[0].confidence[0] < forecasts[0].confidence[0] + 1e-9 and cold[0].confidence[0] < 0.3


def test_contexts_replace_the_observed_sentences_and_must_match_the_points():
    model, vocab, candidates, points = setup("four_tensor")
    as_said = model_forecasts.k_step_forecasts(model, vocab, candidates, points, 1)
    swapped = model_forecasts.k_step_forecasts(model, vocab, candidates, points, 1, contexts=[SENTENCES[:3], ["x."]])
    assert swapped[0].confidence == as_said[1].confidence
    with pytest.raises(ValueError, match="contexts"):
        model_forecasts.k_step_forecasts(model, vocab, candidates, points, 1, contexts=[["x."]])
    with pytest.raises(ValueError, match="steps"):
        model_forecasts.k_step_forecasts(model, vocab, candidates, points, 0)


def test_the_baselines_trie_scores_equal_its_teacher_forced_scores_and_prune_only_the_unlikely(monkeypatch):
    model, vocab, candidates, points = setup("baseline")
    windows = torch.stack(
        [
            torch.cat([torch.zeros(2, TINY["n_tokens"], dtype=torch.long), vocab.encode_batch(SENTENCES[:1], 5)]),
            torch.cat([torch.zeros(0, TINY["n_tokens"], dtype=torch.long), vocab.encode_batch(SENTENCES[:3], 5)]),
        ]
    )
    full = model.score_sentences(windows, candidates).float()
    monkeypatch.setattr(model_forecasts, "PRUNE", 1e-30)
    for depth in (1, 3, 10):  # a trie over the first token, three, or the whole spans; then the rest in one pass
        monkeypatch.setattr(model_forecasts, "TRIE_DEPTH", depth)
        assert torch.allclose(model_forecasts.pruned_sentence_scores(model, windows, candidates), full, atol=1e-4)
    monkeypatch.setattr(model_forecasts, "PRUNE", 1.0)  # only the likeliest prefix of each length goes on
    pruned = model_forecasts.pruned_sentence_scores(model, windows, candidates)
    kept = torch.isfinite(pruned)
    assert kept.sum(dim=1).tolist() == [1, 1]  # no two of these candidates share all but their last token
    assert torch.allclose(pruned[kept], full[kept], atol=1e-4)  # what is kept is scored exactly
    monkeypatch.setattr(model_forecasts, "PRUNE", 1e-2)
    some = torch.isfinite(model_forecasts.pruned_sentence_scores(model, windows, candidates))
    assert (some >= kept).all()  # a looser rule keeps at least as much


@pytest.mark.parametrize("model_type", ["four_tensor", "baseline"])
def test_each_distinct_window_is_scored_once_a_call(model_type, monkeypatch):
    """The cut after a second reads what the cut before it followed with the true sentence: one window, scored once."""
    model, vocab, candidates, _ = setup(model_type)
    record = {"id": "a", "scene": "ball"}
    points = [
        Point(record, ["the ball falls."], ["the ball bounces.", "the ball rests."]),
        Point(record, ["the ball falls.", "the ball bounces."], ["the ball rests.", "the box slides."]),
        Point({"id": "b", "scene": "ball"}, ["the ball falls."], ["the ball bounces.", "the ball rests."]),
    ]
    monkeypatch.setattr(model_forecasts, "EXPAND_MIN", 0.0)
    monkeypatch.setattr(model_forecasts, "BEAM", 100)
    alone = [model_forecasts.k_step_forecasts(model, vocab, candidates, [p], 2) for p in points]
    scored = []
    original = model_forecasts.candidate_scores
    monkeypatch.setattr(
        model_forecasts, "candidate_scores", lambda m, w, c: scored.extend(map(bytes, w.numpy())) or original(m, w, c)
    )
    together = model_forecasts.k_step_forecasts(model, vocab, candidates, points, 2, batch_size=2)
    # step 1: two distinct pasts (a's and b's are the same); step 2: the four continuations of that one past, and the
    # four of the longer past, one of which (falls, bounces) is the second point's own window of step 1
    assert len(scored) == len(set(scored)) == 2 + 4 + 4 - 1
    for one, many in zip(alone, together):
        assert many.predicted == one[0].predicted
        assert many.confidence == pytest.approx(one[0].confidence) and many.truth_prob == pytest.approx(
            one[0].truth_prob
        )

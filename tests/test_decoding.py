"""The closed-set readout (world_model.models.decoding): known sentences scored whole, for the 4-tensor model, and the
known-sentences file a predictor folder carries."""

import math

import pytest
import torch

from tests.test_faithfulness import V, make_model, make_window
from world_model.models.checkpoint import CheckpointError
from world_model.models.decoding import (
    KNOWN_SENTENCES_NAME,
    load_known_sentences,
    slot_log_likelihood,
    write_known_sentences,
)
from world_model.models.generation_config import GenerationConfig, after_first, sample_ids
from world_model.models.registry import load_predictor
from world_model.text.vocab import Vocabulary

END = 3
A = [4, 9, END, 0, 0]  # a short sentence
B = [5, 6, 7, END, 0]  # a longer one, sharing no slot with A


def two_way_logits(p0: float, p1: float) -> torch.Tensor:
    """Per-slot logits (1, 5, V) of a draw between A and B: slot 0 gives A's word probability p0, slot 1 p1,
    the rest B's word; with p0 > 1/2 > p1 the per-slot argmax reads [4, 6, ...], which is neither."""
    probs = torch.full((5, V), 1e-4)
    probs[0, 4], probs[0, 5] = p0, 1 - p0
    probs[1, 9], probs[1, 6] = p1, 1 - p1
    probs[2, END], probs[2, 7] = 0.5, 0.5
    probs[3, END] = 0.9
    probs[4, 8] = 0.9
    return probs.log()[None]


def test_slot_log_likelihood_sums_content_slots_only():
    log_probs = torch.randn(2, 5, V).log_softmax(-1)
    candidates = torch.tensor([A, B])
    scores = slot_log_likelihood(log_probs, candidates, padding_idx=0)
    for b in range(2):
        for c, row in enumerate([A, B]):
            expected = sum(log_probs[b, n, t] for n, t in enumerate(row) if t != 0)
            assert math.isclose(scores[b, c].item(), expected.item(), rel_tol=1e-5)


def test_per_slot_readout_mixes_two_sentences_and_the_closed_set_picks_one_of_them():
    model = make_model()
    logits = two_way_logits(0.55, 0.45)
    mixed = model.decode_state(logits, GenerationConfig(end_ids=[END]))[0].tolist()
    assert mixed[:2] == [4, 6] and mixed not in (A, B)
    candidates = torch.tensor([A, B])
    chosen = model.decode_state(logits, GenerationConfig(end_ids=[END]), candidates=candidates)[0].tolist()
    # By hand: A scores log .55 + log .45 + log .5 (3 slots), B log .45 + log .55 + log .5 + log .9: A is likelier.
    assert chosen == A
    logits[0, 3, END] = math.log(
        1.0
    )  # B's extra slot now costs nothing: a tie broken by argmax order, still a sentence
    assert model.decode_state(logits, candidates=candidates)[0].tolist() in (A, B)
    # B: .7 * .7 * .5 * .9 against A: .3 * .3 * .5.
    assert model.decode_state(two_way_logits(0.3, 0.3), candidates=candidates)[0].tolist() == B


def test_closed_set_sampling_is_seeded_and_returns_only_candidates():
    model = make_model()
    candidates = torch.tensor([A, B, [10, 11, END, 0, 0]])
    logits = torch.randn(64, 5, V)
    draw = lambda seed, **kw: model.decode_state(
        logits, GenerationConfig(temperature=2.0, **kw), torch.Generator().manual_seed(seed), candidates=candidates
    )
    assert torch.equal(draw(0), draw(0))
    rows = {tuple(r) for r in draw(1).tolist()}
    assert rows <= {tuple(c) for c in candidates.tolist()} and len(rows) > 1
    greedy = model.decode_state(logits, candidates=candidates)
    assert torch.equal(draw(2, top_k=1), greedy)  # top-1 of the candidates is the greedy choice


def test_rollout_with_candidates_predicts_known_sentences_at_every_step():
    model = make_model()
    candidates = torch.tensor([A, B, [10, 11, 12, END, 0]])
    out = model.rollout(make_window(B=3), 4, GenerationConfig(end_ids=[END]), candidates=candidates)
    assert out.shape == (3, 4, 5)
    known = {tuple(c) for c in candidates.tolist()}
    assert all(tuple(s) in known for s in out.reshape(-1, 5).tolist())


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.tensor([A[:4]]), "must be \\(C, N=5\\)"),
        (torch.zeros(0, 5, dtype=torch.long), "C >= 1"),
        (torch.tensor([A, [0, 0, 0, 0, 0]]), "row\\(s\\) \\[1\\] hold only padding"),
        (torch.tensor([[4, V, END, 0, 0]]), "must lie in"),
        (torch.tensor([A], dtype=torch.float), "integer token ids"),
    ],
)
def test_bad_candidates_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        make_model().decode_state(torch.randn(1, 5, V), candidates=bad)


def test_known_sentences_file_round_trip_and_errors(tmp_path):
    vocab = Vocabulary.build(["the ball falls.", "the ball rests on the floor."])
    write_known_sentences(tmp_path, ["the ball falls.", "the  ball falls.", "the ball rests on the floor."])
    assert (tmp_path / KNOWN_SENTENCES_NAME).read_text().splitlines() == [
        "the ball falls.",
        "the ball rests on the floor.",
    ]
    ids = load_known_sentences(tmp_path, vocab, n_tokens=8)
    assert sorted(vocab.decode(r) for r in ids) == ["the ball falls.", "the ball rests on the floor."]
    assert load_known_sentences(tmp_path / "elsewhere", vocab, 8) is None
    with pytest.raises(ValueError, match="more than the model's 4 slots"):
        load_known_sentences(tmp_path, vocab, n_tokens=4)
    (tmp_path / KNOWN_SENTENCES_NAME).write_text("the ball falls.\nthe cat sleeps.\n")
    with pytest.raises(ValueError, match="line 2: .*'cat'"):
        load_known_sentences(tmp_path, vocab, n_tokens=8)
    (tmp_path / KNOWN_SENTENCES_NAME).write_text("\n \n")
    with pytest.raises(ValueError, match="lists no sentences"):
        load_known_sentences(tmp_path, vocab, n_tokens=8)
    with pytest.raises(ValueError, match="non-empty"):
        write_known_sentences(tmp_path, [])


def test_save_pretrained_carries_the_known_sentences_to_load_predictor(tmp_path):
    sentences = ["the ball falls.", "the ball rests on the floor."]
    vocab = Vocabulary.build(sentences)
    model = make_model(vocab_size=len(vocab), n_tokens=8)
    model.save_pretrained(tmp_path / "with", vocab=vocab, known_sentences=sentences)
    model.save_pretrained(tmp_path / "without", vocab=vocab)
    loaded = load_predictor(tmp_path / "with")
    assert loaded.known_sentences.shape == (2, 8)
    assert load_predictor(tmp_path / "without").known_sentences is None
    (tmp_path / "with" / KNOWN_SENTENCES_NAME).write_text("the dog barks.\n")
    with pytest.raises(CheckpointError, match="'dog'"):
        load_predictor(tmp_path / "with")


def test_generation_config_checks_and_counts_futures():
    assert GenerationConfig().futures == 1 and GenerationConfig(samples=4).futures == 1  # greedy: one future
    assert GenerationConfig(temperature=0.5, samples=4).futures == 4
    assert GenerationConfig(end_ids=[3, 4]).end_ids == (3, 4)  # stored as a tuple: the config is frozen
    g1, g2 = GenerationConfig(seed=7).generator(), GenerationConfig(seed=7).generator()
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))
    for bad in (dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=0), dict(samples=0)):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)


def test_sample_ids_and_after_first_stop():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.0]])
    assert sample_ids(logits).tolist() == [1, 0]
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_ids(logits, 10.0, top_k=2, generator=g) for _ in range(50)])  # (50, 2)
    assert set(draws[:, 0].tolist()) == {1, 3} and set(draws[:, 1].tolist()) == {0, 3}
    is_stop = torch.tensor([[False, True, False, True], [False, False, False, False]])
    assert after_first(is_stop).tolist() == [[False, False, True, True], [False, False, False, False]]

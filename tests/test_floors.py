"""Count floors (world_model/evaluation/floors/) against values computed by hand, and their selection on training data only."""

import math
from fractions import Fraction

import pytest
import torch

from world_model.evaluation import floors as fl
from world_model.evaluation.floors.dual_encoder import DualEncoderSettings, fit_dual_encoder

V = 5  # 0 padding, 1 unknown, 2..4 words
# Two training windows of five sentences, N = 2 slots.
TRAIN = torch.tensor(
    [
        [[2, 3], [2, 0], [4, 3], [2, 3], [3, 0]],
        [[3, 2], [4, 4], [2, 0], [3, 3], [2, 4]],
    ]
)
# Counted by hand over all five sentences (padding left out), per slot and id 1..4.
SLOT_COUNTS = [{1: 0, 2: 5, 3: 3, 4: 2}, {1: 0, 2: 1, 3: 4, 4: 2}]
# Three validation windows: context S(0..3), then S(4).
VAL = torch.tensor(
    [
        [[2, 3], [4, 0], [3, 3], [2, 0], [3, 4]],  # context tokens 2 3 4 3 3 2: copy(3) = 3/6, copy(4) = 1/6
        [[4, 2], [4, 0], [2, 2], [4, 4], [2, 0]],  # 4 2 4 2 2 4 4: copy(2) = 3/7
        [[4, 4], [4, 4], [4, 0], [0, 0], [4, 0]],  # only 4: copy(4) = 1
    ]
)
ALPHA, WEIGHT = Fraction(1, 2), Fraction(1, 3)  # no ties among the argmax candidates


def by_hand(name: str, context: list[list[int]], slot: int, v: int) -> Fraction:
    """p(v at slot | context) from the hand counts, add-ALPHA over the 4 ids but padding."""
    counts = SLOT_COUNTS[slot] if name != "unigram" else {u: SLOT_COUNTS[0][u] + SLOT_COUNTS[1][u] for u in range(1, V)}
    p = (counts[v] + ALPHA) / (sum(counts.values()) + 4 * ALPHA)
    if name == "position_unigram_copy":
        tokens = [t for sentence in context for t in sentence if t != 0]
        p = (1 - WEIGHT) * p + WEIGHT * Fraction(tokens.count(v), len(tokens))
    return p


@pytest.mark.parametrize("name", fl.TABLE_FLOORS)
def test_floors_match_hand_computed_values(name):
    floor = fl.CountFloor.fit(
        name, fl.slot_counts(TRAIN, V), float(ALPHA), float(WEIGHT) if name.endswith("copy") else 0.0
    )
    log_sum, correct, tokens = 0.0, 0, 0
    for window in VAL.tolist():
        context, target = window[:4], window[4]
        for slot, v in enumerate(target):
            if v == 0:
                continue
            probs = {u: by_hand(name, context, slot, u) for u in range(1, V)}
            assert sum(probs.values()) == 1
            log_sum += math.log(probs[v])
            correct += max(probs, key=probs.get) == v
            tokens += 1
    m = fl.floor_metrics(floor, VAL)
    assert m["last_tokens"] == tokens == 4
    assert m["last_ce"] == pytest.approx(-log_sum / tokens, rel=1e-12)
    assert m["token_accuracy"] == correct / tokens


def test_hand_values_spelled_out():
    """The numbers above, one by one, for the first validation target (id 3 at slot 0)."""
    counts = fl.slot_counts(TRAIN, V)
    assert counts[0, 1:].tolist() == [0, 5, 3, 2] and counts[1, 1:].tolist() == [0, 1, 4, 2]
    target = VAL[:1, 4]
    unigram = fl.CountFloor.fit("unigram", counts, 0.5).token_probs(VAL[:1, :4], target)
    position = fl.CountFloor.fit("position_unigram", counts, 0.5).token_probs(VAL[:1, :4], target)
    copy = fl.CountFloor.fit("position_unigram_copy", counts, 0.5, 1 / 3).token_probs(VAL[:1, :4], target)
    assert unigram[0, 0].item() == pytest.approx(7.5 / 19)  # (3 + 4 + 1/2) / (17 + 2)
    assert position[0, 0].item() == pytest.approx(3.5 / 12)  # (3 + 1/2) / (10 + 2)
    assert copy[0, 0].item() == pytest.approx(2 / 3 * 3.5 / 12 + 1 / 3 * 3 / 6)
    # accuracy: the copy floor gets window 3 right (4 fills its context), the position floor predicts 2 there
    position_pred = fl.CountFloor.fit("position_unigram", counts, 0.5).predictions(VAL[:, :4])
    copy_pred = fl.CountFloor.fit("position_unigram_copy", counts, 0.5, 1 / 3).predictions(VAL[:, :4])
    assert position_pred[2, 0].item() == 2 and copy_pred[2, 0].item() == 4


def test_count_end_cost_is_the_add_one_end_rate_of_the_training_sentences_paid_by_each_s4_token():
    # TRAIN's ten sentence lengths: seven of 2 tokens, three of 1. At slot 0 none has ended (0 of 10 end there),
    # at slot 1 three of the ten end: add-one rates 1/12 and 4/12. VAL's S(4) has three tokens at slot 0, one at 1.
    expected = (3 * -math.log(1 - 1 / 12) - math.log(1 - 4 / 12)) / 4
    assert fl.count_end_cost(TRAIN, VAL) == pytest.approx(expected, rel=1e-12)
    longer = VAL.clone()
    longer[1:, 4, 1] = 3  # every S(4) reaches slot 1, where sentences often end: it costs more
    assert fl.count_end_cost(TRAIN, longer) > fl.count_end_cost(TRAIN, VAL)
    with pytest.raises(ValueError, match="slots a sentence"):
        fl.count_end_cost(TRAIN, VAL[:, :, :1])
    with pytest.raises(ValueError, match="no non-padding S"):
        fl.count_end_cost(TRAIN, torch.zeros_like(VAL))


def test_count_prior_is_the_position_unigram_times_the_chance_of_going_on_and_eos_the_chance_of_ending():
    # End rates by hand: of TRAIN's ten sentences none ends at slot 0, 3 of the 10 reaching slot 1 end there, and
    # the 7 that reach slot 2 (full) all end. Alpha by hand: fitted on the first window, the held-out second
    # window's S(4) [2, 4] has p(2 @ 0) p(4 @ 1) = (3 + a) / (5 + 4a) * a / (3 + 4a), which rises over the whole
    # grid, so alpha is its largest value, 2. The table is then refitted on both windows (SLOT_COUNTS).
    eos, model_vocab = 5, 7  # ids 5 ([EOS]) and 6 past the sentence vocabulary
    prior = fl.count_prior(TRAIN, V, model_vocab, eos)
    assert prior.shape == (3, model_vocab) and prior.dtype == torch.float32
    assert max(fl.ALPHAS) == 2.0
    end = [0.0, 0.3, 1.0]
    for slot in range(2):
        counts = SLOT_COUNTS[slot]
        for v in range(1, V):
            expected = (1 - end[slot]) * (counts[v] + 2) / (sum(counts.values()) + 8)
            assert float(prior[slot, v]) == pytest.approx(expected, rel=1e-6)
    assert prior[:, eos].tolist() == pytest.approx(end)
    assert prior[:, 0].tolist() == [0, 0, 0] and prior[:, 6].tolist() == [0, 0, 0]  # padding and ids past [EOS]
    torch.testing.assert_close(prior.sum(-1), torch.ones(3))
    with pytest.raises(ValueError, match=r"\[EOS\] id 3 must lie in \[5, 7\)"):
        fl.count_prior(TRAIN, V, model_vocab, 3)


def test_count_copy_prior_gives_the_copy_floors_weight_of_every_content_step_to_copying():
    eos, model_vocab = 5, 7
    w = fl.select_floors(TRAIN, V)["selection"]["position_unigram_copy"]["copy_weight"]
    assert 0 < w < 1
    prior, copy_mass = fl.count_copy_prior(TRAIN, V, model_vocab, eos)
    plain = fl.count_prior(TRAIN, V, model_vocab, eos)
    end = torch.tensor([0.0, 0.3, 1.0])
    torch.testing.assert_close(prior[:, :V], (1 - w) * plain[:, :V])  # the position unigram, scaled by 1 - w
    torch.testing.assert_close(prior[:, eos], end)  # [EOS] keeps the chance of ending
    torch.testing.assert_close(copy_mass, w * (1 - end))  # the rest of each content step: copying
    torch.testing.assert_close(prior.sum(-1) + copy_mass, torch.ones(3))
    torch.testing.assert_close(fl.count_prior(TRAIN, V, model_vocab, eos, 0.0), plain)
    with pytest.raises(ValueError, match=r"copy weight must be in \[0, 1\), got 1"):
        fl.count_prior(TRAIN, V, model_vocab, eos, 1)


def test_last_sentence_floor_counts_the_training_s4_slots_alone():
    # TRAIN's S(4)s are [3, pad] and [2, 4]: slot 0 holds 3 once and 2 once, slot 1 holds 4 once (ids 1..4).
    got = fl.last_sentence_floor(TRAIN, VAL, V)
    alpha = Fraction(got["alpha"]).limit_denominator(1000)
    assert got["alpha"] in fl.ALPHAS
    s4_counts = [{1: 0, 2: 1, 3: 1, 4: 0}, {1: 0, 2: 0, 3: 0, 4: 1}]
    log_sum, tokens = 0.0, 0
    for window in VAL.tolist():
        for slot, v in enumerate(window[4]):
            if v:
                counts = s4_counts[slot]
                log_sum += math.log((counts[v] + alpha) / (sum(counts.values()) + 4 * alpha))
                tokens += 1
    assert got["val_last_ce"] == pytest.approx(-log_sum / tokens, rel=1e-9)
    # alpha is the grid value of lowest loss on the held-out training window (the second), counts from the first
    fit, held = fl.split_heldout(TRAIN)
    counts = fl.slot_counts(fit, V, last_only=True)
    scores = {a: fl.floor_metrics(fl.CountFloor.fit("position_unigram", counts, a), held)["last_ce"] for a in fl.ALPHAS}
    assert got["alpha"] == min(scores, key=scores.get) and got["heldout_last_ce"] == scores[got["alpha"]]
    # the context sentences of the training windows are not counted
    other_context = TRAIN.clone()
    other_context[:, :4] = 4
    assert fl.last_sentence_floor(other_context, VAL, V) == got
    assert fl.floor_report(TRAIN, VAL, V)[1]["last_sentence"] == got


def test_padding_is_never_predicted_and_an_empty_context_copies_nothing():
    floor = fl.CountFloor.fit("position_unigram_copy", fl.slot_counts(TRAIN, V), 0.5, 0.5)
    assert (floor.table[:, 0] == 0).all() and torch.allclose(floor.table.sum(-1), torch.ones(2, dtype=torch.float64))
    empty = torch.zeros(1, 4, 2, dtype=torch.long)
    target = torch.tensor([[2, 0]])
    position = fl.CountFloor.fit("position_unigram", fl.slot_counts(TRAIN, V), 0.5)
    assert floor.token_probs(empty, target)[0, 0] == position.token_probs(empty, target)[0, 0]
    assert floor.token_log_probs(empty, target)[0, 1] == 0  # padding target: not scored


def random_windows(seed: int, s: int, n: int = 4, v: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(1, v, (s, 5, n), generator=g)
    return w.masked_fill(torch.rand(s, 5, n, generator=g) < 0.3, 0)


def test_selection_reads_training_windows_only_and_minimises_the_heldout_loss():
    train = random_windows(0, 40)
    _, report_a = fl.floor_report(train, random_windows(1, 15), 12)
    _, report_b = fl.floor_report(train, random_windows(2, 9), 12)
    settings = lambda r: {k: (r[k]["alpha"], r[k]["copy_weight"], r[k]["heldout_last_ce"]) for k in fl.FLOORS}
    assert settings(report_a) == settings(report_b)  # other validation windows, the same choice
    assert report_a["selection"] == {"fit_windows": 36, "heldout_windows": 4, "heldout_fraction": 0.1}
    fit, held = train[:36], train[36:]
    counts = fl.slot_counts(fit, 12)
    for name in ("unigram", "position_unigram"):
        scores = {a: fl.floor_metrics(fl.CountFloor.fit(name, counts, a), held)["last_ce"] for a in fl.ALPHAS}
        assert report_a[name]["alpha"] == min(scores, key=scores.get)
    alpha = report_a["position_unigram"]["alpha"]
    scores = {
        w: fl.floor_metrics(fl.CountFloor.fit("position_unigram_copy", counts, alpha, w), held)["last_ce"]
        for w in fl.COPY_WEIGHTS
    }
    assert report_a["position_unigram_copy"]["copy_weight"] == min(scores, key=scores.get)
    # the reported floors are refitted on all the training windows
    floors = fl.select_floors(train, 12)["floors"]
    assert torch.equal(
        floors["unigram"].table,
        fl.CountFloor.fit("unigram", fl.slot_counts(train, 12), report_a["unigram"]["alpha"]).table,
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: fl.CountFloor.fit("bigram", fl.slot_counts(TRAIN, V), 0.5), "unknown floor"),
        (lambda: fl.CountFloor.fit("unigram", fl.slot_counts(TRAIN, V), 0.0), "alpha must be > 0"),
        (lambda: fl.CountFloor.fit("unigram", fl.slot_counts(TRAIN, V), 0.5, 0.3), "does not fit floor"),
        (lambda: fl.CountFloor.fit("position_unigram_copy", fl.slot_counts(TRAIN, V), 0.5, 1.0), "does not fit floor"),
        (lambda: fl.slot_counts(TRAIN[:, :4], V), r"\(S >= 1, 5, N\)"),
        (lambda: fl.slot_counts(TRAIN, 4), "outside"),
        (lambda: fl.select_floors(TRAIN[:1], V), "cannot hold out"),
    ],
)
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def naive_cooccurrence(windows: torch.Tensor) -> dict[tuple[int, int], int]:
    """A[c, v] by loops: v in sentence j = 1..4, c a distinct non-padding id of the sentences before j."""
    counts: dict[tuple[int, int], int] = {}
    for window in windows.tolist():
        for j in range(1, 5):
            before = {c for sentence in window[:j] for c in sentence if c}
            for v in window[j]:
                for c in before if v else ():
                    counts[c, v] = counts.get((c, v), 0) + 1
    return counts


def test_cooccurrence_counts_spelled_out():
    # S(1) [2] follows {2, 3}; S(2) [4] follows {2, 3}; S(3) is empty; S(4) [3] follows {2, 3, 4}
    window = torch.tensor([[[2, 3], [2, 0], [4, 0], [0, 0], [3, 0]]])
    got = fl.cooccurrence_counts(window, V).to_dense()
    expected = torch.zeros(V, V, dtype=torch.float64)
    for c, v in [(2, 2), (3, 2), (2, 4), (3, 4), (2, 3), (3, 3), (4, 3)]:
        expected[c, v] = 1
    assert torch.equal(got, expected)
    pairs = fl.cooccurrence_counts(TRAIN, V).to_dense()
    assert {(c, v): int(pairs[c, v]) for c, v in pairs.nonzero().tolist()} == naive_cooccurrence(TRAIN)


def cooccurrence_by_hand(context: list[list[int]], slot: int, m: Fraction, beta: int, w: Fraction) -> dict:
    """p(v at slot | context) of the co-occurrence floor for ids 1..4, with exact fractions (beta an integer)."""
    pairs = naive_cooccurrence(TRAIN)
    column = {v: sum(n for (_, u), n in pairs.items() if u == v) for v in range(1, V)}
    u = {v: Fraction(column[v] + 1, sum(column.values()) + V - 1) for v in range(1, V)}
    row = {c: sum(n for (d, _), n in pairs.items() if d == c) for c in range(1, V)}
    bag = sorted({c for sentence in context for c in sentence if c})
    t = {v: sum((pairs.get((c, v), 0) + m * u[v]) / (row[c] + m) for c in bag) / len(bag) for v in range(1, V)}
    counts = SLOT_COUNTS[slot]
    p_pos = {v: (counts[v] + ALPHA) / (sum(counts.values()) + 4 * ALPHA) for v in range(1, V)}
    q = {v: p_pos[v] * (t[v] / u[v]) ** beta for v in range(1, V)}
    tokens = [c for sentence in context for c in sentence if c]
    return {v: (1 - w) * q[v] / sum(q.values()) + w * Fraction(tokens.count(v), len(tokens)) for v in range(1, V)}


@pytest.mark.parametrize("beta", [1, 2])
def test_cooccurrence_floor_matches_hand_computed_values(beta):
    m = Fraction(3)
    position = fl.CountFloor.fit("position_unigram", fl.slot_counts(TRAIN, V), float(ALPHA))
    floor = fl.CooccurrenceFloor(position, fl.cooccurrence_counts(TRAIN, V), float(m), float(beta), float(WEIGHT))
    log_sum, correct, tokens = 0.0, 0, 0
    for s, window in enumerate(VAL.tolist()):
        probs = [cooccurrence_by_hand(window[:4], slot, m, beta, WEIGHT) for slot in range(2)]
        got = floor.token_probs(VAL[s : s + 1, :4], torch.tensor([[1, 2]]))
        assert got[0, 0].item() == pytest.approx(float(probs[0][1]), rel=1e-12)  # id 1 at slot 0
        assert got[0, 1].item() == pytest.approx(float(probs[1][2]), rel=1e-12)  # id 2 at slot 1
        for slot, v in enumerate(window[4]):
            assert sum(probs[slot].values()) == 1
            if v:
                log_sum += math.log(probs[slot][v])
                correct += max(probs[slot], key=probs[slot].get) == v
                tokens += 1
    metrics = fl.floor_metrics(floor, VAL)
    assert metrics["last_ce"] == pytest.approx(-log_sum / tokens, rel=1e-12)
    assert metrics["token_accuracy"] == correct / tokens


def test_cooccurrence_floor_without_context_is_the_position_unigram():
    position = fl.CountFloor.fit("position_unigram", fl.slot_counts(TRAIN, V), 0.5)
    floor = fl.CooccurrenceFloor(position, fl.cooccurrence_counts(TRAIN, V), 10.0, 1.0, 0.3)
    empty, target = torch.zeros(1, 4, 2, dtype=torch.long), torch.tensor([[2, 3]])
    torch.testing.assert_close(floor.token_probs(empty, target), position.token_probs(empty, target))
    assert torch.equal(floor.predictions(empty), position.predictions(empty))
    assert floor.token_log_probs(empty, torch.tensor([[2, 0]]))[0, 1] == 0  # padding target: not scored


def test_cooccurrence_selection_minimises_the_heldout_loss_and_refits_on_all_windows():
    train = random_windows(0, 40)
    fit, held = train[:36], train[36:]
    chosen = fl.select_floors(train, 12)
    got = chosen["selection"]["cooccurrence_copy"]
    alpha = chosen["selection"]["position_unigram"]["alpha"]
    position = fl.CountFloor.fit("position_unigram", fl.slot_counts(fit, 12), alpha)
    counts = fl.cooccurrence_counts(fit, 12)
    scores = {
        (m, b, w): fl.floor_metrics(fl.CooccurrenceFloor(position, counts, m, b, w), held, accuracy=False)["last_ce"]
        for m in fl.STRENGTHS
        for b in fl.BETAS
        for w in fl.COPY_WEIGHTS
    }
    best = min(scores.values())
    assert got["heldout_last_ce"] == pytest.approx(best, rel=1e-12)
    assert scores[got["strength"], got["beta"], got["copy_weight"]] == pytest.approx(best, rel=1e-12)
    assert got["alpha"] == alpha
    floor = chosen["floors"]["cooccurrence_copy"]
    assert torch.equal(floor.counts.to_dense(), fl.cooccurrence_counts(train, 12).to_dense())
    assert torch.equal(floor.table, fl.CountFloor.fit("position_unigram", fl.slot_counts(train, 12), alpha).table)
    assert (
        fl.floor_settings(got)
        == f"alpha {alpha:g}, copy {got['copy_weight']:g}, m {got['strength']:g}, beta {got['beta']:g}"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"strength": 0.0}, "strength and beta must be > 0"),
        ({"beta": -1.0}, "strength and beta must be > 0"),
        ({"copy_weight": 1.0}, r"copy weight in \[0, 1\)"),
        ({"position": fl.CountFloor.fit("unigram", fl.slot_counts(TRAIN, V), 0.5)}, "rescales the position unigram"),
        ({"counts": torch.zeros(V, V)}, r"counts must be a sparse \(5, 5\) tensor"),
    ],
)
def test_cooccurrence_floor_rejects_bad_settings(change, message):
    settings = {
        "position": fl.CountFloor.fit("position_unigram", fl.slot_counts(TRAIN, V), 0.5),
        "counts": fl.cooccurrence_counts(TRAIN, V),
        "strength": 10.0,
        "beta": 1.0,
        "copy_weight": 0.2,
    }
    with pytest.raises(ValueError, match=message):
        fl.CooccurrenceFloor(**{**settings, **change})


def test_the_dual_encoder_learns_which_next_sentence_shares_the_storys_topic():
    gen = torch.Generator().manual_seed(0)
    topics, filler, n = torch.arange(2, 22), torch.arange(22, 40), 6  # 20 topic words, 18 common words
    story_topic = topics[torch.randint(0, len(topics), (200,), generator=gen)]  # (S,)
    windows = filler[torch.randint(0, len(filler), (200, 5, n), generator=gen)]  # (S, 5, N)
    windows[:, :, 0] = story_topic[:, None]  # every sentence of a story names its topic
    encoder, fitted = fit_dual_encoder(windows, 40, DualEncoderSettings(dim=16, epochs=6, batch_size=32))
    assert fitted["losses"][fitted["epoch"] - 1] == min(fitted["losses"]) and fitted["dim"] == 16
    other = windows[torch.roll(torch.arange(200), 1), 4]  # (S, N) the next story's ending
    differs = story_topic != torch.roll(story_topic, 1)
    with torch.no_grad():
        scores = encoder.score(windows[:, :4], torch.stack([windows[:, 4], other], 1))  # (S, 2)
    assert (scores[differs, 0] > scores[differs, 1]).float().mean() > 0.9  # its own topic's ending wins

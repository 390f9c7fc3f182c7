"""Why a predicted state and how sure: the explanations a rollout records (world_model.models.explanations),
rollout.json's per-step records and the --explain output (world_model.generation.explain), on tiny models."""

import json

import pytest
import torch

from pipeline.rollout import main
from tests.model_factories import one_torch_thread
from world_model.generation.explain import step_records, window_sources
from world_model.generation.sentence_bank import SentenceBank, bank_rollout, slot_log_probs
from world_model.models.decoding import slot_log_likelihood, write_known_sentences
from world_model.models.explanations import LastSliceProbe, slice_mass
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig, draw_probability, sample_ids
from world_model.text.vocab import PAD_ID, Vocabulary

WORDS = [
    "a red square moves to the right .",
    "the square stops at the wall .",
    "a ball falls down .",
    "the ball bounces off the floor .",
    "the ball rests on the floor .",
]
T, N = 4, 8


@pytest.fixture(autouse=True)
def single_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def vocab():
    return Vocabulary.build(WORDS)


def tiny_model(vocab, **options) -> FourTensorModel:
    torch.manual_seed(0)
    config = FourTensorConfig(
        vocab_size=len(vocab), d_x=4, d_t=2, n_heads=2, n_layers=2, n_tokens=N, n_states=T, **options
    )
    return FourTensorModel(config).eval()


def window_of(vocab, sentences: list[str]) -> torch.Tensor:
    """(1, T, N): the sentences left-padded with empty states."""
    ids = vocab.encode_batch(sentences, N)
    return torch.cat([torch.full((T - len(sentences), N), PAD_ID), ids])[None]


def row_of(candidates: torch.Tensor, ids: torch.Tensor) -> int:
    """The candidate row (C, N) equal to ids (N,)."""
    return int((candidates == ids).all(dim=1).nonzero()[0, 0])


@pytest.fixture
def windows(vocab):
    return torch.cat([window_of(vocab, WORDS[:2]), window_of(vocab, WORDS[2:5]), window_of(vocab, WORDS[1:2])])


@pytest.mark.parametrize("options", [{}, {"temporal_causal": True}, {"attention": "reference"}])
def test_recorded_attention_is_the_last_slice_of_the_full_attention(vocab, windows, options):
    model = tiny_model(vocab, **options)
    with torch.no_grad(), LastSliceProbe(model) as probe:
        model.encode(windows)
    weights = probe.weights()  # (passes, layers, B, H, N, N, T)
    assert weights.shape[:2] == (1, 2), "one pass, one record per layer"
    X = model.input_construction(windows).flatten(3)  # (B, N, T, d), the first layer's input
    pad = model.build_pad_mask(windows)
    first = model.layers[0]
    with torch.no_grad():
        full = first.attention.attention_weights(first.ln_attn(X), pad)  # (B, H, N, T, N, T)
    expected = full[:, :, :, -1].flatten(3)  # (B, H, N, N*T)
    torch.testing.assert_close(weights[0, 0].flatten(-2), expected, rtol=1e-5, atol=1e-6)
    assert all(a.last_slice_probe is None for a in (layer.attention for layer in model.layers)), "probe removed"


def test_known_sentence_readout_explains_with_a_direct_probability(vocab, windows):
    model = tiny_model(vocab)
    known = vocab.encode_batch(WORDS, N)
    seen = []
    states = model.rollout(windows, 2, candidates=known, explanations=seen, alternatives=3)
    assert torch.equal(states, model.rollout(windows, 2, candidates=known)), "explaining changes no choice"
    first = seen[0]
    with torch.no_grad():
        log_probs = model.readout_logits(model.last_slice_logits(windows)).log_softmax(-1)
    probs = slot_log_likelihood(log_probs, known, PAD_ID).softmax(-1)  # (B, C) softmax over the known sentences
    chosen = [row_of(known, s) for s in states[:, 0]]
    torch.testing.assert_close(first.probability, probs[torch.arange(3), chosen])
    for b in range(3):
        alternatives = first.alternative_probabilities[b]
        assert alternatives.shape == (3,)
        assert torch.all(alternatives[:-1] >= alternatives[1:]), "likeliest first"
        assert first.probability[b] >= alternatives[0], "greedy takes the likeliest"
        assert float(first.probability[b] + alternatives.sum()) <= 1 + 1e-6
        rows = [row_of(known, ids) for ids in first.alternatives[b]]
        assert chosen[b] not in rows and len(set(rows)) == 3
        torch.testing.assert_close(alternatives, probs[b, rows])
    for step in seen:
        assert step.slice_mass.shape == (3, T)
        torch.testing.assert_close(step.slice_mass.sum(dim=1), torch.ones(3))
        assert torch.all(step.slice_mass >= 0)
    assert torch.all(seen[0].slice_mass[2, :3] < 1e-6), "empty slices of the window draw no attention"


def test_token_readout_alternatives_change_one_word_and_are_ordered(vocab, windows):
    model = tiny_model(vocab)
    generation = GenerationConfig(end_ids=vocab.end_ids)
    seen = []
    states = model.rollout(windows, 1, generation, explanations=seen, alternatives=4)[:, 0]
    step = seen[0]
    with torch.no_grad():
        log_probs = model.readout_logits(model.last_slice_logits(windows)).log_softmax(-1)
    content = states != PAD_ID
    direct = (log_probs.gather(-1, states[..., None])[..., 0] * content).sum(1).exp()
    torch.testing.assert_close(step.probability, direct)
    for b in range(3):
        p = step.alternative_probabilities[b]
        assert torch.all(p[:-1] >= p[1:]) and float(step.probability[b] + p.sum()) <= 1 + 1e-6
        for ids in step.alternatives[b]:
            assert int((ids != states[b]).sum()) == 1, "one slot changed"
            assert torch.equal(ids != PAD_ID, content[b]), "same length"
    torch.testing.assert_close(step.slice_mass.sum(1), torch.ones(3))


def test_copy_path_reports_the_gate_and_the_pointer_mass_of_each_word(vocab, windows):
    model = tiny_model(vocab, copy_path=True)
    known = vocab.encode_batch(WORDS, N)
    seen = []
    states = model.rollout(windows, 1, candidates=known, explanations=seen)[:, 0]
    step = seen[0]
    content = states != PAD_ID
    with torch.no_grad():
        X = model.encode(windows)
        log_gate, _, pointer, key_ids = model.pointer(X, windows)
    rows = torch.arange(N) * T + T - 1
    mass = (pointer[:, rows] * (key_ids[:, None, :] == states[:, :, None])).sum(-1)
    torch.testing.assert_close(step.copy_mass, mass * content)
    torch.testing.assert_close(step.copy_gate, log_gate[:, rows].exp() * content)
    assert torch.all((step.copy_share >= 0) & (step.copy_share <= 1))
    assert torch.all(step.copy_share[~content] == 0)


def test_bank_readout_probability_is_the_softmax_of_its_ranking_scores(vocab, windows):
    model = tiny_model(vocab)
    bank = SentenceBank.encode(WORDS, [], vocab, N)
    seen = []
    states = bank_rollout(model, windows[:1], 1, bank, generation=GenerationConfig(alternatives=2), explanations=seen)[
        0, 0
    ]
    with torch.no_grad():
        log_probs = slot_log_probs(model, windows[:1])[0]
    length = (bank.candidates != PAD_ID).sum(1).float() ** 1.5
    scores = slot_log_likelihood(log_probs[None], bank.candidates, PAD_ID)[0] / length
    seen_rows = (bank.candidates[:, None] == windows[0][None]).all(-1).any(-1)
    probs = scores.masked_fill(seen_rows, float("-inf")).softmax(-1)
    row = row_of(bank.candidates, states)
    torch.testing.assert_close(seen[0].probability, probs[row : row + 1])
    assert probs[seen_rows].sum() == 0 and seen[0].alternative_probabilities.shape == (1, 2)
    torch.testing.assert_close(seen[0].slice_mass.sum(1), torch.ones(1))


def test_draw_probability_is_the_frequency_of_the_draw():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    draws = sample_ids(logits.expand(40000, 4), 0.7, 3, torch.Generator().manual_seed(0))
    frequency = torch.bincount(draws, minlength=4).double() / len(draws)
    drawn = draw_probability(logits.expand(4, 4), torch.arange(4), 0.7, 3)
    torch.testing.assert_close(drawn.double(), frequency, atol=0.01, rtol=0)
    assert drawn[3] == 0, "outside the top k: never drawn"


def test_sampled_steps_report_the_probability_they_were_drawn_with(vocab, windows):
    """At temperature 1 without top_k a closed-set draw has the readout's own probability; at another temperature a
    different one; greedy steps report none. The tokens readout's draw is the product over its content slots."""
    model = tiny_model(vocab)
    known = vocab.encode_batch(WORDS, N)
    bank = SentenceBank.encode(WORDS, [], vocab, N)
    for temperature in (1.0, 0.5):
        generation = GenerationConfig(temperature=temperature, end_ids=vocab.end_ids)
        closed, banked, free = [], [], []
        model.rollout(windows, 1, generation, torch.Generator().manual_seed(0), known, explanations=closed)
        bank_rollout(model, windows[:1], 1, bank, generation=generation, explanations=banked)
        states = model.rollout(windows, 1, generation, torch.Generator().manual_seed(0), explanations=free)[:, 0]
        for step in (closed[0], banked[0]):
            same = torch.isclose(step.draw_probability, step.probability)
            assert bool(same.all()) == (temperature == 1.0), (temperature, step.draw_probability, step.probability)
        with torch.no_grad():
            log_probs = model.readout_logits(model.last_slice_logits(windows)).log_softmax(-1)
        slots = (log_probs / temperature).log_softmax(-1).gather(-1, states[..., None])[..., 0]
        torch.testing.assert_close(free[0].draw_probability, slots.masked_fill(states == PAD_ID, 0).sum(1).exp())
    greedy = []
    model.rollout(windows, 1, candidates=known, explanations=greedy)
    assert greedy[0].draw_probability is None


def test_window_sources_name_captions_and_earlier_predictions(vocab):
    states = ["", "a ball falls down .", "the ball bounces off the floor ."]
    assert window_sources(states, captions=2) == [
        {"source": "empty", "index": None, "text": ""},
        {"source": "observed", "index": 0, "text": states[1]},
        {"source": "observed", "index": 1, "text": states[2]},
    ]
    assert [s["index"] for s in window_sources(states[1:], captions=5)] == [3, 4], "the last captions"


def test_step_records_slide_the_window_over_the_predictions(vocab, windows):
    model = tiny_model(vocab)
    known = vocab.encode_batch(WORDS, N)
    seen = []
    states = model.rollout(windows[:1], 3, candidates=known, explanations=seen)[0]
    window_states = ["", ""] + WORDS[:2]
    records = step_records(seen, states, window_states, captions=2, vocab=vocab)
    assert [len(r["attention"]) for r in records] == [T] * 3
    last = records[2]["attention"]
    assert [(s["source"], s["index"]) for s in last] == [
        ("observed", 0),
        ("observed", 1),
        ("predicted", 0),
        ("predicted", 1),
    ]
    assert last[2]["text"] == vocab.decode(states[0])
    for r in records:
        assert abs(sum(s["mass"] for s in r["attention"]) - 1) < 1e-3
        assert r["drew_on"] == max(r["attention"], key=lambda s: s["mass"])
        assert 0 <= r["probability"] <= 1 and [a["probability"] for a in r["alternatives"]] == sorted(
            (a["probability"] for a in r["alternatives"]), reverse=True
        )


@pytest.fixture(scope="module")
def known_predictor(parts, tmp_path_factory):
    """The tiny rollout set-up's predictor with a closed set of known sentences."""
    import shutil

    folder = tmp_path_factory.mktemp("known") / "predictor"
    shutil.copytree(parts["predictor"], folder)
    write_known_sentences(folder, ["a ball falls down .", "a ball falls .", "ball falls down ."])
    return str(folder)


def test_cli_explain_prints_probabilities_alternatives_and_the_caption_drawn_on(
    parts, known_predictor, tmp_path, capsys
):
    out = tmp_path / "run"
    models = ["--captioner", parts["captioner"], "--renderer", parts["renderer"], "--predictor", known_predictor]
    assert main([str(parts["clip"]), "--steps", "2", "--out", str(out), "--explain", *models]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "rollout.json").read_text())
    steps = record["predictions"][0]["explanations"]
    assert len(steps) == 2
    for s, step in enumerate(steps):
        assert f"  step {s + 1}: {record['predictions'][0]['sentences'][s]}  (p=" in printed
        assert len(step["alternatives"]) == 2, "the known sentences but the chosen one"
        assert 0 <= step["probability"] + sum(a["probability"] for a in step["alternatives"]) <= 1 + 1e-3
        assert abs(sum(a["mass"] for a in step["attention"]) - 1) < 1e-3
    assert printed.count("      or ") == 4 and printed.count("drew on most: ") == 2
    assert "drew on most: caption at t=" in printed, "the first step draws on a caption: the window holds nothing else"


def test_without_explain_the_output_is_unchanged_and_explanations_can_be_off(parts, tmp_path, capsys):
    models = ["--captioner", parts["captioner"], "--renderer", parts["renderer"], "--predictor", parts["predictor"]]
    assert main([str(parts["clip"]), "--steps", "1", "--out", str(tmp_path / "a"), *models]) == 0
    printed = capsys.readouterr().out
    assert "(p=" not in printed and "drew on most" not in printed
    record = json.loads((tmp_path / "a" / "rollout.json").read_text())
    assert record["predictions"][0]["explanations"][0]["alternatives"], "recorded by default (tokens readout)"
    assert (
        main([str(parts["clip"]), "--steps", "1", "--out", str(tmp_path / "b"), "--explanations", "false", *models])
        == 0
    )
    record = json.loads((tmp_path / "b" / "rollout.json").read_text())
    assert record["predictions"][0]["explanations"] is None


@pytest.mark.parametrize("options", [{}, {"copy_path": True}])
def test_a_window_shorter_than_T_grows_and_each_step_explains_its_own_window(vocab, options):
    model = tiny_model(vocab, **options)
    known = vocab.encode_batch(WORDS, N)
    short = vocab.encode_batch(WORDS[:2], N)[None]  # (1, 2, N): two states, T = 4
    seen = []
    states = model.rollout(short, 3, candidates=known, explanations=seen)[0]
    assert [step.slice_mass.shape[1] for step in seen] == [2, 3, 4]
    for s, step in enumerate(seen):
        window = torch.cat([short[0], states[:s]])[None]
        with torch.no_grad():
            log_probs = model.readout_logits(model.last_slice_logits(window)).log_softmax(-1)
        probs = slot_log_likelihood(log_probs, known, PAD_ID).softmax(-1)[0]
        torch.testing.assert_close(step.probability[0], probs[row_of(known, states[s])])
        torch.testing.assert_close(step.slice_mass.sum(1), torch.ones(1))
        with torch.no_grad(), LastSliceProbe(model) as alone:  # this step's window in a pass of its own
            model.last_slice_logits(window)
        direct = slice_mass(alone.weights(), states[s : s + 1] != PAD_ID)
        torch.testing.assert_close(step.slice_mass, direct, rtol=1e-5, atol=1e-6)
        if options:
            torch.testing.assert_close(
                step.copy_gate, alone.attribution(states[s : s + 1], log_probs, PAD_ID)["copy_gate"]
            )


def test_demo_cells_mark_copied_words_and_escape_model_text():
    from apps.demo.explain_view import attention_cell, sentence_cell
    from pipeline.record import ObservedFrame

    copy = [
        {"slot": 0, "word": "the", "gate": 0.1, "pointer_mass": 0.2, "share": 0.05},
        {"slot": 1, "word": "ball", "gate": 0.8, "pointer_mass": 0.9, "share": 0.93},
    ]
    cell = sentence_cell("the ball", {"copy": copy})
    assert cell.count("<mark") == 1 and '<mark class="copied" title="pointer 0.90, gate 0.80">ball</mark>' in cell
    assert sentence_cell("a <b>|c*", None) == "a &lt;b&gt;&#124;c&#42;"
    step = {
        "attention": [
            {"source": "observed", "index": 0, "text": "x", "mass": 0.25},
            {"source": "empty", "index": None, "text": "", "mass": 0.75},
        ]
    }
    bars = attention_cell(step, [ObservedFrame(2.0, 20, "x", None, "observed/000.png")])
    assert bars.count("<meter") == 2 and "t=2.0s" in bars and 'value="0.7500"' in bars


def test_demo_table_shows_the_draw_probability_of_sampled_steps_only():
    from apps.demo.explain_view import predicted_rows
    from pipeline.record import Prediction

    step = {"probability": 0.5, "alternatives": [], "attention": None, "drew_on": None, "copy": None}
    greedy = predicted_rows(Prediction(["a ball falls down."], [[1]], [step], ["x.png"]), [])
    sampled = predicted_rows(
        Prediction(["a ball falls down."], [[1]], [{**step, "draw_probability": 0.23}], ["x.png"]), []
    )
    assert "p-drawn" not in greedy[0]
    assert '<span class="p-chosen">0.500</span><br><span class="p-drawn">drawn 0.230</span>' in sampled[0]

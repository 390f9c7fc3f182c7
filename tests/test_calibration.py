"""Calibration of the next-state probabilities against the synthetic world's exact distributions
(world_model.evaluation.calibration), and the temperature a rollout then reports with."""

import json
import math

import pytest
import torch

from tests.model_factories import one_torch_thread
from world_model.data.synthetic import generator
from world_model.data.synthetic.episodes import episode_sentences, read_episodes, sentence_windows
from world_model.data.synthetic.scenes import FIRST_SCENE_TYPES
from world_model.evaluation import calibration
from world_model.evaluation.calibration import fit_temperature, metrics
from world_model.generation.readouts import resolve_readout
from world_model.models.decoding import slot_log_likelihood, write_known_sentences
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig
from world_model.models.registry import load_predictor
from world_model.text.vocab import PAD_ID, Vocabulary


def test_the_true_distribution_itself_is_perfectly_calibrated_and_at_the_floors():
    truth = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.1, 0.1, 0.8]], dtype=torch.float64)
    m = metrics(truth.log(), truth, torch.zeros(3))
    assert m["ece"] == pytest.approx(0.0, abs=1e-12)
    assert m["brier"] == pytest.approx(m["brier_floor"]) and m["log_loss"] == pytest.approx(m["log_loss_floor"])
    assert m["accuracy"] == pytest.approx((0.5 + 1.0 + 0.8) / 3)


def test_metrics_by_hand():
    truth = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    scores = torch.tensor([[0.9, 0.1], [0.9, 0.1]], dtype=torch.float64).log()
    m = metrics(scores, truth, torch.zeros(2))
    assert m["ece"] == pytest.approx(abs(0.9 - 0.75)), "both in one bin: confidence 0.9, right 0.5 and 1.0"
    assert m["brier"] == pytest.approx((0.82 + 0.02) / 2)
    assert m["log_loss"] == pytest.approx((-0.5 * math.log(0.9) - 0.5 * math.log(0.1) - math.log(0.9)) / 2)
    assert m["log_loss_floor"] == pytest.approx(math.log(2) / 2)
    assert [b["windows"] for b in m["bins"]] == [2]


def test_fitted_temperature_undoes_overconfidence():
    torch.manual_seed(0)
    truth = torch.rand(200, 6, dtype=torch.float64).pow(3).softmax(dim=1)
    truth = (truth * 8).softmax(dim=1)  # peaked, but not one-hot
    overconfident = 3.0 * truth.log()  # softmax(3 log p) is p sharpened
    assert fit_temperature(overconfident, truth, torch.zeros(200)) == pytest.approx(3.0, rel=0.03)
    assert (
        metrics(overconfident, truth, torch.zeros(200), 3.0)["ece"]
        < metrics(overconfident, truth, torch.zeros(200))["ece"]
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny splits of the synthetic world and a random 4-tensor predictor with their known sentences."""
    root = tmp_path_factory.mktemp("world")
    small = {"seconds": 4, "size": 16, "scenes": FIRST_SCENE_TYPES}
    generator.generate(4, 1, root / "data", split="heldout", **small)
    generator.generate(4, 2, root / "data", split="train", **small)
    sentences = [
        s for split in ("heldout", "train") for r in read_episodes(root / "data" / split) for s in episode_sentences(r)
    ]
    vocab = Vocabulary.build(sentences)
    with one_torch_thread():
        torch.manual_seed(0)
        model = FourTensorModel(
            FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1, n_states=3)
        )
    model.save_pretrained(root / "predictor", vocab=vocab)
    write_known_sentences(root / "predictor", sentences)
    return root


def test_command_reports_both_temperatures_and_saves_the_fitted_one(world, capsys):
    out = world / "out"
    args = ["--checkpoint", str(world / "predictor"), "--heldout", str(world / "data" / "heldout")]
    args += ["--train", str(world / "data" / "train"), "--out", str(out), "--save"]
    with one_torch_thread():
        assert calibration.main(args) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["at_1"]["windows"] == 4 * 3, "every second t >= 1 of four 4-second episodes"
    assert result["mass_outside_known"] == 0
    for key in ("at_1", "at_fitted"):
        m = result[key]
        assert 0 <= m["ece"] <= 1 and m["brier"] >= m["brier_floor"] - 1e-9 and m["log_loss"] >= m["log_loss_floor"]
    assert result["command"].startswith("python -m world_model.evaluation.calibration --checkpoint")
    assert "--split heldout --episodes 4 --seed 1" in result["heldout_made_by"]
    assert (out / "reliability.png").stat().st_size > 1000 and "| 1, all | 12 |" in (out / "results.md").read_text()
    saved = json.loads((world / "predictor" / "calibration.json").read_text())
    assert saved["temperature"] == result["fitted_temperature"]


def test_a_rollout_reports_known_sentence_probabilities_at_the_saved_temperature(world):
    folder = world / "predictor"
    (folder / "calibration.json").write_text(json.dumps({"temperature": 4.0}))
    model, vocab, known = load_predictor(folder)
    readout = resolve_readout(folder, known, "auto", vocab, model.config.n_tokens)
    assert readout.confidence_temperature == 4.0 and "confidence temperature 4" in readout.name
    window = vocab.encode_batch(episode_sentences(read_episodes(world / "data" / "heldout")[0])[:3], 16)[None]
    seen = []
    with one_torch_thread():
        (states,) = readout.futures(model, vocab, window, 1, GenerationConfig(), seen)
        with torch.no_grad():
            log_probs = model.readout_logits(model.last_slice_logits(window)).log_softmax(-1)
    probs = (slot_log_likelihood(log_probs, known, PAD_ID) / 4.0).softmax(-1)[0]
    chosen = int((known == states[0]).all(dim=1).nonzero()[0, 0])
    assert seen[0][0].probability.item() == pytest.approx(probs[chosen].item(), rel=1e-5)
    (folder / "calibration.json").write_text(json.dumps({"temperature": -1}))
    with pytest.raises(ValueError, match="calibration.json: 'temperature' must be a positive number"):
        resolve_readout(folder, known, "auto", vocab, model.config.n_tokens)


def test_the_flat_baseline_calibrates_on_the_last_episodes_of_a_split(world, tmp_path):
    from world_model.evaluation.model_forecasts import candidate_scores as closed_set_scores
    from world_model.evaluation.model_forecasts import known_sentences
    from world_model.models.baseline import BaselineModel
    from world_model.models.baseline_config import BaselineConfig

    _, vocab, known = load_predictor(world / "predictor")
    with one_torch_thread():
        torch.manual_seed(0)
        baseline = BaselineModel(
            BaselineConfig(content_vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1, n_states=3)
        )
    baseline.save_pretrained(tmp_path / "baseline", vocab=vocab)
    write_known_sentences(tmp_path / "baseline", known_sentences(known, vocab))
    with one_torch_thread():
        train = world / "data" / "train"
        result = calibration.calibrate(tmp_path / "baseline", train, train, 1)  # fitted and reported on one episode
    assert result["at_1"]["windows"] == 3 and result["episodes"] == 1  # the last episode's seconds t >= 1
    assert result["fitted_temperature"] > 0 and result["at_fitted"]["log_loss"] <= result["at_1"]["log_loss"] + 1e-9
    last = read_episodes(world / "data" / "heldout")[-1:]
    baseline, vocab, known = load_predictor(tmp_path / "baseline")
    with one_torch_thread():
        scores = calibration.candidate_scores(baseline, vocab, last, known)
        windows = sentence_windows([episode_sentences(r) for r in last], vocab, 3, baseline.config.n_tokens)[:, :-1]
        expected = baseline.score_sentences(windows, known)
    kept = scores > float("-inf")  # candidates pruned as unlikely score -inf; the others score exactly
    assert kept.any(dim=1).all() and torch.allclose(scores[kept], expected.double()[kept], atol=1e-4)
    assert torch.equal(scores, closed_set_scores(baseline, windows, known).double())

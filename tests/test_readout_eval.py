"""The readability measures of world_model.evaluation.readout_eval, by hand, and the command on a tiny ROCStories folder."""

import json

import pytest
import torch

from tests.test_rocstories import make_folder
from world_model.data.rocstories import build_vocabulary, load_corpus
from world_model.evaluation.readout_eval import main
from world_model.evaluation.readout_metrics import attested, one_step_measures, repeat_share, well_formed, word_f1
from world_model.generation.bank_file import write_rocstories_bank
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.text.vocab import Vocabulary, tokenize


def test_well_formed_needs_attested_ngrams_and_final_punctuation():
    grams = attested(["Tom had a dog.", "The dog ran."], 3)
    assert well_formed(tokenize("The dog ran."), grams, 3)
    assert not well_formed(tokenize("Tom had a dog"), grams, 3)  # no final punctuation
    assert not well_formed(tokenize("Tom had a dog ran."), grams, 3)  # "a dog ran" is not attested
    assert well_formed(tokenize("Tom had a dog ran."), attested(["Tom had a dog.", "The dog ran."], 2), 2)


def test_word_f1_counts_words_as_multisets_without_punctuation():
    assert word_f1(tokenize("he was happy."), tokenize("He was happy!")) == 1.0
    # predicted {he, he, was}, true {he, ran}: one shared; precision 1/3, recall 1/2 -> F1 0.4.
    assert abs(word_f1(tokenize("he he was."), tokenize("he ran.")) - 0.4) < 1e-9
    assert word_f1(tokenize("he was happy."), tokenize("he ran."), skip=frozenset({"he"})) == 0.0


def test_repeat_share_counts_rollouts_that_repeat_the_window_or_themselves():
    window = torch.tensor([[[0, 0], [5, 6]], [[0, 0], [5, 6]], [[0, 0], [5, 6]]])  # (S=3, T=2, N=2)
    states = torch.tensor([[[7, 8], [9, 9]], [[7, 8], [7, 8]], [[5, 6], [7, 8]]])  # clean, self-repeat, window
    assert repeat_share(window, states) == 2 / 3


def test_the_command_writes_results_with_ten_examples_at_most(tmp_path):
    (tmp_path / "data").mkdir()
    data = make_folder(tmp_path / "data")
    vocab = build_vocabulary(load_corpus(data))
    torch.manual_seed(0)
    FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
        tmp_path / "ckpt", vocab=vocab
    )
    write_rocstories_bank(tmp_path / "ckpt", data)
    assert (
        main(
            [
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "--data",
                str(data),
                "--out",
                str(tmp_path / "out"),
                "--rollout-contexts",
                "2",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    bank = next(r for name, r in results["results"].items() if name.startswith("bank") and "guard on" in name)
    assert bank["well_formed_3grams"] == 1.0 and bank["in_bank"] == 0  # training sentences; new endings
    assert "rollout_repeat_share" in results["results"]["tokens"]
    assert results["results"]["true next sentence"]["word_f1"] == 1.0
    assert len(results["examples"]) == 2 and "| 0 |" in (tmp_path / "out" / "results.md").read_text()


def test_the_command_refuses_a_folder_without_a_bank_and_bad_counts(tmp_path, capsys):
    data = make_folder(tmp_path)
    vocab = build_vocabulary(load_corpus(data))
    FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
        tmp_path / "ckpt", vocab=vocab
    )
    common = ["--checkpoint", str(tmp_path / "ckpt"), "--data", str(data), "--out", str(tmp_path / "out")]
    assert main(common) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'ckpt'} has no sentence bank")
    with pytest.raises(SystemExit) as stopped:
        main([*common, "--heldout", "0"])
    assert stopped.value.code == 2 and "--heldout must be >= 1" in capsys.readouterr().err


def test_one_step_measures_report_the_share_of_predictions_that_restate_their_context():
    vocab = Vocabulary.build(["Tom went to the store.", "He bought milk.", "She slept."])
    encode = lambda texts: vocab.encode_batch(texts, 8)  # noqa: E731
    context = torch.stack([encode(["Tom went to the store.", "He bought milk."])] * 2)  # (S=2, T=2, N=8)
    predicted = encode(["Tom went to the store.", "She slept."])  # the first restates sentence 1
    true = encode(["She slept.", "She slept."])
    measures = one_step_measures(predicted, true, vocab, {}, None, frozenset({"the", "to"}), context)
    assert measures["restated"] == 0.5
    assert "restated" not in one_step_measures(predicted, true, vocab, {}, None)

"""The opt-in coherence head: its pieces by hand, training on a tiny folder, and the folder round trip."""

import json
import shutil

import pytest
import torch

from tests.test_sentence_bank import STORY, VOCAB, N, ids
from tests.test_train import make_data
from world_model.data.rocstories import build_vocabulary, encode_windows, load_corpus
from world_model.evaluation.evaluate import WITH_HEAD, EvaluateSettings, evaluate_checkpoint
from world_model.generation.bank_file import SentenceBank, save_bank
from world_model.generation.predict import SHIPPED_CHECKPOINT
from world_model.generation.readouts import resolve_readout
from world_model.generation.sentence_bank import BankRanking, bank_rollout
from world_model.models.checkpoint import CheckpointError
from world_model.models.coherence_head import (
    HEAD_CONFIG,
    CoherenceHead,
    CoherenceHeadConfig,
    likelihood_ratio,
    load_coherence_head,
    pooled_state,
    save_coherence_head,
    token_log_likelihood,
)
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.registry import load_predictor
from world_model.training import coherence as training


def test_pooled_state_averages_live_slots_of_the_last_sentence_and_of_the_window():
    X = torch.arange(3 * 2, dtype=torch.float32).view(1, 3, 2, 1)  # (B=1, N=3, T=2, d=1): X[x, t] = 2x + t
    window = torch.tensor([[[5, 0, 0], [6, 7, 0]]])  # (B, T, N): sentence 0 one token, sentence 1 two
    # last sentence: slots 0, 1 of t = 1 -> (1 + 3) / 2; every live slot: 0, 1, 3 -> 4 / 3
    assert pooled_state(X, window).tolist() == [[2.0, pytest.approx(4 / 3)]]


def test_likelihood_ratio_is_per_token_and_skips_padding_and_unknown_words():
    log_probs = torch.log(torch.tensor([[[0.0, 0.0, 0.1, 0.5, 0.4], [0.0, 0.0, 0.1, 0.2, 0.7]]]))  # (B=1, N=2, V=5)
    blank = torch.log(torch.tensor([[0.0, 0.0, 0.1, 0.25, 0.65], [0.0, 0.0, 0.1, 0.7, 0.2]]))  # (N, V); pad, unk -inf
    candidates = torch.tensor([[[3, 4], [4, 0], [1, 4]]])  # (B, K=3, N): two words, one and padding, unknown and one
    ratio = likelihood_ratio(log_probs, blank, candidates)
    expected = [
        (torch.log(torch.tensor(2.0)) + torch.log(torch.tensor(3.5))) / 2,
        torch.log(torch.tensor(0.4 / 0.65)),
        torch.log(torch.tensor(3.5)),  # the unknown word is not scored: the readouts give it -inf under both
    ]
    assert torch.allclose(ratio[0], torch.stack(expected))
    likelihood = token_log_likelihood(log_probs, candidates)  # the window's side of the ratio alone
    assert torch.allclose(likelihood[0], torch.log(torch.tensor([(0.5 * 0.7) ** 0.5, 0.4, 0.7])))


def test_the_likelihood_weight_is_the_best_val_cloze_that_retrieves_as_well_as_the_predictor():
    trade = {
        0.0: {"cloze": 0.58, "mrr": 0.19},
        1.0: {"cloze": 0.57, "mrr": 0.33},
        4.0: {"cloze": 0.57, "mrr": 0.40},  # ties 1.0 on cloze: the first wins
        8.0: {"cloze": 0.55, "mrr": 0.39},
    }
    assert training.pick_likelihood_weight(trade, predictor_mrr=0.33) == 1.0
    assert training.pick_likelihood_weight(trade, predictor_mrr=0.34) == 4.0
    assert training.pick_likelihood_weight(trade, predictor_mrr=0.5) == 0.0  # none retrieves as well: the head alone


def test_the_heads_score_adds_the_weighted_likelihood_and_the_bank_ranks_by_the_same_score():
    torch.manual_seed(0)
    model = FourTensorModel(FourTensorConfig(vocab_size=len(VOCAB), d_x=4, d_t=2, n_heads=1, n_layers=1, n_tokens=N))
    model.eval()
    head = CoherenceHead(CoherenceHeadConfig(vocab_size=len(VOCAB), d_state=2 * model.config.d)).eval()
    bank = SentenceBank.encode(STORY[3:], [], VOCAB, N)
    window = torch.tensor([[ids(s) for s in STORY[:3]]])  # (1, T=3, N)
    plain = head.score(model, window, bank.candidates[None])[0]
    head.config.likelihood_weight = 1e6
    heavy = head.score(model, window, bank.candidates[None])[0]
    _, log_probs, _ = head.context_and_log_probs(model, window)
    likelihood = token_log_likelihood(log_probs, bank.candidates[None])[0]
    assert torch.allclose(heavy - plain, 1e6 * likelihood, rtol=1e-4)
    assert heavy.argmax() == likelihood.argmax() != plain.argmax()  # the weight moves the head's choice here
    chosen = bank_rollout(
        model, window, 1, bank, BankRanking(names=False, guard=False, coherence=head, coherence_weight=1.0)
    )
    assert torch.equal(chosen[0, 0], bank.candidates[likelihood.argmax()])


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    root = tmp_path_factory.mktemp("coherence")
    data = make_data(root / "data")
    vocab = build_vocabulary(load_corpus(data))
    torch.manual_seed(0)
    config = FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1, temporal_causal=True)
    FourTensorModel(config).save_pretrained(root / "ckpt", vocab=vocab)
    return root / "ckpt", data


def test_one_pass_gives_every_prefix_state_of_a_causal_predictor(predictor):
    folder, data = predictor
    model = FourTensorModel.from_pretrained(folder)
    windows = encode_windows(load_corpus(data).train[:3], build_vocabulary(load_corpus(data)))
    states = training.prefix_states(model, windows)
    assert states.shape == (3, 4, 2 * model.config.d)
    for k in (1, 2, 4):
        ids = windows[:, :k]
        assert torch.allclose(states[:, k - 1], pooled_state(model.encode(ids), ids), atol=1e-5)


def test_training_writes_a_head_that_loads_with_the_predictor(predictor, tmp_path):
    folder, data = predictor
    report_path = tmp_path / "report.json"
    argv = ["--checkpoint", str(folder), "--data", str(data), "--seeds", "0", "1", "--out", str(tmp_path / "head")]
    assert training.main([*argv, "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert [r["head"]["seed"] for r in report["seeds"]] == [0, 1]
    assert report["seeds"][0]["head"]["model_weight"] in training.MODEL_WEIGHTS
    assert report["summary"]["test"]["n"] == 2 and len(report["summary"]["test"]["ci95"]) == 2
    model = FourTensorModel.from_pretrained(folder)
    head = load_coherence_head(tmp_path / "head", model)
    assert head.config.extra["seed"] == 0 and 1 <= head.config.extra["epoch"] <= training.EPOCHS
    v = model.config.vocab_size
    window, candidates = torch.randint(2, v, (2, 4, 16)), torch.randint(2, v, (2, 3, 16))
    assert head.score(model, window, candidates).shape == (2, 3)
    assert load_coherence_head(folder, model) is None  # the predictor folder itself has none


def test_coherence_refuses_where_it_would_lose_something_before_training(predictor, tmp_path, capsys, monkeypatch):
    import hashlib

    folder, data = predictor
    shutil.copytree(folder, tmp_path / "ckpt")
    model = FourTensorModel.from_pretrained(folder)
    save_coherence_head(
        CoherenceHead(CoherenceHeadConfig(model.config.vocab_size, 2 * model.config.d)), tmp_path / "ckpt"
    )

    def digests():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "ckpt").iterdir()}

    before = digests()
    monkeypatch.setattr(training, "train_coherence_heads", lambda *a: pytest.fail("trained before refusing"))
    argv = ["--checkpoint", str(tmp_path / "ckpt"), "--data", str(data)]
    assert training.main(argv) == 2  # the folder's head would be replaced
    assert "already holds a coherence head" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("")
    assert training.main([*argv, "--out", str(tmp_path / "new"), "--report", str(tmp_path / "a_file" / "r.json")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert training.main([*argv, "--out", str(tmp_path / "new"), "--report", str(tmp_path / "ckpt" / "r.json")]) == 2
    assert "lies inside the checkpoint" in capsys.readouterr().err
    (tmp_path / "kept.json").write_text("{}")
    assert training.main([*argv, "--out", str(tmp_path / "new"), "--report", str(tmp_path / "kept.json")]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert digests() == before and (tmp_path / "kept.json").read_text() == "{}" and not (tmp_path / "new").exists()


def test_a_head_for_another_predictor_is_refused(tmp_path):
    head = CoherenceHead(CoherenceHeadConfig(vocab_size=30, d_state=16))
    save_coherence_head(head, tmp_path)
    model = FourTensorModel(FourTensorConfig(vocab_size=31, d_x=4, d_t=2, n_heads=1, n_layers=1))
    with pytest.raises(CheckpointError, match="vocabulary of 30 and states of width 16"):
        load_coherence_head(tmp_path, model)
    (tmp_path / HEAD_CONFIG).write_text("{not json")
    with pytest.raises(CheckpointError, match="does not describe a coherence head"):
        load_coherence_head(tmp_path)


def test_the_bank_ranked_with_a_heavy_head_picks_the_heads_favourite(tmp_path):
    torch.manual_seed(0)
    model = FourTensorModel(FourTensorConfig(vocab_size=len(VOCAB), d_x=4, d_t=2, n_heads=1, n_layers=1, n_tokens=N))
    model.eval()
    head = CoherenceHead(CoherenceHeadConfig(vocab_size=len(VOCAB), d_state=2 * model.config.d, model_weight=0.5))
    head.eval()
    bank = SentenceBank.encode(STORY[3:], [], VOCAB, N)
    window = torch.tensor([[ids(s) for s in STORY[:3]]])  # (1, T=3, N)
    favourite = head.score(model, window, bank.candidates[None])[0].argmax()
    plain = bank_rollout(model, window, 1, bank, BankRanking(names=False, guard=False))[0, 0]
    heavy = bank_rollout(
        model, window, 1, bank, BankRanking(names=False, guard=False, coherence=head, coherence_weight=1e6)
    )
    assert torch.equal(heavy[0, 0], bank.candidates[favourite])
    assert not torch.equal(plain, bank.candidates[favourite])  # the likelihood alone picks another sentence here
    model.save_pretrained(tmp_path, vocab=VOCAB)
    save_bank(tmp_path, STORY[3:], [], "test")
    with pytest.raises(ValueError, match="coherence needs coherence_head.json"):
        resolve_readout(tmp_path, None, "auto", VOCAB, N, coherence_for=model)
    save_coherence_head(head, tmp_path)
    readout = resolve_readout(tmp_path, None, "auto", VOCAB, N, coherence_for=model)
    assert readout.kind == "bank" and readout.coherence is not None
    with pytest.raises(ValueError, match="ranks the sentences of a bank readout"):
        resolve_readout(tmp_path, None, "tokens", VOCAB, N, coherence_for=model)


def test_evaluate_reports_the_model_with_its_folders_head(predictor, tmp_path):
    folder, data = predictor
    shutil.copytree(folder, tmp_path / "ckpt")
    model = FourTensorModel.from_pretrained(folder)
    head = CoherenceHead(CoherenceHeadConfig(vocab_size=model.config.vocab_size, d_state=2 * model.config.d))
    save_coherence_head(head, tmp_path / "ckpt")
    result = evaluate_checkpoint(EvaluateSettings(checkpoint=tmp_path / "ckpt", data=data, device="cpu"))
    row = result["coherence"][WITH_HEAD]
    assert row["model_weight"] == 0.0 and row["retrieval"]["candidates"] == 11
    assert result["coherence"]["model"]["rule"] in ("summed", "per_token", "ratio_summed", "ratio_per_token")


def test_a_lone_pair_has_nothing_to_lose_against_its_batch_but_its_story_to_tell_apart():
    torch.manual_seed(0)
    windows = torch.randint(2, 30, (3, 5, 6))
    head = CoherenceHead(CoherenceHeadConfig(vocab_size=30, d_state=8))
    states = torch.randn(3, 4, 8)
    stories, k = torch.tensor([1]), torch.tensor([2])
    assert training.pair_loss(head, windows, states, stories, k, same_story=False).item() == 0.0  # one candidate
    assert training.pair_loss(head, windows, states, stories, k).item() > 0.0  # S(2) against S(0, 1, 3, 4)


@pytest.mark.parametrize(
    "story, endings",
    [
        (
            [
                "Lisa had a big math test on Friday.",
                "She studied all week.",
                "On Friday she felt ready.",
                "She took the test calmly.",
            ],
            [
                "She got an A on the test.",
                "He bought a new car at the store.",
                "The dog barked at the mailman all night.",
            ],
        ),
        (
            ["Tom was very hungry.", "He went to the kitchen.", "He opened the fridge.", "There was nothing to eat."],
            ["He ordered a pizza instead.", "Lisa got an A on her math test.", "The plane landed safely in Paris."],
        ),
    ],
)
def test_the_shipped_predictor_and_its_head_prefer_the_ending_that_fits(story, endings):
    model, vocab, _ = load_predictor(SHIPPED_CHECKPOINT)
    head = load_coherence_head(SHIPPED_CHECKPOINT, model)  # refused if it does not fit the shipped predictor
    window = torch.tensor([[vocab.encode(s) for s in story]])
    candidates = torch.tensor([[vocab.encode(s) for s in endings]])
    assert head.score(model, window, candidates)[0].argmax() == 0

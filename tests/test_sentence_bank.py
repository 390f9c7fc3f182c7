"""The sentence-bank readout (world_model.generation.sentence_bank): whole bank sentences scored by a tiny model whose
per-slot distributions are set by hand, names of the window put in, the repeat guard, the bank file a predictor
folder carries, and the readout choice of `world_model.generation.predict`."""

import gzip

import pytest
import torch

from tests.test_baseline import V as BASELINE_V
from tests.test_baseline import make_model as make_baseline
from tests.test_predict import tiny_checkpoint
from world_model.generation.bank_file import BANK_NAME, SentenceBank, find_names, load_bank, save_bank
from world_model.generation.predict import main, predict
from world_model.generation.readouts import resolve_readout
from world_model.generation.sentence_bank import BankRanking, bank_rollout, bank_scores
from world_model.models.decoding import slot_log_likelihood, write_known_sentences
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig
from world_model.text.vocab import Vocabulary

STORY = [
    "Tom was hungry.",
    "He went to the kitchen.",
    "He ate a sandwich.",
    "Anna went to the park.",
    "Then Anna went home.",
    "Anna's dog barked.",
    "Tom was full.",
    "He was happy.",
    "Later Tom went home.",
    "Tom's dog barked at Anna.",
]
VOCAB = Vocabulary.build(STORY)
N = 8


def ids(sentence: str) -> list[int]:
    return VOCAB.encode(sentence, N, strict=True)


def model_preferring(slot_words: list[dict[str, float]]) -> FourTensorModel:
    """A tiny 4-tensor model whose next-state distribution is fixed: slot n puts the given probabilities on its
    words and spreads the rest evenly over the vocabulary, whatever the window."""
    model = FourTensorModel(FourTensorConfig(vocab_size=len(VOCAB), d_x=4, d_t=2, n_heads=1, n_layers=1, n_tokens=N))
    probs = torch.full((N, len(VOCAB)), 1e-4)
    for n, words in enumerate(slot_words):
        for word, p in words.items():
            probs[n, VOCAB.stoi[word]] = p
    model.last_slice_logits = lambda window: probs.log().expand(len(window), N, len(VOCAB))
    return model.eval()


def window_of(*sentences: str) -> torch.Tensor:
    """(1, T=4, N) window, left-padded with empty states."""
    rows = [[0] * N] * (4 - len(sentences)) + [ids(s) for s in sentences]
    return torch.tensor([rows])


def bank_of(*sentences: str) -> SentenceBank:
    return SentenceBank.encode(sentences, ["tom", "anna"], VOCAB, N)


def decoded(states: torch.Tensor) -> list[str]:
    return [VOCAB.decode(row) for row in states.reshape(-1, N)]


# A draw between "he was happy ." and "tom was full .": the per-slot winners ("he was full .") are neither.
DRAW = [{"he": 0.55, "tom": 0.45}, {"was": 0.9}, {"happy": 0.45, "full": 0.55}, {".": 0.9}]


def test_bank_picks_the_likeliest_whole_sentence_where_the_slot_readout_mixes_two():
    model = model_preferring(DRAW)
    bank = bank_of("he was happy.", "tom was full.", "he went to the kitchen.")
    tokens = model.rollout(window_of("Tom was hungry."), 1, GenerationConfig(end_ids=VOCAB.end_ids))
    assert decoded(tokens) == ["he was full."]
    # By hand: he/happy .55 * .45 against tom/full .45 * .55, a tie; "he" comes first in slot 0 but "full"
    # wins slot 2. Tip it: "tom was full." at .45 * .6 beats "he was happy." at .55 * .4.
    model = model_preferring([DRAW[0], DRAW[1], {"happy": 0.4, "full": 0.6}, DRAW[3]])
    chosen = bank_rollout(model, window_of("Tom was hungry."), 1, bank, BankRanking(names=False))
    assert decoded(chosen) == ["tom was full."]


def test_length_power_decides_between_a_short_and_a_long_sentence():
    bank = bank_of("he was happy.", "he went to the kitchen.")
    model = model_preferring(
        [
            {"he": 0.9},
            {"was": 0.45, "went": 0.45},
            {"happy": 0.45, "to": 0.45},
            {".": 0.45, "the": 0.45},
            {"kitchen": 0.9},
            {".": 0.9},
        ]
    )
    # short: .9 * .45^3 = 0.082 (mean log -0.63); long: .9 * .45^3 * .9 * .9 = 0.066 (mean log -0.45).
    assert decoded(bank_rollout(model, window_of("Tom was hungry."), 1, bank, BankRanking(length_power=0.0))) == [
        "he was happy."
    ]
    assert decoded(bank_rollout(model, window_of("Tom was hungry."), 1, bank, BankRanking(length_power=1.0))) == [
        "he went to the kitchen."
    ]


def test_names_of_the_window_replace_the_bank_sentence_names():
    model = model_preferring([{"tom": 0.5, "anna": 0.1}, {"went": 0.5}, {"home": 0.5}, {".": 0.9}])
    bank = bank_of("anna went home.", "he was happy.", "anna's dog barked.")
    assert decoded(bank_rollout(model, window_of("Tom was hungry."), 1, bank)) == ["tom went home."]
    assert decoded(bank_rollout(model, window_of("Tom was hungry."), 1, bank, BankRanking(names=False))) == [
        "anna went home."
    ]
    edits = bank.name_edits(bank.context_names(window_of("Tom was hungry.")[0]))
    assert decoded(bank.substitute_edits(edits)) == ["tom went home.", "he was happy.", "tom's dog barked."]
    # Two people in the window: a bank sentence's first name becomes the window's first, and so on.
    two = bank.context_names(window_of("Tom went to the park.", "Anna was hungry.")[0])
    assert two == [VOCAB.stoi["tom"], VOCAB.stoi["anna"]]


def test_scores_with_names_put_in_equal_the_slot_log_likelihood_of_the_substituted_bank():
    torch.manual_seed(0)
    bank = bank_of(*STORY, "Tom's dog barked at Anna.")
    log_probs = torch.randn(N, len(VOCAB)).log_softmax(-1)
    log_probs[:, 0] = float("-inf")  # padding, as `slot_log_probs` leaves it
    edits = bank.name_edits([VOCAB.stoi["anna"], VOCAB.stoi["tom"]])
    expected = slot_log_likelihood(log_probs[None], bank.substitute_edits(edits), padding_idx=0)[0]
    assert torch.allclose(bank_scores(bank, edits, log_probs), expected, atol=1e-5)
    assert decoded(bank.substitute_edits(edits))[-1] == "anna's dog barked at tom."


def test_repeat_guard_skips_sentences_already_in_the_window():
    model = model_preferring(
        [
            {"he": 0.9},
            {"was": 0.5, "went": 0.3},
            {"happy": 0.5, "to": 0.3},
            {".": 0.5, "the": 0.3},
            {"kitchen": 0.3},
            {".": 0.3},
        ]
    )
    bank = bank_of("he was happy.", "he went to the kitchen.")
    window = window_of("Tom was hungry.", "He was happy.")
    assert decoded(bank_rollout(model, window, 1, bank, BankRanking(guard=False))) == ["he was happy."]
    assert decoded(bank_rollout(model, window, 1, bank)) == ["he went to the kitchen."]
    # Over three steps the guard alternates instead of repeating one sentence; without it, one sentence loops.
    assert (
        decoded(bank_rollout(model, window_of("Tom was hungry."), 3, bank, BankRanking(guard=False)))
        == ["he was happy."] * 3
    )
    looped = decoded(bank_rollout(model, window_of("Tom was hungry."), 3, bank))
    assert looped[:2] == ["he was happy.", "he went to the kitchen."]


def test_sampling_from_the_bank_is_seeded_and_returns_bank_sentences():
    model = model_preferring(DRAW)
    bank = bank_of("he was happy.", "tom was full.", "he went to the kitchen.")
    window = window_of("Tom was hungry.").expand(16, 4, N)
    draw = lambda seed: bank_rollout(
        model,
        window,
        2,
        bank,
        generation=GenerationConfig(temperature=3.0),
        generator=torch.Generator().manual_seed(seed),
    )
    assert torch.equal(draw(1), draw(1))
    said = set(decoded(draw(1)))
    assert said <= {"he was happy.", "tom was full.", "he went to the kitchen."} and len(said) > 1


def test_the_flat_baseline_reads_off_the_bank_through_its_own_sentence_scores():
    model = make_baseline(scale=1.0)
    rows = torch.tensor([[4, 9, 3, 0, 0], [5, 6, 7, 3, 0], [10, 11, 3, 0, 0]])  # N = 5, T = 3 there
    bank = SentenceBank(rows, *torch.zeros(3, 0, dtype=torch.long), torch.zeros(0, dtype=torch.bool), {}, {})
    window = torch.randint(2, BASELINE_V, (2, 3, 5), generator=torch.Generator().manual_seed(0))
    chosen = bank_rollout(model, window, 1, bank, BankRanking(guard=False, length_power=0.0))[:, 0]
    expected = rows[model.score_sentences(window, rows).argmax(dim=1)]
    assert torch.equal(chosen, expected)


def test_find_names_keeps_people_and_leaves_places_and_days():
    text = [
        "Tom went to Boston on Monday.",
        "Then Tom was tired.",
        "Later Tom walked home.",
        "On Monday Tom ate.",
        "We saw Tom.",
        "It rained in Boston.",
        "We liked Boston.",
        "Then Monday came.",
        "He left Monday.",
    ]
    assert find_names(text) == ["tom"]


def test_bank_file_round_trip_and_readout_choice(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    vocab = Vocabulary.load(ckpt)
    assert resolve_readout(ckpt, None, "auto", vocab, 16).kind == "tokens"
    with pytest.raises(ValueError, match="sentence_bank.json.gz"):
        resolve_readout(ckpt, None, "bank", vocab, 16)
    save_bank(ckpt, ["he ate a sandwich !", "tom was hungry ."], ["tom"], source="test")
    bank = load_bank(ckpt, vocab, 16)
    assert decoded_with(vocab, bank.candidates) == ["he ate a sandwich!", "tom was hungry."]
    assert resolve_readout(ckpt, None, "auto", vocab, 16).name == "bank (2 sentences)"
    assert resolve_readout(ckpt, None, "tokens", vocab, 16).kind == "tokens"
    write_known_sentences(ckpt, ["tom was hungry ."])  # a closed set, where a folder has one, comes first
    assert (
        resolve_readout(ckpt, torch.tensor([vocab.encode("tom was hungry .")]), "auto", vocab, 16).kind == "sentences"
    )


def decoded_with(vocab, rows):
    return [vocab.decode(row) for row in rows]


def test_bad_banks_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no sentences"):
        SentenceBank.encode([], [], VOCAB, N)
    with pytest.raises(ValueError, match=r"sentence 2 \('Tom ate a zebra.'\).*'zebra'.*vocabulary"):
        SentenceBank.encode(["Tom was hungry.", "Tom ate a zebra."], [], VOCAB, N)
    with pytest.raises(ValueError, match="sentence 1.*9 tokens.*8 slots"):
        SentenceBank.encode(["he went to the kitchen and ate a sandwich"], [], VOCAB, N)
    with pytest.raises(ValueError, match="at least one sentence"):
        save_bank(tmp_path, [], [], source="test")
    (tmp_path / BANK_NAME).write_bytes(gzip.compress(b'{"sentences": ["tom was hungry."]}'))
    with pytest.raises(ValueError, match="not a sentence bank"):
        load_bank(tmp_path, VOCAB, N)
    (tmp_path / BANK_NAME).write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a sentence bank"):
        load_bank(tmp_path, VOCAB, N)


def test_predict_reads_the_bank_by_default_and_tokens_by_flag(tmp_path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    save_bank(ckpt, ["he ate a sandwich !", "he went to the kitchen .", "tom was hungry ."], ["tom"], source="test")
    result = predict(["Tom was hungry.", "He went to the kitchen."], ckpt, steps=3)
    assert result["readout"] == "bank"
    # The guard: never a state of the window while another sentence is left.
    assert result["predictions"][0][0] == "he ate a sandwich!"
    assert set(result["predictions"][0]) <= {"he ate a sandwich!", "he went to the kitchen.", "tom was hungry."}
    assert predict(["Tom was hungry."], ckpt, 2, GenerationConfig(readout="tokens"))["readout"] == "tokens"
    assert main(["--checkpoint", str(ckpt), "--readout", "tokens", "Tom was hungry."]) == 0
    (ckpt / BANK_NAME).write_bytes(gzip.compress(b'{"sentences": ["tom ate a zebra ."], "names": []}'))
    assert main(["--checkpoint", str(ckpt), "Tom was hungry."]) == 2
    assert "zebra" in capsys.readouterr().err


def test_the_video_rollout_reads_a_predictor_bank_by_default(tmp_path):
    from pipeline.config import ModelChoice
    from pipeline.rollout import run_rollout
    from pipeline.tiny_pack import make_tiny_blip, make_tiny_sd
    from tests.model_factories import one_torch_thread, write_test_clip
    from world_model.models.generation_config import GenerationConfig

    bank = ["a red square moves to the right.", "the square stops at the wall."]
    with one_torch_thread():
        vocab = Vocabulary.build([*bank, "a ball falls down."])
        torch.manual_seed(0)
        FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
            tmp_path / "predictor", vocab=vocab
        )
        save_bank(tmp_path / "predictor", bank, [], source="test")
        parts = {
            "captioner": str(make_tiny_blip(tmp_path / "blip")),
            "renderer": str(make_tiny_sd(tmp_path / "sd")),
            "predictor": str(tmp_path / "predictor"),
        }
        clip = write_test_clip(tmp_path / "clip.mp4", seconds=2.0, fps=10)
        result = run_rollout(clip, 3, ModelChoice(**parts), output=tmp_path / "run")
        free = run_rollout(
            clip, 1, ModelChoice(**parts), generation=GenerationConfig(readout="tokens"), output=tmp_path / "free"
        )
    assert result.record["sampling"]["readout"] == "bank (2 sentences)"
    assert set(result.predicted_sentences[0]) <= set(bank)
    assert free.record["sampling"]["readout"] == "tokens"


def test_bank_command_writes_the_training_sentences_and_refuses_a_foreign_vocabulary(tmp_path, capsys):
    from tests.test_rocstories import TRAIN_ROWS, make_folder
    from world_model.data.rocstories import build_vocabulary, load_corpus
    from world_model.generation.sentence_bank import main as bank_main

    data = make_folder(tmp_path)
    vocab = build_vocabulary(load_corpus(data))
    FourTensorModel(FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
        tmp_path / "ckpt", vocab=vocab
    )
    assert bank_main(["--data", str(data), "--out", str(tmp_path / "ckpt")]) == 0
    bank = load_bank(tmp_path / "ckpt", vocab, 16)
    assert sorted(vocab.decode(row) for row in bank.candidates) == sorted(
        vocab.decode(vocab.encode(s)) for row in TRAIN_ROWS for s in row[2:]
    )
    small = Vocabulary.build(TRAIN_ROWS[0][2:])  # no "ann", "cat", ...
    FourTensorModel(FourTensorConfig(vocab_size=len(small), d_x=4, d_t=2, n_heads=1, n_layers=1)).save_pretrained(
        tmp_path / "foreign", vocab=small
    )
    assert bank_main(["--data", str(data), "--out", str(tmp_path / "foreign")]) == 2
    assert "'ann'" in capsys.readouterr().err and not (tmp_path / "foreign" / BANK_NAME).exists()

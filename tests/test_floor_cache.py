"""evaluate's floors cache: a second evaluation on the same data reuses the floors, anything else refits them."""

import json
from pathlib import Path

import pytest
import torch

from tests.test_train import make_data
from world_model.data.rocstories import build_vocabulary, load_cloze_halves, load_corpus
from world_model.evaluation import evaluate
from world_model.evaluation import floor_cache as fc
from world_model.evaluation.evaluate import EvaluateSettings
from world_model.evaluation.evaluate_report import DUAL_ENCODER
from world_model.evaluation.floors import FLOORS, floor_report
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.text.vocab import Vocabulary


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    """Every test's user cache is its own empty folder (nothing is written to the real ~/.cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / fc.PROJECT / "floors"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny data folder and two untrained 4-tensor checkpoints of its vocabulary (different weights)."""
    root = tmp_path_factory.mktemp("floor_cache")
    data = make_data(root / "data")
    vocab = build_vocabulary(load_corpus(data))
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        config = FourTensorConfig(vocab_size=len(vocab), d_x=4, d_t=2, n_heads=1, n_layers=1)
        FourTensorModel(config).save_pretrained(root / f"ckpt{seed}", vocab=vocab)
        folders.append(root / f"ckpt{seed}")
    return data, folders


@pytest.fixture
def fits(monkeypatch):
    """How often the count floors and the dual encoder have been fitted since the test began."""
    calls = {"counts": 0, "dual_encoder": 0}

    def counted(name, fit):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fit(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(fc, "floor_report", counted("counts", fc.floor_report))
    monkeypatch.setattr(fc, "fit_dual_encoder", counted("dual_encoder", fc.fit_dual_encoder))
    return calls


def floor_part(result: dict) -> dict:
    """What evaluate reports of the floors: their rows, Story Cloze and coherence."""
    names = (*FLOORS, DUAL_ENCODER)
    return {
        "floors": result["floors"],
        "story_cloze": {k: v for k, v in result["story_cloze"].items() if k in names},
        "coherence": {k: v for k, v in result["coherence"].items() if k in names},
    }


def evaluate_floors(data: Path, checkpoint: Path, **kwargs) -> dict:
    return floor_part(
        evaluate.evaluate_checkpoint(EvaluateSettings(checkpoint=checkpoint, data=data, device="cpu", **kwargs))
    )


def entries(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f"{name}-*.json"))


def test_a_second_checkpoint_on_the_same_data_reuses_the_floors_of_the_first(checkpoints, fits, user_cache):
    data, (first, second) = checkpoints
    fresh = evaluate.evaluate_checkpoint(EvaluateSettings(checkpoint=first, data=data, device="cpu"))
    assert fits == {"counts": 1, "dual_encoder": 1}
    assert len(entries(user_cache, "counts")) == 1 and len(entries(user_cache, "dual_encoder")) == 1
    reused = evaluate.evaluate_checkpoint(EvaluateSettings(checkpoint=second, data=data, device="cpu"))
    assert fits == {"counts": 1, "dual_encoder": 1}  # nothing refitted
    assert floor_part(reused) == floor_part(fresh)
    assert list(reused["story_cloze"]) == ["model", *FLOORS, "references"]
    assert list(reused["coherence"]) == ["model", *FLOORS, DUAL_ENCODER, "references"]
    assert reused["story_cloze"]["model"] != fresh["story_cloze"]["model"]  # the model's own part is its own
    # what was kept is what a fit gives, to the last bit
    vocab = Vocabulary.load(first)
    train = evaluate.training_windows(data, vocab, 16)
    val, _ = evaluate.encode_stories(evaluate.load_validation_stories(data), vocab, 16)
    assert reused["floors"] == floor_report(train, val, len(vocab))[1]


def test_floors_counts_reuses_what_all_kept_and_none_fits_and_reads_nothing(checkpoints, fits, monkeypatch, tmp_path):
    data, (first, _) = checkpoints
    cache = tmp_path / "mine"
    everything = evaluate_floors(data, first, floors_cache=cache)
    counts = evaluate_floors(data, first, floors="counts", floors_cache=cache)
    assert fits == {"counts": 1, "dual_encoder": 1}
    assert DUAL_ENCODER not in counts["coherence"] and counts["floors"] == everything["floors"]
    assert list(counts["coherence"]) == list(FLOORS)
    monkeypatch.setattr(evaluate, "training_windows", lambda *a: pytest.fail("--floors none read the training stories"))
    assert evaluate_floors(data, first, floors="none", floors_cache=cache) == {
        "floors": None,
        "story_cloze": {},
        "coherence": {},
    }
    assert not (tmp_path / "xdg").exists()  # --floors-cache, not the user's cache


@pytest.mark.parametrize("damage", ["not json {", '["a list"]', "key", "report"])
def test_a_damaged_or_mismatching_entry_is_refitted_with_a_warning(checkpoints, fits, user_cache, capsys, damage):
    data, (first, _) = checkpoints
    fresh = evaluate_floors(data, first)
    (entry,) = entries(user_cache, "counts")
    good = entry.read_text()
    stored = json.loads(good)
    if damage == "key":
        stored["key"]["train_windows"] = "0" * 64
    elif damage == "report":
        stored["report"]["floors"] = 3
    entry.write_text(json.dumps(stored) if damage in ("key", "report") else damage)
    capsys.readouterr()
    assert evaluate_floors(data, first) == fresh
    assert fits == {"counts": 2, "dual_encoder": 1}
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and warning.startswith(f"warning: the floors cache entry {entry}")
    assert entry.read_text() == good  # refitted and kept whole again
    evaluate_floors(data, first)
    assert fits["counts"] == 2


def test_other_training_windows_a_vocabulary_or_settings_make_another_entry(checkpoints, fits, monkeypatch, tmp_path):
    data, (first, _) = checkpoints
    vocab = Vocabulary.load(first)
    train = evaluate.training_windows(data, vocab, 16)
    val, _ = evaluate.encode_stories(evaluate.load_validation_stories(data), vocab, 16)
    halves = load_cloze_halves(data)
    kept = fc.floor_results(train, val, halves, vocab, 16, "counts", tmp_path)
    assert fc.floor_results(train, val, halves, vocab, 16, "counts", tmp_path) == kept and fits["counts"] == 1
    changed = train.clone()
    changed[0, 0, 0] = 3 if int(changed[0, 0, 0]) != 3 else 4
    fc.floor_results(changed, val, halves, vocab, 16, "counts", tmp_path)
    fc.floor_results(train, val, halves, Vocabulary([*vocab.itos, "zebra"]), 16, "counts", tmp_path)
    monkeypatch.setitem(fc.COUNT_SETTINGS, "heldout_fraction", 0.2)
    fc.floor_results(train, val, halves, vocab, 16, "counts", tmp_path)
    assert fits["counts"] == 4 and len(entries(tmp_path, "counts")) == 4


def test_a_cache_that_cannot_be_written_only_warns(checkpoints, fits, tmp_path, capsys):
    data, (first, _) = checkpoints
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    result = evaluate_floors(data, first, floors="counts", floors_cache=blocked)
    assert result["floors"]["train_windows"] == 40 and fits["counts"] == 1
    assert "warning: the floors could not be kept in" in capsys.readouterr().err


def test_the_user_cache_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fc.default_floors_cache() == tmp_path / "xdg" / "semantic-world-model" / "floors"
    for unusable in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", unusable)
        assert fc.user_cache_dir() == tmp_path / "home" / ".cache" / "semantic-world-model"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert fc.user_cache_dir() == tmp_path / "home" / ".cache" / "semantic-world-model"


def test_the_command_takes_floors_and_floors_cache(checkpoints, fits, tmp_path, capsys):
    data, (first, _) = checkpoints
    args = ["--checkpoint", str(first), "--data", str(data), "--device", "cpu", "--floors-cache", str(tmp_path / "c")]
    assert evaluate.main([*args, "--floors", "counts"]) == 0
    printed = capsys.readouterr()
    assert "cooccurrence_copy" in printed.out and DUAL_ENCODER not in printed.out
    stages = [line for line in printed.err.splitlines() if line.startswith("evaluating: ")]
    assert [line.split()[1] for line in stages] == ["L_S(4)", "floors", "Story"], "each stage said as it starts"
    assert str(tmp_path / "c") in stages[1]
    assert evaluate.main([*args, "--floors", "none"]) == 0
    printed = capsys.readouterr()
    assert "floors: none" in printed.out and fits == {"counts": 1, "dual_encoder": 0}
    assert "evaluating: floors" not in printed.err
    with pytest.raises(SystemExit):
        evaluate.main([*args, "--floors", "some"])

"""`python -m pipeline.fit`: a folder of clips (or a captions table) to a predictor folder the rollout loads."""

import csv
import json

import numpy as np
import pytest

from pipeline import components
from pipeline import fit as fit_module
from pipeline.fit_captions import read_caption_table
from tests.model_factories import one_torch_thread, write_test_clip
from world_model.models.registry import load_predictor

TINY_CONFIG = """\
model: {type: four_tensor, d_x: 4, d_t: 2, n_heads: 1, n_layers: 1, dropout: 0.0, n_tokens: 8, n_states: 3}
training: {lr: 3.0e-3, batch_size: 8, max_epochs: 3, patience: 3, seed: 0, eval_batch_size: 64}
"""
COLOURS = ("red", "green", "blue")


def story(clip: int, length: int = 9) -> list[str]:
    """A clip's states: a ball of the clip's colour rolls left, stops, rolls right, stops, ... (a cycle of four)."""
    moves = ("rolls left", "stops", "rolls right", "stops")
    return [f"the {COLOURS[clip % 3]} ball {moves[(clip + t) % 4]}." for t in range(length)]


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(TINY_CONFIG)
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("captions") / "captions.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["clip", "time", "sentence"])
        for clip in range(10):
            rows = [(f"clip{clip}.mp4", float(t), s) for t, s in enumerate(story(clip))]
            writer.writerows(reversed(rows))  # rows in any order: each clip's are sorted by time
    return path


@pytest.fixture(scope="module")
def fitted(table, tiny_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "predictor"
    with one_torch_thread():
        record = fit_module.fit_command(table, fit_settings(out, tiny_config), "python -m pipeline.fit ...")
    return out, record


def fit_settings(out, config, **overrides):
    return fit_module.FitSettings(out=out, config=config, progress=False, **overrides)


def test_a_captions_table_fits_a_predictor_split_by_clip_and_scored_against_floors(fitted):
    out, record = fitted
    train, heldout = record["splits"]["train"], record["splits"]["heldout"]
    assert len(heldout) == 2 and len(train) == 8 and not set(train) & set(heldout)  # 20% of 10 clips, by clip
    assert record["states"] == {"train": 8 * 9, "heldout": 2 * 9}
    model, vocab, known = load_predictor(out)
    assert model.config.n_states == 3 and len(known) == 9  # 3 colours x 3 moves
    report = record["report"]
    assert report["points"] == 2 * (9 - 3) and sorted(report["k"]) == ["1", "2", "3"]
    for k in ("1", "2", "3"):
        assert set(report["k"][k]) == {"four_tensor", "copy_last", "markov1", "markov2"}
        assert report["k"][k]["copy_last"]["log_loss"] is None and report["k"][k]["markov2"]["log_loss"] > 0
    assert report["k"]["1"]["markov2"]["accuracy"] >= 10 / 12  # the last two states fix the next: all but first cuts
    assert report["k"]["1"]["copy_last"]["accuracy"] == 0.0  # every state differs from the one before
    assert any("only 12 held-out predictions" in w for w in record["warnings"])
    card = (out / "model_card.md").read_text()
    assert "| four_tensor |" in card and "| markov2 |" in card and "2 held-out clips (18 states)" in card
    assert json.loads((out / "fit.json").read_text())["splits"] == record["splits"]


def test_the_split_is_by_clip_fixed_by_the_seed():
    names = [f"c{i}" for i in range(10)]
    assert fit_module.split_clips(names, 0.2, 0) == fit_module.split_clips(list(reversed(names)), 0.2, 0)
    assert fit_module.split_clips(names, 0.2, 0) != fit_module.split_clips(names, 0.2, 1)
    train, held = fit_module.split_clips(names[:3], 0.9, 0)
    assert len(train) == 2 and len(held) == 1  # two clips always stay for training
    with pytest.raises(ValueError, match="at least 3 clips"):
        fit_module.split_clips(names[:2], 0.2, 0)


def test_the_fitted_folder_runs_in_the_rollout(fitted, tmp_path, capsys):
    from pipeline.rollout import main as rollout_main
    from pipeline.tiny_pack import make_tiny_blip, make_tiny_sd

    out, _ = fitted
    clip = write_test_clip(tmp_path / "clip.mp4", seconds=3.0, fps=10)
    with one_torch_thread():
        code = rollout_main(
            [str(clip), "--steps", "2", "--out", str(tmp_path / "run"), "--predictor", str(out)]
            + ["--captioner", str(make_tiny_blip(tmp_path / "blip")), "--renderer", str(make_tiny_sd(tmp_path / "sd"))]
        )
    assert code == 0, capsys.readouterr().err
    [predicted] = json.loads((tmp_path / "run" / "rollout.json").read_text())["predictions"]
    known = set((out / "known_sentences.txt").read_text().splitlines())
    assert len(predicted["sentences"]) == 2 and set(predicted["sentences"]) <= known  # its own world's sentences


class SquareCaptioner:
    """Says where the test clip's red square is: one caption per image, from the square's column."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, images):
        self.calls.append(len(images))
        return [f"the square is in column {int(np.argmax(image[:, :, 0].mean(axis=0))) // 32}." for image in images]


def test_clips_are_captioned_once_and_the_cache_survives_an_overwrite(tiny_config, tmp_path, monkeypatch):
    folder = tmp_path / "clips"
    folder.mkdir()
    for i in range(4):
        write_test_clip(folder / f"clip{i}.mp4", seconds=4.0 + i, fps=10)
    (folder / "notes.txt").write_text("not a clip")
    calls = []
    monkeypatch.setattr(components, "load_captioner", lambda *a: SquareCaptioner(calls))
    out = tmp_path / "predictor"
    settings = fit_settings(out, tiny_config, captioner="my-captioner", val_fraction=0.25, max_epochs=1)
    with one_torch_thread():
        record = fit_module.fit_command(folder, settings, "cmd")
    assert calls == [4, 5, 6, 7]  # one frame a second of each clip, captioned once
    cached = [json.loads(line) for line in (out / "captions.jsonl").read_text().splitlines()]
    assert [c["clip"] for c in cached] == ["clip0.mp4", "clip1.mp4", "clip2.mp4", "clip3.mp4"]
    assert cached[0]["captioner"] == "my-captioner" and cached[0]["interval"] == 1.0
    assert record["captioning"]["merge_repeats"] is True and record["frames"] == 22
    assert len(record["splits"]["heldout"]) == 1
    with pytest.raises(ValueError, match="is not empty"):
        fit_module.fit_command(folder, settings, "cmd")
    with one_torch_thread():
        fit_module.fit_command(folder, fit_settings(out, tiny_config, captioner="my-captioner", overwrite=True), "cmd")
    assert calls == [4, 5, 6, 7]  # nothing captioned again
    with one_torch_thread():  # another interval is another captioning
        fit_module.fit_command(
            folder, fit_settings(out, tiny_config, captioner="my-captioner", interval=2.0, overwrite=True), "cmd"
        )
    assert calls == [4, 5, 6, 7, 2, 3, 3, 4]


def test_the_report_warns_of_too_few_predictions_and_of_frames_outside_the_captioners_world():
    from pipeline.fit_report import FEW_POINTS, warnings_of

    enough = {"points": FEW_POINTS, "k": {}}
    assert warnings_of(enough, 0, 40, "offline_pack/captioner") == []
    [outside] = warnings_of(enough, 3, 40, "offline_pack/captioner")
    assert outside.startswith("3 of 40 frames lie outside the world offline_pack/captioner was trained on")
    few = {"points": 12, "k": {"1": {"four_tensor": {"accuracy_ci95": [0.25, 0.75]}}}}
    assert warnings_of(few, 0, 40, "x") == [
        "only 12 held-out predictions (the 95% interval of its one-step accuracy is 0.50 wide): too few for the "
        "figures to mean much; add clips or raise --val-fraction"
    ]


def test_a_captions_table_row_that_is_not_one_is_named(tmp_path):
    path = tmp_path / "captions.jsonl"
    path.write_text('{"clip": "a", "time": 0, "sentence": "a cat sits."}\n{"clip": "a", "time": "soon"}\n')
    with pytest.raises(ValueError, match="row 2: needs a clip, a numeric time and a sentence"):
        read_caption_table(path)


def test_the_command_refuses_bad_input_before_any_work(table, tmp_path, capsys):
    assert fit_module.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "p")]) == 2
    assert "not found: give a folder of clips or a captions file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit_module.main([str(table), "--out", str(tmp_path / "p"), "--val-fraction", "0"])
    assert "--val-fraction must be between 0.01 and 0.9" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("")
    assert fit_module.main([str(table), "--out", str(tmp_path / "full")]) == 2
    assert "is not empty (mine.txt)" in capsys.readouterr().err
    clips = tmp_path / "clips"
    clips.mkdir()
    (clips / "a.mp4").write_bytes(b"")
    assert fit_module.main([str(clips), "--out", str(clips / "predictor")]) == 2
    assert "lies inside the clips" in capsys.readouterr().err and sorted(p.name for p in clips.iterdir()) == ["a.mp4"]

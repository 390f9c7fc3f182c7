import hashlib
import importlib
import json
import os

import cv2
import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np
import pytest
from matplotlib.figure import Figure

from renderers.outputs import write_storyboard
from world_model.utils.video import write_gif, write_video

COLOURS = [(230, 30, 30), (30, 200, 30), (30, 30, 230), (230, 230, 30), (200, 30, 200)]


def solid_frames(height=33, width=47):
    return [np.full((height, width, 3), colour, np.uint8) for colour in COLOURS]


def test_video_is_browser_playable_h264(tmp_path):
    path = write_video(solid_frames(), tmp_path / "clip.mp4", fps=2)
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    assert meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p")
    assert meta["size"] == (48, 34) and meta["fps"] == 2  # odd 47x33 padded to even
    decoded = [np.frombuffer(raw, np.uint8).reshape(34, 48, 3) for raw in reader]
    assert len(decoded) == len(COLOURS)
    for frame, colour in zip(decoded, COLOURS):  # order and RGB channel order survive
        assert np.abs(frame.reshape(-1, 3).mean(0) - colour).max() < 8
    capture = cv2.VideoCapture(str(path))
    assert capture.get(cv2.CAP_PROP_FRAME_COUNT) == len(COLOURS)
    assert int(capture.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little") in (b"h264", b"avc1")
    capture.release()
    data = path.read_bytes()
    assert data.index(b"moov") < data.index(b"mdat")  # index first: plays while downloading
    assert os.listdir(tmp_path) == ["clip.mp4"]


def test_even_sized_video_keeps_its_size(tmp_path):
    path = write_video(solid_frames(32, 48)[:2], tmp_path / "sub" / "even.mp4")
    reader = imageio_ffmpeg.read_frames(str(path))
    assert next(reader)["size"] == (48, 32)
    reader.close()


def test_gif_round_trips(tmp_path):
    path = write_gif(solid_frames(), tmp_path / "clip.gif", fps=4)
    frames = iio.imread(path)
    assert frames.shape == (5, 33, 47, 3)
    for frame, colour in zip(frames, COLOURS):
        assert np.abs(frame.reshape(-1, 3).mean(0) - colour).max() < 8
    meta = iio.immeta(path)
    assert meta["duration"] == 250 and meta["loop"] == 0


def test_storyboard_puts_observed_on_top_and_predicted_below(tmp_path):
    red, blue = np.zeros((48, 64, 3), np.uint8), np.zeros((48, 64, 3), np.uint8)
    red[..., 0] = 255
    blue[..., 2] = 255
    observed = [(red, f"t={t:.1f}s: a red square slides over a dark background " * 3) for t in (0.0, 1.0, 2.0)]
    predicted = [(blue, "step 1: it leaves the frame"), (blue, "step 2: the frame is empty")]
    path = write_storyboard(observed, predicted, tmp_path / "board.png", title="clip.mp4")
    image = iio.imread(path)[..., :3].astype(int)
    assert image.shape[1] == 900  # 300 px per column
    is_red = (image[..., 0] > 240) & (image[..., 1] < 15) & (image[..., 2] < 15)
    is_blue = (image[..., 2] > 240) & (image[..., 0] < 15) & (image[..., 1] < 15)
    middle = image.shape[0] // 2
    top, bottom = slice(0, middle), slice(middle, None)
    assert is_red[top].sum() > 3 * 48 * 64 * 0.5 and is_red[bottom].sum() == 0
    assert is_blue[bottom].sum() > 2 * 48 * 64 * 0.5 and is_blue[top].sum() == 0
    assert is_blue[:, 650:].sum() == 0  # third predicted cell is empty
    text = (image.sum(-1) < 200) & ~is_red & ~is_blue
    assert text[:40].sum() > 20  # the title


def test_storyboard_height_follows_the_frames_shape(tmp_path):
    def height(frame_shape):
        cells = [(np.full((*frame_shape, 3), 200, np.uint8), "a caption")] * 2
        return iio.imread(write_storyboard(cells, cells, tmp_path / "board.png")).shape[0]

    square, strip = height((96, 96)), height((48, 144))
    assert strip < 0.7 * square  # a row of wide strips leaves no band of empty space
    assert square - strip == pytest.approx(2 * 300 * (1 - 1 / 3), abs=4)  # the frames' own height difference


def test_storyboard_needs_frames(tmp_path):
    with pytest.raises(ValueError, match="nothing to draw"):
        write_storyboard([], [], tmp_path / "board.png")
    assert not any(tmp_path.iterdir())


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "board.png"
    path.write_bytes(b"previous storyboard")

    def crash_half_way(self, fname, **kwargs):
        with open(fname, "wb") as file:
            file.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        write_storyboard([(np.zeros((8, 8, 3), np.uint8), "x")], [], path)
    assert path.read_bytes() == b"previous storyboard"
    assert os.listdir(tmp_path) == ["board.png"]


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "no frames"),
        ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 10, 3), np.uint8)], "one size"),
        ([np.zeros((8, 8, 3), np.float32)], "uint8"),
        ([np.zeros((8, 8), np.uint8)], r"\(H, W, 3\)"),
    ],
)
def test_bad_frames_are_rejected_before_writing(tmp_path, frames, message):
    for writer, name in ((write_video, "a.mp4"), (write_gif, "a.gif")):
        with pytest.raises(ValueError, match=message):
            writer(frames, tmp_path / name)
    assert not any(tmp_path.iterdir())


def test_storyboard_wraps_into_a_grid_of_bounded_size(tmp_path):
    from renderers.outputs import MAX_COLUMNS, MAX_SECTION_ROWS

    frame = np.full((96, 96, 3), 200, np.uint8)
    observed = [(frame, f"t={t}s: a caption") for t in range(250)]
    predicted = [(frame, f"step {s}: a caption") for s in range(12)]
    image = iio.imread(write_storyboard(observed, predicted, tmp_path / "board.png", title="long.mp4"))
    assert image.shape[1] == MAX_COLUMNS * 300, "wrapped, not one 75,000 px row"
    rows = MAX_SECTION_ROWS + 2  # observed thinned to the row cap; 12 predicted cells wrap onto 2 rows
    one_row = iio.imread(write_storyboard(observed[:MAX_COLUMNS], [], tmp_path / "row.png")).shape[0] / 2
    assert image.shape[0] <= rows * one_row + 60
    tall = [(np.full((512, 16, 3), 200, np.uint8), "a very tall frame")] * 3
    assert iio.imread(write_storyboard(tall, tall, tmp_path / "tall.png")).shape[0] < 2 * 800, (
        "tall frames drawn narrower"
    )


# --- every command's outputs: checked before any work, never an input, never replaced unasked (issue #70) ---

IN_AN_INPUT = [  # (module, its arguments with {in} an input folder, what it would do first, the input's name)
    (
        "world_model.evaluation.readout_eval",
        ["--checkpoint", "{in}", "--data", "d", "--out", "{in}/r"],
        "load_predictor",
        "checkpoint",
    ),
    (
        "world_model.evaluation.calibration",
        ["--checkpoint", "{in}", "--heldout", "h", "--out", "{in}/r"],
        "calibrate",
        "checkpoint",
    ),
    ("world_model.evaluation.world_report", ["--data", "{in}", "--out", "{in}/r"], "world_report", "data folder"),
    (
        "world_model.benchmark.coherence_rows",
        ["--runs", "r", "--data", "{in}", "--out", "{in}/r"],
        "seed_record",
        "data folder",
    ),
    (
        "world_model.benchmark.sweep",
        ["--preset", "cpu", "--data", "{in}", "--out", "{in}/r"],
        "train_mod.train",
        "data folder",
    ),
    ("world_model.training.export", ["--run", "{in}", "--out", "{in}/e", "--command", "c"], "load_model", "run"),
    ("pipeline.pack.train_captioner", ["--data", "{in}", "--out", "{in}/r"], "train", "data folder"),
    ("pipeline.pack.train_renderer", ["--data", "{in}", "--out", "{in}/r"], "train", "data folder"),
    ("pipeline.hub_readout", ["--sequences", "{in}", "--out", "{in}/r"], "hub_readout", "sequences"),
    (
        "world_model.data.synthetic.sentences",
        ["--checkpoint", "c", "--data", "{in}", "--json", "{in}/s.json"],
        "score_checkpoints",
        "data folder",
    ),
    (
        "pipeline.pack.round_trip",
        ["--renderer", "{in}", "--sentences", "s.txt", "--json", "{in}/s.json"],
        "renderer_round_trip",
        "renderer",
    ),
    ("world_model.benchmark.speed", ["--data", "{in}", "--json", "{in}/s.json"], "load_inputs", "data folder"),
]


def refused(module, argv, first_work, monkeypatch, capsys) -> str:
    """The one error line of `module` run with `argv`, which must exit 2 before it calls `first_work`."""
    main = importlib.import_module(module).main
    monkeypatch.setattr(f"{module}.{first_work}", lambda *a, **k: pytest.fail(f"{first_work} ran before the check"))
    capsys.readouterr()
    assert main(argv) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("module, argv, first_work, name", IN_AN_INPUT, ids=[row[0] for row in IN_AN_INPUT])
def test_an_output_inside_an_input_is_refused_before_any_work(
    module, argv, first_work, name, tmp_path, monkeypatch, capsys
):
    given = tmp_path / "input"
    given.mkdir()
    (given / "kept.txt").write_text("input")
    err = refused(module, [a.replace("{in}", str(given)) for a in argv], first_work, monkeypatch, capsys)
    assert f"the {name} {given}, an input; write it elsewhere" in err
    assert sorted(p.name for p in given.iterdir()) == ["kept.txt"]


EXISTING_JSON = [  # (module, its arguments but --json, what it would do first)
    ("world_model.data.rocstories", ["d"], "load_corpus"),
    ("world_model.data.synthetic.sentences", ["--checkpoint", "c", "--data", "d"], "score_checkpoints"),
    ("pipeline.pack.round_trip", ["--renderer", "r", "--sentences", "s.txt"], "renderer_round_trip"),
    ("pipeline.bench", [], "bench_command"),
    ("world_model.benchmark.speed", [], "load_inputs"),
]


@pytest.mark.parametrize("module, argv, first_work", EXISTING_JSON, ids=[row[0] for row in EXISTING_JSON])
def test_an_existing_json_needs_overwrite(module, argv, first_work, tmp_path, monkeypatch, capsys):
    path = tmp_path / "old.json"
    path.write_text('{"earlier": "figures"}\n')
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    err = refused(module, [*argv, "--json", str(path)], first_work, monkeypatch, capsys)
    assert f"error: --json {path} already exists; pass --overwrite to replace it" in err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    dangling = tmp_path / "link.json"
    dangling.symlink_to(tmp_path / "nowhere" / "x.json")
    assert "is a link to nothing" in refused(module, [*argv, "--json", str(dangling)], first_work, monkeypatch, capsys)


def test_overwrite_replaces_an_existing_json_whole(tmp_path, capsys):
    from tests.test_rocstories import make_folder
    from world_model.data.rocstories import main

    (tmp_path / "data").mkdir()
    data = make_folder(tmp_path / "data")
    path = tmp_path / "stats.json"
    path.write_text("old")
    assert main([str(data), "--json", str(path), "--overwrite"]) == 0
    assert json.loads(path.read_text())["train_stories"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "stats.json"]  # no staging file left


def test_a_report_folder_that_holds_files_needs_overwrite(tmp_path, monkeypatch, capsys):
    out = tmp_path / "report"
    out.mkdir()
    (out / "results.json").write_text("{}")
    argv = ["--data", str(tmp_path / "data"), "--out", str(out)]
    err = refused("world_model.evaluation.world_report", argv, "world_report", monkeypatch, capsys)
    assert f"--out {out} already exists; pass --overwrite to replace it" in err
    assert (out / "results.json").read_text() == "{}"


def test_a_run_folder_inside_an_input_is_refused(tmp_path):
    from pipeline.run_folder import RunFolderError, run_folder

    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(RunFolderError, match="lies inside the data folder"):
        with run_folder(data / "run", True, inputs={"data folder": data}):
            pytest.fail("claimed a folder inside the data")
    assert not any(data.iterdir())


def test_the_generator_refuses_a_dangling_split_folder(tmp_path, capsys):
    from world_model.data.synthetic import generator

    (tmp_path / "train").symlink_to(tmp_path / "gone")
    assert generator.main(["generate", "--episodes", "1", "--out", str(tmp_path)]) == 2
    assert "is a link to nothing" in capsys.readouterr().err


def test_a_failed_text_or_bank_write_keeps_the_old_file(tmp_path, monkeypatch):
    from pathlib import Path

    from world_model.generation import bank_file
    from world_model.utils.files import write_text_atomic

    report, bank = tmp_path / "results.md", tmp_path / bank_file.BANK_NAME
    report.write_text("old report")
    bank.write_bytes(b"old bank")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(report, "new report")
    monkeypatch.setattr(bank_file.gzip.GzipFile, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        bank_file.save_bank(tmp_path, ["a ball falls ."], [], source="test")
    assert report.read_text() == "old report" and bank.read_bytes() == b"old bank"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([report.name, bank.name])


def test_a_folder_replacing_a_file_leaves_nothing_of_the_file_behind(tmp_path):
    from world_model.utils.files import replace_dir

    (tmp_path / "split").write_text("a file where the folder goes")
    staged = tmp_path / ".split.partial"
    staged.mkdir()
    (staged / "episodes.jsonl").write_text("{}\n")
    replace_dir(staged, tmp_path / "split")
    assert (tmp_path / "split" / "episodes.jsonl").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]

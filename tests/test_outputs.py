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

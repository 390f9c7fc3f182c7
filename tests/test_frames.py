import cv2
import numpy as np
import pytest

from encoders import frames as frames_module
from encoders.frames import SampledClip, SampledFrame, VideoError, probe_video, sample_frames, state_offsets
from tests.model_factories import (
    BACKGROUND,
    SQUARE_SIZE,
    SQUARE_TOP,
    run_ffmpeg,
    square_left,
    write_audio_only,
    write_test_clip,
)

WIDTH, HEIGHT, FPS, SECONDS = 160, 96, 10, 3.0
COUNT = 30


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_test_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", SECONDS, FPS, (WIDTH, HEIGHT))


def red_mask(image):
    """Pixels of the square, assuming RGB order: strong red, weak green and blue."""
    return (image[..., 0] > 180) & (image[..., 1] < 90) & (image[..., 2] < 90)


def square_bbox(image):
    rows, cols = np.nonzero(red_mask(image))
    assert rows.size, "no red square found (wrong channel order?)"
    return rows.min(), rows.max(), cols.min(), cols.max()


def assert_shows_frame(frame, count=COUNT, width=WIDTH):
    """The square's position in an unrotated, unresized frame matches the frame's index."""
    top, _, left, _ = square_bbox(frame.image)
    assert abs(top - SQUARE_TOP) <= 1
    assert abs(left - square_left(frame.index, count, width)) <= 2  # neighbouring frames differ by ~5 px


def test_probe_reports_stream_properties(clip):
    info = probe_video(clip)
    assert (info.fps, info.frame_count, info.width, info.height, info.rotation) == (FPS, COUNT, WIDTH, HEIGHT, 0)
    assert info.duration == pytest.approx(SECONDS)


@pytest.mark.parametrize("interval, indices", [(1.0, [0, 10, 20]), (0.5, [0, 5, 10, 15, 20, 25]), (1.3, [0, 13, 26])])
def test_interval_sampling_takes_the_frame_at_each_time(clip, interval, indices):
    result = sample_frames(clip, interval=interval)
    assert isinstance(result, SampledClip) and result.warnings == []
    assert [f.index for f in result] == indices
    assert [f.timestamp for f in result] == pytest.approx([i / FPS for i in indices])
    for frame in result:
        assert_shows_frame(frame)


def test_num_frames_are_evenly_spaced_from_first_to_last(clip):
    result = sample_frames(clip, num_frames=4)
    assert [f.index for f in result] == [0, 10, 19, 29]
    assert [f.timestamp for f in result] == pytest.approx([0.0, 1.0, 1.9, 2.9])
    for frame in result:
        assert_shows_frame(frame)


def test_state_strips_tile_the_first_middle_and_last_frame_of_each_span(clip):
    result = sample_frames(clip, interval=1.0, frames_per_state=3)
    assert [(f.index, f.timestamp) for f in result] == [(0, 0.0), (10, 1.0), (20, 2.0)]
    for strip in result:
        assert strip.image.shape == (HEIGHT, 3 * WIDTH, 3)
        for k, offset in enumerate(state_offsets(FPS, 1.0, 3)):  # frames 0, 4, 9 of the span
            part = strip.image[:, k * WIDTH : (k + 1) * WIDTH]
            assert_shows_frame(SampledFrame(part, 0.0, strip.index + offset))


def test_state_strips_skip_a_trailing_span_the_clip_does_not_cover(clip):
    assert state_offsets(FPS, 1.3, 2) == [0, 12]
    assert [f.index for f in sample_frames(clip, interval=1.3, frames_per_state=2)] == [0, 13]  # 26 + 12 > 29
    with pytest.raises(VideoError, match="shorter than one 5.0s state"):
        sample_frames(clip, interval=5.0, frames_per_state=2)
    with pytest.raises(ValueError, match="frames_per_state"):
        sample_frames(clip, num_frames=3, frames_per_state=2)


def test_seeking_gives_the_same_frames_as_grabbing(clip, monkeypatch):
    grabbed = sample_frames(clip, num_frames=3)
    monkeypatch.setattr(frames_module, "SEEK_GAP_SECONDS", 0.0)
    seeked = sample_frames(clip, num_frames=3)
    assert [f.index for f in seeked] == [f.index for f in grabbed] == [0, 14, 29]
    for a, b in zip(seeked, grabbed):
        assert_shows_frame(a)
        assert np.abs(a.image.astype(int) - b.image.astype(int)).max() <= 2


def test_cap_thins_evenly_and_warns(clip):
    result = sample_frames(clip, interval=0.1, max_frames=4)
    assert [f.index for f in result] == [0, 10, 19, 29]
    assert len(result.warnings) == 1 and "max_frames=4" in result.warnings[0]


def test_frames_are_rgb_uint8(clip):
    image = sample_frames(clip, num_frames=1)[0].image
    assert image.shape == (HEIGHT, WIDTH, 3) and image.dtype == np.uint8
    centre = image[SQUARE_TOP + SQUARE_SIZE // 2, SQUARE_SIZE // 2]
    assert centre[0] > 220 and centre[1] < 40 and centre[2] < 40, centre
    assert np.abs(image[-10, -10].astype(int) - BACKGROUND).max() <= 4


def test_resize_bounds_the_longer_side(tmp_path):
    big = write_test_clip(tmp_path / "big.mp4", seconds=0.5, size=(320, 180))
    image = sample_frames(big, num_frames=1, max_side=64)[0].image
    assert image.shape == (36, 64, 3)
    assert sample_frames(big, num_frames=1, max_side=1000)[0].image.shape == (180, 320, 3)


@pytest.mark.parametrize("rotation", [90, 270])
def test_rotation_metadata_is_applied(tmp_path, rotation):
    path = write_test_clip(tmp_path / "rotated.mp4", SECONDS, FPS, (WIDTH, HEIGHT), rotation=rotation)
    info = probe_video(path)
    assert (info.rotation, info.width, info.height) == (rotation, HEIGHT, WIDTH)
    image = sample_frames(path, num_frames=1)[0].image
    assert image.shape == (WIDTH, HEIGHT, 3)
    stored = np.zeros((HEIGHT, WIDTH), bool)
    stored[SQUARE_TOP : SQUARE_TOP + SQUARE_SIZE, :SQUARE_SIZE] = True
    expected = np.nonzero(np.rot90(stored, k=-rotation // 90))  # np.rot90 turns counter-clockwise
    rows, cols = np.nonzero(red_mask(image))
    assert abs(rows.mean() - expected[0].mean()) <= 2 and abs(cols.mean() - expected[1].mean()) <= 2


def test_one_frame_clip_gives_one_frame(tmp_path):
    path = write_test_clip(tmp_path / "one.mp4", seconds=0.1, fps=FPS)
    assert probe_video(path).frame_count == 1
    for kwargs in ({}, {"num_frames": 5}, {"interval": 0.01}):
        result = sample_frames(path, **kwargs)
        assert [(f.index, f.timestamp) for f in result] == [(0, 0.0)]


def test_raw_stream_without_frame_count_is_counted(tmp_path, clip):
    raw = tmp_path / "clip.h264"
    run_ffmpeg("-i", str(clip), "-c:v", "libx264", "-f", "h264", str(raw))
    assert probe_video(raw).frame_count == COUNT
    result = sample_frames(raw, num_frames=3)
    assert [f.index for f in result] == [0, 14, 29]
    for frame in result:
        assert_shows_frame(frame)


def test_stream_truncated_part_way_returns_the_frames_before_the_break(tmp_path):
    path = write_test_clip(tmp_path / "cut.mp4", SECONDS, FPS, (WIDTH, HEIGHT), faststart=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    result = sample_frames(path, interval=0.5)
    indices = [f.index for f in result]
    assert 1 <= len(indices) < 6 and indices == [0, 5, 10, 15, 20, 25][: len(indices)]
    for frame in result:
        assert_shows_frame(frame)
    assert len(result.warnings) == 1 and "truncated" in result.warnings[0]


def test_mp4_with_header_but_no_frame_data_raises(tmp_path):
    path = write_test_clip(tmp_path / "empty_mdat.mp4", SECONDS, FPS, (WIDTH, HEIGHT), faststart=True)
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"mdat") + 4])
    with pytest.raises(VideoError, match="No frame .* could be decoded"):
        sample_frames(path)


def test_bad_inputs_raise_clear_errors(tmp_path):
    cases = {
        tmp_path / "missing.mp4": "not found",
        tmp_path: "directory",
    }
    (tmp_path / "empty.mp4").touch()
    cases[tmp_path / "empty.mp4"] = r"empty \(0 bytes\)"
    (tmp_path / "text.mp4").write_text("this is not a video\n" * 20)
    cases[tmp_path / "text.mp4"] = "not a video file"
    cases[write_audio_only(tmp_path / "audio.mp4")] = r"no video stream \(only audio\)"
    for name, keep in (("half.mp4", 0.5), ("most.mp4", 0.95)):  # index (moov) at the end: lost or damaged
        cut = write_test_clip(tmp_path / name)
        data = cut.read_bytes()
        cut.write_bytes(data[: int(len(data) * keep)])
        cases[cut] = "MP4 whose header or index cannot be read.*truncated"
    for path, message in cases.items():
        with pytest.raises(VideoError, match=message):
            sample_frames(path)
        with pytest.raises(VideoError, match=message):
            probe_video(path)


TIMES = [0.0, 0.2, 0.4, 0.6, 1.6, 1.8, 2.0, 2.2, 2.4, 4.0, 4.2, 5.0]  # shown-at times of a gappy clip


@pytest.mark.parametrize("suffix", [".mp4", ".avi"])  # variable frame rate; empty repeat-frame index entries
def test_timestamps_come_from_the_container(tmp_path, suffix):
    from tests.model_factories import write_timed_clip

    path = write_timed_clip(tmp_path / f"timed{suffix}", TIMES)
    info = probe_video(path)
    result = sample_frames(path, interval=1.0)
    assert result.warnings == [], "a clip with gaps between its frames is not truncated"
    # each state shows the first frame shown at or after its time (half a nominal frame early counts)
    expected = [next(i for i, t in enumerate(TIMES) if t >= start - 0.5 / info.fps) for start in range(len(result))]
    assert [f.timestamp for f in result] == pytest.approx([TIMES[i] for i in expected], abs=1e-3)
    assert len(result) >= 4 and result[3].timestamp == pytest.approx(4.0), "frame index / fps would say 3.0 s"
    for frame, i in zip(result, expected):
        _, _, left, _ = square_bbox(frame.image)
        assert abs(left - square_left(i, len(TIMES), WIDTH)) <= 2, "the image is the frame of that timestamp"
    if suffix == ".avi":
        assert info.frame_count > len(TIMES), "the index counts the repeat entries as frames"


def test_frames_smaller_than_the_minimum_are_refused(tmp_path):
    from encoders.frames import MIN_SIDE

    path = tmp_path / "tiny.mp4"
    run_ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "color=c=red:size=2x2:duration=2:rate=10",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        str(path),
    )
    with pytest.raises(VideoError, match=f"2x2 frames; at least {MIN_SIDE}x{MIN_SIDE} pixels"):
        sample_frames(path)
    assert probe_video(write_test_clip(tmp_path / "ok.mp4", 1.0, FPS, (MIN_SIDE, MIN_SIDE))).width == MIN_SIDE


def test_a_video_stream_shorter_than_its_container_is_not_called_corrupt(tmp_path):
    """3 s of video muxed with 4 s of audio: the container says 4 s; the stream's frames end at 2.9 s."""
    import subprocess

    import imageio_ffmpeg

    video = write_test_clip(tmp_path / "v.mp4", seconds=3.0, fps=10)
    muxed = tmp_path / "with_audio.mp4"
    subprocess.run(
        [
            imageio_ffmpeg.get_ffmpeg_exe(),
            "-y",
            "-loglevel",
            "error",
            "-i",
            str(video),
            "-f",
            "lavfi",
            "-i",
            "anullsrc=r=8000:cl=mono",
            "-t",
            "4",
            "-map",
            "0:v",
            "-map",
            "1:a",
            "-c:v",
            "copy",
            "-c:a",
            "aac",
            str(muxed),
        ],
        check=True,
    )
    clip = sample_frames(muxed, interval=0.5)
    assert clip.info.duration == pytest.approx(4.0, abs=0.05)
    assert [round(f.timestamp, 2) for f in clip] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert len(clip.warnings) == 1 and "truncated or corrupt" not in clip.warnings[0]
    assert "the video stream ends at 2.90s" in clip.warnings[0]


def test_an_unreadable_file_gives_our_error_without_opencvs_warning(tmp_path, capfd):
    path = tmp_path / "text.mp4"
    path.write_text("this is not a video\n" * 20)
    level = cv2.utils.logging.getLogLevel()
    with pytest.raises(VideoError, match="not a video file"):
        sample_frames(path)
    assert "WARN" not in capfd.readouterr().err  # OpenCV's "can't be used to capture by name" says nothing useful
    assert cv2.utils.logging.getLogLevel() == level  # the caller's own OpenCV log level is put back

"""Counting what a rendered strip shows against the simulator's own drawing (pipeline.pack.render_scores)."""

import cv2
import numpy as np
import pytest

from encoders.world_dataset import episode_strips
from pipeline.pack import render_scores as rs
from world_model.data.synthetic import scenes
from world_model.data.synthetic.episodes import read_records
from world_model.data.synthetic.generator import generate


def exact_objects(frame):
    """Regions of the exact object colours of at least MIN_AREA pixels (the simulator's drawing is flat)."""
    count = 0
    for colour in scenes.OBJECT_COLOURS:
        n, _, stats, _ = cv2.connectedComponentsWithStats(np.all(frame == colour, -1).astype(np.uint8), connectivity=4)
        count += sum(stats[r, cv2.CC_STAT_AREA] >= rs.MIN_AREA for r in range(1, n))
    return count


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two 5-second held-out episodes of every scene type, 96 px, with their records."""
    out = tmp_path_factory.mktemp("world")
    generate(14, seed=3, out_dir=out, split="heldout", seconds=5)
    return read_records(out / "heldout"), list(scenes.SCENE_TYPES)


def test_the_simulators_strips_are_the_clips_seconds_and_count_what_it_drew(world):
    records, kinds = world
    frames = agree = 0
    for record in records:
        truth = rs.simulator_strips(record, kinds)
        decoded = episode_strips(record["path"], (96, 288))
        assert len(truth) == len(decoded) == len(record["sentences"])
        for true, seen in zip(truth, decoded):
            colours = rs.palette(true)
            assert np.abs(true.astype(int) - seen.astype(int)).mean() < 6  # the same frames, but for compression
            for mine, theirs in zip(rs.frames_of(seen), rs.frames_of(true)):
                assert len(rs.object_regions(theirs, colours)) == exact_objects(theirs)
                frames += 1
                agree += len(rs.object_regions(mine, colours)) == exact_objects(theirs)
    assert agree / frames >= 0.97  # the clip's smeared colours still count as drawn


def test_a_strip_scores_perfectly_against_itself_and_worse_when_moved_or_emptied(world):
    records, kinds = world
    true = rs.simulator_strips(records[0], kinds)[2]
    same = rs.score_strip(true, true)
    assert same.counts_right == 1.0 and same.position_error == 0.0 and same.pixel_error == 0.0
    frames = rs.frames_of(true)
    moved = np.concatenate([np.roll(f, 3, axis=1) for f in frames], axis=1)  # everything 3 pixels right
    score = rs.score_strip(moved, true)
    assert score.counts_right == 1.0 and score.position_error == pytest.approx(3.0, abs=0.5) and score.pixel_error > 0
    background = np.array(scenes.base.BACKGROUND, dtype=np.uint8)
    emptied = true.copy()
    for index in range(len(scenes.OBJECT_COLOURS)):
        emptied[np.all(true == scenes.OBJECT_COLOURS[index], -1)] = background
    assert rs.object_regions(frames[0], rs.palette(true))  # the episode shows an object
    empty_frames = [not rs.object_regions(f, rs.palette(true)) for f in frames]
    assert rs.score_strip(emptied, true).counts_right == pytest.approx(np.mean(empty_frames))  # only those were right
    with pytest.raises(ValueError, match="differ in size"):
        rs.score_strip(true[:, :96], true)


def test_a_render_at_another_size_is_counted_at_96_pixels(world):
    records, kinds = world
    true = rs.simulator_strips(records[1], kinds)[1]
    small = cv2.resize(true, (144, 48), interpolation=cv2.INTER_AREA)
    colours = rs.palette(true)
    assert [len(rs.object_regions(f, colours)) for f in rs.frames_of(small)] == [
        len(rs.object_regions(f, colours)) for f in rs.frames_of(true)
    ]

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from world_model.data.synthetic import ceilings, generator, scenes, simulation
from world_model.data.synthetic.scenes import base, physical
from world_model.text.vocab import tokenize

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(seconds=3, fps=4, size=32)


def scene(kind, seed=0, fps=12, **state):
    made = scenes.make_scene(kind, np.random.default_rng(seed), fps)
    for key, value in state.items():
        setattr(made, key, value)
    return made


def first_seed(kind, start=0):
    """The first train episode seed of base seed 0 whose scene type is ``kind``."""
    return next(
        simulation.episode_seed(0, i)
        for i in range(start, 1000)
        if simulation.simulate(simulation.episode_seed(0, i), seconds=1).kind == kind
    )


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generator.generate(3, seed, tmp_path / name, **SMALL)
    a, b, c = ((tmp_path / n / "train" / "episodes.jsonl").read_bytes() for n in "abc")
    assert a == b and a != c
    assert (tmp_path / "a/train/summary.json").read_bytes() == (tmp_path / "b/train/summary.json").read_bytes()


def test_splits_never_share_a_seed_and_differ():
    train = {simulation.episode_seed(s, i, "train") for s in range(3) for i in range(500)}
    heldout = {simulation.episode_seed(s, i, "heldout") for s in range(3) for i in range(500)}
    assert len(train) == len(heldout) == 1500 and not train & heldout
    pairs = [
        (
            simulation.simulate(simulation.episode_seed(0, i, "train"), seconds=4),
            simulation.simulate(simulation.episode_seed(0, i, "heldout"), seconds=4),
        )
        for i in range(6)
    ]
    assert any(a.sentences != b.sentences or a.scene.attributes() != b.scene.attributes() for a, b in pairs)
    with pytest.raises(ValueError):
        simulation.episode_seed(0, 0, "test")
    with pytest.raises(ValueError):
        simulation.episode_seed(0, simulation.MAX_EPISODES)


def test_one_short_sentence_per_second_and_the_truth_is_in_the_predicted_support():
    kinds = set()
    for i in range(45):
        ep = simulation.simulate(simulation.episode_seed(1, i), seconds=10, fps=4)
        kinds.add(ep.kind)
        assert len(ep.sentences) == 10 and len(ep.next) == 9
        for text in ep.sentences:
            tokens = tokenize(text)
            assert len(tokens) <= scenes.MAX_TOKENS and tokens[-1] == "." and text == text.lower()
        for t, dist in enumerate(ep.next):
            assert math.isclose(sum(p for _, p in dist), 1.0) and all(p > 0 for _, p in dist)
            assert ep.sentences[t + 1] in dict(dist)  # what happened was possible
            assert dist[0][1] == max(p for _, p in dist)
        if ep.kind in ("ball", "box"):  # visible colour and size are named
            assert all(f"the {ep.scene.size_word} {ep.scene.colour} {ep.kind}" in s for s in ep.sentences)
    assert kinds == set(scenes.SCENE_TYPES)


def test_invisible_distractors_leave_sentences_alone():
    a = simulation.run_scene(scene("ball", 1, x=0.8), 8, lambda o: 0).sentences
    b = simulation.run_scene(scene("ball", 1, x=3.0), 8, lambda o: 0).sentences
    c = simulation.run_scene(scene("ball", 1, colour="green", x=3.0), 8, lambda o: 0).sentences
    assert a == b and a != c and all("green" in s for s in c)
    d = simulation.run_scene(scene("elevator", 2, shirt="red"), 6, lambda o: 0).sentences
    e = simulation.run_scene(scene("elevator", 2, shirt="blue"), 6, lambda o: 0).sentences
    assert d == e


def test_ball_bounces_lower_and_comes_to_rest():
    for seed in range(4):
        ball = scene("ball", seed)
        ep = simulation.run_scene(ball, 8, lambda o: 0)
        apexes = [v * v / (2 * physical.GRAVITY) for _, v in ball.impacts]
        assert len(apexes) >= 3 and apexes[0] < ball.drop
        assert all(b < a for a, b in zip(apexes, apexes[1:]))
        for (t0, v), (t1, _) in zip(ball.impacts, ball.impacts[1:]):  # each flight rises to v^2 / 2g
            assert math.isclose(t1 - t0, 2 * v / physical.GRAVITY, rel_tol=1e-9)
        heights = [(s["t"], s["y"]) for second in ep.snapshots for s in second]
        for (t0, v), (t1, _) in zip(ball.impacts, ball.impacts[1:]):
            peak = max(y for t, y in heights if t0 < t < t1)
            assert peak <= v * v / (2 * physical.GRAVITY) + 1e-9
        assert ball.resting and ball.y == 0 and ball.v == 0
        kinds = [s.split("ball ")[1] for s in ep.sentences]
        assert kinds[0] == "falls toward the floor." and "bounces off the floor." in kinds
        rest = kinds.index("comes to rest on the floor.")
        assert set(kinds[rest + 1 :]) == {"rests on the floor."} and rest < 7
        assert math.isclose(
            ball.impacts[-1][1], max(v for _, v in ball.impacts) * physical.BALL_RESTITUTION ** (len(apexes) - 1)
        )


def test_box_slides_slower_and_stops_at_the_wall():
    for seed in range(6):
        box = scene("box", seed)
        ep = simulation.run_scene(box, 6, lambda o: 0)
        snaps = [s for second in ep.snapshots for s in second]
        assert all(s["x"] + box.side <= physical.BOX_WALL_X + 1e-12 for s in snaps)
        speeds = [s["v"] for s in snaps]
        assert all(b <= a for a, b in zip(speeds, speeds[1:])) and speeds[0] > 0
        assert box.stopped and box.v == 0 and math.isclose(box.x + box.side, physical.BOX_WALL_X)
        hit = int(box.hit_time)
        assert 1 <= hit and ep.sentences[hit].endswith("hits the wall and stops.")
        assert ep.sentences[0].endswith("is pushed toward the wall.")
        assert all(s.endswith("slides toward the wall.") for s in ep.sentences[1:hit])
        assert all(s.endswith("rests against the wall.") for s in ep.sentences[hit + 1 :])


def test_elevator_moves_one_floor_per_step_with_doors_shut():
    moves = 0
    for seed in range(5):
        lift = scene("elevator", seed)
        ep = simulation.run_scene(lift, 30, simulation.sampler(np.random.default_rng(seed)))
        positions = [second[0]["pos"] for second in ep.snapshots] + [lift.pos]
        occupied = lift.start_occupied
        for t, text in enumerate(ep.sentences):
            step = positions[t + 1] - positions[t]
            if " goes " in text:
                moves += 1
                assert abs(step) == 1 and all(s["doors"] == 0 for s in ep.snapshots[t])
                assert f"floor {physical.FLOOR_NAMES[int(positions[t + 1])]}" in text.split(" on its way")[0]
                if "stops" in text and t + 1 < len(ep.sentences):
                    assert "opens its doors" in ep.sentences[t + 1]
            else:
                assert step == 0
            if "walks into" in text:
                assert not occupied
                occupied = True
            elif "walks out" in text:
                assert occupied
                occupied = False
            if "opens its doors" in text:
                assert ("with a person inside" in text) == occupied
            assert 1 <= positions[t + 1] <= 4
    assert moves >= 20


def test_frames_show_the_simulated_state():
    size = 96
    ball = scene("ball", 3)
    ep = simulation.run_scene(ball, 8, lambda o: 0)
    rows = []
    for snap, frame in zip((s for second in ep.snapshots for s in second), ep.frames(size)):
        mask = np.all(frame == scenes.COLOURS[ball.colour], axis=-1)
        ys, xs = np.nonzero(mask)
        scale = (size - scenes.FLOOR_PX) / scenes.WORLD  # pixels per unit; the floor band's top edge is at row 87.5
        row, col = size - scenes.FLOOR_PX - 0.5 - (snap["y"] + ball.radius) * scale, snap["x"] * scale
        assert abs(ys.mean() - row) < 0.75 and abs(xs.mean() - col) < 0.75
        if snap["resting"]:  # sits on the floor band, not in it
            assert ys.max() == size - scenes.FLOOR_PX - 1
        rows.append(ys.mean())
    assert max(rows) - min(rows) > 30 and snap["resting"]  # it really moves on screen, and lands

    box = scene("box", 4)
    ep = simulation.run_scene(box, 4, lambda o: 0)
    scale = base.px_scale(size)
    for snap, frame in zip((s for second in ep.snapshots for s in second), ep.frames(size)):
        xs = np.nonzero(np.all(frame == scenes.COLOURS[box.colour], axis=-1))[1]
        assert abs(xs.mean() + 0.5 - (snap["x"] + box.side / 2) * scale) < 1.0

    lift = scene("elevator", 0, floor=1, pos=1.0, occupied=False)
    ep = simulation.run_scene(lift, 4, lambda options: len(options) - 1)  # nobody boards, then called to floor four
    frames = ep.frames(size)
    lamp = np.array([250, 200, 0])
    assert not np.all(frames[0] == lamp, axis=-1).any()  # no call yet
    assert np.all(frames[-1] == lamp, axis=-1).any()  # the call lamp is lit while it moves
    open_car = np.all(frames[11] == (170, 150, 120), axis=-1).sum()
    shut_car = np.all(frames[0] == (170, 150, 120), axis=-1).sum()
    assert open_car > 5 * max(shut_car, 1)  # doors opening reveal the car


def enumerate_leaves(start, seconds):
    """Every sequence of draws for ``seconds`` seconds: (probability, [(choice index, sentence)])."""
    leaves = []

    def walk(state, path, p):
        if len(path) == seconds:
            leaves.append((p, path))
            return
        for i, (q, outcome) in enumerate(state.choices()):
            child = copy.deepcopy(state)
            text, _ = child.advance(outcome)
            walk(child, path + [(i, text)], p * q)

    walk(start, [], 1.0)
    return leaves


def brute_force_ceiling(leaves, seconds):
    per_step = []
    for t in range(seconds - 1):
        joint = {}
        for p, path in leaves:
            history = tuple(i for i, _ in path[: t + 1])
            joint.setdefault(history, {}).setdefault(path[t + 1][1], 0.0)
            joint[history][path[t + 1][1]] += p
        per_step.append(sum(max(nexts.values()) for nexts in joint.values()))
    return sum(per_step) / len(per_step)


@pytest.mark.parametrize(
    "state, seconds, expected",
    [
        (dict(floor=1, pos=1.0, occupied=False), 4, (0.5 + 1 + 1 / 3) / 3),
        (dict(floor=2, pos=2.0, occupied=True), 7, None),
    ],
)
def test_ceiling_equals_brute_force_enumeration(state, seconds, expected):
    start = scene("elevator", 0, **state)
    leaves = enumerate_leaves(start, seconds)
    assert math.isclose(sum(p for p, _ in leaves), 1.0) and len(leaves) > 4
    episodes = []
    for _, path in leaves:
        script = iter(i for i, _ in path)
        ep = simulation.run_scene(copy.deepcopy(start), seconds, lambda options, script=script: next(script))
        assert ep.sentences == [text for _, text in path]
        episodes.append(ep)
    value = ceilings.ceiling(episodes, weights=[p for p, _ in leaves])
    assert math.isclose(value["overall"], brute_force_ceiling(leaves, seconds), rel_tol=1e-12)
    assert value["overall"] < 1
    if expected is not None:
        assert math.isclose(value["overall"], expected)
    records = [json.loads(json.dumps(ep.record())) for ep in episodes]  # the recorded form gives the same
    assert math.isclose(ceilings.ceiling(records, [p for p, _ in leaves])["overall"], value["overall"])


def test_ceiling_is_one_only_without_stochastic_scenes():
    mixed = [
        simulation.simulate(simulation.episode_seed(2, i), scenes.FIRST_SCENE_TYPES, seconds=6, fps=4)
        for i in range(24)
    ]
    value = ceilings.ceiling(mixed)
    assert value["per_scene"]["ball"] == value["per_scene"]["box"] == 1.0
    assert 0.5 < value["per_scene"]["elevator"] < 1 and value["overall"] < 1
    assert sum(value["steps"].values()) == 24 * 5
    physical = [
        simulation.simulate(simulation.episode_seed(2, i), scenes=("ball", "box"), seconds=6, fps=4) for i in range(12)
    ]
    assert ceilings.ceiling(physical)["overall"] == 1.0


def test_cli_writes_clips_records_and_summary(tmp_path):
    args = [
        "generate",
        "--episodes",
        "3",
        "--seed",
        "5",
        "--out",
        str(tmp_path),
        "--split",
        "heldout",
        "--seconds",
        "3",
        "--fps",
        "4",
        "--size",
        "32",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "world_model.data.synthetic.generator", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    split = tmp_path / "heldout"
    assert sorted(p.name for p in split.iterdir()) == [
        "episode_00000.mp4",
        "episode_00001.mp4",
        "episode_00002.mp4",
        "episodes.jsonl",
        "summary.json",
    ]
    records = [json.loads(line) for line in (split / "episodes.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["heldout-00000", "heldout-00001", "heldout-00002"]
    assert all(
        r["seed"] % 2 == 1 and r["fps"] == 4 and len(r["sentences"]) == 3 and len(r["next"]) == 2 for r in records
    )
    assert [s["second"] for s in records[0]["sentences"]] == [0, 1, 2]
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(split / "episode_00000.mp4"))
    assert frames == 12
    summary = json.loads((split / "summary.json").read_text())
    assert sum(summary["counts"].values()) == 3 and summary["split"] == "heldout"
    assert set(summary["vocabulary"]) == {t for r in records for s in r["sentences"] for t in tokenize(s["text"])}
    assert summary["ceiling"] == ceilings.ceiling(records)
    assert generator.main([*args]) == 2  # refuses to overwrite
    assert generator.main([*args, "--overwrite", "--episodes", "1"]) == 0
    assert len((split / "episodes.jsonl").read_text().splitlines()) == 1
    assert not list(tmp_path.glob(".heldout.partial-*"))


def test_replay_reaches_the_recorded_state():
    for i in range(12):
        seed = simulation.episode_seed(3, i, "heldout")
        ep = simulation.simulate(seed, seconds=8, fps=4)
        for seconds in (0, 3, 8):
            reached, sentences = simulation.replay(seed, seconds, fps=4)
            assert reached.kind == ep.kind and sentences == ep.sentences[:seconds]
            if 0 < seconds < 8:
                assert simulation.next_distribution(reached) == ep.next[seconds - 1]
    other = simulation.simulate(7, scenes=("elevator", "ball"), seconds=6, fps=4).record()
    assert ceilings.k_step_ceilings(other, 2, 3, scenes=("elevator", "ball"))
    with pytest.raises(ValueError, match="scene types"):
        ceilings.k_step_ceilings({**other, "sentences": other["sentences"][::-1]}, 2, 3, scenes=("elevator", "ball"))


def test_k_step_distributions_are_the_marginals_of_the_outcome_tree():
    start = scene("elevator", 0, floor=2, pos=2.0, occupied=True)
    steps = 6
    leaves = enumerate_leaves(start, steps)
    dists = ceilings.k_step_distributions(start, steps)
    assert len(dists) == steps
    for k, dist in enumerate(dists):
        marginal = {}
        for p, path in leaves:
            marginal[path[k][1]] = marginal.get(path[k][1], 0.0) + p
        assert dict(dist).keys() == marginal.keys()
        assert all(math.isclose(dict(dist)[s], p) for s, p in marginal.items())
        assert math.isclose(sum(p for _, p in dist), 1.0) and math.isclose(dist[0][1], max(marginal.values()))


def test_k_step_ceilings_by_hand_for_an_empty_car_at_open_doors():
    # floor two, doors open, nobody inside: walk in or not, close, then a call to floor one (weight 2 of 4),
    # three or four (1 each); floor one and three are one second away, four two seconds.
    lift = scene("elevator", 0, floor=2, pos=2.0, occupied=False, phase="board", doors=1.0)
    dists = ceilings.k_step_distributions(lift, 4)
    assert dict(dists[0]) == {
        "a person walks into the elevator on floor two.": physical.P_ENTER,
        "the elevator waits on floor two with its doors open.": 1 - physical.P_ENTER,
    }
    assert dict(dists[1]) == {"the elevator closes its doors on floor two.": 1.0}
    down = physical.CALL_WEIGHTS[1] / (physical.CALL_WEIGHTS[1] + physical.CALL_WEIGHTS[3] + physical.CALL_WEIGHTS[4])
    up = (1 - down) / 2
    assert dict(dists[2]) == pytest.approx(
        {
            "the elevator goes down and stops at floor one.": down,
            "the elevator goes up and stops at floor three.": up,
            "the elevator goes up to floor three on its way to floor four.": up,
        }
    )
    assert dict(dists[3]) == pytest.approx(
        {
            "the elevator opens its doors on floor one with a person inside.": down * physical.P_ENTER,
            "the empty elevator opens its doors on floor one.": down * (1 - physical.P_ENTER),
            "the elevator opens its doors on floor three with a person inside.": up * physical.P_ENTER,
            "the empty elevator opens its doors on floor three.": up * (1 - physical.P_ENTER),
            "the elevator goes up and stops at floor four.": up,
        }
    )


def test_k_step_ceilings_agree_with_the_record_and_are_one_for_deterministic_scenes():
    kinds = set()
    for i in range(40):
        record = json.loads(
            json.dumps(simulation.simulate(simulation.episode_seed(4, i, "heldout"), seconds=8, fps=4).record())
        )
        kinds.add(record["scene"])
        for observe in (1, 3, 5):
            values = ceilings.k_step_ceilings(record, observe, 8 - observe)
            assert len(values) == 8 - observe and all(0 < c <= 1 for c in values)
            assert math.isclose(values[0], record["next"][observe - 1]["best_p"])
            if record["scene"] in ("ball", "box", "occlusion", "blocks", "counting"):  # deterministic given the state
                assert values == [1.0] * len(values)
            assert ceilings.k_step_ceilings(record["seed"], observe, 2, fps=4) == values[:2]
        if record["scene"] in ("elevator", "doors"):
            assert min(ceilings.k_step_ceilings(record, 3, 5)) < 1
    assert kinds == set(scenes.SCENE_TYPES)
    with pytest.raises(ValueError, match="cannot observe"):
        ceilings.k_step_ceilings(record, 9, 1)

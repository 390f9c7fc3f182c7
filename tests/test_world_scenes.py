"""The scenes that need memory, interaction and chance: what each simulates, says and draws."""

import copy

import cv2
import numpy as np
import pytest

from world_model.data.synthetic import scenes, simulation
from world_model.data.synthetic.scenes import base, blocks, counting, doors

NEW = ("occlusion", "blocks", "counting", "doors")


def episodes(kind, n, seconds=14, fps=12, seed=0):
    return [simulation.simulate(simulation.episode_seed(seed, i), (kind,), seconds, fps) for i in range(n)]


def objects(frame):
    """Connected regions of each object colour in a frame (exact colours: the simulator's own drawing)."""
    count = 0
    for colour in scenes.OBJECT_COLOURS:
        mask = np.all(frame == colour, axis=-1).astype(np.uint8)
        count += cv2.connectedComponents(mask, connectivity=4)[0] - 1
    return count


@pytest.mark.parametrize("kind", scenes.SCENE_TYPES)
def test_distractors_never_change_a_sentence(kind):
    """Two scenes with the same latents and different distractors say the same thing under the same outcomes."""
    rng = np.random.default_rng(5)
    latents = {name: base.draw(rng, dist) for name, dist in scenes.SCENES[kind].latents().items()}
    runs = []
    for seed in (1, 2, 3):
        made = scenes.SCENES[kind](12, latents, np.random.default_rng(seed))
        runs.append(simulation.run_scene(made, 14, simulation.sampler(np.random.default_rng(9))).sentences)
    assert runs[0] == runs[1] == runs[2]


def test_scene_prior_is_every_latent_combination_with_its_probability():
    for kind in scenes.SCENE_TYPES:
        prior = scenes.scene_prior(kind, 4)
        sizes = [len(d) for d in scenes.SCENES[kind].latents().values()]
        assert len(prior) == int(np.prod(sizes)) and sum(p for p, _ in prior) == pytest.approx(1.0)
    lamps = {(s.speed_word, s.start, s.row) for _, s in scenes.scene_prior("blocks", 4)}
    assert len(lamps) == len(blocks.SPEEDS) * len(blocks.START_X) * len(blocks.ROW)


def test_occlusion_hides_the_object_and_lets_it_out_on_the_far_side():
    passes = {"slowly": [], "quickly": []}
    for ep in episodes("occlusion", 30):
        s = ep.scene
        name = f"the {s.size_word} {s.colour} {s.object}"
        hidden_run, went_in = 0, None
        for t, text in enumerate(ep.sentences):
            snaps = ep.snapshots[t]
            visible = [np.all(s.draw(snap, 96) == scenes.COLOURS[s.colour], axis=-1).any() for snap in snaps]
            assert visible == [not snap["hidden"] for snap in snaps]  # "hidden" is what the frame shows
            if text == "the screen hides something.":
                assert not visible[0] and not visible[-1]  # wholly behind the screen at both ends of the second
                went_in = went_in or ("right" if snaps[0]["v"] > 0 else "left")
                hidden_run += 1
                continue
            assert text.startswith(name)  # seen, so named
            if "goes behind" in text:
                assert visible[0] and not visible[-1]
                went_in = "right" if snaps[0]["v"] > 0 else "left"
            elif "comes out" in text:
                assert text.endswith(f"comes out on the {went_in} of the screen.") and not visible[0] and visible[-1]
                passes[s.speed_word].append(hidden_run)
            else:
                assert visible[0] and visible[-1]
            hidden_run, went_in = 0, went_in if "goes behind" in text else None
            if "toward the screen" in text:
                assert s.speed_word in text
        assert ep.sentences[0].endswith("toward the screen.")  # its speed is said before it first hides
    assert min(passes["slowly"]) >= 2 and max(passes["quickly"]) <= 2
    assert np.mean(passes["slowly"]) > np.mean(passes["quickly"]) + 1


def test_counting_overflows_on_the_ball_after_the_capacity_and_empties_next():
    overflows = 0
    for ep in episodes("counting", 30):
        s = ep.scene
        assert ep.sentences[0] == f"a sign says the bin holds {base.NUMBER_WORDS[s.capacity]} balls."
        held = 0
        for t, text in enumerate(ep.sentences[1:], start=1):
            if "drops into the bin" in text:
                held += 1
                assert held <= s.capacity
            elif "bounces off the full bin" in text:
                assert held == s.capacity
                overflows += 1
                if t + 1 < len(ep.sentences):
                    assert ep.sentences[t + 1] == "the bin empties through its trapdoor."
            else:
                assert text == "the bin empties through its trapdoor."
                held = 0
        dots = np.all(s.draw(ep.snapshots[0][0], 96) == counting.DOT_COLOUR, axis=-1)
        assert cv2.connectedComponents(dots.astype(np.uint8))[0] - 1 == s.capacity  # shown in the first second ...
        assert not any(np.all(s.draw(snap, 96) == counting.DOT_COLOUR, axis=-1).any() for snap in ep.snapshots[1])
    assert overflows >= 30  # ... and then only counting the drops tells when the bin is full


def test_blocks_slide_in_turn_and_the_lamp_lights_four_seconds_after_the_switch():
    for ep in episodes("blocks", 30):
        s = ep.scene
        texts = ep.sentences
        press = next(t for t, x in enumerate(texts) if "rolls over the switch" in x)
        hit = next(t for t, x in enumerate(texts) if "hits the first block" in x)
        assert 1 <= press < hit and f"row of {scenes.physical.FLOOR_NAMES[s.row]} blocks" in texts[0]
        lamp = [(t, "lights up" in x) for t, x in enumerate(texts) if "the lamp" in x]
        assert lamp == [(press + 4 + 3 * j, j % 2 == 0) for j in range(len(lamp))]  # on, then off and on every 3 s
        assert len(lamp) == len(range(press + 4, len(texts), 3))
        knocks = [t for t, x in enumerate(texts) if x.startswith("a block knocks")]
        assert knocks == list(range(hit + 1, hit + s.row))
        if hit + s.row < len(texts):
            assert texts[hit + s.row].startswith("the last block hits the wall")
        for second in ep.snapshots:
            for snap in second:
                lefts = snap["blocks"]
                assert all(b - a >= blocks.BLOCK[0] - 1e-9 for a, b in zip(lefts, lefts[1:]))  # never overlap
                assert lefts[-1] + blocks.BLOCK[0] <= blocks.WALL_X + 1e-9
                lit = np.all(s.draw(snap, 96) == blocks.LAMP_LIT_COLOUR, axis=-1).any()
                assert lit == snap["lamp"]


def test_doors_bring_the_parcel_back_to_the_door_they_came_in_by():
    targets = {}
    for ep in episodes("doors", 40):
        came_in, walking = None, 0
        for text in ep.sentences:
            if "comes in through" in text:
                came_in = text.split("through the ")[1].split()[0]
            elif "walks to the" in text:
                target = text.split("walks to the ")[1].split()[0]
                assert target != came_in
                walking += 1
            elif "picks up" in text:
                distance = abs(list(doors.DOORS).index(target) - list(doors.DOORS).index(came_in))
                assert walking == distance  # a second from one door to the next
                targets.setdefault(came_in, []).append(target)
                walking = 0
            elif "carries the parcel back" in text:
                assert text.endswith(f"back to the {came_in} door.")
    assert len(targets) == 3
    lift = scenes.make_scene("doors", np.random.default_rng(0), 4)
    lift.door, lift.phase = "middle", "choose"
    assert dict((d, p) for p, d in lift.choices()) == pytest.approx({"left": 0.75, "right": 0.25})


@pytest.mark.parametrize("kind", NEW)
def test_every_frame_shows_the_objects_the_snapshot_holds(kind):
    for ep in episodes(kind, 6, seconds=10, fps=4):
        for second in ep.snapshots:
            for snap in second:
                frame = ep.scene.draw(copy.deepcopy(snap), 96)
                assert frame.shape == (96, 96, 3) and frame.dtype == np.uint8
                assert objects(frame) == expected_objects(kind, ep.scene, snap)


def expected_objects(kind, scene, snap):
    if kind == "occlusion":
        return 0 if snap["hidden"] else 1
    if kind == "blocks":
        return 1 + scene.row
    if kind == "counting":
        return len(snap["balls"])
    person = snap["person"] is not None
    return person + 3 - (snap["taken"] is not None) + (snap["carrying"] and person)


def every_sentence(kind, seconds, fps):
    """Every sentence a scene of ``kind`` can say in ``seconds``: the outcome tree over every start, equal states
    merged."""
    from world_model.data.synthetic.ceilings import state_key

    frontier = {state_key(s): s for _, s in scenes.scene_prior(kind, fps)}
    said = set()
    for _ in range(seconds):
        grown = {}
        for state in frontier.values():
            for _, outcome in state.choices():
                child = copy.deepcopy(state)
                said.add(child.advance(outcome)[0])
                grown[state_key(child)] = child
        frontier = grown
    return said


def test_scene_of_names_the_scene_of_every_sentence_it_can_say():
    total = 0
    for kind in scenes.SCENE_TYPES:
        said = every_sentence(kind, 14, 4)
        total += len(said)
        assert {scenes.scene_of(s) for s in said} == {kind}, kind
        assert all(len(s.split()) < scenes.MAX_TOKENS for s in said)  # words and the full stop fit the window
    assert total > 400
    assert scenes.scene_of("a cat sleeps.") == "other"

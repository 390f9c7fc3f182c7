"""The ceilings from the sentences, the Markov floors, and the report that sets them side by side."""

import copy
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.model_factories import make_tiny_world_predictor
from world_model.data.synthetic import ceilings, generator, scenes, simulation
from world_model.evaluation import world_report, world_scores
from world_model.evaluation.floors.markov import MIN_PROB, START, STRENGTHS, MarkovFloor

MINI = ("box", "counting")


def every_episode(kinds, seconds, fps):
    """Every sentence sequence the world can produce in ``seconds``, with its probability: (p, sentences)."""
    leaves = []

    def walk(state, sentences, p):
        if len(sentences) == seconds:
            leaves.append((p, sentences))
            return
        for q, outcome in state.choices():
            child = copy.deepcopy(state)
            text, _ = child.advance(outcome)
            walk(child, sentences + [text], p * q)

    for kind in kinds:
        for p, start in scenes.scene_prior(kind, fps):
            walk(start, [], p / len(kinds))
    return leaves


def test_the_predictive_from_sentences_is_the_brute_force_conditional():
    seconds, fps = 5, 4
    leaves = every_episode(MINI, seconds, fps)
    assert math.isclose(sum(p for p, _ in leaves), 1.0)
    for observed in range(1, seconds - 1):
        joint = defaultdict(lambda: defaultdict(float))  # prefix -> (k-step sentence) -> mass, for k = 1, 2
        for p, sentences in leaves:
            prefix = tuple(sentences[:observed])
            joint[prefix][(1, sentences[observed])] += p
            joint[prefix][(2, sentences[observed + 1])] += p
        for prefix, mass in joint.items():
            total = sum(m for (k, _), m in mass.items() if k == 1)
            dists = ceilings.sentence_predictive(list(prefix), 2, MINI, fps)
            for k, dist in enumerate(dists, start=1):
                expected = {s: m / total for (j, s), m in mass.items() if j == k}
                assert dict(dist) == pytest.approx(expected, abs=1e-12), (prefix, k)


def test_hand_computed_posteriors():
    box = "the small red box"
    dist = ceilings.sentence_predictive([f"{box} is pushed toward the wall."], 1, ("box",))[0]
    # the box reaches the wall within the second second for hit times 1.4 and 1.8 s: two of six
    assert dict(dist) == pytest.approx(
        {f"{box} hits the wall and stops.": 1 / 3, f"{box} slides toward the wall.": 2 / 3}
    )
    ball = "a large blue ball"
    sign = "a sign says the bin holds two balls."
    first = ceilings.sentence_predictive([sign], 1, ("counting",))[0]  # the balls' colour and size are not known yet
    assert len(first) == 12 and all(p == pytest.approx(1 / 12) for _, p in first)
    assert ceilings.entropy(first) == pytest.approx(math.log(12))
    full = ceilings.sentence_predictive(
        [sign, f"{ball} drops into the bin.", f"{ball} drops into the bin."], 2, ("counting",)
    )
    assert full == [[(f"{ball} bounces off the full bin.", 1.0)], [("the bin empties through its trapdoor.", 1.0)]]
    seen = [sign.replace("two", "three"), f"{ball} drops into the bin.", f"{ball} drops into the bin."]
    assert ceilings.sentence_predictive(seen, 1, ("counting",))[0] == [(f"{ball} drops into the bin.", 1.0)]
    with pytest.raises(ValueError, match="no state"):
        ceilings.posterior([sign, "the bin empties through its trapdoor."], ("counting",))
    with pytest.raises(ValueError, match="begins with"):
        ceilings.posterior(["a cow jumps over the moon."], ("counting",))


def test_every_true_future_is_possible_and_the_elevator_says_all_its_state():
    for i in range(30):
        ep = simulation.simulate(simulation.episode_seed(6, i), seconds=10, fps=4)
        for observed, belief in enumerate(ceilings.beliefs(ep.sentences[:7], fps=4), start=1):
            said = ceilings.k_step_distributions(belief, 3)
            full = ceilings.k_step_distributions(simulation.replay(ep.seed, observed, fps=4)[0], 3)
            assert sum(p for p, _ in belief) == pytest.approx(1.0)
            for k in range(3):
                assert ep.sentences[observed + k] in dict(said[k])  # what happened was possible
            if ep.kind == "elevator":  # its sentences say every state the draws depend on
                assert [d[0][1] for d in said] == pytest.approx([d[0][1] for d in full])


def test_markov_floor_counts_backs_off_and_pads_the_start():
    floor = MarkovFloor.fit([["a", "b", "c"], ["a", "b", "d"], ["x", "b", "c"]], order=2, strength=1e-9)
    assert floor.known == ["a", "b", "c", "d", "x"]
    p = dict(zip(floor.known, floor.distribution(["a", "b"])))
    assert p["c"] == pytest.approx(0.5) and p["d"] == pytest.approx(0.5)
    p = dict(zip(floor.known, floor.distribution(["x", "b"])))
    assert p["c"] == pytest.approx(1.0)
    unseen = dict(zip(floor.known, floor.distribution(["c", "b"])))  # (c, b) never seen: backs off to (b,)
    assert unseen["c"] == pytest.approx(2 / 3) and unseen["d"] == pytest.approx(1 / 3)
    start = dict(zip(floor.known, floor.distribution([])))  # (START, START): the first sentences
    assert start["a"] == pytest.approx(2 / 3) and start["x"] == pytest.approx(1 / 3)
    assert floor._history([]) == (START, START)
    smooth = MarkovFloor.fit([["a", "b"]] * 3, order=1, strength=1.0)
    assert smooth.probability(smooth.distribution(["a"]), "a") > 0  # smoothing leaves nothing impossible
    assert smooth.probability(smooth.distribution(["a"]), "never said") == 0
    chosen = MarkovFloor.fit([["a", "b", "a", "b"]] * 20, order=1)
    assert chosen.strength in STRENGTHS and chosen.strength == min(STRENGTHS)  # a deterministic world: least smoothing


def test_markov_k_step_pushes_the_chain_forward():
    cycle = [["a", "b", "c"] * 4] * 5 + [["a", "c", "b"] * 4]
    floor = MarkovFloor.fit(cycle, order=1, strength=1e-9)
    one, two = floor.k_step(["a"], 2)
    p1, p2 = dict(zip(floor.known, one)), dict(zip(floor.known, two))
    after = {s: dict(zip(floor.known, floor.distribution([s]))) for s in "abc"}  # the chain's one-step table
    assert p1 == pytest.approx(after["a"])
    assert p2["c"] == pytest.approx(sum(after["a"][s] * after[s]["c"] for s in "abc"), abs=1e-3)
    assert sum(two) == pytest.approx(1.0)


def test_scores_accuracy_log_loss_calibration_and_episode_intervals():
    records = [{"id": "e0", "scene": "box"}, {"id": "e1", "scene": "ball"}]
    points = [
        world_scores.Point(records[0], ["x"], ["a", "b"]),
        world_scores.Point(records[0], ["x", "a"], ["b", "c"]),
        world_scores.Point(records[1], ["y"], ["a", "a"]),
    ]
    forecasts = [
        world_scores.Forecast(["a", "b"], [0.9, 0.6], [0.9, 0.6]),
        world_scores.Forecast(["c", "c"], [0.5, 0.5], [0.2, 0.5]),
        world_scores.Forecast(["a", "b"], [0.8, 0.7], [0.8, 0.0]),
    ]
    out = world_scores.score(points, forecasts, 2)
    assert out["all"]["1"]["accuracy"] == pytest.approx(2 / 3) and out["all"]["2"]["accuracy"] == pytest.approx(2 / 3)
    assert out["box"]["1"]["log_loss"] == pytest.approx((-math.log(0.9) - math.log(0.2)) / 2)
    assert out["ball"]["2"]["log_loss"] == pytest.approx(-math.log(MIN_PROB))
    # bins of width 1/15: (0.9: hit), (0.5: miss), (0.8: hit) at k=1 -> |0.9-1| + |0.5-0| + |0.8-1| over 3
    assert out["all"]["1"]["ece"] == pytest.approx((0.1 + 0.5 + 0.2) / 3)
    copy_last = world_scores.score(points, world_scores.copy_last_forecasts(points, 2), 2)
    assert copy_last["all"]["1"]["log_loss"] is None and copy_last["all"]["1"]["accuracy"] == 0
    lo, hi = world_scores.episode_interval([1, 0, 1, 1], ["e0", "e0", "e1", "e2"])
    assert lo < 0.75 < hi and hi - lo < 1.2
    assert world_scores.episode_interval([1.0, 0.0], ["e0", "e0"]) is None


def test_the_world_needs_memory_where_it_was_built_to():
    """Counting what followed the last two sentences falls well short of the from-sentences ceiling in the
    occlusion, blocks and counting scenes (the committed report measures it on the full held-out set)."""
    kinds = ("occlusion", "blocks", "counting")
    train = [
        {**simulation.simulate(simulation.episode_seed(1, i), kinds, 14, 4).record(), "id": f"t{i}"} for i in range(900)
    ]
    heldout = [
        {**simulation.simulate(simulation.episode_seed(1, i, "heldout"), kinds, 14, 4).record(), "id": f"h{i}"}
        for i in range(90)
    ]
    points = world_scores.prediction_points(heldout, 1)
    said = world_scores.ceiling_table(points, world_scores.ceilings_at(points, 1, kinds), 1)
    floor = world_scores.fit_markov_floors(train, (2,))["markov2"]
    markov = world_scores.score(points, world_scores.markov_forecasts(floor, points, 1), 1)
    for kind in kinds:
        gap = said[kind]["1"]["ceiling_from_sentences"] - markov[kind]["1"]["accuracy"]
        assert gap >= 0.12, (kind, gap)


def test_report_command_writes_the_world_report(tmp_path, capsys):
    data = tmp_path / "world"
    small = dict(seconds=8, fps=4, size=32, scenes=("counting", "occlusion"))
    generator.generate(30, 0, data, "train", **small)
    generator.generate(6, 0, data, "heldout", **small)
    summary = json.loads((data / "heldout" / "summary.json").read_text())
    said = summary["ceiling_from_sentences"]
    assert said["overall"] <= summary["ceiling"]["overall"] + 1e-9 and said["entropy"]["overall"] > 0
    out = tmp_path / "report"
    assert world_report.main(["--data", str(data), "--out", str(out), "--steps", "3"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["scenes"]) == {"all", "counting", "occlusion"}
    assert result["points"] == 6 * (8 - 3) and (out / "accuracy.png").stat().st_size > 10_000
    k1 = result["scenes"]["all"]["k"]["1"]
    assert set(k1["predictors"]) == {"copy_last", "markov1", "markov2", "markov3"}
    assert 0 < k1["ceiling_from_sentences"] <= k1["ceiling_full_state"] + 1e-9 and k1["entropy_from_sentences"] > 0
    assert "| counting |" in capsys.readouterr().out and "needs memory" in (out / "results.md").read_text()
    assert world_report.main(["--data", str(data), "--out", str(out)]) == 2  # never over an existing report
    assert "already exists" in capsys.readouterr().err
    assert world_report.main(["--data", str(tmp_path), "--out", str(tmp_path / "r2")]) == 2
    np.testing.assert_equal(sorted(p.name for p in out.iterdir()), ["accuracy.png", "results.json", "results.md"])


def test_report_scores_predictors_seed_by_seed_beside_the_floors(tmp_path, monkeypatch):
    from world_model.data.synthetic.episodes import known_sentences

    data = tmp_path / "world"
    small = dict(seconds=7, fps=4, size=16, scenes=("counting",))
    generator.generate(12, 0, data, "train", **small)
    generator.generate(3, 0, data, "heldout", **small)
    known = known_sentences(data)
    folders = {}
    for kind in ("four_tensor", "baseline"):
        for seed in (0, 1):
            folder = make_tiny_world_predictor(tmp_path / f"{kind}{seed}", kind, known, seed)
            folders.setdefault(kind, []).append(str(folder))
    Path(folders["baseline"][1], "calibration.json").write_text('{"temperature": 2.5}')
    out, cache = tmp_path / "two", tmp_path / "cache"
    args = ["--data", str(data), "--steps", "2", "--four-tensor", *folders["four_tensor"]]
    both = [*args, "--flat-baseline", *folders["baseline"], "--cache", str(cache)]
    assert world_report.main([*both, "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert len(list(cache.iterdir())) == 4  # one forecast file per checkpoint
    assert result["settings"]["temperatures"] == {"four_tensor": [1.0, 1.0], "flat_baseline": [1.0, 2.5]}
    assert "the temperature of each seed: four_tensor 1, 1; flat_baseline 1, 2.5." in (out / "results.md").read_text()
    import world_model.models.registry as registry

    monkeypatch.setattr(registry, "load_predictor", lambda folder: pytest.fail(f"loaded {folder} again"))
    assert world_report.main([*both, "--out", str(tmp_path / "again")]) == 0  # every forecast from the cache
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["scenes"] == result["scenes"] and again["targets"] == result["targets"]
    monkeypatch.undo()
    cell = result["scenes"]["counting"]["k"]["2"]
    four = cell["predictors"]["four_tensor"]
    assert len(four["seeds"]) == 2 and four["accuracy"]["mean"] == pytest.approx(sum(four["seeds"]) / 2)
    assert four["accuracy"]["lo"] <= four["accuracy"]["mean"] <= four["accuracy"]["hi"]
    paired = cell["four_tensor_minus_flat_baseline"]
    base = cell["predictors"]["flat_baseline"]
    assert paired["accuracy"]["over"] == "seeds"
    assert paired["accuracy"]["mean"] == pytest.approx(four["accuracy"]["mean"] - base["accuracy"]["mean"])
    assert paired["log_loss"]["mean"] == pytest.approx(four["log_loss"]["mean"] - base["log_loss"]["mean"])
    assert set(result["targets"]) == {"copy_last", "markov1", "markov2", "markov3", "four_tensor", "flat_baseline"}
    assert result["targets"]["copy_last"]["log_loss_minus_entropy"] is None
    assert result["targets"]["markov1"]["log_loss_minus_entropy"] > 0  # no forecaster beats the entropy here
    one = tmp_path / "one"
    assert world_report.main([*args[:-1], "--flat-baseline", folders["baseline"][0], "--out", str(one)]) == 0
    single = json.loads((one / "results.json").read_text())["scenes"]["all"]["k"]["1"]
    assert single["four_tensor_minus_flat_baseline"]["accuracy"]["over"] == "episodes"
    assert single["predictors"]["four_tensor"]["accuracy"]["lo"] is None
    assert "four tensor minus flat baseline" in (one / "results.md").read_text()
    assert world_report.main([*args[:4], "--four-tensor", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2


def test_contexts_are_read_in_place_of_the_sentences_and_only_changed_points_are_forecast_anew(tmp_path, monkeypatch):
    from world_model.data.synthetic.episodes import known_sentences, read_episodes
    from world_model.evaluation import model_forecasts

    data = tmp_path / "world"
    small = dict(seconds=6, fps=4, size=16, scenes=("counting",))
    generator.generate(10, 0, data, "train", **small)
    generator.generate(3, 0, data, "heldout", **small)
    known = known_sentences(data)
    make_tiny_world_predictor(tmp_path / "p", "four_tensor", known, n_states=5)
    heldout = read_episodes(data / "heldout")
    truths = {r["id"]: [s["text"] for s in r["sentences"]] for r in heldout}
    predictors = {"four_tensor": [tmp_path / "p"]}
    cache = tmp_path / "cache"
    plain = world_report.world_report(data, 2, None, predictors, False, cache)
    same = world_report.world_report(data, 2, None, predictors, False, cache, contexts=truths)
    assert same["scenes"] == plain["scenes"]  # the true sentences as contexts change nothing

    wrong = dict(truths)
    first = heldout[0]["id"]
    wrong[first] = [truths[first][0], "the bin empties through its trapdoor.", *truths[first][2:]]
    counted = []
    original = model_forecasts.k_step_forecasts
    monkeypatch.setattr(
        model_forecasts, "k_step_forecasts", lambda *a, **k: counted.append(len(a[3])) or original(*a, **k)
    )
    misread = world_report.world_report(data, 2, None, predictors, False, cache, contexts=wrong)
    assert counted == [4 - 1]  # the first episode's cuts that read its second second: o = 2, 3, 4 (of 1..4)
    copy_plain = plain["scenes"]["all"]["k"]["1"]["predictors"]["copy_last"]["accuracy"]
    copy_wrong = misread["scenes"]["all"]["k"]["1"]["predictors"]["copy_last"]["accuracy"]
    assert copy_wrong != copy_plain  # the floors read the contexts too
    k1 = misread["scenes"]["all"]["k"]["1"]
    assert k1["ceiling_from_sentences"] == plain["scenes"]["all"]["k"]["1"]["ceiling_from_sentences"]
    with pytest.raises(world_report.UsageError, match="no context of"):
        world_report.world_report(data, 2, None, None, False, None, contexts={first: truths[first][:1]})

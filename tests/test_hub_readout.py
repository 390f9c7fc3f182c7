"""The hub preset's readout: measured on BLIP-style sequences, chosen by a stated rule, applied by the rollout."""

import pytest

from pipeline import hub_readout
from pipeline.presets import PresetError, check_readout, load_preset
from world_model.models.generation_config import GenerationConfig


def test_the_measures_by_hand():
    grams = hub_readout.attested_pairs(["the dog runs in the park.", "a man rides a bike."])
    captions = [["a dog running in a park"], ["a man rides a bike", "a man on a road"], ["a cat on a couch"]]
    predicted = ["the dog runs in the park.", "a man rides a bike.", "the dog runs in the park."]
    m = hub_readout.measure(predicted, captions, frozenset({"a", "the", "in", "on"}), grams)
    assert m["well_formed"] == 1.0
    assert m["distinct"] == pytest.approx(2 / 3)
    assert m["on_topic"] == pytest.approx(2 / 3)  # "dog"/"park", "man"/"bike"; nothing of the cat's
    assert m["restated"] == pytest.approx(1 / 3)  # man, rides, bike all stand in one caption; dog/runs/park do not
    garbled = hub_readout.measure(["the was to the the."], [["a dog"]], frozenset(), grams)
    assert garbled["well_formed"] == 0.0


def test_the_rule_prefers_well_formed_then_wide_then_on_topic():
    m = lambda wf, d, t, r=0.0: {"well_formed": wf, "distinct": d, "on_topic": t, "restated": r}  # noqa: E731
    assert hub_readout.choose({"a": m(1, 0.5, 0.4), "b": m(1, 0.7, 0.5), "free": m(0.2, 1.0, 0.9)}) == "b"
    assert hub_readout.choose({"a": m(1, 0.95, 0.4), "b": m(1, 0.8, 0.9)}) == "a"  # only a is 90% distinct
    assert hub_readout.choose({"a": m(1, 0.95, 0.6, 0.3), "b": m(1, 0.92, 0.6, 0.1)}) == "b"  # tie: less restated


def test_the_halves_are_fixed_disjoint_and_cover_every_sequence():
    sequences = [{"id": f"s{i}", "captions": ["x"]} for i in range(9)]
    choose, report = hub_readout.halves(sequences)
    assert (len(choose), len(report)) == (4, 5) and hub_readout.halves(list(reversed(sequences))) == (choose, report)
    assert {s["id"] for s in choose + report} == {s["id"] for s in sequences}
    shipped = hub_readout.read_sequences(hub_readout.SEQUENCES)
    assert len(shipped) == 60 and len({s["id"] for s in shipped}) == 60


def test_the_hub_preset_applies_its_readout_unless_the_command_names_one():
    hub = load_preset("hub")
    assert hub.readout == {"readout": "bank", "coherence": True}
    chosen = hub.generation_for(GenerationConfig())
    assert (chosen.readout, chosen.coherence) == ("bank", True)
    named = hub.generation_for(GenerationConfig(readout="tokens"))
    assert (named.readout, named.coherence) == ("tokens", False)
    assert hub.with_models({"predictor": "my/predictor"}).readout == {}  # another predictor: its own default
    offline = load_preset("offline")
    assert offline.generation_for(GenerationConfig()) == GenerationConfig()
    with pytest.raises(PresetError, match="readout takes readout"):
        check_readout("x.yaml", {"coherence": "yes"})

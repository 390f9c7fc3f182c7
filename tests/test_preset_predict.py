"""`python -m pipeline.predict`: the text prediction with a pipeline preset's predictor and readout."""

import json

import pytest

from pipeline.predict import PresetPrediction, main, preset_predict
from pipeline.presets import load_preset
from tests.model_factories import one_torch_thread
from world_model.generation.predict import predict
from world_model.models.generation_config import GenerationConfig

SEQUENCE = ["a man riding a bike down a street.", "a man riding a bike on a road."]


@pytest.fixture(autouse=True)
def single_thread():
    with one_torch_thread():
        yield


def test_the_hub_preset_predicts_with_the_rollouts_readout():
    """The hub preset's readout (configs/pipeline/hub.yaml: the bank ranked by the coherence head) is applied, as
    the video rollout applies it; naming another readout on the command line wins."""
    hub = load_preset("hub")
    assert hub.readout == {"readout": "bank", "coherence": True}
    result = preset_predict(SEQUENCE, PresetPrediction(steps=2), GenerationConfig())
    expected = predict(SEQUENCE, hub.predictor, 2, GenerationConfig(readout="bank", coherence=True))
    assert result["preset"] == "hub" and result["readout"] == "bank" and result["coherence"] is True
    assert result["predictions"] == expected["predictions"]
    plain = preset_predict(SEQUENCE, PresetPrediction(), GenerationConfig(readout="tokens"))
    assert plain["readout"] == "tokens" and plain["coherence"] is False


def test_a_replaced_predictor_drops_the_presets_readout():
    preset = load_preset("hub")
    result = preset_predict(SEQUENCE, PresetPrediction(checkpoint=preset.predictor), GenerationConfig())
    assert result["coherence"] is False  # the folder's own default: its bank, unranked
    assert result["predictions"] == predict(SEQUENCE, preset.predictor)["predictions"]


def test_the_command_prints_json_and_refuses_an_unknown_preset(capsys):
    assert main(["--preset", "hub", "--json", *SEQUENCE]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["preset"] == "hub" and len(printed["predictions"][0]) == 1
    assert main(["--preset", "auto", *SEQUENCE]) == 2
    assert "--preset must be one of hub, offline, got 'auto'" in capsys.readouterr().err

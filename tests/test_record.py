"""rollout.json as `pipeline.record.RolloutRecord`: a real tiny rollout's record loads and writes back byte for byte,
and a malformed record is refused with the field at fault named."""

import json
import re

import pytest

from encoders.grounding import Grounding
from pipeline.config import ModelChoice
from pipeline.record import (
    ClipInfo,
    GroundingVerdict,
    Models,
    ObservedFrame,
    OutOfVocabulary,
    Prediction,
    RolloutRecord,
    Sampling,
    Window,
)
from pipeline.rollout import run_rollout
from tests.model_factories import one_torch_thread
from world_model.models.generation_config import GenerationConfig


def make_record(
    captions: list[str], futures: list[list[str]], groundings: list[Grounding | None] | None = None
) -> RolloutRecord:
    """A complete record of one clip's `captions` (with `groundings`, else unscored) and the sentences of its
    `futures`, for tests of what reads a record."""
    groundings = groundings or [None] * len(captions)
    flagged = sum(g is not None and g.grounded is False for g in groundings)
    return RolloutRecord(
        video="/clips/clip.mp4",
        clip=ClipInfo(fps=10.0, duration_s=float(len(captions)), width=160, height=96, rotation=0),
        preset="offline",
        preset_reason="asked",
        models=Models("/somewhere/offline_pack/captioner", "/pack/renderer", "/pack/predictor", "cpu"),
        sampling=Sampling(
            1.0, None, 32, 1, False, len(futures[0]), 0.0, None, 0, "fp32", "tokens", len(futures), False
        ),
        observed=[
            ObservedFrame(float(t), 10 * t, text, g, f"observed/{t:03d}.png")
            for t, (text, g) in enumerate(zip(captions, groundings))
        ],
        grounding=GroundingVerdict(
            "outside" if flagged * 2 >= len(captions) else "partly outside" if flagged else "unscored",
            len(captions),
            flagged,
            groundings[0].kind if groundings[0] else None,
        ),
        states=[],
        window=Window(states=[], token_ids=[]),
        oov=OutOfVocabulary(tokens=1, unknown=0, rate=0.0, unknown_words=[]),
        predictions=[
            Prediction(sentences, [], None, [f"rendered/sample{k}_step{s + 1:02d}.png" for s in range(len(sentences))])
            for k, sentences in enumerate(futures)
        ],
        warnings=[],
        timings_s={},
    )


def test_a_real_rollout_record_loads_and_writes_back_unchanged(parts, tmp_path):
    with one_torch_thread():
        result = run_rollout(
            parts["clip"],
            2,
            ModelChoice(**{k: parts[k] for k in ("captioner", "renderer", "predictor")}),
            generation=GenerationConfig(samples=2, temperature=1.0),
            output=tmp_path / "run",
        )
    path = tmp_path / "run" / "rollout.json"
    record = RolloutRecord.from_json(path)
    assert record == result.rollout, "what the run holds is what it wrote"
    assert record.to_json() == json.loads(path.read_text()) == result.record
    assert len(record.predictions) == 2 and record.predictions[0].explanations, "samples and explanations recorded"
    record.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()
    assert RolloutRecord.from_json(json.loads(path.read_text())) == record


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda r: r.pop("warnings"), "missing field 'warnings'"),
        (lambda r: r["sampling"].pop("readout"), "missing field 'sampling.readout'"),
        (lambda r: r["predictions"][0].update(sentences="a ball."), r"predictions\[0\].sentences: expected a list"),
        (lambda r: r["observed"][1].update(timestamp_s="1.0"), r"observed\[1\].timestamp_s: expected float, got str"),
        (lambda r: r["observed"][0]["grounding"].pop("score"), r"missing field 'observed\[0\].grounding.score'"),
        (lambda r: r["oov"].update(tokens=True), "oov.tokens: expected int, got bool"),
        (lambda r: r.update(colour="red"), "unknown field 'colour'"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(break_it, message):
    grounded = Grounding("feature_distance", 3.0, 15.6, True)
    data = make_record(["a ball falls.", "a ball lands."], [["a ball rolls."]], [grounded, grounded]).to_json()
    assert RolloutRecord.from_json(data).to_json() == data
    break_it(data)
    with pytest.raises(ValueError, match=message):
        RolloutRecord.from_json(data)


def test_a_file_that_is_not_a_record_is_refused_with_its_path(tmp_path):
    path = tmp_path / "rollout.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: the record: expected an object, got list"):
        RolloutRecord.from_json(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: Expecting property name"):
        RolloutRecord.from_json(path)
    record = make_record(["a ball falls."], [["a ball rolls."]])
    record.write(path)
    assert RolloutRecord.from_json(path) == record

"""Grounding scores: frames outside the captioner's world are flagged, in the score object, in the
shipped pack, and through the rollout (rollout.json, the warning, --on-unknown stop)."""

import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from PIL import Image

from encoders.captioner import HFCaptioner
from encoders.frames import sample_frames
from encoders.grounding import CAPTION_LOGPROB, FEATURE_DISTANCE, FeatureReference, Grounding, clip_verdict
from pipeline import rollout as rollout_module
from pipeline.config import ModelChoice
from pipeline.pack.grounding import pan_zoom_clip
from pipeline.rollout import main, run_rollout
from pipeline.tiny_pack import make_tiny_blip
from tests.model_factories import one_torch_thread

ROOT = Path(__file__).resolve().parent.parent
PHOTO = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"  # a real photograph matplotlib ships


def test_reference_flags_features_far_from_the_training_ones_and_survives_a_round_trip(tmp_path):
    generator = torch.Generator().manual_seed(0)
    train = torch.randn(500, 8, generator=generator) * torch.linspace(0.1, 3, 8)
    reference = FeatureReference.fit(train)
    assert all(g.grounded for g in reference.ground(train)), "every training feature lies inside the threshold"
    far = train[:5] + 20
    assert not any(g.grounded for g in reference.ground(far))
    reference.save(tmp_path)
    loaded = FeatureReference.load(tmp_path)
    assert torch.allclose(loaded.distance(far), reference.distance(far).float().double(), rtol=1e-4)
    assert loaded.threshold == pytest.approx(reference.threshold)
    assert FeatureReference.load(tmp_path / "elsewhere") is None


@pytest.mark.parametrize(
    "flags, verdict",
    [
        ([True, True, True], "inside"),
        ([True, False, True], "partly outside"),
        ([False, True], "outside"),
        ([None, None], "uncalibrated"),
    ],
)
def test_clip_verdict(flags, verdict):
    groundings = [Grounding(FEATURE_DISTANCE, 1.0, 2.0, flag) for flag in flags]
    result = clip_verdict(groundings)
    assert result["verdict"] == verdict and result["flagged"] == flags.count(False)
    assert clip_verdict([None, None])["verdict"] == "unscored"


@pytest.fixture(scope="module")
def pack_captioner():
    with one_torch_thread():
        yield HFCaptioner.from_pretrained(ROOT / "offline_pack" / "captioner", device="cpu")


@pytest.mark.parametrize("example", ["ball", "box", "elevator"])
def test_the_pack_grounds_its_bundled_examples(pack_captioner, example):
    clip = sample_frames(ROOT / "examples" / f"{example}.mp4", frames_per_state=3)
    with one_torch_thread():
        _, groundings = pack_captioner.caption_and_ground([f.image for f in clip])
    assert clip_verdict(groundings)["verdict"] == "inside"
    assert all(g.kind == FEATURE_DISTANCE for g in groundings)


@pytest.mark.parametrize("zoom", [False, True])
def test_the_pack_flags_every_frame_of_a_real_photo_clip(pack_captioner, tmp_path, zoom):
    video = pan_zoom_clip(np.asarray(Image.open(PHOTO).convert("RGB")), tmp_path / "real.mp4", zoom=zoom, seconds=3)
    clip = sample_frames(video, frames_per_state=3)
    with one_torch_thread():
        captions, groundings = pack_captioner.caption_and_ground([f.image for f in clip])
    assert len(captions) == 3 and not any(g.grounded for g in groundings)
    assert clip_verdict(groundings)["verdict"] == "outside"


def test_a_captioner_without_reference_gets_an_uncalibrated_caption_likelihood(tmp_path):
    with one_torch_thread():
        captioner = HFCaptioner.from_pretrained(make_tiny_blip(tmp_path / "blip"), device="cpu")
        images = [np.full((32, 32, 3), v, np.uint8) for v in (0, 128, 255)]
        captions, groundings = captioner.caption_and_ground(images)
    assert captions == captioner(images)
    assert all(g.kind == CAPTION_LOGPROB and g.grounded is None and g.score <= 0 for g in groundings)
    assert clip_verdict(groundings)["verdict"] == "uncalibrated"


class FlaggingCaptioner:
    """Captions every frame 'a ball falls down' and flags the frames whose index is in ``outside``."""

    def __init__(self, outside):
        self.outside = outside

    def caption_and_ground(self, images, progress=None, on_batch=None):
        return (
            ["a ball falls down"] * len(images),
            [
                Grounding(FEATURE_DISTANCE, 30.0 if i in self.outside else 3.0, 15.0, i not in self.outside)
                for i in range(len(images))
            ],
        )


def test_rollout_records_per_frame_scores_the_verdict_and_a_warning(parts, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: FlaggingCaptioner({0, 1, 2}))
    with one_torch_thread():
        result = run_rollout(
            parts["clip"],
            1,
            ModelChoice(**{k: parts[k] for k in ("captioner", "renderer", "predictor")}),
            output=tmp_path / "run",
        )
    record = json.loads((tmp_path / "run" / "rollout.json").read_text())
    assert record["grounding"]["verdict"] == "outside" and record["grounding"]["flagged"] == 3
    assert [o["grounding"]["grounded"] for o in record["observed"]] == [False] * 3
    assert record["observed"][0]["grounding"]["score"] == 30.0
    assert record["warnings"][0].startswith("the clip is outside the captioner's world: 3 of 3 frames")
    assert "[outside the captioner's world]" in rollout_module.summary(result)


def test_a_grounded_clip_gets_no_warning(parts, tmp_path, monkeypatch):
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: FlaggingCaptioner(set()))
    with one_torch_thread():
        result = run_rollout(
            parts["clip"],
            1,
            ModelChoice(**{k: parts[k] for k in ("captioner", "renderer", "predictor")}),
            output=tmp_path / "run",
        )
    assert result.record["grounding"]["verdict"] == "inside"
    assert not any("captioner's world" in w for w in result.record["warnings"])


def test_on_unknown_stop_refuses_the_clip_before_predicting(parts, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout_module, "load_captioner", lambda *a: FlaggingCaptioner({2}))
    out = tmp_path / "run"
    with one_torch_thread():
        code = main(
            [
                str(parts["clip"]),
                "--steps",
                "1",
                "--out",
                str(out),
                "--on-unknown",
                "stop",
                *[x for k in ("captioner", "renderer", "predictor") for x in (f"--{k}", parts[k])],
            ]
        )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: part of the clip is outside the captioner's world: 1 of 3 frames")
    assert err.count("\n") == 1 and not out.exists() and list(tmp_path.iterdir()) == []

"""Calibrate a captioner's grounding reference and measure how often frames are flagged.

    python -m pipeline.pack.grounding calibrate --captioner offline_pack/captioner --data DATA/train --episodes 300
    python -m pipeline.pack.grounding measure --captioner offline_pack/captioner --data DATA/heldout --episodes 300 \\
        --images photo1.png photo2.jpg ...

`calibrate` fits `encoders.grounding.FeatureReference` to the captioner's features of the training strips
and saves it in the captioner folder. `measure` prints, as JSON, the share of held-out synthetic strips
flagged (the target is at most 1%) and of strips of real-photo clips flagged (a pan and a zoom over each
image, written as MP4 and read back as a user's clip is; the target is all), with both candidate scores
(feature distance and the caption's mean token log-probability) so they can be compared.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from encoders.captioner import HFCaptioner
from encoders.frames import sample_frames
from encoders.grounding import FeatureReference
from encoders.world_dataset import read_states
from world_model.data.synthetic.simulation import STATE_FRAMES
from world_model.utils.flags import SettingsParser, add_verbose, settings_main


def strip_features(captioner: HFCaptioner, images: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) images -> (N, D) encoder features and (N,) caption mean log-probabilities."""
    reference, captioner.reference = captioner.reference, None
    try:
        logprobs = torch.tensor([g.score for g in captioner.caption_and_ground(images)[1]])
    finally:
        captioner.reference = reference
    feats = []
    for start in range(0, len(images), 64):
        inputs = captioner.image_processor(
            images=images[start : start + 64], input_data_format="channels_last", return_tensors="pt"
        )
        with torch.inference_mode():
            feats.append(captioner.features(inputs["pixel_values"].to(captioner.model.device, captioner.model.dtype)))
    return torch.cat(feats), logprobs


def pan_zoom_clip(
    image: np.ndarray, path: Path, zoom: bool, seconds: int = 6, fps: int = 12, size: tuple[int, int] = (240, 320)
) -> Path:
    """Write an MP4 that pans across (or zooms into) an (H, W, 3) uint8 photograph, `size` = (height, width)."""
    from world_model.utils.video import write_video

    height, width = image.shape[:2]
    aspect = size[1] / size[0]
    crop_h = min(height, round(width / aspect))
    frames = []
    for i in range(seconds * fps):
        t = i / (seconds * fps - 1)
        h = round(crop_h * (1 - 0.5 * t)) if zoom else round(crop_h * 0.7)
        w = round(h * aspect)
        top = (height - h) // 2
        left = (width - w) // 2 if zoom else round((width - w) * t)
        crop = Image.fromarray(image[top : top + h, left : left + w]).resize(
            (size[1], size[0]), Image.Resampling.BILINEAR
        )
        frames.append(np.asarray(crop))
    return write_video(frames, path, fps=fps)


def real_strips(paths: list[Path]) -> list[np.ndarray]:
    """State strips of a pan and a zoom clip over each photograph, read back as `pipeline.rollout` reads a clip."""
    strips = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, path in enumerate(paths):
            image = np.asarray(Image.open(path).convert("RGB"))
            for zoom in (False, True):
                clip = pan_zoom_clip(image, Path(tmp) / f"{n}-{zoom}.mp4", zoom)
                strips += [f.image for f in sample_frames(clip, frames_per_state=STATE_FRAMES)]
    return strips


def summarise(distances: torch.Tensor, logprobs: torch.Tensor, threshold: float) -> dict:
    return {
        "strips": len(distances),
        "flagged": int((distances > threshold).sum()),
        "flag_rate": round(float((distances > threshold).float().mean()), 4),
        "distance": {
            "min": round(float(distances.min()), 2),
            "median": round(float(distances.median()), 2),
            "max": round(float(distances.max()), 2),
        },
        "caption_logprob": {
            "min": round(float(logprobs.min()), 3),
            "median": round(float(logprobs.median()), 3),
            "max": round(float(logprobs.max()), 3),
        },
    }


@dataclass
class GroundingSettings:
    """The captioner whose grounding reference is fitted or measured, and the strips it is fitted or measured on."""

    captioner: Path = field(metadata={"help": "captioner folder"})
    data: Path = field(metadata={"help": "a split folder of synthetic_world episodes"})
    episodes: int = 300
    images: list[Path] = field(default_factory=list, metadata={"help": "photographs for real-footage clips (measure)"})


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        GroundingSettings,
        "pipeline.pack.grounding",
        __doc__.split("\n\n")[0],
        lambda settings, args, command: grounding_command(args.command, settings),
        argv,
        arguments=add_subcommand,
    )


def add_subcommand(parser: SettingsParser) -> None:
    """The command's arguments beside its settings: the subcommand (calibrate or measure) and --verbose."""
    parser.add_argument("command", choices=("calibrate", "measure"))
    add_verbose(parser)


def grounding_command(command: str, settings: GroundingSettings) -> int:
    """`calibrate` or `measure` (see the module docstring); 2 when `measure` finds no reference."""
    captioner = HFCaptioner.from_pretrained(settings.captioner, device="cpu", batch_size=64)
    states = read_states(settings.data, settings.episodes, progress=False)
    features, logprobs = strip_features(captioner, list(states.images))
    if command == "calibrate":
        reference = FeatureReference.fit(features)
        reference.save(
            settings.captioner, note=f"fit on {len(features)} strips of {settings.data} ({settings.episodes} episodes)"
        )
        captioner.reference = reference
        print(
            json.dumps(
                {
                    "threshold": round(reference.threshold, 3),
                    "train": summarise(reference.distance(features), logprobs, reference.threshold),
                },
                indent=2,
            )
        )
        return 0
    reference = captioner.reference
    if reference is None:
        print(f"error: {settings.captioner} has no grounding reference; run `calibrate` first", file=sys.stderr)
        return 2
    result = {
        "threshold": round(reference.threshold, 3),
        "heldout": summarise(reference.distance(features), logprobs, reference.threshold),
    }
    if settings.images:
        real_features, real_logprobs = strip_features(captioner, real_strips(settings.images))
        result["real"] = summarise(reference.distance(real_features), real_logprobs, reference.threshold)
        cut = float(torch.quantile(logprobs, 0.01))  # the log-probability threshold that flags 1% of held-out strips
        result["real"]["flag_rate_by_caption_logprob_at_1pct_heldout"] = round(
            float((real_logprobs < cut).float().mean()), 4
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Grounding: is a frame something the captioner was trained on?

A captioner trained on a small world (the offline pack's synthetic ball, box and elevator) captions
*any* image with that world's sentences, confidently: its caption likelihood does not tell a street
from a bouncing ball. What does tell them apart is where the image lands in the captioner's own
feature space. ``FeatureReference`` keeps the mean and the (shrunk) inverse covariance of the vision
encoder's mean-pooled features over the training strips; a frame's score is its Mahalanobis distance
to them, and a frame further than ``threshold`` (set from the training strips' own distances) is
*ungrounded*: its caption describes the pack's world, not the frame. The README gives the measured
flag rates (held-out synthetic strips, real photographs turned into clips).

A captioner without a reference (the hub's BLIP) gets the mean log-probability of its greedy caption
tokens as its score instead: uncalibrated, so ``grounded`` is None and no verdict is drawn from it.

``python -m pipeline.pack.grounding`` calibrates a reference and measures the flag rates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from world_model.utils.files import replacing_file
from world_model.utils.hub import ModelLoadError

REFERENCE_FILE = "grounding.safetensors"
FEATURE_DISTANCE = "feature_distance"  # lower is closer to the training strips; calibrated
CAPTION_LOGPROB = "caption_logprob"  # mean log-probability of the caption tokens; higher is surer; uncalibrated


@dataclass(frozen=True)
class Grounding:
    """One frame's grounding: ``score`` of ``kind``; ``grounded`` is None when there is no calibrated threshold."""

    kind: str
    score: float
    threshold: float | None = None
    grounded: bool | None = None

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class FeatureReference:
    """Where the training strips lie in the captioner's feature space."""

    mean: torch.Tensor  # (D,)
    precision: torch.Tensor  # (D, D) inverse of the shrunk covariance
    threshold: float  # a distance above this is outside the training world

    def distance(self, features: torch.Tensor) -> torch.Tensor:
        """(B, D) features -> (B,) Mahalanobis distances."""
        centred = features.double() - self.mean.double()
        return torch.einsum("bd,de,be->b", centred, self.precision.double(), centred).clamp_min(0).sqrt()

    def ground(self, features: torch.Tensor) -> list[Grounding]:
        """(B, D) features -> one calibrated ``Grounding`` per row."""
        return [
            Grounding(FEATURE_DISTANCE, d, self.threshold, d <= self.threshold)
            for d in self.distance(features).tolist()
        ]

    @classmethod
    def fit(cls, features: torch.Tensor, shrinkage: float = 0.1, margin: float = 1.25) -> FeatureReference:
        """From (N, D) training features: threshold = ``margin`` x the largest training distance."""
        x = features.double()
        mean = x.mean(0)
        cov = torch.cov((x - mean).T)
        cov = (1 - shrinkage) * cov + shrinkage * cov.diagonal().mean() * torch.eye(len(mean), dtype=cov.dtype)
        reference = cls(mean, torch.linalg.inv(cov), float("inf"))
        reference.threshold = margin * float(reference.distance(x).max())
        return reference

    def save(self, folder: str | Path, note: str = "") -> None:
        """Write the reference into the captioner `folder`, staged and renamed (an old reference stays whole on a
        failure)."""
        tensors = {
            "mean": self.mean.float(),
            "precision": self.precision.float().contiguous(),
            "threshold": torch.tensor([self.threshold]),
        }
        metadata = {"features": "vision encoder last hidden state, mean over tokens", "note": note}
        with replacing_file(Path(folder) / REFERENCE_FILE) as staged:
            save_file(tensors, staged, metadata=metadata)

    @classmethod
    def load(cls, folder: str | Path) -> FeatureReference | None:
        """The reference saved in a captioner folder, or None when it has none (or is a hub id)."""
        path = Path(folder) / REFERENCE_FILE
        if not path.is_file():
            return None
        try:
            tensors = load_file(str(path))
            return cls(tensors["mean"], tensors["precision"], float(tensors["threshold"][0]))
        except (SafetensorError, OSError, KeyError, IndexError) as err:
            raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({err}); copy it again") from err


def clip_verdict(groundings: list[Grounding | None]) -> dict:
    """The clip's verdict from its frames' groundings.

    ``outside`` when at least half the frames are ungrounded, ``partly outside`` when some are,
    ``inside`` when none are; ``uncalibrated`` when the captioner has no threshold (hub models) and
    ``unscored`` when it gives no score at all.
    """
    flags = [g.grounded for g in groundings if g is not None]
    flagged = sum(flag is False for flag in flags)
    if not flags:
        verdict = "unscored"
    elif any(flag is None for flag in flags):
        verdict = "uncalibrated"
    elif flagged * 2 >= len(flags):
        verdict = "outside"
    else:
        verdict = "partly outside" if flagged else "inside"
    return {
        "verdict": verdict,
        "frames": len(groundings),
        "flagged": flagged,
        "kind": groundings[0].kind if flags else None,
    }

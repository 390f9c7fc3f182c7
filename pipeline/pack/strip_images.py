"""State strips as images: the captioner's view of one (uint8 strips to [0, 1] floats and to the ViT's normalised
pixels, exactly what its image processor computes), its training-time augmentation, and the renderer trainer's grid of
real strips beside their renderings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from transformers import ViTImageProcessor

from world_model.data.synthetic.simulation import STRIP_SIZE
from world_model.utils.files import replacing_file

if TYPE_CHECKING:
    from renderers.pixel_pipeline import PixelTextToImagePipeline


def strip_image_processor() -> ViTImageProcessor:
    """Resizes any image to ``STRIP_SIZE`` and maps [0, 255] to [-1, 1] (what ``to_pixels`` does to strips)."""
    return ViTImageProcessor(
        size={"height": STRIP_SIZE[0], "width": STRIP_SIZE[1]}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, H, W) float in [0, 1]."""
    return images.permute(0, 3, 1, 2).float() / 255


def to_pixels(unit: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) in [0, 1] -> the model's pixel values in [-1, 1], as ``strip_image_processor`` gives them."""
    return unit * 2 - 1


def augment(unit: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Randomly perturb (B, 3, H, W) images in [0, 1] the way a diffusion renderer's strips differ from
    the simulator's: a shift of up to one pixel, brightness/contrast/per-channel colour jitter, a light
    Gaussian blur and pixel noise, each drawn per image. Returns a new tensor of the same shape."""
    batch, channels, height, width = unit.shape

    def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
        return low + (high - low) * torch.rand(batch, *shape, generator=generator)

    padded = F.pad(unit, (1, 1, 1, 1), mode="replicate")
    dy, dx = torch.randint(0, 3, (2, batch), generator=generator).tolist()
    out = torch.stack([padded[i, :, dy[i] : dy[i] + height, dx[i] : dx[i] + width] for i in range(batch)])
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = (out - mean) * uniform(0.9, 1.1, 1, 1, 1) + mean * uniform(0.9, 1.1, 1, 1, 1)
    out = out + uniform(-0.04, 0.04, channels, 1, 1)
    sigma = uniform(0.05, 0.9)  # (B,) Gaussian blur widths in pixels; 0.05 leaves the image as is
    offsets = torch.arange(-1, 2, dtype=torch.float32)
    taps = torch.exp(-(offsets[None] ** 2) / (2 * sigma[:, None] ** 2))
    taps = taps / taps.sum(dim=1, keepdim=True)  # (B, 3) separable kernel
    kernels = (taps[:, :, None] * taps[:, None, :]).repeat_interleave(channels, dim=0)[:, None]  # (B*3, 1, 3, 3)
    out = F.conv2d(
        F.pad(out.reshape(1, batch * channels, height, width), (1, 1, 1, 1), mode="replicate"),
        kernels,
        groups=batch * channels,
    ).reshape(batch, channels, height, width)
    out = out + uniform(0.0, 0.05, 1, 1, 1) * torch.randn(out.shape, generator=generator)
    return out.clamp(0, 1)


def sample_grid(
    pipe: PixelTextToImagePipeline,
    real: np.ndarray,
    sentences: list[str],
    path: Path,
    seed: int = 0,
    previous: list[np.ndarray] | None = None,
) -> None:
    """Write a PNG: one row per sentence, its real strip (left) beside a rendering (right; continuing ``previous``,
    the strips before, for a pipeline that reads them), under its text."""
    generator = torch.Generator().manual_seed(seed)
    rendered = pipe(sentences, generator=generator, output_type="np", previous=previous).images
    rendered = (rendered * 255).round().astype(np.uint8)
    height, width = real.shape[1:3]
    band, gap = 12, 4
    grid = Image.new("RGB", (2 * width + gap, len(sentences) * (height + band)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (strip, image, text) in enumerate(zip(real, rendered, sentences)):
        top = i * (height + band)
        draw.text((2, top), text, fill="black")
        grid.paste(Image.fromarray(strip), (0, top + band))
        grid.paste(Image.fromarray(image), (width + gap, top + band))
    with replacing_file(path) as staged:
        grid.resize((grid.width * 2, grid.height * 2), Image.Resampling.NEAREST).save(staged)

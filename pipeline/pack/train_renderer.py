"""Train the offline pack's renderer (``renderers.pixel_pipeline``) on the synthetic world's state strips.

    python -m pipeline.pack.train_renderer --data DATA --out RUN [--max-minutes 55] [--threads 2] [--seed 0]

The UNet and the text encoder learn together to denoise the state strips of ``DATA/train`` (3 frames of
one second side by side, 48 x 144) given their sentences. The loss is the squared error of the predicted
clean strip weighted by min(SNR, ``--snr-cap``) + 1 (the velocity loss, capped at low noise), and by
1 + ``--motion-weight`` on the pixels that change within the second (what tells a door opening from
one closing, or a ball falling from one bouncing, is a small part of the strip); the
sentence is replaced by the empty prompt with probability ``--text-dropout`` (so sampling can use
classifier-free guidance); AdamW warms up, then decays on a cosine over the time (or step) budget; an
exponential moving average of the weights is what gets sampled and saved. Convolutions run in
bfloat16 autocast where the CPU supports it (about twice as fast), attention then with the math kernel
(the fused CPU kernel is several times slower in bfloat16).

Every ``--sample-minutes`` a grid of a few fixed held-out strips beside their renderings is written to
``OUT/samples/``; every ``--save-minutes`` and at the end the pipeline is saved in float16 to
``OUT/pipeline`` (written beside it and renamed into place, so an interrupted run never leaves a
half-written model), with ``OUT/train_log.json`` (settings, loss curve, throughput) and the resume state
``OUT/last/`` (``pipeline.pack.renderer_state``). Ctrl-C or SIGTERM stops training after the current step and
saves; ``--resume`` goes on from ``OUT/last/`` with the same settings (the budgets ``--max-minutes``,
``--max-steps``, ``--sample-minutes`` and ``--save-minutes`` may change: the learning-rate schedule follows the
new budget from where the run is). ``--frame-size`` sets the strips' resolution: frames of that many pixels a
side (48 by default; the clips' own 96 with ``--frame-size 96 --patch-size 4`` costs about what 48 does).
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import copy
import sys
import time
from argparse import RawDescriptionHelpFormatter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from encoders.world_dataset import read_states
from pipeline.pack.renderer_state import (
    STATE_DIR,
    EMAWeights,
    RendererState,
    StopRequest,
    has_state,
    load_state,
    save_state,
)
from pipeline.pack.strip_images import sample_grid
from renderers.pixel_pipeline import PixelPipelineConfig, PixelTextToImagePipeline, build_pixel_pipeline
from renderers.pixel_scheduler import check_solver
from world_model.data.synthetic.simulation import STATE_FRAMES
from world_model.training.schedule import warmup_cosine
from world_model.utils.cli import check_output, check_positive, check_range
from world_model.utils.files import atomic_dir, write_json_atomic
from world_model.utils.flags import settings_main

PIPELINE_DIR = "pipeline"
LOG_NAME = "train_log.json"
SAMPLE_COUNT = 8


@dataclass
class TrainConfig:
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 200
    final_lr_fraction: float = 0.1
    text_dropout: float = 0.1
    previous_dropout: float = 0.1  # with --previous-strip: how often a strip is trained without the one before it
    snr_cap: float = 5.0
    motion_weight: float = 4.0  # extra loss weight on pixels that change between a strip's frames (0: none)
    ema_max_decay: float = 0.999
    max_minutes: float = 55.0
    max_steps: int | None = None
    sample_minutes: float = 5.0
    save_minutes: float = 10.0
    log_every: int = 25
    seed: int = 0
    threads: int = 1
    bf16: bool = True

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_steps", "log_every", "threads"):
            check_range(f"--{name.replace('_', '-')}", getattr(self, name), 1)
        for name in ("lr", "max_minutes", "sample_minutes", "save_minutes", "snr_cap"):
            check_positive(f"--{name.replace('_', '-')}", getattr(self, name))
        for name in ("weight_decay", "warmup_steps", "motion_weight", "seed"):
            check_range(f"--{name.replace('_', '-')}", getattr(self, name), 0)
        check_range("--final-lr-fraction", self.final_lr_fraction, 0, 1)
        check_range("--text-dropout", self.text_dropout, 0, 1)
        check_range("--previous-dropout", self.previous_dropout, 0, 1)
        check_range("--ema-max-decay", self.ema_max_decay, 0, 1)


def to_model_range(images: np.ndarray) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, H, W) float in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def motion_mask(images: torch.Tensor, frames: int = STATE_FRAMES, threshold: float = 0.1) -> torch.Tensor:
    """(B, 3, H, W) strips of ``frames`` frames side by side -> (B, 1, H, W) float mask, 1 where any channel of
    the pixel differs by more than ``threshold`` between two of the frames (the same pixel lit in every frame),
    grown by one pixel: where a moving object is, was or will be within the second."""
    b, c, h, w = images.shape
    if w % frames:
        raise ValueError(f"strip width {w} is not a multiple of {frames} frames")
    per_frame = images.view(b, c, h, frames, w // frames)  # (B, 3, H, frames, w)
    spread = (per_frame.amax(dim=3) - per_frame.amin(dim=3)).amax(dim=1, keepdim=True)  # (B, 1, H, w)
    moving = F.max_pool2d((spread > threshold).float(), kernel_size=3, stride=1, padding=1)
    return moving.repeat(1, 1, 1, frames)


def diffusion_loss(
    pipe: PixelTextToImagePipeline,
    images: torch.Tensor,
    prompts: list[str],
    generator: torch.Generator,
    snr_cap: float = 5.0,
    motion_weight: float = 0.0,
    previous: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted squared error of the clean image the model predicts from ``images`` (B, 3, H, W) in [-1, 1]
    noised at uniformly drawn timesteps: x_t = a x + s e with a^2 = alphas_cumprod[t], s^2 = 1 - a^2,
    weight min(a^2 / s^2, snr_cap) + 1. Uncapped, that is the squared error of the velocity v = a e - s x.
    ``motion_weight`` > 0 multiplies the error of the pixels of ``motion_mask`` by 1 + motion_weight (what
    tells one second's motion from its reverse is a small part of the strip). ``previous`` (B, 3, H, W): the strips
    they continue, for a pipeline with ``previous_strip`` (zeros: none)."""
    alphas_cumprod = pipe.scheduler.alphas_cumprod
    t = torch.randint(0, len(alphas_cumprod), (len(images),), generator=generator)
    noise = torch.randn(images.shape, generator=generator)
    a = alphas_cumprod[t].sqrt().view(-1, 1, 1, 1)
    s = (1 - alphas_cumprod[t]).sqrt().view(-1, 1, 1, 1)
    noisy = a * images + s * noise
    output = pipe.predict(
        noisy.contiguous(memory_format=torch.channels_last), t, pipe.encode_prompt(prompts), previous
    ).float()
    prediction_type = pipe.scheduler.config.prediction_type
    if prediction_type == "sample":
        clean = output
    elif prediction_type == "v_prediction":
        clean = a * noisy - s * output
    else:
        raise ValueError(f"training supports prediction_type 'sample' or 'v_prediction', not {prediction_type!r}")
    weight = (a / s).pow(2).clamp(max=snr_cap) + 1
    if motion_weight:
        weight = weight * (1 + motion_weight * motion_mask(images))
    return (weight * (clean - images).pow(2)).mean()


def save_pipeline(pipe: PixelTextToImagePipeline, folder: Path) -> None:
    """Save a float16 copy of ``pipe`` to ``folder``, written beside it and renamed into place."""
    half = PixelTextToImagePipeline(
        unet=copy.deepcopy(pipe.unet).half().to(memory_format=torch.contiguous_format),
        scheduler=pipe.scheduler,
        text_encoder=copy.deepcopy(pipe.text_encoder).half(),
        tokenizer=pipe.tokenizer,
        **{
            k: pipe.config[k]
            for k in (
                "default_num_inference_steps",
                "default_guidance_scale",
                "patch_size",
                "strip_frames",
                "previous_strip",
            )
        },
    )
    with atomic_dir(folder) as tmp:
        half.save_pretrained(tmp)


def fixed_samples(data: Path, size: tuple[int, int]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """``SAMPLE_COUNT`` strips of ``size`` spread over the first held-out episodes (all scene types), their
    sentences, and the strips of the seconds before them (blank, 0 in the model's range, for an episode's first)."""
    states = read_states(data / "heldout", limit=SAMPLE_COUNT * 2, size=size, progress=False)
    rows = np.linspace(0, len(states) - 1, SAMPLE_COUNT).round().astype(int)
    before = np.stack(
        [states.images[i - 1] if states.second[i] > 0 else np.full_like(states.images[i], 128) for i in rows]
    )
    return states.images[rows], [states.sentences[i] for i in rows], before


def train(
    data: Path,
    out: Path,
    config: TrainConfig,
    model_config: PixelPipelineConfig,
    limit: int | None = None,
    resume: bool = False,
) -> dict:
    """Train on ``data/train`` (the first ``limit`` episodes), write ``out/pipeline``, ``out/last`` and
    ``out/train_log.json``; with ``resume``, go on from ``out/last``. Returns the log."""
    torch.set_num_threads(config.threads)
    bf16 = config.bf16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    states = read_states(data / "train", limit=limit, size=model_config.sample_size)
    sample_real, sample_sentences, sample_before = fixed_samples(data, model_config.sample_size)
    pipe = build_pixel_pipeline(states.sentences + sample_sentences, model_config, seed=config.seed)
    pipe.set_progress_bar_config(disable=True)
    pipe.unet.to(memory_format=torch.channels_last)
    parameters = [*pipe.unet.parameters(), *pipe.text_encoder.parameters()]
    run = RendererRun(
        pipe,
        parameters,
        torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay),
        EMAWeights(parameters, config.ema_max_decay),
        torch.Generator().manual_seed(config.seed),
        np.random.default_rng(config.seed),
        states.images,
        np.array(states.sentences, dtype=object),
        np.where(states.second > 0, np.arange(len(states)) - 1, -1),
        bf16,
    )
    log = {
        "command": " ".join(sys.argv),
        "train": asdict(config),
        "model": asdict(model_config),
        "strips": len(states),
        "bf16": bf16,
        "parameters": {
            "unet": sum(p.numel() for p in pipe.unet.parameters()),
            "text_encoder": sum(p.numel() for p in pipe.text_encoder.parameters()),
        },
        "loss": [],
    }
    start = RendererState(0, 0.0, None, log)
    if resume:
        resumed = load_state(out / STATE_DIR, run, asdict(config), asdict(model_config))
        if resumed.log["strips"] != len(states):
            raise ValueError(f"--resume: {len(states)} training strips, the run in {out} had {resumed.log['strips']}")
        log = {**resumed.log, "command": log["command"], "train": log["train"]}
        start = RendererState(resumed.step, resumed.minutes, resumed.running_loss, log)
        print(f"resuming {out} after {resumed.step} steps ({resumed.minutes:.1f} min)", file=sys.stderr)

    def checkpoint(step: int, minutes: float, running: float | None) -> None:
        with run.ema:
            save_pipeline(pipe, out / PIPELINE_DIR)
        log.update(
            steps=step,
            minutes=round(minutes, 2),
            samples_seen=step * config.batch_size,
            samples_per_second=round(step * config.batch_size / max(minutes * 60, 1e-9), 2),
        )
        save_state(out / STATE_DIR, run, RendererState(step, minutes, running, log))
        write_json_atomic(out / LOG_NAME, log)

    def samples(step: int) -> None:
        with run.ema, torch.no_grad():
            before = list(sample_before) if pipe.config.previous_strip else None
            sample_grid(pipe, sample_real, sample_sentences, out / "samples" / f"step_{step:06d}.png", previous=before)

    step, running, minutes = run_steps(run, config, checkpoint, samples, start)
    samples(step)
    checkpoint(step, minutes, running)
    print(f"saved {out / PIPELINE_DIR} after {step} steps, {minutes:.1f} min, smoothed loss {running}")
    return log


@dataclass
class RendererRun:
    """What the renderer's training steps share."""

    pipe: PixelTextToImagePipeline
    parameters: list[torch.nn.Parameter]  # the UNet's and the text encoder's
    optimizer: torch.optim.Optimizer
    ema: EMAWeights
    generator: torch.Generator  # noise and timesteps
    rng: np.random.Generator  # batches and text dropout
    images: np.ndarray  # (N, H, W, 3) uint8 training strips
    sentences: np.ndarray  # (N,) their sentences
    previous: np.ndarray  # (N,) the row of the strip of the second before each one, -1 for an episode's first
    bf16: bool

    def step(self, config: TrainConfig, lr: float) -> float:
        """One AdamW step on a random batch (text dropped with probability `text_dropout`); returns its loss."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        rows = self.rng.integers(0, len(self.images), config.batch_size)
        prompts = ["" if self.rng.random() < config.text_dropout else s for s in self.sentences[rows]]
        previous = None
        if self.pipe.config.previous_strip:
            before = np.where(self.rng.random(len(rows)) < config.previous_dropout, -1, self.previous[rows])
            previous = to_model_range(self.images[np.maximum(before, 0)]) * torch.from_numpy(before >= 0).view(
                -1, 1, 1, 1
            )
        kernels = [SDPBackend.MATH] if self.bf16 else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16), sdpa_kernel(kernels):
            loss = diffusion_loss(
                self.pipe,
                to_model_range(self.images[rows]),
                prompts,
                self.generator,
                config.snr_cap,
                config.motion_weight,
                previous,
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        self.ema.update()
        return loss.item()


def run_steps(
    run: RendererRun, config: TrainConfig, checkpoint, samples, start_at: RendererState
) -> tuple[int, float, float]:
    """Train until the time budget or `max_steps` (or a stop request), logging the smoothed loss, drawing samples
    and checkpointing on their schedules, from ``start_at`` (its steps and minutes done, its log). Returns (steps,
    smoothed loss, minutes)."""
    stop = StopRequest()
    last_sample = last_save = time.monotonic()
    start = last_sample - 60 * start_at.minutes
    step, running, log = start_at.step, start_at.running_loss, start_at.log
    progress_bar = tqdm(total=config.max_steps, initial=step, desc="training renderer", unit="step")
    try:
        while not stop.requested:
            progress = (time.monotonic() - start) / (config.max_minutes * 60)
            if config.max_steps is not None:
                progress = max(progress, step / config.max_steps)
            if progress >= 1:
                break
            lr = warmup_cosine(config.lr, step, progress, config.warmup_steps, config.final_lr_fraction)
            loss = run.step(config, lr)
            step += 1
            running = loss if running is None else 0.98 * running + 0.02 * loss
            progress_bar.update()
            if step % config.log_every == 0:
                minutes = (time.monotonic() - start) / 60
                log["loss"].append({"step": step, "minutes": round(minutes, 2), "loss": round(running, 5), "lr": lr})
                progress_bar.set_postfix(loss=f"{running:.4f}", min=f"{minutes:.1f}")
            now = time.monotonic()
            if now - last_sample >= config.sample_minutes * 60:
                samples(step)
                last_sample = time.monotonic()
            if now - last_save >= config.save_minutes * 60:
                checkpoint(step, (now - start) / 60, running)
                last_save = time.monotonic()
    finally:
        progress_bar.close()
        stop.close()
    return step, running, (time.monotonic() - start) / 60


@dataclass
class RendererFiles:
    """Where a training run reads and writes, and how many episodes it uses; the optimiser is `TrainConfig`, the
    model `PixelPipelineConfig`."""

    data: Path = field(metadata={"help": "folder with train/ and heldout/ episodes"})
    out: Path = field(metadata={"help": "run folder: pipeline/, samples/, train_log.json"})
    limit: int | None = field(default=None, metadata={"help": "use only the first N training episodes"})
    resume: bool = field(default=False, metadata={"help": f"go on from OUT/{STATE_DIR} (same settings but budgets)"})


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        (RendererFiles, TrainConfig, PixelPipelineConfig),  # one flag per setting, e.g. --batch-size
        "pipeline.pack.train_renderer",
        __doc__,
        lambda files, config, model_config, command: train_command(files, config, model_config),
        argv,
        formatter_class=RawDescriptionHelpFormatter,
    )


def train_command(files: RendererFiles, config: TrainConfig, model_config: PixelPipelineConfig) -> None:
    """The command's work: check the settings, then train."""
    if model_config.prediction_type not in ("sample", "v_prediction"):
        raise ValueError(f"--prediction-type must be 'sample' or 'v_prediction', got {model_config.prediction_type!r}")
    try:
        check_solver(model_config.solver)
    except ValueError as err:
        raise ValueError(f"--{err}") from None
    check_output(files.out / LOG_NAME, "--out", {"data folder": files.data}, overwrite=True)  # before the data is read
    if files.resume and not has_state(files.out):
        raise ValueError(f"--resume: {files.out / STATE_DIR} holds no resume state (nothing to go on from)")
    train(files.data, files.out, config, model_config, limit=files.limit, resume=files.resume)


if __name__ == "__main__":
    sys.exit(main())

"""Offline test fixtures: synthetic video clips, single-threaded torch and the test-only tiny models.

The BLIP, Stable Diffusion and 4-tensor builders are part of the package (``pipeline.tiny_pack``, which
``pipeline.bench`` times); the tests import them from there.  Every model uses the real architecture class with a tiny
config and a tokenizer built from vocabulary files written on the spot, is saved with
``save_pretrained`` and is meant to be loaded back through the production ``from_pretrained``
code.  Nothing is downloaded; each builds in about a second on CPU.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cv2
import imageio_ffmpeg
import numpy as np
import torch

from pipeline.tiny_pack import INIT_RANGE, byte_level_vocab, write_bpe_files

SQUARE_SIZE = 16
SQUARE_TOP = 8
SQUARE_RGB = (255, 0, 0)
BACKGROUND = 40


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch single-threaded: tiny models gain nothing from threads, and on a shared CPU the
    extra threads spin-wait for busy cores (10x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def make_tiny_world_predictor(
    folder: str | Path, kind: str, known: list[str], seed: int = 0, n_tokens: int = 12, n_states: int = 6
) -> Path:
    """Save a random tiny predictor of ``kind`` ("four_tensor" or "baseline") over the words of ``known``, with
    ``known`` as its known sentences (the closed set the world's forecasts read)."""
    from world_model.models.decoding import write_known_sentences
    from world_model.models.registry import build_model, model_vocab_size
    from world_model.text.vocab import Vocabulary

    vocab = Vocabulary.build(known)
    torch.manual_seed(seed)
    section = {
        "type": kind,
        "d_x": 4,
        "d_t": 2,
        "n_heads": 1,
        "n_layers": 1,
        "n_tokens": n_tokens,
        "n_states": n_states,
    }
    build_model(section, model_vocab_size(kind, vocab)).save_pretrained(folder, vocab=vocab)
    write_known_sentences(folder, known)
    return Path(folder)


def square_left(index: int, frame_count: int, width: int) -> int:
    """Left edge (x, pixels) of the square in stored frame ``index`` of a clip from ``write_test_clip``."""
    return round(index * (width - SQUARE_SIZE) / max(frame_count - 1, 1))


def write_test_clip(
    path: str | Path,
    seconds: float = 3.0,
    fps: float = 10,
    size: tuple[int, int] = (160, 96),
    rotation: int | None = None,
    faststart: bool = False,
) -> Path:
    """Write an MPEG-4 clip of a red square sliding left to right over a dark grey background.

    ``size`` is (width, height) of the stored frames.  Frame ``i`` of ``n = round(seconds * fps)``
    shows a ``SQUARE_SIZE`` square of colour ``SQUARE_RGB`` with its top at ``SQUARE_TOP`` and its
    left edge at ``square_left(i, n, width)``, so the frame index can be read back from the pixels.

    ``rotation`` (degrees clockwise, 90/180/270) stores display-rotation metadata, as phones do:
    a player shows the stored frames turned clockwise by that angle.  ``faststart`` moves the MP4
    index (moov atom) to the front, as streaming encoders do, so a truncated copy still opens.
    """
    path = Path(path)
    width, height = size
    count = max(1, round(seconds * fps))
    raw = path.with_name(path.stem + ".raw.mp4") if rotation or faststart else path
    writer = cv2.VideoWriter(str(raw), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {raw}")
    bgr = SQUARE_RGB[::-1]
    for i in range(count):
        frame = np.full((height, width, 3), BACKGROUND, np.uint8)
        left = square_left(i, count, width)
        frame[SQUARE_TOP : SQUARE_TOP + SQUARE_SIZE, left : left + SQUARE_SIZE] = bgr
        writer.write(frame)
    writer.release()
    if raw != path:
        input_args = ["-display_rotation:v:0", str(-rotation)] if rotation else []
        output_args = ["-movflags", "+faststart"] if faststart else []
        run_ffmpeg(*input_args, "-i", str(raw), "-c", "copy", *output_args, str(path))
        raw.unlink()
    return path


def write_timed_clip(path: str | Path, timestamps: list[float], size: tuple[int, int] = (160, 96)) -> Path:
    """Write a clip whose frame ``i`` is shown at ``timestamps[i]`` seconds (multiples of 0.2), as phones
    write variable-frame-rate MP4s: an H.264 ``.mp4`` keeps the timestamps; an MJPEG ``.avi`` at 10 fps
    fills the gaps with empty repeat-frame index entries. Frame ``i`` draws the square of
    ``write_test_clip`` at ``square_left(i, len(timestamps), width)``."""
    path = Path(path)
    width, height = size
    expression = "0"
    for i in reversed(range(len(timestamps))):
        expression = f"if(eq(N\\,{i})\\,{timestamps[i]}\\,{expression})"
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(len(timestamps)):
            frame = np.full((height, width, 3), BACKGROUND, np.uint8)
            left = square_left(i, len(timestamps), width)
            frame[SQUARE_TOP : SQUARE_TOP + SQUARE_SIZE, left : left + SQUARE_SIZE] = SQUARE_RGB[::-1]
            cv2.imwrite(f"{tmp}/{i:03d}.png", frame)
        codec = (
            ["-enc_time_base", "1/10", "-c:v", "mjpeg"]
            if path.suffix == ".avi"
            else ["-bf", "0", "-c:v", "libx264", "-pix_fmt", "yuv420p"]
        )
        run_ffmpeg(
            "-framerate",
            "25",
            "-i",
            f"{tmp}/%03d.png",
            "-vf",
            f"setpts=({expression})/TB",
            "-fps_mode",
            "passthrough",
            *codec,
            str(path),
        )
    return path


def write_audio_only(path: str | Path, seconds: float = 1.0) -> Path:
    """Write an AAC-in-MP4 file with a sine tone and no video stream."""
    run_ffmpeg("-f", "lavfi", "-i", f"sine=duration={seconds}", "-c:a", "aac", str(path))
    return Path(path)


def run_ffmpeg(*args: str) -> None:
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-hide_banner", "-loglevel", "error", *args]
    subprocess.run(cmd, check=True, capture_output=True)


def make_tiny_vit_gpt2(folder: str | Path) -> Path:
    """Save a random tiny ViT + GPT-2 ``VisionEncoderDecoderModel`` (32x32 input) with its
    ``ViTImageProcessor`` and a byte-level BPE ``GPT2Tokenizer``."""
    from transformers import (
        GPT2Config,
        GPT2Tokenizer,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    folder = Path(folder)
    vocab, merges = byte_level_vocab()
    vocab["<|endoftext|>"] = len(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = GPT2Tokenizer(*write_bpe_files(Path(tmp), vocab, merges))
    end = tokenizer.eos_token_id
    encoder = ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        image_size=32,
        patch_size=8,
        initializer_range=INIT_RANGE,
    )
    decoder = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=end,
        eos_token_id=end,
        initializer_range=INIT_RANGE,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = config.pad_token_id = config.eos_token_id = end
    torch.manual_seed(0)
    model = VisionEncoderDecoderModel(config)
    generation = model.generation_config
    generation.decoder_start_token_id = generation.pad_token_id = generation.eos_token_id = end
    generation.min_new_tokens = 3  # a random decoder may emit end-of-text first; keep captions non-empty
    model.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


PIXEL_PIPELINE_CODE = '''\
import zlib

import torch
from diffusers import DiffusionPipeline, ImagePipelineOutput


class TinyPixelPipeline(DiffusionPipeline):
    """Pixel-space DDPM sampler conditioned on a class label hashed from the prompt."""

    def __init__(self, unet, scheduler):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)

    @torch.no_grad()
    def __call__(self, prompt, generator=None, num_inference_steps=2, output_type="np"):
        size = self.unet.config.sample_size
        label = torch.tensor([zlib.crc32(prompt.encode()) % self.unet.config.num_class_embeds], device=self.device)
        image = torch.randn((1, 3, size, size), generator=generator).to(self.device, self.unet.dtype)
        self.scheduler.set_timesteps(num_inference_steps)
        for t in self.progress_bar(self.scheduler.timesteps):
            noise = self.unet(image, t, class_labels=label).sample
            image = self.scheduler.step(noise, t, image, generator=generator).prev_sample
        image = (image / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().cpu().numpy()
        return ImagePipelineOutput(images=image)
'''


def tiny_pixel_pipeline_class() -> type:
    """``TinyPixelPipeline``, a custom ``DiffusionPipeline`` subclass imported from ``PIXEL_PIPELINE_CODE``."""
    global _PIXEL_PIPELINE_CLASS
    if _PIXEL_PIPELINE_CLASS is None:
        file = Path(tempfile.mkdtemp()) / "tiny_pixel_pipeline.py"
        file.write_text(PIXEL_PIPELINE_CODE)
        spec = importlib.util.spec_from_file_location("tiny_pixel_pipeline", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _PIXEL_PIPELINE_CLASS = module.TinyPixelPipeline
    return _PIXEL_PIPELINE_CLASS


_PIXEL_PIPELINE_CLASS = None


def make_tiny_pixel_pipeline(folder: str | Path, ship_code: bool = True) -> Path:
    """Save a ``TinyPixelPipeline`` (16x16 RGB, 2 DDPM steps) with ``save_pretrained``.

    With ``ship_code`` the class's code goes in the folder as ``pipeline.py`` and ``model_index.json``
    points at it (``"_class_name": ["pipeline", "TinyPixelPipeline"]``), the layout diffusers loads
    with ``trust_remote_code=True``; without, the folder names a class diffusers does not know.
    """
    from diffusers import DDPMScheduler, UNet2DModel

    folder = Path(folder)
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D",) * 2,
        up_block_types=("UpBlock2D",) * 2,
        norm_num_groups=4,
        num_class_embeds=8,
    )
    tiny_pixel_pipeline_class()(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=100)).save_pretrained(folder)
    if ship_code:
        (folder / "pipeline.py").write_text(PIXEL_PIPELINE_CODE)
        index_file = folder / "model_index.json"
        index = json.loads(index_file.read_text())
        index["_class_name"] = ["pipeline", "TinyPixelPipeline"]
        index_file.write_text(json.dumps(index, indent=2))
    return folder


def make_tiny_sd_turbo(folder: str | Path, variant: str | None = None) -> Path:
    """Save a tiny ``StableDiffusionPipeline`` shaped like sd-turbo's: ``pipeline.tiny_pack.make_tiny_sd``'s
    models with sd-turbo's scheduler (``EulerDiscreteScheduler``, "trailing" timesteps).

    ``variant="fp16"`` saves only fp16 weight files (``*.fp16.safetensors``), as a cache filled the way the
    model card loads it holds them; otherwise only the default fp32 files.
    """
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    from pipeline.tiny_pack import make_tiny_sd

    folder = Path(folder)
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = StableDiffusionPipeline.from_pretrained(make_tiny_sd(Path(tmp) / "sd"))
    pipeline.scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1, timestep_spacing="trailing"
    )
    if variant == "fp16":
        pipeline.to(torch.float16)
    pipeline.save_pretrained(folder, variant=variant)
    return folder


def fill_hub_cache(cache: str | Path, repo_id: str, folder: str | Path, revision: str = "0" * 40) -> Path:
    """Lay ``folder``'s files out as the Hugging Face cache holds a download of ``repo_id``:
    ``models--org--name/refs/main`` naming ``revision`` and the files under ``snapshots/<revision>/``.
    Returns the snapshot folder."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


@contextmanager
def recording_hub() -> Iterator[list[str]]:
    """A stand-in hub endpoint on localhost that records each HTTP request line and answers 503.

    Yields (the request lines so far, the endpoint URL to put in ``huggingface_hub.constants.ENDPOINT``).
    """
    import http.server
    import threading

    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            requests.append(self.requestline)
            self.send_error(503)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield requests, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

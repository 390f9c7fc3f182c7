"""What the hub preset's models cost, before downloading them: `python -m pipeline.bench --real-size`.

Builds the default hub models' architectures at full size with random weights, from the configs kept in
`configs/real_size/` (nothing is downloaded), and times one frame of each on this machine: captioning with
BLIP (`Salesforce/blip-image-captioning-base`: a 384x384 image, greedy, `max_new_tokens` tokens forced, the
hub preset's cap) and rendering with sd-turbo (`stabilityai/sd-turbo`: text encoder, the UNet for its
inference steps without guidance, the VAE decoder, 512x512), as `DiffusersRenderer` runs them. fp32 on CPU,
fp16 on CUDA, as the loaders choose. Random weights cost the same arithmetic as trained ones. The captioner
stays loaded while the renderer is built and timed, as a rollout holds both, so the renderer's peak memory
is the rollout's combined peak. What a first run downloads follows from the parameter counts: BLIP's
checkpoint is fp32 (its tied output head stored again), sd-turbo's fp16 variant 2 bytes a parameter.
"""

from __future__ import annotations

import json
import time

import torch

from pipeline.presets import PROJECT_ROOT

CONFIG_DIR = PROJECT_ROOT / "configs" / "real_size"


def read_config(name: str) -> dict:
    config = json.loads((CONFIG_DIR / name).read_text())
    config.pop("_source", None)
    return config


def build_captioner(dtype: torch.dtype, device: str):
    """BLIP base with random weights."""
    from transformers import BlipConfig, BlipForConditionalGeneration

    config = read_config("blip-image-captioning-base.json")
    model = BlipForConditionalGeneration(
        BlipConfig(text_config=config.pop("text_config"), vision_config=config.pop("vision_config"), **config)
    )
    return model.to(device, dtype).eval()


def build_renderer(dtype: torch.dtype, device: str) -> tuple[dict, dict]:
    """sd-turbo's UNet, text encoder and VAE with random weights, and its call settings."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    config = read_config("sd-turbo.json")
    parts = {
        "unet": UNet2DConditionModel.from_config(config.pop("unet")),
        "text_encoder": CLIPTextModel(CLIPTextConfig(**config.pop("text_encoder"))),
        "vae": AutoencoderKL.from_config(config.pop("vae")),
    }
    return {k: m.to(device, dtype).eval() for k, m in parts.items()}, config


@torch.inference_mode()
def caption_once(model, device: str, dtype: torch.dtype, tokens: int) -> None:
    pixels = torch.randn(1, 3, 384, 384, device=device, dtype=dtype)
    model.generate(pixel_values=pixels, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)


@torch.inference_mode()
def render_once(parts: dict, settings: dict, device: str, dtype: torch.dtype) -> None:
    ids = torch.randint(0, parts["text_encoder"].config.vocab_size, (1, 77), device=device)
    context = parts["text_encoder"](ids).last_hidden_state  # (1, 77, 1024)
    latents = torch.randn(1, 4, settings["height"] // 8, settings["width"] // 8, device=device, dtype=dtype)
    for step in range(settings["num_inference_steps"]):  # guidance 0: one UNet pass per step
        latents = latents - parts["unet"](latents, 999 - step, encoder_hidden_states=context).sample
    parts["vae"].decode(latents / parts["vae"].config.scaling_factor)


def timed(function, repeats: int, device: str) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(device: str, repeats: int = 2, caption_tokens: int = 30, memory=None) -> dict:
    """Per-frame captioning and rendering seconds, parameter counts, peak memory on `device` (the render's
    with the captioner still loaded: the rollout's combined peak) and the first run's download in MB.

    `memory()` gives the process's peak RSS in bytes so far (CPU); on CUDA the peak allocated memory is used.
    """
    dtype = torch.float16 if device == "cuda" else torch.float32
    result = {"device": device, "dtype": str(dtype).removeprefix("torch."), "repeats": repeats}
    held = []  # the rollout keeps the captioner loaded while it renders
    for name in ("caption", "render"):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        built = (build_captioner if name == "caption" else build_renderer)(dtype, device)
        build_s = time.perf_counter() - start
        params, seconds = time_component(name, built, device, dtype, repeats, caption_tokens)
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else memory()
        result[name] = {
            "seconds_per_frame": round(seconds, 3),
            "build_s": round(build_s, 1),
            "parameters_m": {k: round(v / 1e6, 1) for k, v in params.items()},
            ("peak_cuda_allocated_mib" if device == "cuda" else "peak_rss_mib"): round(peak / 2**20),
        }
        held.append(built)
    result["rollout_peak_mib"] = result["render"][next(k for k in result["render"] if k.endswith("_mib"))]
    result["download_mb"] = download_mb(held[0], held[1][0])
    return result


def download_mb(captioner, renderer_parts: dict) -> dict:
    """MB of weights a first run downloads: BLIP's fp32 checkpoint (with its tied output head stored again)
    and sd-turbo's fp16 variant."""
    tied_head = captioner.text_decoder.cls.predictions.decoder.weight.numel()
    blip = (sum(p.numel() for p in captioner.parameters()) + tied_head) * 4
    sd_turbo = sum(p.numel() for m in renderer_parts.values() for p in m.parameters()) * 2
    return {"captioner_fp32": round(blip / 1e6), "renderer_fp16": round(sd_turbo / 1e6)}


def time_component(name: str, built, device: str, dtype, repeats: int, caption_tokens: int) -> tuple[dict, float]:
    """Parameter counts {part: count} and median seconds per frame of the built captioner or renderer."""
    if name == "render":
        parts, settings = built
        params = {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}
        return params, timed(lambda: render_once(parts, settings, device, dtype), repeats, device)
    params = {"blip": sum(p.numel() for p in built.parameters())}
    return params, timed(lambda: caption_once(built, device, dtype, caption_tokens), repeats, device)


def format_result(result: dict) -> str:
    lines = [
        f"real-size hub models, random weights, on {result['device']} ({result['dtype']}), "
        f"median of {result['repeats']} after a warm-up:"
    ]
    for name, what in (
        ("caption", "captioning (BLIP base, 384 px, 30 tokens)"),
        ("render", "rendering (sd-turbo, 512 px, 1 step; captioner still loaded)"),
    ):
        r = result[name]
        memory = ", ".join(f"{k.replace('_', ' ')} {v} MiB" for k, v in r.items() if k.endswith("_mib"))
        params = ", ".join(f"{k} {v}M" for k, v in r["parameters_m"].items())
        lines.append(f"  {what}: {r['seconds_per_frame']:.2f} s per frame; {memory}; parameters {params}")
    download = result["download_mb"]
    lines.append(
        f"  the rollout holds both: combined peak {result['rollout_peak_mib']} MiB; a first run downloads about "
        f"{sum(download.values()) / 1e3:.1f} GB of weights (BLIP fp32 {download['captioner_fp32']} MB, "
        f"sd-turbo fp16 {download['renderer_fp16']} MB)"
    )
    return "\n".join(lines)

"""`python -m pipeline.bench --real-size`: the hub models' architectures from the configs kept in the repo."""

import json

import pytest
import torch

from pipeline import real_size
from pipeline.bench import main as bench_main
from tests.model_factories import one_torch_thread


def test_the_configs_build_the_published_architectures():
    with torch.device("meta"):  # full size, no memory
        blip = real_size.build_captioner(torch.float32, "meta")
        parts, settings = real_size.build_renderer(torch.float32, "meta")
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}
    assert counts == {"unet": 865_910_724, "text_encoder": 340_387_840, "vae": 83_653_863}  # Stable Diffusion 2.x
    tied_head = blip.text_decoder.cls.predictions.decoder.weight.numel()  # stored again in the hub's checkpoint
    assert sum(p.numel() for p in blip.parameters()) + tied_head == 247_414_076  # blip-image-captioning-base
    assert settings == {"height": 512, "width": 512, "num_inference_steps": 1, "guidance_scale": 0.0}


def test_measure_times_both_models_on_small_configs(tmp_path, monkeypatch):
    small = {
        "blip-image-captioning-base.json": {
            "projection_dim": 16,
            "text_config": {
                "vocab_size": 64,
                "hidden_size": 16,
                "encoder_hidden_size": 16,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "bos_token_id": 1,
                "pad_token_id": 0,
                "sep_token_id": 2,
                "eos_token_id": 2,
            },
            "vision_config": {
                "image_size": 384,
                "patch_size": 64,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
            },
        },
        "sd-turbo.json": {
            "height": 64,
            "width": 64,
            "num_inference_steps": 2,
            "guidance_scale": 0.0,
            "unet": {
                "sample_size": 8,
                "block_out_channels": [32, 64],
                "layers_per_block": 1,
                "cross_attention_dim": 16,
                "attention_head_dim": 4,
                "norm_num_groups": 8,
                "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
                "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
            },
            "text_encoder": {
                "vocab_size": 64,
                "hidden_size": 16,
                "intermediate_size": 32,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "max_position_embeddings": 77,
            },
            "vae": {
                "block_out_channels": [8, 8, 8, 8],
                "norm_num_groups": 8,
                "layers_per_block": 1,
                "down_block_types": ["DownEncoderBlock2D"] * 4,
                "up_block_types": ["UpDecoderBlock2D"] * 4,
            },
        },
    }
    for name, config in small.items():
        (tmp_path / name).write_text(json.dumps(config))
    monkeypatch.setattr(real_size, "CONFIG_DIR", tmp_path)
    with one_torch_thread():
        result = real_size.measure("cpu", repeats=1, caption_tokens=3, memory=lambda: 2**30)
    for name in ("caption", "render"):
        assert result[name]["seconds_per_frame"] > 0 and result[name]["peak_rss_mib"] == 1024
    assert set(result["render"]["parameters_m"]) == {"unet", "text_encoder", "vae"}
    assert result["rollout_peak_mib"] == 1024, "the render's peak, taken with the captioner still loaded"
    params = sum(result["render"]["parameters_m"].values()) * 1e6
    assert result["download_mb"]["renderer_fp16"] == pytest.approx(params * 2 / 1e6, abs=1)
    text = real_size.format_result(result)
    assert "s per frame" in text and "combined peak 1024 MiB" in text and "a first run downloads about" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_real_size_on_cuda_without_cuda_is_a_clear_error(capsys):
    assert bench_main(["--real-size", "--device", "cuda"]) == 2
    assert (
        capsys.readouterr().err
        == "error: --device cuda: this machine has no CUDA GPU (torch sees none); use --device cpu\n"
    )

import numpy as np
import pytest
import torch
from huggingface_hub import constants as hub_constants

from pipeline.tiny_pack import make_tiny_sd
from renderers.text_to_image import KNOWN_DEFAULTS, DiffusersRenderer
from tests.model_factories import make_tiny_pixel_pipeline, one_torch_thread, tiny_pixel_pipeline_class
from world_model.utils.hub import ModelLoadError

PROMPTS = ["a red dog", "the car on the street"]


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def sd_folder(tmp_path_factory):
    return make_tiny_sd(tmp_path_factory.mktemp("sd"))


@pytest.fixture(scope="module")
def renderer(sd_folder):
    return DiffusersRenderer.from_pretrained(sd_folder, num_inference_steps=2)


def test_loads_on_cpu_in_fp32_without_progress_bar(renderer, sd_folder):
    assert type(renderer.pipeline).__name__ == "StableDiffusionPipeline"
    assert renderer.name == str(sd_folder) and renderer.settings == {"num_inference_steps": 2}
    assert renderer.pipeline.device.type == "cpu" and renderer.pipeline.unet.dtype == torch.float32
    assert renderer.pipeline._progress_bar_config == {"disable": True}


def test_renders_one_uint8_image_per_prompt(renderer):
    images = renderer(PROMPTS)
    assert [(i.shape, i.dtype) for i in images] == [((32, 32, 3), np.uint8)] * 2
    assert all(i.std() > 1 for i in images)
    assert not np.array_equal(images[0], images[1])


def test_seeding_is_per_prompt_and_reproducible(renderer):
    first, second = renderer(PROMPTS, seed=3)
    assert np.array_equal(renderer([PROMPTS[1]], seed=3)[0], second)  # independent of position in the list
    assert np.array_equal(renderer([PROMPTS[0]], seed=3)[0], first)
    assert np.abs(renderer([PROMPTS[0]], seed=4)[0].astype(int) - first).mean() > 5


def test_explicit_settings_override_the_known_defaults(sd_folder, monkeypatch):
    monkeypatch.setitem(KNOWN_DEFAULTS, str(sd_folder), {"num_inference_steps": 1, "guidance_scale": 0.0})
    turbo = DiffusersRenderer.from_pretrained(sd_folder)
    assert turbo.settings == {"num_inference_steps": 1, "guidance_scale": 0.0}
    sized = DiffusersRenderer.from_pretrained(sd_folder, num_inference_steps=2, height=48, width=64)
    assert sized.settings == {"num_inference_steps": 2, "guidance_scale": 0.0, "height": 48, "width": 64}
    assert sized(["a dog"])[0].shape == (48, 64, 3)
    assert turbo(["a dog"])[0].shape == (32, 32, 3)


def test_image_to_image_starts_from_the_init_images(renderer):
    rng = np.random.default_rng(0)
    inits = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), np.zeros((48, 64, 3), np.uint8)]
    images = renderer(PROMPTS[:1] * 2, seed=0, init_images=inits)
    assert [(i.shape, i.dtype) for i in images] == [((48, 64, 3), np.uint8)] * 2  # keeps the init size
    # Same prompt and seed: only the init image differs (a random VAE barely passes it on, hence the low bar).
    assert np.abs(images[0].astype(int) - images[1]).mean() > 0.5
    assert np.array_equal(renderer(PROMPTS[:1], seed=0, init_images=inits[:1])[0], images[0])
    assert type(renderer.image_to_image()).__name__ == "StableDiffusionImg2ImgPipeline"
    assert renderer.image_to_image().unet is renderer.pipeline.unet  # shares the components
    with pytest.raises(ValueError, match="1 init images for 2 prompts"):
        renderer(PROMPTS, init_images=inits[:1])
    with pytest.raises(ValueError, match="strength must be in"):
        DiffusersRenderer(renderer.pipeline, "x", {}, strength=0.0)


def test_one_step_image_to_image_still_denoises_and_is_resized(sd_folder):
    turbo = DiffusersRenderer.from_pretrained(sd_folder, num_inference_steps=1, guidance_scale=0.0, height=32, width=32)
    init = np.zeros((48, 64, 3), np.uint8)
    image = turbo(["a dog"], init_images=[init])[0]
    assert image.shape == (32, 32, 3) and image.std() > 1


def test_custom_pipeline_with_code_in_the_folder_needs_trust(tmp_path):
    folder = make_tiny_pixel_pipeline(tmp_path / "pixel")
    with pytest.raises(ModelLoadError, match="custom code in pipeline.py(.|\n)*trust_remote_code=True"):
        DiffusersRenderer.from_pretrained(folder)
    renderer = DiffusersRenderer.from_pretrained(folder, trust_remote_code=True)
    assert type(renderer.pipeline).__name__ == "TinyPixelPipeline"
    images = renderer(PROMPTS, seed=0)
    assert [(i.shape, i.dtype) for i in images] == [((16, 16, 3), np.uint8)] * 2
    assert np.array_equal(renderer(PROMPTS[:1], seed=0)[0], images[0])
    assert not np.array_equal(renderer(PROMPTS[:1], seed=1)[0], images[0])
    with pytest.raises(ValueError, match="TinyPixelPipeline has no image-to-image counterpart"):
        renderer(PROMPTS[:1], init_images=[images[0]])


def test_custom_pipeline_class_unknown_to_diffusers(tmp_path):
    folder = make_tiny_pixel_pipeline(tmp_path / "pixel", ship_code=False)
    message = "'TinyPixelPipeline', which diffusers does not provide: pass pipeline_class"
    with pytest.raises(ModelLoadError, match=message):
        DiffusersRenderer.from_pretrained(folder)
    renderer = DiffusersRenderer.from_pretrained(folder, pipeline_class=tiny_pixel_pipeline_class())
    assert renderer(PROMPTS[:1])[0].shape == (16, 16, 3)


def test_load_errors_say_what_is_wrong(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="Model folder not found"):
        DiffusersRenderer.from_pretrained(tmp_path / "nope")
    (tmp_path / "unet").mkdir()
    with pytest.raises(ModelLoadError, match="has no model_index.json; it contains: unet"):
        DiffusersRenderer.from_pretrained(tmp_path)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # no network retries
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    message = "'no-such-org/no-such-renderer' .* Hub id, but it is not in the local cache"
    with pytest.raises(ModelLoadError, match=message):
        DiffusersRenderer.from_pretrained("no-such-org/no-such-renderer")

import numpy as np
import pytest
import torch
from huggingface_hub import constants as hub_constants

from pipeline.tiny_pack import make_tiny_sd
from renderers.text_to_image import DiffusersRenderer
from tests.model_factories import (
    make_tiny_pixel_pipeline,
    make_tiny_sd_turbo,
    one_torch_thread,
    tiny_pixel_pipeline_class,
)
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


def test_explicit_settings_override_the_model_card_settings(tmp_path):
    turbo_copy = make_tiny_sd_turbo(tmp_path / "my-local-copy")
    sized = DiffusersRenderer.from_pretrained(turbo_copy, num_inference_steps=2, height=48, width=64)
    assert sized.settings == {"num_inference_steps": 2, "guidance_scale": 0.0, "height": 48, "width": 64}
    assert sized(["a dog"])[0].shape == (48, 64, 3)


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


TURBO_CARD = {"num_inference_steps": 1, "guidance_scale": 0.0, "height": 512, "width": 512}


def count_unet_passes(renderer, monkeypatch) -> list[int]:
    """The batch size of every UNet pass the renderer makes from now on (guidance doubles the batch)."""
    passes = []
    unet = renderer.pipeline.unet
    forward = unet.forward
    monkeypatch.setattr(
        unet, "forward", lambda sample, *a, **k: passes.append(sample.shape[0]) or forward(sample, *a, **k)
    )
    return passes


def test_a_local_copy_of_sd_turbo_renders_one_step_without_guidance(tmp_path, monkeypatch):
    folder = make_tiny_sd_turbo(tmp_path / "my-local-copy")  # recognised by its config; no hub id in the path
    renderer = DiffusersRenderer.from_pretrained(folder)
    assert renderer.settings == TURBO_CARD
    renderer.settings |= {"height": 32, "width": 32}  # the tiny model at its own size, to keep the test fast
    passes = count_unet_passes(renderer, monkeypatch)
    assert renderer(["a dog"])[0].shape == (32, 32, 3)
    assert passes == [1], "one step, no classifier-free guidance batch"


def test_a_plain_stable_diffusion_folder_keeps_its_own_defaults(sd_folder):
    assert DiffusersRenderer.from_pretrained(sd_folder).settings == {}


def test_hub_preset_carries_the_sd_turbo_card_settings():
    from pipeline.presets import load_preset

    hub = load_preset("hub")
    assert hub.renderer_options == TURBO_CARD
    other = hub.with_models({"renderer": "some-org/another-renderer"})
    assert other.renderer_options == {}, "the card's settings belong to sd-turbo, not to a renderer named instead"
    assert other.captioner_options == hub.captioner_options


def test_image_to_image_resizes_the_init_frame_to_the_card_size(tmp_path, monkeypatch):
    renderer = DiffusersRenderer.from_pretrained(make_tiny_sd_turbo(tmp_path / "turbo"))
    received = []

    def image_to_image(prompt, image, **settings):  # records what the pipeline would get; rendering 512 px is slow
        received.append((image.size, settings["height"], settings["width"]))
        raise InterruptedError

    monkeypatch.setattr(renderer, "image_to_image", lambda: image_to_image)
    wide_frame = np.zeros((288, 512, 3), np.uint8)  # a 16:9 frame as sampled from a clip
    with pytest.raises(InterruptedError):
        renderer(["a dog"], init_images=[wide_frame])
    assert received == [((512, 512), 512, 512)]


def test_a_folder_with_only_fp16_variant_weights_loads_them(tmp_path):
    folder = make_tiny_sd_turbo(tmp_path / "fp16", variant="fp16")
    assert not list(folder.glob("unet/diffusion_pytorch_model.safetensors"))
    renderer = DiffusersRenderer.from_pretrained(folder, height=32, width=32)
    assert renderer.pipeline.unet.dtype == torch.float32  # cast up on CPU
    assert renderer(["a dog"])[0].std() > 1


def test_the_fp16_variant_is_preferred_over_the_default_weights(tmp_path):
    import safetensors.torch

    folder = make_tiny_sd_turbo(tmp_path / "both")
    fp16 = make_tiny_sd_turbo(tmp_path / "fp16", variant="fp16")
    for file in fp16.glob("*/*.fp16.safetensors"):
        (folder / file.parent.name / file.name).write_bytes(file.read_bytes())
    renderer = DiffusersRenderer.from_pretrained(folder)
    stored = safetensors.torch.load_file(fp16 / "unet" / "diffusion_pytorch_model.fp16.safetensors")
    name, value = next((k, v) for k, v in stored.items() if v.dtype == torch.float16 and v.numel() > 100)
    loaded = renderer.pipeline.unet.state_dict()[name]
    assert torch.equal(loaded, value.float())


def test_a_cached_hub_model_loads_without_asking_the_hub(tmp_path, monkeypatch):
    from pipeline.presets import hub_model_available
    from tests.model_factories import fill_hub_cache, recording_hub

    snapshot = fill_hub_cache(tmp_path / "cache", "tiny-org/tiny-turbo", make_tiny_sd_turbo(tmp_path / "m", "fp16"))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    with recording_hub() as (requests, url):
        monkeypatch.setattr(hub_constants, "ENDPOINT", url)
        assert hub_model_available("tiny-org/tiny-turbo")
        renderer = DiffusersRenderer.from_pretrained("tiny-org/tiny-turbo", height=32, width=32)
    assert renderer.settings["num_inference_steps"] == 1 and renderer(["a dog"])[0].shape == (32, 32, 3)
    assert not [r for r in requests if "tiny-org" in r], requests
    for file in snapshot.glob("*/*.safetensors"):  # the index is cached, the weights are not
        file.unlink()
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    assert not hub_model_available("tiny-org/tiny-turbo")
    with pytest.raises(ModelLoadError, match="weights may be missing: `hf download tiny-org/tiny-turbo --include"):
        DiffusersRenderer.from_pretrained("tiny-org/tiny-turbo")


def test_download_hint_fetches_only_what_is_loaded(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError) as error:
        DiffusersRenderer.from_pretrained("no-such-org/no-such-renderer")
    assert '`hf download no-such-org/no-such-renderer --include "*.json" "*/*.txt" "*/*.fp16.safetensors"`' in str(
        error.value
    )


def test_an_uncached_hub_id_downloads_the_fp16_variant_first(tmp_path, monkeypatch):
    from world_model.utils.hub import load_model_files

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    tries = []

    def load(variant, local_files_only):
        tries.append((variant, local_files_only))
        return "loaded"

    assert load_model_files(load, "some-org/turbo", "model_index.json") == "loaded"
    assert tries == [("fp16", False)], "an fp16 repository: only its fp16 files are fetched"

    def load_without_variant(variant, local_files_only):
        tries.append((variant, local_files_only))
        if variant == "fp16":
            raise ValueError("You are trying to load the model files of the `variant=fp16`, but no such files exist")
        return "loaded"

    tries.clear()
    assert load_model_files(load_without_variant, "some-org/plain", "model_index.json") == "loaded"
    assert tries == [("fp16", False), (None, False)], "no fp16 files: the default ones"

    def offline(variant, local_files_only):
        raise OSError("cannot reach the hub")

    with pytest.raises(OSError, match="cannot reach"):  # a real failure is not retried
        load_model_files(offline, "some-org/plain", "model_index.json")


def test_a_checkpoint_with_a_renamed_key_fails_loudly(tmp_path):
    import safetensors.torch

    folder = make_tiny_sd(tmp_path / "sd")
    file = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights = safetensors.torch.load_file(file)
    weights["renamed.weight"] = weights.pop("conv_in.bias")
    safetensors.torch.save_file(weights, file, metadata={"format": "pt"})
    import diffusers

    level = diffusers.logging.get_verbosity()
    diffusers.logging.set_verbosity_error()  # as the rollout command silences it
    try:
        with pytest.raises(ModelLoadError, match="not used when initializing(.|\n)*not initialized from the model"):
            DiffusersRenderer.from_pretrained(folder)
    finally:
        diffusers.logging.set_verbosity(level)

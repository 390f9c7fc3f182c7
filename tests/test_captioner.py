import numpy as np
import pytest
import torch
from huggingface_hub import constants as hub_constants

from encoders.captioner import HFCaptioner
from pipeline.tiny_pack import WORDS, make_tiny_blip
from tests.model_factories import make_tiny_vit_gpt2, one_torch_thread
from world_model.utils.hub import ModelLoadError, default_device

IMAGES = [
    np.zeros((40, 50, 3), np.uint8),
    np.full((64, 32, 3), 255, np.uint8),
    np.tile(np.array([255, 0, 0], np.uint8), (32, 32, 1)),
    np.random.default_rng(0).integers(0, 256, (30, 30, 3), dtype=np.uint8),
]


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=[make_tiny_blip, make_tiny_vit_gpt2], ids=["blip", "vit-gpt2"])
def model_folder(request, tmp_path_factory):
    return request.param(tmp_path_factory.mktemp(request.param.__name__))


def test_captions_a_batch_in_order_and_deterministically(model_folder):
    captioner = HFCaptioner.from_pretrained(model_folder, batch_size=3, max_new_tokens=8)
    assert captioner.name == str(model_folder)
    assert captioner.model.device.type == "cpu" and captioner.model.dtype == torch.float32
    captions = captioner(IMAGES)  # two batches: 3 + 1
    assert len(captions) == len(IMAGES)
    assert all(isinstance(c, str) and c and c == c.strip() for c in captions)
    assert len(set(captions)) > 1, "tiny model ignores the image; the order check below would be vacuous"
    assert captions == [captioner([image])[0] for image in IMAGES]
    assert captioner(IMAGES) == captions
    assert captioner([]) == []


def test_blip_captions_are_decoded_words_without_special_tokens(tmp_path):
    captions = HFCaptioner.from_pretrained(make_tiny_blip(tmp_path), max_new_tokens=8)(IMAGES)
    for caption in captions:
        assert set(caption.split()) <= set(WORDS), caption


def test_default_device_prefers_cuda(monkeypatch):
    assert default_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device(None) == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device(None) == torch.device("cpu")


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match=f"Model folder not found: {tmp_path / 'nope'}"):
        HFCaptioner.from_pretrained(tmp_path / "nope")


def test_folder_without_model_files_says_what_it_lacks(tmp_path):
    (tmp_path / "README.md").write_text("weights go here")
    with pytest.raises(ModelLoadError, match=r"has no config.json; it contains: README.md"):
        HFCaptioner.from_pretrained(tmp_path)


def test_folder_with_missing_weights_lists_its_contents(tmp_path):
    folder = make_tiny_blip(tmp_path / "blip")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"Cannot load a model from folder .*blip: it contains: config.json"):
        HFCaptioner.from_pretrained(folder)


def test_uncached_hub_id_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # no network retries
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    message = "'no-such-org/no-such-captioner' .* Hub id, but it is not in the local cache"
    with pytest.raises(ModelLoadError, match=message):
        HFCaptioner.from_pretrained("no-such-org/no-such-captioner")

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


def test_decoding_joins_the_spaces_a_word_piece_tokenizer_puts_around_punctuation(tmp_path):
    from transformers import BertTokenizer

    captioner = HFCaptioner.from_pretrained(make_tiny_blip(tmp_path / "blip"))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "'", "s", "dog", ","]) + "\n")
    captioner.tokenizer = BertTokenizer(vocab=str(vocab))
    ids = captioner.tokenizer(["a man's dog, a dog"], return_tensors="pt").input_ids
    assert captioner.decode(ids) == ["a man's dog, a dog"]


def test_a_checkpoint_with_missing_or_unexpected_keys_fails_loudly(tmp_path):
    import safetensors.torch

    folder = make_tiny_blip(tmp_path / "blip")
    weights = safetensors.torch.load_file(folder / "model.safetensors")
    missing = next(k for k in weights if "vision_model" in k)
    weights["unexpected.weight"] = weights.pop(missing)
    safetensors.torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=f"does not match the model's weights \\(missing: {missing}; unexpected"):
        HFCaptioner.from_pretrained(folder)


def test_the_score_is_the_greedy_captions_log_probability_whatever_the_generation_config(tmp_path):
    from transformers import GenerationConfig

    folder = make_tiny_blip(tmp_path / "blip")
    GenerationConfig.from_pretrained(folder).save_pretrained(folder)
    config = GenerationConfig.from_pretrained(folder)
    config.num_beams, config.repetition_penalty = 3, 1.3  # a checkpoint may ship beam search or a penalty
    config.save_pretrained(folder)
    captioner = HFCaptioner.from_pretrained(folder, max_new_tokens=6)
    image = IMAGES[3:]
    captions, groundings = captioner.caption_and_ground(image)
    # Greedy decoding (under the penalty), scored by the model's own (raw) log-probabilities.
    inputs = captioner.image_processor(images=image, input_data_format="channels_last", return_tensors="pt")
    with torch.inference_mode():
        out = captioner.model.generate(**inputs, max_new_tokens=6, do_sample=False, num_beams=1)
        logits = captioner.model(pixel_values=inputs["pixel_values"], input_ids=out[:, :-1]).logits  # (1, L-1, V)
    chosen = logits.log_softmax(-1).gather(-1, out[:, 1:, None])[0, :, 0]
    keep = out[0, 1:] != captioner.tokenizer.pad_token_id
    assert captions == captioner.decode(out)
    assert groundings[0].score == pytest.approx(chosen[keep].mean().item(), abs=1e-4)


def test_progress_is_reported_after_every_batch(tmp_path):
    captioner = HFCaptioner.from_pretrained(make_tiny_blip(tmp_path / "blip"), batch_size=3, max_new_tokens=4)
    calls = []
    captioner.caption_and_ground(IMAGES, on_batch=lambda done, total: calls.append((done, total)))
    assert calls == [(3, 4), (4, 4)]


def test_fp16_variant_folder_and_cached_hub_id_load_without_the_network(tmp_path, monkeypatch):
    from transformers import BlipForConditionalGeneration

    from tests.model_factories import fill_hub_cache, recording_hub

    folder = make_tiny_blip(tmp_path / "blip")
    model = BlipForConditionalGeneration.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    model.to(torch.float16).save_pretrained(folder, variant="fp16")
    captions = HFCaptioner.from_pretrained(folder, max_new_tokens=4)(IMAGES)
    fill_hub_cache(tmp_path / "cache", "tiny-org/tiny-blip", folder)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    with recording_hub() as (requests, url):
        monkeypatch.setattr(hub_constants, "ENDPOINT", url)
        captioner = HFCaptioner.from_pretrained("tiny-org/tiny-blip", max_new_tokens=4)
    assert captioner(IMAGES) == captions and captioner.model.dtype == torch.float32
    assert not [r for r in requests if "tiny-org" in r], requests


def test_a_folder_without_its_tokenizer_files_is_refused(tmp_path):
    folder = make_tiny_blip(tmp_path / "blip")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(ModelLoadError, match="tokenizer has 5 tokens for a model that writes 26; its tokenizer files"):
        HFCaptioner.from_pretrained(folder)


def blip_as_the_hub_ships_it(folder):
    """A tiny BLIP laid out as BLIP base's repository is: ``pytorch_model.bin`` (a plain state dict, with the
    ``position_ids`` buffer older versions saved) and no safetensors."""
    import safetensors.torch

    weights = safetensors.torch.load_file(folder / "model.safetensors")
    weights["text_decoder.bert.embeddings.position_ids"] = torch.arange(512)[None]
    torch.save(weights, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


def test_a_bin_only_repository_is_recognised_in_the_cache_and_loads_without_the_network(tmp_path, monkeypatch):
    import threading

    from tests.model_factories import fill_hub_cache, recording_hub
    from world_model.utils.hub import model_folder

    folder = make_tiny_blip(tmp_path / "blip")
    expected = HFCaptioner.from_pretrained(folder, max_new_tokens=4)(IMAGES)
    blip_as_the_hub_ships_it(folder)
    snapshot = fill_hub_cache(tmp_path / "cache", "tiny-org/tiny-blip", folder)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    assert model_folder("tiny-org/tiny-blip", "config.json") == snapshot
    with recording_hub() as (requests, url):
        monkeypatch.setattr(hub_constants, "ENDPOINT", url)
        captioner = HFCaptioner.from_pretrained("tiny-org/tiny-blip", max_new_tokens=4)
    assert captioner(IMAGES) == expected
    assert not [r for r in requests if "tiny-org" in r], requests
    assert not [t for t in threading.enumerate() if "conversion" in t.name]


def test_loading_a_bin_from_the_hub_starts_no_safetensors_conversion(tmp_path, monkeypatch):
    """transformers converts a downloaded .bin in a background thread (a second download) unless told not to."""
    import os

    from world_model.utils.hub import NO_CONVERSION, load_model_files

    monkeypatch.delenv(NO_CONVERSION, raising=False)
    seen = []
    load_model_files(lambda variant, local: seen.append(os.environ.get(NO_CONVERSION)), "some-org/uncached", "x.json")
    assert seen == ["1"] and NO_CONVERSION not in os.environ


def test_the_download_hint_fetches_the_weights_a_bin_only_repository_has(tmp_path, monkeypatch):
    from fnmatch import fnmatch

    from world_model.utils.hub import DOWNLOAD_PATTERNS, download_command

    patterns = DOWNLOAD_PATTERNS["config.json"]
    assert any(fnmatch("pytorch_model.bin", p) for p in patterns)
    assert any(fnmatch("model.safetensors", p) for p in patterns)
    assert '"pytorch_model*.bin"' in download_command("Salesforce/blip-image-captioning-base", "config.json")


def test_an_unexpected_key_that_is_not_a_buffer_still_fails(tmp_path):
    import safetensors.torch

    folder = blip_as_the_hub_ships_it(make_tiny_blip(tmp_path / "blip"))
    weights = torch.load(folder / "pytorch_model.bin", weights_only=True)
    weights["text_decoder.bert.embeddings.not_a_buffer"] = torch.zeros(1)
    (folder / "pytorch_model.bin").unlink()
    safetensors.torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="unexpected: text_decoder.bert.embeddings.not_a_buffer"):
        HFCaptioner.from_pretrained(folder)


def test_a_checkpoint_key_naming_one_of_the_models_own_buffers_is_not_a_mismatch():
    """transformers before 5.6 reports BLIP's saved ``position_ids`` as unexpected; the model makes that buffer."""
    from encoders.captioner import check_loading_report

    model = torch.nn.Module()
    model.register_buffer("position_ids", torch.arange(3), persistent=False)
    check_loading_report({"unexpected_keys": ["position_ids"]}, "tiny", model)
    with pytest.raises(ModelLoadError, match="unexpected: weight"):
        check_loading_report({"unexpected_keys": ["position_ids", "weight"]}, "tiny", model)

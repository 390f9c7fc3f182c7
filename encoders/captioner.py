"""Image-to-text captioners.

``HFCaptioner`` wraps any Hugging Face image-to-text model that ``AutoModelForImageTextToText``
loads and that captions from pixels alone: BLIP (``BlipForConditionalGeneration``) and
``VisionEncoderDecoderModel`` checkpoints such as ViT + GPT-2.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors import SafetensorError
from tqdm.auto import tqdm
from transformers import (
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoTokenizer,
    BaseImageProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from encoders.grounding import CAPTION_LOGPROB, FeatureReference, Grounding
from world_model.utils.hub import ModelLoadError, default_device, explain_load_failure, load_model_files

DEFAULT_CAPTIONER = "Salesforce/blip-image-captioning-base"


class Captioner(Protocol):
    name: str

    def __call__(self, images: list[np.ndarray]) -> list[str]:
        """Images (H, W, 3) uint8 RGB -> one caption per image, in order."""
        ...


def decoder_positions(model: PreTrainedModel) -> int | None:
    """How many positions the model's text decoder has (None when its config does not say)."""
    decoder = getattr(model.config, "decoder", None) or getattr(model.config, "text_config", None)
    return getattr(decoder, "n_positions", None) or getattr(decoder, "max_position_embeddings", None)


class HFCaptioner:
    """Batched greedy captioning with a Hugging Face image-to-text model.

    The image processor and tokenizer are loaded separately (``AutoImageProcessor`` +
    ``AutoTokenizer``) because ``AutoProcessor`` on a VisionEncoderDecoder folder returns only the
    tokenizer.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        image_processor: BaseImageProcessor,
        tokenizer: PreTrainedTokenizerBase,
        name: str,
        batch_size: int = 8,
        max_new_tokens: int = 30,
        reference: FeatureReference | None = None,
    ):
        self.model = model
        self.reference = reference
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        positions = decoder_positions(model)  # a caption never runs past the decoder's position table
        self.max_new_tokens = max_new_tokens if positions is None else min(max_new_tokens, positions - 1)

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | Path = DEFAULT_CAPTIONER,
        device: str | torch.device | None = None,
        batch_size: int = 8,
        max_new_tokens: int = 30,
    ) -> HFCaptioner:
        """Load from a hub id or a ``save_pretrained`` folder; fp16 on CUDA, fp32 elsewhere.

        A folder with ``grounding.safetensors`` (``encoders.grounding``) gets calibrated grounding scores.
        The files are found as ``world_model.utils.hub.load_model_files`` says (fp16 variant where it exists,
        a cached hub id without the network). Raises ``ModelLoadError`` saying whether the folder lacks files or
        the hub id is not cached, and when the checkpoint's weights do not match the model's (missing,
        unexpected or mis-shaped keys, which transformers would only log).
        """
        device = default_device(device)
        dtype = torch.float16 if device.type == "cuda" else torch.float32

        def load(variant: str | None, local_files_only: bool):
            processor = AutoImageProcessor.from_pretrained(model_id_or_path, local_files_only=local_files_only)
            tokenizer = AutoTokenizer.from_pretrained(model_id_or_path, local_files_only=local_files_only)
            model, report = AutoModelForImageTextToText.from_pretrained(
                model_id_or_path,
                dtype=dtype,
                variant=variant,
                local_files_only=local_files_only,
                output_loading_info=True,
            )
            check_tokenizer(tokenizer, model, model_id_or_path)
            return processor, tokenizer, model, report

        try:
            image_processor, tokenizer, model, report = load_model_files(load, model_id_or_path, "config.json")
        except (OSError, ValueError, SafetensorError) as error:
            raise ModelLoadError(explain_load_failure(model_id_or_path, "config.json", error)) from error
        check_loading_report(report, model_id_or_path, model)
        model.to(device).eval()
        reference = FeatureReference.load(model_id_or_path) if Path(model_id_or_path).is_dir() else None
        return cls(model, image_processor, tokenizer, str(model_id_or_path), batch_size, max_new_tokens, reference)

    def __call__(self, images: list[np.ndarray], progress: str | None = None) -> list[str]:
        """Images (H, W, 3) uint8 RGB, any sizes -> one stripped caption per image, in order. With
        ``progress`` (a label), a progress bar counts the images."""
        return self.caption_and_ground(images, progress)[0]

    @torch.inference_mode()
    def caption_and_ground(
        self,
        images: list[np.ndarray],
        progress: str | None = None,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> tuple[list[str], list[Grounding]]:
        """Captions as ``__call__`` does, and each image's ``Grounding``: the distance of its encoder
        features to the training strips' when the folder has a reference, else the caption's mean token
        log-probability (uncalibrated). ``on_batch(done, total)`` is called after every batch with the
        images captioned so far."""
        captions, groundings = [], []
        with tqdm(total=len(images), desc=progress, unit="image", disable=progress is None) as bar:
            for start in range(0, len(images), self.batch_size):
                batch = images[start : start + self.batch_size]
                inputs = self.image_processor(images=batch, input_data_format="channels_last", return_tensors="pt")
                pixels = inputs["pixel_values"].to(self.model.device, self.model.dtype)
                out = self.model.generate(
                    pixel_values=pixels,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    num_beams=1,  # greedy: the score below is the log-probability of the tokens chosen
                    output_logits=True,
                    return_dict_in_generate=True,
                )
                captions += self.decode(out.sequences)
                if self.reference is not None:
                    groundings += self.reference.ground(self.features(pixels))
                else:
                    groundings += [Grounding(CAPTION_LOGPROB, lp) for lp in self._mean_logprobs(out).tolist()]
                bar.update(len(batch))
                if on_batch is not None:
                    on_batch(len(captions), len(images))
        return captions, groundings

    def decode(self, sequences: torch.Tensor) -> list[str]:
        """(B, L) generated token ids -> B stripped captions, special tokens dropped and the spaces a
        word-piece tokenizer puts around punctuation joined back ("a man ' s dog" -> "a man's dog")."""
        texts = self.tokenizer.batch_decode(sequences, skip_special_tokens=True, clean_up_tokenization_spaces=True)
        return [text.strip() for text in texts]

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) processed pixels -> (B, D) vision encoder features, mean over tokens (float32, CPU)."""
        hidden = self.model.get_encoder()(pixel_values=pixels).last_hidden_state  # (B, tokens, D)
        return hidden.mean(1).float().cpu()

    def _mean_logprobs(self, out) -> torch.Tensor:
        """(B,) mean log-probability of each generated caption's tokens under the model's raw logits (before
        any logits processor of the generation config), padding after the end left out."""
        scores = self.model.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)  # (B, new)
        new = out.sequences[:, -scores.shape[1] :]
        keep = torch.isfinite(scores) & (
            new != self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else True
        )
        return (scores.where(keep, 0).sum(1) / keep.sum(1).clamp_min(1)).float().cpu()


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, source: str | Path) -> None:
    """Raise ``ModelLoadError`` when the tokenizer covers less than half the model's output vocabulary: transformers
    builds a near-empty tokenizer, without a word, when a folder lacks its tokenizer files."""
    vocabulary = model.config.get_text_config(decoder=True).vocab_size
    if len(tokenizer) < vocabulary // 2:
        raise ModelLoadError(
            f"{source}: the tokenizer has {len(tokenizer)} tokens for a model that writes {vocabulary}; "
            "its tokenizer files (tokenizer.json, vocab.txt or vocab.json) are missing"
        )


def check_loading_report(report: dict, source: str | Path, model: torch.nn.Module) -> None:
    """Raise ``ModelLoadError`` when ``from_pretrained``'s loading report lists checkpoint keys that are missing,
    unexpected or of the wrong shape: such a model would run on random weights. A checkpoint key naming one of the
    model's own buffers (BLIP's ``position_ids``, saved by older versions) is not a problem: the model makes it."""
    buffers = {name for name, _ in model.named_buffers()}
    problems = {
        kind: sorted(str(k) for k in report.get(f"{kind}_keys") or () if kind != "unexpected" or k not in buffers)
        for kind in ("missing", "unexpected", "mismatched")
    }
    listed = "; ".join(
        f"{kind}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}" for kind, keys in problems.items() if keys
    )
    if listed:
        raise ModelLoadError(f"{source}: the checkpoint does not match the model's weights ({listed})")

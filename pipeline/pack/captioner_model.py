"""The offline pack's captioner as a model: a small ViT + GPT-2 ``VisionEncoderDecoderModel`` built from scratch for
state strips, saved in float16 with its tokenizer and image processor, and loaded back to train further."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import (
    GPT2Config,
    PreTrainedTokenizerFast,
    VisionEncoderDecoderConfig,
    VisionEncoderDecoderModel,
    ViTConfig,
)

from pipeline.pack.strip_images import strip_image_processor
from world_model.data.synthetic.simulation import STRIP_SIZE
from world_model.utils.files import atomic_dir

if TYPE_CHECKING:
    from pipeline.pack.train_captioner import TrainConfig


def build_captioner(tokenizer: PreTrainedTokenizerFast, config: TrainConfig) -> VisionEncoderDecoderModel:
    """A randomly initialised ViT + GPT-2 captioner for ``STRIP_SIZE`` strips whose special token ids
    (decoder start = BOS, end = EOS, padding = PAD) are set in both the model and generation configs."""
    encoder = ViTConfig(
        image_size=list(STRIP_SIZE),
        patch_size=config.patch_size,
        hidden_size=config.encoder_hidden,
        num_hidden_layers=config.encoder_layers,
        num_attention_heads=config.encoder_heads,
        intermediate_size=4 * config.encoder_hidden,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    decoder = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=tokenizer.model_max_length + 2,
        n_embd=config.decoder_hidden,
        n_layer=config.decoder_layers,
        n_head=config.decoder_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model_config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    special = dict(
        decoder_start_token_id=tokenizer.bos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    for name, value in special.items():
        setattr(model_config, name, value)
    torch.manual_seed(config.seed)
    model = VisionEncoderDecoderModel(model_config)
    for name, value in special.items():
        setattr(model.generation_config, name, value)
    return model


def save_captioner(model: VisionEncoderDecoderModel, tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """Write model (fp16 safetensors), tokenizer and image processor to a temporary folder beside
    ``folder``, then rename it into place: an interruption never leaves a partial ``folder``."""
    with atomic_dir(folder) as tmp:
        half = {name: tensor.detach().to(torch.float16) for name, tensor in model.state_dict().items()}
        model.save_pretrained(tmp, state_dict=half)
        tokenizer.save_pretrained(tmp)
        strip_image_processor().save_pretrained(tmp)


def warm_start(folder: Path, tokenizer: PreTrainedTokenizerFast) -> tuple[VisionEncoderDecoderModel, object]:
    """The float32 captioner and tokenizer saved in ``folder``; a ValueError when its words are not those of
    ``tokenizer`` (built from the training sentences), so that it would read other data."""
    try:
        model = VisionEncoderDecoderModel.from_pretrained(folder, dtype=torch.float32)
        saved = PreTrainedTokenizerFast.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise ValueError(f"--init-from {folder}: not a captioner folder ({err})") from err
    if saved.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"--init-from {folder}: its words differ from those of the training sentences")
    return model, saved

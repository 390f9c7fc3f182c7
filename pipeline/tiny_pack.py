"""The tiny model pack: random-weight models of the real architectures, built locally (nothing is downloaded).

``python -m pipeline.bench --preset tiny`` times the pipeline with them (captioner, renderer, and a predictor
when the shipped one is missing); the tests load them as model fixtures (``tests/model_factories.py`` adds
the test-only ones, built from the same tokenizer helpers). Every
model uses the production architecture class with a tiny config and a tokenizer built from vocabulary
files written on the spot, is saved with ``save_pretrained`` and is meant to be loaded back through the
production ``from_pretrained`` code. Each builds in about a second on CPU. The outputs are noise: these
models measure the pipeline's plumbing and cost, not its quality.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

# Larger than the usual 0.02 so that tiny random captioners react to the image at all.
INIT_RANGE = 0.2
WORDS = "a the red square on dark background moves left right person dog car street walks runs is in of and".split()

# Sentences for a predictor vocabulary that shares words with the tiny captioner's ``WORDS``.
PREDICTOR_SENTENCES = (
    "a red square moves to the right .",
    "the square stops at the wall .",
    "a person walks in the street .",
    "the dog runs left and the car moves right .",
    "a ball falls down on the dark background .",
)


def byte_level_vocab(end_of_word: str = "") -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE vocabulary over all 256 bytes (each also with ``end_of_word`` when given) and a few merges."""
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    if end_of_word:
        symbols += [s + end_of_word for s in symbols]
    if end_of_word:
        merges = ["t h", "th e" + end_of_word, "r e", "re d" + end_of_word]
    else:
        merges = ["Ġ t", "Ġt h", "Ġth e", "r e"]
    for merge in merges:
        symbols.append(merge.replace(" ", ""))
    return {s: i for i, s in enumerate(symbols)}, merges


def write_bpe_files(folder: Path, vocab: dict[str, int], merges: list[str]) -> tuple[str, str]:
    """Write ``vocab.json`` and ``merges.txt`` into ``folder``; returns their paths, as BPE tokenizers take them."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    vocab_file.write_text(json.dumps(vocab))
    merges_file.write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return str(vocab_file), str(merges_file)


def make_tiny_blip(folder: str | Path) -> Path:
    """Save a random tiny ``BlipForConditionalGeneration`` (32x32 input) with its ``BlipProcessor``."""
    from transformers import BertTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    folder = Path(folder)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", *WORDS]) + "\n")
        # transformers 5: the vocabulary path goes in `vocab`; a `vocab_file=` keyword is silently ignored.
        tokenizer = BertTokenizer(vocab=str(vocab_file), bos_token="[DEC]")
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tokenizer)
    config = BlipConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
            initializer_range=INIT_RANGE,
        ),
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.sep_token_id,
            sep_token_id=tokenizer.sep_token_id,
            pad_token_id=tokenizer.pad_token_id,
            initializer_range=INIT_RANGE,
        ),
        projection_dim=32,
    )
    torch.manual_seed(0)
    BlipForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _tiny_clip_text() -> tuple:
    """A byte-level BPE ``CLIPTokenizer`` of 16 tokens and a random 2-layer ``CLIPTextModel`` (width 32) over it."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab, merges = byte_level_vocab(end_of_word="</w>")
    vocab.update({"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1})
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = CLIPTokenizer(*write_bpe_files(Path(tmp), vocab, merges), model_max_length=16)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=16,
            projection_dim=32,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    return tokenizer, text_encoder


def make_tiny_sd(folder: str | Path) -> Path:
    """Save a random tiny ``StableDiffusionPipeline`` rendering 32x32 images by default.

    UNet (8/16 channels, one cross-attention block, 16x16 latents), 2-level VAE (scale factor 2),
    2-layer CLIP text encoder with a byte-level BPE ``CLIPTokenizer`` of 16 tokens, Euler ancestral
    scheduler, no safety checker.
    """
    from diffusers import AutoencoderKL, EulerAncestralDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel

    folder = Path(folder)
    tokenizer, text_encoder = _tiny_clip_text()
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=4,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8, 16),
        norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        sample_size=32,
    )
    scheduler = EulerAncestralDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1, timestep_spacing="trailing"
    )
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(folder)
    return folder


def make_tiny_predictor(
    folder: str | Path,
    sentences: Iterable[str] = PREDICTOR_SENTENCES,
    d_x: int = 16,
    d_t: int = 8,
    n_heads: int = 4,
    n_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised ``FourTensorModel`` (default: the CPU-sized preset, d_x 16, d_t 8,
    4 heads, 2 layers) with a vocabulary built from ``sentences``, in the checkpoint layout
    ``load_model`` / ``Vocabulary.load`` read."""
    from world_model.models.four_tensor import FourTensorModel
    from world_model.models.four_tensor_config import FourTensorConfig
    from world_model.text.vocab import Vocabulary

    vocab = Vocabulary.build(sentences)
    torch.manual_seed(seed)
    model = FourTensorModel(
        FourTensorConfig(vocab_size=len(vocab), d_x=d_x, d_t=d_t, n_heads=n_heads, n_layers=n_layers)
    )
    return model.save_pretrained(Path(folder), vocab=vocab)

"""Registry of the trainable predictors, keyed by the ``model_type`` written into config.json.

Every registered model class is an ``nn.Module`` with ``PretrainedMixin`` (``save_pretrained`` /
``from_pretrained``) whose ``training_step(windows (B, T+1, N))`` returns a ``StepStats``. A class may
define a classmethod ``vocab_size_for(vocab) -> int`` when its embedding table is not ``len(vocab)``
(e.g. a baseline that adds [BOS] and [EOS]); without it the model gets ``len(vocab)``.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
from torch import nn

from world_model.models.baseline import BaselineModel
from world_model.models.baseline_config import BaselineConfig
from world_model.models.checkpoint import CheckpointError, read_config_dict, resolve_folder
from world_model.models.decoding import load_known_sentences
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.text.vocab import Vocabulary

MODEL_TYPES: dict[str, tuple[type, type]] = {
    "four_tensor": (FourTensorConfig, FourTensorModel),
    "baseline": (BaselineConfig, BaselineModel),
}
DEFAULT_MODEL_TYPE = "four_tensor"
# Config fields that come from the data, never from a config file.
DATA_FIELDS = ("vocab_size", "content_vocab_size", "padding_idx", "unknown_idx")


def model_classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of a registered type; a ValueError naming the known types otherwise."""
    try:
        return MODEL_TYPES[model_type]
    except KeyError:
        raise ValueError(f"unknown model type {model_type!r}; known types: {sorted(MODEL_TYPES)}") from None


def model_vocab_size(model_type: str, vocab) -> int:
    """Embedding-table size the model of `model_type` needs for `vocab`: its ``vocab_size_for`` hook or len(vocab)."""
    _, model_class = model_classes(model_type)
    hook = getattr(model_class, "vocab_size_for", None)
    return int(hook(vocab)) if hook is not None else len(vocab)


def build_model(model_section: dict[str, Any], vocab_size: int) -> nn.Module:
    """A freshly initialised model from a config file's ``model:`` section ({"type": ..., hyper-parameters}).

    The caller seeds the RNG first if the initial weights must be reproducible.
    """
    section = dict(model_section)
    model_type = section.pop("type", DEFAULT_MODEL_TYPE)
    config_class, model_class = model_classes(model_type)
    data_keys = [k for k in DATA_FIELDS if k in section]
    if data_keys:
        raise ValueError(f"model section must not set {data_keys}: they come from the vocabulary")
    try:
        config = config_class.from_vocabulary(vocab_size, **section)
    except TypeError as err:  # unknown keyword
        raise ValueError(f"bad model section for type {model_type!r}: {err}") from err
    return model_class(config)


def load_model(name_or_path: str | os.PathLike, device: str = "cpu") -> nn.Module:
    """Load a checkpoint folder written by ``save_pretrained``, whatever its registered model type."""
    folder = resolve_folder(name_or_path)
    model_type = read_config_dict(folder).get("model_type")
    if model_type is None:
        raise CheckpointError(f"{folder}/config.json has no 'model_type'; known types: {sorted(MODEL_TYPES)}")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"{folder}/config.json has model_type {model_type!r}; known types: {sorted(MODEL_TYPES)}")
    _, model_class = MODEL_TYPES[model_type]
    return model_class.from_pretrained(folder, device=device)


class Predictor(NamedTuple):
    """A predictor checkpoint as the pipeline uses it."""

    model: nn.Module
    vocab: Vocabulary
    known_sentences: torch.Tensor | None  # (C, N) the closed set of known_sentences.txt, or None


def load_predictor(name_or_path: str | os.PathLike, device: str = "cpu") -> Predictor:
    """A checkpoint folder (or hub id) with its vocabulary and, when it has them, its known sentences."""
    folder = resolve_folder(name_or_path)
    model = load_model(folder, device=device)
    vocab = Vocabulary.load(folder)
    try:
        known = load_known_sentences(folder, vocab, model.config.n_tokens)
    except ValueError as err:
        raise CheckpointError(str(err)) from err
    return Predictor(model, vocab, known)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""The rollout's models, loaded once per (name, device, options) and kept for the next run (the demo's requests)."""

from __future__ import annotations

from functools import lru_cache

from world_model.generation.readouts import Readout, resolve_readout
from world_model.models.registry import Predictor
from world_model.models.registry import load_predictor as load_predictor_folder


@lru_cache(maxsize=4)
def load_captioner(name: str, device: str | None, options: tuple):
    from encoders.captioner import HFCaptioner

    return HFCaptioner.from_pretrained(name, device=device, **dict(options))


@lru_cache(maxsize=4)
def load_renderer(name: str, device: str | None, options: tuple):
    from renderers.text_to_image import DiffusersRenderer

    return DiffusersRenderer.from_pretrained(name, device=device, **dict(options))


@lru_cache(maxsize=4)
def load_predictor(name: str, device: str) -> Predictor:
    """The predictor, its vocabulary and its known sentences (or None) from a checkpoint folder."""
    return load_predictor_folder(name, device=device)


@lru_cache(maxsize=4)
def load_readout(name: str, device: str, readout: str, coherence: bool = False) -> Readout:
    """How the predictor reads its states off (`world_model.generation.readouts.resolve_readout`), its bank
    ranked with the folder's coherence head when `coherence`; a bank is encoded once."""
    predictor = load_predictor(name, device)
    model = predictor.model
    coherence_for = model if coherence else None
    return resolve_readout(
        name, predictor.known_sentences, readout, predictor.vocab, model.config.n_tokens, coherence_for
    )

"""Captions -> a token window for the predictor, and predicted ids -> sentences."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from world_model.text.vocab import PAD_ID, SENTENCE_END_TOKENS, Vocabulary, tokenize


def as_state_sentence(caption: str) -> str:
    """A caption as the predictor's states look: stripped, ending in sentence-final punctuation.

    Captioners rarely end with a full stop, while every corpus sentence does; the full stop is added so
    the window looks like the states the predictor was trained on.
    """
    text = " ".join(caption.split())
    tokens = tokenize(text)
    if tokens and tokens[-1] not in SENTENCE_END_TOKENS:
        text += "."
    return text


@dataclass
class CaptionWindow:
    """The predictor's input built from the captions of a clip."""

    token_ids: torch.Tensor  # (1, T, N) the last T states, left-padded with empty states
    states: list[str]  # the T sentences the window holds ("" for an empty state)
    tokens: int  # caption tokens kept over all captions
    unknown: int  # of which outside the vocabulary
    unknown_words: list[str]  # distinct unknown words, in order of appearance

    @property
    def oov_rate(self) -> float:
        return self.unknown / self.tokens if self.tokens else 0.0


def caption_window(captions: list[str], vocab: Vocabulary, n_states: int, n_tokens: int) -> CaptionWindow:
    """Encode the last `n_states` captions into a (1, T, N) window; fewer are left-padded with empty states.

    Words outside the vocabulary become the unknown id and are counted: the out-of-vocabulary rate is
    over the captions' own tokens (not the added full stops), for all captions of the clip.
    """
    if not captions:
        raise ValueError("no captions to build a window from: the clip gave no frames")
    sentences = [as_state_sentence(c) for c in captions]
    ids = vocab.encode_batch(sentences, n=n_tokens)  # (len(captions), N)
    _, stats = vocab.encode_with_stats(captions, n=n_tokens)
    unknown_words = list(dict.fromkeys(w for s in sentences for w in tokenize(s) if w not in vocab))
    window = torch.full((n_states, n_tokens), PAD_ID, dtype=torch.long)
    kept = ids[-n_states:]
    window[n_states - len(kept) :] = kept
    states = [""] * (n_states - len(kept)) + sentences[-n_states:]
    return CaptionWindow(window[None], states, stats["tokens"], stats["unknown"], unknown_words)


def decode_states(ids: torch.Tensor, vocab: Vocabulary) -> list[str]:
    """Predicted states (S, N) -> S sentences, padding skipped."""
    return [vocab.decode(row) for row in ids]

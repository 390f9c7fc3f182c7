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
class CaptionState:
    """A run of consecutive captions that say the same sentence: one state of the clip."""

    caption: str  # the run's first caption, as the captioner wrote it
    first: int  # index of the run's first caption
    last: int  # index of its last caption (inclusive)

    @property
    def sentence(self) -> str:
        """The caption as the predictor's states look (`as_state_sentence`)."""
        return as_state_sentence(self.caption)


def caption_states(captions: list[str], merge: bool = True) -> list[CaptionState]:
    """Merge consecutive captions that are the same sentence up to case, spacing and the final full stop
    (equal `tokenize` tokens of their state sentences) into one state each, in order; with `merge` False,
    every caption is a state of its own.

    Near-identical frames give identical captions; merged, the predictor's window holds the clip's last
    distinct states instead of one state repeated.
    """
    states: list[CaptionState] = []
    for i, caption in enumerate(captions):
        if merge and states and tokenize(states[-1].sentence) == tokenize(as_state_sentence(caption)):
            states[-1].last = i
        else:
            states.append(CaptionState(caption, i, i))
    return states


@dataclass
class CaptionWindow:
    """The predictor's input built from the captions of a clip."""

    token_ids: torch.Tensor  # (1, T, N) the last T states, left-padded with empty states
    states: list[str]  # the T sentences the window holds ("" for an empty state)
    tokens: int  # caption tokens kept over all captions
    unknown: int  # of which outside the vocabulary
    unknown_words: list[str]  # distinct unknown words, in order of appearance
    cut: list[str]  # sentences longer than the N token slots, of which only the first N tokens are kept

    @property
    def oov_rate(self) -> float:
        return self.unknown / self.tokens if self.tokens else 0.0


def caption_window(captions: list[str], vocab: Vocabulary, n_states: int, n_tokens: int) -> CaptionWindow:
    """Encode the last `n_states` captions into a (1, T, N) window; fewer are left-padded with empty states.

    Words outside the vocabulary become the unknown id and are counted: the out-of-vocabulary rate is
    over the captions' own tokens (not the added full stops), for all captions given. Sentences with more
    than `n_tokens` tokens are cut to their first `n_tokens` and listed in `cut`.
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
    cut = [s for s in sentences if len(tokenize(s)) > n_tokens]
    return CaptionWindow(window[None], states, stats["tokens"], stats["unknown"], unknown_words, cut)


def decode_states(ids: torch.Tensor, vocab: Vocabulary) -> list[str]:
    """Predicted states (S, N) -> S sentences, padding skipped."""
    return [vocab.decode(row) for row in ids]

"""A word-level ``transformers`` tokenizer over a closed vocabulary (the synthetic world's sentences).

The offline captioner and renderer are trained from scratch on a world with a few dozen words, so a
subword tokenizer buys nothing. This one splits like ``world_model.text.vocab.tokenize`` (lower-cased words
and punctuation marks), maps each to its id, and decodes ``["the", "ball", "falls", "."]`` back to
``"the ball falls."``. It is a ``PreTrainedTokenizerFast``: ``save_pretrained`` writes
``tokenizer.json`` and ``AutoTokenizer.from_pretrained`` loads it with no project code.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from world_model.text.vocab import tokenize

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)  # ids 0, 1, 2, 3


def build_word_tokenizer(sentences: Iterable[str], model_max_length: int = 24) -> PreTrainedTokenizerFast:
    """A tokenizer whose vocabulary is the special tokens then every word of ``sentences``, sorted.

    Encoding adds no special tokens by itself; callers put ``bos_token``/``eos_token`` where their
    model wants them. Unknown words map to ``[UNK]``.
    """
    words = sorted({token for sentence in sentences for token in tokenize(sentence)})
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.normalizer = normalizers.Lowercase()
    # Same split as world_model.text.vocab.tokenize: words keep inner apostrophes/hyphens, other marks stand alone.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Split(Regex(r"[^\W_]+(?:['\-][^\W_]+)*|[^\w\s]|_"), behavior="isolated"),
        ]
    )
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins with spaces, " ." -> "."
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=True,
    )

"""Measures of a readout's predicted sentences against the true next ones, and the readouts compared.

Measures, for one predicted sentence per context:
- well-formed (bigrams, trigrams): ends with `.`, `!` or `?` and every token bigram (trigram), sentence start
  and end included, occurs in the training stories; the true next sentences' own shares show how often the
  test rejects real sentences it has not seen;
- word F1: overlap of the predicted and true word tokens (punctuation left out), as multisets; content-word
  F1 the same without the `COMMON_WORDS` most frequent tokens of the training stories ("he", "was", "to", ...);
- slot accuracy: the share of the true sentence's slots whose token the prediction has in the same slot
  (the token accuracy of L_S(4), for the chosen sentence);
- exact: the prediction is the true sentence; `in_bank` counts contexts whose true sentence is in the bank;
- repeats: over a 5-step rollout, the share of rollouts that predict a sentence already in the window or
  predicted before;
- restated: the share of predictions that restate a context sentence (70% or more of their distinct content words
  in one of them, `world_model.evaluation.coherence.restates`), beside the true next sentences' own share.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import torch

from world_model.evaluation.coherence import restatement_rate
from world_model.generation.bank_file import SentenceBank
from world_model.generation.sentence_bank import COHERENCE_WEIGHT, LENGTH_POWER, BankRanking, bank_rollout
from world_model.models.coherence_head import CoherenceHead
from world_model.models.generation_config import GenerationConfig
from world_model.text.vocab import PAD_ID, SENTENCE_END_TOKENS, Vocabulary, tokenize

EXAMPLES = 10  # fixed contexts shown side by side: every (contexts // EXAMPLES)-th one, from the first
ROLLOUT_STEPS = 5
COMMON_WORDS = 100  # the most frequent training tokens, left out of the content-word F1


def ngrams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    """The token n-grams of a sentence, with "<s>" before its first token and "</s>" after its last."""
    padded = ["<s>", *tokens, "</s>"]
    return list(zip(*(padded[i:] for i in range(n))))


def attested(sentences: list[str], n: int) -> set[tuple[str, ...]]:
    """Every token n-gram of the sentences (`ngrams`)."""
    return {gram for s in sentences for gram in ngrams(tokenize(s), n)}


def well_formed(tokens: list[str], grams: set[tuple[str, ...]], n: int) -> bool:
    """Ends with sentence-final punctuation and every n-gram (with start and end) is attested in `grams`."""
    return bool(tokens) and tokens[-1] in SENTENCE_END_TOKENS and all(g in grams for g in ngrams(tokens, n))


def word_f1(predicted: list[str], true: list[str], skip: frozenset[str] = frozenset()) -> float:
    """F1 of the word tokens (those with a letter or digit) of two sentences, as multisets, words in `skip` left out."""
    p, t = (Counter(w for w in ws if any(ch.isalnum() for ch in w) and w not in skip) for ws in (predicted, true))
    shared = sum((p & t).values())
    return 0.0 if shared == 0 else 2 * shared / (sum(p.values()) + sum(t.values()))


def predict(
    model,
    windows: torch.Tensor,
    readout: dict,
    vocab: Vocabulary,
    bank: SentenceBank | None,
    steps: int = 1,
    batch: int = 64,
    head: CoherenceHead | None = None,
) -> torch.Tensor:
    """Predicted states (S, steps, N) of windows (S, T, N), `batch` windows at a time. `readout` is {"kind":
    "tokens"} or {"kind": "bank", "names": bool, "guard": bool, "length_power": float}, and for a bank ranked with
    the coherence `head` also "coherence": its weight."""
    out = []
    with torch.no_grad():
        for start in range(0, len(windows), batch):
            w = windows[start : start + batch]
            if readout["kind"] == "tokens":
                out.append(model.rollout(w, steps, GenerationConfig(end_ids=vocab.end_ids)))
            else:
                options = {k: readout[k] for k in ("names", "guard", "length_power")}
                if "coherence" in readout:
                    options.update(coherence=head, coherence_weight=readout["coherence"])
                out.append(bank_rollout(model, w, steps, bank, BankRanking(**options)))
    return torch.cat(out)


def one_step_measures(
    predicted: torch.Tensor,
    true: torch.Tensor,
    vocab: Vocabulary,
    grams: dict[int, set],
    bank: SentenceBank | None,
    common: frozenset[str] = frozenset(),
    context: torch.Tensor | None = None,
) -> dict:
    """Shares over contexts of predicted states (S, N) against the true ones (S, N); with the context windows
    (S, T, N) also the share of predictions that restate one of their context sentences."""
    pred_tokens = [tokenize(vocab.decode(row)) for row in predicted]
    true_tokens = [tokenize(vocab.decode(row)) for row in true]
    live = true != PAD_ID
    exact = (predicted == true).all(dim=1)
    result = {
        **{
            f"well_formed_{n}grams": sum(well_formed(p, g, n) for p in pred_tokens) / len(pred_tokens)
            for n, g in grams.items()
        },
        "word_f1": sum(map(word_f1, pred_tokens, true_tokens)) / len(pred_tokens),
        "content_word_f1": sum(word_f1(p, t, common) for p, t in zip(pred_tokens, true_tokens)) / len(pred_tokens),
        "slot_accuracy": float(((predicted == true) & live).sum() / live.sum()),
        "exact": float(exact.float().mean()),
        "mean_tokens": sum(map(len, pred_tokens)) / len(pred_tokens),
    }
    if context is not None:
        sentences = [[tokenize(vocab.decode(row)) for row in window] for window in context]
        result["restated"] = restatement_rate(pred_tokens, sentences, common)
    if bank is not None:
        in_bank = torch.isin((true * bank.hash_weights).sum(dim=1), bank.hashes)  # hash match; exact below
        in_bank &= torch.tensor(
            [
                bool((bank.candidates[bank.hashes == h] == row).all(dim=1).any())
                for h, row in zip((true * bank.hash_weights).sum(dim=1), true)
            ]
        )
        result["in_bank"] = int(in_bank.sum())
        result["retrieved_when_in_bank"] = float(exact[in_bank].float().mean()) if in_bank.any() else None
    return result


def repeat_share(windows: torch.Tensor, rollouts: torch.Tensor) -> float:
    """Share of rollouts (S, steps, N) that predict a state already in their window (S, T, N) or predicted
    before (empty states aside)."""
    repeats = 0
    for window, states in zip(windows, rollouts):
        seen = {tuple(row) for row in window.tolist() if any(row)}
        for row in map(tuple, states.tolist()):
            if row in seen:
                repeats += 1
                break
            seen.add(row)
    return repeats / len(windows)


def timed(fn, *args):
    """(fn(*args), its wall-clock seconds)."""
    start = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - start


def evaluate(
    model,
    vocab,
    windows,
    true,
    bank,
    one_step: dict[str, dict],
    rollouts: dict[str, dict],
    grams,
    rollout_contexts: int,
    common: frozenset[str] = frozenset(),
    head: CoherenceHead | None = None,
) -> dict[str, dict]:
    """One-step measures and timing for the `one_step` readouts, and the repeat share of 5-step rollouts on the
    first `rollout_contexts` contexts for the `rollouts` readouts (`head` for those ranked with it)."""
    results = {}
    singles = [windows[i : i + 1] for i in range(min(20, len(windows)))]  # one at a time, as a rollout asks
    for name, readout in one_step.items():
        predicted, seconds = timed(lambda r=readout: predict(model, windows, r, vocab, bank, head=head))
        predicted = predicted[:, 0]
        _, single = timed(lambda r=readout: [predict(model, w, r, vocab, bank, head=head) for w in singles])
        results[name] = {
            **readout,
            **one_step_measures(predicted, true, vocab, grams, bank, common, windows),
            "ms_per_prediction_batched": round(1000 * seconds / len(windows), 2),
            "ms_per_prediction_one_at_a_time": round(1000 * single / len(singles), 2),
        }
        print(name, json.dumps(results[name]), flush=True)
    for name, readout in rollouts.items():
        states = predict(model, windows[:rollout_contexts], readout, vocab, bank, steps=ROLLOUT_STEPS, head=head)
        results.setdefault(name, dict(readout))["rollout_repeat_share"] = repeat_share(
            windows[:rollout_contexts], states
        )
        results[name]["rollout_well_formed_3grams"] = (
            sum(well_formed(tokenize(vocab.decode(r)), grams[3], 3) for r in states.flatten(0, 1))
            / states[..., 0].numel()
        )
        print(name, json.dumps(results[name]), flush=True)
    generator = torch.Generator().manual_seed(0)
    if bank is not None:  # a floor: a random bank sentence for every context
        random_rows = bank.candidates[torch.randint(len(bank.candidates), (len(windows),), generator=generator)]
        results["random bank sentence"] = one_step_measures(random_rows, true, vocab, grams, None, common, windows)
    results["true next sentence"] = one_step_measures(true, true, vocab, grams, None, common, windows)
    return results


def fixed_examples(model, vocab, bank, stories, windows: torch.Tensor, head: CoherenceHead | None = None) -> list[dict]:
    """The per-slot and the bank readout side by side for every (contexts // EXAMPLES)-th context (S, 5, N), and
    the bank ranked with the coherence `head` when there is one."""
    rows = list(range(0, len(windows), max(1, len(windows) // EXAMPLES)))[:EXAMPLES]
    context = windows[rows, :4]
    tokens = predict(model, context, {"kind": "tokens"}, vocab, bank)[:, 0]
    banked = predict(model, context, next(iter(bank_readouts().values())), vocab, bank)[:, 0]
    examples = [
        {
            "index": i,
            "context": list(stories[i].sentences[:4]),
            "tokens": vocab.decode(t),
            "bank": vocab.decode(b),
            "true": stories[i].sentences[4],
        }
        for i, t, b in zip(rows, tokens, banked)
    ]
    if head is not None:
        coherent = next(iter(bank_readouts(coherence=(COHERENCE_WEIGHT,)).values()))
        for example, row in zip(examples, predict(model, context, coherent, vocab, bank, head=head)[:, 0]):
            example["bank_coherence"] = vocab.decode(row)
    return examples


def bank_readouts(names_options=(True,), powers=(LENGTH_POWER,), guards=(True,), coherence=(None,)) -> dict[str, dict]:
    """The bank readouts of every combination of the settings; a coherence weight of None ranks without the head."""
    return {
        f"bank (names {'on' if n else 'off'}, length power {p}, guard {'on' if g else 'off'}"
        + ("" if c is None else f", coherence {c:g}")
        + ")": {"kind": "bank", "names": n, "guard": g, "length_power": p, **({} if c is None else {"coherence": c})}
        for n in names_options
        for p in powers
        for g in guards
        for c in coherence
    }


def training_statistics(corpus) -> tuple[dict, frozenset[str]]:
    """The n-grams (n = 2, 3) attested in the training sentences and their `COMMON_WORDS` commonest words."""
    train_sentences = [s for story in corpus.train for s in story.sentences]
    counts = Counter(t for s in train_sentences for t in tokenize(s))
    return {n: attested(train_sentences, n) for n in (2, 3)}, frozenset(t for t, _ in counts.most_common(COMMON_WORDS))

"""Readability of a predictor's next sentences, per readout: the paper's per-slot tokens against the sentence bank.

    python -m world_model.evaluation.readout_eval --checkpoint world_model/pretrained/rocstories-cpu \
        --data ../shared/data/rocstories --out results/readout
    python -m world_model.evaluation.readout_eval --checkpoint ... --data ... --out results/readout --select

The first scores the 3,742 cloze contexts (sentences 1-4; the right ending is the true next sentence) with
the checkpoint's own bank. `--select` chooses the bank's settings on training stories instead: the last
`--heldout` training stories are the contexts and a bank is built from the others, so no validation story
and no true next sentence is in it. Each writes `results.json` / `selection.json` and a Markdown table.

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

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from world_model.data.rocstories import encode_windows, load_corpus
from world_model.evaluation.coherence import restatement_rate
from world_model.generation.sentence_bank import (
    COHERENCE_WEIGHT,
    LENGTH_POWER,
    SentenceBank,
    bank_rollout,
    distinct_sentences,
    find_names,
    load_bank,
)
from world_model.models.coherence_head import CoherenceHead, load_coherence_head
from world_model.models.generation_config import GenerationConfig
from world_model.models.registry import load_predictor
from world_model.text.vocab import PAD_ID, SENTENCE_END_TOKENS, Vocabulary, tokenize
from world_model.utils.cli import SettingsParser, UsageError, add_verbose, check_writable, run_command

EXAMPLES = 10  # fixed contexts shown side by side: every (contexts // EXAMPLES)-th one, from the first
ROLLOUT_STEPS = 5
COHERENCE_WEIGHTS = (0.03, 0.1, 0.3, 1.0, 3.0)  # the coherence head's weights --select --coherence compares
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
                out.append(bank_rollout(model, w, steps, bank, **options))
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


def markdown(title: str, command: str, results: dict, examples: list[dict] | None) -> str:
    """The results as a Markdown table (and the fixed examples side by side, when given)."""

    def cell(r: dict, key: str, fmt: str = ".3f") -> str:
        return "" if r.get(key) is None else format(r[key], fmt)

    lines = [
        f"# {title}",
        "",
        "```",
        command,
        "```",
        "",
        "| readout | well-formed (bigrams / trigrams) | word F1 | content-word F1 | restated | slot accuracy | exact | "
        "mean tokens | true in bank | retrieved when in bank | ms / prediction (batched / one) | "
        "5-step rollouts with a repeat |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        formed = f"{cell(r, 'well_formed_2grams')} / {cell(r, 'well_formed_3grams')}" if "word_f1" in r else ""
        speed = f"{cell(r, 'ms_per_prediction_batched', '.1f')} / {cell(r, 'ms_per_prediction_one_at_a_time', '.1f')}"
        lines.append(
            " | ".join(
                [
                    "",
                    name,
                    formed,
                    cell(r, "word_f1"),
                    cell(r, "content_word_f1"),
                    cell(r, "restated"),
                    cell(r, "slot_accuracy"),
                    cell(r, "exact", ".4f"),
                    cell(r, "mean_tokens", ".1f"),
                    cell(r, "in_bank", "d"),
                    cell(r, "retrieved_when_in_bank"),
                    speed if "ms_per_prediction_batched" in r else "",
                    cell(r, "rollout_repeat_share"),
                    "",
                ]
            ).strip()
        )
    return "\n".join(lines + ([""] + examples_markdown(examples) if examples else [])) + "\n"


def examples_markdown(examples: list[dict]) -> list[str]:
    coherent = "bank_coherence" in examples[0]
    lines = [
        "## Ten fixed contexts",
        "",
        "| # | context (sentences 1-4) | per-slot readout | bank readout | "
        + ("bank readout with the coherence head | " if coherent else "")
        + "true next sentence |",
        "|---:|---|---|---|---|" + ("---|" if coherent else ""),
    ]
    return lines + [
        f"| {e['index']} | {' '.join(e['context'])} | {e['tokens']} | {e['bank']} | "
        + (f"{e['bank_coherence']} | " if coherent else "")
        + f"{e['true']} |"
        for e in examples
    ]


@dataclass
class ReadoutEvalSettings:
    """Which predictor's readouts are measured on which stories, and where the report goes."""

    checkpoint: str = field(metadata={"help": "predictor folder (with sentence_bank.json.gz unless --select)"})
    data: str = field(metadata={"help": "ROCStories folder"})
    out: str = field(metadata={"help": "folder for results.json / selection.json and .md"})
    select: bool = field(default=False, metadata={"help": "choose settings on held-out training stories"})
    heldout: int = field(default=1000, metadata={"help": "training stories held out with --select"})
    rollout_contexts: int = field(default=1000, metadata={"help": "contexts rolled out 5 steps"})
    contexts: int | None = field(default=None, metadata={"help": "only the first K cloze contexts (default: all)"})
    coherence: bool = field(
        default=False,
        metadata={
            "help": "also the bank ranked with the folder's coherence head (with --select: only the bank, guarded, "
            "without and with each weight of the head)"
        },
    )
    examples_only: bool = field(
        default=False,
        metadata={"help": "write only the ten fixed examples (examples.json, examples.md), without the measures"},
    )

    def __post_init__(self) -> None:
        for name in ("heldout", "rollout_contexts", "contexts"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


def main(argv: list[str] | None = None) -> int:
    parser = SettingsParser(
        ReadoutEvalSettings, prog="python -m world_model.evaluation.readout_eval", description=__doc__.split("\n\n")[0]
    )
    add_verbose(parser)
    settings, args = parser.parse(argv)
    command = "python -m world_model.evaluation.readout_eval " + " ".join(argv if argv is not None else sys.argv[1:])
    return run_command(lambda: readout_command(settings, command), verbose=args.verbose)


def readout_command(settings: ReadoutEvalSettings, command: str) -> None:
    """The command's work (see the module docstring); a UsageError for a checkpoint without a sentence bank (or
    without a coherence head, with --coherence)."""
    check_writable(settings.out)
    model, vocab, _ = load_predictor(settings.checkpoint)
    model.eval()
    corpus = load_corpus(settings.data)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    bank = None if settings.select else load_bank(settings.checkpoint, vocab, model.config.n_tokens)
    if bank is None and not settings.select:
        raise UsageError(
            f"{settings.checkpoint} has no sentence bank; build one with python -m world_model.generation.sentence_bank"
        )
    head = load_coherence_head(settings.checkpoint, model) if settings.coherence else None
    if settings.coherence and head is None:
        raise UsageError(
            f"{settings.checkpoint} has no coherence head; train one with python -m world_model.training.coherence"
        )
    if settings.examples_only:
        windows = encode_windows(corpus.validation, vocab, model.config.n_tokens)
        examples = fixed_examples(model, vocab, bank, corpus.validation, windows, head)
        (out / "examples.json").write_text(json.dumps({"command": command, "examples": examples}, indent=2) + "\n")
        (out / "examples.md").write_text("\n".join([f"```\n{command}\n```", "", *examples_markdown(examples)]) + "\n")
    elif settings.select:
        select_settings(model, vocab, corpus, settings, command, out, head)
    else:
        measure_readouts(model, vocab, corpus, bank, settings, command, out, head)


def training_statistics(corpus) -> tuple[dict, frozenset[str]]:
    """The n-grams (n = 2, 3) attested in the training sentences and their `COMMON_WORDS` commonest words."""
    train_sentences = [s for story in corpus.train for s in story.sentences]
    counts = Counter(t for s in train_sentences for t in tokenize(s))
    return {n: attested(train_sentences, n) for n in (2, 3)}, frozenset(t for t, _ in counts.most_common(COMMON_WORDS))


def select_settings(model, vocab, corpus, settings: ReadoutEvalSettings, command: str, out: Path, head=None) -> None:
    """`--select`: every bank setting scored on the last `--heldout` training stories, with a bank built from the
    others; writes selection.json and selection.md (with a coherence `head`: the guarded bank without and with each
    weight of COHERENCE_WEIGHTS, coherence_selection.json and .md)."""
    grams, common = training_statistics(corpus)
    n_tokens = model.config.n_tokens
    kept, heldout = corpus.train[: -settings.heldout], corpus.train[-settings.heldout :]
    sentences = distinct_sentences([s for story in kept for s in story.sentences], n_tokens)
    bank = SentenceBank.encode(sentences, find_names(sentences), vocab, n_tokens)
    windows = encode_windows(heldout, vocab, n_tokens)
    grid = bank_readouts(names_options=(False, True), powers=(0.0, 0.5, 1.0, 1.5, 2.0), guards=(False,))
    guarded = bank_readouts(powers=(LENGTH_POWER,), guards=(True,))
    one_step = {"tokens": {"kind": "tokens"}, **grid}
    rollouts = {"tokens": {"kind": "tokens"}, **guarded, **bank_readouts(guards=(False,))}
    name = "selection"
    if head is not None:
        one_step, rollouts, name = bank_readouts(coherence=(None, *COHERENCE_WEIGHTS)), {}, "coherence_selection"
    report = evaluate(
        model,
        vocab,
        windows[:, :4],
        windows[:, 4],
        bank,
        one_step,
        rollouts,
        grams,
        settings.rollout_contexts,
        common,
        head,
    )
    payload = {
        "command": command,
        "contexts": len(heldout),
        "bank_sentences": len(sentences),
        "rollout_contexts": settings.rollout_contexts,
        "results": report,
    }
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    title = (
        f"Readout settings chosen on {len(heldout)} held-out training stories (bank: the other "
        f"{len(corpus.train) - len(heldout)} stories' {len(sentences)} sentences)"
    )
    (out / f"{name}.md").write_text(markdown(title, command, report, None))


def measure_readouts(
    model, vocab, corpus, bank: SentenceBank, settings: ReadoutEvalSettings, command: str, out: Path, head=None
):
    """The per-slot and bank readouts on the cloze contexts (and the bank ranked with the coherence `head`, at
    COHERENCE_WEIGHT, when one is given); writes results.json and results.md."""
    grams, common = training_statistics(corpus)
    windows = encode_windows(corpus.validation[: settings.contexts], vocab, model.config.n_tokens)
    coherent = {} if head is None else bank_readouts(coherence=(COHERENCE_WEIGHT,))
    one_step = {"tokens": {"kind": "tokens"}, **bank_readouts(), **coherent}
    rollouts = {**one_step, **bank_readouts(guards=(False,))}
    report = evaluate(
        model,
        vocab,
        windows[:, :4],
        windows[:, 4],
        bank,
        one_step,
        rollouts,
        grams,
        settings.rollout_contexts,
        common,
        head,
    )
    examples = fixed_examples(model, vocab, bank, corpus.validation, windows, head)
    payload = {
        "command": command,
        "contexts": len(windows),
        "bank_sentences": len(bank.candidates),
        "rollout_contexts": settings.rollout_contexts,
        "results": report,
        "examples": examples,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    title = f"Readouts of {settings.checkpoint} on the {len(windows)} cloze contexts"
    (out / "results.md").write_text(markdown(title, command, report, examples))


if __name__ == "__main__":
    sys.exit(main())

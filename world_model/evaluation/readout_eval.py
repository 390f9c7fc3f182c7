"""Readability of a predictor's next sentences, per readout: the paper's per-slot tokens against the sentence bank.

    python -m world_model.evaluation.readout_eval --checkpoint world_model/pretrained/rocstories-cpu \
        --data ../shared/data/rocstories --out results/readout
    python -m world_model.evaluation.readout_eval --checkpoint ... --data ... --out results/readout --select

The first scores the 3,742 cloze contexts (sentences 1-4; the right ending is the true next sentence) with
the checkpoint's own bank. `--select` chooses the bank's settings on training stories instead: the last
`--heldout` training stories are the contexts and a bank is built from the others, so no validation story
and no true next sentence is in it. Each writes `results.json` / `selection.json` and a Markdown table.
The measures are those of `world_model.evaluation.readout_metrics`.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import sys
from dataclasses import dataclass, field
from pathlib import Path

from world_model.data.rocstories import encode_windows, load_corpus
from world_model.evaluation.readout_metrics import bank_readouts, evaluate, fixed_examples, training_statistics
from world_model.generation.bank_file import SentenceBank, distinct_sentences, find_names, load_bank
from world_model.generation.sentence_bank import COHERENCE_WEIGHT, LENGTH_POWER
from world_model.models.coherence_head import load_coherence_head
from world_model.models.registry import load_predictor
from world_model.utils.cli import UsageError, check_output
from world_model.utils.files import write_json_atomic, write_text_atomic
from world_model.utils.flags import settings_main

COHERENCE_WEIGHTS = (0.03, 0.1, 0.3, 1.0, 3.0)  # the coherence head's weights --select --coherence compares


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
    return settings_main(
        ReadoutEvalSettings, "world_model.evaluation.readout_eval", __doc__.split("\n\n")[0], readout_command, argv
    )


def readout_command(settings: ReadoutEvalSettings, command: str) -> None:
    """The command's work (see the module docstring); a UsageError for a checkpoint without a sentence bank (or
    without a coherence head, with --coherence)."""
    # a report folder: each mode replaces its own files
    check_output(settings.out, "--out", {"checkpoint": settings.checkpoint}, overwrite=True)
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
        write_json_atomic(out / "examples.json", {"command": command, "examples": examples})
        write_text_atomic(
            out / "examples.md", "\n".join([f"```\n{command}\n```", "", *examples_markdown(examples)]) + "\n"
        )
    elif settings.select:
        select_settings(model, vocab, corpus, settings, command, out, head)
    else:
        measure_readouts(model, vocab, corpus, bank, settings, command, out, head)


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
    write_json_atomic(out / f"{name}.json", payload)
    title = (
        f"Readout settings chosen on {len(heldout)} held-out training stories (bank: the other "
        f"{len(corpus.train) - len(heldout)} stories' {len(sentences)} sentences)"
    )
    write_text_atomic(out / f"{name}.md", markdown(title, command, report, None))


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
    write_json_atomic(out / "results.json", payload)
    title = f"Readouts of {settings.checkpoint} on the {len(windows)} cloze contexts"
    write_text_atomic(out / "results.md", markdown(title, command, report, examples))


if __name__ == "__main__":
    sys.exit(main())

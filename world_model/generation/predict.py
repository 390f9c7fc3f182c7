"""Predict the next sentences of a story with a trained predictor (the semantic layer of the pipeline).

    python -m world_model.generation.predict "Tom was hungry." "He went to the kitchen." --steps 3
    python -m world_model.generation.predict --checkpoint DIR --samples 3 --temperature 0.8 --seed 1 "..." "..."
    python -m world_model.generation.predict --checkpoint offline_pack/predictor --steps 3 \
        "the elevator waits on floor two with its doors open." "the elevator closes its doors on floor two."

The sentences are the observed states, oldest first; the last T of them form the window (fewer are
left-padded with empty states). The default checkpoint is the ROCStories predictor shipped with the
project. A checkpoint folder with known_sentences.txt predicts one of those sentences per step (the closed-set
readout of `world_model.models.decoding`), one with sentence_bank.json.gz one of its bank's sentences, with the
window's names (`world_model.generation.sentence_bank`; the shipped predictor has one), unless `--readout tokens` is given
(the paper's per-slot readout).
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from world_model.generation.explain import describe_slice, explain_lines, probability_text, step_records
from world_model.generation.readouts import resolve_readout
from world_model.models.generation_config import GenerationConfig
from world_model.models.registry import load_predictor
from world_model.text.vocab import tokenize
from world_model.text.windows import caption_window, decode_states
from world_model.utils.flags import SettingsParser, add_verbose, settings_main

SHIPPED_CHECKPOINT = Path(__file__).resolve().parents[1] / "pretrained" / "rocstories-cpu"
MAX_STEPS = 64  # predicted sentences (or states) per request, of the text and the video commands alike
MAX_SAMPLES = 16  # alternative futures per request


@dataclass
class PredictSettings:
    """Which predictor the command asks, and for how many sentences."""

    checkpoint: str = field(
        default=str(SHIPPED_CHECKPOINT), metadata={"help": "predictor folder (default: the shipped one)"}
    )
    steps: int = field(default=1, metadata={"help": f"sentences to predict (default 1, at most {MAX_STEPS})"})


def predict(
    sentences: list[str],
    checkpoint: str | Path = SHIPPED_CHECKPOINT,
    steps: int = 1,
    generation: GenerationConfig | None = None,
) -> dict:
    """The predicted next `steps` sentences for each sample, with the window and its unknown words; `generation`
    (default greedy) as in `world_model.models.generation_config`, its readout as in
    `world_model.generation.readouts.resolve_readout`. Raises ValueError for an empty sentence or `steps` /
    samples outside 1..MAX_STEPS / 1..MAX_SAMPLES; `warnings` names sentences cut to the slot count. With
    `generation.explanations` (the default), `explanations` holds per future the per-step records of
    `world_model.generation.explain` (None for a model that cannot explain)."""
    generation = generation or GenerationConfig()
    check_request(sentences, steps, generation.samples)
    model, vocab, known = load_predictor(checkpoint)
    c = model.config
    coherence_for = model if generation.coherence else None
    chosen = resolve_readout(checkpoint, known, generation.readout, vocab, c.n_tokens, coherence_for)
    window = caption_window(sentences, vocab, c.n_states, c.n_tokens)
    warnings = [
        f"sentence {i} has {n} tokens; the predictor reads only its first {c.n_tokens}"
        for i, n in enumerate((len(tokenize(s)) for s in sentences), 1)
        if n > c.n_tokens
    ]
    seen = [] if generation.explanations else None
    futures = chosen.futures(model, vocab, window.token_ids, steps, generation, seen)
    return {
        "checkpoint": str(checkpoint),
        "readout": chosen.kind,
        "coherence": generation.coherence,
        "window": window.states,
        "unknown_words": window.unknown_words,
        "predictions": [decode_states(ids, vocab) for ids in futures],
        "explanations": [
            step_records(steps_seen, ids, window.states, len(sentences), vocab) if steps_seen else None
            for ids, steps_seen in zip(futures, seen or [None] * len(futures))
        ],
        "warnings": warnings,
    }


def check_request(sentences: list[str], steps: int, samples: int) -> None:
    """Refuse empty sentences and unbounded work before loading anything."""
    if not sentences:
        raise ValueError("give at least one observed sentence")
    for i, sentence in enumerate(sentences, 1):
        if not any(ch.isalnum() for ch in sentence):
            raise ValueError(f"sentence {i} is empty: every observed sentence needs at least one word")
    check_horizon(steps, samples)


def check_horizon(steps: int, samples: int = 1, error: type[ValueError] = ValueError) -> None:
    """An `error` unless `steps` is 1 to `MAX_STEPS` and `samples` 1 to `MAX_SAMPLES`: the one rule of how far and
    how wide a request predicts, for the text and the video commands."""
    if not 1 <= steps <= MAX_STEPS:
        raise error(f"--steps must be between 1 and {MAX_STEPS}, got {steps}")
    if not 1 <= samples <= MAX_SAMPLES:
        raise error(f"--samples must be between 1 and {MAX_SAMPLES}, got {samples}")


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        (GenerationConfig, PredictSettings),
        "world_model.generation.predict",
        __doc__.split("\n\n")[0],
        predict_command,
        argv,
        arguments=add_sentences_and_switches,
        usage_on_bad_setting=False,
    )


def add_sentences_and_switches(parser: SettingsParser) -> None:
    """The command's arguments beside its settings: the sentences, --json, --verbose and --explain."""
    parser.add_argument("sentences", nargs="+", help="observed sentences, oldest first")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_verbose(parser)
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print under each predicted sentence its probability, the likeliest alternatives and the observed "
        "sentence it drew on most (the JSON holds them either way)",
    )


def predict_command(
    generation: GenerationConfig, settings: PredictSettings, args: argparse.Namespace, command: str
) -> None:
    """The command's work: predict from the sentences, then print the result."""
    result = predict(args.sentences, settings.checkpoint, settings.steps, generation)
    print_prediction(result, args.json, args.explain)


def print_prediction(result: dict, as_json: bool, explain: bool = False) -> None:
    """The command's output: warnings on stderr, then the result as JSON or as lines of text."""
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    for state in result["window"]:
        print(f"  observed: {state or '(empty)'}")
    if result["unknown_words"]:
        print(f"  not in the vocabulary: {', '.join(result['unknown_words'])}")
    for k, (future, explained) in enumerate(zip(result["predictions"], result["explanations"])):
        for step, sentence in enumerate(future, 1):
            label = "predicted" if len(result["predictions"]) == 1 else f"sample {k + 1}"
            if explain and explained:
                record = explained[step - 1]
                print(f"{label} +{step}: {sentence}  (p={probability_text(record['probability'])})")
                print("\n".join(explain_lines(record, describe_slice)))
            else:
                print(f"{label} +{step}: {sentence}")


if __name__ == "__main__":
    sys.exit(main())

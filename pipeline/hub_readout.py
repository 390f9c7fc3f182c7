"""Which readout the hub preset's predictor uses, chosen by measurement on BLIP-style caption sequences.

    python -m pipeline.hub_readout --out results/hub_readout [--sequences configs/pipeline/blip_style_sequences.jsonl]

The sequences (one JSON object a line: {"id", "captions"}, captions as BLIP base writes them: present-tense noun
phrases of everyday scenes) are shuffled with `SPLIT_SEED` and cut in two halves: every readout of `READOUTS` is
measured on the first ("choose"), the one `choose` picks is reported on the second ("report"). For each sequence the
preset's predictor reads the captions (as the rollout's states) and predicts one sentence:

    well_formed share of predictions ending a sentence whose every word pair is attested in the predictor's
                sentence bank (`world_model.evaluation.readout_metrics.well_formed`, bigrams): sentences of its
                training stories pass, a free per-slot readout's "the was to the the." does not
    distinct    distinct step-1 predictions / sequences of the half (the same sentence for every clip is 1 / n)
    on_topic    share of predictions sharing a content word with their captions (a word outside the predictor's
                `COMMON_WORDS` commonest, as `world_model.evaluation.coherence.content_words` counts them)
    restated    share of predictions that restate one caption (`world_model.evaluation.coherence.restates`)

`choose`: among the readouts whose predictions are at least `MIN_WELL_FORMED` well formed, the highest on_topic of
those with distinct >= `MIN_DISTINCT` (ties: the lower restated), else the highest on_topic + distinct.
results.json and results.md hold both halves' measures, the choice and the command.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.presets import PROJECT_ROOT, load_preset
from world_model.utils.cli import check_output
from world_model.utils.files import atomic_dir, repo_path
from world_model.utils.flags import settings_main

SEQUENCES = PROJECT_ROOT / "configs" / "pipeline" / "blip_style_sequences.jsonl"
READOUTS = {  # name -> (readout, coherence)
    "bank": ("bank", False),
    "bank + coherence head": ("bank", True),
    "tokens": ("tokens", False),
}
SPLIT_SEED = 0
MIN_DISTINCT = 0.9
MIN_WELL_FORMED = 0.9
COMMON_WORDS = 100  # as readout_metrics: the predictor vocabulary's commonest words are not content words


def read_sequences(path: Path) -> list[dict]:
    """The sequences of `path`: a ValueError naming a line without an id and a non-empty list of captions."""
    sequences = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        entry = json.loads(line)
        if not (isinstance(entry.get("id"), str) and entry.get("captions") and all(entry["captions"])):
            raise ValueError(f"{path}, line {number}: needs an id and a non-empty list of captions")
        sequences.append(entry)
    return sequences


def halves(sequences: list[dict], seed: int = SPLIT_SEED) -> tuple[list[dict], list[dict]]:
    """(choose, report): the sequences shuffled with `seed` and cut in two."""
    order = sorted(sequences, key=lambda s: s["id"])
    random.Random(seed).shuffle(order)
    middle = len(order) // 2
    return order[:middle], order[middle:]


def measure(predictions: list[str], captions: list[list[str]], common: frozenset[str], grams: set) -> dict:
    """well_formed, distinct, on_topic and restated (module docstring) of one readout's step-1 predictions;
    `grams` the attested bigrams."""
    from world_model.evaluation.coherence import content_words, restates
    from world_model.evaluation.readout_metrics import well_formed
    from world_model.text.vocab import tokenize

    topics = [
        bool(content_words(tokenize(p), common) & set().union(*(content_words(tokenize(c), common) for c in caps)))
        for p, caps in zip(predictions, captions)
    ]
    restated = [restates(tokenize(p), [tokenize(c) for c in caps], common) for p, caps in zip(predictions, captions)]
    formed = [well_formed(tokenize(p), grams, 2) for p in predictions]
    n = len(predictions)
    return {
        "well_formed": sum(formed) / n,
        "distinct": len(set(predictions)) / n,
        "on_topic": sum(topics) / n,
        "restated": sum(restated) / n,
    }


def choose(measures: dict[str, dict]) -> str:
    """The readout the rule of the module docstring picks from `measures` (name -> measure)."""
    formed = {name: m for name, m in measures.items() if m["well_formed"] >= MIN_WELL_FORMED} or measures
    wide = {name: m for name, m in formed.items() if m["distinct"] >= MIN_DISTINCT}
    if wide:
        return max(wide, key=lambda name: (wide[name]["on_topic"], -wide[name]["restated"]))
    return max(
        formed, key=lambda name: (formed[name]["on_topic"] + formed[name]["distinct"], -formed[name]["restated"])
    )


def attested_pairs(sentences: list[str]) -> set:
    """The word pairs (bigrams, with sentence start and end) of `sentences`."""
    from world_model.evaluation.readout_metrics import attested

    return attested(sentences, 2)


def bank_sentences(folder: str | Path) -> list[str]:
    """The sentences of a predictor folder's sentence bank ([] without one)."""
    import gzip

    from world_model.generation.bank_file import BANK_NAME

    path = Path(folder) / BANK_NAME
    return json.loads(gzip.decompress(path.read_bytes()))["sentences"] if path.is_file() else []


def predictions_of(checkpoint: str, sequences: list[dict], readout: str, coherence: bool) -> list[str]:
    """The step-1 prediction of every sequence under one readout (greedy)."""
    from world_model.generation.predict import predict
    from world_model.models.generation_config import GenerationConfig
    from world_model.text.windows import caption_states

    generation = GenerationConfig(readout=readout, coherence=coherence, explanations=False)
    out = []
    for entry in sequences:
        states = [state.caption for state in caption_states(entry["captions"])]
        out.append(predict(states, checkpoint, 1, generation)["predictions"][0][0])
    return out


def hub_readout(sequences_path: Path, preset: str = "hub") -> dict:
    """Both halves measured under every readout, and the choice."""
    from world_model.models.registry import load_predictor

    checkpoint = load_preset(preset).predictor
    _, vocab, _ = load_predictor(checkpoint)
    common = frozenset(vocab.itos[2 : 2 + COMMON_WORDS])  # after padding and the unknown word, by frequency
    grams = attested_pairs(bank_sentences(checkpoint))
    sequences = read_sequences(sequences_path)
    parts = dict(zip(("choose", "report"), halves(sequences)))
    result = {"predictor": repo_path(checkpoint), "sequences": len(sequences), "halves": {}}
    for part, members in parts.items():
        rows = {}
        for name, (readout, coherence) in READOUTS.items():
            predicted = predictions_of(checkpoint, members, readout, coherence)
            rows[name] = {
                **measure(predicted, [m["captions"] for m in members], common, grams),
                "examples": [{"id": m["id"], "predicted": p} for m, p in zip(members[:5], predicted[:5])],
            }
        result["halves"][part] = {"ids": [m["id"] for m in members], "readouts": rows}
    chosen = choose(result["halves"]["choose"]["readouts"])
    readout, coherence = READOUTS[chosen]
    result["chosen"] = {"name": chosen, "readout": readout, "coherence": coherence}
    return result


def markdown(result: dict, command: str) -> str:
    lines = [
        "# The hub preset's readout, chosen on BLIP-style caption sequences",
        "",
        f"Command: `{command}`",
        "",
        f"Predictor `{result['predictor']}`; {result['sequences']} sequences in two halves (choose, report). "
        f"Chosen on the first half: **{result['chosen']['name']}** (among readouts at least {MIN_WELL_FORMED:.0%} "
        f"well formed, the highest on-topic rate of those at least {MIN_DISTINCT:.0%} distinct, else the highest "
        "on-topic + distinct).",
        "",
        "| half | readout | well formed | distinct | on topic | restated |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for part, entry in result["halves"].items():
        for name, m in entry["readouts"].items():
            lines.append(
                f"| {part} | {name} | {m['well_formed']:.2f} | {m['distinct']:.2f} | {m['on_topic']:.2f} | "
                f"{m['restated']:.2f} |"
            )
    lines += ["", "First five sequences of the report half:", ""]
    for name, m in result["halves"]["report"]["readouts"].items():
        lines += [f"- {name}: " + "; ".join(f'{e["id"]}: "{e["predicted"]}"' for e in m["examples"])]
    return "\n".join(lines) + "\n"


@dataclass
class HubReadoutSettings:
    """Where the sequences are and where the report goes."""

    out: Path = field(metadata={"help": "folder for results.json and results.md"})
    sequences: Path = field(default=SEQUENCES, metadata={"help": "JSONL of {id, captions} sequences"})
    preset: str = field(default="hub", metadata={"help": "the preset whose predictor is measured (default hub)"})


def main(argv: list[str] | None = None) -> int:
    return settings_main(HubReadoutSettings, "pipeline.hub_readout", __doc__.split("\n\n")[0], run, argv)


def run(settings: HubReadoutSettings, command: str) -> None:
    """The command's work: check --out (a report folder, replaced whole when the report is written), measure, write
    and print the report."""
    check_output(settings.out, "--out", {"sequences": settings.sequences}, overwrite=True)
    result = hub_readout(settings.sequences, settings.preset)
    with atomic_dir(settings.out) as staging:
        (staging / "results.json").write_text(json.dumps({"command": command, **result}, indent=2) + "\n")
        (staging / "results.md").write_text(markdown(result, command))
    print(markdown(result, command))


if __name__ == "__main__":
    sys.exit(main())

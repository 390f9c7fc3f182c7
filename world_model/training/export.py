"""Export a training run's selected checkpoint for shipping: fp16 weights, vocabulary and a model card.

    python -m world_model.training.export --run RUN_DIR --out world_model/pretrained/rocstories-cpu \
        --command "python -m world_model.training.train ..." [--data DIR]

The card records the data, the training command and this export's own, the selected epoch and its validation
L_S(4), token accuracy and perplexity, re-measured on the exported fp16 weights when --data is given; --data also
writes the folder's sentence bank from the training stories (`world_model.generation.sentence_bank`), its default
readout.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from world_model.evaluation.evaluate import EvaluateSettings, evaluate_checkpoint
from world_model.evaluation.floors import FLOORS
from world_model.generation.sentence_bank import write_rocstories_bank
from world_model.models.registry import count_parameters, load_model
from world_model.text.vocab import Vocabulary
from world_model.utils.cli import check_output
from world_model.utils.files import write_text_atomic
from world_model.utils.flags import settings_main


def model_card(config: dict, run: dict, metrics: dict, command: str, export_command: str, size_bytes: int) -> str:
    history = run.get("history", [])
    training = run.get("config", {}).get("training", {})
    variants = [name for name in ("temporal_causal", "copy_path") if config.get(name)]
    lines = [
        "# 4-tensor predictor, CPU-sized, trained on ROCStories",
        "",
        f"d_x {config['d_x']}, d_t {config['d_t']}, H {config['n_heads']}, L {config['n_layers']}, N {config['n_tokens']}, "
        f"T {config['n_states']}, vocabulary {config['vocab_size']:,} words; {metrics['parameters']:,} parameters, "
        f"stored as fp16 safetensors ({size_bytes / 1e6:.1f} MB)."
        + (
            f" Opt-in variants beyond the paper: {', '.join(variants)} (README, 'Beyond the paper')."
            if variants
            else ""
        ),
        "",
        "## Data",
        "Training windows: the 20,000-story ROCStories subset in `../shared/data/rocstories/` (5 sentences a story, "
        "one window each). Validation: the 3,742 Story Cloze stories (val + test, right ending as sentence 5). "
        "The vocabulary is built over both, as in the paper.",
        "",
        "## Training",
        "```",
        command,
        "```",
        f"Selected epoch {run.get('best_epoch')} of {run.get('last_epoch', len(history))} run "
        f"(stopped by: {run.get('stop_reason', 'unknown')}); "
        + (", ".join(f"{k} {v}" for k, v in training.items()) if training else "training settings: see the command")
        + ".",
        "",
        "Exported with:",
        "```",
        export_command,
        "```",
        "",
        "## Validation (3,742 cloze stories, measured on the exported fp16 weights)",
        "| L_S(4) | token accuracy | perplexity | window loss S(1..4) |",
        "|---|---|---|---|",
        f"| {metrics['val_last_ce']:.4f} | {metrics['val_token_accuracy']:.4f} | {metrics['val_perplexity']:.1f} | "
        f"{metrics['val_window_loss']:.4f} |",
        "",
    ]
    lines += floor_lines(metrics) + story_cloze_lines(metrics)
    lines += [
        "Per epoch (fp32, from the run's metrics.jsonl):",
        "",
        "| epoch | train loss | val window loss | L_S(4) | accuracy | perplexity |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {h['epoch']} | {h['train_loss']:.4f} | {h['val_window_loss']:.4f} | {h['val_last_ce']:.4f} | "
        f"{h['val_token_accuracy']:.4f} | {h['val_perplexity']:.1f} |"
        for h in history
    ]
    lines += ["", "Paper, at d_x 64, d_t 32 on the full pool: L_S(4) 5.531-5.562, perplexity 252-260.", ""]
    return "\n".join(lines)


def floor_lines(metrics: dict) -> list[str]:
    """The count floors' table of the model card, if the metrics hold them."""
    if not metrics.get("floors"):
        return []
    return [
        "Count floors (world_model/evaluation/floors/; fitted on the training stories, settings chosen on "
        "held-out training windows):",
        "",
        "| floor | L_S(4) | token accuracy |",
        "|---|---|---|",
        *(
            f"| {name} | {metrics['floors'][name]['val_last_ce']:.4f} | "
            f"{metrics['floors'][name]['val_token_accuracy']:.4f} |"
            for name in FLOORS
            if name in metrics["floors"]  # metrics written before a floor was added lack it
        ),
        "",
    ]


def story_cloze_lines(metrics: dict) -> list[str]:
    """The Story Cloze table of the model card, if the metrics hold it."""
    if not metrics.get("story_cloze"):
        return []
    lines = [
        "Story Cloze (the right one of two endings by its S(4) log-likelihood; chance 50%, DSSM 58.5%, GPT-1 86.5%):",
        "",
        "| scorer | val, summed / per token | test, summed / per token |",
        "|---|---|---|",
    ]
    for name, halves in metrics["story_cloze"].items():
        if name != "references":
            cells = [f"{100 * halves[h]['summed']:.1f}% / {100 * halves[h]['per_token']:.1f}%" for h in ("val", "test")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


@dataclass
class ExportSettings:
    """What to export and where."""

    run: Path = field(metadata={"help": "a training run folder (holds best/ and metrics.jsonl)"})
    out: Path = field(metadata={"help": "destination checkpoint folder"})
    command: str = field(metadata={"help": "the training command, for the model card"})
    data: Path | None = field(
        default=None, metadata={"help": "ROCStories folder: re-measure the exported weights on validation"}
    )


def main(argv: list[str] | None = None) -> int:
    return settings_main(ExportSettings, "world_model.training.export", __doc__.split("\n\n")[0], export, argv)


def export(settings: ExportSettings, command: str) -> None:
    """The command's work (`command`, this export's own command line): write the run's best epoch to --out in
    fp16, with its model card."""
    check_output(settings.out, "--out", {"run": settings.run, "data folder": settings.data}, overwrite=True)
    model = load_model(settings.run / "best")
    vocab = Vocabulary.load(settings.run / "best")
    history = [json.loads(line) for line in (settings.run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary_path = settings.run / "summary.json"
    run = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    best_epoch = run.get("best_epoch") or min(history, key=lambda h: h["val_window_loss"])["epoch"]
    run = {**run, "history": history, "best_epoch": best_epoch, "last_epoch": history[-1]["epoch"]}
    model.save_pretrained(settings.out, vocab=vocab, dtype=torch.float16, epoch=best_epoch, source="ROCStories")
    if settings.data is not None:
        metrics = evaluate_checkpoint(EvaluateSettings(checkpoint=settings.out, data=settings.data))
        write_rocstories_bank(
            settings.out, settings.data
        )  # the readout of world_model.generation.predict and the hub preset
    else:
        metrics = {
            k: v for k, v in next(h for h in history if h["epoch"] == best_epoch).items() if k.startswith("val_")
        }
    metrics["parameters"] = count_parameters(model)
    size = (settings.out / "model.safetensors").stat().st_size
    write_text_atomic(
        settings.out / "README.md", model_card(model.config.to_dict(), run, metrics, settings.command, command, size)
    )
    print(
        f"exported epoch {best_epoch} to {settings.out} ({size / 1e6:.1f} MB): L_S(4) {metrics['val_last_ce']:.4f}, "
        f"accuracy {metrics['val_token_accuracy']:.4f}, perplexity {metrics['val_perplexity']:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())

"""Validation metrics of a trained predictor on the ROCStories cloze stories (paper, section 8.2).

    python -m world_model.evaluation.evaluate --checkpoint OUT/best --data DATA_DIR [--out FILE.json] [--batch-size 64]
        [--holdout H] [--floors none|counts|all] [--floors-cache DIR]

Reported, on the validation windows (S, 5, 16): the cloze stories, or with `--holdout H` the last H training stories
(the slice a run trained with `training.holdout_stories: H` validated on; the floors are then fitted on the stories
before them, so nothing they read was scored):
    val_window_loss     the selection loss: sum of window_ce_sum / sum of window_tokens (S(1..4), padding ignored)
    val_last_ce         L_S(4): mean cross-entropy of the non-padding tokens of S(4)
    val_token_accuracy  argmax match rate on those tokens
    val_perplexity      exp(L_S(4))
    val_last_ce_teacher_forced  baseline only, a diagnostic beside the paper's free-running L_S(4): each gold token of
                        S(4) given the context and the gold tokens before it
    val_last_end_cost   baseline only: the part of L_S(4) spent on [EOS] mass, the mean -log(1 - p([EOS])) over the
                        S(4) tokens at their free-running steps; the floors and the 4-tensor readout, scored on live
                        slots only, never pay it (`floors["end_cost"]` is what a count of sentence lengths pays)
    floors              the count floors of world_model/evaluation/floors/ beside them (L_S(4), token accuracy; fitted on the
                        training stories of DATA_DIR, none when it holds no ROCStories*.csv or with `--floors none`)
    story_cloze         Story Cloze accuracy (val and test halves; summed and per-token ending log-likelihood) of the
                        model and the floors, with the published reference points (world_model/evaluation/story_cloze.py)
    coherence           for the model (and the model with its folder's coherence head, when it has one,
                        world_model/models/coherence_head.py), every floor and the bag-of-words dual encoder (a
                        coherence floor fitted on the same training stories): Story Cloze on the test half with the
                        decision rule chosen on the val half (val beside it), and recall@1 / recall@10 / MRR of the
                        right ending among 100 candidates (world_model/evaluation/coherence.py)

The floors take minutes to fit and score but depend only on the data and the vocabulary: they are kept in a cache
folder and reused by the next evaluation on the same data (`world_model/evaluation/floor_cache.py`); `--floors counts`
leaves out the dual encoder, `--floors none` every floor.

`evaluate_windows` is the one evaluation routine; training calls it (through `evaluation_sums`) every epoch.
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from world_model.data.rocstories import (
    CLOZE_PATTERN,
    STORY_SENTENCES,
    TRAIN_PATTERN,
    DataError,
    Story,
    encode_windows,
    load_cloze_halves,
    load_corpus,
    read_cloze_csv,
)
from world_model.evaluation import coherence as coh
from world_model.evaluation import story_cloze as sc
from world_model.evaluation.evaluate_report import WITH_HEAD, print_result
from world_model.evaluation.floor_cache import FLOOR_CHOICES, default_floors_cache, floor_results
from world_model.models.coherence_head import CoherenceHead, load_coherence_head
from world_model.models.precision import PRECISIONS, autocast
from world_model.models.registry import count_parameters, load_model
from world_model.text.vocab import Vocabulary
from world_model.utils.cli import UsageError, check_device, check_output
from world_model.utils.eval_mode import eval_mode
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main
from world_model.utils.hub import default_device

SUM_KEYS = ("window_ce_sum", "window_tokens", "last_ce_sum", "last_correct", "last_tokens")


@torch.no_grad()
def evaluation_sums(
    model: nn.Module,
    windows: torch.Tensor,
    batch_size: int,
    device: torch.device | str | None = None,
    precision: str = "fp32",
) -> torch.Tensor:
    """Summed statistics over `windows` (S, T+1, N) in eval mode: float64 tensor ordered as SUM_KEYS.
    `precision` "bf16" runs the forward passes under bf16 autocast (the sums stay fp32 / float64).

    The model's train/eval mode is restored afterwards. Sums (not means) so that shards evaluated by
    several processes can be added before dividing.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if device is None:
        device = next(model.parameters()).device
    sums = torch.zeros(len(SUM_KEYS), dtype=torch.float64, device=device)
    with eval_mode(model):
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size].to(device)
            with autocast(precision, device):
                stats = model.training_step(batch)
            sums += torch.stack([getattr(stats, k).detach().double() for k in SUM_KEYS])
    return sums


def metrics_from_sums(sums: torch.Tensor | Sequence[float]) -> dict:
    """The four validation metrics from summed statistics (ordered as SUM_KEYS)."""
    s = dict(zip(SUM_KEYS, (float(v) for v in (sums.tolist() if isinstance(sums, torch.Tensor) else sums))))
    if s["window_tokens"] <= 0 or s["last_tokens"] <= 0:
        raise ValueError("the validation windows hold no non-padding target tokens")
    last_ce = s["last_ce_sum"] / s["last_tokens"]
    try:
        perplexity = math.exp(last_ce)
    except OverflowError:
        perplexity = float("inf")
    return {
        "val_window_loss": s["window_ce_sum"] / s["window_tokens"],
        "val_last_ce": last_ce,
        "val_token_accuracy": s["last_correct"] / s["last_tokens"],
        "val_perplexity": perplexity,
        "window_tokens": int(s["window_tokens"]),
        "last_tokens": int(s["last_tokens"]),
    }


def evaluate_windows(
    model: nn.Module,
    windows: torch.Tensor,
    batch_size: int = 64,
    device: torch.device | str | None = None,
    precision: str = "fp32",
) -> dict:
    """Validation metrics of `model` on `windows` (S, T+1, N); see the module docstring."""
    metrics = metrics_from_sums(evaluation_sums(model, windows, batch_size, device, precision))
    metrics["validation_windows"] = len(windows)
    return metrics


# result key -> the method giving (summed value, count) of a batch, of a model that `scores_sentences` (the baseline)
BASELINE_DIAGNOSTICS = {
    "val_last_ce_teacher_forced": "teacher_forced_last_ce",
    "val_last_end_cost": "last_end_cost",
}


@torch.no_grad()
def token_mean(model: nn.Module, method: str, windows: torch.Tensor, batch_size: int, device: str) -> float:
    """The mean over `windows` (S, T+1, N) of a per-token diagnostic, `model.<method>(batch)` -> (sum, count),
    in eval mode (the baseline's `teacher_forced_last_ce` and `last_end_cost`)."""
    with eval_mode(model):
        sums = [
            getattr(model, method)(windows[i : i + batch_size].to(device)) for i in range(0, len(windows), batch_size)
        ]
    return float(sum(value.double() for value, _ in sums) / sum(int(n) for _, n in sums))


def load_validation_stories(data_dir: str | os.PathLike) -> list[Story]:
    """The Story Cloze stories of `data_dir` (cloze_test_*.csv, sorted), in the order training reads them."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such folder")
    files = sorted(data_dir.glob(CLOZE_PATTERN))
    if not files:
        raise DataError(f"{data_dir}: no validation file ({CLOZE_PATTERN}) found")
    return [story for path in files for story in read_cloze_csv(path)]


def encode_stories(stories: Sequence[Story], vocab: Vocabulary, n: int) -> tuple[torch.Tensor, dict]:
    """Windows (S, 5, n) of `stories` with `vocab` (unknown words -> UNK id) and the encoding statistics."""
    ids, stats = vocab.encode_with_stats([s for story in stories for s in story.sentences], n)
    return ids.reshape(len(stories), STORY_SENTENCES, n), stats


@dataclass
class EvaluateSettings:
    """Which checkpoint is evaluated on which stories, and how."""

    checkpoint: Path = field(metadata={"help": "folder written by save_pretrained (e.g. OUT/best)"})
    data: Path = field(metadata={"help": "folder with cloze_test_*.csv"})
    out: Path | None = field(default=None, metadata={"help": "also write the metrics to this JSON file"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out file"})
    batch_size: int = field(default=64, metadata={"help": "windows per forward pass"})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1 ... (default: cuda when available)"})
    precision: str = field(
        default="fp32", metadata={"choices": list(PRECISIONS), "help": "bf16: the forward passes under bf16 autocast"}
    )
    holdout: int = field(
        default=0,
        metadata={
            "help": "validate on the last H training stories (a run's training.holdout_stories) instead of the "
            "cloze stories"
        },
    )
    floors: str = field(
        default="all",
        metadata={
            "choices": list(FLOOR_CHOICES),
            "help": "the floors fitted and reported: none, the count floors, or all (the bag-of-words dual encoder too)",
        },
    )
    floors_cache: Path | None = field(
        default=None,
        metadata={
            "help": "keep the fitted floors here, and reuse them for the same data and vocabulary (default "
            "$XDG_CACHE_HOME/semantic-world-model/floors, ~/.cache/... without XDG_CACHE_HOME)"
        },
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.holdout < 0:
            raise ValueError(f"--holdout must be >= 0, got {self.holdout}")


def evaluate_checkpoint(settings: EvaluateSettings, stage: Callable[[str], None] = lambda _: None) -> dict:
    """Load `settings.checkpoint` (any registered model type) and its vocab.json; evaluate on the cloze stories of
    `settings.data`, or with `holdout` H > 0 on the last H training stories (L_S(4) and the other metrics in
    `precision`; Story Cloze, always on the cloze halves, and the floors in fp32). The floors `floors` ("none",
    "counts" or "all") are read from the cache folder `floors_cache` (default the user's) when fitted on the same
    inputs before (`floor_cache`). `stage` is told what starts, as it starts (the command prints it)."""
    s = settings
    checkpoint, data_dir, batch_size, precision, holdout = s.checkpoint, s.data, s.batch_size, s.precision, s.holdout
    device = str(default_device(s.device))
    if holdout:  # the data is read first: a DataError comes before the model loads
        train_stories, val_stories = load_corpus(data_dir).split(holdout)
    else:
        train_stories, val_stories = None, load_validation_stories(data_dir)
    model = load_model(checkpoint, device=device)
    vocab = Vocabulary.load(Path(checkpoint))
    windows, stats = encode_stories(val_stories, vocab, getattr(model.config, "n_tokens", 16))
    stage(f"L_S(4) and token metrics on {len(windows)} validation windows")
    metrics = evaluate_windows(model, windows, batch_size, device, precision)
    n = windows.shape[2]
    halves = load_cloze_halves(data_dir)
    folder = s.floors_cache or default_floors_cache()
    if s.floors != "none":
        stage(f"floors ({s.floors}): read from {folder} when fitted there on this data before, else fitted, kept there")
    train_windows = None if s.floors == "none" else training_windows(data_dir, vocab, n, train_stories)
    floor_part = floor_results(train_windows, windows, halves, vocab, n, s.floors, folder)
    stage("Story Cloze and coherence of the model")
    story_cloze = sc.story_cloze(sc.model_scorer(model, batch_size), halves, vocab, n)
    diagnostic = {
        key: token_mean(model, method, windows, batch_size, device)
        for key, method in BASELINE_DIAGNOSTICS.items()
        if model.scores_sentences
    }
    return {
        "val_last_ce": metrics["val_last_ce"],
        **diagnostic,
        "val_token_accuracy": metrics["val_token_accuracy"],
        "val_perplexity": metrics["val_perplexity"],
        "val_window_loss": metrics["val_window_loss"],
        "validation_windows": metrics["validation_windows"],
        "last_tokens": metrics["last_tokens"],
        "unknown_tokens": stats["unknown"],
        "validation": f"the last {holdout} training stories (held out)" if holdout else "the cloze stories",
        "checkpoint": str(checkpoint),
        "model_type": model.config.to_dict()["model_type"],
        "parameters": count_parameters(model),
        "precision": precision,
        "floors": floor_part["floors"],
        "story_cloze": {
            "model": story_cloze,
            **floor_part["story_cloze"],
            "references": sc.REFERENCES,
        },
        "coherence": coherence_reports(
            model, floor_part["coherence"], halves, vocab, n, batch_size, load_coherence_head(Path(checkpoint), model)
        ),
    }


def coherence_reports(
    model: nn.Module,
    floor_reports: dict,
    halves: dict,
    vocab: Vocabulary,
    n: int,
    batch_size: int = 64,
    head: CoherenceHead | None = None,
) -> dict:
    """`coherence.coherence_report` of the model and of the model with its coherence `head` (when it has one), then
    the floors' `floor_reports` ({name: report}, `floor_results`): {name: report, "references": the published Story
    Cloze points}."""
    reports = {"model": coh.coherence_report(sc.model_scorer(model, batch_size), halves, vocab, n)}
    if head is not None:
        report = coh.coherence_report(coh.head_scorer(head, model), halves, vocab, n, coh.LIKELIHOOD_FREE_RULES)
        weights = {"model_weight": head.config.model_weight, "likelihood_weight": head.config.likelihood_weight}
        reports[WITH_HEAD] = {**report, **weights}
    return {**reports, **floor_reports, "references": sc.REFERENCES}


def training_windows(
    data_dir: str | os.PathLike, vocab: Vocabulary, n: int, train_stories: Sequence[Story] | None = None
) -> torch.Tensor | None:
    """`train_stories` (default: the training stories of `data_dir`) encoded with `vocab` as windows (S, 5, n), or
    None when there are none."""
    if train_stories is None:
        if not any(Path(data_dir).glob(TRAIN_PATTERN)):
            return None
        train_stories = load_corpus(data_dir).train
    return encode_windows(train_stories, vocab, n)


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        EvaluateSettings,
        "world_model.evaluation.evaluate",
        "Validation metrics of a trained checkpoint (paper, section 8.2).",
        lambda settings, _: evaluate_command(settings),
        argv,
    )


def evaluate_command(settings: EvaluateSettings) -> None:
    """The command's work: check the device and --out first, then evaluate, print and write."""
    check_device(settings.device)
    if settings.out and settings.out.is_dir():
        raise UsageError(f"--out {settings.out} is a folder; give the JSON file's path")
    if settings.out:
        inputs = {"checkpoint": settings.checkpoint, "data folder": settings.data}
        check_output(settings.out, "--out", inputs, settings.overwrite)
    result = evaluate_checkpoint(settings, stage=lambda what: print(f"evaluating: {what}", file=sys.stderr, flush=True))
    print_result(result)
    if result["unknown_tokens"]:
        print(
            f"note: {result['unknown_tokens']} validation token(s) are not in the checkpoint's vocabulary (scored as <unk>)"
        )
    if settings.out:
        settings.out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(settings.out, result)


if __name__ == "__main__":
    sys.exit(main())

"""Train the offline pack's captioner from scratch on the synthetic world's state strips.

    python -m pipeline.pack.train_captioner --data DATA --out DIR [--max-minutes M] [--threads T] [--seed S]
        [--max-steps N] [--batch-size B] [--lr LR] [--patch-size P] [--encoder-hidden D] [--encoder-layers L] ...

The model is a ``VisionEncoderDecoderModel``: a small ViT over the (48, 144) RGB strip (``STRIP_SIZE``;
by default a 4 x 12 grid of 12-pixel patches) and a small GPT-2 decoder with cross-attention, over the
word-level tokenizer of ``world_model.text.word_tokenizer`` built from the training sentences. It trains on
``DATA/train`` minus its last ``--val-episodes`` episodes, which select the checkpoint (greedy exact
match, then loss), and stops at ``--max-steps``, at ``--max-minutes``, after ``--patience`` evaluations
without improvement, or on Ctrl-C; the selected checkpoint is then scored on ``DATA/heldout``. Training
images are lightly augmented (brightness, contrast and colour jitter, blur, pixel noise, a one-pixel
shift) so that the model also reads the diffusion renderer's imperfect strips.

DIR receives
    best/          the selected checkpoint, written whole and renamed into place: config.json,
                   generation_config.json, model.safetensors (fp16), tokenizer files and
                   preprocessor_config.json; ``encoders.captioner.HFCaptioner.from_pretrained(DIR/best)`` loads it
    metrics.json   the run's settings, validation history, and exact-match accuracy on ``DATA/heldout``
                   (overall, per scene type) with the most common confusions
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import (
    PreTrainedTokenizerFast,
    VisionEncoderDecoderModel,
)

from encoders.world_dataset import StateSet, read_states
from pipeline.pack.captioner_model import build_captioner, save_captioner, warm_start
from pipeline.pack.captioner_report import heldout_report
from pipeline.pack.strip_images import augment, to_pixels, to_unit
from world_model.text.vocab import same_sentence
from world_model.text.word_tokenizer import build_word_tokenizer
from world_model.training.schedule import warmup_cosine
from world_model.utils.cli import INPUT_ERRORS, check_output, check_positive, check_range
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main

BEST_DIR = "best"
METRICS_FILE = "metrics.json"
IGNORE_INDEX = -100  # label positions the loss skips (padding after the end token)


class TrainingStopped(RuntimeError):
    """Training ended before any checkpoint was selected."""


@dataclass
class TrainConfig:
    """Model size and optimisation settings; every field is also a command-line flag."""

    patch_size: int = 12
    encoder_hidden: int = 128
    encoder_layers: int = 4
    encoder_heads: int = 4
    decoder_hidden: int = 128
    decoder_layers: int = 2
    decoder_heads: int = 4
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 200
    max_steps: int = 20_000
    eval_every: int = 250
    patience: int = 8
    val_episodes: int = 75
    augment: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("patch_size", "encoder_hidden", "encoder_layers", "encoder_heads", "decoder_hidden",
                     "decoder_layers", "decoder_heads", "batch_size", "max_steps", "eval_every", "patience",
                     "val_episodes"):  # fmt: skip
            check_range(f"--{name.replace('_', '-')}", getattr(self, name), 1)
        check_positive("--lr", self.lr)
        check_range("--weight-decay", self.weight_decay, 0)
        check_range("--warmup-steps", self.warmup_steps, 0)
        check_range("--seed", self.seed, 0)


def caption_labels(tokenizer: PreTrainedTokenizerFast, sentences: Sequence[str]) -> torch.Tensor:
    """(N, L) long: each sentence's word ids then EOS, right-padded with ``IGNORE_INDEX``. The model shifts
    them right behind the decoder start token to make its inputs."""
    rows = [ids + [tokenizer.eos_token_id] for ids in tokenizer(list(sentences), add_special_tokens=False)["input_ids"]]
    labels = torch.full((len(rows), max(map(len, rows))), IGNORE_INDEX, dtype=torch.long)
    for i, row in enumerate(rows):
        labels[i, : len(row)] = torch.tensor(row)
    return labels


def train_step(
    model: VisionEncoderDecoderModel, optimizer: torch.optim.Optimizer, pixels: torch.Tensor, labels: torch.Tensor
) -> float:
    """One AdamW step on pixel values (B, 3, H, W) and labels (B, L); returns the batch's mean token loss."""
    model.train()
    loss = model(pixel_values=pixels, labels=labels, decoder_attention_mask=labels != IGNORE_INDEX).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


@torch.inference_mode()
def validate(
    model: VisionEncoderDecoderModel,
    tokenizer: PreTrainedTokenizerFast,
    images: torch.Tensor,
    labels: torch.Tensor,
    sentences: Sequence[str],
    batch_size: int = 256,
) -> tuple[float, float]:
    """(exact-match accuracy of greedy captions, mean token loss) on uint8 strips (N, H, W, 3)."""
    model.eval()
    hits, loss_sum, tokens = 0, 0.0, 0
    for start in range(0, len(images), batch_size):
        pixels = to_pixels(to_unit(images[start : start + batch_size]))
        batch_labels = labels[start : start + batch_size]
        logits = model(
            pixel_values=pixels, labels=batch_labels, decoder_attention_mask=batch_labels != IGNORE_INDEX
        ).logits
        loss_sum += F.cross_entropy(logits.flatten(0, 1), batch_labels.flatten(), reduction="sum").item()
        tokens += int((batch_labels != IGNORE_INDEX).sum())
        ids = model.generate(pixel_values=pixels, max_new_tokens=labels.shape[1] + 2, do_sample=False)
        captions = tokenizer.batch_decode(ids, skip_special_tokens=True)
        hits += sum(same_sentence(c, s) for c, s in zip(captions, sentences[start : start + batch_size]))
    return hits / len(images), loss_sum / tokens


def split_validation(states: StateSet, val_episodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training strips and of the validation strips (those of the last ``val_episodes`` episodes)."""
    episodes = len(states.records)
    if not 0 < val_episodes < episodes:
        raise ValueError(f"need 0 < val_episodes < {episodes} (the training episodes), got {val_episodes}")
    is_val = states.episode >= episodes - val_episodes
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def train(
    data: Path,
    out: Path,
    config: TrainConfig,
    max_minutes: float | None = None,
    progress: bool = True,
    init_from: Path | None = None,
) -> dict:
    """Train on ``data/train``, save the best checkpoint to ``out/best`` and score it on ``data/heldout``;
    returns (and writes to ``out/metrics.json``) the run's metrics. With ``init_from`` (a captioner folder, such as
    an earlier run's best/) training starts from its weights and tokenizer, with a fresh optimiser and schedule."""
    t_start = time.monotonic()
    heldout = read_states(data / "heldout", progress=progress)  # fail early if the held-out split is missing
    states = read_states(data / "train", progress=progress)
    train_idx, val_idx = split_validation(states, config.val_episodes)
    tokenizer = build_word_tokenizer(states.sentences[i] for i in train_idx)
    if init_from is not None:
        model, tokenizer = warm_start(init_from, tokenizer)
    else:
        model = build_captioner(tokenizer, config)
    data_set = CaptionData(
        torch.from_numpy(states.images),
        caption_labels(tokenizer, states.sentences),
        train_idx,
        val_idx,
        [states.sentences[i] for i in val_idx],
    )
    out.mkdir(parents=True, exist_ok=True)
    history, best, reason, step = fit(model, tokenizer, data_set, config, out, t_start, max_minutes, progress)
    train_minutes = (time.monotonic() - t_start) / 60
    metrics = {
        "config": dataclasses.asdict(config),
        "data": str(data),
        "init_from": None if init_from is None else str(init_from),
        "train_strips": len(train_idx),
        "val_strips": len(val_idx),
        "vocabulary": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "model_megabytes": round(sum(f.stat().st_size for f in (out / BEST_DIR).iterdir()) / 2**20, 3),
        "stop_reason": reason,
        "steps": step,
        "train_minutes": round(train_minutes, 2),
        "best": best,
        "history": history,
        "heldout": heldout_report(out / BEST_DIR, heldout),
    }
    metrics["wall_minutes"] = round((time.monotonic() - t_start) / 60, 2)
    write_json_atomic(out / METRICS_FILE, metrics)
    report = metrics["heldout"]
    print(
        f"held-out exact match {report['exact_match']:.4f} ("
        + ", ".join(f"{scene} {acc:.4f}" for scene, acc in report["per_scene"].items())
        + f") on {report['strips']} strips; model {out / BEST_DIR} ({metrics['model_megabytes']} MB)"
    )
    return metrics


@dataclasses.dataclass
class CaptionData:
    """The strips as the trainer reads them."""

    images: torch.Tensor  # (N, H, W, 3) uint8
    labels: torch.Tensor  # (N, L) caption token ids
    train_idx: np.ndarray  # rows trained on
    val_idx: np.ndarray  # rows validated on (the last episodes)
    val_sentences: list[str]


def fit(
    model,
    tokenizer,
    data: CaptionData,
    config: TrainConfig,
    out: Path,
    t_start: float,
    max_minutes: float | None,
    progress: bool,
) -> tuple[list[dict], dict, str, int]:
    """The training loop: AdamW steps, validation every `eval_every` steps (the best checkpoint saved to out/best),
    until max_steps, the time budget, `patience` validations without a gain, or Ctrl-C.

    Returns (validation history, best record, stop reason, steps). Raises TrainingStopped without a checkpoint."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    history, best, since_best, reason, step, loss_avg = [], None, 0, None, 0, None
    bar = tqdm(total=config.max_steps, desc="training captioner", disable=not progress)
    try:
        while reason is None:
            minutes = (time.monotonic() - t_start) / 60
            fraction = max(step / config.max_steps, minutes / max_minutes if max_minutes else 0.0)
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine(config.lr, step, fraction, config.warmup_steps)
            batch = torch.from_numpy(data.train_idx)[
                torch.randint(len(data.train_idx), (config.batch_size,), generator=generator)
            ]
            unit = to_unit(data.images[batch])
            pixels = to_pixels(augment(unit, generator) if config.augment else unit)
            loss = train_step(model, optimizer, pixels, data.labels[batch])
            loss_avg = loss if loss_avg is None else 0.98 * loss_avg + 0.02 * loss
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss_avg:.4f}", val=f"{best['val_exact_match']:.4f}" if best else "-")
            if step >= config.max_steps:
                reason = "max_steps"
            elif max_minutes is not None and time.monotonic() - t_start >= 60 * max_minutes:
                reason = "time_budget"
            if step % config.eval_every and reason is None:
                continue
            record = validation_record(model, tokenizer, data, step, t_start, loss_avg)
            history.append(record)
            if best is None or (record["val_exact_match"], -record["val_loss"]) > (
                best["val_exact_match"],
                -best["val_loss"],
            ):
                best, since_best = record, 0
                save_captioner(model, tokenizer, out / BEST_DIR)
            else:
                since_best += 1
            bar.write(
                f"step {step}: train loss {loss_avg:.4f}  val loss {record['val_loss']:.4f}  val exact match "
                f"{record['val_exact_match']:.4f}" + ("  *best*" if since_best == 0 else "")
            )
            if reason is None and since_best >= config.patience:
                reason = "converged"
    except KeyboardInterrupt:
        reason = "interrupted"
        bar.write(f"interrupted at step {step}; scoring the best checkpoint so far")
    finally:
        bar.close()
    if best is None:
        raise TrainingStopped(f"stopped ({reason}) before the first evaluation; no checkpoint was saved")
    return history, best, reason, step


def validation_record(model, tokenizer, data: CaptionData, step: int, t_start: float, loss_avg: float) -> dict:
    """Exact-match accuracy and loss on the validation strips at `step`."""
    accuracy, val_loss = validate(
        model, tokenizer, data.images[data.val_idx], data.labels[data.val_idx], data.val_sentences
    )
    return {
        "step": step,
        "minutes": round((time.monotonic() - t_start) / 60, 2),
        "train_loss": loss_avg,
        "val_exact_match": accuracy,
        "val_loss": val_loss,
    }


@dataclass
class CaptionerRun:
    """Where a training run reads and writes, and how long it may take; the model and optimiser are `TrainConfig`."""

    data: Path = field(metadata={"help": "folder with train/ and heldout/ episodes"})
    out: Path = field(metadata={"help": "output folder (receives best/ and metrics.json)"})
    max_minutes: float | None = field(
        default=None, metadata={"help": "stop training after this many minutes (wall clock)"}
    )
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    init_from: Path | None = field(
        default=None, metadata={"help": "start from this captioner folder's weights (e.g. an earlier run's best/)"}
    )
    progress: bool = field(default=True, metadata={"help": "progress bars (--no-progress: none)"})


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        (CaptionerRun, TrainConfig),  # one flag per setting, e.g. --batch-size
        "pipeline.pack.train_captioner",
        "Train the offline captioner on synthetic-world state strips.",
        train_command,
        argv,
        input_errors=(*INPUT_ERRORS, TrainingStopped),
    )


def train_command(run: CaptionerRun, config: TrainConfig, command: str) -> None:
    """The command's work: set the torch threads, check the output can be written, then train."""
    torch.set_num_threads(run.threads)
    # before the data is read and the training starts; the files of an earlier run in --out are replaced
    inputs = {"data folder": run.data, "--init-from folder": run.init_from}
    check_output(run.out / METRICS_FILE, "--out", inputs, overwrite=True)
    train(run.data, run.out, config, max_minutes=run.max_minutes, progress=run.progress, init_from=run.init_from)


if __name__ == "__main__":
    sys.exit(main())

"""Train the opt-in coherence head of a predictor folder (`world_model.models.coherence_head`), the predictor frozen.

    python -m world_model.training.coherence --checkpoint world_model/pretrained/rocstories-cpu \
        --data ../shared/data/rocstories [--seeds 0 1 2] [--out FOLDER] [--report FILE.json]

1. The frozen predictor reads every training window once: `pooled_state` of each story prefix S(0..k-1), k = 1..4.
2. The head learns to pick S(k) after S(0..k-1) among the batch's other next sentences and the four other
   sentences of the same story (the earlier ones a restatement, the later ones out of order), cross-entropy over
   scale * cos. The weights kept are those of the epoch of lowest loss on the held-out slice of the training
   windows (`split_heldout`, the last tenth); the rest train.
3. The weights of the predictor's likelihood ratio and of its per-token likelihood in the head's score are chosen
   on the Story Cloze val half (`choose_weights`); the cloze endings are never trained on.
4. With several --seeds, one head a seed; each one's coherence report (Story Cloze val and test, retrieval;
   `world_model.evaluation.coherence`) is printed and, with their mean and 95% interval, written to --report. The
   first seed's head is written into --out (default: the checkpoint folder).
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from world_model.data.rocstories import DataError, encode_cloze, encode_windows, load_cloze_halves, load_corpus
from world_model.evaluation import coherence as coh
from world_model.evaluation.floors.counts import CONTEXT, split_heldout
from world_model.evaluation.seed_stats import mean_interval
from world_model.models.coherence_head import (
    HEAD_CONFIG,
    HEAD_WEIGHTS,
    CoherenceHead,
    CoherenceHeadConfig,
    pooled_state,
    save_coherence_head,
)
from world_model.models.registry import load_predictor
from world_model.text.vocab import PAD_ID
from world_model.utils.cli import UsageError, check_output, check_range, check_writable
from world_model.utils.files import write_json_atomic
from world_model.utils.flags import settings_main

# The predictor's ratio weight is never negative: a negative weight prefers the endings the story makes less likely,
# which the cloze val half rewards (its wrong endings reuse the story's words) but which ranks a story's own next
# sentence below other stories' (docs/coherence.md). 0 first: it wins a tie on the val half.
MODEL_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0)
# The predictor's per-token likelihood: the head alone ranks other stories' endings worse than the predictor does; a
# likelihood weight trades Story Cloze for retrieval. 0 first: it wins a tie.
LIKELIHOOD_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
EPOCHS = 6
BATCH_SIZE = 256
LR = 3e-3
ENCODE_BATCH = 256


@torch.no_grad()
def prefix_states(model, windows: torch.Tensor) -> torch.Tensor:
    """`pooled_state` of every prefix S(0..k-1), k = 1..4, of windows (S, 5, N): (S, 4, 2 d), [:, k - 1] for k.

    A temporal-causal predictor's slice k - 1 sees only the sentences before it, so one pass over S(0..3) gives
    every prefix; otherwise each prefix is encoded on its own."""
    out = []
    for start in range(0, len(windows), ENCODE_BATCH):
        ids = windows[start : start + ENCODE_BATCH, :CONTEXT].long()
        if model.config.temporal_causal:
            X = model.encode(ids)
            out.append(torch.stack([pooled_state(X[:, :, :k], ids[:, :k]) for k in range(1, CONTEXT + 1)], 1))
        else:
            out.append(
                torch.stack([pooled_state(model.encode(ids[:, :k]), ids[:, :k]) for k in range(1, CONTEXT + 1)], 1)
            )
    return torch.cat(out)


def pair_loss(
    head: CoherenceHead,
    windows: torch.Tensor,
    states: torch.Tensor,
    stories: torch.Tensor,
    k: torch.Tensor,
    same_story: bool = True,
) -> torch.Tensor:
    """Mean cross-entropy of picking S(k) of each pair (stories, k (B,)) among the batch's next sentences and, with
    `same_story`, the other four sentences of its story; states (S, 4, 2 d) from `prefix_states`, windows (S, 5, N)."""
    context_ids = windows[stories, :CONTEXT].clone()  # (B, 4, N), the sentences from k on blanked
    context_ids[torch.arange(CONTEXT)[None, :] >= k[:, None]] = PAD_ID
    context = head.context_vectors(states[stories, k - 1], context_ids)  # (B, dim)
    others = torch.arange(CONTEXT + 1)[None, :] != k[:, None]  # (B, 5)
    own = windows[stories][others].view(len(k), CONTEXT, -1)  # (B, 4, N)
    batch_next = head.sentence_encoder(windows[stories, k])  # (B, dim), each pair's S(k)
    if not same_story:
        return F.cross_entropy(head.scale * context @ batch_next.T, torch.arange(len(k)))
    own_other = head.sentence_encoder(own.flatten(0, 1)).view(len(k), CONTEXT, -1)  # (B, 4, dim)
    logits = torch.cat([context @ batch_next.T, (own_other @ context[:, :, None])[..., 0]], dim=1)  # (B, B + 4)
    return F.cross_entropy(head.scale * logits, torch.arange(len(k)))


def all_pairs(first: int, last: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(story, k) of every pair of the stories first..last-1, k = 1..4."""
    stories = torch.arange(first, last).repeat(CONTEXT)
    return stories, torch.arange(1, CONTEXT + 1).repeat_interleave(last - first)


def train_head(
    windows: torch.Tensor,
    states: torch.Tensor,
    vocab_size: int,
    seed: int = 0,
    epochs: int = EPOCHS,
    same_story: bool = True,
) -> tuple[CoherenceHead, dict]:
    """Fit the head on the windows (S, 5, N) before the held-out slice (`same_story` negatives or the batch's alone),
    keep the epoch of lowest held-out loss: (head in eval mode, {"epoch", "heldout_loss", "losses"})."""
    fit, held = split_heldout(windows)
    torch.manual_seed(seed)
    head = CoherenceHead(CoherenceHeadConfig(vocab_size=vocab_size, d_state=states.shape[-1]))
    optimizer = torch.optim.Adam(head.parameters(), lr=LR)
    stories, k = all_pairs(0, len(fit))
    held_stories, held_k = all_pairs(len(fit), len(windows))
    held_batches = torch.randperm(len(held_k), generator=torch.Generator().manual_seed(0)).split(BATCH_SIZE)
    losses, best = [], None
    for _ in range(epochs):
        head.train()
        for b in torch.randperm(len(k)).split(BATCH_SIZE):
            loss = pair_loss(head, windows, states, stories[b], k[b], same_story)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        head.eval()
        with torch.no_grad():
            held_loss = [
                float(pair_loss(head, windows, states, held_stories[b], held_k[b], same_story)) for b in held_batches
            ]
        losses.append(sum(held_loss) / len(held_loss))
        if losses[-1] == min(losses):
            best = copy.deepcopy(head.state_dict())
    head.load_state_dict(best)
    return head.eval(), {"epoch": losses.index(min(losses)) + 1, "heldout_loss": min(losses), "losses": losses}


def choose_weights(head: CoherenceHead, model, val_items, vocab) -> dict:
    """The head's two weights, chosen on the Story Cloze val half alone:

    model_weight       of `MODEL_WEIGHTS`, the highest val Story Cloze accuracy (the head, likelihood weight 0);
    likelihood_weight  of `LIKELIHOOD_WEIGHTS`, the highest val Story Cloze accuracy among the weights whose val
                       retrieval MRR (`world_model.evaluation.coherence`, the val stories' endings as candidates)
                       is at least the predictor's own per-token likelihood's; 0 when none is (`pick_likelihood_weight`).

    Returns {"model_weight", "likelihood_weight", "val": {model weight: accuracy}, "likelihood_val": {likelihood
    weight: {"cloze", "mrr"}}, "predictor_val_mrr"}."""
    context, endings, answer = encode_cloze(val_items, vocab, model.config.n_tokens)
    candidates = coh.retrieval_candidates(endings, answer)  # (S, 2 + O): the right ending, the wrong one, others
    scores, ratios, likelihoods = coh.head_parts(head, model, context, candidates)  # each (S, 2 + O)
    right = torch.zeros_like(answer)  # Story Cloze reads the first two columns, the right one first
    accuracy = {w: coh.choice_accuracy((scores + w * ratios)[:, :2], right) for w in MODEL_WEIGHTS}
    model_weight = max(accuracy, key=accuracy.get)
    trade = {}
    for w in LIKELIHOOD_WEIGHTS:
        combined = scores + model_weight * ratios + w * likelihoods
        trade[w] = {
            "cloze": coh.choice_accuracy(combined[:, :2], right),
            "mrr": coh.retrieval_metrics(combined)["mrr"],
        }
    predictor_mrr = coh.retrieval_metrics(likelihoods)["mrr"]
    return {
        "model_weight": model_weight,
        "likelihood_weight": pick_likelihood_weight(trade, predictor_mrr),
        "val": {str(w): a for w, a in accuracy.items()},
        "likelihood_val": {str(w): t for w, t in trade.items()},
        "predictor_val_mrr": predictor_mrr,
    }


def pick_likelihood_weight(trade: dict[float, dict], predictor_mrr: float) -> float:
    """Of the weights {w: {"cloze", "mrr"}}, the one of highest "cloze" among those of "mrr" >= predictor_mrr (the
    first on a tie); 0.0 when none retrieves as well as the predictor."""
    allowed = [w for w, t in trade.items() if t["mrr"] >= predictor_mrr]
    return max(allowed, key=lambda w: trade[w]["cloze"]) if allowed else 0.0


def seed_summary(reports: list[dict]) -> dict:
    """Mean, sd and the 95% Student-t interval of the mean over the seeds' reports, for Story Cloze val and test
    and the retrieval figures: {name: {"n", "mean", "sd", "ci95"}}."""
    figures = {
        "val": [r["val"] for r in reports],
        "test": [r["test"] for r in reports],
        **{k: [r["retrieval"][k] for r in reports] for k in ("recall_at_1", "recall_at_10", "mrr")},
    }
    return {name: mean_interval(values) for name, values in figures.items()}


def train_coherence_heads(
    checkpoint: str | Path,
    data_dir: str | Path,
    seeds: Sequence[int] = (0,),
    out: str | Path | None = None,
    same_story: bool = True,
) -> list[tuple[CoherenceHead, dict]]:
    """Steps 1-3 of the module docstring once per seed (the frozen states computed once), each with its coherence
    report: [(head, report)]. The first seed's head is written into `out` as soon as it is trained."""
    model, vocab, _ = load_predictor(checkpoint)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    halves = load_cloze_halves(data_dir)
    if "val" not in halves:
        raise DataError(
            f"{data_dir}: the head's model weight is chosen on the Story Cloze val half, found {list(halves)}"
        )
    windows = encode_windows(load_corpus(data_dir).train, vocab, model.config.n_tokens)
    states = prefix_states(model, windows)
    heads = []
    for seed in seeds:
        head, fitted = train_head(windows, states, len(vocab), seed, same_story=same_story)
        chosen = choose_weights(head, model, halves["val"], vocab)
        head.config.model_weight = chosen["model_weight"]
        head.config.likelihood_weight = chosen["likelihood_weight"]
        head.config.extra = {
            "seed": seed,
            "same_story": same_story,
            **fitted,
            "model_weight_val": chosen["val"],
            "likelihood_weight_val": chosen["likelihood_val"],
            "predictor_val_mrr": chosen["predictor_val_mrr"],
            "source": str(data_dir),
        }
        scorer = coh.head_scorer(head, model)
        report = coh.coherence_report(scorer, halves, vocab, model.config.n_tokens, coh.LIKELIHOOD_FREE_RULES)
        weights = {"model_weight": head.config.model_weight, "likelihood_weight": head.config.likelihood_weight}
        heads.append((head, {**report, "head": {**head.config.extra, **weights}}))
        if out is not None and len(heads) == 1:
            Path(out).mkdir(parents=True, exist_ok=True)
            save_coherence_head(head, out)
        print(json.dumps({"seed": seed, **{k: report[k] for k in ("val", "test", "retrieval")}}), flush=True)
    return heads


@dataclass
class CoherenceSettings:
    """Which predictor gets a coherence head, trained on which stories, with which seeds."""

    checkpoint: str = field(metadata={"help": "predictor folder (4-tensor model)"})
    data: str = field(metadata={"help": "ROCStories folder (training stories and the cloze halves)"})
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "one head per seed; the first is written"})
    out: str | None = field(
        default=None, metadata={"help": "folder that gets the first seed's head (default: the checkpoint folder)"}
    )
    batch_negatives_only: bool = field(
        default=False, metadata={"help": "train against the batch's next sentences alone"}
    )
    report: str | None = field(
        default=None, metadata={"help": "also write every seed's coherence report and their summary to this JSON file"}
    )
    overwrite: bool = field(
        default=False, metadata={"help": "replace a coherence head already in --out, and an existing --report file"}
    )

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("--seeds needs at least one seed")
        for seed in self.seeds:
            check_range("--seeds", seed, 0)


def main(argv: Sequence[str] | None = None) -> int:
    return settings_main(
        CoherenceSettings,
        "world_model.training.coherence",
        __doc__.split("\n\n")[0],
        lambda settings, _: coherence_command(settings),
        argv,
    )


def coherence_command(settings: CoherenceSettings) -> None:
    """The command's work: check where it writes, train a head per seed, write the first, print (and write) the
    reports' summary."""
    out = Path(settings.out or settings.checkpoint)
    check_head_folder(out, settings.overwrite)
    if settings.report:
        inputs = {"checkpoint": settings.checkpoint, "data folder": settings.data}
        check_output(settings.report, "--report", inputs, settings.overwrite)
    heads = train_coherence_heads(
        settings.checkpoint, settings.data, settings.seeds, out, not settings.batch_negatives_only
    )
    reports = [report for _, report in heads]
    summary = seed_summary(reports)
    if settings.report:
        Path(settings.report).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(settings.report), {"seeds": reports, "summary": summary, "written": str(out)})
    print(json.dumps({"summary": summary}))


def check_head_folder(out: Path, overwrite: bool) -> None:
    """A UsageError unless the head can be written into folder `out` without replacing one (unless `overwrite`)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    check_writable(out / HEAD_WEIGHTS, "--out")
    existing = [name for name in (HEAD_WEIGHTS, HEAD_CONFIG) if (out / name).exists()]
    if existing and not overwrite:
        raise UsageError(f"--out {out} already holds a coherence head ({', '.join(existing)}); pass --overwrite")


if __name__ == "__main__":
    sys.exit(main())

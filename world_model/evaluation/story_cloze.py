"""Story Cloze accuracy: pick the right one of two endings by its S(4) log-likelihood given S(0..3).

Each ending is scored as the story's S(4) after the four context sentences, by
    a 4-tensor model   log_softmax(last_slice_logits(context)) at the ending's non-padding tokens
    the baseline       `score_sentences`: its teacher-forced log-likelihood, the closing [EOS] included
    a count floor      `CountFloor.token_log_probs`
"summed" picks the ending of higher total log-likelihood, "per_token" the higher mean over the scored tokens
(the baseline's [EOS] counts as one). A tie earns half a story (the expected score of a coin flip).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from world_model.data.rocstories import ClozeStory, encode_cloze
from world_model.evaluation.floors import CountFloor
from world_model.text.vocab import PAD_ID, Vocabulary
from world_model.utils.eval_mode import eval_mode

VARIANTS = ("summed", "per_token")
REFERENCES = {  # published Story Cloze accuracies (test set of the spring 2016 release)
    "chance": 0.5,
    "DSSM (Mostafazadeh et al., 2016)": 0.585,
    "Roemmele et al., 2017": 0.672,
    "GPT-1 (Radford et al., 2018)": 0.865,
}

Scorer = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def four_tensor_scores(
    model: nn.Module, context: torch.Tensor, endings: torch.Tensor, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-likelihood and scored-token count of each ending, (S, K) each, under a 4-tensor model:
    context (S, 4, N), endings (S, K, N).

    `log_softmax` is applied to `last_slice_logits` in every case: it leaves log-probabilities unchanged."""
    device = next(model.parameters()).device
    sums = []
    with eval_mode(model):
        for start in range(0, len(context), batch_size):
            log_p = (
                model.last_slice_logits(context[start : start + batch_size].to(device)).float().log_softmax(-1)
            )  # (B, N, V)
            ends = endings[start : start + batch_size].to(device).long()  # (B, K, N)
            slots = torch.arange(ends.shape[-1], device=device)[None, None, :]
            picked = log_p[torch.arange(len(ends), device=device)[:, None, None], slots, ends]  # (B, K, N)
            sums.append(torch.where(ends != PAD_ID, picked, 0.0).sum(-1).double().cpu())
    return torch.cat(sums), (endings != PAD_ID).sum(-1).double()


@torch.no_grad()
def baseline_scores(
    model: nn.Module, context: torch.Tensor, endings: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-likelihood (closing [EOS] included) and scored-token count of each ending (S, K, N) under the
    baseline, (S, K) each."""
    device = next(model.parameters()).device
    with eval_mode(model):
        sums = model.score_sentences(context.to(device), endings.to(device)).double().cpu()
    return sums, (endings != PAD_ID).sum(-1).double() + 1


def floor_scores(floor: CountFloor, context: torch.Tensor, endings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-likelihood and scored-token count of each ending (S, K, N) under a count floor, (S, K) each."""
    sums = floor.token_log_probs(context, endings).sum(-1)
    return sums, (endings != PAD_ID).sum(-1).double()


def model_scorer(model: nn.Module, batch_size: int = 64) -> Scorer:
    """The scorer of a loaded model, by what it declares it scores: whole sentences (the baseline's
    `score_sentences`), else the next state's slots (the 4-tensor last slice)."""
    if model.scores_sentences:
        return lambda context, endings: baseline_scores(model, context, endings)
    if model.scores_slots:
        return lambda context, endings: four_tensor_scores(model, context, endings, batch_size)
    raise ValueError(f"{type(model).__name__} scores neither whole sentences nor slots: it cannot score endings")


def floor_scorer(floor: CountFloor) -> Scorer:
    """The scorer of a count floor."""
    return lambda context, endings: floor_scores(floor, context, endings)


def choice_accuracy(scores: torch.Tensor, answer: torch.Tensor) -> float:
    """Share of stories whose right ending (column answer[s] of scores (S, 2)) scores above the other; a tie earns
    half a story."""
    right, wrong = scores.gather(1, answer[:, None])[:, 0], scores.gather(1, 1 - answer[:, None])[:, 0]
    return float(((right > wrong).double() + 0.5 * (right == wrong).double()).mean())


def accuracy(sums: torch.Tensor, tokens: torch.Tensor, answer: torch.Tensor) -> dict:
    """{"summed", "per_token"} accuracy of picking the higher-scored ending (S, 2) against `answer` (S,) in {0, 1}."""
    return {
        variant: choice_accuracy(score, answer) for variant, score in (("summed", sums), ("per_token", sums / tokens))
    }


def story_cloze(scorer: Scorer, halves: dict[str, list[ClozeStory]], vocab: Vocabulary, n: int = 16) -> dict:
    """{half: {"summed", "per_token", "stories"}} for every half of `halves` (see `load_cloze_halves`)."""
    out = {}
    for half, items in halves.items():
        if not items:
            raise ValueError(f"the {half!r} half holds no Story Cloze item")
        context, endings, answer = encode_cloze(items, vocab, n)
        out[half] = {**accuracy(*scorer(context, endings), answer), "stories": len(items)}
    return out

"""Coherence: does a predictor prefer the next sentence that fits the story?

Three measures on the Story Cloze stories (four context sentences, a right and a wrong fifth sentence):

Story Cloze with a fixed decision rule. A scorer gives each ending e its summed log-likelihood L(e | context) and
its scored-token count n(e); L0(e) is the same scorer's log-likelihood after a blank context (every context slot
padding: what the scorer expects of a fifth sentence knowing nothing of the story). The rules (`RULES`):
    summed           L
    per_token        L / n
    ratio_summed     L - L0                (how much the story raised the ending)
    ratio_per_token  (L - L0) / n
The rule is the one of highest accuracy on the val half (the first in `RULES` order on a tie); the test half,
read with that rule only, is the result (`cloze_with_rule`).

Next-sentence retrieval. Every story ranks 100 candidates (`retrieval_endings`): its right ending, its own wrong
ending and the right endings of 98 other cloze stories drawn with a fixed seed, by the chosen rule.
recall@k is the share of stories whose right ending ranks k or better, MRR the mean of 1 / rank. Ties are ranked
at random, in expectation (`retrieval_metrics`): a right ending tied with t others above g better ones has each
rank g + 1 .. g + t + 1 with chance 1 / (t + 1).

Restatement. A predicted sentence restates its context when RESTATED_SHARE or more of its distinct content words
(word tokens outside the commonest words of the training stories) stand in one context sentence
(`restates`); a sentence without content words restates nothing.

Shapes: S stories, K candidate endings a story, N token slots a sentence.
"""

from __future__ import annotations

from typing import Sequence

import torch

from world_model.data.rocstories import ClozeStory, encode_cloze
from world_model.evaluation.story_cloze import Scorer, choice_accuracy
from world_model.models.coherence_head import CoherenceHead, likelihood_ratio, token_log_likelihood
from world_model.text.vocab import Vocabulary

RULES = ("summed", "per_token", "ratio_summed", "ratio_per_token")
LIKELIHOOD_FREE_RULES = ("summed",)  # for a scorer whose "log-likelihood" is a similarity score
RETRIEVAL_CANDIDATES = 100  # the right ending, its wrong ending and 98 right endings of other stories
RETRIEVAL_SEED = 0
RECALL_AT = (1, 10)
RESTATED_SHARE = 0.7
HEAD_BATCH = 64  # windows at a time through the frozen predictor and the coherence head


def rule_scores(sums: torch.Tensor, tokens: torch.Tensor, blank_sums: torch.Tensor) -> dict[str, torch.Tensor]:
    """{rule: score (S, K)} of every rule of `RULES` from the summed log-likelihoods (S, K) after the context, the
    scored-token counts (S, K) and the summed log-likelihoods (S, K) after a blank context."""
    return {
        "summed": sums,
        "per_token": sums / tokens,
        "ratio_summed": sums - blank_sums,
        "ratio_per_token": (sums - blank_sums) / tokens,
    }


def blank_context(context: torch.Tensor) -> torch.Tensor:
    """A context of the same shape (S, 4, N) with every slot padding."""
    return torch.zeros_like(context)


def scored_rules(scorer: Scorer, context: torch.Tensor, endings: torch.Tensor, rules: Sequence[str]) -> dict:
    """{rule: score (S, K)} of `endings` (S, K, N) after `context` (S, 4, N), for the given rules (the blank context
    is scored only when a ratio rule asks for it)."""
    sums, tokens = scorer(context, endings)
    blank = scorer(blank_context(context), endings)[0] if any(r.startswith("ratio") for r in rules) else sums
    scores = rule_scores(sums.double(), tokens.double(), blank.double())
    return {rule: scores[rule] for rule in rules}


def cloze_with_rule(per_half: dict[str, dict[str, float]]) -> dict:
    """The decision rule of highest val accuracy and the accuracies with it: per_half {half: {rule: accuracy}},
    with a "val" half -> {"rule", "val", "test" (when there is a test half), "rules": per_half}."""
    if "val" not in per_half:
        raise ValueError(f"the decision rule is chosen on the val half; halves given: {sorted(per_half)}")
    val = per_half["val"]
    rule = max(val, key=lambda r: (val[r], -list(val).index(r)))
    return {"rule": rule, **{half: accuracies[rule] for half, accuracies in per_half.items()}, "rules": per_half}


def retrieval_others(stories: int, seed: int = RETRIEVAL_SEED, others: int = RETRIEVAL_CANDIDATES - 2) -> torch.Tensor:
    """(S, others) indices of other stories, distinct within a row and never the row's own, drawn with `seed`."""
    if stories <= others:
        raise ValueError(
            f"retrieval draws {others} other stories a story, so it needs more than {others}, got {stories}"
        )
    generator = torch.Generator().manual_seed(seed)
    draws = torch.stack([torch.randperm(stories - 1, generator=generator)[:others] for _ in range(stories)])
    return draws + (draws >= torch.arange(stories)[:, None]).long()  # skip the row's own story


def retrieval_endings(endings: torch.Tensor, answer: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """Candidates (S, 2 + O, N) from the cloze endings (S, 2, N), right-ending index (S,) and other stories (S, O):
    column 0 the right ending, column 1 the wrong one, then the right endings of the other stories."""
    rows = torch.arange(len(endings))
    right, wrong = endings[rows, answer], endings[rows, 1 - answer]  # (S, N)
    return torch.cat([right[:, None], wrong[:, None], right[others]], dim=1)


def retrieval_candidates(
    endings: torch.Tensor, answer: torch.Tensor, seed: int = RETRIEVAL_SEED, others: int = RETRIEVAL_CANDIDATES - 2
) -> torch.Tensor:
    """`retrieval_endings` with `others` other stories a story drawn by `retrieval_others` (all the other stories
    where there are fewer): candidates (S, 2 + O, N), column 0 the right ending, column 1 the wrong one."""
    others = min(others, len(endings) - 1)
    return retrieval_endings(endings, answer, retrieval_others(len(endings), seed, others))


def retrieval_metrics(scores: torch.Tensor, recall_at: Sequence[int] = RECALL_AT) -> dict:
    """recall@k and MRR of scores (S, C) whose right candidate is column 0, ties ranked at random in expectation:
    {"recall_at_1", "recall_at_10", "mrr", "candidates"}."""
    right = scores[:, :1]
    better = (scores[:, 1:] > right).sum(1).double()  # g
    tied = (scores[:, 1:] == right).sum(1).double()  # t
    result = {f"recall_at_{k}": float(((k - better) / (tied + 1)).clamp(0, 1).mean()) for k in recall_at}
    ranks = better[:, None] + 1 + torch.arange(scores.shape[1], dtype=torch.float64)[None, :]  # g + 1 .. g + C
    reciprocal = torch.where(ranks <= better[:, None] + tied[:, None] + 1, 1 / ranks, 0.0).sum(1) / (tied + 1)
    return {**result, "mrr": float(reciprocal.mean()), "candidates": scores.shape[1]}


def coherence_report(
    scorer: Scorer,
    halves: dict[str, list[ClozeStory]],
    vocab: Vocabulary,
    n: int = 16,
    rules: Sequence[str] = RULES,
    seed: int = RETRIEVAL_SEED,
    others: int = RETRIEVAL_CANDIDATES - 2,
) -> dict:
    """Story Cloze with the rule chosen on the val half (`cloze_with_rule`) and next-sentence retrieval over the
    stories of all halves with that rule, `others` other stories' right endings a story (all other stories where
    there are fewer): {"rule", "val", "test", "rules", "retrieval": `retrieval_metrics`}."""
    per_half, encoded = {}, []
    for half, items in halves.items():
        if not items:
            raise ValueError(f"the {half!r} half holds no Story Cloze item")
        context, endings, answer = encode_cloze(items, vocab, n)
        scores = scored_rules(scorer, context, endings, rules)
        per_half[half] = {rule: choice_accuracy(s, answer) for rule, s in scores.items()}
        encoded.append((context, endings, answer))
    report = cloze_with_rule(per_half)
    context, endings, answer = (torch.cat(parts) for parts in zip(*encoded))
    candidates = retrieval_candidates(endings, answer, seed, others)
    ranked = scored_rules(scorer, context, candidates, (report["rule"],))[report["rule"]]
    return {**report, "retrieval": retrieval_metrics(ranked)}


def content_words(tokens: Sequence[str], common: frozenset[str]) -> set[str]:
    """The distinct word tokens (with a letter or digit) of a tokenized sentence outside `common`."""
    return {t for t in tokens if any(ch.isalnum() for ch in t) and t not in common}


def restates(
    predicted: Sequence[str], context: Sequence[Sequence[str]], common: frozenset[str], share: float = RESTATED_SHARE
) -> bool:
    """Whether `share` or more of the predicted sentence's content words (`content_words`) stand in one of the
    context sentences (each a token list); False for a sentence without content words."""
    words = content_words(predicted, common)
    if not words:
        return False
    return any(len(words & content_words(sentence, common)) >= share * len(words) for sentence in context)


def restatement_rate(
    predicted: Sequence[Sequence[str]], contexts: Sequence[Sequence[Sequence[str]]], common: frozenset[str]
) -> float:
    """Share of predicted sentences (token lists) that restate their context (`restates`)."""
    if len(predicted) != len(contexts) or not predicted:
        raise ValueError(f"need one context per predicted sentence, got {len(predicted)} and {len(contexts)}")
    return sum(restates(p, c, common) for p, c in zip(predicted, contexts)) / len(predicted)


@torch.no_grad()
def head_parts(head: CoherenceHead, model, context: torch.Tensor, endings: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(head scores, predictor likelihood ratios, predictor per-token log-likelihoods) of endings (S, K, N) after
    contexts (S, 4, N), each (S, K); `head.combined(*parts)` is the head's score."""
    scores, ratios, likelihoods = [], [], []
    for start in range(0, len(context), HEAD_BATCH):
        window, ends = context[start : start + HEAD_BATCH].long(), endings[start : start + HEAD_BATCH].long()
        vectors, log_probs, blank = head.context_and_log_probs(model, window)
        scores.append(head.head_scores(vectors, ends))
        ratios.append(likelihood_ratio(log_probs, blank, ends))
        likelihoods.append(token_log_likelihood(log_probs, ends))
    return tuple(torch.cat(part).double() for part in (scores, ratios, likelihoods))


def head_scorer(head: CoherenceHead, model):
    """A Story Cloze scorer (`world_model.evaluation.story_cloze.Scorer`) of the head's score: (scores, ones)."""

    def score(context: torch.Tensor, endings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = head.combined(*head_parts(head, model, context, endings))
        return scores, torch.ones_like(scores)

    return score

"""Sentence-bank readout: predict whole sentences of open text, picked from a bank of corpus sentences.

The 4-tensor model reads each word slot of the next sentence off its own distribution p_xv (section 3.7); on
open-ended stories the per-slot winners come from different sentences and read as none ("he he to kitchen.").
The bank readout scores every sentence of a bank (the training stories' sentences, about 100,000) as the next
state with the model's per-slot log-likelihood (`world_model.models.decoding.slot_log_likelihood`, one gather per
candidate), divided by the candidate's length to the power `length_power` (the summed score alone favours the
shortest sentences), and takes the best. Two rules keep the result about the story being told:

- **Names.** A bank sentence about "Anna" is scored and returned about the window's own people: the person
  names of a bank sentence, in order of first appearance, are replaced by those of the window, in order of
  first appearance ("Anna's" by "Tom's" when the vocabulary has it). Names are the words the bank's own text
  capitalises mid-sentence and follows with a verb (`world_model.generation.bank_file.find_names`).
- **Repeat guard.** A sentence already in the window is never predicted again, so a rollout does not loop.

Opt-in, with a predictor folder's coherence head (`world_model.models.coherence_head`, `--coherence` of the
commands): each sentence's score gains `COHERENCE_WEIGHT` times the head's score of it as the next sentence (the
head's similarity of the window and the sentence, plus its weight times the predictor's per-token likelihood ratio
against a blank window), so the pick follows what the head learned comes next rather than what restates the window.

A predictor folder carries its bank as sentence_bank.json.gz (`world_model.generation.bank_file`, written by
`python -m world_model.generation.sentence_bank`);
any folder with one reads its states off the bank unless told otherwise (`world_model.generation.readouts`).

    python -m world_model.generation.sentence_bank --data ../shared/data/rocstories --out world_model/pretrained/rocstories-cpu
"""

from __future__ import annotations

import world_model.utils.quiet_start  # noqa: F401  (first: a stop signal while libraries import exits quietly)

# isort: split
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from world_model.generation.bank_file import BANK_NAME, SentenceBank, write_rocstories_bank
from world_model.models.coherence_head import (
    CoherenceHead,
    pooled_state,
    readout_log_probs,
)
from world_model.models.decoding import choose_candidates
from world_model.models.explanations import LastSliceProbe, StepExplanation, closed_set_choice
from world_model.models.generation_config import GREEDY, GenerationConfig, draw_probability
from world_model.models.rollout import slide_rollout
from world_model.text.vocab import PAD_ID
from world_model.utils.cli import check_output
from world_model.utils.flags import settings_main

SAMPLE_TOP_K = 20  # sampling draws among this many best sentences unless top_k is given: over the whole bank,
# length-normalised scores are nearly flat and a draw is any sentence at all
# score = summed slot log-likelihood / length ** LENGTH_POWER, chosen in results/readout/selection.md
LENGTH_POWER = 1.5
# weight of the coherence head's score beside the length-normalised likelihood, chosen on held-out training stories
# (results/coherence/readout/coherence_selection.md: highest content-word F1)
COHERENCE_WEIGHT = 0.1


def slot_log_probs(model, window: torch.Tensor) -> torch.Tensor | None:
    """Per-slot log-probabilities (B, N, V) of the next state for a model that `scores_slots` (the 4-tensor
    predictor), padding and the unknown word excluded as in its own readout; None for one that does not (the flat
    baseline scores whole sentences instead)."""
    return CoherenceHead.slot_log_probs(model, window) if model.scores_slots else None


def bank_scores(
    bank: SentenceBank,
    edits: tuple[torch.Tensor, ...],
    log_probs: torch.Tensor | None = None,
    model=None,
    window: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-likelihood (C,) of every bank sentence, with `edits` (`name_edits`) applied, as the next state.

    For the 4-tensor model, from its per-slot `log_probs` (N, V) of one window: the sum over content slots
    of log_probs[n, candidate[n]] (`slot_log_likelihood`), computed as one gather over the bank and a correction
    at the edited slots, so the substituted bank is never written. Otherwise `model.score_sentences` on the
    window (1, T, N) and the substituted bank (the flat baseline).
    """
    if log_probs is None:
        return model.score_sentences(window, bank.substitute_edits(edits))[0].cpu()
    n_tokens, vocab_size = log_probs.shape
    table = log_probs.masked_fill(torch.arange(vocab_size) == PAD_ID, 0.0).flatten()  # a padding slot adds 0
    offsets = torch.arange(n_tokens) * vocab_size  # slot n's row of the flattened (N, V) table
    scores = table[bank.candidates + offsets].sum(dim=1)  # (C,)
    rows, slots, new = edits
    old = bank.candidates[rows, slots]
    return scores.index_add_(0, rows, table[offsets[slots] + new] - table[offsets[slots] + old])


def seen_in_window(bank: SentenceBank, edits: tuple[torch.Tensor, ...], window: torch.Tensor) -> torch.Tensor:
    """Which bank sentences (C,) bool, with `edits` applied, equal a state of the window (T, N): a hash of each
    row narrows the search, an exact comparison decides."""
    rows, slots, new = edits
    weights = bank.hash_weights
    hashes = bank.hashes.clone().index_add_(0, rows, (new - bank.candidates[rows, slots]) * weights[slots])
    maybe = torch.isin(hashes, (window * weights).sum(dim=1)).nonzero().flatten()
    seen = torch.zeros(len(hashes), dtype=torch.bool)
    if len(maybe):
        rows_now = bank.substitute_edits(edits, maybe)  # (M, N)
        seen[maybe] = (rows_now[:, None, :] == window[None]).all(dim=-1).any(dim=-1)
    return seen


def guarded(
    scores: torch.Tensor, bank: SentenceBank, edits: tuple[torch.Tensor, ...], window: torch.Tensor
) -> torch.Tensor:
    """The bank's scores (C,) with the sentences already in the window (T, N) at -inf, unless that is all of them."""
    seen = seen_in_window(bank, edits, window)
    return scores if seen.all() else scores.masked_fill(seen, float("-inf"))


def step_explanation(
    choices: list[tuple[torch.Tensor, ...]], state: torch.Tensor, log_probs: torch.Tensor | None, probe
) -> StepExplanation:
    """One bank rollout step's `StepExplanation` (on the CPU) from each window's (p, alternatives, their p, draw
    probability or None) choice, the chosen states (B, N), the per-slot log-probabilities (B, N, V) (None for a model
    without them) and the `LastSliceProbe` that watched the forward pass."""
    p, alts, p_alts, drawn = zip(*choices)
    p, alts, p_alts = torch.cat(p), torch.cat(alts), torch.cat(p_alts)
    drawn = None if drawn[0] is None else torch.cat(drawn)
    seen = {} if log_probs is None else probe.attribution(state.to(log_probs.device), log_probs, PAD_ID)
    seen = {k: None if v is None else v.cpu() for k, v in seen.items()}
    return StepExplanation(p, alts, p_alts, **seen, draw_probability=drawn)


@dataclass
class CoherentRanking:
    """What the coherence head adds to the bank scores of one step: the head, its sentence vectors of the bank
    (C, dim), the window's context vectors (B, dim) and the predictor's per-slot log-probabilities after a blank
    window (N, V)."""

    head: CoherenceHead
    sentences: torch.Tensor
    context: torch.Tensor | None = None
    blank: torch.Tensor | None = None
    blanks: dict[int, torch.Tensor] = field(default_factory=dict)  # blank log-probabilities by window length

    @classmethod
    def for_bank(cls, head: CoherenceHead, bank: SentenceBank) -> "CoherentRanking":
        """The ranking of `bank` with `head`; the bank's sentence vectors are computed once per bank and head."""
        weight = head.sentence_encoder.embedding.weight
        key = (id(head), weight.data_ptr(), weight._version)
        if key not in bank.coherence_vectors:
            bank.coherence_vectors = {key: head.sentence_encoder(bank.candidates)}  # the latest head's only
        return cls(head, bank.coherence_vectors[key])

    def read(self, model, window: torch.Tensor) -> torch.Tensor:
        """Set the context vectors for the windows (B, T, N) of this step and return the predictor's per-slot
        log-probabilities (B, N, V) after them, both from one encoding of the windows (`read_blank` first)."""
        X = model.encode(window)  # (B, N, T, d)
        self.context = self.head.context_vectors(pooled_state(X, window), window).cpu()
        return readout_log_probs(model.slice_logits(X, window, X.shape[2] - 1))

    def read_blank(self, model, window: torch.Tensor) -> None:
        """Set the blank log-probabilities for windows of this length (computed once per length)."""
        length = window.shape[1]
        if length not in self.blanks:
            self.blanks[length] = self.head.slot_log_probs(model, torch.zeros_like(window[:1]))[0].cpu()
        self.blank = self.blanks[length]

    def scores(self, b: int, bank: SentenceBank, edits: tuple[torch.Tensor, ...], likelihood: torch.Tensor):
        """The head's score (C,) of every bank sentence after window b, given their summed log-likelihoods (C,)."""
        blank = bank_scores(bank, edits, self.blank)
        tokens = (bank.candidates != PAD_ID).sum(dim=1).clamp(min=1)
        ratio = (likelihood - blank) / tokens
        return self.head.combined(self.head.scale * (self.sentences @ self.context[b]), ratio, likelihood / tokens)


@dataclass(frozen=True)
class BankRanking:
    """How `bank_rollout` ranks the bank: the window's `names` put in, sentences already in the window excluded
    (`guard`), scores divided by length ** `length_power`, and `coherence_weight` times the `coherence` head's
    score added when a head is given."""

    names: bool = True
    guard: bool = True
    length_power: float = LENGTH_POWER
    coherence: CoherenceHead | None = None
    coherence_weight: float = COHERENCE_WEIGHT


@torch.no_grad()
def bank_rollout(
    model,
    window: torch.Tensor,
    steps: int,
    bank: SentenceBank,
    ranking: BankRanking = BankRanking(),
    generation: GenerationConfig = GREEDY,
    generator: torch.Generator | None = None,
    explanations: list[StepExplanation] | None = None,
) -> torch.Tensor:
    """Predict `steps` states of each window (B, T, N) -> (B, steps, N), each a bank sentence.

    Each step scores the bank for every window (`bank_scores`), ranks it as `ranking` says (module docstring),
    takes the best (`generation.temperature` 0) or samples from softmax(score / temperature) within its top_k
    (default `SAMPLE_TOP_K`), and slides the window as `model.rollout` does. The bank stays on the CPU; the model
    runs where its weights are, and the states come back on the window's device. Given a list, `explanations`
    receives each step's `StepExplanation` (on the CPU): probabilities are the softmax of the length-normalised
    scores over the bank (guarded sentences 0), with `generation.alternatives` runner-ups.
    """
    device, top_k = window.device, generation.top_k or SAMPLE_TOP_K
    index = torch.arange(len(bank.candidates))[:, None]  # (C, 1): `choose_candidates` then returns row numbers
    length = (bank.candidates != PAD_ID).sum(dim=1).float() ** ranking.length_power  # (C,)
    if ranking.coherence is not None and not model.scores_slots:
        raise ValueError("a coherence head reads the 4-tensor predictor's state; this model has none")
    coherent = None if ranking.coherence is None else CoherentRanking.for_bank(ranking.coherence.cpu(), bank)

    def next_state(window: torch.Tensor) -> torch.Tensor:  # (B, T, N) on the CPU -> (B, N)
        window_device = window.to(device)
        if coherent is not None:
            coherent.read_blank(model, window_device)  # outside the probe: it watches the step's own pass only
        with LastSliceProbe(model, active=explanations is not None) as probe:
            log_probs = (
                slot_log_probs(model, window_device) if coherent is None else coherent.read(model, window_device)
            )
        states, choices = [], []
        for b in range(len(window)):
            edits = bank.name_edits(bank.context_names(window[b]) if ranking.names else [])
            likelihood = bank_scores(
                bank, edits, None if log_probs is None else log_probs[b].cpu(), model, window[b : b + 1].to(device)
            )
            scores = likelihood / length
            if coherent is not None:
                scores = scores + ranking.coherence_weight * coherent.scores(b, bank, edits, likelihood)
            if ranking.guard:
                scores = guarded(scores, bank, edits, window[b])
            row = choose_candidates(scores[None], index, generation.temperature, top_k, generator)[0]  # (1,)
            states.append(bank.substitute_edits(edits, row)[0])
            if explanations is not None:
                p, rows, p_rows = closed_set_choice(scores[None], row, generation.alternatives)
                sampled = generation.temperature > 0
                drawn = draw_probability(scores[None], row, generation.temperature, top_k) if sampled else None
                choices.append((p, bank.substitute_edits(edits, rows[0])[None], p_rows, drawn))
        state = torch.stack(states)  # (B, N)
        if explanations is not None:
            explanations.append(step_explanation(choices, state, log_probs, probe))
        return state

    return slide_rollout(window.cpu(), steps, model.config.n_states, next_state).to(device)


@dataclass
class BankSettings:
    """Which stories make the bank and which predictor folder receives it."""

    data: str = field(metadata={"help": "ROCStories folder (its training stories make the bank)"})
    out: str = field(metadata={"help": "predictor folder (gets sentence_bank.json.gz)"})
    stories: int | None = field(default=None, metadata={"help": "only the first K training stories"})


def main(argv: list[str] | None = None) -> int:
    return settings_main(
        BankSettings,
        "world_model.generation.sentence_bank",
        "Write a predictor folder's sentence bank from ROCStories training stories.",
        lambda settings, command: write_bank_command(settings),
        argv,
    )


def write_bank_command(settings: BankSettings) -> None:
    """The command's work: the bank written into the predictor folder (its old bank replaced), and its size."""
    check_output(Path(settings.out) / BANK_NAME, "--out", overwrite=True)
    path = write_rocstories_bank(settings.out, settings.data, settings.stories)
    print(f"{path}: {path.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())

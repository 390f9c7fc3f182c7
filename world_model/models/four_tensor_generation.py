"""How the 4-tensor predictor reads sentences off its logits and rolls a window forward: `decode_state` (per-slot
or closed-set readout), `explain_state` (why a state was chosen), and the sliding-window `rollout`.

Axis names as in `world_model.models.four_tensor`: B batch, T sentences, N token slots, V vocabulary, C candidates.
"""

from __future__ import annotations

import torch

from world_model.models.decoding import check_candidates, choose_candidates, slot_log_likelihood
from world_model.models.explanations import (
    ALTERNATIVES,
    LastSliceProbe,
    StepExplanation,
    closed_set_choice,
    token_choice,
)
from world_model.models.generation_config import GREEDY, GenerationConfig, after_first, draw_probability, sample_ids
from world_model.models.rollout import slide_rollout


class FourTensorGeneration:
    """`decode_state`, `explain_state` and `rollout` for the 4-tensor model (`FourTensorModel` mixes it in; it
    uses the model's `config`, `check_token_ids` and `last_slice_logits`)."""

    def decode_state(
        self,
        logits: torch.Tensor,
        generation: GenerationConfig = GREEDY,
        generator: torch.Generator | None = None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Read one predicted sentence off its logits: (B, N, V) -> token ids (B, N).

        Length rule. Padding is never a training target (it is dropped by the ignore index) and its logit
        is fixed at 0 by the zero padding row, so it carries no information about where a sentence ends.
        The padding column, the unknown word (its logit is pinned at 0 the same way) and any id in
        `generation.banned_ids` are therefore excluded; every slot gets a content token, and the sentence
        ends at the first slot whose token is one of `generation.end_ids` (the sentence-final punctuation the
        corpus ends its sentences with). Slots after it are padding. With no end token the sentence fills all
        N slots.

        Each slot's token follows `sample_ids` (greedy at temperature 0, else a draw within the top_k ids, from
        `generator` for reproducible futures).

        Closed-set readout. With `candidates` (C, N), the known sentences (`world_model.models.decoding`), the
        sentence is one of them instead: each is scored by the summed log-probability of its content slots
        under the per-slot distributions (the excluded ids removed), and the highest score is taken, or one
        is sampled from softmax(score / temperature) (top_k then counts candidates). end_ids is not used.
        """
        c = self.config
        logits = self.readout_logits(logits, generation)
        if candidates is not None:
            check_candidates(candidates, c.n_tokens, c.padding_idx, c.vocab_size)
            candidates = candidates.to(logits.device).long()
            scores = slot_log_likelihood(logits.log_softmax(dim=-1), candidates, c.padding_idx)  # (B, C)
            return choose_candidates(scores, candidates, generation.temperature, generation.top_k, generator)
        ids = sample_ids(logits, generation.temperature, generation.top_k, generator)  # (B, N)
        if generation.end_ids:
            is_end = torch.isin(ids, torch.tensor(generation.end_ids, device=ids.device))
            ids = ids.masked_fill(after_first(is_end), c.padding_idx)
        return ids

    def readout_logits(self, logits: torch.Tensor, generation: GenerationConfig = GREEDY) -> torch.Tensor:
        """The logits (B, N, V) as `decode_state` reads them: fp32, -inf at padding, the unknown word and
        `generation.banned_ids`."""
        c = self.config
        logits = logits.float().clone()
        excluded = [c.padding_idx, *generation.banned_ids]
        if c.unknown_idx is not None:
            excluded.append(c.unknown_idx)
        logits[..., excluded] = float("-inf")
        return logits

    def explain_state(
        self,
        logits: torch.Tensor,
        state: torch.Tensor,
        probe: LastSliceProbe,
        generation: GenerationConfig = GREEDY,
        candidates: torch.Tensor | None = None,
        alternatives: int = ALTERNATIVES,
    ) -> StepExplanation:
        """Why `decode_state` chose the states (B, N) off these logits (B, N, V), and how sure it was: the
        `world_model.models.explanations` record, with the attention and copy path of `probe`, which watched the
        forward passes that gave the logits (S passes: the rows of each stacked along the batch axis, S*B in all,
        pass-major)."""
        c = self.config
        log_probs = self.readout_logits(logits, generation).log_softmax(dim=-1)
        sampled, drawn = generation.temperature > 0, None
        if candidates is None:
            choice = token_choice(log_probs, state, c.padding_idx, generation.end_ids, alternatives)
            if sampled:  # each content slot was drawn on its own; the slots after the end token do not matter
                slots = draw_probability(log_probs, state, generation.temperature, generation.top_k)  # (B, N)
                drawn = slots.masked_fill(state == c.padding_idx, 1.0).prod(dim=1)
        else:
            candidates = candidates.to(state.device).long()
            scores = slot_log_likelihood(log_probs, candidates, c.padding_idx)  # (B, C)
            chosen = (candidates[None] == state[:, None]).all(dim=-1).float().argmax(dim=1)  # (B,)
            p, rows, p_rows = closed_set_choice(scores / generation.confidence_temperature, chosen, alternatives)
            choice = (p, candidates[rows], p_rows)
            if sampled:
                drawn = draw_probability(scores, chosen, generation.temperature, generation.top_k)
        seen = probe.attribution(state, log_probs, c.padding_idx)
        return StepExplanation(*choice, **seen, draw_probability=drawn)

    @torch.no_grad()
    def rollout(
        self,
        token_ids: torch.Tensor,
        steps: int,
        generation: GenerationConfig = GREEDY,
        generator: torch.Generator | None = None,
        candidates: torch.Tensor | None = None,
        explanations: list[StepExplanation] | None = None,
        alternatives: int = ALTERNATIVES,
    ) -> torch.Tensor:
        """Predict `steps` future sentences from a window (B, T, N) -> (B, steps, N).

        Each step reads the next sentence off the last slice, appends the prediction, drops the oldest
        sentence once the window holds T, and writes the new window again onto positions 0..T-1 (the temporal
        embedding is recomputed from those positions, section 2.3). Decoding follows `decode_state` (with
        `candidates`, every predicted sentence is one of them). Given a list, `explanations` receives each step's
        `explain_state` (with `alternatives` runner-ups), read off the same forward passes, all steps at once.
        """
        self.check_token_ids(token_ids)
        seen = []  # (logits (B, N, V), state (B, N)) of each step

        def next_state(window: torch.Tensor) -> torch.Tensor:
            logits = self.last_slice_logits(window)  # (B, N, V)
            state = self.decode_state(logits, generation, generator, candidates)
            seen.append((logits, state))
            return state

        with LastSliceProbe(self, active=explanations is not None) as probe:
            predicted = slide_rollout(token_ids, steps, self.config.n_states, next_state)
        if explanations is not None:
            logits, states = (torch.cat(parts) for parts in zip(*seen))  # steps stacked along the batch axis
            explained = self.explain_state(logits, states, probe, generation, candidates, alternatives)
            explanations += explained.split(steps, probe.lengths)
        return predicted

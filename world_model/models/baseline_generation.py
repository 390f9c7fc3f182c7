"""Closed-set scoring and generation of the flat baseline (`BaselineGeneration`, a mixin of
`world_model.models.baseline.BaselineModel` on top of its KV cache).

Shapes: B windows, T' <= T sentences in a window, N token slots, C candidates, G longest candidate span
(content ids, then [EOS]), R (window, candidate) rows of one chunk, V output table.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from world_model.models.decoding import check_candidates, choose_candidates
from world_model.models.generation_config import GREEDY, GenerationConfig, after_first, sample_ids
from world_model.models.kernels import linear_cross_entropy
from world_model.models.kv_cache import CachedDecoding
from world_model.models.rollout import slide_rollout


def gold_log_probs(states: torch.Tensor, gold: torch.Tensor, readout: torch.Tensor) -> torch.Tensor:
    """log softmax(states readout^T)[gold] of states (n, d), gold ids (n,) and the readout table (V, d) -> (n,).

    Without autograd the fused kernel (`linear_cross_entropy`) computes it a block of rows at a time; with autograd,
    the plain expression (the logits and their logsumexp), whose gradient flows to both inputs row by row."""
    if torch.is_grad_enabled() and (states.requires_grad or readout.requires_grad):
        logits = F.linear(states, readout)  # (n, V)
        return logits.gather(1, gold[:, None])[:, 0] - logits.logsumexp(dim=-1)
    _, ce, _ = linear_cross_entropy(states.detach(), readout.detach().T, gold, argmax_from=len(gold))
    return -ce


class BaselineGeneration(CachedDecoding):
    """`score_sentences`, `generate` and `rollout` for the baseline (see `world_model.models.baseline`)."""

    # ----- closed-set scoring -----
    def score_sentences(
        self, token_ids: torch.Tensor, candidates: torch.Tensor, chunk_rows: int | None = None
    ) -> torch.Tensor:
        """Teacher-forced log-likelihood of each candidate as the next sentence: window (B, T', N) with
        1 <= T' <= T, candidates (C, N) shared by every window or (B, C, N), window b's own -> scores (B, C).

        scores[b, c] = sum_k log softmax(logits)[gold_k] over the candidate's span exactly as `pack` builds a
        training target: its non-padding ids in order, then [EOS]. Training (`pack`, `training_step`) puts
        [EOS] after the last content token of every target S(T) and scores it, so [EOS] is what terminates a
        sentence here too (`end_ids` of `generate` are a decoding option, never a training target). The
        conditioning sequence is what the model reads in training with the candidate as S(T): `pack_prefix`
        of the window ([BOS] + its non-padding ids), then the candidate's earlier gold tokens, positions from
        0 and log-probabilities over the whole output table (V = content vocabulary + 2).

        `candidates` must pass `check_candidates` (C >= 1 rows of width N, ids in the content vocabulary
        [0, content_vocab_size), at least one non-padding id per row); the window is checked as in
        `generate`. Padding inside a row is removed as `pack` removes it.

        How it computes: the prefix is the same for every candidate, so each window's prefix runs through the
        causal stack once (`prefill`, which also gives the log-probability of each candidate's first token),
        and only the candidates' tokens run after it: the prefix cache is copied to one row per (window,
        candidate) pair (`KVCache.select`) and each candidate's span but its final [EOS] is fed in one causal
        multi-token pass (`extend_hidden`), its token k at position prefix_len + k, seeing the live prefix and
        its own tokens 0..k, exactly the sequence [BOS] + window + candidate + [EOS] of teacher forcing.
        Only the span's own tokens (not its padding) reach the readout, scored by `gold_log_probs`.
        Windows are prefilled in groups of max(1, chunk_rows // C) and their (window, candidate) rows run
        `chunk_rows` at a time (default: sized to about 2^25 activations per chunk), so memory stays bounded
        under torch.no_grad(); with autograd on, the result is differentiable.
        """
        per_window = self.check_score_inputs(token_ids, candidates)
        C = candidates.shape[-2]
        cand = candidates.flatten(0, 1) if per_window else candidates
        prefix, prefix_len = self.pack_prefix(token_ids)  # (B, Lp), (B,)
        gold, gold_len = self.pack_target(cand.to(token_ids.device))  # (C or B * C, G) and lengths
        if chunk_rows is None:  # per (window, candidate) row: the span's MLP and readout, its copy of the cache
            c, G = self.config, gold.shape[1]
            L = prefix.shape[1] + G  # longest packed sequence, prefix + span, <= max_len
            chunk_rows = max(1, (1 << 25) // (G * (c.d_ff + c.vocab_size) + 4 * L * c.d))
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        group = max(1, chunk_rows // C)  # windows prefilled together; their B_w * C rows then run in chunks
        scores = []
        for w0 in range(0, prefix.shape[0], group):
            lens = prefix_len[w0 : w0 + group]  # (B_w,)
            rows = torch.arange(len(lens) * C, device=prefix.device)  # (window, candidate) row b * C + c
            gold_row = rows + w0 * C if per_window else rows % C  # its candidate's row of `gold`
            spans = gold[gold_row], gold_len[gold_row]  # (B_w * C, G), (B_w * C,)
            scores.append(self.score_spans(prefix[w0 : w0 + group, : int(lens.max())], lens, spans, chunk_rows))
        return torch.cat(scores)

    def check_score_inputs(self, token_ids: torch.Tensor, candidates: torch.Tensor) -> bool:
        """`score_sentences`' checks; True for per-window candidates (B, C, N), False for shared ones (C, N)."""
        c = self.config
        self.check_window(token_ids)
        if not isinstance(candidates, torch.Tensor):
            raise ValueError(
                f"candidates must be a (C, N={c.n_tokens}) tensor of token ids, got {type(candidates).__name__}"
            )
        per_window = candidates.dim() == 3
        if per_window and candidates.shape[0] != token_ids.shape[0]:
            raise ValueError(
                f"per-window candidates (B, C, N) need B = {token_ids.shape[0]} windows, got shape {tuple(candidates.shape)}"
            )
        check_candidates(
            candidates.flatten(0, 1) if per_window else candidates, c.n_tokens, c.padding_idx, c.content_vocab_size
        )
        return per_window

    def score_spans(
        self,
        prefix: torch.Tensor,
        prefix_len: torch.Tensor,
        spans: tuple[torch.Tensor, torch.Tensor],
        chunk_rows: int,
    ) -> torch.Tensor:
        """Log-likelihood of C packed spans after each of B_w prefixes: prefix (B_w, Lp), prefix_len (B_w,),
        spans = (gold (B_w * C, G), gold_len (B_w * C,)) with row b * C + c the span of candidate c after
        prefix b -> scores (B_w, C). Each prefix runs once; the (prefix, span) rows run `chunk_rows` at a time."""
        gold, gold_len = spans
        Bw = prefix.shape[0]
        C = gold.shape[0] // Bw
        live = torch.arange(gold.shape[1], device=gold.device)[None, :] < gold_len[:, None]  # (B_w * C, G)
        logits, cache = self.prefill(prefix, prefix_len)  # (B_w, V)
        first = logits.log_softmax(dim=-1).gather(1, gold[:, 0].view(Bw, C))  # (B_w, C) log p(first gold token)
        rest = []
        for start in range(0, Bw * C, chunk_rows):
            rows = torch.arange(start, min(start + chunk_rows, Bw * C), device=gold.device)  # (R,)
            fed, targets = gold[rows, :-1], gold[rows, 1:]  # (R, G - 1) each
            states = self.extend_hidden(cache.select(rows // C), fed)  # (R, G - 1, d)
            scored = live[rows, 1:]  # (R, G - 1): only the span's own tokens reach the readout
            picked = gold_log_probs(states[scored], targets[scored], self.E.weight)  # (n,) live tokens
            owner = torch.arange(len(rows), device=gold.device)[:, None].expand_as(scored)[scored]  # (n,) their row
            rest.append(picked.new_zeros(len(rows)).index_add(0, owner, picked))
        return first + torch.cat(rest).view(Bw, C)

    # ----- generation -----
    def picker(
        self, generation: GenerationConfig = GREEDY, generator: torch.Generator | None = None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """Token choice on logits (B, V) by `sample_ids` (greedy argmax at temperature 0, the free-running
        objective's rule); `generation.banned_ids` are never chosen."""
        banned = list(generation.banned_ids)

        def pick(logits: torch.Tensor) -> torch.Tensor:
            if banned:
                logits = logits.float().clone()
                logits[:, banned] = float("-inf")
            return sample_ids(logits, generation.temperature, generation.top_k, generator)

        return pick

    @torch.no_grad()
    def generate(
        self,
        token_ids: torch.Tensor,
        generation: GenerationConfig = GREEDY,
        generator: torch.Generator | None = None,
        candidates: torch.Tensor | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """The next sentence from the prefix alone: window (B, T', N) -> content ids (B, N), right-padded.

        A row stops at [EOS] (not stored), after N content tokens, or after storing one of
        `generation.end_ids`. Greedy decoding takes the argmax over the whole table, as the free-running
        objective does, so its accuracy against gold S(T) is `last_correct` of `training_step`; put ids such
        as padding or [BOS] (which `rollout` bans, to keep its windows in the content vocabulary) in
        `generation.banned_ids` to exclude them.

        Closed-set readout. With `candidates` (C, N), the known sentences (`world_model.models.decoding`), each
        row returns one candidate row as given: the one of highest `score_sentences` log-likelihood at
        temperature 0, else a sample from softmax(score / temperature) (top_k then counts candidates;
        `generator` makes it reproducible). end_ids, banned_ids and `use_cache` do not apply then: no token is
        chosen freely.
        """
        c = self.config
        if candidates is not None:
            scores = self.score_sentences(token_ids, candidates)  # (B, C); checks both inputs
            candidates = candidates.to(token_ids.device).long()
            return choose_candidates(scores, candidates, generation.temperature, generation.top_k, generator)
        self.check_window(token_ids)
        prefix, prefix_len = self.pack_prefix(token_ids)
        stop_ids = torch.tensor([c.eos_id, *generation.end_ids], device=token_ids.device)
        _, tokens = self.decode(  # (B, K), K <= N
            prefix,
            prefix_len,
            c.n_tokens,
            self.picker(generation, generator),
            done=lambda t: bool(torch.isin(t, stop_ids).any(dim=1).all()),
            use_cache=use_cache,
        )
        stopped_before = after_first(torch.isin(tokens, stop_ids))
        out = tokens.masked_fill(stopped_before | (tokens == c.eos_id), c.padding_idx)
        return F.pad(out, (0, c.n_tokens - out.shape[1]), value=c.padding_idx)

    @torch.no_grad()
    def rollout(
        self,
        token_ids: torch.Tensor,
        steps: int,
        generation: GenerationConfig = GREEDY,
        generator: torch.Generator | None = None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict `steps` future sentences from a window (B, T', N) -> (B, steps, N).

        Each prediction is appended to the window, which keeps its last T sentences and is packed again;
        decoding follows `generate`, with padding and [BOS] added to the banned ids: neither is content, and a
        padding id inside a predicted state would read as a gap in the next window. With `candidates` (C, N)
        every predicted state is one of its rows (closed-set readout, see `generate`; the banned ids are then
        unused).
        """
        self.check_window(token_ids)
        c = self.config
        generation = replace(generation, banned_ids=(*generation.banned_ids, c.padding_idx, c.bos_id))
        return slide_rollout(
            token_ids, steps, c.n_states, lambda window: self.generate(window, generation, generator, candidates)
        )

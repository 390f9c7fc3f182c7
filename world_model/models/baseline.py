"""The flat autoregressive baseline of section 7 of the 4-tensor paper (nanoGPT-style, one file).

A decoder-only causal transformer reads the same stored window (B, T+1, N) as the 4-tensor model, but
as one flattened token string: the sentences S(0..T-1) with their padding removed and no separators,
behind a [BOS] token. It must then emit S(T) token by token, conditioning on its own argmax choices
(free running), and end it with [EOS]. Gold S(T) is a target only; it never enters the input.

Shapes and names used in the comments:
    B batch, T sentences in the input window, N token slots per sentence, L sequence length,
    V = content_vocab_size + 2 (the 4-tensor vocabulary, then [BOS] = V - 2 and [EOS] = V - 1),
    d = d_x * d_t model width, H heads of width d / H, G steps of the longest gold span.

Architecture (section 7.1, 7.3-7.4): token table E (V, d) plus a 1-D position code, n_layers Pre-LN
blocks x <- x + drop(Attn(LN(x))); x <- x + drop(MLP(LN(x))) with causal multi-head self-attention
(W_Q, W_K, W_V, W_O each d x d, no biases) and a GELU MLP d -> 4d -> d (with biases), one final LayerNorm,
and the tied readout logits = h E^T (no bias, no extra parameters).

Position code. The default is a parameter-free sinusoidal code (`positions="sinusoidal"`, the function of the
4-tensor's Stage B), with bias-free attention maps and standard nn.Linear / nn.LayerNorm elsewhere: the policy
that reproduces the paper's parameter totals (175.9M, 226.2M; docs/predictor.md says how they pin it down).
`positions="learned"` swaps in a learned absolute table of max_len rows (+max_len * d); `positions="rotary"` adds
nothing to the input and turns each head's queries and keys by their positions (`rotate`), parameter-free, for
the default attention only.

Attention kind. `attention` picks the self-attention of every block from the 1-D attention
family of the Tucker Attention paper (`world_model.models.attention_family`): "mha" (default), "gqa"
(`n_kv_heads`), "mla" (`mla_kv_rank`, optional `mla_q_rank`, `mla_shared_kv`) or "tucker"
(`tucker_ranks` (r_1, r_2, r_3) of W, optional `tucker_ranks_out` of W~) or "tucker_listing" (the reference
listing's form: `tucker_query_rank`, `tucker_key_rank`, `tucker_value_rank`), with `bitlinear` for ternary
projections. The default (mha, no bitlinear) keeps the original `CausalSelfAttention` (one stacked W_qkv),
so its parameter names, count and old checkpoints are unchanged; every other choice puts a causal
`FamilyAttention` (head width d / H, no attention dropout) in its place, with that kind's KV cache.

Target marker (not in the paper; off by default). `target_marker=True` puts [BOS] once more after S(T-1),
so the model sees where the sentence it writes begins; without it, a free-running model must infer from the
words alone where its own sentence started. No parameter is added; training, scoring and generation all pack
through `pack_prefix`, so they agree. The cpu benchmark reports it as the "marker" row.

Token scale (not in the paper; off by default). The token table is initialised at N(0, 0.02) and is also the
readout, so its rows stay small (norm about 1 after training at the cpu width), while the sinusoidal code has norm
sqrt(d / 2) (8 at d = 128): what the first LayerNorm sees is mostly position. `scale_embeddings=True` feeds
E(ids) * sqrt(d) instead (Vaswani et al. 2017, section 3.4), the readout unchanged. The cpu benchmark reports it,
with the target marker, as the "marker_scaled" row.

Layout: `baseline_config` (BaselineConfig), `baseline_packing` (windows as token strings, gold alignment),
`baseline_layers` (attention and blocks), this module (the model and its objective), `kv_cache` (prefill,
extension, the free-running loop), `baseline_generation` (closed-set scoring, generation).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.baseline_config import BaselineConfig
from world_model.models.baseline_generation import BaselineGeneration
from world_model.models.baseline_layers import Block
from world_model.models.baseline_packing import FreeRun, Packed, aligned_correct, compact, gold_steps
from world_model.models.checkpoint import PretrainedMixin
from world_model.models.four_tensor_layers import sinusoidal_embedding
from world_model.models.inputs import INT_DTYPES, check_example, check_window
from world_model.models.step_stats import StepStats


class BaselineModel(PretrainedMixin, BaselineGeneration, nn.Module):
    """The free-running 1-D baseline: packed token strings (B, L) -> next-token logits (B, L, V)."""

    config_class = BaselineConfig
    # What a readout or a scorer may ask of this model (world_model.generation.readouts):
    scores_slots = False  # no per-slot distribution of the next state: its tokens come one after another
    scores_sentences = True  # teacher-forced log-likelihood of whole sentences (`score_sentences`)
    explains = False  # rollouts record no `StepExplanation`s

    def __init__(self, config: BaselineConfig):
        super().__init__()
        c = self.config = config
        self.E = nn.Embedding(c.vocab_size, c.d)  # (V, d), also the readout
        if c.positions == "learned":
            self.P = nn.Embedding(c.max_len, c.d)  # learned absolute positions
        elif c.positions == "sinusoidal":
            self.register_buffer(
                "P_sin", sinusoidal_embedding(torch.arange(c.max_len, dtype=torch.float32), c.d), persistent=False
            )  # (max_len, d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.final_norm = nn.LayerNorm(c.d)
        # nanoGPT initialisation: N(0, 0.02) weights, zero biases, residual outputs scaled by 1/sqrt(2L).
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual_out in (block.attention_output_map(), block.fc2):
                nn.init.normal_(residual_out.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))

    def attention_modules(self) -> list[nn.Module]:
        """The self-attention module of every block."""
        return [block.attention for block in self.blocks]

    def attention_parameter_count(self) -> int:
        """Parameters of the attention maps of all layers (4 d^2 per layer for the default mha)."""
        return sum(block.attention_parameter_count() for block in self.blocks)

    def kv_cache_size(self, seq_len: int) -> int:
        """Numbers the KV cache holds for seq_len tokens of one sequence, summed over layers."""
        return sum(block.kv_cache_size(seq_len) for block in self.blocks)

    @classmethod
    def vocab_size_for(cls, vocab) -> int:
        """Content vocabulary size for the registry; [BOS] and [EOS] are added by the config."""
        return len(vocab)

    # ----- checks on what callers hand in -----
    def check_window(self, token_ids: torch.Tensor, name: str = "token_ids", sentences: int | None = None) -> None:
        """Reject anything but integer content ids (B, T', N), with T' == `sentences` or else 1 <= T' <= T."""
        c = self.config
        check_window(token_ids, c.n_states, c.n_tokens, c.content_vocab_size, name, sentences, "content vocabulary")

    def check_sequence(self, ids: torch.Tensor, lengths: torch.Tensor | None = None) -> None:
        """Packed ids (B, L) with 1 <= L <= max_len and ids in [0, V); lengths (B,) in [1, L]."""
        c = self.config
        if not isinstance(ids, torch.Tensor) or ids.dtype not in INT_DTYPES:
            raise TypeError(f"ids must be an integer torch.Tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
        if ids.dim() != 2 or ids.shape[0] < 1 or not 1 <= ids.shape[1] <= c.max_len:
            raise ValueError(f"ids must have shape (B>=1, 1..{c.max_len}), got {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
            raise ValueError(f"ids must lie in [0, {c.vocab_size}), got range [{int(ids.min())}, {int(ids.max())}]")
        if lengths is not None:
            if lengths.shape != ids.shape[:1]:
                raise ValueError(f"lengths must have shape ({ids.shape[0]},), got {tuple(lengths.shape)}")
            if int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]:
                raise ValueError(
                    f"lengths must lie in [1, {ids.shape[1]}], got range [{int(lengths.min())}, {int(lengths.max())}]"
                )

    # ----- packing (section 7.4) -----
    def pack_prefix(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sentences (B, T', N) -> [BOS] + their non-padding ids in reading order (+ [BOS] with the target
        marker) (B, Lp), lengths (B,)."""
        c = self.config
        flat = token_ids.long().reshape(token_ids.shape[0], -1)  # (B, T'N), sentence-major
        tail = c.bos_id if c.target_marker else None
        return compact(flat, flat != c.padding_idx, c.padding_idx, lead=c.bos_id, tail=tail)

    def pack(self, token_ids_full: torch.Tensor) -> Packed:
        """A stored window (B, T+1, N) -> prefix from S(0..T-1) and gold S(T) + [EOS]."""
        prefix, prefix_len = self.pack_prefix(token_ids_full[:, :-1])
        gold, gold_len = self.pack_target(token_ids_full[:, -1])
        return Packed(prefix, prefix_len, gold, gold_len)

    def pack_target(self, sentences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sentences (R, N) -> their non-padding ids then [EOS] (R, G), right-padded, and lengths (R,)."""
        c = self.config
        sentences = sentences.long()
        return compact(sentences, sentences != c.padding_idx, c.padding_idx, tail=c.eos_id)

    # ----- forward pass -----
    def token_code(self, ids: torch.Tensor) -> torch.Tensor:
        """Ids (...) -> input token vectors (..., d): E(ids), times sqrt(d) with `scale_embeddings`."""
        x = self.E(ids)
        return x * math.sqrt(self.config.d) if self.config.scale_embeddings else x

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Ids (B, L) at positions pos (L,) or (B, L) -> the blocks' input (B, L, d) and the positions their
        attention rotates by: token code + additive position code (sinusoidal, learned) and None, or, with rotary
        positions, the token code alone and pos."""
        x = self.token_code(ids)
        if self.config.positions == "rotary":
            return x, pos
        return x + (self.P(pos) if self.config.positions == "learned" else self.P_sin[pos]), None

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Packed ids (B, L) -> final-normalised states (B, L, d)."""
        self.check_sequence(ids)
        x, rotary = self.embed(ids.long(), torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x, _ = block(x, positions=rotary)
        return self.final_norm(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Packed ids (B, L), right-padded -> logits (B, L, V); logits[:, i] predict token i + 1."""
        return F.linear(self.encode(ids), self.E.weight)

    def forward_last(self, ids: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, V) at the last live position lengths - 1 (the last column without lengths)."""
        if lengths is not None:
            self.check_sequence(ids, lengths)
        H = self.encode(ids)  # (B, L, d)
        idx = H.shape[1] - 1 if lengths is None else lengths.long() - 1
        H_last = H[torch.arange(H.shape[0], device=H.device), idx]  # (B, d)
        return F.linear(H_last, self.E.weight)  # the tied readout of one vector

    # ----- the free-running objective (section 7.4) -----
    def check_full_window(self, token_ids_full: torch.Tensor) -> None:
        c = self.config
        check_example(token_ids_full, c.n_states, c.n_tokens, c.content_vocab_size, "content vocabulary")

    def free_run(self, token_ids_full: torch.Tensor, use_cache: bool = True) -> FreeRun:
        """A stored window (B, T+1, N) -> packing, step logits (B, G, V) and appended argmax (B, G)."""
        self.check_full_window(token_ids_full)
        packed = self.pack(token_ids_full)
        logits, tokens = self.decode(packed.prefix, packed.prefix_len, packed.gold.shape[1], use_cache=use_cache)
        return FreeRun(packed, logits, tokens)

    def teacher_forced_ce(self, token_ids_full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A stored window (B, T+1, N) -> (cross-entropy (B, G), content (B, G)): at step k, the cross-entropy of
        gold token k of S(T) given the prefix and the gold tokens before it (0 where it is not scored), and the
        mask of the scored steps, S(T)'s content tokens ([EOS] not scored).

        Not the paper's number: section 8.2 scores the baseline free-running (`training_step`). This is the
        diagnostic of how well a model trained on its own argmax history reads gold text; where gold S(T) is the
        model's own greedy sentence, the two are the same.
        """
        self.check_full_window(token_ids_full)
        p = self.pack(token_ids_full)
        steps = torch.arange(p.gold.shape[1], device=p.gold.device)  # (G,)
        _, content = gold_steps(p, self.config.eos_id)  # (B, G) the gold tokens before [EOS]
        live = torch.arange(p.prefix.shape[1], device=p.prefix.device)[None, :] < p.prefix_len[:, None]  # (B, Lp)
        seq, _ = compact(
            torch.cat([p.prefix, p.gold], dim=1), torch.cat([live, content], dim=1), self.config.padding_idx
        )
        H = self.encode(seq)  # (B, L, d)
        pos = (p.prefix_len[:, None] - 1 + steps).clamp(max=seq.shape[1] - 1)  # (B, G) the state predicting gold k
        h = H.gather(1, pos[..., None].expand(-1, -1, H.shape[-1]))  # (B, G, d)
        ce = F.cross_entropy(F.linear(h, self.E.weight).transpose(1, 2), p.gold, reduction="none")  # (B, G)
        return torch.where(content, ce, 0.0), content

    def teacher_forced_last_ce(self, token_ids_full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A stored window (B, T+1, N) -> (summed cross-entropy (), count ()) of S(T)'s content tokens, each
        given the prefix and the gold tokens before it (`teacher_forced_ce`)."""
        ce, content = self.teacher_forced_ce(token_ids_full)
        return ce.sum(), content.sum()

    @torch.no_grad()
    def last_end_cost(self, token_ids_full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A stored window (B, T+1, N) -> (summed -log(1 - p([EOS])) (), count ()) over S(T)'s content tokens, at
        their free-running steps: the part of L_S(T) spent on saying the sentence goes on.

        A diagnostic beside the paper's number: the 4-tensor readout and the count floors are scored only on live
        slots, so they never pay it. L_S(T) less this cost is the cross-entropy under the step distributions
        renormalised without [EOS].
        """
        run = self.free_run(token_ids_full)
        _, content = gold_steps(run.packed, self.config.eos_id)
        logits = run.logits[content]  # (K, V)
        rest = logits.index_fill(-1, torch.tensor([self.config.eos_id], device=logits.device), float("-inf"))
        return (logits.logsumexp(-1) - rest.logsumexp(-1)).sum(), content.sum()  # -log(1 - p([EOS])) per token

    @staticmethod
    def smoothing_cross_entropy(
        logits: torch.Tensor, steps: torch.Tensor, prior: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The cross-entropy of each row of `logits` (K, V) against label smoothing's target, (K,): uniform over the
        vocabulary (logsumexp - mean of the logits) without a `prior`, else q = prior[step] (`prior` (N + 1, V),
        one distribution per step k = 0..N of S(T); `steps` (K,) is each row's k): logsumexp - sum_v q_v logit_v."""
        if prior is None:
            return logits.logsumexp(-1) - logits.mean(-1)
        q = prior[steps.clamp(max=len(prior) - 1)]  # (K, V)
        return logits.logsumexp(-1) - (q * logits).sum(-1)

    def copy_smoothing_cross_entropy(
        self,
        logits: torch.Tensor,
        steps: torch.Tensor,
        context: torch.Tensor,
        prior: torch.Tensor,
        copy_mass: torch.Tensor,
    ) -> torch.Tensor:
        """The cross-entropy of each row of `logits` (K, V) against q = prior[k] + copy_mass[k] copy, (K,), where
        copy(v) is the share of v among the non-padding ids of the row's `context` (K, C) and `prior` (N + 1, V)
        and `copy_mass` (N + 1,) add up to one distribution at every step k (`steps` (K,);
        `world_model.evaluation.floors.count_copy_prior`). A row whose context is all padding puts its copy mass
        nowhere (q then sums to less than 1): lse sum(q) - q . logits."""
        k = steps.clamp(max=len(prior) - 1)
        live = context != self.config.padding_idx  # (K, C)
        n_live = live.sum(-1)  # (K,)
        mass = torch.where(n_live > 0, copy_mass[k], 0.0)  # (K,)
        copied = (logits.gather(1, context) * live).sum(-1) / n_live.clamp(min=1)  # (K,) mean logit of the context
        q = prior[k]  # (K, V)
        return logits.logsumexp(-1) * (q.sum(-1) + mass) - (q * logits).sum(-1) - mass * copied

    def training_step(
        self,
        token_ids_full: torch.Tensor,
        use_cache: bool = True,
        label_smoothing: float = 0.0,
        smoothing_prior: torch.Tensor | None = None,
        smoothing_copy: torch.Tensor | None = None,
    ) -> StepStats:
        """A stored window (B, T+1, N) -> the free-running selection loss and the statistics on S(T).

        Row b is active for steps k < gold_len[b]. `loss` and window_* cover every gold token of the active
        steps, [EOS] included; last_* cover only the content tokens of S(T), the non-padding slots the
        4-tensor last slice is scored on. last_correct follows `aligned_correct`. A `label_smoothing` e > 0
        (not in the paper; training.label_smoothing) makes `loss` the cross-entropy against (1 - e) gold + e
        uniform over the vocabulary, or + e smoothing_prior[k] at step k (training.label_smoothing_prior "counts";
        `smoothing_prior` (N + 1, V), see `smoothing_cross_entropy`), and with `smoothing_copy` (N + 1,) ("counts_copy")
        + e smoothing_copy[k] copy, copy the share of each id among the tokens of the window's S(0..T-1)
        (`copy_smoothing_cross_entropy`); the statistics stay the plain cross-entropy.
        """
        run = self.free_run(token_ids_full, use_cache)
        gold = run.packed.gold
        active, content = gold_steps(run.packed, self.config.eos_id)
        logits = run.logits[active]  # (K, V), row-major over (b, k)
        ce = F.cross_entropy(logits, gold[active], reduction="none")  # (K,)
        is_content = content[active]  # (K,)
        window_tokens = active.sum()
        loss_sum = ce.sum()
        if label_smoothing > 0:
            steps = torch.arange(gold.shape[1], device=gold.device).expand_as(gold)[active]  # (K,) step k of each row
            if smoothing_copy is None:
                smoothed = self.smoothing_cross_entropy(logits, steps, smoothing_prior).sum()
            else:
                context = token_ids_full[:, :-1].flatten(1)  # (B, T * N) the ids of S(0..T-1)
                rows = torch.arange(len(gold), device=gold.device)[:, None].expand_as(gold)[active]  # (K,) window b
                smoothed = self.copy_smoothing_cross_entropy(
                    logits, steps, context[rows], smoothing_prior, smoothing_copy
                ).sum()
            loss_sum = (1 - label_smoothing) * loss_sum + label_smoothing * smoothed
        return StepStats(
            loss=loss_sum / window_tokens,
            window_ce_sum=ce.sum().detach(),
            window_tokens=window_tokens,
            last_ce_sum=ce[is_content].sum().detach(),
            last_correct=aligned_correct(run.tokens, gold, content, self.config.eos_id).sum(),
            last_tokens=content.sum(),
        )

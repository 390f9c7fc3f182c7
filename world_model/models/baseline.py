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

Position code and parameter count. The paper only says "1-D positional encodings"; its totals pin the
choice down. At d_x = 64, d_t = 32 (d = 2048) and |V| = 36,713 the Table 3 terms alone give 175.85M
(H in {2, 4}, L = 2) and 226.18M (H = 4, L = 3) against the reported 175.9M and 226.2M, so everything
else the model owns must stay below 0.1M at L = 2 and about 67k at L = 3. A learned table of
max_len = 82 positions is 168k parameters (176.1M / 226.4M) and does not fit, nor do biases on all four
attention maps on top of the MLP biases at L = 3 (226.3M). The default is therefore the same policy as
the 4-tensor model: a parameter-free sinusoidal code (`positions="sinusoidal"`, the function of the
4-tensor's Stage B), bias-free attention maps (the 4-tensor's W_Q, W_K, W_V have no bias either) and
standard nn.Linear / nn.LayerNorm elsewhere, which totals 175,892,480 (175.9M) and 226,242,560
(226.2M). `positions="learned"` swaps in a learned absolute table of max_len rows (+max_len * d).

Attention kind (issue 7). `attention` picks the self-attention of every block from the 1-D attention
family of the Tucker Attention paper (`world_model.models.attention_family`): "mha" (default), "gqa"
(`n_kv_heads`), "mla" (`mla_kv_rank`, optional `mla_q_rank`, `mla_shared_kv`) or "tucker"
(`tucker_ranks` (r_1, r_2, r_3) of W, optional `tucker_ranks_out` of W~), with `bitlinear` for ternary
projections. The default (mha, no bitlinear) keeps the original `CausalSelfAttention` (one stacked W_qkv),
so its parameter names, count and old checkpoints are unchanged; every other choice puts a causal
`FamilyAttention` (head width d / H, no attention dropout) in its place, with that kind's KV cache.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.attention_family import KINDS as ATTENTION_KINDS
from world_model.models.attention_family import AttentionConfig, FamilyAttention
from world_model.models.checkpoint import PretrainedMixin
from world_model.models.decoding import check_candidates, choose_candidates
from world_model.models.four_tensor import StepStats, sinusoidal_embedding
from world_model.models.inputs import INT_DTYPES, check_example, check_window


@dataclass
class BaselineConfig:
    """Hyper-parameters of the flat baseline (defaults: the CPU-sized preset of the 4-tensor model)."""

    content_vocab_size: int  # the 4-tensor vocabulary, padding and unknown word included
    d_x: int = 16
    d_t: int = 8
    n_heads: int = 4  # split d: head width d / n_heads
    n_layers: int = 2
    n_tokens: int = 16  # N, token slots per stored sentence
    n_states: int = 4  # T, sentences in the input window
    dropout: float = 0.1
    padding_idx: int = 0
    positions: str = "sinusoidal"  # "sinusoidal" (parameter-free) or "learned" (absolute table)
    # Attention kind from the family (see the module docstring); the defaults are the original model.
    attention: str = "mha"  # "mha" | "gqa" | "mla" | "tucker"
    n_kv_heads: int | None = None  # gqa only: key/value heads n_KV dividing n_heads (1 = MQA)
    mla_kv_rank: int | None = None  # mla only: latent width d_c of keys/values (required)
    mla_q_rank: int | None = None  # mla only: query latent d_c^Q; None = full-rank query map
    mla_shared_kv: bool = False  # mla only: one latent c_KV for keys and values
    tucker_ranks: tuple[int, int, int] | None = None  # tucker only: (r_1, r_2, r_3) of W (required)
    tucker_ranks_out: tuple[int, int, int] | None = None  # tucker only: (r~_1, r~_2, r~_3) of W~; None = tucker_ranks
    bitlinear: bool = False  # ternary BitLinear attention projections (always a FamilyAttention)

    def __post_init__(self) -> None:
        for name in ("content_vocab_size", "d_x", "d_t", "n_heads", "n_layers", "n_tokens", "n_states"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"BaselineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.padding_idx < self.content_vocab_size:
            raise ValueError(
                f"padding_idx {self.padding_idx} is outside the content vocabulary of size {self.content_vocab_size}"
            )
        if self.d % self.n_heads:
            raise ValueError(f"n_heads {self.n_heads} must divide the width d = d_x * d_t = {self.d}")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1], got {self.dropout}")
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {self.positions!r}")
        self._check_attention()

    def _check_attention(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        for name in ("tucker_ranks", "tucker_ranks_out"):  # JSON gives lists: store tuples, so configs compare equal
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                    raise ValueError(f"{name} must be three positive ints, got {value!r}")
                setattr(self, name, tuple(int(r) for r in value))
        only = {
            "n_kv_heads": ("gqa", self.n_kv_heads is not None),
            "mla_kv_rank": ("mla", self.mla_kv_rank is not None),
            "mla_q_rank": ("mla", self.mla_q_rank is not None),
            "mla_shared_kv": ("mla", bool(self.mla_shared_kv)),
            "tucker_ranks": ("tucker", self.tucker_ranks is not None),
            "tucker_ranks_out": ("tucker", self.tucker_ranks_out is not None),
        }
        for name, (kind, is_set) in only.items():
            if is_set and self.attention != kind:
                raise ValueError(f"{name} applies only to attention={kind!r}, not attention={self.attention!r}")
        try:
            self.attention_config()
        except ValueError as err:
            raise ValueError(f"attention={self.attention!r}: {err}") from err

    @property
    def uses_family_attention(self) -> bool:
        """False only for the default (mha, no bitlinear), which keeps the original CausalSelfAttention."""
        return self.attention != "mha" or self.bitlinear

    def attention_config(self) -> AttentionConfig:
        """The causal family layer of each block (head width d / n_heads, no attention dropout)."""
        return AttentionConfig(
            d_model=self.d,
            n_heads=self.n_heads,
            kind=self.attention,
            n_kv_heads=self.n_kv_heads,
            mla_q_rank=self.mla_q_rank,
            mla_kv_rank=self.mla_kv_rank,
            mla_shared_kv=self.mla_shared_kv,
            tucker_ranks=self.tucker_ranks,
            tucker_ranks_out=self.tucker_ranks_out,
            causal=True,
            bitlinear=self.bitlinear,
            dropout=0.0,
        )

    @classmethod
    def from_vocabulary(cls, vocab_size: int, **hyper) -> "BaselineConfig":
        """The config for a content vocabulary of `vocab_size` ids; [BOS] and [EOS] are added after it."""
        return cls(content_vocab_size=vocab_size, **hyper)

    @property
    def d(self) -> int:
        """Model width, the joint fiber product d_x * d_t (section 7.3)."""
        return self.d_x * self.d_t

    @property
    def d_ff(self) -> int:
        return 4 * self.d

    @property
    def bos_id(self) -> int:
        return self.content_vocab_size

    @property
    def eos_id(self) -> int:
        return self.content_vocab_size + 1

    @property
    def vocab_size(self) -> int:
        """Content vocabulary plus [BOS] and [EOS], appended after it (the padding id is not reused)."""
        return self.content_vocab_size + 2

    @property
    def max_len(self) -> int:
        """Longest sequence: packed prefix 1 + T*N, then at most N content tokens and [EOS]."""
        return 1 + self.n_states * self.n_tokens + self.n_tokens + 1

    def to_dict(self) -> dict:
        return {"model_type": "baseline", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "BaselineConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class Packed(NamedTuple):
    """Section 7.4 packing of a stored window, right-padded with the padding id."""

    prefix: torch.Tensor  # (B, Lp) [BOS] + S(0) .. S(T-1), padding removed, no separators
    prefix_len: torch.Tensor  # (B,) live length of each prefix, >= 1
    gold: torch.Tensor  # (B, G) S(T) with padding removed, then [EOS]; target only
    gold_len: torch.Tensor  # (B,) live length of each gold span, >= 1 (the [EOS])


class FreeRun(NamedTuple):
    """One free-running pass over a batch of windows."""

    packed: Packed
    logits: torch.Tensor  # (B, G, V) logits of the last live position at step k
    tokens: torch.Tensor  # (B, G) argmax appended after step k (detached ids)


def compact(ids: torch.Tensor, keep: torch.Tensor, pad: int, lead: int | None = None, tail: int | None = None):
    """Keep the `keep` entries of each row in order, optionally behind `lead` and before `tail`.

    ids, keep (B, M) -> right-padded rows (B, Lmax) and their lengths (B,).
    """
    B = ids.shape[0]
    start = int(lead is not None)
    lengths = keep.sum(dim=1) + start + int(tail is not None)  # (B,)
    out = ids.new_full((B, int(lengths.max())), pad)
    dest = keep.cumsum(dim=1) - 1 + start  # (B, M) target column of each kept id
    rows = torch.arange(B, device=ids.device)[:, None].expand_as(ids)
    out[rows[keep], dest[keep]] = ids[keep]
    if lead is not None:
        out[:, 0] = lead
    if tail is not None:
        out[torch.arange(B, device=ids.device), lengths - 1] = tail
    return out, lengths


def aligned_correct(tokens: torch.Tensor, gold: torch.Tensor, content: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Greedy token accuracy on gold content positions: tokens, gold, content (B, G) -> matches (B, G).

    Position k counts only if the model emitted gold[k] there and had not emitted [EOS] before k:
    greedy evaluation stops at [EOS], so whatever the free run produced after it is not in the string.
    """
    is_eos = tokens == eos_id
    eos_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return (tokens == gold) & content & ~eos_before


class KVCache:
    """The cached per-token quantities of every layer for right-padded prefixes plus the tokens fed after them.

    Per layer this is (K, V) (B, H, Lk, d / H) for the default attention, else the family layer's cache,
    a tuple of (B, Lk, c_k) tensors (K and V for mha/gqa, the latents for mla, k~ and v~ for tucker).

    The prefix block keeps its padding columns (masked by `live`); tokens fed later are appended as
    new columns for every row at once, so each row's sequence is prefix[:len] + fed tokens, with positions
    continuing from its own prefix length.
    """

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]], live: torch.Tensor, next_pos: torch.Tensor):
        self.kv = kv  # per layer: the attention's cache tuple (see above)
        self.live = live  # (B, Lk) True at real keys
        self.next_pos = next_pos  # (B,) position of the next token fed

    def select(self, rows: torch.Tensor) -> "KVCache":
        """A new cache of the given rows (R,) of this one (repeats allowed), e.g. one copy per candidate."""
        kv = [tuple(t[rows] for t in layer) for layer in self.kv]  # every cached tensor is batch-first
        return KVCache(kv, self.live[rows], self.next_pos[rows])


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention: W_Q, W_K, W_V (stacked in one d x 3d map) and W_O, no biases."""

    def __init__(self, config: BaselineConfig):
        super().__init__()
        self.n_heads, self.d = config.n_heads, config.d
        self.W_qkv = nn.Linear(config.d, 3 * config.d, bias=False)
        self.W_o = nn.Linear(config.d, config.d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, Lq, d) -> (B, Lq, d) and the keys/values (B, H, Lk, d/H) after appending this call's.

        Without `past`, x is a whole sequence from position 0 and the mask is causal (right padding needs
        nothing more: a live position never sees a later slot). With `past`, `attn_mask` (B, 1, Lq, Lk),
        True where a query may look, is required.
        """
        B, Lq, d = x.shape
        q, k, v = self.W_qkv(x).view(B, Lq, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if past is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.W_o(y.transpose(1, 2).reshape(B, Lq, d)), (k, v)


class Block(nn.Module):
    """Pre-LN block on (B, L, d): x + drop(Attn(LN(x))), then + drop(MLP(LN(x)))."""

    def __init__(self, config: BaselineConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d)
        if config.uses_family_attention:
            self.attention = FamilyAttention(config.attention_config())
        else:
            self.attention = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.d)
        self.fc1 = nn.Linear(config.d, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d)
        self.dropout = nn.Dropout(config.dropout)  # one rate, both residual branches

    def attention_output_map(self) -> nn.Linear:
        """The attention's last linear map into the residual stream (W_O, or U~_3 for Tucker)."""
        if isinstance(self.attention, CausalSelfAttention):
            return self.attention.W_o
        proj = self.attention.proj
        return proj.o_factor if self.attention.config.kind == "tucker" else proj.W_o

    def attention_parameter_count(self) -> int:
        return sum(p.numel() for p in self.attention.parameters())

    def kv_cache_size(self, seq_len: int) -> int:
        """Numbers cached for seq_len tokens (one batch element): 2 N d for the default attention."""
        if isinstance(self.attention, CausalSelfAttention):
            return 2 * seq_len * self.attention.d
        return self.attention.kv_cache_size(seq_len)

    def forward(self, x, past=None, attn_mask=None):
        y, kv = self.attention(self.ln_attn(x), past=past, attn_mask=attn_mask)  # both kinds take these keywords
        x = x + self.dropout(y)
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.ln_mlp(x))))), kv


class BaselineModel(PretrainedMixin, nn.Module):
    """The free-running 1-D baseline: packed token strings (B, L) -> next-token logits (B, L, V)."""

    config_class = BaselineConfig

    def __init__(self, config: BaselineConfig):
        super().__init__()
        c = self.config = config
        self.E = nn.Embedding(c.vocab_size, c.d)  # (V, d), also the readout
        if c.positions == "learned":
            self.P = nn.Embedding(c.max_len, c.d)  # learned absolute positions
        else:
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
        """Sentences (B, T', N) -> [BOS] + their non-padding ids in reading order (B, Lp), lengths (B,)."""
        c = self.config
        flat = token_ids.long().reshape(token_ids.shape[0], -1)  # (B, T'N), sentence-major
        return compact(flat, flat != c.padding_idx, c.padding_idx, lead=c.bos_id)

    def pack(self, token_ids_full: torch.Tensor) -> Packed:
        """A stored window (B, T+1, N) -> prefix from S(0..T-1) and gold S(T) + [EOS]."""
        c = self.config
        prefix, prefix_len = self.pack_prefix(token_ids_full[:, :-1])
        last = token_ids_full[:, -1].long()  # (B, N)
        gold, gold_len = compact(last, last != c.padding_idx, c.padding_idx, tail=c.eos_id)
        return Packed(prefix, prefix_len, gold, gold_len)

    # ----- forward pass -----
    def position_code(self, pos: torch.Tensor) -> torch.Tensor:
        """Positions (...) -> (..., d)."""
        return self.P(pos) if self.config.positions == "learned" else self.P_sin[pos]

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Packed ids (B, L) -> final-normalised states (B, L, d)."""
        self.check_sequence(ids)
        ids = ids.long()
        x = self.E(ids) + self.position_code(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x, _ = block(x)
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

    # ----- KV cache -----
    def prefill(self, prefix: torch.Tensor, prefix_len: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
        """Right-padded prefixes (B, Lp) -> logits (B, V) at their last live position, and the cache."""
        self.check_sequence(prefix, prefix_len)
        prefix, prefix_len = prefix.long(), prefix_len.long()
        Lp = prefix.shape[1]
        x = self.E(prefix) + self.position_code(torch.arange(Lp, device=prefix.device))
        kv = []
        for block in self.blocks:
            x, layer_kv = block(x)
            kv.append(layer_kv)
        rows = torch.arange(prefix.shape[0], device=prefix.device)
        h = self.final_norm(x[rows, prefix_len - 1])  # (B, d)
        live = torch.arange(Lp, device=prefix.device)[None, :] < prefix_len[:, None]  # (B, Lp)
        return F.linear(h, self.E.weight), KVCache(kv, live, prefix_len.clone())

    def extend(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,) at each row's next position -> its logits (B, V); grows `cache`."""
        return self.extend_many(cache, tokens[:, None])[:, 0]

    def extend_many(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed K tokens per row (B, K) at each row's next K positions in one causal pass -> their logits
        (B, K, V), logits[:, k] predicting the token after tokens[:, k]; grows `cache` by K columns.

        Token k of a row sees the row's live cached keys and its own tokens 0..k, exactly as K calls of
        `extend` would, at positions next_pos .. next_pos + K - 1.
        """
        B, K = tokens.shape
        if int(cache.next_pos.max()) + K > self.config.max_len:
            raise ValueError(f"the sequence would pass max_len = {self.config.max_len}")
        steps = torch.arange(K, device=tokens.device)
        x = self.E(tokens.long()) + self.position_code(cache.next_pos[:, None] + steps)  # (B, K, d)
        causal = steps[:, None] >= steps[None, :]  # (K, K) token k sees tokens 0..k
        mask = torch.cat(
            [
                cache.live[:, None, None, :].expand(B, 1, K, -1),  # (B, 1, K, Lk + K)
                causal.expand(B, 1, K, K),
            ],
            dim=-1,
        )
        for i, block in enumerate(self.blocks):
            x, cache.kv[i] = block(x, cache.kv[i], mask)
        cache.live = torch.cat([cache.live, cache.live.new_ones(B, K)], dim=1)
        cache.next_pos = cache.next_pos + K
        return F.linear(self.final_norm(x), self.E.weight)

    def decode(
        self,
        prefix: torch.Tensor,
        prefix_len: torch.Tensor,
        steps: int,
        pick: Callable[[torch.Tensor], torch.Tensor] = greedy,
        done: Callable[[torch.Tensor], bool] | None = None,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Free-running loop from right-padded prefixes: logits (B, K, V) and appended tokens (B, K), K <= steps.

        At step k the logits of each row's last live position choose a token (`pick`, argmax by default),
        which is appended, detached, before step k + 1. Every row advances; callers mask rows they are done
        with. `done(tokens so far)` ends the loop early. Without the cache, each step reruns the full
        causal forward on the grown ids: the same function, for tests.
        """
        if use_cache:
            logits, cache = self.prefill(prefix, prefix_len)
        else:
            ids = torch.cat([prefix.long(), prefix.new_full((prefix.shape[0], steps), self.config.padding_idx)], dim=1)
            lengths = prefix_len.long().clone()
            logits = self.forward_last(ids[:, : int(lengths.max())], lengths)
        rows = torch.arange(prefix.shape[0], device=prefix.device)
        all_logits, tokens = [], []
        for k in range(steps):
            all_logits.append(logits)
            tokens.append(pick(logits).detach())  # the discrete choice passes no gradient
            if k + 1 == steps or (done is not None and done(torch.stack(tokens, dim=1))):
                break
            if use_cache:
                logits = self.extend(cache, tokens[-1])
            else:
                ids = ids.index_put((rows, lengths), tokens[-1])  # out of place: autograd saved the old ids
                lengths = lengths + 1
                logits = self.forward_last(ids[:, : int(lengths.max())], lengths)
        return torch.stack(all_logits, dim=1), torch.stack(tokens, dim=1)

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

    def training_step(self, token_ids_full: torch.Tensor, use_cache: bool = True) -> StepStats:
        """A stored window (B, T+1, N) -> the free-running selection loss and the statistics on S(T).

        Row b is active for steps k < gold_len[b]. `loss` and window_* cover every gold token of the active
        steps, [EOS] included; last_* cover only the content tokens of S(T), the non-padding slots the
        4-tensor last slice is scored on. last_correct follows `aligned_correct`.
        """
        run = self.free_run(token_ids_full, use_cache)
        gold, gold_len = run.packed.gold, run.packed.gold_len
        G = gold.shape[1]
        active = torch.arange(G, device=gold.device)[None, :] < gold_len[:, None]  # (B, G)
        content = active & (gold != self.config.eos_id)  # (B, G)
        ce = F.cross_entropy(run.logits[active], gold[active], reduction="none")  # (K,), row-major over (b, k)
        is_content = content[active]  # (K,)
        window_tokens = active.sum()
        return StepStats(
            loss=ce.sum() / window_tokens,
            window_ce_sum=ce.sum().detach(),
            window_tokens=window_tokens,
            last_ce_sum=ce[is_content].sum().detach(),
            last_correct=aligned_correct(run.tokens, gold, content, self.config.eos_id).sum(),
            last_tokens=content.sum(),
        )

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
        multi-token pass (`extend_many`), its token k at position prefix_len + k, seeing the live prefix and
        its own tokens 0..k, exactly the sequence [BOS] + window + candidate + [EOS] of teacher forcing.
        Windows are prefilled in groups of max(1, chunk_rows // C) and their (window, candidate) rows run
        `chunk_rows` at a time (default: sized to about 2^25 activations per chunk), so memory stays bounded
        under torch.no_grad(); with autograd on, the result is differentiable.
        """
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
        C = candidates.shape[-2] if candidates.dim() >= 2 else 0
        check_candidates(
            candidates.flatten(0, 1) if per_window else candidates, c.n_tokens, c.padding_idx, c.content_vocab_size
        )
        device = token_ids.device
        cand = candidates.flatten(0, 1).to(device).long() if per_window else candidates.to(device).long()
        prefix, prefix_len = self.pack_prefix(token_ids)  # (B, Lp), (B,)
        gold, gold_len = compact(
            cand, cand != c.padding_idx, c.padding_idx, tail=c.eos_id
        )  # (C or B * C, G) and lengths
        B, G = prefix.shape[0], gold.shape[1]  # G >= 2: one content id, then [EOS]
        gold_live = torch.arange(G, device=device)[None, :] < gold_len[:, None]
        fed, targets, later_live = gold[:, :-1], gold[:, 1:], gold_live[:, 1:]  # (C, G - 1) each
        L = prefix.shape[1] + G  # longest packed sequence, prefix + span, <= max_len
        if chunk_rows is None:  # per (window, candidate) row: the span's MLP and readout, its copy of the cache
            chunk_rows = max(1, (1 << 25) // (G * (c.d_ff + c.vocab_size) + 4 * L * c.d))
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        group = max(1, chunk_rows // C)  # windows prefilled together; their B_w * C rows then run in chunks
        scores = []
        for w0 in range(0, B, group):
            lens = prefix_len[w0 : w0 + group]  # (B_w,)
            logits, cache = self.prefill(prefix[w0 : w0 + group, : int(lens.max())], lens)  # each prefix once
            Bw, rest = logits.shape[0], []
            rows = torch.arange(Bw * C, device=device)  # (window, candidate) row b * C + c of this group
            gold_row = rows + w0 * C if per_window else rows % C  # its candidate's row of `gold`
            first = logits.log_softmax(dim=-1).gather(
                1, gold[gold_row, 0].view(Bw, C)
            )  # (B_w, C) log p(first gold token | prefix)
            for start in range(0, Bw * C, chunk_rows):
                flat = rows[start : start + chunk_rows]  # (R,)
                b, k = flat // C, gold_row[flat]
                log_probs = self.extend_many(cache.select(b), fed[k]).log_softmax(dim=-1)  # (R, G - 1, V)
                picked = log_probs.gather(-1, targets[k][..., None])[..., 0]  # (R, G - 1)
                rest.append(torch.where(later_live[k], picked, picked.new_zeros(())).sum(dim=1))
            scores.append(first + torch.cat(rest).view(Bw, C))
        return torch.cat(scores)

    # ----- generation -----
    def picker(
        self,
        banned_ids=(),
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """Token choice on logits (B, V): greedy argmax at temperature 0 (the free-running objective's rule),
        else a sample from softmax(logits / temperature), within the top_k ids if given. `banned_ids` are
        never chosen."""
        if not banned_ids and temperature <= 0:
            return greedy

        def pick(logits: torch.Tensor) -> torch.Tensor:
            logits = logits.float().clone()
            if banned_ids:
                logits[:, list(banned_ids)] = float("-inf")
            if temperature <= 0:
                return logits.argmax(dim=-1)
            logits = logits / temperature
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]

        return pick

    @torch.no_grad()
    def generate(
        self,
        token_ids: torch.Tensor,
        end_ids: list[int] | tuple[int, ...] = (),
        banned_ids: list[int] | tuple[int, ...] = (),
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The next sentence from the prefix alone: window (B, T', N) -> content ids (B, N), right-padded.

        A row stops at [EOS] (not stored), after N content tokens, or after storing one of `end_ids`.
        Greedy decoding takes the argmax over the whole table, as the free-running objective does, so its
        accuracy against gold S(T) is `last_correct` of `training_step`; pass `banned_ids` to exclude ids
        such as padding or [BOS] (which `rollout` bans, to keep its windows in the content vocabulary).

        Closed-set readout. With `candidates` (C, N), the known sentences (`world_model.models.decoding`), each row
        returns one candidate row as given: the one of highest `score_sentences` log-likelihood at temperature
        0, else a sample from softmax(score / temperature) (top_k then counts candidates; `generator` makes it
        reproducible). `end_ids`, `banned_ids` and `use_cache` do not apply then: no token is chosen freely.
        """
        c = self.config
        if candidates is not None:
            scores = self.score_sentences(token_ids, candidates)  # (B, C); checks both inputs
            candidates = candidates.to(token_ids.device).long()
            return choose_candidates(scores, candidates, temperature, top_k, generator)
        self.check_window(token_ids)
        prefix, prefix_len = self.pack_prefix(token_ids)
        stop_ids = torch.tensor([c.eos_id, *end_ids], device=token_ids.device)
        _, tokens = self.decode(  # (B, K), K <= N
            prefix,
            prefix_len,
            c.n_tokens,
            self.picker(banned_ids, temperature, top_k, generator),
            done=lambda t: bool(torch.isin(t, stop_ids).any(dim=1).all()),
            use_cache=use_cache,
        )
        is_stop = torch.isin(tokens, stop_ids).long()
        stopped_before = (is_stop.cumsum(dim=1) - is_stop) > 0
        out = tokens.masked_fill(stopped_before | (tokens == c.eos_id), c.padding_idx)
        return F.pad(out, (0, c.n_tokens - out.shape[1]), value=c.padding_idx)

    @torch.no_grad()
    def rollout(self, token_ids: torch.Tensor, steps: int, **decoding) -> torch.Tensor:
        """Predict `steps` future sentences from a window (B, T', N) -> (B, steps, N).

        Each prediction is appended to the window, which keeps its last T sentences and is packed again;
        `decoding` goes to `generate`, with padding and [BOS] added to the banned ids: neither is content,
        and a padding id inside a predicted state would read as a gap in the next window. With
        `candidates=` (C, N) every predicted state is one of its rows (closed-set readout, see `generate`;
        the banned ids are then unused).
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.check_window(token_ids)
        c = self.config
        decoding["banned_ids"] = (*decoding.get("banned_ids", ()), c.padding_idx, c.bos_id)
        window, predicted = token_ids.long(), []
        for _ in range(steps):
            state = self.generate(window, **decoding)
            predicted.append(state)
            window = torch.cat([window, state[:, None]], dim=1)[:, -self.config.n_states :]
        return torch.stack(predicted, dim=1)

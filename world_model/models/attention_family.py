"""The 1-D attention family of the Tucker Attention paper: MHA, GQA/MQA, MLA and Tucker Attention.

Klein, Kusch, Sager, Schnake, Schotthoefer (2026), "Tucker Attention: A generalization of approximate
attention mechanisms". One self-attention layer is read as two order-3 weight tensors over
(head, input embedding, input embedding):

    pre-softmax   W[h]  = W_Q^h (W_K^h)^T   (n_H, d, d)   score_h(i, j) = x_i^T W[h] x_j * scale
    post-softmax  W~[h] = W_V^h (W_O^h)^T   (n_H, d, d)   y_i = sum_h W~[h]^T sum_j a_h(i, j) x_j

MHA, GQA and MLA are particular low-rank factorisations of W and W~; Tucker Attention factorises both
with a Tucker decomposition W = C x_1 U_1 x_2 U_2 x_3 U_3 of multilinear ranks (r_1, r_2, r_3):

    U_1 (n_H, r_1) head factor, U_2 (d, r_2) query factor, U_3 (d, r_3) key factor, C (r_1, r_2, r_3) core,

and likewise W~ = C~ x_1 U~_1 x_2 U~_2 x_3 U~_3 with ranks (r~_1, r~_2, r~_3) (head, value, output).
The layer is evaluated without ever forming W: with G_h = sum_a U_1[h, a] C[a] (r_2, r_3),

    q~_i = U_2^T x_i (r_2),  k~_j = U_3^T x_j (r_3),  v~_j = U~_2^T x_j (r~_2)   (one of each per token)
    q_h,i = G_h^T q~_i (r_3)   score_h(i, j) = <q_h,i, k~_j> * scale             (MQA-like: one shared key)
    o_h,i = sum_j a_h(i, j) v~_j (r~_2),  y_i = U~_3 sum_h G~_h^T o_h,i (d)

so a decoder caches only k~ and v~, r_3 + r~_2 numbers per token (2r at the paper's ranks (r_1, r, r)),
and the attention itself is an ordinary scaled-dot-product call (flash-attention compatible).

Special cases (see `tucker_from_grouped`, `tucker_from_mla`; all exact in real arithmetic):
    MHA       ranks (n_H, n_H d_H, n_H d_H) for W and W~  (= (n_H, d, d) at d = n_H d_H)
    GQA-n_KV  ranks (n_H, n_H d_H, n_KV d_H) for W, (n_H, n_KV d_H, n_H d_H) for W~
    MLA       ranks (n_H, d_c^Q, d_c^K) for W, (n_H, d_c^V, n_H d_H) for W~ (d_c^Q -> n_H d_H if the
              query is full rank); the output side stays full rank, as in the paper's Figure 1.

Shapes and names used in the comments:
    B batch, L query length, S key length (cached + new), d = d_model, H = n_H heads of width d_H,
    n_KV key/value heads (GQA), d_c latent width (MLA), r_* Tucker ranks.

Interface: `FamilyAttention(config).forward(x (B, L, d), attn_mask=None, past=None) -> (y (B, L, d), cache)`.
The cache is a tuple of (B, S, c_k) tensors holding exactly the per-token quantities the paper's
Table 1 KV-cache column counts (K and V for MHA/GQA, the latent(s) for MLA, k~ and v~ for Tucker);
`kv_cache_size(N)` and `parameter_count()` are the Table 1 formulas (in their general form).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("mha", "gqa", "mla", "tucker")


@dataclass
class AttentionConfig:
    """Hyper-parameters of one attention layer of the family (paper notation in the comments)."""

    d_model: int  # d_model
    n_heads: int  # n_H, query heads
    head_dim: int | None = None  # d_H (default d_model // n_heads); sets the softmax scale 1/sqrt(d_H) for every kind
    kind: str = "mha"  # "mha" | "gqa" | "mla" | "tucker"
    n_kv_heads: int | None = None  # n_KV for GQA (1 = MQA); forced to n_heads for MHA
    mla_q_rank: int | None = None  # d_c^Q, the query latent; None = full-rank query map d -> n_H d_H
    mla_kv_rank: int | None = None  # d_c = d_c^K = d_c^V, the key/value latent width
    mla_shared_kv: bool = False  # one latent c_KV for keys and values (else separate c_K, c_V)
    tucker_ranks: tuple[int, int, int] | None = None  # (r_1, r_2, r_3) of W: head, query, key
    tucker_ranks_out: tuple[int, int, int] | None = (
        None  # (r~_1, r~_2, r~_3) of W~: head, value, output; None = tucker_ranks
    )
    causal: bool = True  # True: decoder (causal mask); False: encoder (full attention)
    bitlinear: bool = False  # ternary BitLinear for every nn.Linear projection
    bias: bool = False  # projections carry no bias (the Table 1 counts assume none)
    dropout: float = 0.0  # dropout on attention weights (training only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"n_heads {self.n_heads} must divide d_model {self.d_model} when head_dim is not given"
                )
            self.head_dim = self.d_model // self.n_heads
        if self.bias:
            raise ValueError("bias=True is not supported: the family is bias-free, as Table 1 counts it")
        for name in ("d_model", "n_heads", "head_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"AttentionConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.kind == "mha":
            self.n_kv_heads = self.n_heads
        elif self.kind == "gqa":
            if self.n_kv_heads is None or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
                raise ValueError(f"gqa needs n_kv_heads >= 1 dividing n_heads {self.n_heads}, got {self.n_kv_heads}")
        elif self.kind == "mla":
            if self.mla_kv_rank is None or self.mla_kv_rank < 1:
                raise ValueError(f"mla needs mla_kv_rank >= 1, got {self.mla_kv_rank}")
            if self.mla_q_rank is not None and self.mla_q_rank < 1:
                raise ValueError(f"mla_q_rank must be >= 1 or None, got {self.mla_q_rank}")
        elif self.kind == "tucker":
            if self.tucker_ranks is None:
                raise ValueError("tucker needs tucker_ranks = (r_1, r_2, r_3)")
            self.tucker_ranks = tuple(int(r) for r in self.tucker_ranks)
            self.tucker_ranks_out = (
                self.tucker_ranks if self.tucker_ranks_out is None else tuple(int(r) for r in self.tucker_ranks_out)
            )
            for ranks in (self.tucker_ranks, self.tucker_ranks_out):
                if len(ranks) != 3 or min(ranks) < 1:
                    raise ValueError(f"Tucker ranks must be three positive ints, got {ranks}")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1], got {self.dropout}")

    @property
    def inner(self) -> int:
        """n_H d_H, the width of the concatenated heads (= d_model in the paper's Table 1)."""
        return self.n_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "AttentionConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ----------------------------------------------------------------------------------------------------
# BitLinear


def ternary(w: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Absmean ternary quantisation with a straight-through estimator: w -> gamma * clamp(round(w / gamma), -1, 1).

    gamma = mean |w| is one per-tensor scale. The forward value is ternary times gamma; the backward is
    the identity (d out / d w = 1), so gradients reach the latent full-precision weights unchanged.
    """
    gamma = w.abs().mean().clamp_min(eps)
    q = (w / gamma).round().clamp(-1, 1) * gamma
    return w + (q - w).detach()


class BitLinear(nn.Linear):
    """nn.Linear whose weight is used ternary ({-1, 0, +1} times a per-tensor absmean scale) in forward."""

    def quantised_weight(self) -> torch.Tensor:
        return ternary(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.quantised_weight(), self.bias)


def _linear(config: AttentionConfig, n_in: int, n_out: int) -> nn.Linear:
    return (BitLinear if config.bitlinear else nn.Linear)(n_in, n_out, bias=False)


# ----------------------------------------------------------------------------------------------------
# Projections: what each kind caches, and how it turns the cache into keys/values and heads into y


class GroupedProjection(nn.Module):
    """MHA (n_KV = n_H) and GQA/MQA: W_Q (d -> n_H d_H), W_K, W_V (d -> n_KV d_H), W_O (n_H d_H -> d).

    Caches K and V, (B, S, n_KV d_H) each: 2 n_KV d_H per token (2 d_model for MHA).
    """

    def __init__(self, c: AttentionConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.d_h = c.n_heads, c.n_kv_heads, c.head_dim
        self.W_q = _linear(c, c.d_model, c.inner)
        self.W_k = _linear(c, c.d_model, self.n_kv * self.d_h)
        self.W_v = _linear(c, c.d_model, self.n_kv * self.d_h)
        self.W_o = _linear(c, c.inner, c.d_model)

    def cache_widths(self) -> tuple[int, ...]:
        return (self.n_kv * self.d_h, self.n_kv * self.d_h)

    def cache_entries(self, x):  # x (B, L, d) -> K, V (B, L, n_KV d_H)
        return self.W_k(x), self.W_v(x)

    def queries(self, x):  # (B, L, d) -> (B, H, L, d_H)
        B, L, _ = x.shape
        return self.W_q(x).view(B, L, self.n_heads, self.d_h).transpose(1, 2)

    def keys_values(self, cache):  # K, V (B, S, n_KV d_H) -> (B, n_KV, S, d_H) each
        B, S, _ = cache[0].shape
        return tuple(t.view(B, S, self.n_kv, self.d_h).transpose(1, 2) for t in cache)

    def output(self, o):  # o (B, H, L, d_H) -> (B, L, d)
        B, H, L, _ = o.shape
        return self.W_o(o.transpose(1, 2).reshape(B, L, H * self.d_h))

    def parameter_count(self) -> int:
        """2 d n_H d_H + 2 d n_KV d_H: Table 1's 4 d^2 (MHA), 2 d^2 + 2 n_KV d_H d (GQA) at d = n_H d_H."""
        d, inner = self.W_q.in_features, self.W_q.out_features
        return 2 * d * inner + 2 * d * self.n_kv * self.d_h


class LatentProjection(nn.Module):
    """MLA: down-projections to latents, per-head up-projections (no decoupled RoPE, no latent norm).

    Query: W_DQ (d -> d_c^Q), W_UQ (d_c^Q -> n_H d_H), or one full W_Q if mla_q_rank is None.
    Keys/values: separate W_DK, W_DV (d -> d_c) or one shared W_DKV; W_UK, W_UV (d_c -> n_H d_H); W_O.
    Caches the latents: c_K, c_V (2 d_c per token) or c_KV (d_c per token).
    """

    def __init__(self, c: AttentionConfig):
        super().__init__()
        self.n_heads, self.d_h, self.d_c, self.shared = c.n_heads, c.head_dim, c.mla_kv_rank, c.mla_shared_kv
        if c.mla_q_rank is None:
            self.W_dq, self.W_uq = None, _linear(c, c.d_model, c.inner)
        else:
            self.W_dq, self.W_uq = _linear(c, c.d_model, c.mla_q_rank), _linear(c, c.mla_q_rank, c.inner)
        if self.shared:
            self.W_dkv = _linear(c, c.d_model, self.d_c)
        else:
            self.W_dk = _linear(c, c.d_model, self.d_c)
            self.W_dv = _linear(c, c.d_model, self.d_c)
        self.W_uk = _linear(c, self.d_c, c.inner)
        self.W_uv = _linear(c, self.d_c, c.inner)
        self.W_o = _linear(c, c.inner, c.d_model)

    def cache_widths(self) -> tuple[int, ...]:
        return (self.d_c,) if self.shared else (self.d_c, self.d_c)

    def cache_entries(self, x):  # x (B, L, d) -> (c_KV,) or (c_K, c_V), each (B, L, d_c)
        return (self.W_dkv(x),) if self.shared else (self.W_dk(x), self.W_dv(x))

    def _heads(self, t):  # (B, L, n_H d_H) -> (B, H, L, d_H)
        B, L, _ = t.shape
        return t.view(B, L, self.n_heads, self.d_h).transpose(1, 2)

    def queries(self, x):  # (B, L, d) -> (B, H, L, d_H)
        return self._heads(self.W_uq(x if self.W_dq is None else self.W_dq(x)))

    def keys_values(self, cache):  # latents (B, S, d_c) -> K, V (B, H, S, d_H), up-projected on the fly
        c_k, c_v = (cache[0], cache[0]) if self.shared else cache
        return self._heads(self.W_uk(c_k)), self._heads(self.W_uv(c_v))

    def output(self, o):  # o (B, H, L, d_H) -> (B, L, d)
        B, H, L, _ = o.shape
        return self.W_o(o.transpose(1, 2).reshape(B, L, H * self.d_h))

    def parameter_count(self) -> int:
        """Query (d d_c^Q + d_c^Q n_H d_H, or d n_H d_H) + K/V (2 d d_c or d d_c, + 2 d_c n_H d_H) + n_H d_H d.

        At d = n_H d_H and d_c^Q = d_c: Table 1's d^2 + 6 d d_c (separated KV), d^2 + 5 d d_c (shared KV).
        """
        d, inner = self.W_o.out_features, self.W_o.in_features
        q = d * inner if self.W_dq is None else self.W_dq.out_features * (d + inner)
        kv_down = (1 if self.shared else 2) * d * self.d_c
        return q + kv_down + 2 * self.d_c * inner + inner * d


class TuckerProjection(nn.Module):
    """Tucker Attention: factors U_2, U_3, U~_2, U~_3 as linear maps, head factors U_1, U~_1 and cores C, C~.

    q_factor (d -> r_2) = U_2^T, k_factor (d -> r_3) = U_3^T, v_factor (d -> r~_2) = U~_2^T,
    o_factor (r~_3 -> d) = U~_3; head_qk U_1 (n_H, r_1), core_qk C (r_1, r_2, r_3),
    head_vo U~_1 (n_H, r~_1), core_vo C~ (r~_1, r~_2, r~_3).
    Caches k~ (r_3) and v~ (r~_2) per token. With `bitlinear` only the four linear factor maps are
    ternary; the small head factors and cores stay in full precision.
    """

    def __init__(self, c: AttentionConfig):
        super().__init__()
        self.n_heads = c.n_heads
        r1, r2, r3 = c.tucker_ranks
        s1, s2, s3 = c.tucker_ranks_out
        self.q_factor = _linear(c, c.d_model, r2)
        self.k_factor = _linear(c, c.d_model, r3)
        self.v_factor = _linear(c, c.d_model, s2)
        self.o_factor = _linear(c, s3, c.d_model)
        # Fan-in-scaled Gaussian init: G_h = U_1[h] C keeps q_h at roughly unit scale per entry.
        self.head_qk = nn.Parameter(torch.randn(c.n_heads, r1) / math.sqrt(r1))  # U_1 (n_H, r_1)
        self.core_qk = nn.Parameter(torch.randn(r1, r2, r3) / math.sqrt(r2))  # C (r_1, r_2, r_3)
        self.head_vo = nn.Parameter(torch.randn(c.n_heads, s1) / math.sqrt(s1))  # U~_1 (n_H, r~_1)
        self.core_vo = nn.Parameter(torch.randn(s1, s2, s3) / math.sqrt(s2 * c.n_heads))  # C~ (r~_1, r~_2, r~_3)

    def cache_widths(self) -> tuple[int, ...]:
        return (self.k_factor.out_features, self.v_factor.out_features)

    def cache_entries(self, x):  # x (B, L, d) -> k~ (B, L, r_3), v~ (B, L, r~_2)
        return self.k_factor(x), self.v_factor(x)

    def queries(self, x):  # (B, L, d) -> q_h = G_h^T U_2^T x, (B, H, L, r_3)
        G = torch.einsum("ha,abc->hbc", self.head_qk, self.core_qk)  # (H, r_2, r_3)
        return torch.einsum("nlr,hrc->nhlc", self.q_factor(x), G)

    def keys_values(self, cache):  # k~ (B, S, r_3), v~ (B, S, r~_2) -> one shared key/value head each
        k, v = cache
        return k.unsqueeze(1), v.unsqueeze(1)  # (B, 1, S, r_3), (B, 1, S, r~_2)

    def output(self, o):  # o (B, H, L, r~_2) -> y = U~_3 sum_h G~_h^T o_h, (B, L, d)
        G = torch.einsum("ha,abc->hbc", self.head_vo, self.core_vo)  # (H, r~_2, r~_3)
        return self.o_factor(torch.einsum("nhlv,hvc->nlc", o, G))

    def parameter_count(self) -> int:
        """(n_H r_1 + d r_2 + d r_3 + r_1 r_2 r_3) + (n_H r~_1 + d r~_2 + d r~_3 + r~_1 r~_2 r~_3).

        At the paper's ranks (r_1, r, r) for both tensors: 2 n_H r_1 + 4 d r + 2 r_1 r^2.
        """
        d = self.q_factor.in_features
        total = 0
        for core in (self.core_qk, self.core_vo):
            r1, r2, r3 = core.shape
            total += self.n_heads * r1 + d * r2 + d * r3 + r1 * r2 * r3
        return total


_PROJECTIONS = {"mha": GroupedProjection, "gqa": GroupedProjection, "mla": LatentProjection, "tucker": TuckerProjection}


class FamilyAttention(nn.Module):
    """One self-attention layer of the family: x (B, L, d) -> y (B, L, d), with a per-kind KV cache.

    The kind-specific part lives in `self.proj` (cache entries, queries, keys/values, output map); the
    attention itself is shared: scaled dot product with scale 1/sqrt(d_H), key/value heads broadcast
    over query-head groups (head h reads group h // (n_H / n_kv)), causal in decoder mode.
    """

    def __init__(self, config: AttentionConfig):
        super().__init__()
        self.config = config
        self.proj = _PROJECTIONS[config.kind](config)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, past: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """x (B, L, d) -> y (B, L, d) and the cache after appending this call's L tokens.

        past: the cache returned by an earlier call (tuple of (B, S_past, c_k) tensors) or None; the L new
        tokens sit at positions S_past .. S_past + L - 1. attn_mask: optional boolean (B or 1, 1, L, S),
        True where a query may look (S = S_past + L); in decoder mode it is combined with the causal mask.
        """
        cache = self.proj.cache_entries(x)
        if past is not None:
            cache = tuple(torch.cat([p, c], dim=1) for p, c in zip(past, cache))  # (B, S, c_k)
        q = self.proj.queries(x)  # (B, H, L, e)
        k, v = self.proj.keys_values(cache)  # (B, H_kv, S, e), (B, H_kv, S, e_v)
        H, H_kv = q.shape[1], k.shape[1]
        if H_kv != H:
            k, v = (t.repeat_interleave(H // H_kv, dim=1) for t in (k, v))
        L, S = q.shape[2], k.shape[2]
        is_causal, mask = False, attn_mask
        if self.config.causal:
            if attn_mask is None and L == S:
                is_causal = True
            else:
                pos_q = torch.arange(S - L, S, device=x.device)[:, None]
                causal = pos_q >= torch.arange(S, device=x.device)[None, :]  # (L, S)
                mask = causal if attn_mask is None else attn_mask & causal
        p = self.config.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal, scale=self.scale)
        return self.proj.output(o), cache

    def parameter_count(self) -> int:
        """Table 1 '#Params (train)': the weights of the query, key, value and output maps of this kind."""
        return self.proj.parameter_count()

    def kv_cache_width(self) -> int:
        """Numbers cached per token per layer (per batch element)."""
        return sum(self.proj.cache_widths())

    def kv_cache_size(self, seq_len: int) -> int:
        """Table 1 'KV Cache' for N = seq_len tokens, per layer and batch element.

        MHA 2 N n_H d_H, GQA 2 N n_KV d_H, MLA 2 N d_c (separated) or N d_c (shared), Tucker N (r_3 + r~_2)
        (= 2 N r at ranks (r_1, r, r)).
        """
        return seq_len * self.kv_cache_width()


# ----------------------------------------------------------------------------------------------------
# Special cases: map MHA / GQA / MLA weights into a Tucker module with identical outputs


def _tucker_like(src: FamilyAttention, ranks, ranks_out) -> FamilyAttention:
    c = src.config
    cfg = AttentionConfig(
        d_model=c.d_model,
        n_heads=c.n_heads,
        head_dim=c.head_dim,
        kind="tucker",
        tucker_ranks=ranks,
        tucker_ranks_out=ranks_out,
        causal=c.causal,
        bitlinear=c.bitlinear,
        dropout=c.dropout,
    )
    return FamilyAttention(cfg).to(device=src.proj.W_o.weight.device, dtype=src.proj.W_o.weight.dtype)


def _head_selector(n_heads: int, d_h: int, rows_group: int, cols_group: int) -> torch.Tensor:
    """Per-head 0/1 block selector (H, rows, cols): entry [h, g_r(h) d_H + i, g_c(h) d_H + i] = 1.

    rows_group / cols_group: heads per block on that axis (1 = block h, n_H / n_KV = block of h's group).
    """
    n_r, n_c = n_heads // rows_group, n_heads // cols_group
    sel = torch.zeros(n_heads, n_r * d_h, n_c * d_h)
    eye = torch.eye(d_h)
    for h in range(n_heads):
        r, c = h // rows_group, h // cols_group
        sel[h, r * d_h : (r + 1) * d_h, c * d_h : (c + 1) * d_h] = eye
    return sel


@torch.no_grad()
def tucker_from_grouped(src: FamilyAttention) -> FamilyAttention:
    """MHA or GQA -> Tucker with the same outputs (exact; also under `bitlinear`, the factors being copies).

    Ranks: W (n_H, n_H d_H, n_KV d_H), W~ (n_H, n_KV d_H, n_H d_H); MHA is n_KV = n_H, i.e. (n_H, d, d).
    U_2 = W_Q, U_3 = W_K, U~_2 = W_V, U~_3 = W_O, U_1 = U~_1 = I_{n_H}, and the cores are 0/1 selectors
    C[h] = E_h E_{g(h)}^T, C~[h] = E_{g(h)} E_h^T (E_h picks head h's d_H block, g(h) its KV group).
    """
    if src.config.kind not in ("mha", "gqa"):
        raise ValueError(f"tucker_from_grouped maps mha/gqa, got {src.config.kind!r}")
    p, c = src.proj, src.config
    H, G, d_h = c.n_heads, c.n_kv_heads, c.head_dim
    out = _tucker_like(src, (H, H * d_h, G * d_h), (H, G * d_h, H * d_h))
    t = out.proj
    t.q_factor.weight.copy_(p.W_q.weight)
    t.k_factor.weight.copy_(p.W_k.weight)
    t.v_factor.weight.copy_(p.W_v.weight)
    t.o_factor.weight.copy_(p.W_o.weight)
    t.head_qk.copy_(torch.eye(H))
    t.head_vo.copy_(torch.eye(H))
    t.core_qk.copy_(_head_selector(H, d_h, 1, H // G))
    t.core_vo.copy_(_head_selector(H, d_h, H // G, 1))
    return out


@torch.no_grad()
def tucker_from_mla(src: FamilyAttention) -> FamilyAttention:
    """MLA -> Tucker with the same outputs (exact without `bitlinear`: the cores are products of weights).

    Ranks: W (n_H, d_c^Q, d_c^K) (d_c^Q -> n_H d_H for a full-rank query), W~ (n_H, d_c^V, n_H d_H).
    U_2 = W_DQ (or W_Q), U_3 = W_DK, U~_2 = W_DV (both W_DKV when shared), U~_3 = W_O, U_1 = U~_1 = I,
    C[h] = W_UQ^h (W_UK^h)^T (d_c^Q, d_c^K), C~[h] = W_UV^h E_h^T (d_c^V, n_H d_H).
    With a shared latent the Tucker form holds two copies of W_DKV and caches k~ and v~ separately
    (2 d_c per token against MLA's d_c): the outputs agree, the cache does not shrink.
    """
    if src.config.kind != "mla":
        raise ValueError(f"tucker_from_mla maps mla, got {src.config.kind!r}")
    p, c = src.proj, src.config
    H, d_h, d_c, inner = c.n_heads, c.head_dim, c.mla_kv_rank, c.inner
    if p.W_dq is None:  # full-rank query: U_2 = W_Q, per-head "up" map is the head selector
        down_q, up_q = p.W_uq.weight, torch.eye(inner, dtype=p.W_uq.weight.dtype, device=p.W_uq.weight.device)
    else:
        down_q, up_q = p.W_dq.weight, p.W_uq.weight  # (d_c^Q, d), (n_H d_H, d_c^Q)
    down_k, down_v = (p.W_dkv.weight, p.W_dkv.weight) if p.shared else (p.W_dk.weight, p.W_dv.weight)
    r_q = down_q.shape[0]
    out = _tucker_like(src, (H, r_q, d_c), (H, d_c, inner))
    t = out.proj
    t.q_factor.weight.copy_(down_q)
    t.k_factor.weight.copy_(down_k)
    t.v_factor.weight.copy_(down_v)
    t.o_factor.weight.copy_(p.W_o.weight)
    t.head_qk.copy_(torch.eye(H))
    t.head_vo.copy_(torch.eye(H))
    uq = up_q.view(H, d_h, r_q)  # W_UQ^h as (d_H, d_c^Q)
    uk = p.W_uk.weight.view(H, d_h, d_c)  # W_UK^h as (d_H, d_c)
    t.core_qk.copy_(torch.einsum("hiq,hik->hqk", uq, uk))
    uv = p.W_uv.weight.view(H, d_h, d_c)  # W_UV^h as (d_H, d_c)
    core_vo = torch.zeros(H, d_c, inner, dtype=uv.dtype, device=uv.device)
    for h in range(H):
        core_vo[h, :, h * d_h : (h + 1) * d_h] = uv[h].T
    t.core_vo.copy_(core_vo)
    return out

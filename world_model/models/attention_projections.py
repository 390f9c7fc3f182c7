"""The kind-specific half of a family attention layer (`world_model.models.attention_family`): what each kind
caches per token, how it turns the cache into keys/values and how it maps the heads back to d_model.

Every projection offers cache_widths(), cache_entries(x (B, L, d)) -> tuple of (B, L, c_k),
queries(x) -> (B, H, L, e), keys_values(cache) -> (B, H_kv, S, e), (B, H_kv, S, e_v),
output(o (B, H, L, e_v)) -> (B, L, d) and parameter_count() (the Table 1 formula).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.attention_config import AttentionConfig

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


class ListingProjection(nn.Module):
    """The reference listing's TuckerAttention: for each of Q, K and V a factor (d -> r) then a core
    (r -> n_H d_H), so W_Q = core_Q factor_Q is of rank at most r_Q (likewise K, V); W_O (n_H d_H -> d) is dense.

    Keys and values are formed whole, n_H d_H each a token, and cached so: this form saves parameters, not KV
    cache (caching the r_K + r_V factor outputs instead would make it MLA with an up-projection per head).
    At ranks (d, d, d) with identity factors it is MHA; GQA and MLA are not special cases of it (their shared or
    latent keys are still projected to every head's width here). With `bitlinear` all seven maps are ternary.
    """

    def __init__(self, c: AttentionConfig):
        super().__init__()
        self.n_heads, self.d_h = c.n_heads, c.head_dim
        r_q, r_k, r_v = c.listing_ranks
        self.q_factor, self.q_core = _linear(c, c.d_model, r_q), _linear(c, r_q, c.inner)
        self.k_factor, self.k_core = _linear(c, c.d_model, r_k), _linear(c, r_k, c.inner)
        self.v_factor, self.v_core = _linear(c, c.d_model, r_v), _linear(c, r_v, c.inner)
        self.W_o = _linear(c, c.inner, c.d_model)

    def _heads(self, t):  # (B, L, n_H d_H) -> (B, H, L, d_H)
        B, L, _ = t.shape
        return t.view(B, L, self.n_heads, self.d_h).transpose(1, 2)

    def cache_widths(self) -> tuple[int, ...]:
        return (self.n_heads * self.d_h, self.n_heads * self.d_h)

    def cache_entries(self, x):  # x (B, L, d) -> K, V (B, L, n_H d_H)
        return self.k_core(self.k_factor(x)), self.v_core(self.v_factor(x))

    def queries(self, x):  # (B, L, d) -> (B, H, L, d_H)
        return self._heads(self.q_core(self.q_factor(x)))

    def keys_values(self, cache):  # K, V (B, S, n_H d_H) -> (B, H, S, d_H) each
        return tuple(self._heads(t) for t in cache)

    def output(self, o):  # o (B, H, L, d_H) -> (B, L, d)
        B, H, L, _ = o.shape
        return self.W_o(o.transpose(1, 2).reshape(B, L, H * self.d_h))

    def parameter_count(self) -> int:
        """(d + n_H d_H)(r_Q + r_K + r_V) + n_H d_H d. At d = n_H d_H: 2 d (r_Q + r_K + r_V) + d^2, so 5 d^2 at the
        listing's default ranks (d, d/2, d/2) and 7 d^2 at full ranks; fewer than MHA's 4 d^2 only when
        r_Q + r_K + r_V < 3 d / 2."""
        d, inner = self.W_o.out_features, self.W_o.in_features
        ranks = sum(f.out_features for f in (self.q_factor, self.k_factor, self.v_factor))
        return (d + inner) * ranks + inner * d


PROJECTIONS = {
    "mha": GroupedProjection,
    "gqa": GroupedProjection,
    "mla": LatentProjection,
    "tucker": TuckerProjection,
    "tucker_listing": ListingProjection,
}

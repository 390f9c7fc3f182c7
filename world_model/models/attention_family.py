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

Special cases (see `tucker_from_grouped`, `tucker_from_mla` in `world_model.models.attention_conversions`; all exact
in real arithmetic):
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

Layout: `attention_config` (AttentionConfig, KINDS), `attention_projections` (the per-kind projections and
BitLinear), this module (the shared attention), `attention_conversions` (the special cases above).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.attention_config import AttentionConfig
from world_model.models.attention_projections import PROJECTIONS


class FamilyAttention(nn.Module):
    """One self-attention layer of the family: x (B, L, d) -> y (B, L, d), with a per-kind KV cache.

    The kind-specific part lives in `self.proj` (cache entries, queries, keys/values, output map); the
    attention itself is shared: scaled dot product with scale 1/sqrt(d_H), key/value heads broadcast
    over query-head groups (head h reads group h // (n_H / n_kv)), causal in decoder mode.
    """

    def __init__(self, config: AttentionConfig):
        super().__init__()
        self.config = config
        self.proj = PROJECTIONS[config.kind](config)
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

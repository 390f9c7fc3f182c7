"""Special cases of Tucker Attention: MHA / GQA / MLA weights mapped into a Tucker layer with identical outputs;
and MHA mapped into the reference listing's form (`listing_from_mha`).

See `world_model.models.attention_family` for the notation (U_1, U_2, U_3, C of W; U~_1, U~_2, U~_3, C~ of W~).
"""

from __future__ import annotations

import torch

from world_model.models.attention_config import AttentionConfig
from world_model.models.attention_family import FamilyAttention


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


@torch.no_grad()
def listing_from_mha(src: FamilyAttention) -> FamilyAttention:
    """MHA -> the reference listing's form at full ranks (d, d, d) with the same outputs: identity factors, the MHA
    maps W_Q, W_K, W_V as cores, W_O kept (exact in real arithmetic). Needs d_model = n_H d_H and no `bitlinear`
    (a ternary identity is the identity scaled by 1/d)."""
    c = src.config
    if c.kind != "mha" or c.inner != c.d_model or c.bitlinear:
        raise ValueError(f"listing_from_mha maps mha with d_model = n_H d_H and no bitlinear, got {c}")
    cfg = AttentionConfig(
        d_model=c.d_model, n_heads=c.n_heads, head_dim=c.head_dim, kind="tucker_listing",
        listing_ranks=(c.d_model,) * 3, causal=c.causal, bitlinear=c.bitlinear, dropout=c.dropout,
    )  # fmt: skip
    out = FamilyAttention(cfg).to(device=src.proj.W_o.weight.device, dtype=src.proj.W_o.weight.dtype)
    p, t = src.proj, out.proj
    eye = torch.eye(c.d_model, dtype=p.W_q.weight.dtype, device=p.W_q.weight.device)
    for factor, core, weight in (
        (t.q_factor, t.q_core, p.W_q),
        (t.k_factor, t.k_core, p.W_k),
        (t.v_factor, t.v_core, p.W_v),
    ):
        factor.weight.copy_(eye)  # (r = d, d)
        core.weight.copy_(weight.weight)  # (n_H d_H, r)
    t.W_o.weight.copy_(p.W_o.weight)
    return out

"""The flat baseline's layers: the rotary position code, its default causal self-attention (one stacked W_qkv, no
biases) and the Pre-LN block that holds either it or a `FamilyAttention` (`world_model.models.baseline` stacks them).

Shapes: B batch, L sequence length, d model width, H heads of width w = d / H.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.attention_family import FamilyAttention
from world_model.models.baseline_config import BaselineConfig


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position code (RoFormer, Su et al. 2021; the half-split pairing of GPT-NeoX): x (B, H, L, w) at
    positions (L,) or (B, L) -> (B, H, L, w), channel i paired with i + w/2 and the pair turned by the angle
    position * base^(-2i/w). Dot products of rotated queries and keys depend on positions only through their
    difference."""
    half = x.shape[-1] // 2
    dtype = torch.promote_types(x.dtype, torch.float32)  # angles in fp32 at least (fp64 for a float64 model)
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=dtype) / half)  # (w/2,)
    angle = positions.to(dtype)[..., None] * inv_freq  # (L, w/2) or (B, L, w/2)
    if angle.dim() == 3:
        angle = angle[:, None]  # (B, 1, L, w/2), broadcast over heads
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention: W_Q, W_K, W_V (stacked in one d x 3d map) and W_O, no biases; with
    `positions="rotary"` the queries and keys are rotated by their positions (`rotate`) before the scores."""

    def __init__(self, config: BaselineConfig):
        super().__init__()
        self.n_heads, self.d = config.n_heads, config.d
        self.rotary = config.positions == "rotary"
        self.W_qkv = nn.Linear(config.d, 3 * config.d, bias=False)
        self.W_o = nn.Linear(config.d, config.d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        attn_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, Lq, d) -> (B, Lq, d) and the keys/values (B, H, Lk, d/H) after appending this call's.

        Without `past`, x is a whole sequence from position 0 and the mask is causal (right padding needs
        nothing more: a live position never sees a later slot). With `past`, `attn_mask` (B, 1, Lq, Lk),
        True where a query may look, is required. Rotary attention needs the positions (Lq,) or (B, Lq) of x;
        the cached keys are stored rotated.
        """
        B, Lq, d = x.shape
        q, k, v = self.W_qkv(x).view(B, Lq, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.rotary:
            if positions is None:
                raise ValueError("rotary attention needs the positions of its queries")
            q, k = rotate(q, positions), rotate(k, positions)
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

    def forward(self, x, past=None, attn_mask=None, positions=None):
        """x (B, L, d) -> (B, L, d) and this layer's cache; `positions` (L,) or (B, L) only for rotary attention."""
        rotary = {} if positions is None else {"positions": positions}  # only CausalSelfAttention takes them
        y, kv = self.attention(self.ln_attn(x), past=past, attn_mask=attn_mask, **rotary)
        x = x + self.dropout(y)
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.ln_mlp(x))))), kv

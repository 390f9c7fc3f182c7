"""The layers of the 4-tensor predictor (sections 4.3-4.5 of the 4-tensor paper): input construction,
the full-fiber rank-4 attention and the Pre-LN layer, on the stored layout (B, N, T, d_x, d_t).

Axis names used in the shape comments:
    B batch, T sentences in the window, N token slots per sentence, V vocabulary,
    d_x semantic fiber, d_t temporal-context fiber, d = d_x * d_t (flat index phi(n, q) = n * d_t + q), H heads.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.four_tensor_config import FourTensorConfig


def zero_rows(grad: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Gradient hook: the same gradient with the given rows cleared."""
    return grad.index_fill(0, torch.tensor(rows, device=grad.device), 0.0)


def sinusoidal_embedding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal code of real-valued positions: (...) -> (..., dim).

    Slot 2i holds sin(pos / 10000^(2i/dim)), slot 2i+1 the cosine; an odd dim leaves its last slot 0.
    """
    half = dim // 2
    i = torch.arange(half, dtype=positions.dtype, device=positions.device)
    angle = positions.unsqueeze(-1) / 10000.0 ** (2 * i / dim)
    pe = positions.new_zeros(*positions.shape, dim)
    pe[..., 0 : 2 * half : 2] = torch.sin(angle)
    pe[..., 1 : 2 * half : 2] = torch.cos(angle)
    return pe


def temporal_causal_bias(pad_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention bias of the temporal-causal variant: pad_mask (B, N, T) -> (B, 1, N*T, N*T).

    Flat positions are x * T + t. Key (x', t') is open to query (x, t) when t' <= t and the key is not
    padding (bias 0); every other key gets the finite minimum. A query whose visible keys are all padding
    attends uniformly to its visible keys (t' <= t), never to a later slice.
    """
    B, N, T = pad_mask.shape
    t = torch.arange(T, device=pad_mask.device).repeat(N)  # (NT,) slice of each flat position
    visible = t[None, :] <= t[:, None]  # (NT query, NT key)
    open_keys = visible[None] & ~pad_mask.reshape(B, 1, N * T)  # (B, NT, NT)
    open_keys = torch.where(open_keys.any(dim=-1, keepdim=True), open_keys, visible[None])
    bias = torch.zeros(open_keys.shape, dtype=dtype, device=pad_mask.device)
    return bias.masked_fill(~open_keys, torch.finfo(dtype).min)[:, None]


class InputConstruction(nn.Module):
    """Stages A-D of section 4.3: token ids (B, T, N) -> input tensor X (B, N, T, d_x, d_t)."""

    def __init__(self, config: FourTensorConfig):
        super().__init__()
        c = config
        self.E_sem = nn.Embedding(c.vocab_size, c.d_x, padding_idx=c.padding_idx)  # (V, d_x)
        self.E_temp = nn.Embedding(c.vocab_size, c.d_t, padding_idx=c.padding_idx)  # (V, d_t)
        # padding_idx only stops the lookup's gradient; the tied readout reaches E_sem too, so the padding
        # row's gradient is cleared on every path and the row stays zero under AdamW. The unknown word
        # (text outside the vocabulary, e.g. in captions) never occurs in training; its rows are held at
        # zero the same way, so an unknown slot carries its position (P + Temb) and no content. Unlike
        # padding it is not masked: the state keeps its shape.
        frozen = [c.padding_idx] if c.unknown_idx is None else [c.padding_idx, c.unknown_idx]
        with torch.no_grad():
            for table in (self.E_sem, self.E_temp):
                table.weight[frozen] = 0.0
                table.weight.register_hook(partial(zero_rows, rows=frozen))
        x = torch.arange(c.n_tokens, dtype=torch.float32)
        t = torch.arange(c.n_states, dtype=torch.float32)
        # Stage B: P[x, n], phase x.  Stage D: Temb[x, t, q], joint phase x + t.
        self.register_buffer("P", sinusoidal_embedding(x, c.d_x), persistent=False)  # (N, d_x)
        self.register_buffer(
            "Temb", sinusoidal_embedding(x[:, None] + t[None, :], c.d_t), persistent=False
        )  # (N, T, d_t)

    def token_tensor(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Stage A and C: outer products E_sem[id] x E_temp[id], (B, T, N) -> (B, N, T, d_x, d_t)."""
        e_n = self.E_sem(token_ids)  # (B, T, N, d_x)
        e_q = self.E_temp(token_ids)  # (B, T, N, d_t)
        return (e_n.unsqueeze(-1) * e_q.unsqueeze(-2)).permute(0, 2, 1, 3, 4)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        T = token_ids.shape[1]
        S = self.token_tensor(token_ids)  # (B, N, T, d_x, d_t)
        P = self.P[None, :, None, :, None]  # broadcast over t and q
        Temb = self.Temb[None, :, :T, None, :]  # broadcast over n
        return S + P + Temb


class FourTensorAttention(nn.Module):
    """H full-fiber rank-4 heads of one layer, summed (sections 4.4-4.5).

    Dense form (qkv_form="dense"): the weights of every head and of Q, K, V live in one parameter `w_qkv`
    of shape (3, H, d_x, d_t, d_x, d_t) indexed [map, head, m, p, n, q], so that one matmul produces all
    of them.

    Tucker form (qkv_form="tucker", ranks (r_m, r_p, r_n, r_q)): each map g and head h has
        W[m, p, n, q] = sum_{i j c e} G[i, j, c, e] A[m, i] B[p, j] C[n, c] D[q, e]
    with the cores in one parameter `core` (3, H, r_m, r_p, r_n, r_q) and the factors in `factor_m` (A),
    `factor_p` (B), `factor_n` (C), `factor_q` (D): (3, H, d_x, r_m), (3, H, d_t, r_p), (3, H, d_x, r_n),
    (3, H, d_t, r_q), or (d_x, r_m), ... shared by every map and head with tucker_shared_factors. The dense
    (d_x d_t)^2 weight is never formed: X is contracted with C, D, the core, B and A in turn (see `qkv`).

    Initialisation (tucker): factors with orthonormal columns (nn.init.orthogonal_), core entries uniform
    with variance d / (r_m r_p r_n r_q). Orthonormal factors preserve the Frobenius norm, so the composed
    W has ||W||_F^2 ~ d, i.e. mean-square entry 1/d and E||W x||^2 = ||x||^2 for white x: the same as the
    dense form's Xavier-uniform d x d matrix (variance 2 / (d + d) = 1 / d). At full ranks the core is
    itself Xavier-distributed.
    """

    def __init__(self, config: FourTensorConfig):
        super().__init__()
        c = config
        self.n_heads, self.d, self.d_x, self.d_t = c.n_heads, c.d, c.d_x, c.d_t
        self.fused = c.attention == "fused"
        self.causal = c.temporal_causal
        self.form = c.qkv_form
        self.shared_factors = c.tucker_shared_factors
        if self.form == "dense":
            w = torch.empty(3, c.n_heads, c.d, c.d)
            for flat in w.view(-1, c.d, c.d):
                nn.init.xavier_uniform_(flat)  # Xavier on the flat (d_x d_t) x (d_x d_t) matrix
            self.w_qkv = nn.Parameter(w.view(3, c.n_heads, c.d_x, c.d_t, c.d_x, c.d_t))
        else:
            r_m, r_p, r_n, r_q = c.tucker_ranks
            lead = () if self.shared_factors else (3, c.n_heads)
            for name, rows, rank in (
                ("factor_m", c.d_x, r_m),
                ("factor_p", c.d_t, r_p),
                ("factor_n", c.d_x, r_n),
                ("factor_q", c.d_t, r_q),
            ):
                f = torch.empty(*lead, rows, rank)
                for mat in f.view(-1, rows, rank):
                    nn.init.orthogonal_(mat)  # orthonormal columns (rank <= rows)
                setattr(self, name, nn.Parameter(f))
            bound = math.sqrt(3.0 * c.d / (r_m * r_p * r_n * r_q))  # uniform(-a, a) has variance a^2 / 3
            self.core = nn.Parameter(torch.empty(3, c.n_heads, r_m, r_p, r_n, r_q).uniform_(-bound, bound))
        self.scale = 1.0 / math.sqrt(c.d)
        # a list: forward appends (q.k (B, H, N, N*T), pad_mask (B, N, T)), the attention logits (before `scale`) of
        # the last slice's queries, the slots that read out the next sentence (world_model.models.explanations)
        self.last_slice_probe: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def qkv(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """X (B, N*T, d) -> Q, K, V each (B, H, N*T, d)."""
        B, L, d = X.shape
        if self.form == "tucker":
            return self.tucker_qkv(X)
        qkv = F.linear(X, self.w_qkv.view(3 * self.n_heads * d, d))  # (B, L, 3*H*d)
        q, k, v = qkv.view(B, L, 3, self.n_heads, d).permute(2, 0, 3, 1, 4)
        return q, k, v

    def tucker_qkv(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tucker form of `qkv`: five two-operand contractions, batched over the 3 maps and H heads.

        Letters: g map, h head, z batch, l position (N*T), n q the input fibers, m p the output fibers,
        c e i j the ranks r_n r_q r_m r_p. Per position, map and head the cost is
            d_x d_t r_n + r_n d_t r_q + r_n r_q r_m r_p + r_m r_p d_t + r_m d_t d_x
        multiply-adds, against (d_x d_t)^2 for the dense form; the largest intermediate per position is
        3 H max(r_n d_t, r_m d_t) (r_n d_t for the first step only, once, with shared factors).
        The contractions are written pairwise so that no path optimiser can choose to compose W first.
        """
        B, L, d = X.shape
        X = X.view(B, L, self.d_x, self.d_t)
        G = self.core  # (g, h, i, j, c, e)
        if self.shared_factors:
            Y = torch.einsum("zlnq,nc->zlcq", X, self.factor_n)  # (B, L, r_n, d_t)
            Y = torch.einsum("zlcq,qe->zlce", Y, self.factor_q)  # (B, L, r_n, r_q), shared by all maps/heads
            Y = torch.einsum("zlce,ghijce->gzhlij", Y, G)  # (3, B, H, L, r_m, r_p)
            Y = torch.einsum("gzhlij,pj->gzhlip", Y, self.factor_p)  # (3, B, H, L, r_m, d_t)
            Y = torch.einsum("gzhlip,mi->gzhlmp", Y, self.factor_m)  # (3, B, H, L, d_x, d_t)
        else:
            Y = torch.einsum("zlnq,ghnc->gzhlcq", X, self.factor_n)  # (3, B, H, L, r_n, d_t)
            Y = torch.einsum("gzhlcq,ghqe->gzhlce", Y, self.factor_q)  # (3, B, H, L, r_n, r_q)
            Y = torch.einsum("gzhlce,ghijce->gzhlij", Y, G)  # (3, B, H, L, r_m, r_p)
            Y = torch.einsum("gzhlij,ghpj->gzhlip", Y, self.factor_p)  # (3, B, H, L, r_m, d_t)
            Y = torch.einsum("gzhlip,ghmi->gzhlmp", Y, self.factor_m)  # (3, B, H, L, d_x, d_t)
        q, k, v = Y.reshape(3, B, self.n_heads, L, d).unbind(0)
        return q, k, v

    def dense_weights(self) -> torch.Tensor:
        """The weights as one dense (3, H, d_x, d_t, d_x, d_t) tensor [map, head, m, p, n, q].

        For tests and diagnostics only: in tucker form this composes the (d_x d_t)^2 maps the forward
        pass avoids.
        """
        if self.form == "dense":
            return self.w_qkv
        A, Bf, C, D = self.factor_m, self.factor_p, self.factor_n, self.factor_q
        f = "" if self.shared_factors else "gh"
        return torch.einsum(f"ghijce,{f}mi,{f}pj,{f}nc,{f}qe->ghmpnq", self.core, A, Bf, C, D)

    def attention_weights(self, X: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """Joint softmax over all N*T keys: X (B, N, T, d), pad_mask (B, N, T) -> A (B, H, N, T, N, T)."""
        B, N, T, d = X.shape
        q, k, _ = self.qkv(X.reshape(B, N * T, d))
        scores = self.scale * q @ k.transpose(-1, -2)  # (B, H, NT, NT)
        if self.causal:
            scores = scores + temporal_causal_bias(pad_mask, scores.dtype)
        else:
            keys_pad = pad_mask.reshape(B, 1, 1, N * T)
            scores = scores.masked_fill(keys_pad, torch.finfo(scores.dtype).min)  # key axes only
        return scores.softmax(dim=-1).view(B, self.n_heads, N, T, N, T)

    def forward(self, X: torch.Tensor, pad_mask: torch.Tensor, last_slice_only: bool = False) -> torch.Tensor:
        """X (B, N, T, d) normalised stream, pad_mask (B, N, T) True at padding -> (B, N, T, d); with
        `last_slice_only` only the queries of the last sentence slot t = T-1 are answered -> (B, N, 1, d)."""
        B, N, T, d = X.shape
        q, k, v = self.qkv(X.reshape(B, N * T, d))
        if self.last_slice_probe is not None:
            last = q[:, :, T - 1 :: T]  # (B, H, N, d): flat positions x * T + t with t = T - 1
            self.last_slice_probe.append((last @ k.mT, pad_mask))
        T_out = 1 if last_slice_only else T
        if last_slice_only:
            q = q.reshape(B, self.n_heads, N, T, d)[:, :, :, -1]  # (B, H, N, d): flat rows x * T + T - 1
        if self.causal and self.fused:
            # Every query keeps at least one open key (temporal_causal_bias), so the fused kernel is exact.
            bias = temporal_causal_bias(pad_mask, q.dtype)
            if last_slice_only:
                bias = bias[:, :, T - 1 :: T]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)
        elif self.fused:
            # Additive bias of the finite minimum: the same function as masked_fill wherever a key is live,
            # since score + finfo.min rounds to finfo.min. A window whose keys are all padding gets the
            # uniform distribution of the reference, i.e. the mean of V, taken directly: the fused kernel's
            # log-sum-exp cannot resolve log(NT) next to finfo.min and its backward would be wrong there.
            keys_pad = pad_mask.reshape(B, 1, 1, N * T)
            all_pad = keys_pad.all(dim=-1, keepdim=True)  # (B, 1, 1, 1)
            bias = torch.zeros(keys_pad.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill(keys_pad & ~all_pad, torch.finfo(q.dtype).min)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)
            if all_pad.device.type != "cpu" or bool(all_pad.any()):  # on CPU only then: it costs a pass over y
                y = torch.where(all_pad, v.mean(dim=-2, keepdim=True), y)
        else:
            A = self.attention_weights(X, pad_mask).view(B, self.n_heads, N * T, N * T)
            if last_slice_only:
                A = A[:, :, T - 1 :: T]
            y = A @ v  # (B, H, NT or N, d)
        return y.sum(dim=1).view(B, N, T_out, d)  # heads summed, no 1/sqrt(H), no output projection


class FourTensorLayer(nn.Module):
    """Pre-LN layer: X' = X + drop(Attn(LN(X))); X_out = X' + drop(MLP(LN(X'))) on (B, N, T, d)."""

    def __init__(self, config: FourTensorConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d)
        self.attention = FourTensorAttention(config)
        self.ln_mlp = nn.LayerNorm(config.d)
        self.fc1 = nn.Linear(config.d, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d)
        self.dropout = nn.Dropout(config.dropout)  # one rate, both residual branches

    def forward(self, X: torch.Tensor, pad_mask: torch.Tensor, last_slice_only: bool = False) -> torch.Tensor:
        """X (B, N, T, d), pad_mask (B, N, T) -> (B, N, T, d); with `last_slice_only` the layer's output at the
        last sentence slot only, (B, N, 1, d) (its keys and values still come from every slot)."""
        attended = self.attention(self.ln_attn(X), pad_mask, last_slice_only)
        X = (X[:, :, -1:] if last_slice_only else X) + self.dropout(attended)
        return X + self.dropout(self.fc2(F.gelu(self.fc1(self.ln_mlp(X)))))

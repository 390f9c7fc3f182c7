"""The 4-tensor attention predictor (sections 2-5 of the 4-tensor paper).

A window of T sentences of N token ids is lifted into a rank-4 activation per example: token slot x,
sentence t, semantic fiber n (width d_x) and temporal-context fiber q (width d_t). The stored layout is
(B, N, T, d_x, d_t); wherever the two fibers are flattened, the flat index is phi(n, q) = n * d_t + q.

Axis names used in the shape comments:
    B batch, T sentences in the window, N token slots per sentence, V vocabulary,
    d_x semantic fiber, d_t temporal-context fiber, d = d_x * d_t, H heads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.checkpoint import PretrainedMixin
from world_model.models.decoding import check_candidates, choose_candidates, slot_log_likelihood
from world_model.models.inputs import check_example, check_window
from world_model.models.kernels import linear_cross_entropy, linear_mixture_cross_entropy


@dataclass
class FourTensorConfig:
    """Hyper-parameters of the 4-tensor predictor (defaults: the CPU-sized preset)."""

    vocab_size: int
    d_x: int = 16
    d_t: int = 8
    n_heads: int = 4
    n_layers: int = 2
    n_tokens: int = 16  # N, token slots per sentence
    n_states: int = 4  # T, sentences in the input window
    dropout: float = 0.1
    padding_idx: int = 0
    unknown_idx: int | None = 1  # the unknown word: zero, frozen rows (position only, content-free)
    attention: str = "fused"  # "fused" (scaled_dot_product_attention) or "reference" (explicit scores)
    # Form of the Q, K, V weights W[m, p, n, q]: "dense" (one (d_x d_t)^2 map per head and map) or "tucker"
    # (W = G x_m A x_p B x_n C x_q D, see FourTensorAttention). tucker_ranks = (r_m, r_p, r_n, r_q), with
    # r_m, r_n <= d_x and r_p, r_q <= d_t, is required in tucker form and must be None in dense form.
    qkv_form: str = "dense"
    tucker_ranks: tuple[int, int, int, int] | None = None
    tucker_shared_factors: bool = False  # one A, B, C, D for every head and map (True) or one set per head and map
    # Opt-in variants (not in the paper; the defaults are the paper's model):
    temporal_causal: bool = False  # slice t attends only to slices <= t, so every target is a genuine next state
    copy_path: bool = False  # a learned pointer mixture over the window's earlier tokens (CopyPath)
    copy_dim: int = 32  # width of the copy path's query and key projections

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_x", "d_t", "n_heads", "n_layers", "n_tokens", "n_states"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"FourTensorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.padding_idx < self.vocab_size:
            raise ValueError(f"padding_idx {self.padding_idx} is outside the vocabulary of size {self.vocab_size}")
        if self.unknown_idx is not None and not (
            0 <= self.unknown_idx < self.vocab_size and self.unknown_idx != self.padding_idx
        ):
            raise ValueError(f"unknown_idx {self.unknown_idx} must be a vocabulary id other than padding_idx")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1], got {self.dropout}")
        if self.attention not in ("fused", "reference"):
            raise ValueError(f"attention must be 'fused' or 'reference', got {self.attention!r}")
        if self.qkv_form not in ("dense", "tucker"):
            raise ValueError(f"qkv_form must be 'dense' or 'tucker', got {self.qkv_form!r}")
        for flag in ("tucker_shared_factors", "temporal_causal", "copy_path"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if int(self.copy_dim) < 1:
            raise ValueError(f"FourTensorConfig.copy_dim must be >= 1, got {self.copy_dim}")
        if self.qkv_form == "dense":
            if self.tucker_ranks is not None:
                raise ValueError(
                    f"tucker_ranks {self.tucker_ranks!r} given with qkv_form='dense'; set qkv_form='tucker' or drop them"
                )
            if self.tucker_shared_factors:
                raise ValueError("tucker_shared_factors=True needs qkv_form='tucker'")
            return
        ranks = self.tucker_ranks
        if ranks is None:
            raise ValueError("qkv_form='tucker' needs tucker_ranks = (r_m, r_p, r_n, r_q)")
        if (
            not isinstance(ranks, (tuple, list))
            or len(ranks) != 4
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
        ):
            raise ValueError(f"tucker_ranks must be four integers (r_m, r_p, r_n, r_q), got {ranks!r}")
        self.tucker_ranks = tuple(ranks)  # JSON hands back a list
        for name, r, limit, fiber in zip(
            ("r_m", "r_p", "r_n", "r_q"),
            self.tucker_ranks,
            (self.d_x, self.d_t, self.d_x, self.d_t),
            ("d_x", "d_t", "d_x", "d_t"),
        ):
            if not 1 <= r <= limit:
                raise ValueError(
                    f"tucker rank {name} = {r} must lie in [1, {fiber} = {limit}] (tucker_ranks {self.tucker_ranks})"
                )

    @property
    def d(self) -> int:
        """Width of the flattened fiber pair, d_x * d_t."""
        return self.d_x * self.d_t

    @property
    def d_ff(self) -> int:
        """MLP hidden width, 4 * d_x * d_t (section 3.3)."""
        return 4 * self.d

    def to_dict(self) -> dict:
        return {"model_type": "four_tensor", **asdict(self)}

    @classmethod
    def from_vocabulary(cls, vocab_size: int, **hyper) -> "FourTensorConfig":
        """The config for a vocabulary of `vocab_size` ids (the table size) and the given hyper-parameters."""
        return cls(vocab_size=vocab_size, **hyper)

    @classmethod
    def from_dict(cls, data: dict) -> "FourTensorConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


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

    def forward(self, X: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """X (B, N, T, d) normalised stream, pad_mask (B, N, T) True at padding -> (B, N, T, d)."""
        B, N, T, d = X.shape
        q, k, v = self.qkv(X.reshape(B, N * T, d))
        if self.causal and self.fused:
            # Every query keeps at least one open key (temporal_causal_bias), so the fused kernel is exact.
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=temporal_causal_bias(pad_mask, q.dtype), scale=self.scale
            )
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
            y = torch.where(all_pad, v.mean(dim=-2, keepdim=True), y)
        else:
            A = self.attention_weights(X, pad_mask).view(B, self.n_heads, N * T, N * T)
            y = A @ v  # (B, H, NT, d)
        return y.sum(dim=1).view(B, N, T, d)  # heads summed, no 1/sqrt(H), no output projection


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

    def forward(self, X: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        X = X + self.dropout(self.attention(self.ln_attn(X), pad_mask))
        return X + self.dropout(self.fc2(F.gelu(self.fc1(self.ln_mlp(X)))))


class CopyPath(nn.Module):
    """Opt-in learned copy path (copy_path=True): a pointer mixture over the window's earlier tokens.

    Not in the paper; in the spirit of pointer-sentinel and neural-cache language models. For the output
    slot (x, t), which predicts token x of S(t+1), a pointer attends from the final state X[x, t] to the
    final states of the input slots (x', t') with t' <= t whose token is a word (not padding, not the
    unknown word), and a gate g = sigmoid(w . X[x, t] + b) mixes the two distributions:

        p(v | x, t) = (1 - g) softmax(X[x, t] M)[v] + g * sum_{(x', t'): id(x', t') = v} pointer[(x, t), (x', t')]

    A slot with no such earlier token gets g = 0. Flat positions are l = x * T + t, as in the attention.
    """

    def __init__(self, config: FourTensorConfig):
        super().__init__()
        self.query = nn.Linear(config.d, config.copy_dim)
        self.key = nn.Linear(config.d, config.copy_dim)
        self.gate = nn.Linear(config.d, 1)
        nn.init.constant_(self.gate.bias, -1.0)  # start mostly on the vocabulary readout (g ~ 0.27)
        self.scale = 1.0 / math.sqrt(config.copy_dim)
        self.ignored = [config.padding_idx] + ([] if config.unknown_idx is None else [config.unknown_idx])

    def forward(
        self, X: torch.Tensor, token_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """X (B, N, T, d) final states, token_ids (B, T, N) the window ->
        (log g (B, NT), log(1 - g) (B, NT), pointer (B, NT, NT) probabilities over keys, key ids (B, NT)),
        in the copy path's parameter dtype (fp32 under autocast)."""
        B, N, T, d = X.shape
        flat = X.reshape(B, N * T, d).to(self.query.weight.dtype)  # fp32 under autocast: the copy path is small
        key_ids = token_ids.permute(0, 2, 1).reshape(B, N * T)  # (B, NT), flat x * T + t
        t = torch.arange(T, device=X.device).repeat(N)
        with torch.autocast(X.device.type, enabled=False):
            scores = self.scale * self.query(flat) @ self.key(flat).transpose(1, 2)  # (B, NT, NT)
            gate_logit = self.gate(flat)[..., 0]  # (B, NT)
        open_keys = (t[None, :] <= t[:, None])[None] & ~torch.isin(
            key_ids, torch.tensor(self.ignored, device=X.device)
        )[:, None, :]
        has_keys = open_keys.any(dim=-1)  # (B, NT)
        pointer = scores.masked_fill(~open_keys, float("-inf")).softmax(dim=-1).nan_to_num(0.0)  # rows without keys: 0
        log_gate = F.logsigmoid(gate_logit).masked_fill(~has_keys, float("-inf"))
        log_keep = F.logsigmoid(-gate_logit).masked_fill(~has_keys, 0.0)
        return log_gate, log_keep, pointer, key_ids

    @staticmethod
    def target_log_prob(pointer: torch.Tensor, key_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log of the pointer's mass on each slot's target: pointer (B, NT, NT), key_ids (B, NT), targets (B, NT) -> (B, NT).

        A target that occurs in no open key gets log(1e-30) with zero gradient (the clamp), never -inf."""
        mass = (pointer * (key_ids[:, None, :] == targets[:, :, None])).sum(dim=-1)
        return mass.clamp_min(1e-30).log()

    @staticmethod
    def mix(
        vocab_logits: torch.Tensor,
        log_gate: torch.Tensor,
        log_keep: torch.Tensor,
        pointer: torch.Tensor,
        key_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Mixture log-probabilities of some output slots: vocab_logits (B, R, V) of R slots, with their log g,
        log(1 - g) (B, R) and pointer rows (B, R, NT) -> (B, R, V)."""
        copy = torch.zeros(vocab_logits.shape, dtype=pointer.dtype, device=vocab_logits.device)
        copy.scatter_add_(2, key_ids[:, None, :].expand(-1, pointer.shape[1], -1), pointer)  # (B, R, V)
        mixed = (
            log_keep[..., None].exp() * vocab_logits.to(pointer.dtype).softmax(dim=-1)
            + log_gate[..., None].exp() * copy
        )
        return mixed.clamp_min(1e-30).log()


class StepStats(NamedTuple):
    """One training step: the window loss and the last-slice statistics on S(T)."""

    loss: torch.Tensor  # mean cross-entropy over the non-padding targets of S(1..T)
    window_ce_sum: torch.Tensor  # summed cross-entropy over the same targets
    window_tokens: torch.Tensor  # their count
    last_ce_sum: torch.Tensor  # summed cross-entropy over the non-padding tokens of S(T)
    last_correct: torch.Tensor  # argmax matches on those tokens (0 in training mode with the copy path, which skips it)
    last_tokens: torch.Tensor  # their count


class FourTensorModel(PretrainedMixin, nn.Module):
    """The 4-tensor predictor: token windows (B, T, N) -> logits (B, N, T, V) for S(1..T)."""

    config_class = FourTensorConfig

    def __init__(self, config: FourTensorConfig):
        super().__init__()
        self.config = config
        self.input_construction = InputConstruction(config)
        self.layers = nn.ModuleList(FourTensorLayer(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d)
        self.W_prime = nn.Parameter(torch.empty(config.d_t, config.vocab_size))  # (d_t, V)
        nn.init.xavier_uniform_(self.W_prime)
        self.pointer = CopyPath(config) if config.copy_path else None
        self._readout_cache: tuple[tuple, torch.Tensor] | None = None  # (weights' identity and versions, M)

    # ----- checks on what callers hand in -----
    def check_token_ids(self, token_ids: torch.Tensor, name: str = "token_ids") -> None:
        """Reject anything that is not an integer (B, T', N) array of ids in range, with 1 <= T' <= T."""
        c = self.config
        check_window(token_ids, c.n_states, c.n_tokens, c.vocab_size, name)

    # ----- forward pass -----
    def build_pad_mask(self, token_ids: torch.Tensor) -> torch.Tensor:
        """From ids, never from activations: (B, T, N) -> (B, N, T), True where the slot is padding."""
        return (token_ids == self.config.padding_idx).permute(0, 2, 1)

    def encode(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T, N) -> normalised final states X_norm (B, N, T, d), flat index phi(n, q)."""
        self.check_token_ids(token_ids)
        return self._encode(token_ids.long())

    def _encode(self, token_ids: torch.Tensor) -> torch.Tensor:
        """`encode` for ids the caller has already checked (the training step checks the whole example)."""
        pad_mask = self.build_pad_mask(token_ids)  # local to this call, shared by every layer
        X = self.input_construction(token_ids)  # (B, N, T, d_x, d_t)
        B, N, T = X.shape[:3]
        X = X.reshape(B, N, T, self.config.d)
        for layer in self.layers:
            X = layer(X, pad_mask)
        return self.final_norm(X)

    def readout_matrix(self) -> torch.Tensor:
        """Tied rank-1 readout M (d, V): M[n * d_t + q, v] = E_sem[v, n] * W'[q, v].

        Without autograd (evaluation, rollout) M is built once and reused until E_sem or W' change: the
        cache key holds both tensors' storage and version counters, which every in-place update (an
        optimizer step, load_state_dict, a .to() that moves them) advances or replaces.
        """
        E_sem = self.input_construction.E_sem.weight  # (V, d_x)
        key = (
            E_sem.data_ptr(),
            E_sem._version,
            self.W_prime.data_ptr(),
            self.W_prime._version,
            E_sem.dtype,
            E_sem.device,
        )
        cacheable = not torch.is_grad_enabled()
        if cacheable and self._readout_cache is not None and self._readout_cache[0] == key:
            return self._readout_cache[1]
        E_T = E_sem.T.contiguous()  # (d_x, V), small; keeps the product below contiguous
        M = (E_T[:, None, :] * self.W_prime[None, :, :]).view(self.config.d, self.config.vocab_size)  # (d_x d_t, V)
        self._readout_cache = (key, M) if cacheable else None
        return M

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T, N) -> logits (B, N, T, V); logits[:, :, t] predict sentence t + 1.

        With the copy path these are the mixture's log-probabilities (also valid logits)."""
        X = self.encode(token_ids)  # (B, N, T, d)
        logits = X @ self.readout_matrix()  # (B, N, T, V)
        if self.pointer is None:
            return logits
        B, N, T, V = logits.shape
        return CopyPath.mix(logits.reshape(B, N * T, V), *self.pointer(X, token_ids)).view(B, N, T, V)

    def last_slice_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits of the next sentence only: (B, T, N) -> (B, N, V), read out from the last sentence slot
        (the copy path's log-probabilities when it is on)."""
        X = self.encode(token_ids)
        return self.slice_logits(X, token_ids.long(), X.shape[2] - 1)

    def slice_logits(self, X: torch.Tensor, token_ids: torch.Tensor, t: int) -> torch.Tensor:
        """Logits of slice t, which predict sentence t + 1: X (B, N, T, d), token_ids (B, T, N) -> (B, N, V)."""
        logits = X[:, :, t] @ self.readout_matrix()
        if self.pointer is None:
            return logits
        N, T = X.shape[1], X.shape[2]
        rows = torch.arange(N, device=X.device) * T + t  # flat positions (x, t)
        log_gate, log_keep, pointer, key_ids = self.pointer(X, token_ids)
        return CopyPath.mix(logits, log_gate[:, rows], log_keep[:, rows], pointer[:, rows], key_ids)

    def training_step(self, token_ids_full: torch.Tensor) -> StepStats:
        """A stored window (B, T+1, N) -> the window loss on S(1..T) and statistics on S(T).

        The readout runs only on slots whose target is not padding, fused with the cross-entropy; the
        result equals the ignore-index cross-entropy of the full logits (B, N, T, V) against Y permuted
        from (B, T, N) to (B, N, T) (tests/test_four_tensor.py proves it).
        """
        c = self.config
        check_example(token_ids_full, c.n_states, c.n_tokens, c.vocab_size)
        token_ids_full = token_ids_full.long()
        X = self._encode(token_ids_full[:, :-1])  # (B, N, T, d)
        Y = token_ids_full[:, 1:].permute(0, 2, 1)  # (B, T, N) -> (B, N, T)
        live = Y != c.padding_idx  # (B, N, T)
        last = torch.zeros_like(live)
        last[:, :, -1] = True  # the slots of S(T)
        # Readout only on slots with a target, fused with the cross-entropy (no (K, V) logits kept).
        # Rows of S(1..T-1) come first and those of S(T) last, the only ones whose argmax is needed.
        earlier, final = live & ~last, live & last
        target = torch.cat([Y[earlier], Y[final]])  # (K,)
        n_earlier = int(earlier.sum())
        rows = torch.cat([X[earlier], X[final]])  # (K, d)
        if self.pointer is None:
            ce_sum, ce, argmax = linear_cross_entropy(rows, self.readout_matrix(), target, argmax_from=n_earlier)
        else:
            ce_sum, ce, argmax = self.copy_path_loss(X, token_ids_full[:, :-1], Y, earlier, final, rows, target)
        window_tokens = live.sum()
        return StepStats(
            loss=ce_sum / window_tokens.clamp(min=1),
            window_ce_sum=ce_sum.detach(),
            window_tokens=window_tokens,
            last_ce_sum=ce[n_earlier:].sum(),
            last_correct=(argmax == target[n_earlier:]).sum(),
            last_tokens=final.sum(),
        )

    def copy_path_loss(self, X, token_ids, Y, earlier, final, rows, target):
        """`training_step`'s loss with the copy path: -log p(target) of the mixture for the K scored rows.

        X (B, N, T, d), token_ids (B, T, N) the input window, Y (B, N, T) targets, earlier / final (B, N, T)
        the scored slots, rows (K, d) and target (K,) ordered as they are -> (ce_sum, ce (K,), argmax of the
        final rows' mixture, or -1 in training mode). The mixture's loss runs through a chunked kernel (no (K, V) logits)."""
        B, N, T = Y.shape
        log_gate, log_keep, pointer, key_ids = self.pointer(X, token_ids)
        log_copy = CopyPath.target_log_prob(pointer, key_ids, Y.reshape(B, N * T))

        def pick(a: torch.Tensor) -> torch.Tensor:  # (B, NT) -> (K,) in the order of `rows`
            a = a.view(B, N, T)
            return torch.cat([a[earlier], a[final]])

        ce_sum, ce = linear_mixture_cross_entropy(
            rows, self.readout_matrix(), target, pick(log_keep), pick(log_gate) + pick(log_copy)
        )
        if (
            self.training
        ):  # the training loop reads only the loss sums; the final rows' argmax would cost another readout
            argmax = torch.full_like(target[len(target) - int(final.sum()) :], -1)
        else:
            with torch.no_grad():
                argmax = self.slice_logits(X, token_ids, T - 1)[final[:, :, -1]].argmax(dim=-1)
        return ce_sum, ce, argmax

    # ----- autoregressive rollout -----
    def decode_state(
        self,
        logits: torch.Tensor,
        end_ids: list[int] | tuple[int, ...] = (),
        banned_ids: list[int] | tuple[int, ...] = (),
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Read one predicted sentence off its logits: (B, N, V) -> token ids (B, N).

        Length rule. Padding is never a training target (it is dropped by the ignore index) and its logit
        is fixed at 0 by the zero padding row, so it carries no information about where a sentence ends.
        The padding column, the unknown word (its logit is pinned at 0 the same way) and any id in
        `banned_ids` are therefore excluded;
        every slot gets a content token, and the sentence ends at the first slot whose token is one of
        `end_ids` (the sentence-final punctuation the corpus ends its sentences with). Slots after it are
        padding. With no end token the sentence fills all N slots.

        temperature 0 is greedy argmax; temperature > 0 samples from softmax(logits / temperature),
        restricted to the top_k ids when top_k is given, using `generator` for reproducible futures.

        Closed-set readout. With `candidates` (C, N), the known sentences (`world_model.models.decoding`), the
        sentence is one of them instead: each is scored by the summed log-probability of its content slots
        under the per-slot distributions (the excluded ids removed), and the highest score is taken, or one
        is sampled from softmax(score / temperature) (top_k then counts candidates). `end_ids` is not used.
        """
        logits = logits.float().clone()
        excluded = [self.config.padding_idx, *banned_ids]
        if self.config.unknown_idx is not None:
            excluded.append(self.config.unknown_idx)
        logits[..., excluded] = float("-inf")
        if candidates is not None:
            c = self.config
            check_candidates(candidates, c.n_tokens, c.padding_idx, c.vocab_size)
            candidates = candidates.to(logits.device).long()
            scores = slot_log_likelihood(logits.log_softmax(dim=-1), candidates, c.padding_idx)  # (B, C)
            return choose_candidates(scores, candidates, temperature, top_k, generator)
        if temperature <= 0:
            ids = logits.argmax(dim=-1)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = logits.softmax(dim=-1)
            ids = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:-1])
        if end_ids:
            is_end = torch.isin(ids, torch.tensor(list(end_ids), device=ids.device))
            ended_before = (is_end.cumsum(dim=-1) - is_end.long()) > 0  # a slot after the first end token
            ids = ids.masked_fill(ended_before, self.config.padding_idx)
        return ids

    @torch.no_grad()
    def rollout(
        self,
        token_ids: torch.Tensor,
        steps: int,
        end_ids: list[int] | tuple[int, ...] = (),
        banned_ids: list[int] | tuple[int, ...] = (),
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict `steps` future sentences from a window (B, T, N) -> (B, steps, N).

        Each step reads the next sentence off the last slice, appends the prediction, drops the oldest
        sentence once the window holds T, and writes the new window again onto positions 0..T-1 (the temporal embedding is
        recomputed from those positions, section 2.3). Decoding follows `decode_state` (with `candidates`, every
        predicted sentence is one of them).
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.check_token_ids(token_ids)
        window = token_ids.long()
        predicted = []
        for _ in range(steps):
            logits = self.last_slice_logits(window)  # (B, N, V)
            state = self.decode_state(logits, end_ids, banned_ids, temperature, top_k, generator, candidates)
            predicted.append(state)
            window = torch.cat([window, state[:, None]], dim=1)[:, -self.config.n_states :]
        return torch.stack(predicted, dim=1)


def tucker_from_dense(dense_model: FourTensorModel, shared_factors: bool = False) -> FourTensorModel:
    """The tucker-form twin of a dense model at full ranks (d_x, d_t, d_x, d_t): identity factors, the dense
    weights as cores and every other parameter copied, so it computes the same function.

    With shared_factors one identity set serves every map and head; otherwise each gets its own copy.
    """
    c = dense_model.config
    if c.qkv_form != "dense":
        raise ValueError(f"tucker_from_dense needs a dense model, got qkv_form={c.qkv_form!r}")
    config = FourTensorConfig.from_dict(
        {
            **c.to_dict(),
            "qkv_form": "tucker",
            "tucker_ranks": (c.d_x, c.d_t, c.d_x, c.d_t),
            "tucker_shared_factors": shared_factors,
        }
    )
    model = FourTensorModel(config)
    state = dict(dense_model.state_dict())
    lead = () if shared_factors else (3, c.n_heads)
    for i in range(len(dense_model.layers)):
        w = state.pop(f"layers.{i}.attention.w_qkv")
        state[f"layers.{i}.attention.core"] = w.detach().clone()
        for name, size in (("factor_m", c.d_x), ("factor_p", c.d_t), ("factor_n", c.d_x), ("factor_q", c.d_t)):
            eye = torch.eye(size, dtype=w.dtype, device=w.device)
            state[f"layers.{i}.attention.{name}"] = eye.expand(*lead, size, size).clone()
    model.load_state_dict(state)
    return model.to(next(dense_model.parameters()).device).train(dense_model.training)

"""The 4-tensor attention predictor (sections 2-5 of the 4-tensor paper).

A window of T sentences of N token ids is lifted into a rank-4 activation per example: token slot x,
sentence t, semantic fiber n (width d_x) and temporal-context fiber q (width d_t). The stored layout is
(B, N, T, d_x, d_t); wherever the two fibers are flattened, the flat index is phi(n, q) = n * d_t + q.

Axis names used in the shape comments:
    B batch, T sentences in the window, N token slots per sentence, V vocabulary,
    d_x semantic fiber, d_t temporal-context fiber, d = d_x * d_t, H heads.

Layout: `four_tensor_config` (FourTensorConfig), `four_tensor_layers` (input construction, attention, layer),
`copy_path` (the opt-in pointer mixture), `four_tensor_generation` (decoding a state, rollout, explanations),
this module (the model: encoding, readout, loss).
"""

from __future__ import annotations

import torch
from torch import nn

from world_model.models.checkpoint import PretrainedMixin
from world_model.models.copy_path import CopyPath
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.four_tensor_generation import FourTensorGeneration
from world_model.models.four_tensor_layers import FourTensorLayer, InputConstruction
from world_model.models.inputs import check_example, check_window
from world_model.models.kernels import linear_cross_entropy, linear_mixture_cross_entropy
from world_model.models.step_stats import StepStats


def scored_order(earlier: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Flat (b, n, t) positions of the scored slots, those of S(1..T-1) first, then those of S(T): earlier and
    final (B, N, T) boolean -> (K,) int64, each group in row-major order (as boolean indexing orders them)."""
    return torch.cat([earlier.reshape(-1).nonzero()[:, 0], final.reshape(-1).nonzero()[:, 0]])


class FourTensorModel(PretrainedMixin, FourTensorGeneration, nn.Module):
    """The 4-tensor predictor: token windows (B, T, N) -> logits (B, N, T, V) for S(1..T)."""

    config_class = FourTensorConfig
    # What a readout or a scorer may ask of this model (world_model.generation.readouts):
    scores_slots = True  # per-slot log-probabilities of the next state (`slice_logits`, `last_slice_logits`)
    scores_sentences = False  # no teacher-forced likelihood of whole sentences (`score_sentences`)
    explains = True  # rollouts record `StepExplanation`s

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

    def attention_modules(self) -> list[nn.Module]:
        """The self-attention module of every layer."""
        return [layer.attention for layer in self.layers]

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

    def _encode(self, token_ids: torch.Tensor, last_slice_only: bool = False) -> torch.Tensor:
        """`encode` for ids the caller has already checked (the training step checks the whole example). With
        `last_slice_only` the last layer answers only the queries of the last sentence slot: -> (B, N, 1, d),
        the same rows as encode(...)[:, :, -1:], with the last layer's other queries and MLP rows never computed."""
        pad_mask = self.build_pad_mask(token_ids)  # local to this call, shared by every layer
        X = self.input_construction(token_ids)  # (B, N, T, d_x, d_t)
        B, N, T = X.shape[:3]
        X = X.reshape(B, N, T, self.config.d)
        for i, layer in enumerate(self.layers):
            X = layer(X, pad_mask, last_slice_only and i == len(self.layers) - 1)
        return self.final_norm(X)

    def readout_matrix(self) -> torch.Tensor:
        """Tied rank-1 readout M (d, V): M[n * d_t + q, v] = E_sem[v, n] * W'[q, v] (with autograd the transpose
        of a contiguous (V, d) tensor, without it contiguous).

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
        # With autograd, M is the transpose of a contiguous (V, d) tensor: the training kernel's products run
        # fastest in that layout (its gradient is accumulated as (V, d) rows, one per word). The cached M is
        # contiguous (d, V), the layout in which the product of a few rows (the rollout's) runs fastest.
        M_T = (E_sem[:, :, None] * self.W_prime.T[:, None, :]).view(self.config.vocab_size, self.config.d)
        M = M_T.T.contiguous() if cacheable else M_T.T  # (d_x d_t, V)
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
        if self.pointer is not None:  # the copy path points at the final states of every slot
            X = self.encode(token_ids)
            return self.slice_logits(X, token_ids.long(), X.shape[2] - 1)
        self.check_token_ids(token_ids)
        return self._encode(token_ids.long(), last_slice_only=True)[:, :, 0] @ self.readout_matrix()

    def slice_logits(self, X: torch.Tensor, token_ids: torch.Tensor, t: int) -> torch.Tensor:
        """Logits of slice t, which predict sentence t + 1: X (B, N, T, d), token_ids (B, T, N) -> (B, N, V)."""
        logits = X[:, :, t] @ self.readout_matrix()
        if self.pointer is None:
            return logits
        N, T = X.shape[1], X.shape[2]
        rows = torch.arange(N, device=X.device) * T + t  # flat positions (x, t)
        log_gate, log_keep, pointer, key_ids = self.pointer(X, token_ids)
        return CopyPath.mix(logits, log_gate[:, rows], log_keep[:, rows], pointer[:, rows], key_ids)

    def training_step(
        self, token_ids_full: torch.Tensor, label_smoothing: float = 0.0, smoothing_prior: torch.Tensor | None = None
    ) -> StepStats:
        """A stored window (B, T+1, N) -> the window loss on S(1..T) and statistics on S(T).

        The readout runs only on slots whose target is not padding, fused with the cross-entropy; the
        result equals the ignore-index cross-entropy of the full logits (B, N, T, V) against Y permuted
        from (B, T, N) to (B, N, T) (tests/test_four_tensor.py proves it). A `label_smoothing` e > 0 (not in
        the paper; training.label_smoothing) makes `loss` the cross-entropy against (1 - e) gold + e q, q uniform
        over the vocabulary, or smoothing_prior[n] (N, V) at token slot n (training.label_smoothing_prior
        "counts"); the statistics stay the plain cross-entropy. Not with the copy path.
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
        order = scored_order(earlier, final)  # (K,) flat (b, n, t) positions of the scored slots
        target = Y.reshape(-1)[order]  # (K,)
        n_earlier = len(order) - int(final.sum())
        rows = X.reshape(-1, c.d)[order]  # (K, d)
        if self.pointer is None:
            # The argmax of S(T) (last_correct) only in eval mode: the training loop reads only the loss sums.
            argmax_from = len(order) if self.training else n_earlier
            ce_sum, ce, argmax = linear_cross_entropy(rows, self.readout_matrix(), target, argmax_from=argmax_from)
        else:
            ce_sum, ce, argmax = self.copy_path_loss(X, token_ids_full[:, :-1], Y, order, final, rows, target)
        window_tokens = live.sum()
        loss_sum = ce_sum
        if label_smoothing > 0:
            if self.pointer is not None:
                raise ValueError("label smoothing is not defined for the copy path's mixture")
            slot = torch.arange(c.n_tokens, device=live.device)[None, :, None].expand_as(live)  # (B, N, T)
            slots = slot.reshape(-1)[order]  # (K,) token slot n of each row
            loss_sum = ce_sum + label_smoothing * self.smoothing_margin(rows, target, slots, smoothing_prior)
        return StepStats(
            loss=loss_sum / window_tokens.clamp(min=1),
            window_ce_sum=ce_sum.detach(),
            window_tokens=window_tokens,
            last_ce_sum=ce[n_earlier:].sum(),
            last_correct=(argmax == target[len(target) - len(argmax) :]).sum(),
            last_tokens=final.sum(),
        )

    def smoothing_margin(
        self, rows: torch.Tensor, target: torch.Tensor, slots: torch.Tensor, prior: torch.Tensor | None
    ) -> torch.Tensor:
        """sum_k z_k[target_k] - q_k . z_k for the logits z = rows @ M of the K scored rows (rows (K, d), target and
        slots (K,)), q_k uniform without a `prior`, else prior[slots_k] (`prior` (N, V)). Label smoothing's loss is
        the fused cross-entropy plus e times this: (1 - e)(lse - z_t) + e (lse - q . z) = (lse - z_t) + e (z_t - q . z),
        so the kernel's own cross-entropy carries the logsumexp and no (K, V) tensor is formed."""
        M = self.readout_matrix()  # (d, V)
        if prior is None:
            toward = M.mean(-1)[None, :]  # (1, d): q . z = rows . mean of M's columns
        else:
            toward = (M @ prior.T.to(M.dtype)).T[slots]  # (N, d) -> (K, d): rows . (M q_n)
        return (rows * (M.T[target] - toward)).sum()

    def copy_path_loss(self, X, token_ids, Y, order, final, rows, target):
        """`training_step`'s loss with the copy path: -log p(target) of the mixture for the K scored rows.

        X (B, N, T, d), token_ids (B, T, N) the input window, Y (B, N, T) targets, order (K,) the flat (b, n, t)
        positions of the scored slots (`scored_order`), final (B, N, T) those of S(T), rows (K, d) and target (K,)
        ordered as `order` -> (ce_sum, ce (K,), argmax of the final rows' mixture, or -1 in training mode). The
        mixture's loss runs through a chunked kernel (no (K, V) logits)."""
        B, N, T = Y.shape
        log_gate, log_keep, pointer, key_ids = self.pointer(X, token_ids)
        log_copy = CopyPath.target_log_prob(pointer, key_ids, Y.reshape(B, N * T))

        def pick(a: torch.Tensor) -> torch.Tensor:  # (B, NT) -> (K,) in the order of `rows`
            return a.reshape(-1)[order]

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

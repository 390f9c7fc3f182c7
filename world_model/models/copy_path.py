"""The opt-in learned copy path of the 4-tensor predictor (copy_path=True): a pointer mixture over the
window's earlier tokens. Axis names as in `world_model.models.four_tensor`; NT = N * T flat positions x * T + t.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from world_model.models.four_tensor_config import FourTensorConfig


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

"""Fused kernels that compute the same function as the plain PyTorch expression they replace."""
from __future__ import annotations

import torch


class LinearCrossEntropy(torch.autograd.Function):
    """Cross-entropy of the logits X @ M against integer targets, in row chunks, without a (K, V) tensor.

    Equals `F.cross_entropy(X @ M, target, reduction="sum")` in value and gradient: the loss of a row is
    minus the log-softmax at its target, as in F.cross_entropy. The gradient is formed chunk by chunk
    during the forward pass (the exponentiated log-softmax minus the target's indicator, times X or M),
    so no (K, V) tensor is kept and the backward pass only scales two stored products.
    """

    @staticmethod
    def forward(ctx, X: torch.Tensor, M: torch.Tensor, target: torch.Tensor, chunk: int, argmax_from: int):
        # X (K, d) rows to score, M (d, V) readout matrix, target (K,) integer ids.
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        ce = X.new_empty(X.shape[0])  # (K,) per-row cross-entropy
        argmax = torch.empty_like(target[argmax_from:])  # predicted ids of rows argmax_from..K-1
        grad_X = torch.empty_like(X) if needs_grad else None
        grad_M = torch.zeros_like(M) if needs_grad else None
        for start in range(0, X.shape[0], chunk):
            rows = slice(start, start + chunk)
            x, y = X[rows], target[rows]
            log_p = torch.log_softmax(x @ M, dim=-1)  # (chunk, V) log-probabilities
            if start + chunk > argmax_from:
                first = max(argmax_from - start, 0)
                argmax[start + first - argmax_from : start + chunk - argmax_from] = log_p[first:].argmax(dim=-1)
            ce[rows] = -log_p.gather(1, y[:, None])[:, 0]
            if needs_grad:
                grad_logits = log_p.exp_()  # softmax, in place
                grad_logits[torch.arange(grad_logits.shape[0], device=X.device), y] -= 1.0  # d ce / d logits
                torch.mm(grad_logits, M.T, out=grad_X[rows])
                grad_M.addmm_(x.T, grad_logits)
        ctx.save_for_backward(grad_X, grad_M)
        ctx.mark_non_differentiable(ce, argmax)
        return ce.sum(), ce, argmax

    @staticmethod
    def backward(ctx, grad_sum, _grad_ce, _grad_argmax):
        grad_X, grad_M = ctx.saved_tensors
        return grad_X * grad_sum, grad_M * grad_sum, None, None, None


def linear_cross_entropy(
    X: torch.Tensor, M: torch.Tensor, target: torch.Tensor, chunk: int | None = None, argmax_from: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of X @ M against `target`: X (K, d), M (d, V), target (K,).

    Returns (ce_sum (), differentiable; ce (K,) per row; argmax (K - argmax_from,) of the rows from
    `argmax_from` on, the only ones whose prediction the caller needs); the last two carry no gradient.
    `chunk` rows are scored at a time (default 128 on CPU, 2048 on accelerators).
    """
    if chunk is None:
        chunk = 128 if X.device.type == "cpu" else 2048
    return LinearCrossEntropy.apply(X, M, target, chunk, argmax_from)

"""Fused kernels that compute the same function as the plain PyTorch expression they replace.

Both kernels score rows of X against a readout matrix M (d, V) chunk by chunk, so that no (K, V) tensor
of logits outlives its chunk. Every chunk's logits are written into one (chunk, V) block allocated once per
call, and the block is turned into the log-softmax, the softmax and the gradient of the logits in place, so
a chunk makes one product and a few in-place passes over the block and allocates nothing of size V.
Under autocast (bf16 mixed precision) the three matrix products of a chunk run in the autocast dtype, while
the log-softmax, the returned values and the gradients of fp32 inputs stay in fp32 (fp32 loss accumulation,
fp32 master weights).
"""

from __future__ import annotations

import torch


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast would run matrix products in on `device`, or None when autocast is off there."""
    kind = device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def logits_into(block: torch.Tensor, x: torch.Tensor, M: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """block (R, V) = x @ M for x (R, d), M (d, V): written in place; with `dtype` the product runs in it (M is
    already in it) and is rounded into the fp32 block."""
    if dtype is None:
        return torch.mm(x, M, out=block)
    return block.copy_(x.to(dtype) @ M)


def log_softmax_(block: torch.Tensor) -> torch.Tensor:
    """The row-wise log-softmax of block (R, V), written over it (the kernel of torch.log_softmax)."""
    return torch.ops.aten._log_softmax.out(block, 1, False, out=block)


def accumulate_grads(
    x: torch.Tensor,
    M: torch.Tensor,
    grad_logits: torch.Tensor,
    grad_x: torch.Tensor,
    grad_M: torch.Tensor,
    first: bool,
    dtype: torch.dtype | None,
) -> None:
    """grad_x = grad_logits @ M.T (written) and grad_M (+)= x.T @ grad_logits: written on the `first` chunk,
    added to after it (so grad_M needs no zero fill); products in `dtype` when given (M is already in it)."""
    if dtype is None:
        torch.mm(grad_logits, M.T, out=grad_x)
        if first:
            torch.mm(x.T, grad_logits, out=grad_M)
        else:
            grad_M.addmm_(x.T, grad_logits)
        return
    g = grad_logits.to(dtype)
    grad_x.copy_(g @ M.T)
    product = x.to(dtype).T @ g
    if first:
        grad_M.copy_(product)
    else:
        grad_M += product


def subtract_at(block: torch.Tensor, target: torch.Tensor, amount: torch.Tensor | float) -> None:
    """block[r, target[r]] -= amount (a number, or one (R,) value per row), in place: block (R, V), target (R,)."""
    if not isinstance(amount, torch.Tensor):
        amount = block.new_full(target.shape, amount)
    block.scatter_add_(1, target[:, None], -amount[:, None].to(block.dtype))


def readout_block(X: torch.Tensor, M: torch.Tensor, chunk: int, acc: torch.dtype) -> torch.Tensor:
    """The (min(chunk, K), V) block every chunk's logits are written into, in the accumulation dtype `acc`."""
    return X.new_empty(min(chunk, X.shape[0]), M.shape[1], dtype=acc)


class LinearCrossEntropy(torch.autograd.Function):
    """Cross-entropy of the logits X @ M against integer targets, in row chunks, without a (K, V) tensor.

    Equals `F.cross_entropy(X @ M, target, reduction="sum")` in value and gradient: the loss of a row is
    minus the log-softmax at its target, as in F.cross_entropy. The gradient is formed chunk by chunk
    during the forward pass (the exponentiated log-softmax minus the target's indicator, times X or M),
    so no (K, V) tensor is kept and the backward pass only scales two stored products. Per chunk: one
    product into the block, the log-softmax over it in place, the target's entries, the argmax only for
    rows from `argmax_from` on, then exp in place, minus 1 at the targets, and the two gradient products.
    """

    @staticmethod
    def forward(
        ctx,
        X: torch.Tensor,
        M: torch.Tensor,
        target: torch.Tensor,
        chunk: int,
        argmax_from: int,
        dtype: torch.dtype | None,
    ):
        # X (K, d) rows to score, M (d, V) readout matrix, target (K,) integer ids.
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        acc = X.dtype if dtype is None else torch.float32  # dtype of the log-softmax, the loss and grad_M
        ce = X.new_empty(X.shape[0], dtype=acc)  # (K,) per-row cross-entropy
        argmax = torch.empty_like(target[argmax_from:])  # predicted ids of rows argmax_from..K-1
        grad_X = torch.empty_like(X) if needs_grad else None
        grad_M = torch.empty_like(M, dtype=acc) if needs_grad else None  # M's strides: products write it directly
        Mc = M if dtype is None else M.to(dtype)  # converted once, not per chunk
        block = readout_block(X, M, chunk, acc)
        with torch.autocast(X.device.type, enabled=False):
            for start in range(0, X.shape[0], chunk):
                rows = slice(start, start + chunk)
                x, y = X[rows], target[rows]
                log_p = log_softmax_(logits_into(block[: len(x)], x, Mc, dtype))  # (chunk, V) fp32
                if start + len(x) > argmax_from:
                    first = max(argmax_from - start, 0)
                    argmax[start + first - argmax_from : start + len(x) - argmax_from] = log_p[first:].argmax(dim=-1)
                ce[rows] = log_p.gather(1, y[:, None])[:, 0].neg_()
                if needs_grad:
                    grad_logits = log_p.exp_()  # softmax, in place
                    subtract_at(grad_logits, y, 1.0)  # d ce / d logits
                    accumulate_grads(x, Mc, grad_logits, grad_X[rows], grad_M, start == 0, dtype)
        if needs_grad and X.shape[0] == 0:
            grad_M.zero_()
        ctx.save_for_backward(grad_X, grad_M.to(M.dtype) if needs_grad else None)
        ctx.mark_non_differentiable(ce, argmax)
        return ce.sum(), ce, argmax

    @staticmethod
    def backward(ctx, grad_sum, _grad_ce, _grad_argmax):
        grad_X, grad_M = ctx.saved_tensors
        return grad_X * grad_sum.to(grad_X.dtype), grad_M * grad_sum, None, None, None, None


class LinearMixtureCrossEntropy(torch.autograd.Function):
    """Cross-entropy of a two-part mixture whose first part is softmax(X @ M), in row chunks, without a (K, V) tensor:

        ce[k] = -log( exp(a[k]) softmax(X[k] M)[target[k]] + exp(b[k]) )

    with a[k] the log-weight of the softmax part and b[k] the log-probability the other part gives the target
    (the copy path: log(1 - g) and log g + log pointer mass). As in LinearCrossEntropy, the gradients of the
    summed loss are formed chunk by chunk in the forward pass, each row's softmax gradient weighted by its
    posterior r = exp(a + log_softmax[target] + ce); d ce / d a = -r and d ce / d b = -exp(b + ce) = -(1 - r).
    """

    @staticmethod
    def forward(ctx, X, M, target, a, b, chunk: int, dtype: torch.dtype | None):
        # X (K, d), M (d, V), target (K,), a and b (K,) log-weights.
        needs_grad = any(ctx.needs_input_grad[:2])
        acc = X.dtype if dtype is None else torch.float32
        ce = X.new_empty(X.shape[0], dtype=acc)
        grad_X = torch.empty_like(X) if needs_grad else None
        grad_M = torch.empty_like(M, dtype=acc) if needs_grad else None  # M's strides: products write it directly
        Mc = M if dtype is None else M.to(dtype)
        a, b = a.to(acc), b.to(acc)
        block = readout_block(X, M, chunk, acc)
        with torch.autocast(X.device.type, enabled=False):
            for start in range(0, X.shape[0], chunk):
                rows = slice(start, start + chunk)
                x, y = X[rows], target[rows]
                log_p = log_softmax_(logits_into(block[: len(x)], x, Mc, dtype))  # (chunk, V)
                vocab = a[rows] + log_p.gather(1, y[:, None])[:, 0]
                ce[rows] = -torch.logaddexp(vocab, b[rows])
                if needs_grad:
                    r = (vocab + ce[rows]).exp()  # posterior of the softmax part
                    grad_logits = log_p.exp_().mul_(r[:, None])  # r * softmax, in place
                    subtract_at(grad_logits, y, r)  # d ce / d logits
                    accumulate_grads(x, Mc, grad_logits, grad_X[rows], grad_M, start == 0, dtype)
        if needs_grad and X.shape[0] == 0:
            grad_M.zero_()
        ctx.save_for_backward(grad_X, grad_M.to(M.dtype) if needs_grad else None, a, b, ce)
        ctx.mark_non_differentiable(ce)
        return ce.sum(), ce

    @staticmethod
    def backward(ctx, grad_sum, _grad_ce):
        grad_X, grad_M, a, b, ce = ctx.saved_tensors
        copy_posterior = (b + ce).exp()  # the other part's posterior, 1 - r
        grad_a = -(1.0 - copy_posterior) * grad_sum
        grad_b = -copy_posterior * grad_sum
        gX = grad_X * grad_sum.to(grad_X.dtype) if grad_X is not None else None
        gM = grad_M * grad_sum if grad_M is not None else None
        return gX, gM, None, grad_a, grad_b, None, None


def default_chunk(X: torch.Tensor, dtype: torch.dtype | None) -> int:
    """Rows scored at a time: 256 on CPU (a (256, V) fp32 block fits a server CPU's last-level cache for V up to
    about 30,000 words, and fewer chunks mean fewer read-modify-write passes over grad_M), 2048 on accelerators."""
    return 256 if X.device.type == "cpu" else 2048


def linear_cross_entropy(
    X: torch.Tensor, M: torch.Tensor, target: torch.Tensor, chunk: int | None = None, argmax_from: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of X @ M against `target`: X (K, d), M (d, V), target (K,).

    Returns (ce_sum (), differentiable; ce (K,) per row; argmax (K - argmax_from,) of the rows from
    `argmax_from` on, the only ones whose prediction the caller needs: argmax_from = K computes none);
    the last two carry no gradient. Under autocast the products run in the autocast dtype; the returned
    values are fp32.
    """
    dtype = autocast_dtype(X.device)
    return LinearCrossEntropy.apply(X, M, target, chunk or default_chunk(X, dtype), argmax_from, dtype)


def linear_mixture_cross_entropy(
    X: torch.Tensor, M: torch.Tensor, target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of the mixture exp(a) softmax(X @ M) + exp(b) at `target` (see LinearMixtureCrossEntropy):
    X (K, d), M (d, V), target, a, b (K,) -> (ce_sum (), differentiable in X, M, a and b; ce (K,), no gradient)."""
    dtype = autocast_dtype(X.device)
    return LinearMixtureCrossEntropy.apply(X, M, target, a, b, chunk or default_chunk(X, dtype), dtype)

"""The twelve faithfulness checks of section 4.8 of the 4-tensor paper, one test each, plus the extras
the predictor issue asks for (float64 gradient check, tied readout == dense W_out, all-padding window)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.four_tensor_layers import sinusoidal_embedding

V = 23


def make_model(**overrides) -> FourTensorModel:
    torch.manual_seed(0)
    settings = dict(vocab_size=V, d_x=4, d_t=3, n_heads=2, n_layers=2, n_tokens=5, n_states=4, dropout=0.0)
    settings.update(overrides)
    return FourTensorModel(FourTensorConfig(**settings)).eval()


def make_window(B=2, T=4, N=5, seed=1) -> torch.Tensor:
    """(B, T, N) ids with a ragged padding tail per sentence."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, T, N), generator=g)
    lengths = torch.randint(1, N + 1, (B, T), generator=g)
    ids[torch.arange(N)[None, None, :] >= lengths[..., None]] = 0
    return ids


class OpRecorder(TorchDispatchMode):
    """Records (op name, output shapes) of every aten op run inside the block."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.calls.append(
            (str(func.overloadpacket.__name__), [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)])
        )
        return out


def manual_input(model: FourTensorModel, ids: torch.Tensor) -> torch.Tensor:
    """Section 4.3 written out slot by slot: X[b, x, t, n, q]."""
    ic = model.input_construction
    B, T, N = ids.shape
    c = model.config
    X = torch.empty(B, N, T, c.d_x, c.d_t)
    for b in range(B):
        for x in range(N):
            for t in range(T):
                v = ids[b, t, x]
                for n in range(c.d_x):
                    for q in range(c.d_t):
                        X[b, x, t, n, q] = (
                            ic.E_sem.weight[v, n] * ic.E_temp.weight[v, q]
                            + sinusoidal_embedding(torch.tensor(float(x)), c.d_x)[n]
                            + sinusoidal_embedding(torch.tensor(float(x + t)), c.d_t)[q]
                        )
    return X


@torch.no_grad()
def test_check01_activation_layout_is_B_N_T_dx_dt():
    # T == d_x, so the wrong layout (B, N, d_x, T, d_t) would have the same shape; the values tell them apart.
    model = make_model(d_x=4, n_states=4)
    ids = make_window()
    X = model.input_construction(ids)
    assert X.shape == (2, 5, 4, 4, 3)
    torch.testing.assert_close(X, manual_input(model, ids))
    assert not torch.allclose(X, X.transpose(2, 3))


@torch.no_grad()
def test_check02_flat_index_phi_is_n_dt_plus_q_everywhere():
    model = make_model(d_x=4, d_t=3)  # d_x != d_t: a swapped (d_t, d_x) fiber has the same product 12
    c = model.config
    ids = make_window()
    X5 = model.input_construction(ids)  # (B, N, T, d_x, d_t)
    X_flat = X5.reshape(*X5.shape[:3], c.d)
    # Weight view: Q[b,x,t,m,p] = sum_{n,q} W[m,p,n,q] X[b,x,t,n,q] equals the flat matmul of the kernel.
    attn = model.layers[0].attention
    W = attn.w_qkv[0, 1]  # (m, p, n, q) of Q, head 1
    q_rank4 = torch.einsum("mpnq,bxtnq->bxtmp", W, X5).reshape(2, -1, c.d)
    q_kernel = attn.qkv(X_flat.reshape(2, -1, c.d))[0][:, 1]
    torch.testing.assert_close(q_kernel, q_rank4)
    # Readout: M[n * d_t + q, v] = E_sem[v, n] * W'[q, v].
    M = model.readout_matrix()
    E = model.input_construction.E_sem.weight
    for n in range(c.d_x):
        for q in range(c.d_t):
            torch.testing.assert_close(M[n * c.d_t + q], E[:, n] * model.W_prime[q])
    # LayerNorm (final_norm, per-branch norms) acts on the same flat fiber: the fibers of one slot, in phi order.
    manual = F.layer_norm(
        X5.reshape(*X5.shape[:3], c.d_x * c.d_t), (c.d,), model.final_norm.weight, model.final_norm.bias
    )
    torch.testing.assert_close(model.final_norm(X_flat), manual)
    swapped = X5.transpose(-1, -2).reshape(*X5.shape[:3], c.d)  # the (d_t, d_x) flattening
    assert not torch.allclose(q_kernel, attn.qkv(swapped.reshape(2, -1, c.d))[0][:, 1])


@torch.no_grad()
def test_check03_P_broadcasts_over_t_q_and_Temb_over_n():
    model = make_model(d_x=3, d_t=3, n_states=4)
    ic = model.input_construction
    ic.E_sem.weight.zero_()  # isolate the positional part: X = P[x, n] + Temb[x, t, q]
    X = ic(make_window())
    P, Temb = ic.P, ic.Temb  # (N, d_x), (N, T, d_t)
    torch.testing.assert_close(X[0], (P[:, None, :, None] + Temb[:, :, None, :]).expand(-1, 4, 3, 3))
    # Column independence and the joint phase: Temb[x, t] != Temb[x', t]; Temb[x, t] == Temb[x-1, t+1].
    assert not torch.allclose(Temb[1, 0], Temb[2, 0])
    torch.testing.assert_close(Temb[2, 1], Temb[1, 2])
    # d_x == d_t makes the interchanged broadcasts shape-compatible; they compute something else.
    swapped = P[:, None, None, :] + Temb[:, :, :, None]
    assert not torch.allclose(X[0], swapped)
    shared_phase = X[0, 2, 1] - X[0, 1, 2]  # same x + t, different x: differ only through P
    torch.testing.assert_close(shared_phase, (P[2] - P[1])[:, None].expand(-1, 3))


@torch.no_grad()
def test_check04_pad_mask_comes_from_ids_not_from_activations():
    model = make_model()
    ids = make_window()
    mask = model.build_pad_mask(ids)
    torch.testing.assert_close(mask, (ids == 0).permute(0, 2, 1))
    X = model.input_construction(ids)
    assert (X[mask].flatten(1).norm(dim=-1) > 0).all(), "padding slots carry P + Temb, not zeros"
    # Perturbing the activations at padding slots leaves the attention output at every live query unchanged.
    attn = model.layers[0].attention
    X_flat = X.reshape(*X.shape[:3], -1)
    noisy = X_flat.clone()
    noisy[mask] += torch.randn_like(noisy[mask])
    live = ~mask
    torch.testing.assert_close(attn(X_flat, mask)[live], attn(noisy, mask)[live])
    no_mask = torch.zeros_like(mask)  # a mask inferred from nothing lets the padding slots leak in
    assert not torch.allclose(attn(X_flat, no_mask)[live], attn(noisy, no_mask)[live])


@torch.no_grad()
def test_check05_key_scores_of_padding_get_the_finite_minimum_queries_unmasked():
    model = make_model(attention="reference")
    ids = make_window()
    X = model.input_construction(ids).flatten(3)
    mask = model.build_pad_mask(ids)
    attn = model.layers[0].attention
    A = attn.attention_weights(X, mask)  # (B, H, N, T, N, T)
    assert torch.all(A[..., mask[0]][0] == 0), "no weight on padding keys"
    torch.testing.assert_close(A.sum(dim=(-1, -2)), torch.ones(A.shape[:4]))
    # Query slots are unmasked: a padding query still attends over the live keys.
    pad_query = mask[0].nonzero()[0]
    assert A[0, :, pad_query[0], pad_query[1]].sum() > 0
    # The fill is finite: with every key padding the weights are uniform, not NaN.
    all_pad = torch.ones_like(mask)
    A_all = attn.attention_weights(X, all_pad)
    torch.testing.assert_close(A_all, torch.full_like(A_all, 1.0 / (5 * 4)))
    # The MLP receives no mask: at a padding slot the layer still changes the stream.
    layer = model.layers[0]
    out = layer(X, mask)
    assert not torch.allclose(out[mask], X[mask] + attn(layer.ln_attn(X), mask)[mask])


def test_check06_pad_mask_is_local_to_a_call_and_shared_by_its_layers():
    model = make_model(n_layers=3)
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda mod, args: seen.append(args[1])) for layer in model.layers]
    a, b = make_window(seed=1), make_window(seed=2)
    with torch.no_grad():
        out_b_after_a = (model(a), model(b))[1]
    for h in hooks:
        h.remove()
    assert seen[0] is seen[1] is seen[2], "one mask object for every layer of a call"
    assert seen[3] is not seen[0] and torch.equal(seen[3], model.build_pad_mask(b))
    with torch.no_grad():
        torch.testing.assert_close(out_b_after_a, make_model(n_layers=3)(b))


@torch.no_grad()
def test_check07_full_fiber_heads_summed_without_rescaling():
    model = make_model(n_heads=3, attention="reference")
    ids = make_window()
    X = model.input_construction(ids).flatten(3)
    mask = model.build_pad_mask(ids)
    attn = model.layers[0].attention
    B, N, T, d = X.shape
    total = torch.zeros_like(X)
    for h in range(3):
        Wq, Wk, Wv = (attn.w_qkv[i, h].reshape(d, d) for i in range(3))  # each a full (d_x d_t)^2 map
        q, k, v = X.reshape(B, -1, d) @ Wq.T, X.reshape(B, -1, d) @ Wk.T, X.reshape(B, -1, d) @ Wv.T
        s = (q @ k.transpose(1, 2)) / math.sqrt(d)
        s = s.masked_fill(mask.reshape(B, 1, -1), torch.finfo(s.dtype).min)
        total += (s.softmax(-1) @ v).view(B, N, T, d)
    torch.testing.assert_close(attn(X, mask), total)
    assert not torch.allclose(attn(X, mask), total / math.sqrt(3))


@torch.no_grad()
def test_check08_pre_ln_on_each_branch_and_final_norm_on_the_raw_stream():
    model = make_model(n_layers=2)
    ids = make_window()
    mask = model.build_pad_mask(ids)
    X = model.input_construction(ids).flatten(3)
    for layer in model.layers:
        X = X + layer.attention(layer.ln_attn(X), mask)  # the addend is the unnormalised stream
        X = X + layer.fc2(F.gelu(layer.fc1(layer.ln_mlp(X))))
    expected = model.final_norm(X) @ model.readout_matrix()
    torch.testing.assert_close(model(ids), expected)
    # Without the final norm the logits differ: the raw stream is not already normalised.
    assert not torch.allclose(X @ model.readout_matrix(), expected)


def test_check09_one_dropout_rate_on_the_two_residual_branches_only():
    model = make_model(dropout=1.0).train()  # every branch output dropped
    ids = make_window()
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(drops) == model.config.n_layers and all(d.p == 1.0 for d in drops)
    with torch.no_grad():
        X = model.input_construction(ids).flatten(3)  # no dropout on the input or the residual stream
        torch.testing.assert_close(model(ids), model.final_norm(X) @ model.readout_matrix())
        model.eval()
        assert not torch.allclose(model(ids), model.final_norm(X) @ model.readout_matrix())


def test_check10_readout_matrix_is_materialised_before_the_product():
    model = make_model()
    ids = make_window()
    c = model.config
    rec = OpRecorder()
    with torch.no_grad(), rec:
        logits = model(ids)
    shapes = [s for _, outs in rec.calls for s in outs]
    assert (c.d, V) in shapes or (c.d_x, c.d_t, V) in shapes, "M (d, V) is formed"
    rows = 2 * 5 * 4
    assert not any(len(s) >= 2 and s[-2:] == (c.d_t, V) and math.prod(s[:-2]) == rows for s in shapes), (
        "no (B N T, d_t, V) intermediate"
    )
    X = model.encode(ids)
    torch.testing.assert_close(logits, X @ model.readout_matrix())


def test_check11_loss_permutes_targets_and_ignores_padding():
    model = make_model(n_tokens=5, n_states=4)  # N != T: a missing permute cannot line up
    full = torch.cat([make_window(seed=3), make_window(seed=4)[:, :1]], dim=1)  # (B, T+1, N)
    stats = model.training_step(full)
    with torch.no_grad():
        logits = model(full[:, :-1])  # (B, N, T, V)
    total, count = 0.0, 0
    for b in range(2):
        for t in range(4):
            for x in range(5):
                y = int(full[b, t + 1, x])
                if y != 0:
                    total -= float(torch.log_softmax(logits[b, x, t], -1)[y])
                    count += 1
    assert int(stats.window_tokens) == count == int((full[:, 1:] != 0).sum())
    assert math.isclose(stats.loss.item(), total / count, rel_tol=1e-5)
    # The key mask stays on in the forward pass that the loss reads: changing padding ids changes nothing.
    relabelled = full.clone()
    assert torch.equal(model.build_pad_mask(relabelled[:, :-1]), (full[:, :-1] == 0).permute(0, 2, 1))


def test_check12_training_scores_logits_against_integer_targets():
    model = make_model()
    full = torch.cat([make_window(seed=5), make_window(seed=6)[:, :1]], dim=1)
    rec = OpRecorder()
    with rec:
        stats = model.training_step(full)
        stats.loss.backward()
    names = [name for name, _ in rec.calls]
    vocab_softmax = [outs for name, outs in rec.calls if name in ("_softmax", "softmax") and outs and outs[0][-1] == V]
    assert not vocab_softmax, "no softmax over the vocabulary in the training step"
    assert "one_hot" not in names and "scatter" not in names
    assert "_log_softmax" in names and "gather" in names, "minus the log-softmax at the target index"
    with torch.no_grad():
        logits = model(full[:, :-1])
    expected = F.cross_entropy(logits.reshape(-1, V), full[:, 1:].permute(0, 2, 1).reshape(-1), ignore_index=0)
    torch.testing.assert_close(stats.loss.detach(), expected)


def test_float64_gradient_check_on_a_tiny_configuration():
    model = make_model(d_x=2, d_t=2, n_heads=2, n_layers=1, n_tokens=3, n_states=2, attention="reference").double()
    ids = torch.tensor([[[3, 4, 0], [5, 0, 0], [6, 7, 8]]])
    params = [model.layers[0].attention.w_qkv, model.W_prime, model.input_construction.E_temp.weight]

    def loss_of(w_qkv, w_prime, e_temp):
        with torch.nn.utils.stateless._reparametrize_module(
            model, {"layers.0.attention.w_qkv": w_qkv, "W_prime": w_prime, "input_construction.E_temp.weight": e_temp}
        ):
            return model.training_step(ids).loss

    assert torch.autograd.gradcheck(loss_of, [p.detach().clone().requires_grad_() for p in params])


@torch.no_grad()
def test_tied_readout_equals_the_dense_W_out_contraction():
    model = make_model()
    c = model.config
    E, Wp = model.input_construction.E_sem.weight, model.W_prime
    W_out = torch.zeros(c.d_x, c.d_t, V)
    for n in range(c.d_x):
        for q in range(c.d_t):
            for v in range(V):
                W_out[n, q, v] = E[v, n] * Wp[q, v]
    X = model.encode(make_window()).unflatten(-1, (c.d_x, c.d_t))  # (B, N, T, d_x, d_t)
    torch.testing.assert_close(model(make_window()), torch.einsum("bxtnq,nqv->bxtv", X, W_out))
    assert torch.all(W_out[:, :, 0] == 0), "the padding column is fixed at zero"


@pytest.mark.parametrize("attention", ["fused", "reference"])
def test_window_of_only_padding_stays_finite(attention):
    model = make_model(attention=attention).train()
    full = torch.zeros(2, 5, 5, dtype=torch.long)
    full[1] = make_window(B=1, T=4)[0].repeat(2, 1)[:5]
    logits = model(full[:, :-1])
    assert torch.isfinite(logits).all()
    stats = model.training_step(full)
    stats.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_padding_rows_are_zero_and_receive_no_gradient():
    model = make_model().train()
    full = torch.cat([make_window(seed=7), make_window(seed=8)[:, :1]], dim=1)
    model.training_step(full).loss.backward()
    ic = model.input_construction
    for row in (0, 1):  # padding, and the unknown word
        assert torch.all(ic.E_sem.weight[row] == 0) and torch.all(ic.E_temp.weight[row] == 0)
        assert torch.all(ic.E_sem.weight.grad[row] == 0) and torch.all(ic.E_temp.weight.grad[row] == 0)
    assert ic.E_sem.weight.grad[2:].abs().sum() > 0 and model.W_prime.grad.abs().sum() > 0

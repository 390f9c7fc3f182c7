"""The opt-in variants of the 4-tensor predictor (temporal-causal mask, copy path), the cached readout
matrix and the bf16 kernels: each computes what its plain expression says."""

import pytest
import torch
import torch.nn.functional as F

from tests.test_faithfulness import V, make_model, make_window
from tests.test_four_tensor import assert_same_training_step, with_attention
from world_model.models.copy_path import CopyPath
from world_model.models.four_tensor_layers import temporal_causal_bias
from world_model.models.kernels import linear_cross_entropy, linear_mixture_cross_entropy


def full_window(seed=21, B=3):
    return torch.cat([make_window(B=B, seed=seed), make_window(B=B, seed=seed + 1)[:, :1]], dim=1)  # (B, T+1, N)


# ----- temporal-causal mask -----
@pytest.mark.parametrize("attention", ["fused", "reference"])
def test_causal_slice_ignores_later_sentences(attention):
    model = make_model(temporal_causal=True, attention=attention)
    window = make_window(seed=3)
    changed = window.clone()
    changed[:, 2:] = make_window(seed=4)[:, 2:]  # new sentences 2 and 3
    a, b = model(window), model(changed)  # (B, N, T, V)
    torch.testing.assert_close(a[:, :, :2], b[:, :, :2])  # slices 0 and 1 see only sentences 0 and 1
    assert not torch.allclose(a[:, :, 2:], b[:, :, 2:])


def test_default_model_is_not_causal():
    model = make_model()
    window = make_window(seed=3)
    changed = window.clone()
    changed[:, 3] = make_window(seed=4)[:, 3]
    assert not torch.allclose(model(window)[:, :, 0], model(changed)[:, :, 0])


def test_causal_fused_equals_reference_in_value_and_gradient():
    fused = make_model(temporal_causal=True).train()
    full = full_window()
    full[1, 0] = 0  # an empty first sentence: its queries see only padding and fall back to uniform
    assert_same_training_step(fused, with_attention(fused, "reference"), full)


def test_causal_bias_opens_earlier_live_keys_and_falls_back_to_visible_ones():
    pad = torch.zeros(1, 2, 3, dtype=torch.bool)  # (B, N, T)
    pad[0, :, 0] = True  # sentence 0 is all padding
    bias = temporal_causal_bias(pad, torch.float32)[0, 0]  # (NT, NT), flat x * T + t
    t = torch.arange(3).repeat(2)
    is_open = bias == 0
    for q in range(6):
        if t[q] == 0:  # only padding visible: uniform over the visible (t' = 0) keys
            assert is_open[q].tolist() == (t == 0).tolist()
        else:
            assert is_open[q].tolist() == ((t <= t[q]) & (t > 0)).tolist()


# ----- copy path -----
def test_copy_path_loss_is_the_mixture_cross_entropy():
    model = make_model(copy_path=True, temporal_causal=True, copy_dim=5)
    full = full_window()
    stats = model.training_step(full)
    log_p = model(full[:, :-1])  # (B, N, T, V) mixture log-probabilities
    Y = full[:, 1:].permute(0, 2, 1)
    ref = F.nll_loss(log_p.reshape(-1, V), Y.reshape(-1), ignore_index=0)
    torch.testing.assert_close(stats.loss, ref, rtol=1e-5, atol=1e-6)
    last = log_p[:, :, -1][full[:, -1] != 0]
    assert int(stats.last_correct) == int((last.argmax(-1) == full[:, -1][full[:, -1] != 0]).sum())  # eval mode
    torch.testing.assert_close(model.last_slice_logits(full[:, :-1]), log_p[:, :, -1])


def test_copy_path_gradient_matches_autograd_on_the_full_mixture():
    model = make_model(copy_path=True, copy_dim=5).double().train()
    full = full_window(B=2)
    model.training_step(full).loss.backward()
    fused = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    Y = full[:, 1:].permute(0, 2, 1)
    F.nll_loss(model(full[:, :-1]).reshape(-1, V), Y.reshape(-1), ignore_index=0).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(fused[name], p.grad, msg=name)


def test_copy_path_puts_mass_only_on_earlier_words():
    model = make_model(copy_path=True, copy_dim=5)
    window = make_window(B=1, seed=5)
    X = model.encode(window)
    log_gate, log_keep, pointer, key_ids = model.pointer(X, window)
    N, T = window.shape[2], window.shape[1]
    t = torch.arange(T).repeat(N)
    later = t[None, :] > t[:, None]  # (query, key): the key lies in a later sentence
    assert torch.all(pointer[0][later] == 0)
    assert torch.all(pointer[0][:, key_ids[0] == 0] == 0)  # never padding
    torch.testing.assert_close(
        pointer.sum(-1)[log_gate > float("-inf")], torch.ones(int((log_gate > float("-inf")).sum()))
    )
    torch.testing.assert_close(log_gate.exp() + log_keep.exp(), torch.ones_like(log_gate))


def test_copy_path_gate_can_copy_a_context_word():
    model = make_model(copy_path=True, copy_dim=5)
    with torch.no_grad():
        model.pointer.gate.bias.fill_(30.0)  # all mass on the pointer
        model.pointer.gate.weight.zero_()
    window = make_window(B=1, seed=6)
    with torch.no_grad():
        probs = model.last_slice_logits(window).exp()[0]  # (N, V)
    words = set(window[0][window[0] != 0].tolist())
    for slot in probs:
        assert abs(sum(float(slot[w]) for w in words) - 1.0) < 1e-4


def test_copy_mixture_scatters_repeated_words():
    pointer = torch.tensor([[[0.25, 0.25, 0.5]]])  # (B=1, R=1, NT=3)
    key_ids = torch.tensor([[4, 4, 6]])
    logits = torch.zeros(1, 1, 8)
    mixed = CopyPath.mix(logits, torch.tensor([[0.5]]).log(), torch.tensor([[0.5]]).log(), pointer, key_ids).exp()
    expected = torch.full((8,), 0.5 / 8)
    expected[4] += 0.25
    expected[6] += 0.25
    torch.testing.assert_close(mixed[0, 0], expected)


# ----- cached readout matrix -----
def test_readout_matrix_is_cached_without_autograd_and_invalidated_by_updates():
    model = make_model().train()
    with torch.no_grad():
        first = model.readout_matrix()
        assert model.readout_matrix() is first
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.training_step(full_window()).loss.backward()
    optimizer.step()
    with torch.no_grad():
        after_step = model.readout_matrix()
        assert after_step is not first and not torch.equal(after_step, first)
        state = {k: torch.randn_like(v) if k == "W_prime" else v for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        loaded = model.readout_matrix()
        E = model.input_construction.E_sem.weight
        torch.testing.assert_close(loaded, (E.T[:, None, :] * state["W_prime"][None]).reshape(model.config.d, V))
    assert model.readout_matrix().requires_grad  # with autograd a fresh, differentiable M


# ----- kernels in bf16 and the per-row log-probability -----
def test_mixture_cross_entropy_matches_autograd():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(37, 6, generator=g, dtype=torch.float64, requires_grad=True)
    M = torch.randn(6, 11, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (37,), generator=g)
    a = torch.randn(37, generator=g, dtype=torch.float64).sigmoid().log().requires_grad_()
    b = torch.randn(37, generator=g, dtype=torch.float64)
    b[::5] = float("-inf")  # rows without the second part
    b.requires_grad_()
    ce_sum, ce = linear_mixture_cross_entropy(X, M, target, a, b, chunk=8)
    (0.3 * ce_sum).backward()
    grads = [t.grad.clone() for t in (X, M, a, b)]
    for t in (X, M, a, b):
        t.grad = None
    vocab = a + (X @ M).log_softmax(-1).gather(1, target[:, None])[:, 0]
    ref = -torch.logaddexp(vocab, b)
    torch.testing.assert_close(ce, ref.detach())
    (0.3 * ref.sum()).backward()
    for mine, t in zip(grads, (X, M, a, b)):
        torch.testing.assert_close(mine, t.grad)


def test_bf16_cross_entropy_is_close_to_fp32_and_stays_fp32():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(300, 32, generator=g, requires_grad=True)
    M = (torch.randn(32, 500, generator=g) / 6).requires_grad_()
    target = torch.randint(0, 500, (300,), generator=g)
    ref_sum, ref_ce, _ = linear_cross_entropy(X, M, target)
    ref_sum.backward()
    gx, gm = X.grad.clone(), M.grad.clone()
    X.grad = M.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ce_sum, ce, _ = linear_cross_entropy(X, M, target)
    ce_sum.backward()
    assert ce.dtype == torch.float32 and M.grad.dtype == torch.float32
    torch.testing.assert_close(ce, ref_ce, atol=0.05, rtol=0.02)
    assert float((M.grad - gm).norm() / gm.norm()) < 0.02
    assert float((X.grad - gx).norm() / gx.norm()) < 0.02


def test_bf16_training_step_is_close_to_fp32():
    model = make_model(d_x=8, d_t=4).train()
    full = full_window()
    ref = model.training_step(full).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model.training_step(full).loss
    assert low.dtype == torch.float32
    assert abs(float(low.detach()) - float(ref.detach())) < 0.03

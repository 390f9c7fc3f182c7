"""The tucker form of the 4-tensor predictor's Q, K, V weights: W = G x_m A x_p B x_n C x_q D."""

import json
import math

import pytest
import torch

from tests.test_faithfulness import OpRecorder, make_model, make_window
from world_model.models.four_tensor import FourTensorModel, tucker_from_dense
from world_model.models.four_tensor_config import FourTensorConfig

TUCKER = ("core", "factor_m", "factor_p", "factor_n", "factor_q")


def full_window(seed=21) -> torch.Tensor:
    return torch.cat([make_window(seed=seed), make_window(seed=seed + 1)[:, :1]], dim=1)  # (B, T+1, N)


def attention_parameters(model: FourTensorModel) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if ".attention." in name)


def tucker_attention_count(c: FourTensorConfig) -> int:
    """Per layer: 3 H cores of r_m r_p r_n r_q, plus the factors once (shared) or 3 H times (per head)."""
    r_m, r_p, r_n, r_q = c.tucker_ranks
    factors = c.d_x * r_m + c.d_t * r_p + c.d_x * r_n + c.d_t * r_q
    per_layer = 3 * c.n_heads * r_m * r_p * r_n * r_q + factors * (1 if c.tucker_shared_factors else 3 * c.n_heads)
    return c.n_layers * per_layer


def mode_products(G, A, B, C, D):
    """W = G x_1 A x_2 B x_3 C x_4 D, one mode at a time with tensordot (independent of the model's einsums)."""
    W = G
    for mode, F_ in enumerate((A, B, C, D)):
        W = torch.tensordot(W, F_, dims=([mode], [1])).movedim(-1, mode)  # replace rank axis by the fiber axis
    return W


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("attention", ["fused", "reference"])
def test_full_rank_tucker_from_dense_is_the_same_model(shared, attention):
    dense = make_model(n_heads=3, attention=attention)
    tucker = tucker_from_dense(dense, shared_factors=shared)
    c = tucker.config
    assert (c.qkv_form, c.tucker_ranks, c.tucker_shared_factors) == ("tucker", (4, 3, 4, 3), shared)
    assert not hasattr(tucker.layers[0].attention, "w_qkv")
    ids, full = make_window(), full_window()
    torch.testing.assert_close(tucker(ids), dense(ids))
    torch.testing.assert_close(tucker.layers[1].attention.dense_weights(), dense.layers[1].attention.w_qkv)
    a, b = tucker.training_step(full), dense.training_step(full)
    torch.testing.assert_close(a.loss, b.loss)
    a.loss.backward()
    b.loss.backward()
    # With identity factors W == G, so dL/dG == dL/dW; every shared parameter gets the same gradient.
    for i in range(2):
        torch.testing.assert_close(
            tucker.layers[i].attention.core.grad, dense.layers[i].attention.w_qkv.grad, atol=1e-6, rtol=1e-5
        )
    dense_grads = dict(dense.named_parameters())
    for name, p in tucker.named_parameters():
        if name.split(".")[-1] not in TUCKER:
            torch.testing.assert_close(p.grad, dense_grads[name].grad, msg=name, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_low_rank_qkv_equals_the_composed_mode_products(shared):
    # d_x != d_t and four distinct ranks: a factor applied to the wrong mode cannot line up.
    model = make_model(
        d_x=5, d_t=3, n_heads=2, qkv_form="tucker", tucker_ranks=(4, 2, 3, 1), tucker_shared_factors=shared
    )
    attn, c = model.layers[0].attention, model.config
    with torch.no_grad():  # break the symmetry of the initial factors
        for name in TUCKER:
            getattr(attn, name).add_(0.3 * torch.randn_like(getattr(attn, name)))
    X5 = model.input_construction(make_window())  # (B, N, T, d_x, d_t)
    q, k, v = attn.qkv(X5.reshape(2, -1, c.d))
    W_all = attn.dense_weights()
    for g, mapped in enumerate((q, k, v)):
        for h in range(2):
            fs = [getattr(attn, n) if shared else getattr(attn, n)[g, h] for n in TUCKER[1:]]
            W = mode_products(attn.core[g, h], *fs)  # (d_x, d_t, d_x, d_t)
            torch.testing.assert_close(W_all[g, h], W)
            expected = torch.einsum("mpnq,bxtnq->bxtmp", W, X5).reshape(2, -1, c.d)
            torch.testing.assert_close(mapped[:, h], expected)
    assert not torch.allclose(q[:, 0], q[:, 1]), "heads differ"


@pytest.mark.parametrize("shared", [False, True])
def test_forward_and_backward_never_form_the_dense_weight(shared):
    # d = 30, d^2 = 900: no activation, intermediate or gradient of these sizes has 900, 1800, 2700 or
    # 5400 elements, nor a (30, 30) or (6, 5, 6, 5) block; the dense model's own weight view is caught.
    sizes = dict(d_x=6, d_t=5, n_heads=2, n_layers=1)
    d = 30
    forbidden = {d * d, 2 * d * d, 3 * d * d, 6 * d * d}

    def dense_like(shape):
        return (
            math.prod(shape) in forbidden
            or any(shape[i : i + 2] == (d, d) for i in range(len(shape) - 1))
            or any(shape[i : i + 4] == (6, 5, 6, 5) for i in range(len(shape) - 3))
        )

    def recorded(model):
        rec = OpRecorder()
        with rec:
            model.training_step(full_window()).loss.backward()
            model(make_window())
        return [(name, s) for name, outs in rec.calls for s in outs if dense_like(s)]

    assert recorded(make_model(**sizes)), "the recorder sees the dense form's (3 H d, d) weight"
    tucker = make_model(**sizes, qkv_form="tucker", tucker_ranks=(3, 2, 3, 2), tucker_shared_factors=shared)
    assert recorded(tucker) == []
    assert tucker.layers[0].attention.core.grad is not None, "the recorded run did train the tucker weights"


@pytest.mark.parametrize("shared", [False, True])
def test_parameter_count_is_the_factorised_one(shared):
    dense = make_model(d_x=6, d_t=5, n_heads=3, n_layers=2)
    tucker = make_model(
        d_x=6, d_t=5, n_heads=3, n_layers=2, qkv_form="tucker", tucker_ranks=(3, 2, 4, 1), tucker_shared_factors=shared
    )
    c = tucker.config
    # 3 H (r_m r_p r_n r_q) + (d_x r_m + d_t r_p + d_x r_n + d_t r_q) x (1 or 3 H), per layer.
    expected = 2 * (3 * 3 * 24 + (18 + 10 + 24 + 5) * (1 if shared else 9))
    assert attention_parameters(tucker) == tucker_attention_count(c) == expected
    assert attention_parameters(dense) == 2 * 3 * 3 * 30**2
    assert attention_parameters(tucker) < attention_parameters(dense) // 10
    total = lambda m: sum(p.numel() for p in m.parameters())
    assert total(dense) - total(tucker) == attention_parameters(dense) - attention_parameters(tucker)


def test_shared_factors_count_once_per_layer():
    settings = dict(d_x=6, d_t=5, n_heads=3, n_layers=2, qkv_form="tucker", tucker_ranks=(3, 2, 4, 1))
    per_head, shared = make_model(**settings), make_model(**settings, tucker_shared_factors=True)
    factors = 6 * 3 + 5 * 2 + 6 * 4 + 5 * 1
    assert attention_parameters(per_head) - attention_parameters(shared) == 2 * (3 * 3 - 1) * factors
    assert per_head.layers[0].attention.factor_m.shape == (3, 3, 6, 3)
    assert shared.layers[0].attention.factor_m.shape == (6, 3)
    # At full ranks, shared identity factors and per-head identity factors give the same function.
    dense = make_model()
    torch.testing.assert_close(
        tucker_from_dense(dense, True)(make_window()), tucker_from_dense(dense, False)(make_window())
    )


@pytest.mark.parametrize("shared", [False, True])
def test_gradients_reach_the_core_and_every_factor(shared):
    model = make_model(qkv_form="tucker", tucker_ranks=(2, 2, 3, 2), tucker_shared_factors=shared).train()
    model.training_step(full_window()).loss.backward()
    for layer in model.layers:
        for name in TUCKER:
            grad = getattr(layer.attention, name).grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
        if not shared:  # every map's and head's own factor is used
            assert (layer.attention.factor_n.grad.flatten(2).abs().sum(-1) > 0).all()


def test_float64_gradient_check_of_the_tucker_parameters():
    model = make_model(
        d_x=2,
        d_t=2,
        n_heads=2,
        n_layers=1,
        n_tokens=3,
        n_states=2,
        attention="reference",
        qkv_form="tucker",
        tucker_ranks=(2, 1, 1, 2),
    ).double()
    ids = torch.tensor([[[3, 4, 0], [5, 0, 0], [6, 7, 8]]])
    names = [f"layers.0.attention.{n}" for n in TUCKER]
    params = dict(model.named_parameters())

    def loss_of(*tensors):
        with torch.nn.utils.stateless._reparametrize_module(model, dict(zip(names, tensors))):
            return model.training_step(ids).loss

    assert torch.autograd.gradcheck(loss_of, [params[n].detach().clone().requires_grad_() for n in names])


def test_initialisation_orthonormal_factors_and_xavier_like_composed_variance():
    model = make_model(d_x=8, d_t=4, n_heads=4, n_layers=3, qkv_form="tucker", tucker_ranks=(3, 2, 4, 2))
    d = 32
    attn = model.layers[0].attention
    for name in TUCKER[1:]:
        F_ = getattr(attn, name)
        eye = torch.eye(F_.shape[-1]).expand_as(F_.transpose(-1, -2) @ F_)
        torch.testing.assert_close(F_.transpose(-1, -2) @ F_, eye)
    with torch.no_grad():
        W = torch.stack([layer.attention.dense_weights() for layer in model.layers]).reshape(-1, d, d)
        frob2 = (W**2).sum(dim=(-1, -2)).mean() / d  # mean-square entry times d; Xavier on d x d gives 1
    assert 0.8 < float(frob2) < 1.25
    dense = make_model(d_x=8, d_t=4, n_heads=4, n_layers=3)
    dense_frob2 = (
        torch.stack([l.attention.w_qkv.detach() for l in dense.layers]).reshape(-1, d, d).pow(2).sum((-1, -2)).mean()
        / d
    )
    assert abs(float(frob2) - float(dense_frob2)) < 0.25


def test_checkpoint_round_trip_keeps_the_tucker_config_and_outputs(tmp_path):
    model = make_model(qkv_form="tucker", tucker_ranks=(3, 2, 2, 1), tucker_shared_factors=True)
    ids = make_window()
    model.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert (
        saved["qkv_form"] == "tucker"
        and saved["tucker_ranks"] == [3, 2, 2, 1]
        and saved["tucker_shared_factors"] is True
    )
    loaded = FourTensorModel.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config and loaded.config.tucker_ranks == (3, 2, 2, 1)
    torch.testing.assert_close(loaded(ids), model(ids))
    assert FourTensorConfig.from_dict(model.config.to_dict()) == model.config
    # Old checkpoints (no tucker fields) load as dense.
    dense = make_model()
    old = {k: v for k, v in dense.config.to_dict().items() if not k.startswith(("qkv_", "tucker_"))}
    assert FourTensorConfig.from_dict(old).qkv_form == "dense"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(qkv_form="cp"), "qkv_form"),
        (dict(qkv_form="tucker"), "needs tucker_ranks"),
        (dict(qkv_form="tucker", tucker_ranks=(2, 2, 2)), "four integers"),
        (dict(qkv_form="tucker", tucker_ranks=(2, 2.0, 2, 2)), "four integers"),
        (dict(qkv_form="tucker", tucker_ranks=(5, 2, 2, 2)), r"r_m = 5 must lie in \[1, d_x = 4\]"),
        (dict(qkv_form="tucker", tucker_ranks=(2, 4, 2, 2)), r"r_p = 4 must lie in \[1, d_t = 3\]"),
        (dict(qkv_form="tucker", tucker_ranks=(2, 2, 0, 2)), r"r_n = 0"),
        (dict(qkv_form="tucker", tucker_ranks=(2, 2, 2, 4)), r"r_q = 4"),
        (dict(tucker_ranks=(2, 2, 2, 2)), "qkv_form='dense'"),
        (dict(tucker_shared_factors=True), "needs qkv_form='tucker'"),
    ],
)
def test_config_rejects_invalid_tucker_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        FourTensorConfig(vocab_size=10, d_x=4, d_t=3, **overrides)


def test_config_accepts_json_lists_and_full_ranks():
    c = FourTensorConfig(vocab_size=10, d_x=4, d_t=3, qkv_form="tucker", tucker_ranks=[4, 3, 4, 3])
    assert c.tucker_ranks == (4, 3, 4, 3)
    with pytest.raises(ValueError, match="dense model"):
        tucker_from_dense(FourTensorModel(c))

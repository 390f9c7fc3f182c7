"""The 4-tensor predictor beyond section 4.8: fast kernels equal the reference, rollout and its length
rule, sampling, input checks, checkpoints."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.test_faithfulness import V, make_model, make_window
from world_model.models.checkpoint import CheckpointError
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig

END = 7  # plays the role of "." in these tests


def with_attention(model: FourTensorModel, attention: str) -> FourTensorModel:
    twin = FourTensorModel(FourTensorConfig(**{**model.config.__dict__, "attention": attention}))
    twin.load_state_dict(model.state_dict())
    return twin.train(model.training)


def assert_same_training_step(a: FourTensorModel, b: FourTensorModel, full: torch.Tensor) -> None:
    """The two models give the same window loss on `full` (B, T+1, N) and the same gradient for every parameter."""
    x, y = a.training_step(full), b.training_step(full)
    torch.testing.assert_close(x.loss, y.loss)
    x.loss.backward()
    y.loss.backward()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, atol=1e-6, rtol=1e-5)


def test_fused_attention_equals_reference_in_value_and_gradient():
    fused = make_model(n_heads=3, attention="fused")
    reference = with_attention(fused, "reference")
    full = torch.cat([make_window(B=3, seed=11), make_window(B=3, seed=12)[:, :1]], dim=1)
    full[2] = 0  # one window of pure padding
    full[2, 4, 0] = 5
    assert_same_training_step(fused, reference, full)


def test_one_matmul_qkv_equals_separate_per_head_contractions():
    model = make_model(n_heads=2)
    c = model.config
    X5 = model.input_construction(make_window())  # (B, N, T, d_x, d_t)
    q, k, v = model.layers[0].attention.qkv(X5.flatten(3).reshape(2, -1, c.d))
    for i, mapped in enumerate((q, k, v)):
        for h in range(2):
            W = model.layers[0].attention.w_qkv[i, h]  # (m, p, n, q)
            per_head = torch.einsum("mpnq,bxtnq->bxtmp", W, X5).reshape(2, -1, c.d)
            torch.testing.assert_close(mapped[:, h], per_head)


def test_readout_on_target_slots_only_equals_full_logits_loss():
    model = make_model()
    full = torch.cat([make_window(seed=13), make_window(seed=14)[:, :1]], dim=1)
    stats = model.training_step(full)
    logits = model(full[:, :-1])  # (B, N, T, V), every slot
    Y = full[:, 1:].permute(0, 2, 1)
    ref = F.cross_entropy(logits.reshape(-1, V), Y.reshape(-1), ignore_index=0)
    torch.testing.assert_close(stats.loss, ref)
    last_gold = full[:, -1]  # (B, N)
    last = logits[:, :, -1]
    mask = last_gold != 0
    ce_sum = F.cross_entropy(last.reshape(-1, V), last_gold.reshape(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(stats.last_ce_sum, ce_sum.detach())
    assert int(stats.last_tokens) == int(mask.sum())
    assert int(stats.last_correct) == int(((last.argmax(-1) == last_gold) & mask).sum())


@pytest.mark.parametrize("prior_kind", ["uniform", "per_slot"])
def test_label_smoothing_equals_the_soft_target_cross_entropy_of_the_full_logits(prior_kind):
    model = make_model()
    full = torch.cat([make_window(seed=13), make_window(seed=14)[:, :1]], dim=1)  # (B, T+1, N)
    n_tokens = model.config.n_tokens
    prior = None
    if prior_kind == "per_slot":
        prior = torch.softmax(torch.randn(n_tokens, V, generator=torch.Generator().manual_seed(5)), -1)  # (N, V)
    stats = model.training_step(full, label_smoothing=0.3, smoothing_prior=prior)
    stats.loss.backward()
    fused = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    logits = model(full[:, :-1])  # (B, N, T, V)
    Y = full[:, 1:].permute(0, 2, 1)  # (B, N, T)
    live = Y != 0
    q = torch.full((n_tokens, V), 1 / V) if prior is None else prior  # (N, V) the smoothing target per slot
    target = 0.7 * F.one_hot(Y, V).double() + 0.3 * q[None, :, None, :].double()  # (B, N, T, V)
    reference = -(target[live] * torch.log_softmax(logits[live].double(), -1)).sum(-1).mean()
    torch.testing.assert_close(stats.loss, reference.float())  # float32 tolerance: the fused loss sums in float32
    reference.backward()
    for name, p in model.named_parameters():
        if name in fused:
            torch.testing.assert_close(fused[name], p.grad, msg=name, atol=1e-6, rtol=1e-4)
    plain = model.training_step(full)
    for key in ("window_ce_sum", "window_tokens", "last_ce_sum", "last_correct", "last_tokens"):
        torch.testing.assert_close(getattr(stats, key), getattr(plain, key))  # the reported numbers stay plain


def test_last_slice_logits_equal_the_full_forward():
    model = make_model()
    ids = make_window()
    torch.testing.assert_close(model.last_slice_logits(ids), model(ids)[:, :, -1])


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attention": "reference"},
        {"temporal_causal": True},
        {"temporal_causal": True, "attention": "reference"},
        {"qkv_form": "tucker", "tucker_ranks": (3, 2, 2, 3)},
    ],
)
def test_last_slice_encoding_equals_the_last_slice_of_the_full_encoding(overrides):
    model = make_model(**overrides)
    ids = make_window(B=3)
    ids[1] = 0  # a window of padding only
    torch.testing.assert_close(model._encode(ids, last_slice_only=True), model.encode(ids)[:, :, -1:])
    torch.testing.assert_close(model.last_slice_logits(ids), model(ids)[:, :, -1])


def test_padding_logit_is_pinned_at_zero():
    model = make_model()
    logits = model(make_window())
    assert torch.all(logits[..., 0] == 0)


def test_length_rule_cuts_after_the_first_end_token():
    model = make_model()
    logits = torch.full((1, 5, V), -1.0)
    for x, token in enumerate([4, 9, END, 3, END]):
        logits[0, x, token] = 5.0
    ids = model.decode_state(logits, GenerationConfig(end_ids=[END]))
    assert ids.tolist() == [[4, 9, END, 0, 0]]
    # Without an end token the state fills all N slots; padding (logit 0 > -1) is never chosen.
    logits[0, 2, END] = -2.0
    logits[0, 4, END] = -2.0
    logits[0, 2, 11] = 5.0
    logits[0, 4, 12] = 5.0
    assert model.decode_state(logits, GenerationConfig(end_ids=[END])).tolist() == [[4, 9, 11, 3, 12]]
    # The unknown word and banned ids are never emitted.
    logits[0, 0, 1] = 9.0
    logits[0, 1, 2] = 9.0
    assert model.decode_state(logits, GenerationConfig(end_ids=[END], banned_ids=[2]))[0, :2].tolist() == [4, 9]


def test_unknown_word_slot_keeps_its_position_and_is_attended():
    model = make_model()
    ids = make_window(B=1)
    ids[0, 3, 0] = 1  # an unknown word at the head of the last sentence
    X = model.input_construction(ids)
    ic = model.input_construction
    torch.testing.assert_close(X[0, 0, 3], ic.P[0][:, None] + ic.Temb[0, 3][None, :])
    assert not model.build_pad_mask(ids)[0, 0, 3]


def test_sampling_is_seeded_and_top_k_restricts_choices():
    model = make_model()
    logits = torch.randn(4, 5, V)
    draw = lambda seed, **kw: model.decode_state(
        logits, GenerationConfig(temperature=1.0, **kw), torch.Generator().manual_seed(seed)
    )
    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    top2 = logits[..., 1:].topk(2, dim=-1).indices + 1  # padding excluded before top-k
    picked = draw(3, top_k=2)
    assert torch.all((picked[..., None] == top2).any(-1))


def test_rollout_slides_the_window_and_rereads_positions():
    model = make_model()
    ids = make_window(B=2, T=4)
    out = model.rollout(ids, 3, GenerationConfig(end_ids=[END]))
    assert out.shape == (2, 3, 5)
    # Step by step by hand: the window is always rewritten onto positions 0..T-1.
    window = ids.clone()
    for step in range(3):
        state = model.decode_state(model(window)[:, :, -1], GenerationConfig(end_ids=[END]))
        assert torch.equal(out[:, step], state)
        window = torch.cat([window[:, 1:], state[:, None]], dim=1)


def test_rollout_from_a_short_window_grows_it_up_to_T():
    model = make_model()
    ids = make_window(B=1, T=2)
    out = model.rollout(ids, steps=3)
    first = model.decode_state(model(ids)[:, :, -1])
    assert torch.equal(out[:, 0], first)
    second_window = torch.cat([ids, first[:, None]], dim=1)  # T' = 3 < T: nothing is dropped yet
    assert torch.equal(out[:, 1], model.decode_state(model(second_window)[:, :, -1]))


def test_training_step_rejects_a_window_without_batch_axis():
    model = make_model()
    window = torch.cat([make_window(B=1), make_window(B=1)[:, :1]], dim=1)[0]  # (T+1, N)
    with pytest.raises(ValueError, match=r"\(B, T\+1, N\).*window\[None\]"):
        model.training_step(window)


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.zeros(2, 4, 6, dtype=torch.long), r"shape \(B>=1, 1..4, 5\)"),
        (torch.zeros(2, 5, 5, dtype=torch.long), r"shape \(B>=1, 1..4, 5\)"),
        (torch.zeros(4, 5, dtype=torch.long), r"insert the batch axis"),
        (torch.full((1, 4, 5), V, dtype=torch.long), rf"id {V}, outside the vocabulary"),
        (torch.full((1, 4, 5), -1, dtype=torch.long), r"id -1"),
        (torch.zeros(1, 4, 5), r"integer token ids"),
    ],
)
def test_forward_names_the_problem_with_bad_ids(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_model()(bad)


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="d_x"):
        FourTensorConfig(vocab_size=10, d_x=0)
    with pytest.raises(ValueError, match="padding_idx"):
        FourTensorConfig(vocab_size=10, padding_idx=10)
    with pytest.raises(ValueError, match="attention"):
        FourTensorConfig(vocab_size=10, attention="flash")


def test_checkpoint_round_trip_in_fp16_and_fp32(tmp_path):
    model = make_model()
    ids = make_window()
    model.save_pretrained(tmp_path / "fp32")
    torch.testing.assert_close(FourTensorModel.from_pretrained(tmp_path / "fp32")(ids), model(ids))
    model.save_pretrained(tmp_path / "fp16", dtype=torch.float16, note="test")
    loaded = FourTensorModel.from_pretrained(tmp_path / "fp16")
    assert json.loads((tmp_path / "fp16" / "config.json").read_text())["extra"] == {"note": "test"}
    torch.testing.assert_close(loaded(ids), model(ids), atol=2e-2, rtol=2e-2)
    assert (tmp_path / "fp16" / "model.safetensors").stat().st_size < (
        tmp_path / "fp32" / "model.safetensors"
    ).stat().st_size


def test_saving_over_a_checkpoint_replaces_it_whole(tmp_path):
    make_model().save_pretrained(tmp_path / "ckpt")
    other = make_model(d_x=2)
    other.save_pretrained(tmp_path / "ckpt")
    assert FourTensorModel.from_pretrained(tmp_path / "ckpt").config.d_x == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "no temporary folders left behind"


def test_truncated_or_mismatched_checkpoints_get_clear_errors(tmp_path):
    make_model().save_pretrained(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        FourTensorModel.from_pretrained(tmp_path / "ckpt")
    make_model().save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, "d_x": 8}))
    with pytest.raises(CheckpointError, match=r"do not match its config: .*E_sem.weight has shape \(23, 4\)"):
        FourTensorModel.from_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        FourTensorModel.from_pretrained(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="holds no config.json"):
        FourTensorModel.from_pretrained(tmp_path)


def test_weights_that_cannot_be_opened_are_not_called_corrupt(tmp_path, monkeypatch):
    import builtins

    make_model().save_pretrained(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    real_open = builtins.open

    def no_permission(path, *args, **kwargs):  # the suite runs as root, whom chmod cannot stop
        if Path(path) == weights:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_permission)
    with pytest.raises(CheckpointError, match="model.safetensors cannot be opened \\(Permission denied\\)"):
        FourTensorModel.from_pretrained(tmp_path / "ckpt")


@pytest.mark.parametrize("layout", ["rows", "transposed"])
def test_fused_linear_cross_entropy_in_fp32_equals_the_plain_expression_to_rounding(layout):
    """fp32, several chunks and a last partial one, M (d, V) stored row-major or as the transpose of (V, d)
    (the model's layout), no argmax: values and gradients equal autograd's to fp32 rounding."""
    from world_model.models.kernels import linear_cross_entropy

    g = torch.Generator().manual_seed(3)
    X0, M0 = torch.randn(300, 32, generator=g), torch.randn(32, 700, generator=g) / 3
    target = torch.randint(0, 700, (300,), generator=g)

    def leaves():
        leaf = (M0 if layout == "rows" else M0.T).clone().requires_grad_()
        return X0.clone().requires_grad_(), leaf, leaf if layout == "rows" else leaf.T

    X, leaf, M = leaves()
    ce_sum, ce, argmax = linear_cross_entropy(X, M, target, chunk=64, argmax_from=300)
    (0.01 * ce_sum).backward()
    X_ref, leaf_ref, M_ref = leaves()
    expected = F.cross_entropy(X_ref @ M_ref, target, reduction="none")
    (0.01 * expected.sum()).backward()
    assert argmax.shape == (0,)
    torch.testing.assert_close(ce, expected.detach())
    torch.testing.assert_close(ce_sum, expected.sum())
    torch.testing.assert_close(X.grad, X_ref.grad)
    torch.testing.assert_close(leaf.grad, leaf_ref.grad)


@pytest.mark.parametrize("rows, chunk, argmax_from", [(37, 8, 0), (37, 128, 0), (37, 8, 13), (37, 8, 37), (0, 8, 0)])
def test_fused_linear_cross_entropy_equals_the_plain_expression(rows, chunk, argmax_from):
    from world_model.models.kernels import linear_cross_entropy

    g = torch.Generator().manual_seed(rows)
    X = torch.randn(rows, 6, generator=g, dtype=torch.float64, requires_grad=True)
    M = torch.randn(6, 11, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (rows,), generator=g)
    ce_sum, ce, argmax = linear_cross_entropy(X, M, target, chunk=chunk, argmax_from=argmax_from)
    (3.0 * ce_sum).backward()
    gX, gM = X.grad.clone(), M.grad.clone()
    X.grad = M.grad = None
    logits = X @ M
    expected = F.cross_entropy(logits, target, reduction="none")
    (3.0 * expected.sum()).backward()
    torch.testing.assert_close(ce_sum, expected.sum())
    torch.testing.assert_close(ce, expected.detach())
    assert torch.equal(argmax, logits.argmax(-1)[argmax_from:])
    torch.testing.assert_close(gX, X.grad)
    torch.testing.assert_close(gM, M.grad)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(X, M, target, chunk=chunk)[0], expected.sum())

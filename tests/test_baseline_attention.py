"""The flat baseline with its attention chosen from the Tucker Attention family: every kind trains,
keeps cached == uncached free running, counts its attention parameters and KV cache by the family's
formulas, round-trips through a checkpoint; the default stays the original model."""

import json

import pytest
import torch

from tests.test_baseline import assert_cached_run_equals_uncached
from tests.test_baseline import make_model as make_baseline
from world_model.models.attention_family import FamilyAttention
from world_model.models.attention_projections import BitLinear
from world_model.models.baseline import BaselineModel
from world_model.models.baseline_config import BaselineConfig
from world_model.models.baseline_layers import CausalSelfAttention
from world_model.models.checkpoint import CheckpointError

V, N, T = 13, 5, 3
D, H, DH, LAYERS = 12, 3, 4, 2  # d = d_x d_t = 4 * 3, three heads of width 4

KINDS = {
    "mha": dict(),
    "mha_bit": dict(bitlinear=True),
    "mqa": dict(attention="gqa", n_kv_heads=1),
    "mla": dict(attention="mla", mla_q_rank=3, mla_kv_rank=3),
    "mla_shared": dict(attention="mla", mla_q_rank=3, mla_kv_rank=3, mla_shared_kv=True),
    "tucker": dict(attention="tucker", tucker_ranks=(2, 3, 3)),
    "tucker_general": dict(attention="tucker", tucker_ranks=[2, 3, 5], tucker_ranks_out=[3, 4, 2]),
    "tucker_bit": dict(attention="tucker", tucker_ranks=(2, 3, 3), bitlinear=True),
    "listing": dict(attention="tucker_listing", tucker_query_rank=4, tucker_key_rank=3, tucker_value_rank=2),
}


def make_model(spec, seed=0, scale=None, **overrides) -> BaselineModel:
    """The tiny baseline of tests/test_baseline.py with this file's heads and layers and an attention `spec`."""
    return make_baseline(seed, scale, **{"n_heads": H, "n_layers": LAYERS, **spec, **overrides})


def make_full(B=3, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, T + 1, N), generator=g)
    lengths = torch.randint(1, N + 1, (B, T + 1), generator=g)
    ids[torch.arange(N)[None, None, :] >= lengths[..., None]] = 0
    return ids


def table1(name: str, n_tokens: int) -> tuple[int, int]:
    """(attention parameters, KV cache numbers) of ONE layer, in the paper's Table 1 notation (d = n_H d_H)."""
    d, d_h = D, DH
    if name in ("mha", "mha_bit"):
        return 4 * d * d, 2 * n_tokens * d
    if name == "mqa":  # n_KV = 1
        return 2 * d * d + 2 * 1 * d_h * d, 2 * n_tokens * 1 * d_h
    if name == "mla":  # d_c^Q = d_c = 3, separate latents
        return d * d + 6 * d * 3, 2 * n_tokens * 3
    if name == "mla_shared":
        return d * d + 5 * d * 3, n_tokens * 3
    if name in ("tucker", "tucker_bit"):  # ranks (r_1, r, r) = (2, 3, 3) for W and W~
        r1, r = 2, 3
        return 2 * H * r1 + 4 * d * r + 2 * r1 * r * r, 2 * n_tokens * r
    if name == "tucker_general":  # W (2, 3, 5), W~ (3, 4, 2): factors, cores; cache k~ (r_3) + v~ (r~_2)
        return (H * 2 + d * 3 + d * 5 + 2 * 3 * 5) + (H * 3 + d * 4 + d * 2 + 3 * 4 * 2), n_tokens * (5 + 4)
    if name == "listing":  # the reference listing's form, ranks (r_Q, r_K, r_V) = (4, 3, 2): K and V cached whole
        return 2 * d * (4 + 3 + 2) + d * d, 2 * n_tokens * d
    raise KeyError(name)


# ----- the default is the original model -----
def test_default_config_is_the_original_model():
    default, explicit = make_model({}), make_model(dict(attention="mha", bitlinear=False))
    assert default.config == explicit.config
    assert all(isinstance(b.attention, CausalSelfAttention) for b in default.blocks)
    keys = list(default.state_dict())
    assert keys == list(explicit.state_dict())
    assert "blocks.0.attention.W_qkv.weight" in keys and "blocks.0.attention.W_o.weight" in keys
    assert not any(".proj." in k for k in keys)
    for k, v in default.state_dict().items():  # same seed, same init, bit for bit
        assert torch.equal(v, explicit.state_dict()[k]), k
    # an old config.json has none of the new keys and still describes the same model
    old = {
        k: v
        for k, v in default.config.to_dict().items()
        if k
        not in (
            "attention",
            "n_kv_heads",
            "mla_kv_rank",
            "mla_q_rank",
            "mla_shared_kv",
            "tucker_ranks",
            "tucker_ranks_out",
            "bitlinear",
        )
    }
    assert BaselineConfig.from_dict(old) == default.config
    # ... and any other choice does swap the layer (and its parameter names)
    tucker = make_model(KINDS["tucker"])
    assert all(isinstance(b.attention, FamilyAttention) for b in tucker.blocks)
    assert "blocks.0.attention.proj.core_qk" in tucker.state_dict()


def test_default_parameter_count_at_the_paper_settings_is_unchanged():
    with torch.device("meta"):
        default = BaselineModel(BaselineConfig(content_vocab_size=36711, d_x=64, d_t=32, n_heads=2, n_layers=2))
        explicit = BaselineModel(
            BaselineConfig(content_vocab_size=36711, d_x=64, d_t=32, n_heads=2, n_layers=2, attention="mha")
        )
        bit = BaselineModel(
            BaselineConfig(content_vocab_size=36711, d_x=64, d_t=32, n_heads=2, n_layers=2, bitlinear=True)
        )
    counts = [sum(p.numel() for p in m.parameters()) for m in (default, explicit, bit)]
    assert counts == [175_892_480] * 3  # BitLinear mha: separate W_Q, W_K, W_V, same count
    assert default.attention_parameter_count() == 2 * 4 * 2048**2


def test_gqa_with_all_heads_reproduces_the_original_attention():
    """n_KV = n_H through FamilyAttention, fed the default model's weights, gives the same logits and runs:
    the Block's call into the family layer (argument order, masks, scale, cache) matches the original."""
    ref = make_model({}, scale=0.5).double()
    fam = make_model(dict(attention="gqa", n_kv_heads=H), scale=0.5).double()
    state = {}
    for k, v in ref.state_dict().items():
        if k.endswith("attention.W_qkv.weight"):
            stem = k[: -len("W_qkv.weight")] + "proj."
            for name, part in zip(("W_q", "W_k", "W_v"), v.chunk(3, dim=0)):
                state[stem + name + ".weight"] = part
        elif k.endswith("attention.W_o.weight"):
            state[k.replace("attention.W_o", "attention.proj.W_o")] = v
        else:
            state[k] = v
    fam.load_state_dict(state)
    ids = torch.randint(0, V + 2, (2, 9), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(fam(ids), ref(ids), rtol=1e-12, atol=1e-12)
    full = make_full(B=4, seed=9)
    a, b = fam.free_run(full), ref.free_run(full)
    assert torch.equal(a.tokens, b.tokens)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-12, atol=1e-12)


# ----- every kind trains and decodes with its cache -----
@pytest.mark.parametrize("name", list(KINDS))
def test_each_kind_trains_one_step(name):
    model = make_model(KINDS[name], dropout=0.1).train()
    if name.endswith("_bit"):
        assert sum(isinstance(m, BitLinear) for m in model.modules()) == LAYERS * 4
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = model.training_step(make_full(B=2, seed=10))
    assert torch.isfinite(stats.loss) and stats.loss.item() > 0
    stats.loss.backward()
    for k, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), k
        if ".attention." in k:
            assert p.grad.abs().sum() > 0, k  # every attention parameter is on the loss path
    opt.step()
    assert all(not torch.equal(before[k], p) for k, p in model.named_parameters() if ".attention." in k)
    assert torch.isfinite(model.training_step(make_full(B=2, seed=10)).loss)


@pytest.mark.parametrize("name", list(KINDS))
def test_cached_and_uncached_free_running_agree(name):
    model = make_model(KINDS[name], scale=0.5, n_layers=3).double()
    full = make_full(B=4, seed=9)
    cached = assert_cached_run_equals_uncached(model, full)
    assert (cached.logits[0, 0] - cached.logits[1, 0]).abs().max() > 1e-3  # the logits do depend on the prefix
    window = full[:, :T]
    assert torch.equal(model.generate(window, use_cache=True), model.generate(window, use_cache=False))


# ----- counts for the Pareto plot -----
@pytest.mark.parametrize("name", list(KINDS))
def test_attention_parameter_and_kv_cache_counts_follow_the_family_formulas(name):
    model = make_model(KINDS[name])
    params, _ = table1(name, 1)
    assert model.attention_parameter_count() == LAYERS * params
    # everything else is the same model: the totals differ by exactly the attention difference
    mha = make_model({})
    total = sum(p.numel() for p in model.parameters())
    assert total - sum(p.numel() for p in mha.parameters()) == model.attention_parameter_count() - LAYERS * 4 * D * D
    if name not in ("mha", "mha_bit"):
        assert model.attention_parameter_count() < mha.attention_parameter_count()
    # the cache really holds kv_cache_size numbers after a prefill of Lp tokens (one row)
    Lp = 7
    prefix = torch.randint(2, V, (1, Lp), generator=torch.Generator().manual_seed(0))
    _, cache = model.prefill(prefix, torch.tensor([Lp]))
    assert sum(t.numel() for kv in cache.kv for t in kv) == model.kv_cache_size(Lp) == LAYERS * table1(name, Lp)[1]


# ----- config and checkpoints -----
def test_tucker_checkpoint_round_trip(tmp_path):
    model = make_model(KINDS["tucker_general"], scale=0.5)
    full = make_full(seed=12)
    model.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert (
        saved["attention"] == "tucker" and saved["tucker_ranks"] == [2, 3, 5] and saved["tucker_ranks_out"] == [3, 4, 2]
    )
    loaded = BaselineModel.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config and loaded.config.tucker_ranks == (2, 3, 5)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    torch.testing.assert_close(loaded.training_step(full).loss, model.training_step(full).loss)
    assert torch.equal(loaded.generate(full[:, :T]), model.generate(full[:, :T]))
    # the same weights under another attention config do not load silently
    saved["tucker_ranks"] = [2, 3, 4]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match="core_qk"):
        BaselineModel.from_pretrained(tmp_path / "ckpt")


@pytest.mark.parametrize("name", list(KINDS))
def test_config_dict_round_trip_through_json(name):
    config = make_model(KINDS[name]).config
    assert BaselineConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_listings_ranks_default_as_the_listing_does():
    config = BaselineConfig(content_vocab_size=V, d_x=4, d_t=3, attention="tucker_listing", tucker_key_rank=5)
    assert config.listing_ranks() == (12, 5, 6)  # r_Q = d, r_K as given, r_V = d // 2
    assert BaselineModel(config).blocks[0].attention.config.listing_ranks == (12, 5, 6)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(attention="linear"), "attention must be one of"),
        (dict(n_kv_heads=1), "n_kv_heads applies only to attention='gqa'"),
        (dict(attention="tucker", tucker_ranks=(2, 3, 3), n_kv_heads=1), "n_kv_heads applies only"),
        (dict(attention="gqa"), "gqa needs n_kv_heads"),
        (dict(attention="gqa", n_kv_heads=2), "dividing n_heads 3"),
        (dict(attention="mla"), "mla needs mla_kv_rank"),
        (dict(attention="mla", mla_kv_rank=3, mla_q_rank=0), "mla_q_rank"),
        (dict(attention="gqa", n_kv_heads=1, mla_shared_kv=True), "mla_shared_kv applies only to attention='mla'"),
        (dict(attention="tucker"), "tucker needs tucker_ranks"),
        (dict(attention="tucker", tucker_ranks=(2, 3)), "three positive ints"),
        (dict(attention="tucker", tucker_ranks=(2, 0, 3)), "three positive ints"),
        (dict(attention="tucker", tucker_ranks=3), "three positive ints"),
        (dict(attention="mha", tucker_ranks=(2, 3, 3)), "tucker_ranks applies only"),
        (dict(attention="mla", mla_kv_rank=3, tucker_ranks_out=(2, 3, 3)), "tucker_ranks_out applies only"),
        (dict(attention="tucker", tucker_ranks=(2, 3, 3), tucker_key_rank=2), "tucker_key_rank applies only"),
        (dict(attention="tucker_listing", tucker_value_rank=0), "three positive ints"),
    ],
)
def test_invalid_attention_configs_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        BaselineConfig(content_vocab_size=V, d_x=4, d_t=3, n_heads=H, **bad)

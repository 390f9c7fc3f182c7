"""The 1-D attention family (Tucker Attention paper): special cases, Table 1 counts, KV-cache decoding, BitLinear."""

import pytest
import torch
import torch.nn.functional as F

from world_model.models.attention_config import AttentionConfig
from world_model.models.attention_conversions import listing_from_mha, tucker_from_grouped, tucker_from_mla
from world_model.models.attention_family import FamilyAttention
from world_model.models.attention_projections import BitLinear, ternary

D, H, DH = 32, 4, 8  # d_model = n_H d_H, as Table 1 assumes

SOURCES = {
    "mha": dict(kind="mha"),
    "gqa2": dict(kind="gqa", n_kv_heads=2),
    "mqa": dict(kind="gqa", n_kv_heads=1),
    "mla_sep": dict(kind="mla", mla_q_rank=12, mla_kv_rank=6),
    "mla_shared_fullq": dict(kind="mla", mla_kv_rank=6, mla_shared_kv=True),
}
ALL_KINDS = {
    **SOURCES,
    "tucker": dict(kind="tucker", tucker_ranks=(2, 6, 5), tucker_ranks_out=(3, 7, 9)),
    "tucker_listing": dict(kind="tucker_listing", listing_ranks=(10, 6, 4)),
}


def make(spec, causal=True, seed=0, **extra):
    torch.manual_seed(seed)
    return FamilyAttention(AttentionConfig(d_model=D, n_heads=H, causal=causal, **spec, **extra)).double().eval()


def x_of(B=2, L=7, seed=1):
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(SOURCES))
def test_special_cases_map_to_tucker_exactly(name, causal):
    src = make(SOURCES[name], causal=causal)
    tucker = (tucker_from_mla if src.config.kind == "mla" else tucker_from_grouped)(src)
    c = src.config
    # the documented ranks of W and W~
    if c.kind == "mla":
        r_q = c.mla_q_rank or H * DH
        assert tucker.config.tucker_ranks == (H, r_q, c.mla_kv_rank)
        assert tucker.config.tucker_ranks_out == (H, c.mla_kv_rank, H * DH)
    else:
        assert tucker.config.tucker_ranks == (H, H * DH, c.n_kv_heads * DH)
        assert tucker.config.tucker_ranks_out == (H, c.n_kv_heads * DH, H * DH)
    assert tucker.config.causal == causal
    x = x_of()
    y_src, _ = src(x)
    y_tucker, _ = tucker(x)
    torch.testing.assert_close(y_tucker, y_src, rtol=1e-10, atol=1e-10)
    # negative control: a perturbed core no longer agrees (the check can fail)
    with torch.no_grad():
        tucker.proj.core_qk.add_(0.1 * torch.randn_like(tucker.proj.core_qk))
    assert (tucker(x)[0] - y_src).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["mha", "gqa2"])
def test_grouped_mapping_is_exact_under_bitlinear(name):
    src = make(SOURCES[name], bitlinear=True)
    tucker = tucker_from_grouped(src)
    assert isinstance(tucker.proj.q_factor, BitLinear)
    x = x_of()
    torch.testing.assert_close(tucker(x)[0], src(x)[0], rtol=1e-10, atol=1e-10)


def table1(name, N):
    """(#Params (train), KV Cache) of Table 1, written in the paper's notation (d = d_model = n_H d_H)."""
    d, n_H, d_H = D, H, DH
    if name == "mha":
        return 4 * d**2, 2 * N * d
    if name == "mqa":
        return 2 * d**2 + 2 * d_H * d, 2 * N * d_H
    if name == "gqa2":
        n_KV = 2
        return 2 * d**2 + 2 * n_KV * d_H * d, 2 * N * n_KV * d_H
    d_c = 6
    if name == "mla_sep":  # d_c^Q = d_c^K = d_c^V = d_c
        return d**2 + 6 * d * d_c, 2 * N * d_c
    if name == "mla_shared":
        return d**2 + 5 * d * d_c, N * d_c
    if name == "tucker":
        # Ranks (r_1, r, r) of W and W~. The Tucker row is missing from the seed text: this is the
        # count of the decomposition itself, factors U_1 (n_H r_1), U_2, U_3 (d r each), core r_1 r^2, twice.
        r_1, r = 2, 5
        return 2 * n_H * r_1 + 4 * d * r + 2 * r_1 * r**2, 2 * N * r
    raise KeyError(name)


TABLE1_SPECS = {
    "mha": dict(kind="mha"),
    "mqa": dict(kind="gqa", n_kv_heads=1),
    "gqa2": dict(kind="gqa", n_kv_heads=2),
    "mla_sep": dict(kind="mla", mla_q_rank=6, mla_kv_rank=6),
    "mla_shared": dict(kind="mla", mla_q_rank=6, mla_kv_rank=6, mla_shared_kv=True),
    "tucker": dict(kind="tucker", tucker_ranks=(2, 5, 5)),
}


@pytest.mark.parametrize("name", list(TABLE1_SPECS))
def test_parameter_and_kv_cache_counts_match_table1(name):
    m = make(TABLE1_SPECS[name])
    N = 9
    params, cache = table1(name, N)
    assert m.parameter_count() == params
    assert sum(p.numel() for p in m.parameters()) == params
    assert m.kv_cache_size(N) == cache
    _, kv = m(x_of(B=1, L=N))  # what the module actually stores for N tokens
    assert sum(t.numel() for t in kv) == cache


@pytest.mark.parametrize("causal", [True, False])
def test_mha_maps_to_the_listings_form_at_full_ranks_exactly(causal):
    src = make(SOURCES["mha"], causal=causal)
    listing = listing_from_mha(src)
    assert listing.config.listing_ranks == (D, D, D) and listing.config.causal == causal
    x = x_of()
    torch.testing.assert_close(listing(x)[0], src(x)[0], rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # negative control: a perturbed factor no longer agrees
        listing.proj.k_factor.weight.add_(0.1 * torch.randn_like(listing.proj.k_factor.weight))
    assert (listing(x)[0] - src(x)[0]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="no bitlinear"):
        listing_from_mha(make(SOURCES["mha"], bitlinear=True))


def test_the_listings_form_counts_its_seven_maps_and_caches_whole_keys_and_values():
    m = make(ALL_KINDS["tucker_listing"])  # ranks (10, 6, 4) at d = n_H d_H = 32
    expected = 2 * D * (10 + 6 + 4) + D * D  # factors d r and cores r d for Q, K, V, and W_O
    assert m.parameter_count() == expected == sum(p.numel() for p in m.parameters())
    assert m.kv_cache_size(5) == 5 * 2 * H * DH  # K and V at every head's width: no cache saved
    _, kv = m(x_of(B=1, L=5))
    assert sum(t.numel() for t in kv) == m.kv_cache_size(5)
    default = make(dict(kind="tucker_listing"))  # the listing's defaults: (d, d/2, d/2)
    assert default.config.listing_ranks == (D, D // 2, D // 2) and default.parameter_count() == 5 * D * D
    bit = make(ALL_KINDS["tucker_listing"], bitlinear=True)
    assert all(isinstance(module, BitLinear) for module in bit.proj.children())


def test_tucker_general_ranks_count():
    m = make(ALL_KINDS["tucker"])  # (2, 6, 5) and (3, 7, 9)
    expected = (H * 2 + D * 6 + D * 5 + 2 * 6 * 5) + (H * 3 + D * 7 + D * 9 + 3 * 7 * 9)
    assert m.parameter_count() == expected == sum(p.numel() for p in m.parameters())
    assert m.kv_cache_size(4) == 4 * (5 + 7)  # k~ (r_3) and v~ (r~_2)


@pytest.mark.parametrize("name", list(ALL_KINDS))
def test_cached_decoding_equals_full_causal_forward(name):
    m = make(ALL_KINDS[name])
    x = x_of(L=8)
    y_full, kv_full = m(x)
    y, past = m(x[:, :3])  # prefill 3, then one chunk of 2 (offset mask path), then token by token
    ys = [y]
    y, past = m(x[:, 3:5], past=past)
    ys.append(y)
    for t in range(5, 8):
        y, past = m(x[:, t : t + 1], past=past)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys, dim=1), y_full, rtol=1e-10, atol=1e-10)
    for a, b in zip(past, kv_full):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", list(ALL_KINDS))
def test_causal_mask_hides_later_tokens(name):
    x = x_of(L=6)
    x2 = x.clone()
    x2[:, 4] += 1.0
    dec = make(ALL_KINDS[name], causal=True)
    y, y2 = dec(x)[0], dec(x2)[0]
    torch.testing.assert_close(y2[:, :4], y[:, :4], rtol=1e-12, atol=1e-12)
    assert (y2[:, 4:] - y[:, 4:]).abs().amax() > 1e-6
    enc = make(ALL_KINDS[name], causal=False)  # control: the encoder sees the change everywhere
    assert (enc(x2)[0][:, :4] - enc(x)[0][:, :4]).abs().amax() > 1e-6


def test_attn_mask_is_combined_with_causal():
    m = make(ALL_KINDS["tucker"])
    x = x_of(B=1, L=5)
    keep = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    keep[..., 1] = False  # nobody may look at token 1 (token 1 itself still sees token 0)
    y = m(x, attn_mask=keep)[0]
    x2 = x.clone()
    x2[:, 1] += 1.0
    y2 = m(x2, attn_mask=keep)[0]
    torch.testing.assert_close(y2[:, 2:], y[:, 2:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y2[:, 0], y[:, 0])


def test_bitlinear_ternary_forward_and_straight_through_backward():
    torch.manual_seed(0)
    layer = BitLinear(16, 8, bias=False)
    wq = layer.quantised_weight().detach()
    scale = layer.weight.detach().abs().mean()
    levels = torch.unique(torch.round(wq / scale, decimals=6))
    assert set(levels.tolist()) <= {-1.0, 0.0, 1.0} and len(levels) == 3
    x = torch.randn(5, 16)
    y = layer(x)
    torch.testing.assert_close(y, F.linear(x, wq))
    assert (y - F.linear(x, layer.weight)).abs().max() > 1e-3  # really quantised
    g = torch.randn(5, 8)
    (y * g).sum().backward()
    torch.testing.assert_close(layer.weight.grad, g.T @ x)  # identity through the quantiser
    w = torch.randn(3, 4, requires_grad=True)
    ternary(w).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(3, 4))


def test_bitlinear_module_uses_ternary_projections():
    spec = ALL_KINDS["tucker"]
    q = make(spec, bitlinear=True)
    fp = make(spec, bitlinear=False)  # same seed, same latent weights
    assert sum(isinstance(mod, BitLinear) for mod in q.modules()) == 4
    x = x_of()
    assert (q(x)[0] - fp(x)[0]).abs().max() > 1e-4
    loss = q(x)[0].square().sum()
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in q.parameters())


def test_config_validation():
    with pytest.raises(ValueError):
        AttentionConfig(d_model=D, n_heads=H, kind="gqa", n_kv_heads=3)
    with pytest.raises(ValueError):
        AttentionConfig(d_model=D, n_heads=H, kind="mla")
    with pytest.raises(ValueError):
        AttentionConfig(d_model=D, n_heads=H, kind="tucker")
    assert AttentionConfig(d_model=D, n_heads=H, kind="mha", n_kv_heads=1).n_kv_heads == H

"""The flat autoregressive baseline of section 7: packing, causal stack, the free-running objective and
its two reductions, the KV cache, generation, parameter counts at the paper settings, checkpoints."""

import json

import pytest
import torch
import torch.nn.functional as F

from world_model.models.baseline import BaselineModel
from world_model.models.baseline_config import BaselineConfig
from world_model.models.baseline_generation import gold_log_probs
from world_model.models.baseline_layers import rotate
from world_model.models.baseline_packing import aligned_correct, compact
from world_model.models.four_tensor import FourTensorModel
from world_model.models.four_tensor_config import FourTensorConfig
from world_model.models.generation_config import GenerationConfig
from world_model.models.kernels import default_chunk
from world_model.text.vocab import Vocabulary

V = 13  # content vocabulary, padding 0 and unknown 1 included
BOS, EOS = V, V + 1
N, T = 5, 3


def make_model(seed=0, scale=None, **overrides) -> BaselineModel:
    """A tiny eval-mode baseline; `scale` redraws every weight from N(0, scale^2) for livelier greedy runs."""
    torch.manual_seed(seed)
    settings = dict(content_vocab_size=V, d_x=4, d_t=3, n_heads=3, n_layers=2, n_tokens=N, n_states=T, dropout=0.0)
    settings.update(overrides)
    model = BaselineModel(BaselineConfig(**settings)).eval()
    if scale is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, scale)
    return model


def make_full(B=3, seed=1, min_len=1) -> torch.Tensor:
    """(B, T+1, N) content ids with a ragged padding tail per sentence."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, T + 1, N), generator=g)
    lengths = torch.randint(min_len, N + 1, (B, T + 1), generator=g)
    ids[torch.arange(N)[None, None, :] >= lengths[..., None]] = 0
    return ids


def row_sequence(run, b: int, steps: int) -> list[int]:
    """Row b's live prefix followed by its first `steps` appended tokens."""
    live = run.packed.prefix[b, : int(run.packed.prefix_len[b])].tolist()
    return live + run.tokens[b, :steps].tolist()


# ----- packing -----
def test_packing_removes_padding_adds_bos_eos_and_no_separators():
    model = make_model()
    assert (model.config.bos_id, model.config.eos_id, model.config.vocab_size) == (BOS, EOS, V + 2)
    full = torch.tensor(
        [
            [[4, 0, 5, 0, 0], [0, 0, 0, 0, 0], [6, 7, 8, 9, 10], [11, 0, 0, 0, 0]],
            [[2, 3, 0, 0, 0], [7, 0, 0, 0, 0], [8, 0, 0, 0, 0], [9, 10, 11, 12, 2]],
        ]
    )
    packed = model.pack(full)
    assert packed.prefix.tolist() == [[BOS, 4, 5, 6, 7, 8, 9, 10], [BOS, 2, 3, 7, 8, 0, 0, 0]]
    assert packed.prefix_len.tolist() == [8, 5]
    assert packed.gold.tolist() == [[11, EOS, 0, 0, 0, 0], [9, 10, 11, 12, 2, EOS]]
    assert packed.gold_len.tolist() == [2, 6]
    # An all-padding target is just [EOS]; an all-padding context is just [BOS].
    empty = torch.zeros(1, T + 1, N, dtype=torch.long)
    packed = model.pack(empty)
    assert packed.prefix.tolist() == [[BOS]] and packed.gold.tolist() == [[EOS]]


def test_target_marker_repeats_bos_after_the_prefix_and_adds_no_parameter():
    """The opt-in marker (not in the paper): [BOS] again after S(T-1), where the written sentence begins."""
    plain, marked = make_model(), make_model(target_marker=True)
    full = torch.tensor(
        [
            [[4, 0, 5, 0, 0], [0, 0, 0, 0, 0], [6, 7, 8, 9, 10], [11, 0, 0, 0, 0]],
            [[2, 3, 0, 0, 0], [7, 0, 0, 0, 0], [8, 0, 0, 0, 0], [9, 10, 11, 12, 2]],
        ]
    )
    packed = marked.pack(full)
    assert packed.prefix.tolist() == [[BOS, 4, 5, 6, 7, 8, 9, 10, BOS], [BOS, 2, 3, 7, 8, BOS, 0, 0, 0]]
    assert packed.prefix_len.tolist() == [9, 6]
    assert torch.equal(packed.gold, plain.pack(full).gold)
    assert marked.config.max_len == plain.config.max_len + 1
    assert sum(p.numel() for p in marked.parameters()) == sum(p.numel() for p in plain.parameters())
    # The longest window (no padding anywhere) still fits: training, scoring and generation run to N tokens.
    longest = torch.randint(2, V, (2, T + 1, N), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(marked.training_step(longest).loss)
    assert marked.generate(longest[:, :T], GenerationConfig(banned_ids=(EOS,))).shape == (2, N)
    # Old checkpoints' configs have no such field: they load as the paper's packing.
    data = marked.config.to_dict()
    assert BaselineConfig.from_dict(data).target_marker
    del data["target_marker"]
    assert not BaselineConfig.from_dict(data).target_marker


def test_scaled_input_token_vectors_are_e_times_sqrt_d_on_every_path(tmp_path):
    model = make_model(seed=2, scale_embeddings=True)
    plain = make_model(seed=2)  # the paper's baseline: E(ids) as stored, the same weights
    ids = torch.tensor([[BOS, 4, 5, 6]])
    torch.testing.assert_close(model.token_code(ids), plain.E(ids) * model.config.d**0.5)
    torch.testing.assert_close(plain.token_code(ids), plain.E(ids))
    assert not torch.allclose(model(ids), plain(ids))
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters())
    # The cached free run reads the same token vectors as the full forward pass.
    full = make_full(B=2, seed=6)
    torch.testing.assert_close(model.free_run(full).logits, model.free_run(full, use_cache=False).logits)
    # Saved and loaded, it keeps the scale; a config saved before the field existed loads as the paper's.
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(BaselineModel.from_pretrained(tmp_path)(ids), model(ids))
    data = model.config.to_dict()
    del data["scale_embeddings"]
    assert not BaselineConfig.from_dict(data).scale_embeddings


# ----- the causal stack -----
def test_rotary_scores_depend_on_the_position_difference_only_and_turn_channel_pairs():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64), torch.randn(2, 3, 6, 8, generator=g).double()
    pos = torch.tensor([0, 1, 2, 5, 9, 20])
    scores = rotate(q, pos) @ rotate(k, pos).transpose(-1, -2)
    torch.testing.assert_close(rotate(q, pos + 37) @ rotate(k, pos + 37).transpose(-1, -2), scores)
    torch.testing.assert_close(rotate(q, pos).norm(dim=-1), q.norm(dim=-1))  # a rotation of each pair
    torch.testing.assert_close(rotate(q, torch.zeros(6, dtype=torch.long)), q)  # position 0 turns nothing
    # channel 0 is paired with channel w/2 = 4 and turned by angle position * base^0 = position
    x = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    x[..., 0] = 1.0
    turned = rotate(x, torch.tensor([2]))[0, 0, 0]
    expected = torch.zeros(8, dtype=torch.float64)
    expected[0], expected[4] = torch.cos(torch.tensor(2.0)), torch.sin(torch.tensor(2.0))
    torch.testing.assert_close(turned, expected.double())
    per_row = rotate(q, torch.stack([pos, pos + 1]))  # (B, L) positions: row 1 one step later
    torch.testing.assert_close(per_row[1], rotate(q[1:], pos + 1)[0])


def test_rotary_positions_add_no_parameter_and_nothing_to_the_input():
    rotary, plain = make_model(positions="rotary"), make_model(positions="sinusoidal")
    assert sum(p.numel() for p in rotary.parameters()) == sum(p.numel() for p in plain.parameters())
    ids = torch.tensor([[BOS, 4, 5, 6]])
    x, positions = rotary.embed(ids, torch.arange(4))
    assert torch.equal(x, rotary.E(ids)) and torch.equal(positions, torch.arange(4))
    x, positions = plain.embed(ids, torch.arange(4))
    assert positions is None and not torch.equal(x, plain.E(ids))
    # order still matters: in one layer, where a position-free model sees only the set of earlier tokens, the same
    # tokens in another order give other logits at the last position
    model = make_model(scale=0.5, positions="rotary", n_layers=1)
    a = model.forward_last(torch.tensor([[BOS, 4, 5, 6, 7]]))
    b = model.forward_last(torch.tensor([[BOS, 5, 4, 6, 7]]))
    assert not torch.allclose(a, b)


def test_causal_mask_later_tokens_do_not_change_earlier_logits():
    model = make_model()
    ids = torch.randint(0, V + 2, (2, 9), generator=torch.Generator().manual_seed(3))
    logits = model(ids)
    assert logits.shape == (2, 9, V + 2)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % (V + 2)
    other = model(changed)
    torch.testing.assert_close(other[:, :6], logits[:, :6], rtol=0, atol=0)
    assert not torch.allclose(other[:, 6:], logits[:, 6:])


def test_forward_last_reads_the_last_live_position_of_right_padded_rows():
    model = make_model()
    ids = torch.randint(2, V, (3, 7), generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([7, 2, 4])
    ids[torch.arange(7)[None, :] >= lengths[:, None]] = 0
    last = model.forward_last(ids, lengths)
    full = model(ids)
    torch.testing.assert_close(last, full[torch.arange(3), lengths - 1])
    # Whatever sits in the padding tail is invisible to the live positions.
    junk = ids.clone()
    junk[torch.arange(7)[None, :] >= lengths[:, None]] = 9
    torch.testing.assert_close(model.forward_last(junk, lengths), last, rtol=0, atol=0)


def test_readout_is_tied_to_the_token_table():
    model = make_model()
    ids = torch.tensor([[BOS, 4, 5]])
    H = model.encode(ids)
    torch.testing.assert_close(model(ids), H @ model.E.weight.T)
    assert not any("readout" in name or "head" in name for name, _ in model.named_parameters())


# ----- the free-running objective -----
def test_free_running_appends_the_argmax_not_the_gold_token():
    model = make_model(scale=0.5)
    full = make_full(B=1, seed=5, min_len=3)
    first = int(model.free_run(full).tokens[0, 0])
    gold0 = 2 if first != 2 else 3  # a gold first token the model does not pick
    full[0, -1, 0] = gold0
    run = model.free_run(full)
    assert int(run.tokens[0, 0]) == first != gold0
    assert torch.equal(run.tokens, run.logits.argmax(-1))
    live = run.packed.prefix[:, : int(run.packed.prefix_len[0])]
    own = model.forward_last(torch.cat([live, torch.tensor([[first]])], dim=1))
    teacher = model.forward_last(torch.cat([live, torch.tensor([[gold0]])], dim=1))
    torch.testing.assert_close(run.logits[:, 1], own)
    assert not torch.allclose(run.logits[:, 1], teacher)


def test_loss_and_gradient_equal_a_fixed_input_pass_over_the_models_own_tokens():
    """Gradient reaches each step's logits through the network, never through the discrete token chosen."""
    model = make_model(scale=0.5).double()
    full = make_full(B=2, seed=6)
    stats = model.training_step(full)
    stats.loss.backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    with torch.no_grad():
        run = model.free_run(full)
    ce, count = 0.0, 0
    for b in range(2):
        p_len, g_len = int(run.packed.prefix_len[b]), int(run.packed.gold_len[b])
        seq = torch.tensor([row_sequence(run, b, g_len - 1)])  # prefix + own tokens, as plain input ids
        logits = model(seq)[0, p_len - 1 : p_len - 1 + g_len]  # (g_len, V)
        ce = ce + F.cross_entropy(logits, run.packed.gold[b, :g_len], reduction="sum")
        count += g_len
    reference = ce / count
    torch.testing.assert_close(stats.loss, reference)
    reference.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, msg=name)


def test_inactive_rows_stop_contributing():
    model = make_model(scale=0.5)
    full = make_full(B=3, seed=7)
    full[0, -1] = torch.tensor([3, 0, 0, 0, 0])  # short gold span: inactive after 2 steps
    full[1, -1] = torch.tensor([4, 5, 6, 7, 8])  # the longest: 6 steps
    batch = model.training_step(full)
    singles = [model.training_step(full[b : b + 1]) for b in range(3)]
    for field in ("window_ce_sum", "last_ce_sum"):
        torch.testing.assert_close(getattr(batch, field), sum(getattr(s, field) for s in singles))
    for field in ("window_tokens", "last_tokens", "last_correct"):
        assert int(getattr(batch, field)) == sum(int(getattr(s, field)) for s in singles)
    assert int(batch.window_tokens) == 2 + 6 + int((full[2, -1] != 0).sum()) + 1


def test_selection_and_content_reductions_differ_by_the_eos_tokens():
    model = make_model(scale=0.5)
    full = make_full(B=4, seed=8)
    full[3, -1] = 0  # an empty S(T): its only gold token is [EOS]
    stats = model.training_step(full)
    run = model.free_run(full)
    assert int(stats.last_tokens) == int((full[:, -1] != 0).sum())  # the 4-tensor last-slice denominator
    assert int(stats.window_tokens) - int(stats.last_tokens) == 4  # one [EOS] per row
    rows = torch.arange(4)
    eos_ce = F.cross_entropy(run.logits[rows, run.packed.gold_len - 1], torch.full((4,), EOS), reduction="sum")
    torch.testing.assert_close(stats.window_ce_sum - stats.last_ce_sum, eos_ce)
    torch.testing.assert_close(stats.loss, stats.window_ce_sum / stats.window_tokens)
    assert stats.loss.requires_grad and not stats.window_ce_sum.requires_grad


def test_label_smoothing_changes_only_the_loss_to_gold_mixed_with_a_uniform_guess():
    model = make_model(scale=0.5)
    full = make_full(B=4, seed=8)
    plain, smooth = model.training_step(full), model.training_step(full, label_smoothing=0.2)
    run = model.free_run(full)
    log_q = torch.log_softmax(run.logits, -1)  # (B, G, V)
    steps = torch.arange(run.packed.gold.shape[1])[None, :] < run.packed.gold_len[:, None]  # active (b, k)
    gold_term = -log_q.gather(-1, run.packed.gold[..., None])[..., 0][steps]  # (K,)
    uniform_term = -log_q.mean(-1)[steps]  # the cross-entropy against a uniform target, (K,)
    torch.testing.assert_close(smooth.loss, (0.8 * gold_term + 0.2 * uniform_term).mean())
    torch.testing.assert_close(plain.loss, gold_term.mean())
    for key in ("window_ce_sum", "window_tokens", "last_ce_sum", "last_correct", "last_tokens"):
        torch.testing.assert_close(getattr(smooth, key), getattr(plain, key))  # the reported numbers stay plain


def test_label_smoothing_towards_a_prior_mixes_gold_with_that_steps_distribution():
    model = make_model(scale=0.5)
    full = make_full(B=4, seed=8)
    run = model.free_run(full)
    n_steps, vocab = run.packed.gold.shape[1], run.logits.shape[-1]
    prior = torch.softmax(torch.randn(N + 1, vocab, generator=torch.Generator().manual_seed(3)), -1)  # (N + 1, V)
    smooth = model.training_step(full, label_smoothing=0.3, smoothing_prior=prior)
    log_q = torch.log_softmax(run.logits, -1)  # (B, G, V)
    active = torch.arange(n_steps)[None, :] < run.packed.gold_len[:, None]  # (B, G)
    gold_term = -log_q.gather(-1, run.packed.gold[..., None])[..., 0][active]  # (K,)
    step_prior = prior[torch.arange(n_steps).clamp(max=N)]  # (G, V): step k's distribution
    prior_term = -(step_prior[None] * log_q).sum(-1)[active]  # (K,)
    torch.testing.assert_close(smooth.loss, (0.7 * gold_term + 0.3 * prior_term).mean())
    uniform = torch.full((N + 1, vocab), 1 / vocab)
    torch.testing.assert_close(  # a uniform prior is the uniform smoothing
        model.training_step(full, label_smoothing=0.3, smoothing_prior=uniform).loss,
        model.training_step(full, label_smoothing=0.3).loss,
    )


def test_copy_smoothing_mixes_gold_with_the_steps_counts_and_a_copy_of_the_windows_context():
    model = make_model(scale=0.5)
    full = make_full(B=4, seed=8)
    full[2, :T] = 0  # a window whose context is all padding: its copy share goes nowhere
    run = model.free_run(full)
    n_steps, vocab = run.packed.gold.shape[1], run.logits.shape[-1]
    copy_mass = torch.linspace(0.1, 0.3, N + 1)  # (N + 1,)
    prior = torch.softmax(torch.randn(N + 1, vocab, generator=torch.Generator().manual_seed(3)), -1)
    prior = prior * (1 - copy_mass[:, None])  # with the copy share, one distribution a step
    smooth = model.training_step(full, label_smoothing=0.3, smoothing_prior=prior, smoothing_copy=copy_mass)
    copy = torch.zeros(len(full), vocab)  # (B, V) copy(v) by hand: v's share of the context's non-padding ids
    for b in range(len(full)):
        ids = [int(i) for i in full[b, :T].flatten() if i != 0]
        for i in ids:
            copy[b, i] += 1 / len(ids)
    step = torch.arange(n_steps).clamp(max=N)  # (G,)
    q = prior[step][None] + copy_mass[step][None, :, None] * copy[:, None, :]  # (B, G, V)
    log_p = torch.log_softmax(run.logits, -1)  # (B, G, V)
    active = torch.arange(n_steps)[None, :] < run.packed.gold_len[:, None]  # (B, G)
    gold_term = -log_p.gather(-1, run.packed.gold[..., None])[..., 0][active]  # (K,)
    target_term = -(q * log_p).sum(-1)[active]  # (K,)
    torch.testing.assert_close(smooth.loss, (0.7 * gold_term + 0.3 * target_term).mean())
    plain = model.training_step(full, label_smoothing=0.3, smoothing_prior=prior)  # the counts alone
    assert not torch.allclose(plain.loss, smooth.loss)
    torch.testing.assert_close(smooth.last_ce_sum, plain.last_ce_sum)  # the reported numbers stay plain


def test_aligned_accuracy_counts_nothing_after_an_early_eos():
    tokens = torch.tensor([[4, 5, EOS, 7, 8, 9], [4, 6, 6, 7, 2, 2]])
    gold = torch.tensor([[4, 5, 6, 7, 8, EOS], [4, 5, 6, EOS, 0, 0]])
    content = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    got = aligned_correct(tokens, gold, content, EOS)
    assert got.long().tolist() == [[1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0]]  # 7 and 8 follow the [EOS]


def test_last_correct_is_the_accuracy_of_greedy_generation_with_early_eos():
    """Gold S(T) is built from the model's own free run, so every slot before its first [EOS] matches and
    the slots after it match too, but only in the free run: greedy decoding has stopped there."""
    for seed in range(20):
        model = make_model(seed=seed, scale=0.5)
        full = make_full(B=8, seed=seed, min_len=N)  # full-length S(T): N + 1 free-running steps
        tokens = model.free_run(full).tokens[:, :N]
        is_eos = tokens == EOS
        early = [b for b in range(8) if is_eos[b].any() and not is_eos[b, -1] and int(tokens[b, -1]) not in (0, BOS)]
        if early:
            break
    assert early, "no seed gave an [EOS] followed by content; the test needs that case"
    gold = tokens.clone()
    gold[(gold == EOS) | (gold == BOS) | (gold == 0)] = 2  # content ids only; the model's own stream
    full[:, -1] = gold
    stats = model.training_step(full)
    assert torch.equal(model.free_run(full).tokens[:, :N], tokens)  # the free run ignores gold
    expected = 0
    for b in range(8):
        for k in range(N):
            if EOS in tokens[b, :k].tolist():
                break
            expected += int(tokens[b, k]) == int(gold[b, k])
    assert int(stats.last_correct) == expected
    assert expected < int(((tokens == gold) & (gold != 0)).sum()), "the naive count would differ here"
    generated = model.generate(full[:, :T])
    assert int(((generated == gold) & (gold != 0)).sum()) == expected


# ----- the KV cache -----
def assert_cached_run_equals_uncached(model, full):
    """Free-running tokens, logits, step statistics and gradients agree with and without the KV cache."""
    cached, plain = model.free_run(full, use_cache=True), model.free_run(full, use_cache=False)
    assert torch.equal(cached.tokens, plain.tokens)
    torch.testing.assert_close(cached.logits, plain.logits, rtol=1e-12, atol=1e-12)
    a, b = model.training_step(full, use_cache=True), model.training_step(full, use_cache=False)
    for field in a._fields:
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=1e-12, atol=1e-12)
    a.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    b.loss.backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)
    return cached


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
def test_cached_and_uncached_free_running_agree(positions):
    model = make_model(scale=0.5, n_layers=3, positions=positions).double()
    assert_cached_run_equals_uncached(model, make_full(B=4, seed=9))


def test_cache_in_float32_training_mode_has_one_dropout_per_position_and_still_trains():
    model = make_model(dropout=0.1).train()
    stats = model.training_step(make_full(B=2, seed=10))
    stats.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_generate_equals_a_naive_uncached_greedy_loop():
    model = make_model(seed=4, scale=0.5)
    window = make_full(B=5, seed=4)[:, :T]
    out = model.generate(window)
    assert out.shape == (5, N)
    prefix, lengths = model.pack_prefix(window)
    for b in range(5):
        seq, content = prefix[b, : int(lengths[b])].tolist(), []
        while len(content) < N:
            nxt = int(model(torch.tensor([seq]))[0, -1].argmax())
            if nxt == EOS:
                break
            content.append(nxt)
            seq.append(nxt)
        assert out[b].tolist() == content + [0] * (N - len(content))
    torch.testing.assert_close(model.generate(window, use_cache=False), out, rtol=0, atol=0)


def test_generate_end_ids_and_banned_ids():
    model = make_model(seed=0, scale=0.5)
    window = make_full(B=4, seed=2)[:, :T]
    free = model.generate(window)
    end = int(free[0, 0])
    cut = model.generate(window, GenerationConfig(end_ids=[end]))
    assert cut[0].tolist() == [end] + [0] * (N - 1)  # the end token is kept, nothing after it
    banned = model.generate(window, GenerationConfig(banned_ids=[end]))
    assert not (banned == end).any()


def test_rollout_slides_the_window_and_packs_it_again():
    model = make_model(seed=4, scale=0.5)
    window = make_full(B=2, seed=11)[:, :T]
    out = model.rollout(window, steps=3)
    assert out.shape == (2, 3, N)
    current = window
    for step in range(3):
        state = model.generate(current, GenerationConfig(banned_ids=[0, BOS]))
        assert torch.equal(out[:, step], state)
        current = torch.cat([current[:, 1:], state[:, None]], dim=1)
    short = model.rollout(window[:, :1], steps=2)  # a window shorter than T grows first
    assert torch.equal(
        short[:, 1],
        model.generate(torch.cat([window[:, :1], short[:, :1]], dim=1), GenerationConfig(banned_ids=[0, BOS])),
    )


# ----- parameter counts at the paper settings (section 8.2, meta device: nothing allocated) -----
def count_on_meta(model_class, config):
    with torch.device("meta"):
        model = model_class(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "H, L, exact, reported", [(2, 2, 175_892_480, 175.9), (4, 2, 175_892_480, 175.9), (4, 3, 226_242_560, 226.2)]
)
def test_baseline_parameter_count_matches_the_paper(H, L, exact, reported):
    config = BaselineConfig(content_vocab_size=36711, d_x=64, d_t=32, n_heads=H, n_layers=L)
    assert config.vocab_size == 36713 and config.d == 2048 and config.d_ff == 8192
    n = count_on_meta(BaselineModel, config)
    d = config.d
    table3 = L * (4 * d * d + 2 * d * config.d_ff) + config.vocab_size * d  # QKV + W_O, MLP, token table
    assert n == exact == table3 + L * (config.d_ff + d + 4 * d) + 2 * d  # + MLP biases, LayerNorms
    assert round(n / 1e6, 1) == reported
    learned = count_on_meta(BaselineModel, BaselineConfig(**{**config.__dict__, "positions": "learned"}))
    assert learned - n == config.max_len * d == 82 * 2048  # why the paper's totals exclude a learned table


@pytest.mark.parametrize(
    "H, L, exact, reported", [(2, 2, 122_180_480, 122.2), (4, 2, 172_512_128, 172.5), (4, 3, 256_416_640, 256.4)]
)
def test_four_tensor_parameter_count_matches_the_paper(H, L, exact, reported):
    n = count_on_meta(FourTensorModel, FourTensorConfig(vocab_size=36711, d_x=64, d_t=32, n_heads=H, n_layers=L))
    assert n == exact
    assert round(n / 1e6, 1) == reported


# ----- config, checkpoints, bad inputs -----
def test_config_round_trip_and_registry_hook():
    config = BaselineConfig(content_vocab_size=40, d_x=8, d_t=4, n_heads=2, positions="learned")
    data = config.to_dict()
    assert data["model_type"] == "baseline" and data["content_vocab_size"] == 40
    assert BaselineConfig.from_dict(data) == config
    assert config.max_len == 1 + 4 * 16 + 16 + 1
    assert BaselineModel.vocab_size_for(Vocabulary(["<pad>", "<unk>", "a", "b"])) == 4
    with pytest.raises(ValueError, match="must divide"):
        BaselineConfig(content_vocab_size=10, d_x=4, d_t=3, n_heads=5)
    with pytest.raises(ValueError, match="padding_idx"):
        BaselineConfig(content_vocab_size=10, padding_idx=10)
    with pytest.raises(ValueError, match="positions"):
        BaselineConfig(content_vocab_size=10, positions="alibi")
    with pytest.raises(ValueError, match="rotary.*default attention"):
        BaselineConfig(content_vocab_size=10, positions="rotary", attention="gqa", n_kv_heads=1)
    with pytest.raises(ValueError, match="even head width"):
        BaselineConfig(content_vocab_size=10, d_x=3, d_t=3, n_heads=3, positions="rotary")


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary"])
def test_checkpoint_round_trip(tmp_path, positions):
    model = make_model(scale=0.5, positions=positions)
    full = make_full(seed=12)
    model.save_pretrained(tmp_path / "ckpt", note="baseline")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["model_type"] == "baseline" and saved["extra"] == {"note": "baseline"}
    loaded = BaselineModel.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    a, b = model.training_step(full), loaded.training_step(full)
    torch.testing.assert_close(a.loss, b.loss)
    assert torch.equal(model.generate(full[:, :T]), loaded.generate(full[:, :T]))


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.zeros(T + 1, N, dtype=torch.long), r"\(B, T\+1, N\).*window\[None\]"),
        (torch.zeros(2, T, N, dtype=torch.long), r"T\+1 = 4 sentences"),
        (torch.zeros(2, T + 1, N + 1, dtype=torch.long), r"shape \(B>=1, 4, 5\)"),
        (torch.full((1, T + 1, N), BOS, dtype=torch.long), rf"id {BOS}, outside the content vocabulary"),
        (torch.full((1, T + 1, N), -1, dtype=torch.long), r"id -1"),
        (torch.zeros(1, T + 1, N), r"integer token ids"),
    ],
)
def test_training_step_names_the_problem_with_bad_windows(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_model().training_step(bad)


def test_forward_generate_and_rollout_reject_bad_inputs():
    model = make_model()
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 15\)"):
        model(torch.tensor([[BOS, V + 2]]))
    with pytest.raises(ValueError, match=r"shape \(B>=1, 1..22\)"):
        model(torch.zeros(1, model.config.max_len + 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 3\]"):
        model.forward_last(torch.tensor([[BOS, 4, 5]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="insert the batch axis"):
        model.generate(torch.zeros(T, N, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(B>=1, 1..3, 5\)"):
        model.generate(torch.zeros(1, T + 1, N, dtype=torch.long))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        model.rollout(torch.zeros(1, T, N, dtype=torch.long), steps=0)


# ----- closed-set readout (world_model.models.decoding) -----
CANDIDATES = torch.tensor([[4, 5, 0, 0, 0], [6, 7, 8, 9, 10], [3, 0, 0, 0, 0], [12, 2, 11, 0, 0]])


def teacher_forced_log_likelihood(model, window_row, sentence) -> torch.Tensor:
    """Independent reference: [BOS] + the window's non-padding ids, then the sentence's non-padding ids and
    [EOS] fed one at a time, each scored by the full causal forward on the sequence so far."""
    seq = [BOS] + [int(t) for t in window_row.flatten() if int(t) != 0]
    total = torch.zeros((), dtype=model.E.weight.dtype)
    for target in [int(t) for t in sentence if int(t) != 0] + [EOS]:
        total = total + model(torch.tensor([seq]))[0, -1].log_softmax(dim=-1)[target]
        seq.append(target)
    return total


def test_score_sentences_equals_a_teacher_forced_loop_ending_in_eos():
    model = make_model(seed=3, scale=0.5).double()
    full = make_full(B=3, seed=13)
    for window in (full[:, :T], full[:, 1:2]):  # a full window and a one-sentence one
        with torch.no_grad():
            scores = model.score_sentences(window, CANDIDATES)
        assert scores.shape == (3, len(CANDIDATES)) and scores.dtype == torch.float64
        for b in range(3):
            for c in range(len(CANDIDATES)):
                with torch.no_grad():
                    ref = teacher_forced_log_likelihood(model, window[b], CANDIDATES[c])
                torch.testing.assert_close(scores[b, c], ref, rtol=1e-10, atol=1e-10)
    # Chunking does not change the scores; padding inside a row is removed as training packing removes it.
    window = full[:, :T]
    torch.testing.assert_close(
        model.score_sentences(window, CANDIDATES, chunk_rows=1),
        model.score_sentences(window, CANDIDATES),
        rtol=1e-12,
        atol=1e-12,
    )
    gappy = torch.tensor([[4, 0, 5, 0, 0], [4, 5, 0, 0, 0]])
    gap_scores = model.score_sentences(window, gappy)
    torch.testing.assert_close(gap_scores[:, 0], gap_scores[:, 1], rtol=1e-12, atol=1e-12)
    # The [EOS] term is part of the score: a sentence is not scored like its own prefix.
    prefix_only = model.score_sentences(window, torch.tensor([[6, 7, 8, 9, 10], [6, 7, 8, 9, 0]]))
    assert not torch.allclose(prefix_only[:, 0], prefix_only[:, 1])


def score_sentences_full_sequences(model, token_ids, candidates, chunk_rows=None) -> torch.Tensor:
    """Reference: the earlier `score_sentences`, which packs every (window, candidate) pair as one full sequence
    [BOS] + window + candidate + [EOS] and runs all B * C of them through the causal stack, prefix included."""
    c = model.config
    cand = candidates.long()
    prefix, prefix_len = model.pack_prefix(token_ids)  # (B, Lp), (B,)
    gold, gold_len = compact(cand, cand != c.padding_idx, c.padding_idx, tail=c.eos_id)  # (C, G), (C,)
    B, C, G = prefix.shape[0], cand.shape[0], gold.shape[1]
    prefix_live = torch.arange(prefix.shape[1])[None, :] < prefix_len[:, None]  # (B, Lp)
    gold_live = torch.arange(G)[None, :] < gold_len[:, None]  # (C, G)
    chunk_rows = chunk_rows or B * C
    steps = torch.arange(G)[None, :]  # (1, G)
    scores = []
    for start in range(0, B * C, chunk_rows):
        flat = torch.arange(start, min(start + chunk_rows, B * C))  # (R,) row b * C + c
        b, k = flat // C, flat % C
        seq, _ = compact(
            torch.cat([prefix[b], gold[k]], dim=1),  # (R, <=L) prefix + span, no gap
            torch.cat([prefix_live[b], gold_live[k]], dim=1),
            c.padding_idx,
        )
        H = model.encode(seq)  # (R, L', d)
        pos = (prefix_len[b][:, None] - 1 + steps).clamp(max=seq.shape[1] - 1)  # (R, G) predicts gold k
        h = H.gather(1, pos[..., None].expand(-1, -1, H.shape[-1]))  # (R, G, d)
        log_probs = F.linear(h, model.E.weight).log_softmax(dim=-1)  # (R, G, V)
        picked = log_probs.gather(-1, gold[k][..., None])[..., 0]  # (R, G)
        scores.append(torch.where(gold_live[k], picked, picked.new_zeros(())).sum(dim=1))
    return torch.cat(scores).view(B, C)


def ragged_candidates(C, seed) -> torch.Tensor:
    """(C, N) content ids with padding gaps inside rows and ragged lengths, at least one content id per row."""
    g = torch.Generator().manual_seed(seed)
    cand = torch.randint(2, V, (C, N), generator=g)
    cand[torch.rand(C, N, generator=g) < 0.4] = 0  # gaps anywhere, trailing padding included
    empty = ~(cand != 0).any(dim=1)
    cand[empty, torch.randint(0, N, (int(empty.sum()),), generator=g)] = 7
    cand[0] = torch.tensor([5, 0, 0, 0, 0])  # the shortest span: one token, then [EOS]
    cand[1] = torch.tensor([2, 3, 4, 5, 6])  # the longest: G = N + 1
    return cand


def test_gold_log_probs_is_the_log_softmax_at_the_gold_ids_with_and_without_autograd():
    """The fused kernel (no autograd, several blocks) and the autograd expression both give log_softmax[gold]."""
    gen = torch.Generator().manual_seed(3)
    n = 2 * default_chunk(torch.empty(0), None) + 5  # two full blocks of the kernel and a ragged one
    states, readout = torch.randn(n, 6, generator=gen) * 3, torch.randn(11, 6, generator=gen)
    gold = torch.randint(0, 11, (n,), generator=gen)
    expected = F.log_softmax(states @ readout.T, dim=-1)[torch.arange(n), gold]
    with torch.no_grad():
        torch.testing.assert_close(gold_log_probs(states, gold, readout), expected)
    readout.requires_grad_(True)
    got = gold_log_probs(states, gold, readout)
    torch.testing.assert_close(got, expected)
    got[:3].sum().backward()
    (reference,) = torch.autograd.grad(
        F.log_softmax(states[:3] @ readout.T, dim=-1)[torch.arange(3), gold[:3]].sum(), readout
    )
    torch.testing.assert_close(readout.grad, reference)


@pytest.mark.parametrize(
    "attention",
    [
        dict(),
        dict(attention="gqa", n_kv_heads=1),
        dict(attention="mla", mla_kv_rank=3),
        dict(attention="tucker", tucker_ranks=(2, 3, 3)),
    ],
)
def test_score_sentences_with_the_prefix_cache_equals_the_full_sequence_reference(attention):
    """Prefilling each window once and running only the candidates' tokens after it gives the scores of
    running every [BOS] + window + candidate + [EOS] sequence in full, for full and short windows, ragged
    candidates, any chunking, and the same gradient."""
    model = make_model(seed=5, scale=0.5, **attention).double()
    full = make_full(B=6, seed=20)
    full[0, :T] = 0  # an all-padding window: the prefix is [BOS] alone
    full[1, :T] = 9  # a window without padding: the longest prefix, 1 + T * N
    cand = ragged_candidates(9, seed=21)
    for window in (full[:, :T], full[:, 1:2], full[:, 2:T]):  # full T' = T and short windows
        with torch.no_grad():
            ref = score_sentences_full_sequences(model, window, cand)
            for chunk_rows in (None, 1, 4, 9, 10, 23, 1000):  # within a window, several windows, all at once
                got = model.score_sentences(window, cand, chunk_rows=chunk_rows)
                assert got.shape == (6, 9)
                torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    window = full[:, :T]
    model.score_sentences(window, cand, chunk_rows=7).sum().backward()
    fast = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    score_sentences_full_sequences(model, window, cand).sum().backward()
    for g, p in zip(fast, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-9, atol=1e-10)
    # float32, as used: the same scores to float tolerance
    model = model.float()
    with torch.no_grad():
        torch.testing.assert_close(
            model.score_sentences(window, cand),
            score_sentences_full_sequences(model, window, cand),
            rtol=1e-5,
            atol=1e-4,
        )


@pytest.mark.parametrize(
    "attention", [dict(), dict(positions="rotary"), dict(attention="mla", mla_kv_rank=3, mla_shared_kv=True)]
)
def test_extend_many_equals_one_token_extends(attention):
    model = make_model(seed=6, scale=0.5, **attention).double()
    prefix, prefix_len = model.pack_prefix(make_full(B=4, seed=22)[:, :T])
    tokens = torch.randint(2, V, (4, 4), generator=torch.Generator().manual_seed(23))
    _, one = model.prefill(prefix, prefix_len)
    _, many = model.prefill(prefix, prefix_len)
    steps = torch.stack([model.extend(one, tokens[:, k]) for k in range(4)], dim=1)
    torch.testing.assert_close(model.extend_many(many, tokens), steps, rtol=1e-12, atol=1e-12)
    assert torch.equal(many.live, one.live) and torch.equal(many.next_pos, one.next_pos)
    for a, b in zip(many.kv, one.kv):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("target_marker", [False, True])
def test_score_sentences_is_the_training_target_log_likelihood_of_the_models_own_free_run(target_marker):
    """Where a candidate is the model's own greedy sentence, teacher forcing and the free run read the same
    tokens, so its score is minus the window cross-entropy of training_step on that window (with the target
    marker too: training, scoring and generation pack the prefix alike)."""
    model = make_model(seed=4, scale=0.5, target_marker=target_marker).double()
    window = make_full(B=5, seed=4)[:, :T]
    own = model.generate(window)
    for b in range(5):
        if not (own[b] != 0).any():
            continue
        full = torch.cat([window[b : b + 1], own[b : b + 1, None]], dim=1)  # (1, T+1, N), S(T) = own sentence
        stats = model.training_step(full)
        score = model.score_sentences(window[b : b + 1], own[b : b + 1])
        torch.testing.assert_close(score[0, 0], -stats.window_ce_sum, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("target_marker", [False, True])
def test_teacher_forced_last_ce_equals_a_naive_loop_and_the_free_run_on_the_models_own_sentence(target_marker):
    model = make_model(seed=4, scale=0.5, target_marker=target_marker).double()
    full = make_full(B=4, seed=21)
    ce, count = model.teacher_forced_last_ce(full)
    per_token, content = model.teacher_forced_ce(full)  # (B, G) each
    ref = torch.zeros_like(per_token)
    for b in range(4):  # one full forward pass per gold token: prefix + the gold tokens before it
        prefix = model.pack_prefix(full[b : b + 1, :T])[0][0].tolist()
        gold = [t for t in full[b, T].tolist() if t != 0]
        assert content[b].tolist() == [k < len(gold) for k in range(content.shape[1])]
        for k, token in enumerate(gold):
            logits = model(torch.tensor([prefix + gold[:k]]))[0, -1]
            ref[b, k] = -logits.log_softmax(-1)[token]
    torch.testing.assert_close(per_token, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ce, ref.sum(), rtol=1e-10, atol=1e-10)
    assert int(count) == int(content.sum())
    # Where gold S(T) is the model's own greedy sentence, free running reads exactly the gold tokens.
    window = make_full(B=5, seed=4)[:, :T]
    own = model.generate(window)
    rows = (own != 0).any(dim=1)
    own_full = torch.cat([window, own[:, None]], dim=1)[rows]
    torch.testing.assert_close(
        model.teacher_forced_last_ce(own_full)[0], model.training_step(own_full).last_ce_sum, rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("target_marker", [False, True])
def test_last_end_cost_is_what_l_s4_loses_to_the_eos_mass_of_the_free_run(target_marker):
    model = make_model(seed=5, scale=0.5, target_marker=target_marker).double()
    full = make_full(B=4, seed=23)
    cost, count = model.last_end_cost(full)
    stats = model.training_step(full)
    assert int(count) == int(stats.last_tokens) and float(cost) > 0
    # L_S(T) less the cost is the cross-entropy under the step distributions with [EOS] taken out
    run = model.free_run(full)
    without_eos = run.logits.clone()
    without_eos[..., model.config.eos_id] = float("-inf")
    content = (run.packed.gold != model.config.eos_id) & (
        torch.arange(run.packed.gold.shape[1])[None, :] < run.packed.gold_len[:, None]
    )
    ce = F.cross_entropy(without_eos[content], run.packed.gold[content], reduction="sum")
    torch.testing.assert_close(stats.last_ce_sum - cost, ce, rtol=1e-10, atol=1e-10)


def test_generate_with_one_candidate_returns_it_for_every_row():
    model = make_model(seed=1, scale=0.5)
    window = make_full(B=4, seed=14)[:, :T]
    one = CANDIDATES[1:2]
    assert torch.equal(model.generate(window, candidates=one), one.expand(4, N))
    g = torch.Generator().manual_seed(0)
    assert torch.equal(model.generate(window, GenerationConfig(temperature=1.0), g, candidates=one), one.expand(4, N))


def test_generate_with_candidates_takes_the_argmax_of_score_sentences():
    model = make_model(seed=0, scale=0.5)
    window = make_full(B=6, seed=15)[:, :T]
    own = model.generate(window, GenerationConfig(banned_ids=[0, BOS]))
    own = own[(own != 0).any(dim=1)]  # the model's own greedy sentences, plus random others
    others = make_full(B=4, seed=16, min_len=1)[:, 0]
    candidates = torch.cat([own, others])
    scores = model.score_sentences(window, candidates)
    chosen = model.generate(window, candidates=candidates)
    assert torch.equal(chosen, candidates[scores.argmax(dim=1)])
    assert len({tuple(r) for r in chosen.tolist()}) > 1, "the test wants rows that choose differently"
    # banned_ids and end_ids do not apply to the closed-set readout
    assert torch.equal(
        model.generate(window, GenerationConfig(banned_ids=[4, 5], end_ids=[6]), candidates=candidates), chosen
    )
    # top_k = 1 sampling is the argmax
    g = torch.Generator().manual_seed(2)
    assert torch.equal(
        model.generate(window, GenerationConfig(temperature=1.0, top_k=1), g, candidates=candidates), chosen
    )


def test_generate_sampling_over_candidates_is_reproducible_and_closed():
    model = make_model(seed=2, scale=0.5)
    window = make_full(B=50, seed=17)[:, :T]
    rows = {tuple(r) for r in CANDIDATES.tolist()}

    def sample(seed):
        g = torch.Generator().manual_seed(seed)
        return model.generate(window, GenerationConfig(temperature=5.0), g, candidates=CANDIDATES)

    a, b, other = sample(7), sample(7), sample(8)
    assert torch.equal(a, b)
    assert not torch.equal(a, other)
    for out in (a, other):
        assert out.shape == (50, N) and {tuple(r) for r in out.tolist()} <= rows
    assert len({tuple(r) for r in a.tolist()}) > 1  # hot sampling visits several candidates


def test_rollout_with_candidates_stays_in_the_set_and_slides_the_window():
    model = make_model(seed=4, scale=0.5)
    window = make_full(B=3, seed=18)[:, :T]
    rows = {tuple(r) for r in CANDIDATES.tolist()}
    out = model.rollout(window, 4, GenerationConfig(banned_ids=[3]), candidates=CANDIDATES)
    assert out.shape == (3, 4, N)
    assert all(tuple(r) in rows for r in out.reshape(-1, N).tolist())
    current = window
    for step in range(4):
        state = model.generate(current, candidates=CANDIDATES)
        assert torch.equal(out[:, step], state)
        current = torch.cat([current[:, 1:], state[:, None]], dim=1)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    hot = dict(generation=GenerationConfig(temperature=5.0), candidates=CANDIDATES)
    s1 = model.rollout(window, steps=3, generator=g1, **hot)
    assert torch.equal(s1, model.rollout(window, steps=3, generator=g2, **hot))
    assert all(tuple(r) in rows for r in s1.reshape(-1, N).tolist())


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.zeros(2, N + 1, dtype=torch.long) + 3, r"candidates must be \(C, N=5\)"),
        (torch.tensor([3, 4, 0, 0, 0]), r"candidates must be \(C, N=5\)"),
        (torch.zeros(0, N, dtype=torch.long), r"C >= 1"),
        (torch.tensor([[4, 5, 0, 0, 0], [0, 0, 0, 0, 0]]), r"row\(s\) \[1\] hold only padding"),
        (torch.tensor([[4, V, 0, 0, 0]]), rf"candidate ids must lie in \[0, {V}\)"),
        (torch.tensor([[4, BOS, 0, 0, 0]]), rf"candidate ids must lie in \[0, {V}\)"),
        (torch.tensor([[4, -1, 0, 0, 0]]), r"candidate ids must lie"),
        (torch.tensor([[4.0, 5.0, 0, 0, 0]]), r"integer token ids"),
    ],
)
def test_bad_candidates_are_rejected_with_the_problem_named(bad, message):
    model = make_model()
    window = make_full(B=2, seed=19)[:, :T]
    with pytest.raises(ValueError, match=message):
        model.score_sentences(window, bad)
    with pytest.raises(ValueError, match=message):
        model.generate(window, candidates=bad)
    with pytest.raises(ValueError, match=message):
        model.rollout(window, steps=2, candidates=bad)


def test_score_sentences_checks_the_window():
    model = make_model()
    with pytest.raises(ValueError, match="insert the batch axis"):
        model.score_sentences(torch.zeros(T, N, dtype=torch.long), CANDIDATES)
    with pytest.raises(ValueError, match=r"shape \(B>=1, 1..3, 5\)"):
        model.score_sentences(torch.zeros(1, T + 1, N, dtype=torch.long), CANDIDATES)
    with pytest.raises(ValueError, match="chunk_rows"):
        model.score_sentences(torch.zeros(1, T, N, dtype=torch.long), CANDIDATES, chunk_rows=0)

"""Cached decoding of the flat baseline: the per-layer KV cache of right-padded prefixes and the free-running
loop over it (`CachedDecoding`, a mixin of `world_model.models.baseline.BaselineModel`).

Shapes: B batch, Lp prefix length, Lk cached key length, K tokens fed in one pass, V output table, d width,
H heads.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from world_model.models.generation_config import sample_ids


class KVCache:
    """The cached per-token quantities of every layer for right-padded prefixes plus the tokens fed after them.

    Per layer this is (K, V) (B, H, Lk, d / H) for the default attention, else the family layer's cache,
    a tuple of (B, Lk, c_k) tensors (K and V for mha/gqa, the latents for mla, k~ and v~ for tucker).

    The prefix block keeps its padding columns (masked by `live`); tokens fed later are appended as
    new columns for every row at once, so each row's sequence is prefix[:len] + fed tokens, with positions
    continuing from its own prefix length.
    """

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]], live: torch.Tensor, next_pos: torch.Tensor):
        self.kv = kv  # per layer: the attention's cache tuple (see above)
        self.live = live  # (B, Lk) True at real keys
        self.next_pos = next_pos  # (B,) position of the next token fed

    def select(self, rows: torch.Tensor) -> "KVCache":
        """A new cache of the given rows (R,) of this one (repeats allowed), e.g. one copy per candidate."""
        kv = [tuple(t[rows] for t in layer) for layer in self.kv]  # every cached tensor is batch-first
        return KVCache(kv, self.live[rows], self.next_pos[rows])


class CachedDecoding:
    """Prefill, extension and the free-running loop of a model with `config`, `E`, `blocks`, `final_norm`,
    `embed`, `check_sequence` and `forward_last` (the baseline)."""

    # ----- KV cache -----
    def prefill(self, prefix: torch.Tensor, prefix_len: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
        """Right-padded prefixes (B, Lp) -> logits (B, V) at their last live position, and the cache."""
        self.check_sequence(prefix, prefix_len)
        prefix, prefix_len = prefix.long(), prefix_len.long()
        Lp = prefix.shape[1]
        x, rotary = self.embed(prefix, torch.arange(Lp, device=prefix.device))
        kv = []
        for block in self.blocks:
            x, layer_kv = block(x, positions=rotary)
            kv.append(layer_kv)
        rows = torch.arange(prefix.shape[0], device=prefix.device)
        h = self.final_norm(x[rows, prefix_len - 1])  # (B, d)
        live = torch.arange(Lp, device=prefix.device)[None, :] < prefix_len[:, None]  # (B, Lp)
        return F.linear(h, self.E.weight), KVCache(kv, live, prefix_len.clone())

    def extend(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (B,) at each row's next position -> its logits (B, V); grows `cache`."""
        return self.extend_many(cache, tokens[:, None])[:, 0]

    def extend_many(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed K tokens per row (B, K) at each row's next K positions in one causal pass -> their logits
        (B, K, V), logits[:, k] predicting the token after tokens[:, k]; grows `cache` by K columns.

        Token k of a row sees the row's live cached keys and its own tokens 0..k, exactly as K calls of
        `extend` would, at positions next_pos .. next_pos + K - 1.
        """
        return F.linear(self.extend_hidden(cache, tokens), self.E.weight)

    def extend_hidden(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """`extend_many` before the readout: the final-normed states (B, K, d) whose logits it returns."""
        B, K = tokens.shape
        if int(cache.next_pos.max()) + K > self.config.max_len:
            raise ValueError(f"the sequence would pass max_len = {self.config.max_len}")
        steps = torch.arange(K, device=tokens.device)
        x, rotary = self.embed(tokens.long(), cache.next_pos[:, None] + steps)  # (B, K, d)
        causal = steps[:, None] >= steps[None, :]  # (K, K) token k sees tokens 0..k
        mask = torch.cat(
            [
                cache.live[:, None, None, :].expand(B, 1, K, -1),  # (B, 1, K, Lk + K)
                causal.expand(B, 1, K, K),
            ],
            dim=-1,
        )
        for i, block in enumerate(self.blocks):
            x, cache.kv[i] = block(x, cache.kv[i], mask, rotary)
        cache.live = torch.cat([cache.live, cache.live.new_ones(B, K)], dim=1)
        cache.next_pos = cache.next_pos + K
        return self.final_norm(x)

    def decode(
        self,
        prefix: torch.Tensor,
        prefix_len: torch.Tensor,
        steps: int,
        pick: Callable[[torch.Tensor], torch.Tensor] = sample_ids,
        done: Callable[[torch.Tensor], bool] | None = None,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Free-running loop from right-padded prefixes: logits (B, K, V) and appended tokens (B, K), K <= steps.

        At step k the logits of each row's last live position choose a token (`pick`, argmax by default),
        which is appended, detached, before step k + 1. Every row advances; callers mask rows they are done
        with. `done(tokens so far)` ends the loop early. Without the cache, each step reruns the full
        causal forward on the grown ids: the same function, for tests.
        """
        if use_cache:
            logits, cache = self.prefill(prefix, prefix_len)
        else:
            ids = torch.cat([prefix.long(), prefix.new_full((prefix.shape[0], steps), self.config.padding_idx)], dim=1)
            lengths = prefix_len.long().clone()
            logits = self.forward_last(ids[:, : int(lengths.max())], lengths)
        rows = torch.arange(prefix.shape[0], device=prefix.device)
        all_logits, tokens = [], []
        for k in range(steps):
            all_logits.append(logits)
            tokens.append(pick(logits).detach())  # the discrete choice passes no gradient
            if k + 1 == steps or (done is not None and done(torch.stack(tokens, dim=1))):
                break
            if use_cache:
                logits = self.extend(cache, tokens[-1])
            else:
                ids = ids.index_put((rows, lengths), tokens[-1])  # out of place: autograd saved the old ids
                lengths = lengths + 1
                logits = self.forward_last(ids[:, : int(lengths.max())], lengths)
        return torch.stack(all_logits, dim=1), torch.stack(tokens, dim=1)

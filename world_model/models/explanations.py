"""Why a predicted state, and how sure: what one rollout step shows beside its choice.

A `StepExplanation` holds, for each window b of a batch of B (axis names as in `world_model.models.four_tensor`;
K alternatives):

- `probability` (B,): the chosen state's probability under the readout.
  Closed-set readouts (known sentences, sentence bank): the softmax, over the candidate sentences, of the scores the
  readout ranks them by (temperature 1, whatever temperature made the choice; a sentence the readout excludes has
  probability 0). Tokens readout: the product, over the chosen sentence's content slots, of each slot's probability
  under its own distribution (padding, the unknown word and banned ids removed): the probability of these words in
  these slots among all sentences of the same length.
- `draw_probability` (B,) or None: when the state was sampled (temperature > 0), the probability with which it was
  drawn at that temperature and top_k (`world_model.models.generation_config.draw_probability`): over the candidate
  sentences for closed-set readouts; the product over the content slots of each slot's draw probability for the
  tokens readout. None for a greedy choice, which is certain.
- `alternatives` (B, K, N) and `alternative_probabilities` (B, K): the K likeliest other states, likeliest first, on
  the same measure. Tokens readout: the chosen sentence with one content slot changed to another word (never an end
  token, and never at the end token), so that each alternative keeps the chosen sentence's length; the chosen state
  and its alternatives are distinct sentences of one length, and their probabilities sum to at most 1.
- `slice_mass` (B, T) or None: where the attention went, per slice t' of the window (oldest first). For each layer,
  head and query slot (x, T-1) of the last slice (the slots that read out the next state), the attention weights on
  the keys (x', t') are summed over x', giving a distribution over the T slices; these are averaged with equal
  weight over layers, heads and the query slots x where the chosen state has a word (all N slots when it has
  none). Every attention row sums to 1, so `slice_mass` does too. None for a model without the 4-tensor attention.
- `copy_gate`, `copy_mass`, `copy_share` (B, N) or None, for a model with the copy path
  (`world_model.models.copy_path`): at each slot of the chosen state, the gate g, the pointer's mass m on the
  window's tokens equal to the chosen word, and the share g * m / p(word) of the word's probability that came
  through the pointer (0 at padding slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALTERNATIVES = 3  # runner-up states per step, unless told otherwise


@dataclass
class StepExplanation:
    """One rollout step's explanation for a batch of B windows; see the module docstring for each field."""

    probability: torch.Tensor  # (B,)
    alternatives: torch.Tensor  # (B, K, N) token ids
    alternative_probabilities: torch.Tensor  # (B, K), descending
    slice_mass: torch.Tensor | None = None  # (B, T)
    copy_gate: torch.Tensor | None = None  # (B, N)
    copy_mass: torch.Tensor | None = None  # (B, N)
    copy_share: torch.Tensor | None = None  # (B, N)
    draw_probability: torch.Tensor | None = None  # (B,), when sampled

    def split(self, parts: int, lengths: list[int] | None = None) -> list["StepExplanation"]:
        """An explanation of `parts` steps stacked along the batch axis (steps * B rows, step-major) -> one per step;
        with `lengths`, each step's slice_mass keeps its last lengths[i] slices (its own window's)."""
        chunks = {k: None if v is None else v.chunk(parts) for k, v in vars(self).items()}
        steps = [StepExplanation(**{k: None if v is None else v[i] for k, v in chunks.items()}) for i in range(parts)]
        if lengths is not None and self.slice_mass is not None:
            for step, t in zip(steps, lengths):
                step.slice_mass = step.slice_mass[:, step.slice_mass.shape[1] - t :]
        return steps

    def row(self, b: int) -> dict:
        """Window b as plain Python: {"probability", "draw_probability" | None, "alternatives" [(ids list, p)],
        "slice_mass" list | None, "copy" {"gate", "mass", "share"} lists | None}."""
        alternatives = [
            (ids.tolist(), float(p)) for ids, p in zip(self.alternatives[b], self.alternative_probabilities[b])
        ]
        copy = None
        if self.copy_gate is not None:
            copy = {
                "gate": self.copy_gate[b].tolist(),
                "mass": self.copy_mass[b].tolist(),
                "share": self.copy_share[b].tolist(),
            }
        return {
            "probability": float(self.probability[b]),
            "draw_probability": None if self.draw_probability is None else float(self.draw_probability[b]),
            "alternatives": alternatives,
            "slice_mass": None if self.slice_mass is None else self.slice_mass[b].tolist(),
            "copy": copy,
        }


class LastSliceProbe:
    """While entered (with `active`), records what the forward passes of `model` show about their last slice, one
    pass per rollout step: each 4-tensor attention layer's attention logits (before scaling) of the last slice's
    queries (B, H, N, N*T) with the pad_mask (B, N, T), pass by pass and layer by layer within a pass
    (`FourTensorAttention.last_slice_probe`), and the copy path's output of each pass (log g, log(1 - g), pointer,
    key ids; `CopyPath.forward`) when the model has one. The weights are formed when asked for (`weights`), once
    for every pass, whatever the lengths of their windows. Inactive, it does nothing."""

    def __init__(self, model, active: bool = True):
        self.model, self.active = model, active
        self.records: list[tuple[torch.Tensor, torch.Tensor]] = []  # (qk, pad_mask): pass-major, then layer
        self.layers = 0  # attention layers per pass
        self.scale = 1.0  # the attention's score scale, 1 / sqrt(d)
        self.copies: list[tuple[torch.Tensor, ...]] = []  # the copy path's output, one per pass
        self._hook = None

    def _attentions(self) -> list:
        return self.model.attention_modules() if self.model.explains else []

    def __enter__(self) -> "LastSliceProbe":
        if self.active:
            attentions = self._attentions()
            for attention in attentions:
                attention.last_slice_probe = self.records  # every layer appends to the one list, in order
                self.scale = attention.scale
            self.layers = len(attentions)
            pointer = self.model.pointer if self.model.explains else None
            if pointer is not None:
                self._hook = pointer.register_forward_hook(self._keep_copy)
        return self

    def _keep_copy(self, module, inputs, output) -> None:
        self.copies.append(output)

    def __exit__(self, *exc) -> None:
        if self.active:
            for attention in self._attentions():
                attention.last_slice_probe = None
            if self._hook is not None:
                self._hook.remove()

    @property
    def lengths(self) -> list[int]:
        """The window length T of each pass watched."""
        return [pad.shape[-1] for _, pad in self.records[:: self.layers]] if self.layers else []

    def weights(self) -> torch.Tensor | None:
        """The last slice's attention weights of every pass and layer, (S, L, B, H, N, N, T) with T the longest
        window's: keys at (x', t'), each window right-aligned (a window of T_s slices holds t' >= T - T_s; the
        slices before it weigh 0). None when no attention was recorded.

        For a pass, equal to `FourTensorAttention.attention_weights`[:, :, :, T-1] in both variants: every slice
        t' <= T-1 is visible to the last slice, so the temporal-causal bias reduces to the key padding mask there,
        and a window whose keys are all padding gets the uniform distribution over its own keys in both."""
        if not self.records:
            return None
        qk, pad = self.records[0]
        B, H, N, _ = qk.shape
        T = max(self.lengths)
        if all(p.shape[-1] == T for _, p in self.records):  # one window length: no alignment needed
            scores = torch.stack([s for s, _ in self.records]).view(-1, B, H, N, N, T)
            keys_pad = torch.stack([p for _, p in self.records]).view(-1, B, 1, 1, N, T)
        else:  # slices missing from a shorter window get -inf: weight 0, even where all live keys are padding
            scores = qk.new_full((len(self.records), B, H, N, N, T), float("-inf"))
            keys_pad = torch.zeros((len(self.records), B, 1, 1, N, T), dtype=torch.bool, device=qk.device)
            for i, (s, p) in enumerate(self.records):
                t = p.shape[-1]
                scores[i, ..., T - t :] = s.view(B, H, N, N, t)
                keys_pad[i, :, 0, 0, :, T - t :] = p
        bias = torch.zeros(keys_pad.shape, device=keys_pad.device).masked_fill_(
            keys_pad, torch.finfo(torch.float32).min
        )
        weights = (scores.float() * self.scale + bias).flatten(-2).softmax(dim=-1)  # score + finfo.min = finfo.min
        return weights.view(-1, self.layers, B, H, N, N, T)

    def attribution(self, state: torch.Tensor, log_probs: torch.Tensor, padding_idx: int) -> dict:
        """`StepExplanation`'s slice_mass and copy fields for the chosen states of every pass (S*B, N), pass-major,
        given the per-slot log-probabilities (S*B, N, V) they were read off. slice_mass is (S*B, T) for the longest
        window's T, right-aligned (`weights`); `StepExplanation.split` trims each pass's to its own window."""
        content = state != padding_idx  # (S*B, N)
        weights = self.weights()
        fields = {"slice_mass": None if weights is None else slice_mass(weights, content)}
        if self.copies:
            parts = zip(
                state.chunk(len(self.copies)), log_probs.chunk(len(self.copies)), content.chunk(len(self.copies))
            )
            per_pass = [copy_attribution(copy, *part) for copy, part in zip(self.copies, parts)]
            fields.update({k: torch.cat([p[k] for p in per_pass]) for k in per_pass[0]})
        return fields


def slice_mass(weights: torch.Tensor, query_slots: torch.Tensor) -> torch.Tensor:
    """Attention mass per window slice: the last slice's weights of S passes in L layers (S, L, B, H, N, N, T), keys
    at (x', t'), and the query slots to average over (S*B, N) bool -> (S*B, T), each row summing to 1 (see the
    module docstring)."""
    S, L, B, H, N, _, T = weights.shape
    w = query_slots.float().view(S, B, N)
    w = w + (w.sum(dim=-1, keepdim=True) == 0)  # no word: every slot
    w = w / (w.sum(dim=-1, keepdim=True) * L * H)  # the mean over layers, heads and the query slots
    rows = weights.transpose(1, 2).reshape(S * B, L * H * N, N * T)  # a view when B = 1
    w = w.view(S * B, 1, 1, N).expand(S * B, L, H, N).reshape(S * B, 1, L * H * N)
    return (w @ rows).view(S * B, N, T).sum(dim=1)  # summed over the key slots x


def copy_attribution(
    copy: tuple[torch.Tensor, ...], state: torch.Tensor, log_probs: torch.Tensor, content: torch.Tensor
) -> dict:
    """copy_gate, copy_mass and copy_share (B, N) of the chosen states (B, N) from the copy path's output over all
    N*T positions (log g (B, NT), log(1 - g), pointer (B, NT, NT), key ids (B, NT)), the last slice's rows being
    x * T + T - 1; `log_probs` (B, N, V) give p(word); padding slots get 0."""
    log_gate, _, pointer, key_ids = copy
    N = state.shape[1]
    T = key_ids.shape[1] // N
    rows = torch.arange(N, device=state.device) * T + T - 1
    gate = log_gate[:, rows].exp()  # (B, N)
    same_word = key_ids[:, None, :] == state[:, :, None]  # (B, N, NT)
    mass = (pointer[:, rows] * same_word).sum(dim=-1)  # (B, N)
    p_word = log_probs.float().gather(-1, state[..., None])[..., 0].exp()  # (B, N)
    share = (gate * mass / p_word.clamp_min(1e-30)).clamp(max=1.0)
    zero = torch.zeros_like(gate)
    return {
        "copy_gate": torch.where(content, gate, zero),
        "copy_mass": torch.where(content, mass, zero),
        "copy_share": torch.where(content, share, zero),
    }


def closed_set_choice(
    scores: torch.Tensor, chosen: torch.Tensor, k: int = ALTERNATIVES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A choice among C candidates: scores (B, C) (-inf for excluded ones), the chosen rows (B,) ->
    (probability of the chosen (B,), rows of the K = min(k, C - 1) likeliest others (B, K), their probabilities
    (B, K) descending), probabilities being softmax(scores)."""
    probs = scores.float().softmax(dim=-1)  # (B, C)
    chosen = chosen.to(probs.device).long()
    p_chosen = probs.gather(1, chosen[:, None])[:, 0]
    others = probs.scatter(1, chosen[:, None], -1.0)  # the chosen row sorts last
    top = others.topk(min(k, probs.shape[1] - 1), dim=1)
    return p_chosen, top.indices, top.values


def token_choice(
    log_probs: torch.Tensor, state: torch.Tensor, padding_idx: int, end_ids: tuple[int, ...] = (), k: int = ALTERNATIVES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sentence read off slot by slot: per-slot log-probabilities (B, N, V) (-inf at excluded ids), the chosen
    states (B, N) -> (probability (B,), alternatives (B, K, N), their probabilities (B, K) descending), as the module
    docstring defines them for the tokens readout; K = k unless fewer one-slot changes exist."""
    B, N, V = log_probs.shape
    log_probs = log_probs.float()
    content = state != padding_idx  # (B, N)
    picked = log_probs.gather(-1, state[..., None])[..., 0]  # (B, N)
    log_p = picked.masked_fill(~content, 0.0).sum(dim=1)  # (B,)
    gain = log_probs - picked[..., None]  # (B, N, V): change of log p when slot n takes word v
    ends = torch.tensor(end_ids, dtype=torch.long, device=state.device)
    fixed = ~content | torch.isin(state, ends)  # slots that keep their token
    gain = gain.masked_fill(fixed[..., None], float("-inf"))
    gain[..., ends] = float("-inf")
    gain = gain.scatter(-1, state[..., None], float("-inf"))  # the chosen word is no alternative
    top = gain.view(B, N * V).topk(min(k, N * V), dim=1)
    live = torch.isfinite(top.values)  # (B, K')
    K = int(live.sum(dim=1).min())
    slot, word = top.indices[:, :K] // V, top.indices[:, :K] % V  # (B, K)
    alternatives = state[:, None, :].repeat(1, K, 1)
    alternatives.scatter_(2, slot[..., None], word[..., None])
    return log_p.exp(), alternatives, (log_p[:, None] + top.values[:, :K]).exp()

"""Hyper-parameters of the 4-tensor predictor (`world_model.models.four_tensor`).

Axis names: T sentences in the window, N token slots per sentence, V vocabulary, d_x semantic fiber,
d_t temporal-context fiber, d = d_x * d_t, H heads; (r_m, r_p, r_n, r_q) the Tucker ranks of the Q, K, V weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class FourTensorConfig:
    """Hyper-parameters of the 4-tensor predictor (defaults: the CPU-sized preset)."""

    vocab_size: int
    d_x: int = 16
    d_t: int = 8
    n_heads: int = 4
    n_layers: int = 2
    n_tokens: int = 16  # N, token slots per sentence
    n_states: int = 4  # T, sentences in the input window
    dropout: float = 0.1
    padding_idx: int = 0
    unknown_idx: int | None = 1  # the unknown word: zero, frozen rows (position only, content-free)
    attention: str = "fused"  # "fused" (scaled_dot_product_attention) or "reference" (explicit scores)
    # Form of the Q, K, V weights W[m, p, n, q]: "dense" (one (d_x d_t)^2 map per head and map) or "tucker"
    # (W = G x_m A x_p B x_n C x_q D, see FourTensorAttention). tucker_ranks = (r_m, r_p, r_n, r_q), with
    # r_m, r_n <= d_x and r_p, r_q <= d_t, is required in tucker form and must be None in dense form.
    qkv_form: str = "dense"
    tucker_ranks: tuple[int, int, int, int] | None = None
    tucker_shared_factors: bool = False  # one A, B, C, D for every head and map (True) or one set per head and map
    # Opt-in variants (not in the paper; the defaults are the paper's model):
    temporal_causal: bool = False  # slice t attends only to slices <= t, so every target is a genuine next state
    copy_path: bool = False  # a learned pointer mixture over the window's earlier tokens (CopyPath)
    copy_dim: int = 32  # width of the copy path's query and key projections

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_x", "d_t", "n_heads", "n_layers", "n_tokens", "n_states"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"FourTensorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.padding_idx < self.vocab_size:
            raise ValueError(f"padding_idx {self.padding_idx} is outside the vocabulary of size {self.vocab_size}")
        if self.unknown_idx is not None and not (
            0 <= self.unknown_idx < self.vocab_size and self.unknown_idx != self.padding_idx
        ):
            raise ValueError(f"unknown_idx {self.unknown_idx} must be a vocabulary id other than padding_idx")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1], got {self.dropout}")
        if self.attention not in ("fused", "reference"):
            raise ValueError(f"attention must be 'fused' or 'reference', got {self.attention!r}")
        if self.qkv_form not in ("dense", "tucker"):
            raise ValueError(f"qkv_form must be 'dense' or 'tucker', got {self.qkv_form!r}")
        for flag in ("tucker_shared_factors", "temporal_causal", "copy_path"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if int(self.copy_dim) < 1:
            raise ValueError(f"FourTensorConfig.copy_dim must be >= 1, got {self.copy_dim}")
        self._check_qkv_form()

    def _check_qkv_form(self) -> None:
        """tucker_ranks and tucker_shared_factors only in tucker form; there, four ranks within the fibers."""
        if self.qkv_form == "dense":
            if self.tucker_ranks is not None:
                raise ValueError(
                    f"tucker_ranks {self.tucker_ranks!r} given with qkv_form='dense'; set qkv_form='tucker' or drop them"
                )
            if self.tucker_shared_factors:
                raise ValueError("tucker_shared_factors=True needs qkv_form='tucker'")
            return
        ranks = self.tucker_ranks
        if ranks is None:
            raise ValueError("qkv_form='tucker' needs tucker_ranks = (r_m, r_p, r_n, r_q)")
        if (
            not isinstance(ranks, (tuple, list))
            or len(ranks) != 4
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks)
        ):
            raise ValueError(f"tucker_ranks must be four integers (r_m, r_p, r_n, r_q), got {ranks!r}")
        self.tucker_ranks = tuple(ranks)  # JSON hands back a list
        for name, r, limit, fiber in zip(
            ("r_m", "r_p", "r_n", "r_q"),
            self.tucker_ranks,
            (self.d_x, self.d_t, self.d_x, self.d_t),
            ("d_x", "d_t", "d_x", "d_t"),
        ):
            if not 1 <= r <= limit:
                raise ValueError(
                    f"tucker rank {name} = {r} must lie in [1, {fiber} = {limit}] (tucker_ranks {self.tucker_ranks})"
                )

    @property
    def d(self) -> int:
        """Width of the flattened fiber pair, d_x * d_t."""
        return self.d_x * self.d_t

    @property
    def d_ff(self) -> int:
        """MLP hidden width, 4 * d_x * d_t (section 3.3)."""
        return 4 * self.d

    def to_dict(self) -> dict:
        return {"model_type": "four_tensor", **asdict(self)}

    @classmethod
    def from_vocabulary(cls, vocab_size: int, **hyper) -> "FourTensorConfig":
        """The config for a vocabulary of `vocab_size` ids (the table size) and the given hyper-parameters."""
        return cls(vocab_size=vocab_size, **hyper)

    @classmethod
    def from_dict(cls, data: dict) -> "FourTensorConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

"""Configuration of one layer of the 1-D attention family (`world_model.models.attention_family`).

Paper notation: d_model, n_H query heads of width d_H, n_KV key/value heads (GQA), d_c latent widths (MLA),
(r_1, r_2, r_3) and (r~_1, r~_2, r~_3) the Tucker ranks of W and W~; r_Q, r_K, r_V the ranks of the reference
listing's form (`tucker_listing`: a factor d -> r and a core r -> n_H d_H for each of Q, K and V).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

KINDS = ("mha", "gqa", "mla", "tucker", "tucker_listing")


@dataclass
class AttentionConfig:
    """Hyper-parameters of one attention layer of the family (paper notation in the comments)."""

    d_model: int  # d_model
    n_heads: int  # n_H, query heads
    head_dim: int | None = None  # d_H (default d_model // n_heads); sets the softmax scale 1/sqrt(d_H) for every kind
    kind: str = "mha"  # "mha" | "gqa" | "mla" | "tucker" | "tucker_listing"
    n_kv_heads: int | None = None  # n_KV for GQA (1 = MQA); forced to n_heads for MHA
    mla_q_rank: int | None = None  # d_c^Q, the query latent; None = full-rank query map d -> n_H d_H
    mla_kv_rank: int | None = None  # d_c = d_c^K = d_c^V, the key/value latent width
    mla_shared_kv: bool = False  # one latent c_KV for keys and values (else separate c_K, c_V)
    tucker_ranks: tuple[int, int, int] | None = None  # (r_1, r_2, r_3) of W: head, query, key
    tucker_ranks_out: tuple[int, int, int] | None = (
        None  # (r~_1, r~_2, r~_3) of W~: head, value, output; None = tucker_ranks
    )
    listing_ranks: tuple[int, int, int] | None = None  # tucker_listing only: (r_Q, r_K, r_V); None = (d, d/2, d/2)
    causal: bool = True  # True: decoder (causal mask); False: encoder (full attention)
    bitlinear: bool = False  # ternary BitLinear for every nn.Linear projection
    bias: bool = False  # projections carry no bias (the Table 1 counts assume none)
    dropout: float = 0.0  # dropout on attention weights (training only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"n_heads {self.n_heads} must divide d_model {self.d_model} when head_dim is not given"
                )
            self.head_dim = self.d_model // self.n_heads
        if self.bias:
            raise ValueError("bias=True is not supported: the family is bias-free, as Table 1 counts it")
        for name in ("d_model", "n_heads", "head_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"AttentionConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.kind == "mha":
            self.n_kv_heads = self.n_heads
        elif self.kind == "gqa":
            if self.n_kv_heads is None or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
                raise ValueError(f"gqa needs n_kv_heads >= 1 dividing n_heads {self.n_heads}, got {self.n_kv_heads}")
        elif self.kind == "mla":
            if self.mla_kv_rank is None or self.mla_kv_rank < 1:
                raise ValueError(f"mla needs mla_kv_rank >= 1, got {self.mla_kv_rank}")
            if self.mla_q_rank is not None and self.mla_q_rank < 1:
                raise ValueError(f"mla_q_rank must be >= 1 or None, got {self.mla_q_rank}")
        elif self.kind == "tucker":
            if self.tucker_ranks is None:
                raise ValueError("tucker needs tucker_ranks = (r_1, r_2, r_3)")
            self.tucker_ranks = tuple(int(r) for r in self.tucker_ranks)
            self.tucker_ranks_out = (
                self.tucker_ranks if self.tucker_ranks_out is None else tuple(int(r) for r in self.tucker_ranks_out)
            )
            for ranks in (self.tucker_ranks, self.tucker_ranks_out):
                if len(ranks) != 3 or min(ranks) < 1:
                    raise ValueError(f"Tucker ranks must be three positive ints, got {ranks}")
        elif self.kind == "tucker_listing":
            half = max(1, self.d_model // 2)
            ranks = (self.d_model, half, half) if self.listing_ranks is None else self.listing_ranks
            self.listing_ranks = tuple(int(r) for r in ranks)
            if len(self.listing_ranks) != 3 or min(self.listing_ranks) < 1:
                raise ValueError(f"tucker_listing ranks (r_Q, r_K, r_V) must be three positive ints, got {ranks}")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1], got {self.dropout}")

    @property
    def inner(self) -> int:
        """n_H d_H, the width of the concatenated heads (= d_model in the paper's Table 1)."""
        return self.n_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "AttentionConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

"""Hyper-parameters of the flat baseline (`world_model.models.baseline`; its docstring explains the position code
and the attention kinds). V = content_vocab_size + 2: the 4-tensor vocabulary, then [BOS] and [EOS].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from world_model.models.attention_config import KINDS as ATTENTION_KINDS
from world_model.models.attention_config import AttentionConfig

LISTING_RANKS = ("tucker_query_rank", "tucker_key_rank", "tucker_value_rank")
POSITIONS = ("sinusoidal", "learned", "rotary")


@dataclass
class BaselineConfig:
    """Hyper-parameters of the flat baseline (defaults: the CPU-sized preset of the 4-tensor model)."""

    content_vocab_size: int  # the 4-tensor vocabulary, padding and unknown word included
    d_x: int = 16
    d_t: int = 8
    n_heads: int = 4  # split d: head width d / n_heads
    n_layers: int = 2
    n_tokens: int = 16  # N, token slots per stored sentence
    n_states: int = 4  # T, sentences in the input window
    dropout: float = 0.1
    padding_idx: int = 0
    # "sinusoidal" (parameter-free, added to the input), "learned" (absolute table, added to the input) or "rotary"
    # (parameter-free, RoFormer: queries and keys rotated by their positions, nothing added; default attention only)
    positions: str = "sinusoidal"
    # Attention kind from the family (see the module docstring); the defaults are the original model.
    attention: str = "mha"  # "mha" | "gqa" | "mla" | "tucker" | "tucker_listing"
    n_kv_heads: int | None = None  # gqa only: key/value heads n_KV dividing n_heads (1 = MQA)
    mla_kv_rank: int | None = None  # mla only: latent width d_c of keys/values (required)
    mla_q_rank: int | None = None  # mla only: query latent d_c^Q; None = full-rank query map
    mla_shared_kv: bool = False  # mla only: one latent c_KV for keys and values
    tucker_ranks: tuple[int, int, int] | None = None  # tucker only: (r_1, r_2, r_3) of W (required)
    tucker_ranks_out: tuple[int, int, int] | None = None  # tucker only: (r~_1, r~_2, r~_3) of W~; None = tucker_ranks
    # tucker_listing only (the reference listing's form): the ranks of the Q, K and V factors; None = d, d/2, d/2
    tucker_query_rank: int | None = None
    tucker_key_rank: int | None = None
    tucker_value_rank: int | None = None
    bitlinear: bool = False  # ternary BitLinear attention projections (always a FamilyAttention)
    # Not in the paper (which packs with no separators): [BOS] once more after S(T-1), so the model sees where
    # the sentence it writes begins. No new parameter; the "marker" row of the cpu benchmark.
    target_marker: bool = False
    # Not in the paper (off by default): input token vectors E(ids) * sqrt(d) (Vaswani et al. 2017, 3.4), so that
    # the tied table, read out at logit scale (rows of norm ~1), meets the unit-amplitude sinusoidal code (norm
    # sqrt(d / 2)) at a like scale instead of about a seventh of it. No new parameter; the "marker_scaled" row.
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("content_vocab_size", "d_x", "d_t", "n_heads", "n_layers", "n_tokens", "n_states"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"BaselineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.padding_idx < self.content_vocab_size:
            raise ValueError(
                f"padding_idx {self.padding_idx} is outside the content vocabulary of size {self.content_vocab_size}"
            )
        if self.d % self.n_heads:
            raise ValueError(f"n_heads {self.n_heads} must divide the width d = d_x * d_t = {self.d}")
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"dropout must lie in [0, 1], got {self.dropout}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        self._check_attention()
        if self.positions == "rotary":
            if self.uses_family_attention:
                raise ValueError("positions='rotary' needs the default attention (mha, no bitlinear)")
            if (self.d // self.n_heads) % 2:
                raise ValueError(
                    f"positions='rotary' needs an even head width, got d / n_heads = {self.d // self.n_heads}"
                )

    def _check_attention(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        for name in ("tucker_ranks", "tucker_ranks_out"):  # JSON gives lists: store tuples, so configs compare equal
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                    raise ValueError(f"{name} must be three positive ints, got {value!r}")
                setattr(self, name, tuple(int(r) for r in value))
        only = {
            "n_kv_heads": ("gqa", self.n_kv_heads is not None),
            "mla_kv_rank": ("mla", self.mla_kv_rank is not None),
            "mla_q_rank": ("mla", self.mla_q_rank is not None),
            "mla_shared_kv": ("mla", bool(self.mla_shared_kv)),
            "tucker_ranks": ("tucker", self.tucker_ranks is not None),
            "tucker_ranks_out": ("tucker", self.tucker_ranks_out is not None),
            **{name: ("tucker_listing", getattr(self, name) is not None) for name in LISTING_RANKS},
        }
        for name, (kind, is_set) in only.items():
            if is_set and self.attention != kind:
                raise ValueError(f"{name} applies only to attention={kind!r}, not attention={self.attention!r}")
        try:
            self.attention_config()
        except ValueError as err:
            raise ValueError(f"attention={self.attention!r}: {err}") from err

    @property
    def uses_family_attention(self) -> bool:
        """False only for the default (mha, no bitlinear), which keeps the original CausalSelfAttention."""
        return self.attention != "mha" or self.bitlinear

    def attention_config(self) -> AttentionConfig:
        """The causal family layer of each block (head width d / n_heads, no attention dropout)."""
        return AttentionConfig(
            d_model=self.d,
            n_heads=self.n_heads,
            kind=self.attention,
            n_kv_heads=self.n_kv_heads,
            mla_q_rank=self.mla_q_rank,
            mla_kv_rank=self.mla_kv_rank,
            mla_shared_kv=self.mla_shared_kv,
            tucker_ranks=self.tucker_ranks,
            tucker_ranks_out=self.tucker_ranks_out,
            listing_ranks=self.listing_ranks(),
            causal=True,
            bitlinear=self.bitlinear,
            dropout=0.0,
        )

    def listing_ranks(self) -> tuple[int, int, int] | None:
        """(r_Q, r_K, r_V) of the tucker_listing attention, each defaulting as the listing does (d, d/2, d/2)."""
        if self.attention != "tucker_listing":
            return None
        defaults = (self.d, max(1, self.d // 2), max(1, self.d // 2))
        return tuple(d if r is None else r for r, d in zip((getattr(self, n) for n in LISTING_RANKS), defaults))

    @classmethod
    def from_vocabulary(cls, vocab_size: int, **hyper) -> "BaselineConfig":
        """The config for a content vocabulary of `vocab_size` ids; [BOS] and [EOS] are added after it."""
        return cls(content_vocab_size=vocab_size, **hyper)

    @property
    def d(self) -> int:
        """Model width, the joint fiber product d_x * d_t (section 7.3)."""
        return self.d_x * self.d_t

    @property
    def d_ff(self) -> int:
        return 4 * self.d

    @property
    def bos_id(self) -> int:
        return self.content_vocab_size

    @property
    def eos_id(self) -> int:
        return self.content_vocab_size + 1

    @property
    def vocab_size(self) -> int:
        """Content vocabulary plus [BOS] and [EOS], appended after it (the padding id is not reused)."""
        return self.content_vocab_size + 2

    @property
    def max_len(self) -> int:
        """Longest sequence: packed prefix 1 + T*N (+1 with the target marker), then at most N content tokens
        and [EOS]."""
        return 1 + self.n_states * self.n_tokens + int(self.target_marker) + self.n_tokens + 1

    def to_dict(self) -> dict:
        return {"model_type": "baseline", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "BaselineConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

"""The configuration of one MLA attention layer: dims, RoPE/YaRN facts, norms.

:class:`MLAConfig` is what :class:`~mla_var3.model.MLALayer` is built from. Its dims come from
:mod:`mla_var3.shapes` (the one source of truth for presets) or from a HF DeepSeek-V2/V3
``config.json``; ``.dims`` hands them back as an :class:`~mla_var3.shapes.MLADims` for the cost
and memory models.

Example
-------
>>> from mla_var3.model import MLAConfig
>>> cfg = MLAConfig.from_preset("deepseek-v3")
>>> cfg.dims.k + cfg.dims.p, round(cfg.softmax_scale, 5)        # YaRN mscale² correction
(576, 0.13523)
>>> small = cfg.scaled(div=16, h=4)                                  # a CPU-test size, same ratios
>>> small.h, small.d, small.p, small.k, small.hidden
(4, 8, 4, 32, 448)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from mla_var3.shapes import MLADims, get_preset

#: RoPE facts of the public DeepSeek-V3 config.json (``rope_scaling`` block and ``rope_theta``).
DEEPSEEK_V3_ROPE = dict(
    rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
    beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
)

#: default hybrid window (newest tokens kept expanded) when a call gives no ``n``.
DEFAULT_HYBRID_N = 64


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention-temperature factor ``0.1 * mscale * ln(scale) + 1`` (1 when scale <= 1)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YarnScaling:
    """The ``rope_scaling`` block of a YaRN model (``type``/``rope_type`` = ``"yarn"``).

    Attributes
    ----------
    factor : float
        Context extension factor (40 for DeepSeek-V3).
    original_max_position_embeddings : int
        Pre-extension context (4096 for DeepSeek-V3).
    beta_fast, beta_slow : float
        Rotation counts bounding the interpolation ramp (32 and 1).
    mscale, mscale_all_dim : float
        cos/sin are multiplied by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``
        (when both are non-zero, else by ``mscale(factor)``); the softmax scale by
        ``mscale(factor, mscale_all_dim)**2`` when ``mscale_all_dim`` is non-zero.
    attention_factor : float or None
        Explicit cos/sin factor overriding the mscale rule (HF's ``attention_factor``).
    truncate : bool
        Round the ramp bounds to integers (HF default True).
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"YarnScaling: factor must be > 0, got {self.factor!r}")
        if not self.original_max_position_embeddings > 0:
            raise ValueError("YarnScaling: original_max_position_embeddings must be > 0, "
                             f"got {self.original_max_position_embeddings!r}")

    @property
    def cos_sin_factor(self) -> float:
        """The factor cos and sin are multiplied by (HF's ``attention_scaling``)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return yarn_get_mscale(self.factor, self.mscale) / yarn_get_mscale(self.factor, self.mscale_all_dim)
        return yarn_get_mscale(self.factor)

    @property
    def softmax_factor(self) -> float:
        """The factor the softmax scale is multiplied by: ``mscale(factor, mscale_all_dim)**2``."""
        if not self.mscale_all_dim:
            return 1.0
        return yarn_get_mscale(self.factor, self.mscale_all_dim) ** 2


@dataclass(frozen=True)
class MLAConfig:
    """One MLA attention layer (DeepSeek-V2/V3 parameterisation, HF names).

    Attributes
    ----------
    hidden, h, d, p, k, dv : int
        Hidden size, heads, no-RoPE q/k head dim, RoPE dim, latent rank (``kv_lora_rank``),
        value head dim.
    q_lora_rank : int or None
        Rank of the low-rank query path (``q_a_proj``/``q_b_proj``); None: a plain ``q_proj``.
    rope_theta : float
        RoPE base.
    rope_scaling : YarnScaling or None
        YaRN scaling, or None for plain RoPE.
    rope_interleave : bool
        DeepSeek's interleaved-pair convention (HF ``rope_interleave``, default True): the p
        RoPE dims hold pairs ``(x[2i], x[2i+1])``; see :mod:`mla_var3.model.rope`.
    rms_norm_eps : float
        Epsilon of ``q_a_layernorm`` and ``kv_a_layernorm``.
    attention_bias : bool
        Bias on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` (HF ``attention_bias``).
    hybrid_n : int
        Hybrid window used when a call gives no ``n``.
    layers : int
        Decoder layers of the model (memory accounting only).
    name : str
        Preset name or ``"custom"``.
    """

    hidden: int
    h: int
    d: int
    p: int
    k: int
    dv: int
    q_lora_rank: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling | None = None
    rope_interleave: bool = True
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    hybrid_n: int = DEFAULT_HYBRID_N
    layers: int = 1
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in ("hidden", "h", "d", "p", "k", "dv", "layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"MLAConfig: {field} must be a positive integer, got {value!r}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or self.q_lora_rank <= 0):
            raise ValueError(f"MLAConfig: q_lora_rank must be a positive integer or None, got {self.q_lora_rank!r}")
        if self.p % 2:
            raise ValueError(f"MLAConfig: the RoPE dim p must be even (pairs are rotated), got {self.p}")
        if self.d != self.dv:
            # The designs' layouts share one D for K, V, Q and O (seed layouts).
            raise ValueError(f"MLAConfig: v_head_dim dv={self.dv} must equal qk_nope_head_dim d={self.d} "
                             "(the designs' layouts share one head dim D)")
        if not isinstance(self.hybrid_n, int) or self.hybrid_n < 0:
            raise ValueError(f"MLAConfig: hybrid_n must be an integer >= 0, got {self.hybrid_n!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"MLAConfig: rope_theta must be > 0, got {self.rope_theta!r}")

    # ------------------------------------------------------------------ derived
    @property
    def qk_head_dim(self) -> int:
        """d + p, the per-head width of the expanded query/key."""
        return self.d + self.p

    @property
    def softmax_scale(self) -> float:
        """``(d + p)**-0.5``, times ``mscale(factor, mscale_all_dim)**2`` under YaRN (as HF does)."""
        scale = float(self.qk_head_dim) ** -0.5
        if self.rope_scaling is not None:
            scale *= self.rope_scaling.softmax_factor
        return scale

    @property
    def dims(self) -> MLADims:
        """The dims as an :class:`MLADims` (w = 2, bf16; use ``.with_dtype`` / ``.replace(w=)``)."""
        return MLADims(h=self.h, d=self.d, p=self.p, k=self.k, dv=self.dv, w=2, layers=self.layers,
                       hidden=self.hidden, q_lora_rank=self.q_lora_rank, name=self.name)

    def replace(self, **changes: Any) -> "MLAConfig":
        """A copy with some fields changed (named ``custom`` unless ``name`` is given)."""
        changes.setdefault("name", "custom" if changes else self.name)
        return dataclasses.replace(self, **changes)

    def scaled(self, div: int = 8, h: int | None = None, min_width: int = 2) -> "MLAConfig":
        """A narrower copy for tests: d, p, k, dv, hidden and q_lora_rank divided by ``div``.

        Ratios between the widths and the RoPE convention are kept; ``h`` defaults to
        ``max(1, h // div)``. p is kept even; every width is at least ``min_width``.
        """
        if not isinstance(div, int) or div <= 0:
            raise ValueError(f"scaled: div must be a positive integer, got {div!r}")

        def shrink(x: int) -> int:
            return max(min_width, x // div)

        p = shrink(self.p)
        p += p % 2
        return dataclasses.replace(
            self, d=shrink(self.d), p=p, k=shrink(self.k), dv=shrink(self.dv), hidden=shrink(self.hidden),
            q_lora_rank=None if self.q_lora_rank is None else shrink(self.q_lora_rank),
            h=h if h is not None else max(1, self.h // div), name=f"{self.name}/{div}",
        )

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_dims(cls, dims: MLADims, **rope: Any) -> "MLAConfig":
        """From an :class:`MLADims`; RoPE facts default to DeepSeek-V3's (override by keyword:
        ``rope_theta``, ``rope_scaling``, ``rope_interleave``, ``rms_norm_eps``, ...)."""
        facts = dict(DEEPSEEK_V3_ROPE)
        theta = facts.pop("rope_theta")
        kwargs: dict[str, Any] = dict(rope_theta=theta, rope_scaling=YarnScaling(**facts))
        kwargs.update(rope)
        return cls(hidden=dims.hidden, h=dims.h, d=dims.d, p=dims.p, k=dims.k, dv=dims.dv,
                   q_lora_rank=dims.q_lora_rank, layers=dims.layers, name=dims.name, **kwargs)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "MLAConfig":
        """A preset's dims (:func:`mla_var3.shapes.get_preset`) with the RoPE facts of the public
        DeepSeek-V3 config (theta 10000; YaRN factor 40, original 4096, beta 32/1, mscale 1/1;
        rms_norm_eps 1e-6). For another checkpoint's exact RoPE use :meth:`from_hf_config`."""
        return cls.from_dims(get_preset(name), **overrides)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "MLAConfig":
        """From a HF DeepSeek-V2/V3 ``config.json`` dict.

        Reads hidden_size, num_attention_heads, q_lora_rank (may be null), kv_lora_rank,
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_theta, rope_scaling or
        rope_parameters (``"yarn"`` or none/``"default"``), rope_interleave (default True),
        rms_norm_eps, attention_bias, num_hidden_layers. Unknown keys are ignored; a missing
        required key or an unsupported RoPE type is a ValueError.
        """
        required = ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                    "qk_rope_head_dim", "v_head_dim")
        missing = [key for key in required if config.get(key) is None]
        if missing:
            raise ValueError(f"MLAConfig.from_hf_config: missing keys {missing}")
        rope_params = config.get("rope_parameters") or config.get("rope_scaling") or {}
        theta = rope_params.get("rope_theta", config.get("rope_theta", 10000.0))
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default")) if rope_params else "default"
        scaling = None
        if rope_type == "yarn":
            factor = rope_params.get("factor")
            original = rope_params.get("original_max_position_embeddings")
            if factor is None:
                if original is None or config.get("max_position_embeddings") is None:
                    raise ValueError("MLAConfig.from_hf_config: YaRN needs rope 'factor' or both "
                                     "'max_position_embeddings' and 'original_max_position_embeddings'")
                factor = config["max_position_embeddings"] / original
            if original is None:
                raise ValueError("MLAConfig.from_hf_config: YaRN needs 'original_max_position_embeddings'")
            scaling = YarnScaling(
                factor=float(factor), original_max_position_embeddings=int(original),
                beta_fast=float(rope_params.get("beta_fast") or 32.0),
                beta_slow=float(rope_params.get("beta_slow") or 1.0),
                mscale=float(rope_params.get("mscale") or 0.0),
                mscale_all_dim=float(rope_params.get("mscale_all_dim") or 0.0),
                attention_factor=rope_params.get("attention_factor"),
                truncate=bool(rope_params.get("truncate", True)),
            )
        elif rope_type not in (None, "default"):
            raise ValueError(f"MLAConfig.from_hf_config: unsupported rope type {rope_type!r} "
                             "(supported: 'default', 'yarn')")
        return cls(
            hidden=int(config["hidden_size"]), h=int(config["num_attention_heads"]),
            d=int(config["qk_nope_head_dim"]), p=int(config["qk_rope_head_dim"]),
            k=int(config["kv_lora_rank"]), dv=int(config["v_head_dim"]),
            q_lora_rank=None if config.get("q_lora_rank") is None else int(config["q_lora_rank"]),
            rope_theta=float(theta), rope_scaling=scaling,
            rope_interleave=bool(config.get("rope_interleave", True)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            attention_bias=bool(config.get("attention_bias", False)),
            layers=int(config.get("num_hidden_layers") or 1),
            name=str(config.get("model_type") or "custom"),
        )

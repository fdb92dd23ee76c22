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

from types import MappingProxyType

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

from mla_var3._io import MAX_INT, quote
from mla_var3.shapes import MLADims, get_preset

#: RoPE facts of the public DeepSeek-V3 config.json (``rope_scaling`` block and ``rope_theta``).
DEEPSEEK_V3_ROPE = MappingProxyType(dict(
    rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
    beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
))

#: default hybrid window (newest tokens kept expanded) when a call gives no ``n``.
DEFAULT_HYBRID_N = 64


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"      # numpy's bool too


def _check_int(where: str, name: str, value, *, low: int = 1) -> int:
    """``value`` as an int in [``low``, 2**53]: an integer (numpy's too, not a bool) or an
    integral float (``512.0``)."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not _is_bool(value):
        if math.isfinite(value) and float(value).is_integer():
            value = int(value)
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where}: {name} must be an integer, got {quote(value)}")
    value = int(value)
    if not low <= value <= MAX_INT:
        raise ValueError(f"{where}: {name} must be an integer in [{low}, 2**53], got {quote(value)}")
    return value


def _check_number(where: str, name: str, value, *, positive: bool = False) -> float:
    """``value`` as a float: a finite real number (numpy's too, not a bool), > 0 with ``positive``."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: {name} must be a number, got {quote(value)}")
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"{where}: {name} must be a finite{' positive' if positive else ''} number, got {value!r}")
    return value


def _check_bool(where: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {name} must be true or false, got {quote(value)}")
    return value


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
        _check_number("YarnScaling", "factor", self.factor, positive=True)
        _check_int("YarnScaling", "original_max_position_embeddings", self.original_max_position_embeddings)
        for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            _check_number("YarnScaling", name, getattr(self, name))
        if self.attention_factor is not None:
            _check_number("YarnScaling", "attention_factor", self.attention_factor, positive=True)
        _check_bool("YarnScaling", "truncate", self.truncate)

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
                raise ValueError(f"MLAConfig: {field} must be a positive integer, got {quote(value)}")
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or isinstance(self.q_lora_rank, bool)
                                             or self.q_lora_rank <= 0):
            raise ValueError(f"MLAConfig: q_lora_rank must be a positive integer or None, got {quote(self.q_lora_rank)}")
        _check_number("MLAConfig", "rope_theta", self.rope_theta, positive=True)
        _check_number("MLAConfig", "rms_norm_eps", self.rms_norm_eps, positive=True)
        _check_bool("MLAConfig", "rope_interleave", self.rope_interleave)
        _check_bool("MLAConfig", "attention_bias", self.attention_bias)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, YarnScaling):
            raise ValueError(f"MLAConfig: rope_scaling must be a YarnScaling or None, got {quote(self.rope_scaling)}")
        if not isinstance(self.name, str):
            raise ValueError(f"MLAConfig: name must be a string, got {quote(self.name)}")
        if self.p % 2:
            raise ValueError(f"MLAConfig: the RoPE dim p must be even (pairs are rotated), got {self.p}")
        if not isinstance(self.hybrid_n, int) or isinstance(self.hybrid_n, bool) or self.hybrid_n < 0:
            raise ValueError(f"MLAConfig: hybrid_n must be an integer >= 0, got {quote(self.hybrid_n)}")

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
        if not isinstance(div, int) or isinstance(div, bool) or div <= 0:
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
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> "MLAConfig":
        """From a HF DeepSeek-V2/V3 ``config.json`` dict, or a config object (a transformers
        ``PretrainedConfig``, or any object with these attributes).

        Reads hidden_size, num_attention_heads, q_lora_rank (may be null), kv_lora_rank,
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_theta, rope_scaling or
        rope_parameters (an object: ``"yarn"`` or none/``"default"``), rope_interleave (default
        True), rms_norm_eps, attention_bias, num_hidden_layers. Unknown keys are ignored. A
        missing required key, a value of the wrong type (``512.7`` or ``"abc"`` for a width,
        ``"false"`` for a flag, NaN for a number), or an unsupported RoPE type is a ValueError
        naming the key.
        """
        where = "MLAConfig.from_hf_config"
        config = _config_mapping(config, where)
        required = ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                    "qk_rope_head_dim", "v_head_dim")
        missing = [key for key in required if config.get(key) is None]
        if missing:
            raise ValueError(f"{where}: missing keys {missing}")
        ints = {key: _check_int(where, key, config[key]) for key in required}
        rope_key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
        rope_params = config.get(rope_key) or {}
        if not isinstance(rope_params, Mapping):
            raise ValueError(f"{where}: {rope_key} must be an object (or null), got {quote(rope_params)}")
        theta = rope_params.get("rope_theta", config.get("rope_theta", 10000.0))
        theta = _check_number(where, "rope_theta", 10000.0 if theta is None else theta, positive=True)
        rope_type = rope_params.get("rope_type", rope_params.get("type", "default")) if rope_params else "default"
        scaling = None
        if rope_type == "yarn":
            scaling = _yarn_from_hf(config, rope_params, f"{where}: {rope_key}")
        elif rope_type not in (None, "default"):
            raise ValueError(f"{where}: unsupported rope type {quote(rope_type)} (supported: 'default', 'yarn')")
        q_lora_rank = config.get("q_lora_rank")
        layers = config.get("num_hidden_layers")
        name = config.get("model_type")
        return cls(
            hidden=ints["hidden_size"], h=ints["num_attention_heads"], d=ints["qk_nope_head_dim"],
            p=ints["qk_rope_head_dim"], k=ints["kv_lora_rank"], dv=ints["v_head_dim"],
            q_lora_rank=None if q_lora_rank is None else _check_int(where, "q_lora_rank", q_lora_rank),
            rope_theta=theta, rope_scaling=scaling,
            rope_interleave=_check_bool(where, "rope_interleave", _default(config, "rope_interleave", True)),
            rms_norm_eps=_check_number(where, "rms_norm_eps", _default(config, "rms_norm_eps", 1e-6), positive=True),
            attention_bias=_check_bool(where, "attention_bias", _default(config, "attention_bias", False)),
            layers=1 if layers is None else _check_int(where, "num_hidden_layers", layers),
            name=name if isinstance(name, str) and name else "custom",
        )


#: the keys :meth:`MLAConfig.from_hf_config` reads (from a config object: its attributes).
HF_CONFIG_KEYS = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim", "rope_theta", "rope_scaling", "rope_parameters",
                  "rope_interleave", "rms_norm_eps", "attention_bias", "num_hidden_layers", "model_type",
                  "max_position_embeddings")


def _config_mapping(config, where: str) -> Mapping[str, Any]:
    """A config.json dict as it is; a config object as the dict of its :data:`HF_CONFIG_KEYS`
    attributes (a transformers ``PretrainedConfig`` included)."""
    if isinstance(config, Mapping):
        return config
    if config is None or isinstance(config, (str, bytes, int, float, list, tuple, set)):
        raise ValueError(f"{where}: config must be a config.json dict or a config object "
                         f"(e.g. transformers' PretrainedConfig), got {quote(config)}")
    return {key: getattr(config, key) for key in HF_CONFIG_KEYS if hasattr(config, key)}


def _default(config: Mapping[str, Any], key: str, default):
    """``config[key]``, or ``default`` when the key is absent or null."""
    value = config.get(key)
    return default if value is None else value


def _yarn_from_hf(config: Mapping[str, Any], rope: Mapping[str, Any], where: str) -> YarnScaling:
    """The YaRN block of a HF config (``factor`` may be implied by the two context lengths)."""
    factor = rope.get("factor")
    original = rope.get("original_max_position_embeddings")
    if factor is None:
        if original is None or config.get("max_position_embeddings") is None:
            raise ValueError(f"{where}: YaRN needs rope 'factor' or both "
                             "'max_position_embeddings' and 'original_max_position_embeddings'")
        longest = _check_int(where, "max_position_embeddings", config["max_position_embeddings"])
        factor = longest / _check_int(where, "original_max_position_embeddings", original)
    if original is None:
        raise ValueError(f"{where}: YaRN needs 'original_max_position_embeddings'")
    attention_factor = rope.get("attention_factor")
    return YarnScaling(
        factor=_check_number(where, "factor", factor, positive=True),
        original_max_position_embeddings=_check_int(where, "original_max_position_embeddings", original),
        beta_fast=_check_number(where, "beta_fast", rope.get("beta_fast") or 32.0),
        beta_slow=_check_number(where, "beta_slow", rope.get("beta_slow") or 1.0),
        mscale=_check_number(where, "mscale", rope.get("mscale") or 0.0),
        mscale_all_dim=_check_number(where, "mscale_all_dim", rope.get("mscale_all_dim") or 0.0),
        attention_factor=None if attention_factor is None else _check_number(where, "attention_factor",
                                                                              attention_factor, positive=True),
        truncate=_check_bool(where, "truncate", _default(rope, "truncate", True)),
    )

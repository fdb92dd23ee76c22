"""KV-cache memory accounting (seed 001): cache per token, totals, and a capacity planner.

Per token and per layer, in bytes (w = bytes per element):

=========  ===========================  =============================================
layout      elements per token/layer    note
=========  ===========================  =============================================
MHA         2·h·d_head                  K and V per head (h·(d_k + d_v) if they differ)
GQA         2·g·d_head                  g shared KV heads
MQA         2·d_head                    one KV head
MLA         k + p                       latent + the RoPE key: forgetting p undercounts
expanded    2·h·d + p                   MLA run expanded: K, V per head + one shared RoPE key
hybrid      o·(k + p) + n·(2·h·d + p)   per sequence; + n·k if latent copies are kept
=========  ===========================  =============================================

The hybrid's *window* (:func:`window_bytes`) is what it adds to a latent cache that keeps every
token's ``z``: ``n·h·2d·w`` per sequence per layer, ``n·(h/tp)·2d·w`` per tensor-parallel rank.

The cache is only the part of memory that grows with context and concurrency: weights,
activations, workspaces and communication buffers stay (see :func:`plan_capacity`).

Example
-------
>>> from mla_var3.shapes import get_preset
>>> from mla_var3.analysis.memory import mla_cache_bytes, expanded_cache_bytes
>>> dims = get_preset("deepseek-v3")
>>> mla_cache_bytes(dims, b=1, t=1), expanded_cache_bytes(dims, b=1, t=1)
(1152, 65664)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mla_var3.shapes import MLADims, dtype_bytes

#: published total parameter counts and checkpoint weight dtypes of the presets
#: (used by the capacity planner when no parameter count is given).
PUBLISHED_WEIGHTS: dict[str, tuple[float, str, str]] = {
    "deepseek-v3": (671e9, "fp8", "DeepSeek-V3 technical report: 671B total parameters; FP8 checkpoint"),
    "deepseek-v2": (236e9, "bf16", "DeepSeek-V2 technical report: 236B total parameters; BF16 checkpoint"),
    "deepseek-v2-lite": (15.7e9, "bf16", "DeepSeek-V2-Lite model card: 15.7B total parameters; BF16 checkpoint"),
    "kimi-k2": (1.0e12, "fp8", "Kimi K2 model card: 1T total parameters; block-FP8 checkpoint"),
    "minicpm3-4b": (4.0e9, "bf16", "MiniCPM3-4B model card: 4B parameters; BF16 checkpoint"),
}


def _check_sizes(where: str, **sizes: int) -> None:
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}: {name} must be a non-negative integer, got {v!r}")


def _check_amount(where: str, name: str, value, *, positive: bool = False) -> float:
    """A finite real number >= 0 (> 0 with ``positive``): NaN would make every comparison
    false and the plan silently empty."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        kind = "positive" if positive else "non-negative"
        raise ValueError(f"{where}: {name} must be a finite {kind} number, got {value!r}")
    return value


# --- per layer, agreed with the cache containers of the layer -------------------------------


def mla_cache_bytes(dims: MLADims, b: int, t: int) -> int:
    """Latent cache of one layer: ``b·t·(k + p)·w`` (Z [b,t,k] and KPE [b,t,p])."""
    _check_sizes("mla_cache_bytes", b=b, t=t)
    return b * t * (dims.k + dims.p) * dims.w


def expanded_cache_bytes(dims: MLADims, b: int, t: int) -> int:
    """Expanded cache of one layer: ``b·t·(2·h·d + p)·w`` (K, V [b,t,h,d] and one shared KPE [b,t,p])."""
    _check_sizes("expanded_cache_bytes", b=b, t=t)
    return b * t * (2 * dims.h * dims.d + dims.p) * dims.w


def hybrid_cache_bytes(dims: MLADims, b: int, o: int, n: int, keep_latent_window: bool = False) -> int:
    """Hybrid cache of one layer: ``b·(o·(k + p) + n·(2·h·d + p))·w``, plus ``b·n·k·w`` when
    latent copies of the n expanded tokens are kept (so the window can be re-latentised)."""
    _check_sizes("hybrid_cache_bytes", b=b, o=o, n=n)
    extra = b * n * dims.k * dims.w if keep_latent_window else 0
    return b * (o * (dims.k + dims.p) + n * (2 * dims.h * dims.d + dims.p)) * dims.w + extra


def window_bytes(dims: MLADims, n: int, tp: int = 1) -> int:
    """The hybrid's expanded window of one sequence in one layer on one tensor-parallel rank:
    ``n·(h/tp)·(d + dv)·w`` (= ``n·h·2d·w`` at tp = 1): K and V of the rank's heads. The latent
    part (and the RoPE keys, kept for every token either way) is not in it, and does not shrink
    with tp: every rank needs the whole latent for its heads."""
    _check_sizes("window_bytes", n=n, tp=tp)
    if tp < 1 or dims.h % tp:
        raise ValueError(f"window_bytes: tp must be a positive divisor of h={dims.h}, got {tp!r}")
    return n * (dims.h // tp) * (dims.d + dims.dv) * dims.w


def max_window_n(dims: MLADims, window_budget_bytes: float, tp: int = 1) -> int:
    """Largest n whose window (:func:`window_bytes`, per sequence per layer per rank) fits
    ``window_budget_bytes``: ``floor(budget / ((h/tp)·(d + dv)·w))``."""
    if isinstance(window_budget_bytes, bool) or not isinstance(window_budget_bytes, (int, float)) \
            or not math.isfinite(window_budget_bytes) or window_budget_bytes < 0:
        raise ValueError(f"max_window_n: the window budget must be a finite number >= 0 bytes, "
                         f"got {window_budget_bytes!r}")
    per_token = window_bytes(dims, 1, tp)
    return int(window_budget_bytes // per_token)


def paged_cache_bytes(dims: MLADims, num_blocks: int, block_size: int = 64) -> int:
    """Paged latent cache of one layer: ``num_blocks·block_size·(k + p)·w``."""
    _check_sizes("paged_cache_bytes", num_blocks=num_blocks, block_size=block_size)
    return num_blocks * block_size * (dims.k + dims.p) * dims.w


# --- per token, per layer, for the classic layouts ----------------------------------------


def mha_bytes_per_token(h: int, d_head: int, w: int, v_head: int | None = None) -> int:
    """MHA: ``h·(d_head + v_head)·w`` per token per layer (``2·h·d_head·w`` when v_head = d_head)."""
    return h * (d_head + (d_head if v_head is None else v_head)) * w


def gqa_bytes_per_token(g: int, d_head: int, w: int, v_head: int | None = None) -> int:
    """GQA with g KV heads: ``2·g·d_head·w`` per token per layer."""
    return mha_bytes_per_token(g, d_head, w, v_head)


def mqa_bytes_per_token(d_head: int, w: int, v_head: int | None = None) -> int:
    """MQA (one KV head): ``2·d_head·w`` per token per layer."""
    return mha_bytes_per_token(1, d_head, w, v_head)


def mla_bytes_per_token(dims: MLADims) -> int:
    """MLA: ``(k + p)·w`` per token per layer — the RoPE key counts."""
    return (dims.k + dims.p) * dims.w


def cache_total_bytes(bytes_per_token_layer: float, layers: int, batch: int, context: int) -> float:
    """Total cache of ``batch`` sequences of ``context`` tokens over ``layers`` layers."""
    return bytes_per_token_layer * layers * batch * context


@dataclass(frozen=True)
class CacheLayout:
    """One row of the cache comparison: a layout's bytes per token per layer and its note."""

    layout: str
    bytes_per_token_layer: float
    formula: str

    def total(self, layers: int, batch: int, context: int) -> float:
        return cache_total_bytes(self.bytes_per_token_layer, layers, batch, context)


def cache_layouts(dims: MLADims, context: int = 4096, n: int = 1024, gqa_groups: int = 8) -> list[CacheLayout]:
    """Cache per token per layer of the same attention stored as MHA, GQA, MQA, MLA, expanded
    MLA and the hybrid (o = context - n latent, n expanded; averaged over the context).

    MHA/GQA/MQA use the model's own head dims: K = d + p (RoPE inside the head), V = dv.
    """
    _check_sizes("cache_layouts", context=context, n=n)
    if not isinstance(gqa_groups, int) or isinstance(gqa_groups, bool) or gqa_groups < 1:
        raise ValueError(f"cache_layouts: gqa_groups must be a positive integer, got {gqa_groups!r}")
    if n > context:
        raise ValueError(f"cache_layouts: hybrid window n={n} exceeds the context {context}")
    w, dk = dims.w, dims.d + dims.p
    hyb = hybrid_cache_bytes(dims, 1, context - n, n) / context
    hyb_keep = hybrid_cache_bytes(dims, 1, context - n, n, keep_latent_window=True) / context
    return [
        CacheLayout(f"MHA (h={dims.h})", mha_bytes_per_token(dims.h, dk, w, dims.dv), "h·(d+p+dv)·w"),
        CacheLayout(f"GQA (g={gqa_groups})", gqa_bytes_per_token(gqa_groups, dk, w, dims.dv), "g·(d+p+dv)·w"),
        CacheLayout("MQA", mqa_bytes_per_token(dk, w, dims.dv), "(d+p+dv)·w"),
        CacheLayout("MLA latent", mla_bytes_per_token(dims), "(k+p)·w"),
        CacheLayout("MLA expanded", expanded_cache_bytes(dims, 1, 1), "(2·h·d+p)·w"),
        CacheLayout(f"hybrid (n={n} of {context})", hyb, "(o·(k+p)+n·(2hd+p))·w / t"),
        CacheLayout(f"hybrid + latent window", hyb_keep, "... + n·k·w / t"),
    ]


@dataclass(frozen=True)
class CapacityPlan:
    """How much KV cache fits on one GPU of a tensor-parallel group, and for how many sequences.

    All sizes in bytes, per GPU. ``cache_bytes_per_token`` covers all layers.
    """

    model: str
    layout: str
    device_memory_bytes: float
    tp: int
    params: float
    weight_bytes_per_param: float
    weights_bytes: float
    reserve_bytes: float
    cache_budget_bytes: float
    cache_bytes_per_token: float
    tokens: int
    context: int
    sequences: int

    @property
    def fits(self) -> bool:
        """Whether the weights and the reserve leave any room for cache."""
        return self.cache_budget_bytes > 0

    def to_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["fits"] = self.fits
        return d


def plan_capacity(
    dims: MLADims,
    device_memory_bytes: float,
    tp: int = 1,
    params: float | None = None,
    weight_dtype: str | None = None,
    reserve_bytes: float | None = None,
    reserve_fraction: float = 0.10,
    context: int = 32768,
    layout: str = "mla",
) -> CapacityPlan:
    """Tokens of cache that fit on one GPU, and concurrent sequences of ``context`` tokens.

    memory = weights / tp + reserve + cache. ``params`` (total parameter count) and
    ``weight_dtype`` default to :data:`PUBLISHED_WEIGHTS` for presets. The reserve
    (activations, workspaces, allocator slack, communication buffers) is ``reserve_bytes``,
    or ``reserve_fraction`` of device memory when not given. ``layout`` 'mla' stores k + p per
    token per layer, replicated on every rank (each rank's heads need the whole latent);
    'expanded' stores 2·h·d + p, whose per-head part is split over the tp ranks.
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or dims.h % tp:
        raise ValueError(f"plan_capacity: tp must be a positive divisor of h={dims.h}, got {tp!r}")
    _check_sizes("plan_capacity", context=context)
    if context == 0:
        raise ValueError("plan_capacity: context must be positive")
    _check_amount("plan_capacity", "device memory (bytes)", device_memory_bytes, positive=True)
    if reserve_bytes is not None:
        _check_amount("plan_capacity", "reserve (bytes)", reserve_bytes)
    if not (isinstance(reserve_fraction, (int, float)) and not isinstance(reserve_fraction, bool)
            and 0 <= reserve_fraction < 1):
        raise ValueError(f"plan_capacity: reserve_fraction must be in [0, 1), got {reserve_fraction!r}")
    published = PUBLISHED_WEIGHTS.get(dims.name)
    if params is None:
        if published is None:
            raise ValueError(f"plan_capacity: no published parameter count for {dims.name!r}; pass params (CLI: --params)")
        params = published[0]
    _check_amount("plan_capacity", "params", params, positive=True)
    if weight_dtype is None:
        weight_dtype = published[1] if published else "bf16"
    wbytes = dtype_bytes(weight_dtype)
    reserve = reserve_fraction * device_memory_bytes if reserve_bytes is None else reserve_bytes
    if layout == "mla":
        per_token = dims.layers * mla_bytes_per_token(dims)
    elif layout == "expanded":
        per_token = dims.layers * (2 * (dims.h // tp) * dims.d + dims.p) * dims.w
    else:
        raise ValueError(f"plan_capacity: layout must be 'mla' or 'expanded', got {layout!r}")
    weights = params * wbytes / tp
    budget = device_memory_bytes - weights - reserve
    tokens = int(budget // per_token) if budget > 0 else 0
    return CapacityPlan(
        dims.name, layout, device_memory_bytes, tp, params, wbytes, weights, reserve, budget,
        per_token, tokens, context, tokens // context,
    )

"""Exact FLOP and byte counts of every MLA attention design and the stages around them.

Each function takes ``(dims: MLADims, problem: Problem)`` and returns a frozen :class:`Cost`
with integer ``flops`` and ``bytes`` (``bytes`` = DRAM traffic: every input read once, every
output written once — the ideal a fused kernel can reach). Derivations are in
``docs/cost-analysis.md``, "The three designs" and "The stages around the designs". Symbols: b, h,
s, t, d, p, k, w as in :mod:`mla_var3.shapes`; ``dv`` (value head dim) appears where the seed
writes ``d`` for V and O — equal in every preset.

The three designs the regime guide compares are in :data:`DESIGN_MODELS` (the seed's model of each
design, named like its kernel in :mod:`mla_var3.designs`); :data:`COST_MODELS` adds the stage
models (query absorption, output decompression) and the shared-RoPE-key variant of
FlashAttention.

Example
-------
>>> from mla_var3.shapes import get_preset, Problem
>>> from mla_var3.analysis.cost import flash_attention, flash_mla
>>> dims = get_preset("deepseek-v3")
>>> round(flash_attention(dims, Problem(b=32, s=1024, t=4096)).intensity, 1)
819.2
>>> round(flash_mla(dims, Problem(b=32, s=1, t=4096)).intensity, 1)
228.3
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mla_var3.designs import DESIGNS as _TABLE, design as _design_of
from mla_var3.shapes import MLADims, Problem

#: bytes per element of split-KV partial outputs and LSEs (fp32).
ACC_BYTES = 4


@dataclass(frozen=True)
class Cost:
    """FLOPs and DRAM bytes of one kernel or stage (add two Costs to fuse their counts)."""

    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return self.flops / self.bytes

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


def flash_attention(dims: MLADims, problem: Problem) -> Cost:
    """Expanded attention, K/V materialised per head, seed formulas.

    FLOPs ``2bhst(d + p) + 2bhst·dv`` (= 2bhst(2d + p)): scores over d + p dims, P·V over dv.
    Bytes ``w·bh(s + t)(2d + p)``: read Q [b,h,s,d], QPE [b,h,s,p], write O [b,h,s,dv];
    read K [b,t,h,d], V [b,t,h,dv] and the RoPE key **per head** [b,t,h,p] (what a generic
    attention kernel reads when the RoPE key is materialised for every head).
    """
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    d, p, dv, w = dims.d, dims.p, dims.dv, dims.w
    flops = 2 * b * h * s * t * (d + p) + 2 * b * h * s * t * dv
    nbytes = w * b * h * (s * (d + p + dv) + t * (d + p + dv))
    return Cost(flops, nbytes)


def flash_attention_shared_kpe(dims: MLADims, problem: Problem) -> Cost:
    """Expanded attention reading the RoPE key once per token as KPE [b,t,p] (our kernel's layout).

    FLOPs as :func:`flash_attention`. Bytes ``w·(bhs(2d + p) + bt(2hd + p))``: Q, QPE, O as
    before; K and V per head; one shared RoPE key per token.
    """
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    d, p, dv, w = dims.d, dims.p, dims.dv, dims.w
    flops = 2 * b * h * s * t * (d + p + dv)
    nbytes = w * (b * h * s * (d + p + dv) + b * t * (h * (d + dv) + p))
    return Cost(flops, nbytes)


def flash_mla(dims: MLADims, problem: Problem) -> Cost:
    """Absorbed (latent) attention over Z, seed formulas.

    FLOPs ``2bhst(2k + p)``: scores Qc·Zᵀ over k plus QPE·KPEᵀ over p, then P·Z over k.
    Bytes ``w·(bhs(2k + p) + bt(k + p))``: read Qc [b,h,s,k], QPE [b,h,s,p], write
    O_latent [b,h,s,k]; read Z [b,t,k] and KPE [b,t,p] once — shared by all heads.
    """
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    k, p, w = dims.k, dims.p, dims.w
    flops = 2 * b * h * s * t * (2 * k + p)
    nbytes = w * (b * h * s * (2 * k + p) + b * t * (k + p))
    return Cost(flops, nbytes)


def mla_var6_plus(dims: MLADims, problem: Problem) -> Cost:
    """Hybrid: o = t - n oldest tokens latent (Z_old), n newest expanded (K_new, V_new), seed formulas.

    FLOPs ``2bhstp + 4bhsnd + 4bhsok``: RoPE scores over all t tokens; scores + P·V over d for
    the n expanded tokens; scores + P·Z over k for the o latent tokens.
    Bytes ``w·(bhsp + bhsd + bhsk + bok + btp + 2bhnd + bhsd + bhsk)``: read QPE, Q (no-RoPE),
    Qc; read Z_old [b,o,k], KPE [b,t,p], K_new and V_new [b,n,h,d]; write O [b,h,s,d] and
    O_latent [b,h,s,k]. ``problem.n`` None counts as n = 0.
    """
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    d, p, k, dv, w = dims.d, dims.p, dims.k, dims.dv, dims.w
    n = problem.n or 0
    o = t - n
    flops = 2 * b * h * s * t * p + 2 * b * h * s * n * (d + dv) + 4 * b * h * s * o * k
    nbytes = w * (
        b * h * s * (p + d + k)          # read QPE, Q, Qc
        + b * o * k + b * t * p          # read Z_old, KPE
        + b * h * n * (d + dv)           # read K_new, V_new
        + b * h * s * (dv + k)           # write O, O_latent
    )
    return Cost(flops, nbytes)


def absorb_query(dims: MLADims, problem: Problem) -> Cost:
    """Query absorption Qc[b,h,s,:] = Q[b,h,s,:] @ W_UK[h] (W_UK [h,d,k]).

    FLOPs ``2bhsdk``; bytes ``w·(bhsd + hdk + bhsk)`` (read Q and W_UK, write Qc).
    """
    b, s, h, d, k, w = problem.b, problem.s, dims.h, dims.d, dims.k, dims.w
    return Cost(2 * b * h * s * d * k, w * (b * h * s * d + h * d * k + b * h * s * k))


def decompress(dims: MLADims, problem: Problem, accumulate: bool = False) -> Cost:
    """Output decompression O[b,h,s,:] = O_latent[b,h,s,:] @ W_UV[h] (W_UV [h,k,dv]).

    FLOPs ``2bhs·k·dv`` (+ ``bhs·dv`` adds when ``accumulate``: O += ..., as in the hybrid);
    bytes ``w·(bhsk + hk·dv + bhs·dv)`` (read O_latent and W_UV, write O), plus ``w·bhs·dv``
    to read the partial O when ``accumulate``.
    """
    b, s, h, k, dv, w = problem.b, problem.s, dims.h, dims.k, dims.dv, dims.w
    flops = 2 * b * h * s * k * dv + (b * h * s * dv if accumulate else 0)
    nbytes = w * (b * h * s * k + h * k * dv + b * h * s * dv * (2 if accumulate else 1))
    return Cost(flops, nbytes)


def split_kv_combine(dims: MLADims, problem: Problem, splits: int, width: int | None = None) -> Cost:
    """Merge ``splits`` partial results of split-KV attention into one output.

    Each split wrote a partial output [b,h,s,width] and its LSE [b,h,s] in fp32. The combine
    reads them (``4·splits·bhs(width + 1)`` bytes), writes the output in the model dtype
    (``w·bhs·width``) and does ``2·splits·bhs·width`` FLOPs (scale and add per element; the
    LSE arithmetic is negligible and not counted). ``width`` defaults to k (latent output).
    """
    if not isinstance(splits, int) or splits < 1:
        raise ValueError(f"split_kv_combine: splits must be a positive integer, got {splits!r}")
    width = dims.k if width is None else width
    rows = problem.b * dims.h * problem.s
    return Cost(2 * splits * rows * width, ACC_BYTES * splits * rows * (width + 1) + dims.w * rows * width)


def design_pipeline(design: str, dims: MLADims, problem: Problem) -> Cost:
    """A design's attention kernel plus the stages it needs around it (unfused sum).

    The latent designs (flash_mla, mla_var6_plus) add :func:`absorb_query` and :func:`decompress`
    (the hybrid's accumulating into the expanded part's O); flash_attention needs none.
    """
    cost = get_cost_model(design)(dims, problem)
    if design in DESIGN_MODELS and (d := _design_of(design)).latent:
        cost = cost + absorb_query(dims, problem) + decompress(dims, problem, accumulate=d.split)
    return cost


CostModel = Callable[[MLADims, Problem], Cost]

#: every cost model with the (dims, problem) signature, by name.
COST_MODELS: dict[str, CostModel] = {f.__name__: f for f in (
    flash_attention, flash_mla, mla_var6_plus, flash_attention_shared_kpe, absorb_query, decompress)}

#: the three attention designs compared by the regime guide: the seed's model of each, by kernel name.
DESIGN_MODELS: dict[str, CostModel] = {d.kernel: COST_MODELS[d.kernel] for d in _TABLE}


def get_cost_model(name: str) -> CostModel:
    """The cost model called ``name``; ValueError naming the known ones."""
    try:
        return COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown design {name!r}; known: {', '.join(COST_MODELS)}") from None


def cost(design: str, dims: MLADims, problem: Problem) -> Cost:
    """``COST_MODELS[design](dims, problem)`` with a clear error for an unknown name."""
    return get_cost_model(design)(dims, problem)

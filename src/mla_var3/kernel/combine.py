"""Split-KV combine: merge partial attention outputs computed over disjoint key ranges.

When a kernel splits the context of one sequence into ``NS`` ranges (split-KV), each range
produces a partial output ``o_i`` (normalised by its own softmax sum) and the natural-log LSE
``lse_i`` of its scores. The exact result over all keys is the LSE-weighted mean::

    lse = log(sum_i exp(lse_i))
    o   = sum_i exp(lse_i - lse) * o_i

A range that saw no key has ``lse_i = -inf`` and weight 0 (its ``o_i`` is ignored, even NaN).
The kernel is generic over the value width ``V`` (512 for the absorbed design's latent
output, 128 for an expanded head), so every design reuses it.

Example
-------
>>> o_part = torch.randn(4, 3, 64)          # 4 rows, 3 splits, V = 64      # doctest: +SKIP
>>> lse_part = torch.randn(4, 3)                                          # doctest: +SKIP
>>> out, lse = combine(o_part, lse_part, out_dtype=torch.bfloat16)          # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from mla_var3.kernel._common import check_device, interpreting, next_pow2
from mla_var3.kernel._launch import CachedLaunch
from mla_var3.kernel._jit import LOG2E_C as LOG2E


@triton.jit
def _merge_splits(o_ptr, lse_ptr, first, n, rows, cols, row_ok, col_ok,
                  so_split, so_row, so_col, sl_split, sl_row, CHUNK: tl.constexpr):
    """The LSE-weighted mean of splits ``first .. first + n - 1`` for the ``rows x cols`` tile:
    ``(out [R, C] fp32, lse [R] fp32)``, ``lse = -inf`` and ``out = 0`` where no split saw a key.

    Partial ``i``'s element ``(r, c)`` is at ``o_ptr + i*so_split + r*so_row + c*so_col``, its
    LSE at ``lse_ptr + i*sl_split + r*sl_row``. ``CHUNK`` splits are read per step (an unrolled
    step: their loads issue together) under a running maximum (one pass): a loop of one split
    per step waits a memory latency per split, which at b = 1 and 64 splits was most of the
    combine's time.
    """
    m = tl.full([rows.shape[0]], float("-inf"), tl.float32)
    acc = tl.zeros([rows.shape[0], cols.shape[0]], tl.float32)
    denom = tl.zeros([rows.shape[0]], tl.float32)
    for c in range(0, n, CHUNK):
        m_new = m
        for j in tl.static_range(CHUNK):
            lse_j = tl.load(lse_ptr + (first + c + j).to(tl.int64) * sl_split + rows * sl_row,
                            mask=row_ok & (c + j < n), other=float("-inf"))
            m_new = tl.maximum(m_new, lse_j)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.where(m == float("-inf"), 0.0, tl.exp2((m - m_ref) * LOG2E))
        acc = acc * alpha[:, None]
        denom = denom * alpha
        for j in tl.static_range(CHUNK):
            slot = (first + c + j).to(tl.int64)
            lse_j = tl.load(lse_ptr + slot * sl_split + rows * sl_row, mask=row_ok & (c + j < n), other=float("-inf"))
            w = tl.exp2((lse_j - m_ref) * LOG2E)
            o_j = tl.load(o_ptr + slot * so_split + rows[:, None] * so_row + cols[None, :] * so_col,
                          mask=(row_ok & (c + j < n))[:, None] & col_ok[None, :], other=0.0)
            acc += tl.where(w[:, None] > 0, o_j * w[:, None], 0.0)
            denom += w
        m = m_new
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    lse = tl.where(denom > 0, m + tl.log2(tl.where(denom > 0, denom, 1.0)) / LOG2E, float("-inf"))
    return out, lse


@triton.jit
def _combine_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, lse_out_ptr,
    M, NS, V,
    stride_pm, stride_ps, stride_pv,
    stride_lm, stride_ls,
    stride_om, stride_ov,
    stride_lo,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, WRITE_LSE: tl.constexpr, CHUNK: tl.constexpr,
):
    """One program merges ``BLOCK_R`` rows x ``BLOCK_V`` value columns over all NS splits.

    Reads NS * (BLOCK_R * BLOCK_V + BLOCK_R) fp32, ``CHUNK`` splits per step; writes BLOCK_R * BLOCK_V
    outputs (+ BLOCK_R lse).
    """
    pid_r = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < M
    col_ok = cols < V
    out, lse = _merge_splits(o_part_ptr, lse_part_ptr, tl.full([], 0, tl.int32), NS, rows, cols, row_ok, col_ok,
                             stride_ps, stride_pm, stride_pv, stride_ls, stride_lm, CHUNK)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_ov,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    if WRITE_LSE:
        tl.store(lse_out_ptr + rows * stride_lo, lse, mask=row_ok & (pid_v == 0))


def combine(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor | None = None,
            lse_out: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
            block_r: int | None = None, block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split-KV partial outputs by their LSE.

    Parameters
    ----------
    o_part : [..., NS, V] float32
        Partial outputs, each normalised over its own key range (any strides).
    lse_part : [..., NS] float32
        Natural-log LSE of each range's scaled scores; ``-inf`` for a range without keys.
    out : [..., V], optional
        Output buffer (any float dtype, any strides). Allocated with ``out_dtype`` (default
        float32) if None.
    lse_out : [...] float32, optional
        Output LSE buffer; allocated if None.
    block_r, block_v : int, optional
        Rows and value columns per program (powers of two); defaults suit the device.

    Returns
    -------
    (out [..., V], lse_out [...] float32). Rows where every split is empty get 0 and ``-inf``.
    """
    if o_part.dim() < 2 or lse_part.shape != o_part.shape[:-1]:
        raise ValueError(f"combine: o_part must be [..., NS, V] and lse_part [..., NS]; got "
                         f"{list(o_part.shape)} and {list(lse_part.shape)}")
    if o_part.dtype != torch.float32 or lse_part.dtype != torch.float32:
        raise ValueError(f"combine: o_part and lse_part must be float32, got {o_part.dtype} and {lse_part.dtype}")
    check_device("o_part", o_part)
    lead, ns, v = tuple(o_part.shape[:-2]), o_part.shape[-2], o_part.shape[-1]
    if out is None:
        out = torch.empty(lead + (v,), dtype=out_dtype or torch.float32, device=o_part.device)
    if lse_out is None:
        lse_out = torch.empty(lead, dtype=torch.float32, device=o_part.device)
    if tuple(out.shape) != lead + (v,) or tuple(lse_out.shape) != lead:
        raise ValueError(f"combine: out must be {list(lead + (v,))} and lse_out {list(lead)}; got "
                         f"{list(out.shape)} and {list(lse_out.shape)}")
    if lse_out.dtype != torch.float32:
        raise ValueError(f"combine: lse_out must be float32, got {lse_out.dtype}")
    m = 1
    for size in lead:
        m *= size
    if m == 0 or v == 0:
        return out, lse_out
    p3 = o_part.reshape(m, ns, v)
    l2 = lse_part.reshape(m, ns)
    # Outputs must be written in place: use a view when the strides allow it, else a temporary.
    out2 = _flat_view(out, (m, v))
    lse1 = _flat_view(lse_out, (m,))
    o_target = out2 if out2 is not None else torch.empty((m, v), dtype=out.dtype, device=out.device)
    l_target = lse1 if lse1 is not None else torch.empty((m,), dtype=torch.float32, device=out.device)
    block_r, block_v, chunk = _plain_tiles(m, ns, v, block_r, block_v)
    grid = (triton.cdiv(m, block_r), triton.cdiv(v, block_v))
    _combine_kernel[grid](
        p3, l2, o_target, l_target, m, ns, v,
        p3.stride(0), p3.stride(1), p3.stride(2), l2.stride(0), l2.stride(1),
        o_target.stride(0), o_target.stride(1), l_target.stride(0),
        BLOCK_R=block_r, BLOCK_V=block_v, WRITE_LSE=True, CHUNK=chunk, num_warps=4,
    )
    if out2 is None:
        out.copy_(o_target.view(out.shape))
    if lse1 is None:
        lse_out.copy_(l_target.view(lse_out.shape))
    return out, lse_out


def _flat_view(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return x.view(shape)
    except RuntimeError:
        return None



@triton.jit
def _combine_planned_kernel(
    o_part_ptr, lse_part_ptr, seqs_ptr, out_ptr, lse_ptr,
    ROWS, S, H, V,
    stride_ob, stride_oh, stride_os, stride_ov,
    stride_lb, stride_lh, stride_ls,
    HEAD_MAJOR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Grid (B, row blocks, value blocks). With ``PDL`` (on a GPU) it is launched as a
    programmatic dependent launch, so its launch and start overlap the last programs of the
    kernel that writes the partials. Sequence b's partials sit in slots ``seqs[b, 0] .. +
    seqs[b, 1]`` of ``o_part [slots, ROWS, V]`` / ``lse_part [slots, ROWS]`` (contiguous, rows in
    the kernel's order); a sequence of one item was written directly and its programs exit at
    once, before the wait (as FlashMLA's combine does): ``seqs`` was written by the planner,
    which ended before that kernel began (an ordinary launch), so only the partials need it.

    Reads n * (BLOCK_R * BLOCK_V + BLOCK_R) fp32; writes BLOCK_R * BLOCK_V outputs (+ LSE).
    """
    b = tl.program_id(0)
    first = tl.load(seqs_ptr + b * 2)
    n = tl.load(seqs_ptr + b * 2 + 1)
    if n > 1:
        if PDL:
            gdc_wait()
        rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
        row_ok = rows < ROWS
        col_ok = cols < V
        out, lse = _merge_splits(o_part_ptr, lse_part_ptr, first, n, rows, cols, row_ok, col_ok,
                                 ROWS * V, V, 1, ROWS, 1, CHUNK)
        if HEAD_MAJOR:
            head = rows // S
            tok = rows % S
        else:
            head = rows % H
            tok = rows // H
        o_rows = b.to(tl.int64) * stride_ob + head * stride_oh + tok * stride_os
        tl.store(out_ptr + o_rows[:, None] + cols[None, :] * stride_ov, out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
        if tl.program_id(2) == 0:
            tl.store(lse_ptr + b * stride_lb + head * stride_lh + tok * stride_ls, lse, mask=row_ok)


_combine_launch = CachedLaunch(_combine_planned_kernel, launch_pdl=True)


def combine_planned(o_part: torch.Tensor, lse_part: torch.Tensor, seqs: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, *, head_major: bool = True) -> None:
    """Merge the split-KV partials of a decode plan into ``out`` and ``lse`` (in place).

    Parameters
    ----------
    o_part : [slots, H*S, V] float32 contiguous   partial outputs, one slot per split item
    lse_part : [slots, H*S] float32 contiguous     their natural-log LSE (-inf: no key)
    seqs : [B, 2] int32                            ``(first_slot, n_items)`` per sequence
        (:class:`mla_var3.kernel.decode_plan.DecodePlan`); sequences of one item are skipped
    out : [B, H, S, V] (any strides)               final output
    lse : [B, H, S] float32 (any strides)          final LSE
    head_major : the partials' row order: ``row = head * S + token`` (else ``token * H + head``)

    One launch whatever the lengths (no host read of ``seqs``: CUDA-graph safe).
    """
    b, h, s, v = out.shape
    if b == 0 or h * s == 0:
        return
    key, grid, args, constexprs = _planned_launch(o_part, lse_part, seqs, out, lse, head_major)
    _combine_launch(key, grid, args, constexprs, num_warps=4)


def _planned_launch(o_part, lse_part, seqs, out, lse, head_major):
    """(key, grid, arguments, constexprs) of :func:`combine_planned`'s launch."""
    b, h, s, v = out.shape
    block_r, block_v, chunk = _tiles(b, h * s, v)
    grid = (b, triton.cdiv(h * s, block_r), triton.cdiv(v, block_v))
    ints = (h * s, s, h, v, *out.stride(), *lse.stride())
    key = (out.dtype, bool(head_major), ints, block_v, out.data_ptr() % 16, lse.data_ptr() % 16,
           o_part.data_ptr() % 16, lse_part.data_ptr() % 16, seqs.data_ptr() % 16)
    return key, grid, (o_part, lse_part, seqs, out, lse, *ints), dict(HEAD_MAJOR=bool(head_major), BLOCK_R=block_r,
                                                                       BLOCK_V=block_v, PDL=not interpreting(),
                                                                       CHUNK=chunk)


#: programs a combine launch aims for on a GPU before it widens its value tiles (about four per
#: SM of an H100 / H200): fewer, and a sequence's many splits are read by too few programs
_TARGET_PROGRAMS = 512
#: fp32 elements of one ``[CHUNK, BLOCK_R, BLOCK_V]`` load: 32 registers a thread at 4 warps
_CHUNK_TILE = 4096


def _tiles(groups: int, rows: int, v: int) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_V, CHUNK)`` of a combine over ``groups`` launch groups of ``rows`` rows
    of width ``v``. The interpreter pays per program: few, wide programs. On a GPU: the widest
    value tile (32 .. 128) that still gives :data:`_TARGET_PROGRAMS` programs of 16 rows; at 32
    columns (few sequences, so many splits each) 8 rows, else 16; and as many splits per step as
    keep the loaded tile at :data:`_CHUNK_TILE` elements (16 at 8 x 32, 2 at 16 x 128). Measured
    alone on an H100 (``results/h100/combine/tiles*.json``): 8 x 32 x 16 merges b = 1's 64 splits
    of 128 rows x 512 in 16.7 us (16 x 32 x 8: 30.3; one split a step: 55.4), 16 x 128 x 2 the
    3 splits of b = 32 in 18.6 (8 x 32 x 16 there: 45.2)."""
    if interpreting():
        return 32, next_pow2(v), _chunk(32, next_pow2(v))
    block_v = min(next_pow2(v), 32)
    while block_v < min(next_pow2(v), 128) and groups * triton.cdiv(rows, 16) * triton.cdiv(v, 2 * block_v) \
            >= _TARGET_PROGRAMS:
        block_v *= 2
    block_r = 8 if block_v == 32 else 16
    return block_r, block_v, _chunk(block_r, block_v)


def _plain_tiles(m: int, ns: int, v: int, block_r: int | None = None,
                 block_v: int | None = None) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_V, CHUNK)`` of :func:`combine` over ``m`` rows of ``ns`` splits: the
    given tile sizes or :func:`_tiles`'s, and no more splits a step than ``ns`` (rounded up to a
    power of two), which the plain combine knows on the host."""
    auto_r, auto_v, _ = _tiles(1, m, v)
    block_r, block_v = block_r or auto_r, block_v or auto_v
    return block_r, block_v, min(_chunk(block_r, block_v), next_pow2(max(ns, 1)))


def _chunk(block_r: int, block_v: int) -> int:
    """Splits a combine program loads per step: 4 under the interpreter (numpy pays per element,
    not per load), else as many as keep the tile at :data:`_CHUNK_TILE` elements (at least 1)."""
    return 4 if interpreting() else max(1, _CHUNK_TILE // (block_r * block_v))


def combine_flat(o_part: torch.Tensor, lse_part: torch.Tensor, seqs: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, *, head_major: bool = True):
    """:func:`combine_planned`'s launch for calls laid out as these tensors (their strides and
    16-byte alignment; fresh allocations of the same shapes are): ``(flat, grid, ints)``, whose
    ``flat.launch(grid, stream, (o_part, lse_part, seqs, out, lse addresses, *ints))`` issues it,
    or None where it is not on the direct path yet (a first call compiles it) or a launch hook
    is installed."""
    b, h, s, _ = out.shape
    if b == 0 or h * s == 0:
        return None
    key, grid, args, _ = _planned_launch(o_part, lse_part, seqs, out, lse, head_major)
    flat = _combine_launch.flat(key)
    return None if flat is None else (flat, grid, args[5:])

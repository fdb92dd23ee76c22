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

from mla_var3.kernel._common import check_device, interpreting, next_pow2
from mla_var3.kernel._jit import LOG2E_C as LOG2E


@triton.jit
def _merge_step(acc, denom, m, lse_i, o_i):
    """Fold one partial (``lse_i`` [R], ``o_i`` [R, V]) into a running LSE merge: ``m`` the max
    LSE so far, ``denom`` = sum of exp(lse - m), ``acc`` the weighted sum of outputs. A partial
    with ``lse_i = -inf`` has weight 0 and its ``o_i`` is ignored (even NaN)."""
    m_new = tl.maximum(m, lse_i)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m - m_safe) * LOG2E)          # 0 while m is -inf
    w = tl.exp2((lse_i - m_safe) * LOG2E)
    acc = acc * alpha[:, None] + tl.where(w[:, None] > 0, o_i * w[:, None], 0.0)
    return acc, denom * alpha + w, m_new


@triton.jit
def _merge_result(acc, denom, m):
    """The merged output [R, V] and natural-log LSE [R] (0 and -inf where no partial had a key)."""
    ok = denom > 0
    out = acc / tl.where(ok, denom, 1.0)[:, None]
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lse = tl.where(ok, m_safe + tl.log2(tl.where(ok, denom, 1.0)) / LOG2E, float("-inf"))
    return out, lse


@triton.jit
def _combine_kernel(
    o_part_ptr, lse_part_ptr, out_ptr, lse_out_ptr,
    M, NS, V,
    stride_pm, stride_ps, stride_pv,
    stride_lm, stride_ls,
    stride_om, stride_ov,
    stride_lo,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    """One program merges ``BLOCK_R`` rows x ``BLOCK_V`` value columns over all NS splits.

    Reads NS * (BLOCK_R * BLOCK_V + BLOCK_R) fp32; writes BLOCK_R * BLOCK_V outputs (+ BLOCK_R lse).
    """
    pid_r = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < M
    col_ok = cols < V
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
    for i in range(NS):
        lse_i = tl.load(lse_part_ptr + rows * stride_lm + i * stride_ls, mask=row_ok, other=float("-inf"))
        o_i = tl.load(o_part_ptr + rows[:, None] * stride_pm + i * stride_ps + cols[None, :] * stride_pv,
                      mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc, denom, m = _merge_step(acc, denom, m, lse_i, o_i)
    out, lse = _merge_result(acc, denom, m)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_ov,
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    if WRITE_LSE:
        tl.store(lse_out_ptr + rows * stride_lo, lse, mask=row_ok & (pid_v == 0))


@triton.jit
def _combine_gathered_kernel(
    o_slot_ptr, lse_slot_ptr, table_ptr, row_base_ptr, n_rows_ptr, out_ptr, lse_out_ptr,
    NP, V,
    stride_os, stride_or, stride_ls, stride_tm, stride_om, stride_lo,
    R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program merges group ``program_id(0)``: its ``n_rows`` (<= R) output rows from the
    slots listed in its table row (-1: none), ``BLOCK_V`` value columns."""
    g = tl.program_id(0)
    pid_v = tl.program_id(1)
    r = tl.arange(0, R)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = r < tl.load(n_rows_ptr + g)
    col_ok = cols < V
    base = tl.load(row_base_ptr + g).to(tl.int64)
    m = tl.full([R], float("-inf"), tl.float32)
    denom = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BLOCK_V], tl.float32)
    for i in range(NP):
        slot = tl.load(table_ptr + g * stride_tm + i)
        ok = row_ok & (slot >= 0)
        src = tl.maximum(slot, 0).to(tl.int64)
        lse_i = tl.load(lse_slot_ptr + src * stride_ls + r, mask=ok, other=float("-inf"))
        o_i = tl.load(o_slot_ptr + src * stride_os + r[:, None] * stride_or + cols[None, :],
                      mask=ok[:, None] & col_ok[None, :], other=0.0)
        acc, denom, m = _merge_step(acc, denom, m, lse_i, o_i)
    out, lse = _merge_result(acc, denom, m)
    rows = base + r
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])
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
    # the interpreter pays per program: few, wide programs there; on a GPU, enough programs
    # to fill the SMs and tiles that stay in registers
    if block_r is None:
        block_r = 32 if interpreting() else 16
    if block_v is None:
        block_v = next_pow2(v) if interpreting() else min(next_pow2(v), 128)
    grid = (triton.cdiv(m, block_r), triton.cdiv(v, block_v))
    _combine_kernel[grid](
        p3, l2, o_target, l_target, m, ns, v,
        p3.stride(0), p3.stride(1), p3.stride(2), l2.stride(0), l2.stride(1),
        o_target.stride(0), o_target.stride(1), l_target.stride(0),
        BLOCK_R=block_r, BLOCK_V=block_v, WRITE_LSE=True, num_warps=4,
    )
    if out2 is None:
        out.copy_(o_target.view(out.shape))
    if lse1 is None:
        lse_out.copy_(l_target.view(lse_out.shape))
    return out, lse_out


def combine_gathered(o_slots: torch.Tensor, lse_slots: torch.Tensor, table: torch.Tensor, row_base: torch.Tensor,
                     n_rows: torch.Tensor, out: torch.Tensor, lse_out: torch.Tensor, *,
                     block_v: int | None = None) -> None:
    """Merge partials stored in *slots* into groups of output rows (in place).

    A kernel that hands each program an arbitrary range of (row tile, key block) work — a
    persistent tile scheduler — leaves some row tiles cut between programs; each piece writes
    its partial to a slot, and group ``g`` of this call merges the slots ``table[g]`` into the
    output rows ``row_base[g] .. row_base[g] + n_rows[g]``.

    Parameters
    ----------
    o_slots : [N, R, V] float32       partial outputs (each normalised over its own key range)
    lse_slots : [N, R] float32        their natural-log LSE (-inf: no key)
    table : [G, NP] int32             slots of each group, padded with -1
    row_base : [G] int64              first output row of each group
    n_rows : [G] int32                rows of each group (<= R)
    out : [M, V]                      output rows (rows of no group are left untouched)
    lse_out : [M] float32             output LSE
    """
    if o_slots.dim() != 3 or tuple(lse_slots.shape) != tuple(o_slots.shape[:2]):
        raise ValueError(f"combine_gathered: o_slots must be [N, R, V] and lse_slots [N, R]; got "
                         f"{list(o_slots.shape)} and {list(lse_slots.shape)}")
    if o_slots.dtype != torch.float32 or lse_slots.dtype != torch.float32 or lse_out.dtype != torch.float32:
        raise ValueError("combine_gathered: o_slots, lse_slots and lse_out must be float32")
    n, r, v = o_slots.shape
    if table.dim() != 2 or row_base.shape != table.shape[:1] or n_rows.shape != table.shape[:1]:
        raise ValueError(f"combine_gathered: table must be [G, NP] with row_base and n_rows [G]; got "
                         f"{list(table.shape)}, {list(row_base.shape)}, {list(n_rows.shape)}")
    if out.dim() != 2 or out.shape[1] != v or lse_out.shape != out.shape[:1]:
        raise ValueError(f"combine_gathered: out must be [M, {v}] and lse_out [M]; got "
                         f"{list(out.shape)} and {list(lse_out.shape)}")
    if r & (r - 1) or o_slots.stride(2) != 1 or lse_slots.stride(1) != 1 or out.stride(1) != 1 or table.stride(1) != 1:
        raise ValueError("combine_gathered: R must be a power of two and the last dimensions contiguous")
    check_device("o_slots", o_slots)
    if table.shape[0] == 0 or v == 0:
        return
    if block_v is None:
        block_v = next_pow2(v) if interpreting() else min(next_pow2(v), 64)
    grid = (table.shape[0], triton.cdiv(v, block_v))
    _combine_gathered_kernel[grid](
        o_slots, lse_slots, table, row_base, n_rows, out, lse_out, table.shape[1], v,
        o_slots.stride(0), o_slots.stride(1), lse_slots.stride(0), table.stride(0), out.stride(0), lse_out.stride(0),
        R=r, BLOCK_V=block_v, num_warps=4,
    )


def _flat_view(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return x.view(shape)
    except RuntimeError:
        return None

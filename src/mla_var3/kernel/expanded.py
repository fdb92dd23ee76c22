"""Expanded attention (design 1, FlashAttention-style) with the decoupled RoPE key shared by heads.

Each program owns ``BLOCK_M`` query rows of one (sequence, head) and streams that head's keys in
blocks of ``BLOCK_N`` with an online softmax (scores in the log2 domain, ``exp2`` only)::

    score[i, j] = (q[i] . k[j] + qpe[i] . kpe[j]) * scale          # d + p = 128 + 64
    o[i]        = sum_j softmax_j(score[i, :]) v[j]

The RoPE key ``kpe`` [B, T, P] is one vector per token for all heads: a program reads it once
per key block (never materialised per head; the other heads' programs find it in L2).

Causal masking (query i of s sees keys ``j <= L - s + i``, ``L = T`` or ``seqlens[b]``) is
applied only where it can bite: the key loop is split into blocks that every row of the program
sees (no mask) and the diagonal / tail blocks (masked); blocks past the last visible key are
never read, so prefill skips the fully masked upper triangle.

Decode with few programs (small ``b * h``) splits the key range over ``num_splits`` programs per
row block (split-KV); the partial outputs are merged by :func:`mla_var3.kernel.combine.combine`.

Launch configs are data: :class:`FlashAttentionConfig` with :func:`default_config` (analytic)
and :func:`candidate_configs` (the autotuning space).

Example
-------
>>> o, lse = flash_attention(q, qpe, k, v, kpe)                      # doctest: +SKIP
>>> o.shape, lse.shape           # [B, H, S, D] in q's dtype, [B, H, S] float32
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mla_var3.kernel import backends
from mla_var3.kernel._common import (
    SMEM_LIMIT, allowed_dtypes, bind_output, bind_shape, cdiv, check_device, check_inference, check_scale, check_seqlens, interpreting, next_pow2,
    num_sms,
)
from mla_var3.kernel._jit import LOG2E, finalize_lse, operand, split_key_range, to_storage
from mla_var3.kernel.combine import combine
from mla_var3.shapes import MLADims, Problem

__all__ = ["FlashAttentionConfig", "default_config", "candidate_configs", "example_launch", "flash_attention",
           "tma_compatible"]


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------

@triton.jit
def load_tile(ptrs, row_ok, col_ok, ROW_MASK: tl.constexpr, COL_MASK: tl.constexpr):
    """Load a 2-D tile, masking rows and/or columns only where a constexpr says it can bite
    (masked-off elements read as 0)."""
    if ROW_MASK:
        if COL_MASK:
            x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    else:
        if COL_MASK:
            x = tl.load(ptrs, mask=col_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _softmax_step_scaled(raw, m_i, l_i, qk_scale, MASKED: tl.constexpr):
    """Online-softmax step on raw (unscaled) scores with ``scale * log2(e)`` folded in.

    Same contract as :func:`mla_var3.kernel._jit.online_softmax_step` (``m_i`` in the log2
    domain, i.e. already scaled), but the max is taken on the raw scores (``qk_scale > 0``
    commutes with max) so each element costs one FFMA (``raw * qk_scale - m``) before ``exp2``
    instead of a multiply and a subtract. Only masked blocks can hold a row that is all -inf
    so far; unmasked blocks skip that guard.
    """
    m_new = tl.maximum(m_i, tl.max(raw, 1) * qk_scale)
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(raw * qk_scale - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def _softmax_step_lazy(raw, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr, THRESHOLD: tl.constexpr):
    """Online-softmax step that rescales the accumulator only when some row's max grew by more
    than ``THRESHOLD`` (log2 units); otherwise every row keeps its stale max.

    Exact: ``o = acc / l`` and ``lse = m + log2(l)`` hold for any reference ``m`` that acc and l
    share; a stale ``m`` only lets ``p`` reach ``2**THRESHOLD`` (fine in bf16 and fp32). The
    decision is one scalar per program (a reduction over the rows), so the common case skips the
    ``BLOCK_M * BLOCK_D`` multiplies of the accumulator and the ``exp2`` of ``alpha``.
    Returns ``(p, acc, m_i, l_i)`` with ``l_i`` already including ``p``'s row sums.
    """
    m_blk = tl.max(raw, 1) * qk_scale
    # +inf where a row saw its first key (m_i = -inf); 0 where the block adds nothing new
    grow = tl.where(m_blk > m_i, m_blk - m_i, 0.0)
    if tl.max(grow, 0) > THRESHOLD:
        m_new = tl.maximum(m_i, m_blk)
        if MASKED:
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_ref = m_new
        alpha = tl.exp2(m_i - m_ref)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    if MASKED:
        m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    else:
        m_use = m_i
    p = tl.exp2(raw * qk_scale - m_use[:, None])
    l_i = l_i + tl.sum(p, 1)
    return p, acc, m_i, l_i


@triton.jit
def _attend_block(
    acc, m_i, l_i, q, qpe, k_src, v_src, kpe_src, start_n,
    offs_m, offs_n, offs_d, offs_p, d_ok, p_ok,
    stride_kt, stride_kd, stride_vt, stride_vd, stride_et, stride_ep,
    L, S, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, EVEN_P: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr, RESCALE_THRESHOLD: tl.constexpr,
):
    """One key block: scores, online-softmax update, P @ V. Reads BLOCK_N * (2D + P) elements.

    ``k_src``, ``v_src``, ``kpe_src`` are this (sequence, head)'s base pointers, or with
    ``USE_TMA`` tensor descriptors over ``[L, D]`` / ``[L, P]`` (rows past L and columns past
    D, P read as zeros, so the loads need no mask).
    """
    offs_j = start_n + offs_n
    j_ok = offs_j < L
    if USE_TMA:
        k = k_src.load([start_n, 0])
        kpe = kpe_src.load([start_n, 0])
    else:
        k = load_tile(k_src + offs_j[:, None] * stride_kt + offs_d[None, :] * stride_kd, j_ok, d_ok,
                      MASKED, not EVEN_D)
        kpe = load_tile(kpe_src + offs_j[:, None] * stride_et + offs_p[None, :] * stride_ep, j_ok, p_ok,
                        MASKED, not EVEN_P)
    # raw scores: d = 128 and p = 64 as two chained tensor-core dots into one accumulator
    scores = tl.dot(q, tl.trans(operand(k, UPCAST)), input_precision=PRECISION)
    scores = tl.dot(qpe, tl.trans(operand(kpe, UPCAST)), scores, input_precision=PRECISION)
    if MASKED:
        visible = j_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_j[None, :] <= (L - S + offs_m)[:, None])
        scores = tl.where(visible, scores, float("-inf"))
    if RESCALE_THRESHOLD > 0:
        p, acc, m_i, l_i = _softmax_step_lazy(scores, m_i, l_i, acc, qk_scale, MASKED, RESCALE_THRESHOLD)
    else:
        p, alpha, m_i, l_i = _softmax_step_scaled(scores, m_i, l_i, qk_scale, MASKED)
        acc = acc * alpha[:, None]
    if USE_TMA:
        v = v_src.load([start_n, 0])
    else:
        v = load_tile(v_src + offs_j[:, None] * stride_vt + offs_d[None, :] * stride_vd, j_ok, d_ok,
                      MASKED, not EVEN_D)
    # p is rounded to the storage dtype like on the tensor cores, then upcast under the interpreter
    p_op = operand(to_storage(p, v.dtype, UPCAST), UPCAST)
    acc = tl.dot(p_op, operand(v, UPCAST), acc, input_precision=PRECISION)
    return acc, m_i, l_i


@triton.jit
def _flash_attention_kernel(
    q_ptr, qpe_ptr, k_ptr, v_ptr, kpe_ptr, o_ptr, lse_ptr, seqlens_ptr,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_pb, stride_ph, stride_ps, stride_pp,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_eb, stride_et, stride_ep,
    stride_ob, stride_oh, stride_os, stride_ox, stride_od,
    stride_lb, stride_lh, stride_ls, stride_lx,
    H, S, T, qk_scale,
    D: tl.constexpr, P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_SEQLENS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    MASKED_STAGES: tl.constexpr = None, USE_TMA: tl.constexpr = False, RESCALE_THRESHOLD: tl.constexpr = 0.0,
):
    """Grid (cdiv(S, BLOCK_M), B * H, NUM_SPLITS). Reads BLOCK_M (D + P) query elements once and
    (2D + P) elements per visible key; writes BLOCK_M (D + 1) outputs (to the split slot ``x``).

    Rows with no visible key (possible only when L < S, which the hybrid's expanded part uses)
    get o = 0 and lse = -inf.

    Row blocks run last-first (``pid_m`` reversed): in causal prefill the last row blocks see
    the most keys, so the longest programs start in the first wave and the short ones fill the
    tail. ``MASKED_STAGES`` pipelines the short masked loop at its own depth (None: the
    launch's); 1 frees the registers its prefetch buffers hold (~50 at 128 x 64 tiles).

    ``USE_TMA`` reads q, qpe and the key blocks through tensor descriptors built per program
    (TMA on sm_90; needs unit last strides and 16-byte aligned bases and strides, which the
    launcher checks). ``RESCALE_THRESHOLD`` > 0 rescales the accumulator lazily
    (:func:`_softmax_step_lazy`); 0 rescales it every block.
    """
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_x = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    if HAS_SEQLENS:
        L = tl.load(seqlens_ptr + b)
    else:
        L = T
    EVEN_D: tl.constexpr = BLOCK_D == D
    EVEN_P: tl.constexpr = BLOCK_P == P

    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_p = tl.arange(0, BLOCK_P)
    m_ok = offs_m < S
    d_ok = offs_d < D
    p_ok = offs_p < P

    # read q, qpe once: BLOCK_M * (D + P) elements
    if USE_TMA:
        # descriptors over this (sequence, head): out-of-range rows / columns read as zeros
        L_rows = tl.maximum(L, 1)
        q_desc = tl.make_tensor_descriptor(q_ptr + b * stride_qb + h * stride_qh, shape=[S, D],
                                           strides=[stride_qs, 1], block_shape=[BLOCK_M, BLOCK_D])
        qpe_desc = tl.make_tensor_descriptor(qpe_ptr + b * stride_pb + h * stride_ph, shape=[S, P],
                                             strides=[stride_ps, 1], block_shape=[BLOCK_M, BLOCK_P])
        q = q_desc.load([m0, 0])
        qpe = qpe_desc.load([m0, 0])
        k_src = tl.make_tensor_descriptor(k_ptr + b * stride_kb + h * stride_kh, shape=[L_rows, D],
                                          strides=[stride_kt, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_ptr + b * stride_vb + h * stride_vh, shape=[L_rows, D],
                                          strides=[stride_vt, 1], block_shape=[BLOCK_N, BLOCK_D])
        kpe_src = tl.make_tensor_descriptor(kpe_ptr + b * stride_eb, shape=[L_rows, P],
                                            strides=[stride_et, 1], block_shape=[BLOCK_N, BLOCK_P])
    else:
        q = load_tile(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs
                      + offs_d[None, :] * stride_qd, m_ok, d_ok, True, not EVEN_D)
        qpe = load_tile(qpe_ptr + b * stride_pb + h * stride_ph + offs_m[:, None] * stride_ps
                        + offs_p[None, :] * stride_pp, m_ok, p_ok, True, not EVEN_P)
        k_src = k_ptr + b * stride_kb + h * stride_kh
        v_src = v_ptr + b * stride_vb + h * stride_vh
        kpe_src = kpe_ptr + b * stride_eb
    q = operand(q, UPCAST)
    qpe = operand(qpe, UPCAST)

    # key range of this program: [0, hi) visible to some row; [0, n_full) visible to every row
    lo, hi, n_full = split_key_range(L, L - S + m0, BLOCK_M, CAUSAL, pid_x, NUM_SPLITS, BLOCK_N)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # blocks every row sees: no mask
    for start_n in range(lo, tl.minimum(hi, n_full), BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q, qpe, k_src, v_src, kpe_src, start_n, offs_m, offs_n, offs_d, offs_p, d_ok, p_ok,
            stride_kt, stride_kd, stride_vt, stride_vd, stride_et, stride_ep, L, S, qk_scale,
            False, CAUSAL, EVEN_D, EVEN_P, UPCAST, PRECISION, USE_TMA,
            RESCALE_THRESHOLD)
    # diagonal and ragged tail: masked
    for start_n in tl.range(tl.maximum(lo, n_full), hi, BLOCK_N, num_stages=MASKED_STAGES):
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q, qpe, k_src, v_src, kpe_src, start_n, offs_m, offs_n, offs_d, offs_p, d_ok, p_ok,
            stride_kt, stride_kd, stride_vt, stride_vd, stride_et, stride_ep, L, S, qk_scale,
            True, CAUSAL, EVEN_D, EVEN_P, UPCAST, PRECISION, USE_TMA,
            RESCALE_THRESHOLD)

    # write o (BLOCK_M * D) and lse (BLOCK_M)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = finalize_lse(m_i, l_i)
    o_ptrs = (o_ptr + b * stride_ob + h * stride_oh + pid_x * stride_ox + offs_m[:, None] * stride_os
              + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, to_storage(o, o_ptr.dtype.element_ty, UPCAST), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + pid_x * stride_lx + offs_m * stride_ls, lse, mask=m_ok)


# ----------------------------------------------------------------------------------------------
# launch configs
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FlashAttentionConfig:
    """Launch config of the expanded kernel.

    block_m : query rows per program (>= 16: the tensor-core dot needs it; decode pads s = 1).
    block_n : keys per inner iteration (>= 16).
    num_warps, num_stages : Triton launch options.
    num_splits : split-KV factor (> 1 adds a combine pass; for decode with few (b, h) programs).
    masked_stages : pipeline depth of the short masked (diagonal / tail) loop; 0 = the launch's.
    rescale_threshold : lazy accumulator rescale (log2 units, 0 < x <= 16): the accumulator and
        the row sums are rescaled only in blocks where some row's max grew by more than this;
        0 = rescale every block. Exact either way (see ``_softmax_step_lazy``).
    tma : read q, qpe, k, v, kpe through TMA tensor descriptors built in the kernel (sm_90);
        the launcher falls back to pointer loads when the inputs' strides or alignment do not
        allow TMA (:func:`tma_compatible`).
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int = 1
    masked_stages: int = 0
    rescale_threshold: float = 0.0
    tma: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"FlashAttentionConfig.{name} must be a power of two >= 16, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"FlashAttentionConfig.num_warps must be a power of two <= 16, got {self.num_warps}")
        if self.num_stages < 1 or self.num_splits < 1:
            raise ValueError(f"FlashAttentionConfig: num_stages and num_splits must be >= 1, got {self}")
        if self.masked_stages < 0:
            raise ValueError(f"FlashAttentionConfig.masked_stages must be >= 0, got {self.masked_stages}")
        if not 0.0 <= self.rescale_threshold <= 16.0:
            raise ValueError("FlashAttentionConfig.rescale_threshold must lie in [0, 16] (log2 units), "
                             f"got {self.rescale_threshold}")

    def label(self) -> str:
        """Short name for tables: ``m128n64w8s3`` (+ ``x4`` splits, ``k1`` masked stages,
        ``r8`` lazy rescale threshold, ``t`` TMA loads)."""
        out = f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_stages}"
        if self.num_splits > 1:
            out += f"x{self.num_splits}"
        if self.masked_stages:
            out += f"k{self.masked_stages}"
        if self.rescale_threshold:
            out += f"r{self.rescale_threshold:g}"
        if self.tma:
            out += "t"
        return out


def _splits_for(programs: int, t: int, block_n: int, sms: int) -> int:
    """Split-KV factor: enough programs for ~2 waves, each split at least 4 key blocks long."""
    if programs >= sms:
        return 1
    return max(1, min(cdiv(2 * sms, programs), t // (4 * block_n), 64))


#: shared memory per SM on sm_90 (two programs co-reside when both fit, with 1 KiB reserved each)
SMEM_PER_SM = 233_472


def smem_bytes(block_m: int, block_n: int, num_stages: int, d: int = 128, p: int = 64, itemsize: int = 2) -> int:
    """Shared memory the kernel requests: q/qpe tiles once plus ``num_stages`` buffers of the
    k, kpe, v key blocks (matches Triton's ``metadata.shared`` for the sm_90 build)."""
    dd, pp = max(16, next_pow2(d)), max(16, next_pow2(p))
    return (block_m * (dd + pp) + num_stages * block_n * (2 * dd + pp)) * itemsize


def _default_config(b: int, h: int, s: int, t: int, d: int, p: int, sms: int) -> FlashAttentionConfig:
    """:func:`default_config` from the launch's sizes and the device's SM count."""
    block_n = 64 if d + p <= 256 else 32
    if s > 128 and smem_bytes(128, block_n, 3, d, p) <= SMEM_LIMIT:
        programs = b * h * cdiv(s, 128)
        return FlashAttentionConfig(128, block_n, 8, 3, _splits_for(programs, t, block_n, sms), masked_stages=1)
    block_m = min(64, max(16, next_pow2(s)))
    programs = b * h * cdiv(s, block_m)
    return FlashAttentionConfig(block_m, block_n, 4, 2, _splits_for(programs, t, block_n, sms))


def _sms(device) -> int:
    device = torch.device(device) if device is not None else None
    return num_sms(device.index if device is not None and device.type == "cuda" else None)


def default_config(dims: MLADims, problem: Problem, *, device=None) -> FlashAttentionConfig:
    """Analytic default, set from measurements on an H200 (``docs/kernels/flash-attention.md``).

    - s <= 64: one row block covers s queries (decode pads to 16); these points are bound by
      the key/value stream and already run at the copy bandwidth.
    - 64 < s <= 128: 64-row tiles on 4 warps, 64-key blocks, 2 stages (two programs per SM):
      3,778 us at b = 32, s = 128 against 4,197 us for 128-row tiles.
    - s > 128: 128-row tiles on 8 warps, 64-key blocks, 3 stages in the unmasked loop and 1 in
      the short masked (diagonal) loop, which frees the registers the third stage needs:
      11,040 us at s = 512 and 20,653 us at s = 1024 (b = 32; 62-67 % of the 801 TFLOP/s matmul
      rate) against 13,985 / 25,445 us for the 2-stage tile, and 6,108 us on causal prefill
      s = t = 4096, b = 4.
    Falls back to the 64-row tile when the deeper one does not fit in shared memory. Split-KV
    when (b, h, row blocks) fill under one wave of ``device``'s SMs (default: the current GPU).
    """
    return _default_config(problem.b, dims.h, problem.s, problem.t, dims.d, dims.p, _sms(device))


def _candidate_configs(b: int, h: int, s: int, t: int, d: int, p: int, sms: int) -> tuple[FlashAttentionConfig, ...]:
    block_ms = sorted({min(64, max(16, next_pow2(s))), *([64, 128] if s > 64 else [])})
    out = []
    for bm, bn, warps, stages in itertools.product(block_ms, (32, 64, 128), (4, 8), (2, 3, 4)):
        if bm * bn > 128 * 128 or (bm >= 128 and warps < 8) or smem_bytes(bm, bn, stages, d, p) > SMEM_LIMIT:
            continue
        programs = b * h * cdiv(s, bm)
        for splits in sorted({1, _splits_for(programs, t, bn, sms)}):
            out.append(FlashAttentionConfig(bm, bn, warps, stages, splits))
            if bm >= 128 and splits == 1:
                out.append(FlashAttentionConfig(bm, bn, warps, stages, splits, masked_stages=1))
                if smem_bytes(bm, bn, stages, d, p) + 1024 <= SMEM_LIMIT:
                    out.append(FlashAttentionConfig(bm, bn, warps, stages, splits, tma=True))
                    out.append(FlashAttentionConfig(bm, bn, warps, stages, splits, rescale_threshold=8.0, tma=True))
    return tuple(out)


def candidate_configs(dims: MLADims, problem: Problem, *, device=None) -> tuple[FlashAttentionConfig, ...]:
    """The autotuning space around :func:`default_config` (tiles x warps x stages x splits, and
    for 128-row tiles a single-stage masked loop and TMA loads with and without the lazy
    rescale), without configs whose shared memory exceeds the sm_90 limit (TMA adds its
    barriers, < 1 KiB, to :func:`smem_bytes`)."""
    return _candidate_configs(problem.b, dims.h, problem.s, problem.t, dims.d, dims.p, _sms(device))


# ----------------------------------------------------------------------------------------------
# launchers
# ----------------------------------------------------------------------------------------------

def tma_compatible(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can address every tensor: unit last stride, 16-byte aligned base
    and other strides, at most 5 dims (the kernel's in-kernel descriptors need this)."""
    for x in tensors:
        size = x.element_size()
        if x.dim() > 5 or x.stride(-1) != 1 or x.data_ptr() % 16:
            return False
        if any((st * size) % 16 for st in x.stride()[:-1]):
            return False
    return True


def _tma_workspace(size: int, alignment: int, stream) -> torch.Tensor:
    """Global scratch for the descriptors a kernel builds (128 bytes per program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Install :func:`_tma_workspace` as Triton's allocator unless one is already set (kernels
    that build tensor descriptors need it on the GPU)."""
    try:
        from triton.runtime import _allocation
        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_tma_workspace)


def _precision(dtype: torch.dtype) -> str:
    # float32 inputs (interpreter only) get exact fp32 dots; bf16/fp16 use the tensor cores
    return "ieee" if dtype == torch.float32 else "tf32"


def arg_types(kwargs: dict) -> dict:
    """Launch arguments with tensors replaced by Triton pointer type strings (``"*bf16"``), the
    form :func:`mla_var3.kernel.sass.compile_launch_in_subprocess` takes."""
    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
    return {k: f"*{names[v.dtype]}" if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def named_strides(names: str, strides) -> dict:
    """``{"stride_qb": ..., ...}`` from space-separated parameter names and a stride tuple."""
    names = names.split()
    if len(names) != len(strides):
        raise ValueError(f"{len(names)} stride names for {len(strides)} strides")
    return dict(zip(names, strides))


def _kernel_args(q, qpe, k, v, kpe, o_dst, lse_dst, seqlens, scale: float, causal: bool,
                 config: FlashAttentionConfig, upcast: bool) -> tuple[tuple, dict]:
    """(grid, kernel arguments by name). ``o_dst`` is [B,H,S,D] or, with splits, the partial
    buffer [B,H,S,NS,D] (``lse_dst`` [B,H,S] or [B,H,S,NS])."""
    b, h, s, d = q.shape
    t, p = k.shape[1], kpe.shape[-1]
    # TMA boxes are at most 256 elements per dim
    use_tma = (config.tma and tma_compatible(q, qpe, k, v, kpe)
               and max(next_pow2(d), next_pow2(p), config.block_m, config.block_n) <= 256)
    if config.num_splits > 1:
        o_strides, l_strides = o_dst.stride(), lse_dst.stride()
    else:
        o_strides = (o_dst.stride(0), o_dst.stride(1), o_dst.stride(2), 0, o_dst.stride(3))
        l_strides = (*lse_dst.stride(), 0)
    strides = {
        **named_strides("stride_qb stride_qh stride_qs stride_qd", q.stride()),
        **named_strides("stride_pb stride_ph stride_ps stride_pp", qpe.stride()),
        **named_strides("stride_kb stride_kt stride_kh stride_kd", k.stride()),
        **named_strides("stride_vb stride_vt stride_vh stride_vd", v.stride()),
        **named_strides("stride_eb stride_et stride_ep", kpe.stride()),
        **named_strides("stride_ob stride_oh stride_os stride_ox stride_od", o_strides),
        **named_strides("stride_lb stride_lh stride_ls stride_lx", l_strides),
    }
    args = dict(
        q_ptr=q, qpe_ptr=qpe, k_ptr=k, v_ptr=v, kpe_ptr=kpe, o_ptr=o_dst, lse_ptr=lse_dst,
        seqlens_ptr=seqlens if seqlens is not None else lse_dst, **strides,
        H=h, S=s, T=t, qk_scale=scale * LOG2E,
        D=d, P=p, BLOCK_D=max(16, next_pow2(d)), BLOCK_P=max(16, next_pow2(p)),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, NUM_SPLITS=config.num_splits,
        CAUSAL=bool(causal), HAS_SEQLENS=seqlens is not None, UPCAST=upcast, PRECISION=_precision(q.dtype),
        MASKED_STAGES=config.masked_stages or None, USE_TMA=use_tma,
        RESCALE_THRESHOLD=float(config.rescale_threshold),
    )
    return (cdiv(s, config.block_m), b * h, config.num_splits), args


def _launch(q, qpe, k, v, kpe, o, lse, seqlens, scale: float, causal: bool, config: FlashAttentionConfig) -> None:
    """Run the kernel without validation (shapes already checked; L may be < S for the hybrid).

    o [B,H,S,D] and lse [B,H,S] float32 are written in place (any strides, o in any float dtype).
    """
    b, h, s, d = q.shape
    splits = config.num_splits
    o_dst, lse_dst = o, lse
    if splits > 1:
        o_dst = torch.empty((b, h, s, splits, d), dtype=torch.float32, device=q.device)
        lse_dst = torch.empty((b, h, s, splits), dtype=torch.float32, device=q.device)
    grid, args = _kernel_args(q, qpe, k, v, kpe, o_dst, lse_dst, seqlens, scale, causal, config, interpreting())
    if args["USE_TMA"] and not interpreting():
        _ensure_allocator()
    _flash_attention_kernel[grid](**args, num_warps=config.num_warps, num_stages=config.num_stages)
    if splits > 1:
        combine(o_dst, lse_dst, o, lse)


def example_launch(b: int, h: int, s: int, t: int, d: int = 128, p: int = 64, *,
                   dtype: torch.dtype = torch.bfloat16, causal: bool = True, ragged: bool = False,
                   config: FlashAttentionConfig | None = None) -> tuple[dict, FlashAttentionConfig]:
    """The GPU launch arguments of the kernel for a problem (contiguous inputs, pointers as type
    strings) and the config used (default: :func:`default_config`), for compiling it without a
    GPU via :func:`mla_var3.kernel.sass.compile_launch_in_subprocess`."""
    config = config or _default_config(b, h, s, t, d, p, num_sms())
    meta = dict(dtype=dtype, device="meta")
    q, qpe = torch.empty(b, h, s, d, **meta), torch.empty(b, h, s, p, **meta)
    k, v, kpe = torch.empty(b, t, h, d, **meta), torch.empty(b, t, h, d, **meta), torch.empty(b, t, p, **meta)
    ns = config.num_splits
    f32 = dict(dtype=torch.float32, device="meta")
    o = torch.empty(b, h, s, ns, d, **f32) if ns > 1 else torch.empty(b, h, s, d, **meta)
    lse = torch.empty(b, h, s, ns, **f32) if ns > 1 else torch.empty(b, h, s, **f32)
    seqlens = torch.empty(b, dtype=torch.int32, device="meta") if ragged else None
    _, args = _kernel_args(q, qpe, k, v, kpe, o, lse, seqlens, (d + p) ** -0.5, causal, config, False)
    return arg_types(args), config


def flash_attention_portable(q, qpe, k, v, kpe, *, scale, causal, seqlens, config, out):
    """The portable Triton backend of :func:`flash_attention` (inputs already validated)."""
    b, h, s, d = q.shape
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    if b * h * s == 0:
        return out, lse
    config = config or _default_config(b, h, s, k.shape[1], d, kpe.shape[-1], _sms(q.device))
    _launch(q, qpe, k, v, kpe, out, lse, seqlens, scale, causal, config)
    return out, lse


backends.register("flash_attention", "triton", flash_attention_portable)


def flash_attention(q: torch.Tensor, qpe: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kpe: torch.Tensor, *,
                    scale: float | None = None, causal: bool = True, seqlens: torch.Tensor | None = None,
                    config: FlashAttentionConfig | None = None, out: torch.Tensor | None = None,
                    backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Expanded attention with a shared RoPE key.

    Parameters
    ----------
    q : [B, H, S, D]      no-RoPE query (bf16/fp16; float32 too under the interpreter)
    qpe : [B, H, S, P]    RoPE query
    k, v : [B, T, H, D]   expanded keys and values (T includes the S new tokens, so S <= T)
    kpe : [B, T, P]       RoPE key, one per token, shared by all heads
    scale : softmax scale, default ``(D + P) ** -0.5``
    causal : query i sees keys ``j <= L - S + i`` (L = T or ``seqlens[b]``)
    seqlens : [B] int32/int64, optional; valid keys per sequence, S <= seqlens[b] <= T
    config : launch config, default :func:`default_config`
    out : [B, H, S, D] in q's dtype, optional output buffer (any strides)
    backend : ``"auto"`` or a registered backend name (see :mod:`mla_var3.kernel.backends`)

    Any strides are accepted for every input. Returns ``(o [B,H,S,D] in q's dtype,
    lse [B,H,S] float32)``, lse the natural-log LSE of the scaled scores.
    """
    check_inference(q, qpe, k, v, kpe)
    sizes: dict[str, int] = {}
    bind_shape("q", q, "B H S D", sizes)
    check_device("q", q)
    dev = q.device
    dtypes = allowed_dtypes(dev)
    bind_shape("q", q, "B H S D", sizes, dtypes=dtypes)
    bind_shape("qpe", qpe, "B H S P", sizes, dtypes=(q.dtype,), device=dev)
    bind_shape("k", k, "B T H D", sizes, dtypes=(q.dtype,), device=dev)
    bind_shape("v", v, "B T H D", sizes, dtypes=(q.dtype,), device=dev)
    bind_shape("kpe", kpe, "B T P", sizes, dtypes=(q.dtype,), device=dev)
    b, h, s, d, t, p = (sizes[x] for x in "BHSDTP")
    if s > t:
        raise ValueError(f"q has S={s} query tokens but k/v hold only T={t} keys (T includes the new tokens: S <= T)")
    if d == 0 or p == 0:
        raise ValueError(f"head dims must be positive, got D={d}, P={p}")
    scale = float(d + p) ** -0.5 if scale is None else check_scale(scale)
    seqlens = check_seqlens(seqlens, b, t, s, dev)
    if out is None:
        out = torch.empty((b, h, s, d), dtype=q.dtype, device=dev)
    else:
        bind_output("out", out, "B H S D", dict(sizes), dtypes=(q.dtype,), device=dev)
    run = backends.select("flash_attention", dev, backend)
    return run(q, qpe, k, v, kpe, scale=scale, causal=bool(causal), seqlens=seqlens, config=config, out=out)

"""The hybrid, ``mla_var6_plus`` (design 3): O old tokens latent, N newest expanded, one softmax over O + N.

Design: two partial passes and an LSE merge
--------------------------------------------
The two parts want different programs. The latent part is the absorbed computation: every head
scores against the same ``z_old`` [B, O, K], so a program takes a *group of heads x queries* as
its rows and reads each Z block once for all of them (Z is both key and value). The expanded
part reads per-head ``k_new``, ``v_new`` [B, N, H, D], so a program takes one head's queries —
exactly the expanded kernel of :mod:`mla_var3.kernel.expanded`, run on the new tokens::

    latent part    (this module)      o_l  [B,H,S,K] fp32, lse_l   over keys 0 .. O-1
    expanded part  (flash_attention)  o_e  [B,H,S,D] fp32, lse_e   over keys O .. O+N-1
    merge          (this module)      lse = log(exp(lse_l) + exp(lse_e))
                                      o_latent = o_l * exp(lse_l - lse),  o = o_e * exp(lse_e - lse)

Each part is normalised by its own softmax sum; the merge rescales both to the one softmax over
all O + N keys, so ``o + decompress(o_latent, w_uv)`` is the attention output. The parts are
independent launches, issued here one after the other on the current stream (the sm_90 backend
below issues them on two streams, or on an SM partition, so that the compute-bound latent part
and the memory-bound expanded part overlap); the merge reads both partials once and writes the
outputs in the input dtype. When O = 0 (or
N = 0) only the expanded (or latent) part runs, writing its output directly, and the other
output is zero; the default call with N = 0 is the absorbed design and runs its kernel
(:func:`mla_var3.kernel.absorbed.flash_mla`).

Causal rule with T = O + N keys: query i sees key j <= T - S + i. The expanded part is the
expanded kernel with L = N (query i sees new key j' <= N - S + i); when N < S its first S - N
queries see no new key (lse_e = -inf, weight 0) and the mask reaches into the latent part, which
applies ``j <= T - S + i`` to old keys. Every query sees key 0, so the merged lse is finite.

Both parts split their key range over ``num_splits`` programs when (b, heads, queries) alone do
not fill the GPU; their split partials are merged by :func:`mla_var3.kernel.combine.combine`.
The hybrid merge itself is not that combine: the two parts have different values (D vs K wide)
that stay separate outputs, each rescaled by its own weight, rather than one value summed over
ranges. The partials are float32 so the outputs are rounded once; fusing the merge into the
parts (and the two parts into one persistent launch) is left to the speed work.

On sm_90 the ``"gluon"`` backend (:mod:`mla_var3.kernel.hopper.hybrid_hopper`) runs the latent
part on the Gluon absorbed kernel instead (non-causal over the O old keys when N >= S) and the
expanded part through the public expanded launcher or, on an SM partition, the Gluon window
kernel, issued on two streams so the two may overlap, then the same merge. The devlog with predictions
and measurements is docs/kernels/mla-var6-plus/ (README.md: the state against the bar, then the
parts by topic).

Example
-------
>>> o, o_latent, lse = mla_var6_plus(q, qpe, qc, z_old, kpe, k_new, v_new, scale=dims.default_scale)  # doctest: +SKIP
>>> out = decompress(o_latent, w_uv, o)                                                            # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from mla_var3.kernel import absorbed as _absorbed
from mla_var3.kernel import backends
from mla_var3.kernel import expanded as _fa
from mla_var3.kernel._common import (
    CPU_DTYPES, GPU_DTYPES, allowed_dtypes, bind_output, bind_shape, cdiv, check_device, check_inference, check_scale,
    cuda_index, interpreting, next_pow2,
)
from mla_var3.kernel._jit import LOG2E, LOG2E_C, finalize_lse, online_softmax_step, operand, split_key_range, to_storage
from mla_var3.kernel._launch import CachedLaunch, int_classes
from mla_var3.kernel.combine import combine
from mla_var3.kernel.decode import AbsorbedDecode
from mla_var3.kernel.expanded import FlashAttentionConfig, load_tile, named_strides
from mla_var3.shapes import MLADims, Problem

__all__ = ["HybridDecode", "LatentPartConfig", "MLAVar6PlusConfig", "default_config", "candidate_configs",
           "example_launch", "expanded_persistent", "merge_partials", "mla_var6_plus"]


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------

@triton.jit
def _latent_block(
    acc, m_i, l_i, qc, qpe, z_base, kpe_base, start_n, offs_n, offs_k, offs_p, k_ok, p_ok, limit,
    stride_zt, stride_zk, stride_et, stride_ep, O, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_K: tl.constexpr, EVEN_P: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """One block of old keys for a group of rows. Reads BLOCK_N * (K + P) elements: Z is the key
    and the value."""
    offs_j = start_n + offs_n
    j_ok = offs_j < O
    z = load_tile(z_base + offs_j[:, None] * stride_zt + offs_k[None, :] * stride_zk, j_ok, k_ok, MASKED, not EVEN_K)
    kpe = load_tile(kpe_base + offs_j[:, None] * stride_et + offs_p[None, :] * stride_ep, j_ok, p_ok,
                    MASKED, not EVEN_P)
    z_op = operand(z, UPCAST)
    scores = tl.dot(qc, tl.trans(z_op), input_precision=PRECISION)
    scores = tl.dot(qpe, tl.trans(operand(kpe, UPCAST)), scores, input_precision=PRECISION)
    scores = scores * qk_scale
    if MASKED:
        visible = j_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_j[None, :] <= limit[:, None])
        scores = tl.where(visible, scores, float("-inf"))
    p, alpha, m_i, l_i = online_softmax_step(scores, m_i, l_i)
    p_op = operand(to_storage(p, z.dtype, UPCAST), UPCAST)
    acc = tl.dot(p_op, z_op, acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_i, l_i


@triton.jit
def _latent_part_kernel(
    qc_ptr, qpe_ptr, z_ptr, kpe_ptr, o_ptr, lse_ptr,
    stride_cb, stride_ch, stride_cs, stride_ck,
    stride_pb, stride_ph, stride_ps, stride_pp,
    stride_zb, stride_zt, stride_zk,
    stride_eb, stride_et, stride_ep,
    stride_ob, stride_oh, stride_os, stride_ox, stride_ok,
    stride_lb, stride_lh, stride_ls, stride_lx,
    H, S, O, T, qk_scale,
    K: tl.constexpr, P: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """Latent part. Grid (cdiv(S, BLOCK_S) * cdiv(H, BLOCK_H), B, NUM_SPLITS); a program's rows
    are BLOCK_H heads x BLOCK_S queries, so each Z block is read once for all of them.

    Reads BLOCK_H*BLOCK_S*(K + P) query elements and (K + P) per visible old key; writes
    BLOCK_H*BLOCK_S*(K + 1) outputs. Query i (of S) sees old key j < O with j <= T - S + i.
    """
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    pid_x = tl.program_id(2)
    num_s_blocks = tl.cdiv(S, BLOCK_S)
    s0 = (pid % num_s_blocks) * BLOCK_S
    h0 = (pid // num_s_blocks) * BLOCK_H
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_S
    EVEN_K: tl.constexpr = BLOCK_K == K
    EVEN_P: tl.constexpr = BLOCK_P == P

    r = tl.arange(0, BLOCK_M)
    hh = h0 + r // BLOCK_S
    ii = s0 + r % BLOCK_S
    row_ok = (hh < H) & (ii < S)
    hh64 = hh.to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_p = tl.arange(0, BLOCK_P)
    k_ok = offs_k < K
    p_ok = offs_p < P

    # read qc, qpe for the row group: BLOCK_M * (K + P) elements
    qc_rows = qc_ptr + b * stride_cb + hh64 * stride_ch + ii * stride_cs
    qc = load_tile(qc_rows[:, None] + offs_k[None, :] * stride_ck, row_ok, k_ok, True, not EVEN_K)
    qpe_rows = qpe_ptr + b * stride_pb + hh64 * stride_ph + ii * stride_ps
    qpe = load_tile(qpe_rows[:, None] + offs_p[None, :] * stride_pp, row_ok, p_ok, True, not EVEN_P)
    qc = operand(qc, UPCAST)
    qpe = operand(qpe, UPCAST)
    z_base = z_ptr + b * stride_zb
    kpe_base = kpe_ptr + b * stride_eb
    limit = T - S + ii

    lo, hi, n_full = split_key_range(O, T - S + s0, BLOCK_S, CAUSAL, pid_x, NUM_SPLITS, BLOCK_N)

    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(lo, tl.minimum(hi, n_full), BLOCK_N):
        acc, m_i, l_i = _latent_block(
            acc, m_i, l_i, qc, qpe, z_base, kpe_base, start_n, offs_n, offs_k, offs_p, k_ok, p_ok, limit,
            stride_zt, stride_zk, stride_et, stride_ep, O, qk_scale, False, CAUSAL, EVEN_K, EVEN_P, UPCAST, PRECISION)
    for start_n in range(tl.maximum(lo, n_full), hi, BLOCK_N):
        acc, m_i, l_i = _latent_block(
            acc, m_i, l_i, qc, qpe, z_base, kpe_base, start_n, offs_n, offs_k, offs_p, k_ok, p_ok, limit,
            stride_zt, stride_zk, stride_et, stride_ep, O, qk_scale, True, CAUSAL, EVEN_K, EVEN_P, UPCAST, PRECISION)

    # write o_latent (BLOCK_M * K) and lse (BLOCK_M)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = finalize_lse(m_i, l_i)
    o_rows = o_ptr + b * stride_ob + hh64 * stride_oh + ii * stride_os + pid_x * stride_ox
    tl.store(o_rows[:, None] + offs_k[None, :] * stride_ok, to_storage(o, o_ptr.dtype.element_ty, UPCAST),
             mask=row_ok[:, None] & k_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + hh64 * stride_lh + ii * stride_ls + pid_x * stride_lx, lse, mask=row_ok)


@triton.jit
def _rescale_rows(src_base, dst_base, rows, row_ok, w, stride_sr, stride_sc, stride_dr, stride_dc,
                  WIDTH, BLOCK_C: tl.constexpr, UPCAST: tl.constexpr):
    """dst[r, :] = w[r] * src[r, :] over WIDTH columns in BLOCK_C chunks."""
    for c0 in range(0, WIDTH, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < WIDTH)[None, :]
        x = tl.load(src_base + rows[:, None] * stride_sr + cols[None, :] * stride_sc, mask=mask, other=0.0)
        y = tl.where(w[:, None] > 0, x * w[:, None], 0.0)
        tl.store(dst_base + rows[:, None] * stride_dr + cols[None, :] * stride_dc,
                 to_storage(y, dst_base.dtype.element_ty, UPCAST), mask=mask)


@triton.jit
def _merge_kernel(
    oe_ptr, le_ptr, ol_ptr, ll_ptr, o_ptr, olat_ptr, lse_ptr,
    stride_eb, stride_eh, stride_es, stride_ed,
    stride_leb, stride_leh, stride_les,
    stride_lb, stride_lh, stride_ls, stride_lk,
    stride_llb, stride_llh, stride_lls,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_ab, stride_ah, stride_as, stride_ak,
    stride_xb, stride_xh, stride_xs,
    H, S, D, K,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, UPCAST: tl.constexpr,
):
    """Grid (cdiv(S, BLOCK_R), B * H). Reads BLOCK_R * (D + K + 2) fp32 partials; writes
    BLOCK_R * (D + K) outputs and BLOCK_R lse."""
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < S
    lse_e = tl.load(le_ptr + b * stride_leb + h * stride_leh + rows * stride_les, mask=row_ok, other=float("-inf"))
    lse_l = tl.load(ll_ptr + b * stride_llb + h * stride_llh + rows * stride_lls, mask=row_ok, other=float("-inf"))
    m = tl.maximum(lse_e, lse_l)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w_e = tl.exp2((lse_e - m_safe) * LOG2E_C)
    w_l = tl.exp2((lse_l - m_safe) * LOG2E_C)
    total = w_e + w_l
    total_safe = tl.where(total > 0, total, 1.0)
    lse = tl.where(total > 0, m_safe + tl.log2(total_safe) / LOG2E_C, float("-inf"))
    tl.store(lse_ptr + b * stride_xb + h * stride_xh + rows * stride_xs, lse, mask=row_ok)
    _rescale_rows(oe_ptr + b * stride_eb + h * stride_eh, o_ptr + b * stride_ob + h * stride_oh, rows, row_ok,
                  w_e / total_safe, stride_es, stride_ed, stride_os, stride_od, D, BLOCK_C, UPCAST)
    _rescale_rows(ol_ptr + b * stride_lb + h * stride_lh, olat_ptr + b * stride_ab + h * stride_ah, rows, row_ok,
                  w_l / total_safe, stride_ls, stride_lk, stride_as, stride_ak, K, BLOCK_C, UPCAST)


@triton.jit
def _expanded_persistent_kernel(
    q_ptr, qpe_ptr, k_ptr, v_ptr, kpe_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_pb, stride_ph, stride_ps, stride_pp,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_eb, stride_et, stride_ep,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls,
    B, H, S, L, qk_scale,
    D: tl.constexpr, P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """Expanded part as a *persistent* launch: grid (NUM_PROGRAMS,), program i takes the tiles
    i, i + NUM_PROGRAMS, ... of the B * H * cdiv(S, BLOCK_M) (sequence, head, query block) tiles.
    A small grid holds only NUM_PROGRAMS SMs, leaving the others to a concurrent latent part.

    Per tile: reads BLOCK_M (D + P) query elements and (2D + P) per visible key of the L new
    keys; writes BLOCK_M (D + 1). Query i sees key j <= L - S + i (causal); a row without a
    visible key (L < S) gets o = 0, lse = -inf.
    """
    EVEN_D: tl.constexpr = BLOCK_D == D
    EVEN_P: tl.constexpr = BLOCK_P == P
    n_m = tl.cdiv(S, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_p = tl.arange(0, BLOCK_P)
    d_ok = offs_d < D
    p_ok = offs_p < P
    for tile in range(tl.program_id(0), B * H * n_m, tl.num_programs(0)):
        m0 = (tile % n_m) * BLOCK_M
        b = (tile // n_m // H).to(tl.int64)
        h = (tile // n_m % H).to(tl.int64)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < S
        q = load_tile(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs
                      + offs_d[None, :] * stride_qd, m_ok, d_ok, True, not EVEN_D)
        qpe = load_tile(qpe_ptr + b * stride_pb + h * stride_ph + offs_m[:, None] * stride_ps
                        + offs_p[None, :] * stride_pp, m_ok, p_ok, True, not EVEN_P)
        q = operand(q, UPCAST)
        qpe = operand(qpe, UPCAST)
        k_base = k_ptr + b * stride_kb + h * stride_kh
        v_base = v_ptr + b * stride_vb + h * stride_vh
        kpe_base = kpe_ptr + b * stride_eb
        _, hi, _ = split_key_range(L, L - S + m0, BLOCK_M, CAUSAL, 0, 1, BLOCK_N)    # one range: [0, hi)
        limit = L - S + offs_m
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start_n in range(0, hi, BLOCK_N):
            offs_j = start_n + offs_n
            j_ok = offs_j < L
            k = load_tile(k_base + offs_j[:, None] * stride_kt + offs_d[None, :] * stride_kd, j_ok, d_ok, True,
                          not EVEN_D)
            kpe = load_tile(kpe_base + offs_j[:, None] * stride_et + offs_p[None, :] * stride_ep, j_ok, p_ok, True,
                            not EVEN_P)
            scores = tl.dot(q, tl.trans(operand(k, UPCAST)), input_precision=PRECISION)
            scores = tl.dot(qpe, tl.trans(operand(kpe, UPCAST)), scores, input_precision=PRECISION)
            visible = j_ok[None, :]
            if CAUSAL:
                visible = visible & (offs_j[None, :] <= limit[:, None])
            scores = tl.where(visible, scores * qk_scale, float("-inf"))
            p, alpha, m_i, l_i = online_softmax_step(scores, m_i, l_i)
            v = load_tile(v_base + offs_j[:, None] * stride_vt + offs_d[None, :] * stride_vd, j_ok, d_ok, True,
                          not EVEN_D)
            p_op = operand(to_storage(p, v.dtype, UPCAST), UPCAST)
            acc = tl.dot(p_op, operand(v, UPCAST), acc * alpha[:, None], input_precision=PRECISION)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = finalize_lse(m_i, l_i)
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od,
                 to_storage(o, o_ptr.dtype.element_ty, UPCAST), mask=m_ok[:, None] & d_ok[None, :])
        tl.store(lse_ptr + b * stride_lb + h * stride_lh + offs_m * stride_ls, lse, mask=m_ok)


# ----------------------------------------------------------------------------------------------
# launch configs
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LatentPartConfig:
    """Launch config of the latent part: rows = block_h heads x block_s queries (>= 16 rows, the
    tensor-core minimum; padded when h * s is smaller), block_n old keys per iteration."""

    block_h: int = 2
    block_s: int = 16
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 2
    num_splits: int = 1

    def __post_init__(self) -> None:
        for name in ("block_h", "block_s", "block_n"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"LatentPartConfig.{name} must be a power of two, got {value}")
        if self.block_h * self.block_s < 16 or self.block_n < 16:
            raise ValueError(f"LatentPartConfig: block_h * block_s and block_n must be >= 16, got {self}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1 or self.num_splits < 1:
            raise ValueError(f"LatentPartConfig: bad num_warps/num_stages/num_splits in {self}")


@dataclass(frozen=True)
class MLAVar6PlusConfig:
    """Launch config of the hybrid: one config per part."""

    latent: LatentPartConfig = field(default_factory=LatentPartConfig)
    expanded: FlashAttentionConfig = field(default_factory=FlashAttentionConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.latent, LatentPartConfig) or not isinstance(self.expanded, FlashAttentionConfig):
            raise ValueError(f"MLAVar6PlusConfig takes a LatentPartConfig and a FlashAttentionConfig, got {self}")


def _latent_config(b: int, h: int, s: int, o: int, rows: int, block_n: int, warps: int, stages: int,
                   sms: int) -> LatentPartConfig:
    block_s = min(next_pow2(s), rows)
    block_h = min(next_pow2(h), max(1, rows // block_s))
    block_s = max(block_s, 16 // block_h)              # pad tiny h * s up to the 16-row minimum
    programs = b * cdiv(h, block_h) * cdiv(s, block_s)
    splits = _fa._splits_for(programs, o, block_n, sms)
    return LatentPartConfig(block_h, block_s, block_n, warps, stages, splits)


def default_config(dims: MLADims, problem: Problem, *, device=None) -> MLAVar6PlusConfig:
    """Analytic default: latent rows = 32 (heads x queries) per program with 32-key blocks of Z
    and 8 warps (the 32 x 512 float32 accumulator is 64 registers per thread: no spills on
    sm_90, where 64 rows spill), split-KV for small batches; the expanded part takes the
    expanded kernel's default for its N keys (``problem.n``, None = 0)."""
    b, h, s, n, sms = problem.b, dims.h, problem.s, problem.n or 0, _fa._sms(device)
    latent = _latent_config(b, h, s, problem.t - n, 32 if dims.k > 256 else 64, 32, 8, 2, sms)
    return MLAVar6PlusConfig(latent, _fa._default_config(b, h, s, max(n, 1), dims.d, dims.p, sms))


def candidate_configs(dims: MLADims, problem: Problem, *, device=None) -> tuple[MLAVar6PlusConfig, ...]:
    """The autotuning space. The parts are tuned independently: each latent candidate (row
    groups x key blocks x warps x stages, keeping the fp32 accumulator within 64 registers per
    thread) with the expanded default, and each expanded candidate with the latent default."""
    base = default_config(dims, problem, device=device)
    b, h, s, n, sms = problem.b, dims.h, problem.s, problem.n or 0, _fa._sms(device)
    latents = {_latent_config(b, h, s, problem.t - n, rows, bn, warps, stages, sms)
               for rows, bn, warps, stages in itertools.product((16, 32, 64), (16, 32, 64), (4, 8), (1, 2, 3))
               if rows * next_pow2(dims.k) <= warps * 32 * 64}
    out = {MLAVar6PlusConfig(lat, base.expanded) for lat in latents}
    out |= {MLAVar6PlusConfig(base.latent, exp)
            for exp in _fa._candidate_configs(b, h, s, max(n, 1), dims.d, dims.p, sms)}
    return (base, *sorted(out - {base}, key=repr))


# ----------------------------------------------------------------------------------------------
# launchers
# ----------------------------------------------------------------------------------------------

def _latent_args(qc, qpe, z_old, kpe_old, o_dst, l_dst, t: int, scale: float, causal: bool,
                 config: LatentPartConfig, upcast: bool) -> tuple[tuple, dict]:
    """(grid, kernel arguments by name) of the latent part; ``o_dst`` [B,H,S,K] or, with splits,
    the partial buffer [B,H,S,NS,K] (``l_dst`` [B,H,S] or [B,H,S,NS])."""
    b, h, s, k = qc.shape
    o, p = z_old.shape[1], kpe_old.shape[-1]
    if config.num_splits > 1:
        o_strides, l_strides = o_dst.stride(), l_dst.stride()
    else:
        o_strides = (o_dst.stride(0), o_dst.stride(1), o_dst.stride(2), 0, o_dst.stride(3))
        l_strides = (*l_dst.stride(), 0)
    args = dict(
        qc_ptr=qc, qpe_ptr=qpe, z_ptr=z_old, kpe_ptr=kpe_old, o_ptr=o_dst, lse_ptr=l_dst,
        **named_strides("stride_cb stride_ch stride_cs stride_ck", qc.stride()),
        **named_strides("stride_pb stride_ph stride_ps stride_pp", qpe.stride()),
        **named_strides("stride_zb stride_zt stride_zk", z_old.stride()),
        **named_strides("stride_eb stride_et stride_ep", kpe_old.stride()),
        **named_strides("stride_ob stride_oh stride_os stride_ox stride_ok", o_strides),
        **named_strides("stride_lb stride_lh stride_ls stride_lx", l_strides),
        H=h, S=s, O=o, T=t, qk_scale=scale * LOG2E,
        K=k, P=p, BLOCK_K=max(16, next_pow2(k)), BLOCK_P=max(16, next_pow2(p)),
        BLOCK_H=config.block_h, BLOCK_S=config.block_s, BLOCK_N=config.block_n, NUM_SPLITS=config.num_splits,
        CAUSAL=bool(causal), UPCAST=upcast, PRECISION=_fa._precision(qc.dtype),
    )
    return (cdiv(s, config.block_s) * cdiv(h, config.block_h), b, config.num_splits), args


def _launch_latent(qc, qpe, z_old, kpe_old, o_lat, lse, t: int, scale: float, causal: bool,
                   config: LatentPartConfig) -> None:
    """Latent part into o_lat [B,H,S,K] (any float dtype, any strides) and lse [B,H,S] float32."""
    b, h, s, k = qc.shape
    splits = config.num_splits
    o_dst, l_dst = o_lat, lse
    if splits > 1:
        o_dst = torch.empty((b, h, s, splits, k), dtype=torch.float32, device=qc.device)
        l_dst = torch.empty((b, h, s, splits), dtype=torch.float32, device=qc.device)
    grid, args = _latent_args(qc, qpe, z_old, kpe_old, o_dst, l_dst, t, scale, causal, config, interpreting())
    _latent_part_kernel[grid](**args, num_warps=config.num_warps, num_stages=config.num_stages)
    if splits > 1:
        combine(o_dst, l_dst, o_lat, lse)


def _merge_args(o_e, lse_e, o_l, lse_l, o, o_latent, lse, upcast: bool) -> tuple[tuple, tuple, tuple, dict]:
    """The merge kernel's ``(grid, tensors, integer arguments, constexprs)``, in its parameters' order."""
    b, h, s, d = o_e.shape
    block_r = min(16, next_pow2(s))
    ints = (*o_e.stride(), *lse_e.stride(), *o_l.stride(), *lse_l.stride(), *o.stride(), *o_latent.stride(),
            *lse.stride(), h, s, d, o_l.shape[-1])
    consts = dict(BLOCK_R=block_r, BLOCK_C=64 if upcast else 128, UPCAST=upcast)
    return (cdiv(s, block_r), b * h, 1), (o_e, lse_e, o_l, lse_l, o, o_latent, lse), ints, consts


_MERGE_LAUNCH = CachedLaunch(_merge_kernel)


def merge_parts(o_e, lse_e, o_l, lse_l, o, o_latent, lse) -> None:
    """Merge the expanded part ``(o_e, lse_e)`` and the latent part ``(o_l, lse_l)`` of a hybrid
    call into ``o``, ``o_latent`` and ``lse`` in place (one launch; see :func:`merge_partials`)."""
    grid, tensors, ints, consts = _merge_args(o_e, lse_e, o_l, lse_l, o, o_latent, lse, interpreting())
    key = (tuple((t.dtype, t.data_ptr() % 16) for t in tensors), int_classes(ints), consts["BLOCK_R"])
    _MERGE_LAUNCH(key, grid, (*tensors, *ints), consts, num_warps=4)


def merge_partials(o_e: torch.Tensor, lse_e: torch.Tensor, o_l: torch.Tensor, lse_l: torch.Tensor, *,
                   out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge the hybrid's two normalised partials into the one softmax over both key ranges.

    o_e [B,H,S,D], lse_e [B,H,S] (expanded part) and o_l [B,H,S,K], lse_l [B,H,S] (latent part):
    any float dtype for the outputs, float32 LSEs (``-inf`` for a part without visible keys).
    Returns ``(o = w_e * o_e, o_latent = w_l * o_l, lse)`` with ``w_x = exp(lse_x - lse)`` and
    ``lse = log(exp(lse_e) + exp(lse_l))``, the outputs in ``out_dtype`` (default o_l's dtype).
    Reads B*H*S*(D + K + 2) partial elements once; writes B*H*S*(D + K + 1).
    """
    sizes: dict[str, int] = {}
    bind_shape("o_e", o_e, "B H S D", sizes)
    check_device("o_e", o_e)
    same = dict(device=o_e.device)
    bind_shape("lse_e", lse_e, "B H S", sizes, dtypes=(torch.float32,), **same)
    bind_shape("o_l", o_l, "B H S K", sizes, **same)
    bind_shape("lse_l", lse_l, "B H S", sizes, dtypes=(torch.float32,), **same)
    b, h, s, d, k = (sizes[x] for x in "BHSDK")
    dtype = out_dtype or o_l.dtype
    o = torch.empty((b, h, s, d), dtype=dtype, device=o_e.device)
    o_latent = torch.empty((b, h, s, k), dtype=dtype, device=o_e.device)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=o_e.device)
    if b * h * s:
        merge_parts(o_e, lse_e, o_l, lse_l, o, o_latent, lse)
    return o, o_latent, lse


def _expanded_persistent_args(q, qpe, k_new, v_new, kpe_new, o, lse, scale: float, causal: bool, programs: int,
                              block_n: int, upcast: bool) -> tuple[tuple, dict]:
    b, h, s, d = q.shape
    n, p = k_new.shape[1], kpe_new.shape[-1]
    args = dict(
        q_ptr=q, qpe_ptr=qpe, k_ptr=k_new, v_ptr=v_new, kpe_ptr=kpe_new, o_ptr=o, lse_ptr=lse,
        **named_strides("stride_qb stride_qh stride_qs stride_qd", q.stride()),
        **named_strides("stride_pb stride_ph stride_ps stride_pp", qpe.stride()),
        **named_strides("stride_kb stride_kt stride_kh stride_kd", k_new.stride()),
        **named_strides("stride_vb stride_vt stride_vh stride_vd", v_new.stride()),
        **named_strides("stride_eb stride_et stride_ep", kpe_new.stride()),
        **named_strides("stride_ob stride_oh stride_os stride_od", o.stride()),
        **named_strides("stride_lb stride_lh stride_ls", lse.stride()),
        B=b, H=h, S=s, L=n, qk_scale=scale * LOG2E,
        D=d, P=p, BLOCK_D=max(16, next_pow2(d)), BLOCK_P=max(16, next_pow2(p)),
        BLOCK_M=min(64, max(16, next_pow2(s))), BLOCK_N=block_n,
        CAUSAL=bool(causal), UPCAST=upcast, PRECISION=_fa._precision(q.dtype),
    )
    return (max(1, int(programs)),), args


def expanded_persistent(q, qpe, k_new, v_new, kpe_new, *, scale: float, causal: bool = True, programs: int,
                        block_n: int = 64, num_warps: int | None = None, num_stages: int = 3,
                        out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The hybrid's expanded part as one persistent launch of ``programs`` programs (so it holds
    at most that many SMs while a latent part runs beside it).

    q [B,H,S,D], qpe [B,H,S,P], k_new, v_new [B,N,H,D], kpe_new [B,N,P] (inputs validated by the
    caller; N < S allowed: rows without a visible key get o = 0, lse = -inf). Returns
    ``(o [B,H,S,D] in q's dtype or ``out``, lse [B,H,S] float32)``. Query blocks of
    min(64, next_pow2(S)) rows (>= 16); ``num_warps`` default 4, 8 for 64-row blocks (4 warps
    spill there on sm_90).
    """
    b, h, s, d = q.shape
    o = torch.empty((b, h, s, d), dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    if b * h * s == 0:
        return o, lse
    grid, args = _expanded_persistent_args(q, qpe, k_new, v_new, kpe_new, o, lse, scale, causal, programs, block_n,
                                           interpreting())
    if num_warps is None:
        num_warps = 8 if args["BLOCK_M"] >= 64 else 4
    _expanded_persistent_kernel[grid](**args, num_warps=num_warps, num_stages=num_stages)
    return o, lse


def example_launch(part: str, b: int, h: int, s: int, o: int, n: int, d: int = 128, p: int = 64, k: int = 512, *,
                   dtype: torch.dtype = torch.bfloat16, causal: bool = True,
                   config: MLAVar6PlusConfig | None = None) -> tuple[dict, dict]:
    """GPU launch arguments (contiguous inputs, pointers as type strings) of one of the hybrid's
    kernels, ``part`` in ``("latent", "merge", "persistent")`` (the expanded part is
    :func:`mla_var3.kernel.expanded.example_launch` with t = n), and its launch options
    (num_warps, num_stages), for :func:`mla_var3.kernel.sass.compile_launch_in_subprocess`."""
    config = config or default_config(MLADims(h=h, d=d, p=p, k=k), Problem(b, s, o + n, n))
    meta = dict(dtype=dtype, device="meta")
    f32 = dict(dtype=torch.float32, device="meta")
    if part == "latent":
        lat = config.latent
        ns = lat.num_splits
        o_dst = torch.empty(b, h, s, ns, k, **f32) if ns > 1 else torch.empty(b, h, s, k, **f32)
        l_dst = torch.empty(b, h, s, ns, **f32) if ns > 1 else torch.empty(b, h, s, **f32)
        _, args = _latent_args(torch.empty(b, h, s, k, **meta), torch.empty(b, h, s, p, **meta),
                               torch.empty(b, o, k, **meta), torch.empty(b, o, p, **meta), o_dst, l_dst,
                               o + n, (d + p) ** -0.5, causal, lat, False)
        return _fa.arg_types(args), dict(num_warps=lat.num_warps, num_stages=lat.num_stages)
    if part == "merge":
        _, tensors, ints, consts = _merge_args(torch.empty(b, h, s, d, **f32), torch.empty(b, h, s, **f32),
                                               torch.empty(b, h, s, k, **f32), torch.empty(b, h, s, **f32),
                                               torch.empty(b, h, s, d, **meta), torch.empty(b, h, s, k, **meta),
                                               torch.empty(b, h, s, **f32), False)
        args = {**dict(zip(_merge_kernel.arg_names, (*tensors, *ints))), **consts}
        return _fa.arg_types(args), dict(num_warps=4, num_stages=1)
    if part == "persistent":
        _, args = _expanded_persistent_args(torch.empty(b, h, s, d, **meta), torch.empty(b, h, s, p, **meta),
                                            torch.empty(b, n, h, d, **meta), torch.empty(b, n, h, d, **meta),
                                            torch.empty(b, n, p, **meta), torch.empty(b, h, s, d, **meta),
                                            torch.empty(b, h, s, **f32), (d + p) ** -0.5, causal, 1, 64, False)
        return _fa.arg_types(args), dict(num_warps=8 if args["BLOCK_M"] >= 64 else 4, num_stages=3)
    raise ValueError(f"part must be 'latent', 'merge' or 'persistent', got {part!r}")


def mla_var6_plus_portable(q, qpe, qc, z_old, kpe, k_new, v_new, *, scale, causal, config, out, out_latent,
                          overlap: bool = True, decode: "HybridDecode | None" = None):
    """The portable Triton backend of :func:`mla_var6_plus` (inputs already validated; ``out``,
    ``out_latent`` may be None: allocated here). ``overlap`` and ``decode`` are accepted for a
    uniform backend signature; the portable launches are issued on one stream and keep no state."""
    b, h, s, d = q.shape
    k, o_len, n_len = qc.shape[-1], z_old.shape[1], k_new.shape[1]
    dev = q.device
    if out is None:
        out = torch.empty((b, h, s, d), dtype=q.dtype, device=dev)
    if out_latent is None:
        out_latent = torch.empty((b, h, s, k), dtype=q.dtype, device=dev)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    if b * h * s == 0:
        return out, out_latent, lse
    config = config or default_config(MLADims(h=h, d=d, p=qpe.shape[-1], k=k), Problem(b, s, o_len + n_len, n_len),
                                      device=dev)
    kpe_old, kpe_new = kpe[:, :o_len], kpe[:, o_len:]
    t = o_len + n_len
    if o_len == 0:
        _fa._launch(q, qpe, k_new, v_new, kpe_new, out, lse, None, scale, causal, config.expanded)
        out_latent.zero_()
        return out, out_latent, lse
    if n_len == 0:
        _launch_latent(qc, qpe, z_old, kpe_old, out_latent, lse, t, scale, causal, config.latent)
        out.zero_()
        return out, out_latent, lse
    f32 = dict(dtype=torch.float32, device=dev)
    o_e, lse_e = torch.empty((b, h, s, d), **f32), torch.empty((b, h, s), **f32)
    o_l, lse_l = torch.empty((b, h, s, k), **f32), torch.empty((b, h, s), **f32)
    # two independent launches, one after the other on the current stream (the sm_90 path, hybrid_hopper,
    # runs them on two streams or an SM partition); each writes its own fp32 partial, merged below
    _launch_latent(qc, qpe, z_old, kpe_old, o_l, lse_l, t, scale, causal, config.latent)
    _fa._launch(q, qpe, k_new, v_new, kpe_new, o_e, lse_e, None, scale, causal, config.expanded)
    merge_parts(o_e, lse_e, o_l, lse_l, out, out_latent, lse)
    return out, out_latent, lse


backends.register("mla_var6_plus", "triton", mla_var6_plus_portable)


class HybridDecode:
    """The hybrid's decode state, owned by the caller: pass one object to every call of a stream
    of calls (a decode step's layers, step after step), as :class:`~mla_var3.kernel.decode.
    AbsorbedDecode` is passed to the absorbed design's.

    It holds the latent part's :class:`~mla_var3.kernel.decode.AbsorbedDecode` (:attr:`latent`:
    its plan, workspace, descriptor encodings and bound launches) and, on a GPU, the side stream
    the sm_90 backend issues one part on (:meth:`side_stream`: made on first use, then the same
    stream at every call). Without one, a call makes the latent part's state for itself and takes
    a side stream from torch's per-device pool at every call (32 streams, taken in turn), so its
    side-stream allocations are cached per stream of the pool. Nothing is kept in the module.

    >>> dec = HybridDecode(q.device)                                                   # doctest: +SKIP
    >>> o, o_latent, lse = mla_var6_plus(q, qpe, qc, z_old, kpe, k_new, v_new, scale=sm, decode=dec)  # doctest: +SKIP
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.latent = AbsorbedDecode(device)
        self._side: dict[int, "torch.cuda.Stream"] = {}

    def __repr__(self) -> str:
        return f"HybridDecode(latent={self.latent!r}, side streams on devices {sorted(self._side)})"

    def side_stream(self, device: torch.device) -> "torch.cuda.Stream":
        """This object's side stream on CUDA ``device`` (made on first use)."""
        index = cuda_index(device)
        stream = self._side.get(index)
        if stream is None:
            stream = self._side[index] = torch.cuda.Stream(device=index)
        return stream


def _pow2_16(x: int) -> bool:
    """The widths the absorbed kernel takes: powers of two >= 16 (others run the hybrid's own latent part)."""
    return x >= 16 and not x & (x - 1)


def _absorbed_shaped(q, qpe, qc, z_old, kpe, k_new, v_new) -> bool:
    """Whether a call is an N = 0 call that every check of :func:`mla_var6_plus` passes (shapes,
    one dtype the device takes, one device (CUDA, or the CPU under the interpreter), no gradient asked, K and P powers of two >= 16,
    ``B H S`` and ``D`` nonzero, S <= T): such a call goes to :func:`_as_absorbed` without the
    checks' cost (about half a decode call's host time at small batch). False on anything else,
    and the checked path then raises or runs. The scale is checked by the absorbed call."""
    tensor = torch.Tensor
    if not (type(q) is tensor and type(qpe) is tensor and type(qc) is tensor and type(z_old) is tensor
            and type(kpe) is tensor and type(k_new) is tensor and type(v_new) is tensor):
        return False
    if not (q.dim() == qpe.dim() == qc.dim() == k_new.dim() == v_new.dim() == 4 and z_old.dim() == kpe.dim() == 3):
        return False
    b, h, s, d = q.shape
    o_len, k = z_old.shape[1], qc.shape[3]
    p = qpe.shape[3]
    if not (k_new.shape == v_new.shape == (b, 0, h, d) and qpe.shape[:3] == qc.shape[:3] == q.shape[:3]
            and z_old.shape[0] == b and z_old.shape[2] == k and kpe.shape == (b, o_len, p) and b * h * s and d and s <= o_len
            and _pow2_16(k) and _pow2_16(p)):
        return False
    dtype, device = q.dtype, q.device
    if dtype not in (GPU_DTYPES if device.type == "cuda" else CPU_DTYPES if device.type == "cpu" and interpreting()
                     else ()):
        return False
    for x in (qpe, qc, z_old, kpe, k_new, v_new):
        if x.dtype != dtype or x.device != device:
            return False
    return not (torch.is_grad_enabled() and (q.requires_grad or qpe.requires_grad or qc.requires_grad
                                             or z_old.requires_grad or kpe.requires_grad or k_new.requires_grad
                                             or v_new.requires_grad))


def _as_absorbed(qc, qpe, z_old, kpe, *, scale, causal, out, out_latent, dv: int, decode: HybridDecode | None):
    """N = 0: the call *is* the absorbed design over the O = T latent keys, so it runs the public
    :func:`mla_var3.kernel.absorbed.flash_mla` (the device's best absorbed kernel: the seesaw with
    its decode plan on sm_90) and keeps the hybrid's contract: ``o`` zero, ``o_latent`` the
    absorbed output (copied into ``out_latent`` when given: an ``out`` buffer would keep the
    absorbed call off its fastest kernel), the LSE over all keys; with ``decode``, on its latent
    part's state."""
    b, h, s, _ = qc.shape
    o_lat, lse = _absorbed.flash_mla(qc, qpe, z_old, kpe, scale=scale, causal=causal,
                                     decode=None if decode is None else decode.latent)
    if out_latent is not None:
        o_lat = out_latent.copy_(o_lat)
    out = torch.zeros((b, h, s, dv), dtype=qc.dtype, device=qc.device) if out is None else out.zero_()
    return out, o_lat, lse


def mla_var6_plus(q: torch.Tensor, qpe: torch.Tensor, qc: torch.Tensor, z_old: torch.Tensor, kpe: torch.Tensor,
                  k_new: torch.Tensor, v_new: torch.Tensor, *, scale: float, causal: bool = True,
                  config: MLAVar6PlusConfig | None = None, out: torch.Tensor | None = None,
                  out_latent: torch.Tensor | None = None, backend: str = "auto",
                  overlap: bool = True, decode: HybridDecode | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                        torch.Tensor]:
    """Hybrid attention: latent over the O old tokens, expanded over the N newest, one softmax.

    Parameters
    ----------
    q : [B, H, S, D]         no-RoPE query (expanded part)
    qpe : [B, H, S, P]       RoPE query (both parts)
    qc : [B, H, S, K]        absorbed query (latent part), e.g. ``absorb_query(q, w_uk)``
    z_old : [B, O, K]        latent cache of the O oldest tokens (O may be 0)
    kpe : [B, O + N, P]      RoPE keys of all tokens, old first
    k_new, v_new : [B, N, H, D]  expanded keys/values of the N newest tokens (N may be 0)
    scale : softmax scale (required: the absorbed query has lost its head dim)
    causal : query i sees key j <= O + N - S + i
    config : launch config, default :func:`default_config`
    out, out_latent : optional output buffers [B,H,S,D] and [B,H,S,K] in q's dtype (any strides)
    backend : ``"auto"`` or a registered backend name (see :mod:`mla_var3.kernel.backends`);
        ``"gluon"`` on sm_90 (opt-in): :mod:`mla_var3.kernel.hopper.hybrid_hopper`
    overlap : issue the two parts on two streams where the backend can (sm_90)
    decode : HybridDecode, optional   the caller's state (the latent part's decode state, the side
        stream): pass one object to every call of a stream of calls; default: made for the call

    With N = 0, no ``config`` and ``backend="auto"`` the call is the absorbed design and runs it:
    :func:`mla_var3.kernel.absorbed.flash_mla` over ``z_old``, ``o`` zero (a named backend, a
    config, or K or P not a power of two >= 16 run the hybrid's own latent part).

    All inputs share one dtype (bf16/fp16; float32 too under the interpreter) and device; any
    strides. Returns ``(o [B,H,S,D], o_latent [B,H,S,K], lse [B,H,S] float32)``, both outputs
    normalised by the softmax over all O + N keys: the attention output is
    ``o + decompress(o_latent, w_uv)``.
    """
    if (config is None and backend == "auto" and out is None and out_latent is None
            and (decode is None or type(decode) is HybridDecode) and _absorbed_shaped(q, qpe, qc, z_old, kpe, k_new, v_new)):
        return _as_absorbed(qc, qpe, z_old, kpe, scale=scale, causal=bool(causal), out=None, out_latent=None,
                            dv=q.shape[3], decode=decode)
    check_inference(q, qpe, qc, z_old, kpe, k_new, v_new)
    if decode is not None and not isinstance(decode, HybridDecode):
        raise ValueError(f"decode must be a HybridDecode (mla_var3.kernel.hybrid), got {type(decode).__name__}")
    sizes: dict[str, int] = {}
    bind_shape("q", q, "B H S D", sizes)
    check_device("q", q)
    dev = q.device
    bind_shape("q", q, "B H S D", sizes, dtypes=allowed_dtypes(dev))
    same = dict(dtypes=(q.dtype,), device=dev)
    bind_shape("qpe", qpe, "B H S P", sizes, **same)
    bind_shape("qc", qc, "B H S K", sizes, **same)
    bind_shape("z_old", z_old, "B O K", sizes, **same)
    bind_shape("k_new", k_new, "B N H D", sizes, **same)
    bind_shape("v_new", v_new, "B N H D", sizes, **same)
    sizes["T"] = sizes["O"] + sizes["N"]
    bind_shape("kpe", kpe, "B T P", sizes, **same)
    b, h, s, d, p, k, o_len, n_len, t = (sizes[x] for x in ("B", "H", "S", "D", "P", "K", "O", "N", "T"))
    if s > t:
        raise ValueError(f"q has S={s} query tokens but the cache holds only O + N = {o_len} + {n_len} = {t} "
                         f"tokens (it includes the new ones: S <= O + N)")
    if min(d, p, k) == 0:
        raise ValueError(f"head dims must be positive, got D={d}, P={p}, K={k}")
    scale = check_scale(scale)
    if out is not None:
        bind_output("out", out, "B H S D", dict(sizes), **same)
    if out_latent is not None:
        bind_output("out_latent", out_latent, "B H S K", dict(sizes), **same)
    if n_len == 0 and config is None and backend == "auto" and b * h * s and _pow2_16(k) and _pow2_16(p):
        return _as_absorbed(qc, qpe, z_old, kpe, scale=scale, causal=bool(causal), out=out, out_latent=out_latent,
                            dv=d, decode=decode)
    run = backends.select("mla_var6_plus", dev, backend)
    return run(q, qpe, qc, z_old, kpe, k_new, v_new, scale=scale, causal=bool(causal), config=config, out=out,
               out_latent=out_latent, overlap=bool(overlap), decode=decode)

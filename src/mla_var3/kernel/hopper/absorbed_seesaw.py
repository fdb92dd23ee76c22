"""Absorbed (FlashMLA-style) attention on Hopper (sm_90): the warp-specialised "seesaw" schedule.

Same contract as :func:`mla_var3.kernel.hopper.absorbed_gluon.flash_mla_gluon` (dense latent
cache, ``seqlens`` not supported), a different algorithm: the two warpgroups of a program run
*different* code (``gl.warp_specialize``), so one's softmax runs while the other's MMAs keep the
tensor cores busy — the overlap a program whose warpgroups run in lockstep cannot get.

Design
------
* **Rows.** A program owns ``BLOCK_M = 64`` rows (``row = head * S + token``) of one sequence
  and a range of 64-key blocks (split-KV as in the pipelined kernel). Its two warpgroups (WG0,
  WG1; 4 warps each) hold the two halves of the ``[64, K]`` fp32 output: WG0 columns
  ``0 .. K/2``, WG1 ``K/2 .. K`` (128 registers per thread each).
* **Key blocks in pairs.** Two key buffers X and Y (each ``[64, K + P]``, next to Q: 3 x 72 KiB).
  In pair ``i``, X holds block ``2i`` and Y block ``2i + 1``. WG0 computes the full ``[64, 64]``
  scores of X (one N = 64 wgmma chain, K + P = 576 deep), WG1 those of Y.
* **Seesaw softmax** (one running max ``m``, identical in both warpgroups):

  1. WG0: ``mA = max(m, rowmax S0)``, ``p0 = exp2(S0 - mA)``; publishes ``p0`` (bf16, written
     over X's RoPE columns, which the scores no longer need) and ``mA``; then
     ``O_L = O_L * exp2(m - mA) + p0 . X_L``.
  2. WG1 (waits for ``mA``): ``mB = max(mA, rowmax S1)``, ``p1 = exp2(S1 - mB)``; publishes
     ``p1`` (over Y's RoPE columns) and ``mB``; ``O_R = O_R * exp2(m - mB) +
     (p0 * exp2(mA - mB)) . X_R + p1 . Y_R`` (``p0`` read back from shared memory into registers
     and rescaled there; its product issued first, so that X — WG0's next block — is released
     first). WG1 keeps the row sum ``l`` (of the rounded ``p`` the MMAs use).
  3. WG0 (waits for ``mB``): ``O_L = O_L * exp2(mA - mB) + p1 . Y_L`` (``p1`` straight from
     shared memory as the wgmma A operand). Both set ``m = mB``.

  WG1's step 2 runs while WG0's ``p0 . X_L`` runs on the tensor cores, and WG0's next softmax
  while WG1's two ``P . Z_R`` run: the seesaw.
* **Piecewise refill.** Each buffer is loaded by TMA in three parts — Z columns ``0 .. K/2``
  (``_L``), ``K/2 .. K`` (``_R``) and the RoPE piece — each one box with its own mbarrier; the
  score MMA runs 64 columns per wgmma group and waits for each part just before its first
  group. A part is refilled by the warpgroup that used it last, as soon as its last MMA has
  retired: X_L by WG0 after ``p0 . X_L``, X_R and X's RoPE piece by WG1 after
  ``p0 . X_R``, Y_L and Y's RoPE piece by WG0 after ``p1 . Y_L``, Y_R by WG1 after ``p1 . Y_R``.
* **Exchange** between the warpgroups: three mbarriers (``mA``/``p0`` ready, ``mB``/``p1`` ready,
  the final ``l``) and three 64-float rows in shared memory. Each warpgroup writes, fences,
  synchronises its own 128 threads, and one thread arrives.
* **Epilogue.** WG1 computes the LSE and publishes ``l``; each warpgroup normalises its half
  and stores it by TMA (WG1 through Q's buffer, WG0 through X's).

Shared memory: Q 64 x 576 + X, Y 2 x 64 x 576 (bf16) = 216 KiB + 3 x 256 B + barriers; one
program per SM. Limits: ``P == 64`` (``p`` lives in a buffer's RoPE piece), ``K`` a multiple of
128 with ``K / 2 <= 256`` (wgmma N), no ``seqlens``. Checked on an H200 at ``K = 512`` only, so
the default path (:func:`seesaw_applies`) takes it only there.

Example
-------
>>> o_latent, lse = flash_mla_seesaw(qc, qpe, z, kpe, scale=192 ** -0.5)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton

from mla_var3.kernel._common import cdiv, check_scale
from mla_var3.kernel.hopper import absorbed_gluon as _base
from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE, GLUON_IMPORT_ERROR

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )

__all__ = ["BLOCK_M", "BLOCK_N", "NUM_WARPS", "seesaw_applies", "compile_for_sm90", "flash_mla_seesaw"]

BLOCK_M = 64          # rows (head x token) per program
BLOCK_N = 64          # keys per block; the two warpgroups take alternate blocks
NUM_WARPS = 8         # two warpgroups of 4 warps (the default partition and one worker)
_WORKER_REGS = gl.constexpr(232) if GLUON_AVAILABLE else 232  # registers for the worker warpgroup (setmaxnreg)


if GLUON_AVAILABLE:

    @gluon.jit
    def _load_half(z_desc, kr_desc, ready, z_buf, kr_buf, buf: gl.constexpr, b, key0, pred,
                   HALF: gl.constexpr, ROPE: gl.constexpr, NZ: gl.constexpr):
        """TMA: half ``HALF`` (0: Z columns ``0 .. K/2``, 1: ``K/2 .. K``) of the key block at ``key0``
        into buffer ``buf`` (one box of K/2 columns) signalling ``ready[buf * 3 + HALF]``; with
        ``ROPE`` also its RoPE piece (``ready[buf * 3 + 2]``)."""
        KH: gl.constexpr = NZ * 32
        bar = ready.index(buf * 3 + HALF)
        mbarrier.expect(bar, z_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(z_desc, [b, key0, HALF * KH], bar, z_buf.slice(HALF * KH, KH, dim=2),
                                        pred=pred)
        if ROPE:
            bar_r = ready.index(buf * 3 + 2)
            mbarrier.expect(bar_r, kr_desc.block_type.nbytes, pred=pred)
            tma.async_copy_global_to_shared(kr_desc, [b, key0, 0], bar_r, kr_buf, pred=pred)

    @gluon.jit
    def _scores(q_tile, qr_tile, z_tile, kr_tile, ready, buf: gl.constexpr, phase, wait_pred, s_zero,
                NZ: gl.constexpr):
        """``Q . Z^T + Qpe . kpe^T`` of buffer ``buf`` ([64, 64] fp32), one wgmma group per 64
        columns; each half of Z (and the RoPE piece) is waited for just before its first group."""
        tok = s_zero
        for c in gl.static_range(NZ):
            if c % (NZ // 2) == 0:
                mbarrier.wait(ready.index(buf * 3 + c // (NZ // 2)), phase, pred=wait_pred)
            tok = warpgroup_mma(q_tile.slice(c * 64, 64, dim=1), z_tile.slice(c * 64, 64, dim=1).permute((1, 0)),
                                tok, use_acc=c > 0, is_async=True)
        mbarrier.wait(ready.index(buf * 3 + 2), phase, pred=wait_pred)
        tok = warpgroup_mma(qr_tile, kr_tile.permute((1, 0)), tok, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(tok,))

    @gluon.jit
    def _publish(bar, row_smem, row_vec, p_smem, p):
        """Write ``p`` (bf16, for the other warpgroup's MMA) and a row vector, make them visible
        (async proxy for the MMA, then this warpgroup's threads), and signal ``bar`` once."""
        p_smem.store(p)
        row_smem.store(row_vec)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bar, count=1)

    @gluon.jit
    def _seesaw_wg(ROLE: gl.constexpr,
                   q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow,
                   z_desc, kr_desc, o_desc, lse_ptr,
                   pid_b, row0, pid_s, blk_lo, n_iter, S, HS, L, qk_scale_log2,
                   stride_lb, stride_lr, stride_ls, causal):
        """One warpgroup of the seesaw (``ROLE`` 0: even blocks, output columns ``0 .. K/2``;
        ``ROLE`` 1: odd blocks, columns ``K/2 .. K``, the row sum and the LSE)."""
        BM: gl.constexpr = 64
        BN: gl.constexpr = 64
        K: gl.constexpr = z_smem.shape[3]
        P: gl.constexpr = kr_smem.shape[3]
        KH: gl.constexpr = K // 2
        NZ: gl.constexpr = K // 64
        dtype: gl.constexpr = z_desc.dtype
        OWN: gl.constexpr = ROLE          # the buffer with this warpgroup's score blocks
        OTHER: gl.constexpr = 1 - ROLE
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BN, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, KH, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        p_rows: gl.constexpr = gl.SliceLayout(1, p_layout)

        q_tile = q_smem.reshape([BM, K])
        qr_tile = qr_smem.reshape([BM, P])
        own_z = z_smem.index(OWN).reshape([BN, K])
        own_r = kr_smem.index(OWN).reshape([BN, P])
        oth_z = z_smem.index(OTHER).reshape([BN, K])
        oth_r = kr_smem.index(OTHER).reshape([BN, P])   # P == BN: also the other warpgroup's p tile
        bar_a = xbar.index(0)   # WG0 -> WG1: mA and p0
        bar_b = xbar.index(1)   # WG1 -> WG0: mB and p1
        bar_e = xbar.index(2)   # WG1 -> WG0: final row sum

        rows = row0 + gl.arange(0, BM, layout=s_rows)
        limit = gl.where(causal != 0, L - S + rows % S, L - 1)
        cols = gl.arange(0, BN, layout=s_cols)
        m_i = gl.full([BM], float("-inf"), gl.float32, s_rows)
        l_o = gl.full([BM], 0.0, gl.float32, o_rows)
        acc = gl.zeros([BM, KH], gl.float32, o_layout)
        s_zero = gl.zeros([BM, BN], gl.float32, s_layout)

        mbarrier.wait(q_bar, 0)
        n_pairs = (n_iter + 1) // 2
        for i in range(n_pairs):
            ph = i & 1
            j = 2 * i + ROLE
            has_own = j < n_iter
            has_y = 2 * i + 1 < n_iter
            # Y was loaded in pair 0 even without a block 1 (a copy of block 0, masked below)
            raw = _scores(q_tile, qr_tile, own_z, own_r, ready, OWN, ph, has_own | (i == 0), s_zero, NZ)
            keys = (blk_lo + j) * BN + cols
            if has_own & ((blk_lo + j + 1) * BN - 1 <= L - S * (causal != 0) - (causal == 0)):
                sc = raw * qk_scale_log2          # every row sees every key of the block: no mask
            else:
                visible = (keys[None, :] <= limit[:, None]) & has_own
                sc = gl.where(visible, raw * qk_scale_log2, float("-inf"))
            if ROLE == 0:
                m_a = gl.maximum(m_i, gl.max(sc, axis=1))
                m_a_safe = gl.where(m_a == float("-inf"), 0.0, m_a)
                p = gl.exp2(sc - m_a_safe[:, None]).to(dtype)
                alpha = gl.convert_layout(gl.exp2(m_i - m_a_safe), o_rows)
                _publish(bar_a, xrow.index(0), m_a, own_r, p)
                acc = acc * alpha[:, None]
                p_op = gl.convert_layout(p, p_layout)
                tok = warpgroup_mma(p_op, own_z.slice(0, KH, dim=1), acc, is_async=True)
                mbarrier.wait(bar_b, ph)
                m_b = xrow.index(1).load(s_rows)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(tok, p_op))
                # X_L is free: its pieces of block 2i + 2
                _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, pid_b,
                             (blk_lo + 2 * i + 2) * BN, 2 * i + 2 < n_iter, 0, False, NZ)
                m_b_safe = gl.where(m_b == float("-inf"), 0.0, m_b)
                beta = gl.convert_layout(gl.exp2(m_a - m_b_safe), o_rows)
                acc = acc * beta[:, None]
                if has_y:
                    tok = warpgroup_mma(oth_r, oth_z.slice(0, KH, dim=1), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
                    # Y_L and Y's RoPE piece (p1) are free: block 2i + 3
                    _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, pid_b,
                                 (blk_lo + 2 * i + 3) * BN, 2 * i + 3 < n_iter, 0, True, NZ)
                m_i = m_b
            else:
                mbarrier.wait(bar_a, ph)
                m_a = xrow.index(0).load(s_rows)
                m_b = gl.maximum(m_a, gl.max(sc, axis=1))
                m_b_safe = gl.where(m_b == float("-inf"), 0.0, m_b)
                p = gl.exp2(sc - m_b_safe[:, None]).to(dtype)
                alpha = gl.convert_layout(gl.exp2(m_i - m_b_safe), o_rows)
                beta = gl.convert_layout(gl.exp2(m_a - m_b_safe), p_rows)
                # p0 (over X's RoPE piece, at scale mA) -> registers, rescaled to mB; read before
                # publishing, since WG0 may overwrite it once it has mB
                p0 = (oth_r.load(p_layout).to(gl.float32) * beta[:, None]).to(dtype)
                _publish(bar_b, xrow.index(1), m_b, own_r, p)
                p_op = gl.convert_layout(p, p_layout)
                l_o = (l_o * alpha + gl.convert_layout(gl.sum(p_op.to(gl.float32), axis=1), o_rows)
                       + gl.convert_layout(gl.sum(p0.to(gl.float32), axis=1), o_rows))
                acc = acc * alpha[:, None]
                # p0 . X_R first: X (WG0's next block, on the critical path) is released before Y
                tok = warpgroup_mma(p0, oth_z.slice(KH, KH, dim=1), acc, is_async=True)
                tok = warpgroup_mma(p_op, own_z.slice(KH, KH, dim=1), tok, is_async=True)
                acc, p0 = warpgroup_mma_wait(num_outstanding=1, deps=(tok, p0))
                # X_R and X's RoPE piece (p0) are free: block 2i + 2
                _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, pid_b,
                             (blk_lo + 2 * i + 2) * BN, 2 * i + 2 < n_iter, 1, True, NZ)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(tok, p_op))
                # Y_R is free: block 2i + 3
                _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, pid_b,
                             (blk_lo + 2 * i + 3) * BN, 2 * i + 3 < n_iter, 1, False, NZ)
                m_i = m_b

        # ---- epilogue
        o_rows_idx = row0 + gl.arange(0, BM, layout=o_rows)
        if ROLE == 1:
            l_ok = l_o > 0
            m_o = gl.convert_layout(m_i, o_rows)
            lse = gl.where(l_ok, (m_o + gl.log2(gl.where(l_ok, l_o, 1.0))) * 0.6931471805599453, float("-inf"))
            gl.store(lse_ptr + pid_b * stride_lb + o_rows_idx * stride_lr + pid_s * stride_ls, lse,
                     mask=o_rows_idx < HS)
            xrow.index(2).store(gl.convert_layout(l_o, s_rows))
            gl.thread_barrier()
            mbarrier.arrive(bar_e, count=1)
            l_fin = l_o
            # every MMA reading Q is done (WG0's last scores precede mA): stage the output there
            o_smem = q_smem._reinterpret(o_desc.dtype, [1, BM, KH], o_desc.layout)
        else:
            mbarrier.wait(bar_e, 0)
            l_fin = xrow.index(2).load(o_rows)
            # WG1 is done with X: stage the output in it
            o_smem = z_smem._reinterpret(o_desc.dtype, [1, BM, KH], o_desc.layout)
        inv_l = 1.0 / gl.where(l_fin > 0, l_fin, 1.0)
        o_smem.reshape([BM, KH]).store((acc * inv_l[:, None]).to(o_desc.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [pid_b, row0, pid_s * K + ROLE * KH], o_smem)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _seesaw_wg1(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, z_desc, kr_desc, o_desc, lse_ptr,
                    pid_b, row0, pid_s, blk_lo, n_iter, S, HS, L, qk_scale_log2, stride_lb, stride_lr, stride_ls,
                    causal):
        _seesaw_wg(1, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, z_desc, kr_desc, o_desc, lse_ptr,
                   pid_b, row0, pid_s, blk_lo, n_iter, S, HS, L, qk_scale_log2, stride_lb, stride_lr, stride_ls,
                   causal)

    @gluon.jit
    def _seesaw_wg0(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, z_desc, kr_desc, o_desc, lse_ptr,
                    pid_b, row0, pid_s, blk_lo, n_iter, S, HS, L, qk_scale_log2, stride_lb, stride_lr, stride_ls,
                    causal):
        _seesaw_wg(0, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, z_desc, kr_desc, o_desc, lse_ptr,
                   pid_b, row0, pid_s, blk_lo, n_iter, S, HS, L, qk_scale_log2, stride_lb, stride_lr, stride_ls,
                   causal)

    @gluon.jit
    def _flash_mla_seesaw(
        q_desc, qr_desc, z_desc, kr_desc,        # TMA: [B, H*S, K], [B, H*S, P], [B, T, K] (64-column boxes), [B, T, P]
        o_desc,                                   # TMA: [B, H*S, NS*K], boxes of K/2 columns
        lse_ptr,
        HS, S, T, qk_scale_log2, blocks_per_split,
        stride_lb, stride_lr, stride_ls,
        K: gl.constexpr, P: gl.constexpr, CAUSAL: gl.constexpr,
    ):
        """One program: 64 rows of sequence ``program_id(2)``, the key blocks of split
        ``program_id(1)``; the default partition is WG0, the worker WG1 (see the module docstring)."""
        BM: gl.constexpr = 64
        BN: gl.constexpr = 64
        NZ: gl.constexpr = K // 64
        dtype: gl.constexpr = q_desc.dtype
        pid_m = gl.program_id(0)
        pid_s = gl.program_id(1)
        pid_b = gl.program_id(2)
        row0 = pid_m * BM
        L = T
        blk_lo = pid_s * blocks_per_split
        blk_hi = gl.minimum(blk_lo + blocks_per_split, gl.cdiv(L, BN))
        n_iter = gl.maximum(blk_hi - blk_lo, 0)

        zl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BN, K], dtype)
        q_smem = gl.allocate_shared_memory(dtype, [1, BM, K], zl)
        qr_smem = gl.allocate_shared_memory(dtype, [1, BM, P], qr_desc.layout)
        z_smem = gl.allocate_shared_memory(dtype, [2, 1, BN, K], zl)
        kr_smem = gl.allocate_shared_memory(dtype, [2, 1, BN, P], kr_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        xbar = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
        xrow = gl.allocate_shared_memory(gl.float32, [3, BM], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        mbarrier.init(q_bar, count=1)
        for i0 in gl.static_range(6):
            mbarrier.init(ready.index(i0), count=1)
        for i1 in gl.static_range(3):
            mbarrier.init(xbar.index(i1), count=1)

        # Q, then block 0 into X and block 1 (block 0 again when there is no block 1) into Y
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
        for c in gl.static_range(2):
            tma.async_copy_global_to_shared(q_desc, [pid_b, row0, c * (K // 2)], q_bar,
                                            q_smem.slice(c * (K // 2), K // 2, dim=2))
        tma.async_copy_global_to_shared(qr_desc, [pid_b, row0, 0], q_bar, qr_smem)
        has0 = n_iter > 0
        _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, pid_b, blk_lo * BN, has0, 0, False, NZ)
        _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, pid_b, blk_lo * BN, has0, 1, True, NZ)
        key_y = (blk_lo + gl.minimum(1, gl.maximum(n_iter - 1, 0))) * BN
        _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, pid_b, key_y, has0, 0, False, NZ)
        _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, pid_b, key_y, has0, 1, True, NZ)

        args = (q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, z_desc, kr_desc, o_desc, lse_ptr,
                    pid_b, row0, pid_s, blk_lo, n_iter, S, HS, L, qk_scale_log2, stride_lb, stride_lr, stride_ls,
                gl.to_tensor(CAUSAL).to(gl.int32))
        gl.warp_specialize([(_seesaw_wg0, args), (_seesaw_wg1, args)], [4], [_WORKER_REGS])


# ---------------------------------------------------------------------------------------------
# host side


def seesaw_applies(k: int, p: int, seqlens=None) -> bool:
    """Whether the default path runs the seesaw kernel: DeepSeek's widths ``K == 512, P == 64``
    (the only ones checked on a GPU so far; the kernel compiles for any ``K`` a multiple of 128
    up to 512 with ``P == 64``, which :func:`flash_mla_seesaw` accepts when called directly)
    and no ``seqlens``."""
    return GLUON_AVAILABLE and p == 64 and k == 512 and seqlens is None


def flash_mla_seesaw(qc: torch.Tensor, qpe: torch.Tensor, z: torch.Tensor, kpe: torch.Tensor, *, scale: float,
                     causal: bool = True, num_splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA attention over a dense latent cache, warp-specialised seesaw kernel (sm_90).

    Parameters
    ----------
    qc : [B, H, S, K] bf16/fp16   absorbed no-RoPE query (K a multiple of 128, <= 512)
    qpe : [B, H, S, P]            RoPE query (P = 64)
    z : [B, T, K]                 latent cache (key and value), T includes the S new tokens
    kpe : [B, T, P]               RoPE key, shared by all heads
    scale : float                 softmax scale
    causal : bool                 query i of S sees keys j <= T - S + i
    num_splits : int, optional    split-KV count (default: ``choose_num_splits`` of the Gluon module)

    Returns
    -------
    o_latent : [B, H, S, K] in qc's dtype;  lse : [B, H, S] float32 (natural log)
    """
    if not GLUON_AVAILABLE:
        raise RuntimeError(f"triton.experimental.gluon is unavailable: {GLUON_IMPORT_ERROR}")
    sizes, _ = _base._validate(qc, qpe, z, kpe, None)
    scale = check_scale(scale)
    b, h, s, t, k, p = (sizes[x] for x in "BHSTKP")
    if p != 64 or k % 128 or not 128 <= k <= 512:
        raise ValueError(f"the seesaw kernel needs P == 64 and K a multiple of 128 in [128, 512]; got K={k}, P={p}")
    hs = h * s
    dev = qc.device
    o_latent = torch.empty((b, h, s, k), dtype=qc.dtype, device=dev)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    if b == 0 or hs == 0:
        return o_latent, lse

    num_splits, per_split, o_buf, lse_buf = _base._split_plan(o_latent, lse, t, num_splits)
    descs = _base._operand_descriptors(qc, qpe, z, kpe, k // 2)
    o_desc = _base._descriptor(o_buf.view(b, hs, num_splits * k), [1, BLOCK_M, k // 2])
    l_strides = (lse_buf.stride(0), lse_buf.stride(1), lse_buf.stride(2))

    grid = (cdiv(hs, BLOCK_M), num_splits, b)
    _flash_mla_seesaw[grid](
        *descs, o_desc, lse_buf, hs, s, t, scale * _base._LOG2E, per_split, *l_strides,
        K=k, P=p, CAUSAL=bool(causal), num_warps=4,
    )
    _base._finish(o_buf, lse_buf, o_latent, lse)
    return o_latent, lse


def compile_for_sm90(*, k: int = 512, p: int = 64, dtype: str = "bf16", causal: bool = True, split: bool = False,
                     capability: int = 90):
    """Compile the seesaw kernel for sm_90 without a GPU; returns Triton's CompiledKernel.
    Must run in a process without ``TRITON_INTERPRET`` set."""
    if not GLUON_AVAILABLE:
        raise RuntimeError(f"triton.experimental.gluon is unavailable: {GLUON_IMPORT_ERROR}")
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    tys = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}

    def desc(cols: int, rows: int, ty: str = dtype) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([1, rows, cols], tys[ty])
        return f"tensordesc<{ty}[1,{rows},{cols}],{layout!r}>"

    signature = {
        "q_desc": desc(k // 2, BLOCK_M), "qr_desc": desc(p, BLOCK_M), "z_desc": desc(k // 2, BLOCK_N),
        "kr_desc": desc(p, BLOCK_N), "o_desc": desc(k // 2, BLOCK_M, "fp32" if split else dtype),
        "lse_ptr": "*fp32", "HS": "i32", "S": "i32", "T": "i32", "qk_scale_log2": "fp32", "blocks_per_split": "i32",
        "stride_lb": "i32", "stride_lr": "i32", "stride_ls": "i32",
        "K": "constexpr", "P": "constexpr", "CAUSAL": "constexpr",
    }
    src = GluonASTSource(fn=_flash_mla_seesaw, signature=signature, constexprs={"K": k, "P": p, "CAUSAL": causal})
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options={"num_warps": 4})

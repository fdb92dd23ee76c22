"""Absorbed (FlashMLA-style) attention on Hopper (sm_90): the warp-specialised "seesaw" schedule.

The default absorbed kernel on sm_90 (selected by the backends of
:mod:`mla_var3.kernel.hopper.absorbed_gluon`) for dense, ragged and paged caches, a different
algorithm from that module's: the two warpgroups of a program run
*different* code (``gl.warp_specialize``), so one's softmax runs while the other's MMAs keep the
tensor cores busy — the overlap a program whose warpgroups run in lockstep cannot get.

Design
------
* **Work.** A program owns ``BLOCK_M = 64`` rows of one sequence and one work item of a decode
  plan (:mod:`mla_var3.kernel.decode_plan`): key blocks ``[blk_lo, blk_hi)``, written to the
  output when the item covers the sequence, else as fp32 partials to its slot for
  :func:`mla_var3.kernel.combine.combine_planned`. With a plan that has program ``starts``
  (``PERSISTENT``: a packed plan, or the planner's item plan run one item per program) a
  program runs items ``starts[p] .. starts[p + 1]`` in turn: when an item's pair loop ends both
  warpgroups release Q, X and the page list (``seg_bar[0]``), and once their output stores
  (staged in Y) are done, Y (``seg_bar[1]``); a third partition, a loader warp, issues the next
  item's prologue (its pages, query tile and first two key blocks) as they come free, so the compute
  warpgroups carry no query descriptors or block table across their pair loops (issued from
  WG0 instead, they spilled 384 B and ran 0.55–0.65x). Registers then: WG0 256, WG1 224, the
  loader's warpgroup 24 (the program is padded to 12 warps). A plan whose kind the GPU chose
  (``DecodePlan.packed``) is launched through both kernels (``GATED``), the item kernel first and
  the packed one as its programmatic dependent; each program reads the choice and exits at once
  unless the plan is its kernel's kind (one of the packed kernel's only after the item kernel
  has ended, so that the combine's wait covers it): the item plan then runs in the item kernel,
  without the loader warp's cost, and an eager call's later launches are issued while it runs.
  An eager call made once the choice has reached the host (``DecodePlan.known_kind``, copied
  behind the planner without a synchronisation) launches the chosen kernel alone instead. The
  host side (which calls take this kernel, the launches of a call, every kind compiled before
  any launches) is :mod:`mla_var3.kernel.hopper.seesaw_host`.
  Rows are ``head * S + token`` (the native layout) or ``token * H + head`` (FlashMLA's
  ``[b, s, h, 576]``), as the queries lie, so neither the queries nor the output are copied. Its two warpgroups (WG0,
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
     first). WG1 keeps the row sum ``l`` in fp32 (``p1``'s, and ``p0``'s that WG0 publishes
     beside ``mA``): summing the rounded bf16 ``p`` instead put the LSE 1.2e-4 off at four keys.
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
* **Keys.** Dense caches ``[B, T, K]`` are read at ``(b, 64 * blk)``; paged caches (FlashMLA's
  ``[pages, 64, 1, K + P]``) at ``(page, 0)``, the item's pages copied from the block table (any
  strides) to shared memory in the prologue. A sequence's last, partial block is read as the 64
  rows ending at its length (paged: the rows before the page are out of bounds and read as
  zeros; dense: the previous block's keys, masked), so nothing past a length is loaded and NaN
  stored there cannot reach the output.
* **Epilogue.** WG1 computes the LSE (from the fp32 row sums of both warpgroups' ``p``; +inf for
  an empty sequence, as FlashMLA) and publishes ``l``; each warpgroup normalises its half and
  stores it by TMA, staged in a free buffer: in the item kernel WG1 through Q's, WG0 through X's;
  in the packed kernel both through Y's, so that the loader refills Q and X meanwhile (a split
  item's fp32 partial half fills Y: WG0 stores its own from its registers). Split items are merged by
  :func:`mla_var3.kernel.combine.combine_planned`, a programmatic dependent launch: every program
  signals ``griddepcontrol.launch_dependents`` as it starts, so the combine is launched while the
  last programs run and waits for the grid before it reads a partial.
* **Scale.** Scores are taken to log2 units by ``qk_scale_log2``, folded into ``exp2``'s
  argument (one FFMA per score, the row max scaled once per row).
* **Key views.** The packed kernel builds its key buffers' views per pair from an opaque zero,
  so the wgmma descriptors are not hoisted out of the pair loop into spilled registers; the item
  kernel does so for WG0's own buffer only and hoists the other three, which measured fastest
  there (``_ITEM_VIEWS``; ``docs/kernels/flash-mla/packed-plan.md``, "The packed kernel's views per pair", and
  ``docs/kernels/flash-mla/stalls.md``, "The two held-back changes, timed").

Shared memory: Q 64 x 576 + X, Y 2 x 64 x 576 (bf16) = 216 KiB + 4 x 256 B + the page list
(4 KiB when paged) + barriers; one program per SM. Limits: ``P == 64`` (``p`` lives in a
buffer's RoPE piece), ``K`` a multiple of 128 with ``K / 2 <= 256`` (wgmma N), 64-token pages.
Checked on an H200 at ``K = 512`` only, so the default path
(:func:`mla_var3.kernel.hopper.seesaw_host.seesaw_applies`) takes it only there. Measured against official
FlashMLA: ``docs/kernels/flash-mla/seesaw.md`` and ``docs/kernels/flash-mla/serving.md``.

Example
-------
>>> o_latent, lse = flash_mla(qc, qpe, z, kpe, scale=192 ** -0.5)   # on sm_90  # doctest: +SKIP
"""

from __future__ import annotations

from mla_var3.kernel._launch import CachedLaunch
from mla_var3.kernel.decode_plan import MAX_ITEM_BLOCKS
from mla_var3.kernel.hopper import _gluon
from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )

__all__ = ["BLOCK_M", "BLOCK_N", "NUM_WARPS", "compile_for_sm90"]

BLOCK_M = 64          # rows (head x token) per program
BLOCK_N = 64          # keys per block; the two warpgroups take alternate blocks
NUM_WARPS = 8         # two warpgroups of 4 warps (the default partition and one worker)
#: key blocks one work item may span on a paged cache (its pages sit in shared memory; the
#: decode plan cuts longer sequences): 1,024 x 64 = 65,536 keys, 4 KiB
MAX_ITEM_PAGES = gl.constexpr(MAX_ITEM_BLOCKS) if GLUON_AVAILABLE else MAX_ITEM_BLOCKS
#: registers for the worker warpgroup (setmaxnreg; WG0 takes 256 whatever this is, and 256 + 240 fit
#: the 8-warp program): measured on an H200 against 232 and 248
#: (``docs/kernels/flash-mla/combine.md``, "The combine's early exit and WG1's register budget"):
#: 240 1.2-1.9 % faster on paged item-plan and dense s = 1 rows, 248 up to 3.5 % slower at s >= 2
_WORKER_REGS = gl.constexpr(240) if GLUON_AVAILABLE else 240
#: a packed plan's kernel adds a loader warp: the program is padded to 12 warps, and 256 (WG0) +
#: 224 (WG1) + 24 (the loader's warpgroup) registers per thread fill the register file
_PACKED_WORKER_REGS = gl.constexpr(224) if GLUON_AVAILABLE else 224
_LOADER_REGS = gl.constexpr(24) if GLUON_AVAILABLE else 24
#: which key-buffer views a kernel builds per pair from an opaque zero instead of hoisting them out
#: of the pair loop (bit 2 * ROLE: the warpgroup's own buffer, bit 2 * ROLE + 1: the other's).
#: Measured on an H200 (``docs/kernels/flash-mla/stalls.md``, "The two held-back changes, timed"): the item kernel's WG0 own views only
#: (1; its reloads per pair 20 -> 4) 0.7-2.7 % faster than none on every item-plan row, where all
#: four lost 0.5-4.6 %; the packed kernel all four (15), 1.5-4 % faster on packed rows than 1, 3 or 5
_PACKED_VIEWS = gl.constexpr(15) if GLUON_AVAILABLE else 15
_ITEM_VIEWS = gl.constexpr(1) if GLUON_AVAILABLE else 1


if GLUON_AVAILABLE:

    @gluon.jit
    def _load_half(z_desc, kr_desc, ready, z_buf, kr_buf, buf: gl.constexpr, c0, c1, pred,
                   HALF: gl.constexpr, ROPE: gl.constexpr, NZ: gl.constexpr):
        """TMA: half ``HALF`` (0: Z columns ``0 .. K/2``, 1: ``K/2 .. K``) of the key block at
        coordinates ``(c0, c1)`` (dense: sequence, first key; paged: page, 0) into buffer ``buf``
        (one box of K/2 columns) signalling ``ready[buf * 3 + HALF]``; with ``ROPE`` also its RoPE
        piece (``ready[buf * 3 + 2]``)."""
        KH: gl.constexpr = NZ * 32
        bar = ready[buf * 3 + HALF]
        mbarrier.expect(bar, z_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(z_desc, [c0, c1, HALF * KH], bar, z_buf.slice(HALF * KH, KH, dim=2),
                                        pred=pred)
        if ROPE:
            bar_r = ready[buf * 3 + 2]
            mbarrier.expect(bar_r, kr_desc.block_type.nbytes, pred=pred)
            tma.async_copy_global_to_shared(kr_desc, [c0, c1, 0], bar_r, kr_buf, pred=pred)

    @gluon.jit
    def _page_at(pages_smem, j, PAGED: gl.constexpr):
        """The page of the item's key block ``j`` (0-based in the item), from the page list the
        prologue copied into shared memory; 0 for a dense cache."""
        if PAGED:
            v = pages_smem.index(gl.minimum(j, pages_smem.shape[0] - 1)).load(
                gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
            return gl.max(v, 0)
        else:
            return 0

    @gluon.jit
    def _tail_shift(blk, n_blk, L):
        """Rows the TMA box of key block ``blk`` starts before the block: the last block of a
        sequence whose length is not a multiple of 64 is read as the 64 rows *ending* at key L,
        so no key past L is ever loaded (paged: the rows before the page are out of bounds and
        read as zeros; dense: they are the previous block's keys, finite, and masked)."""
        return gl.where((blk == n_blk - 1) & (L % 64 != 0), 64 - L % 64, 0)

    @gluon.jit
    def _coords(b, blk, page, n_blk, L, PAGED: gl.constexpr):
        """TMA coordinates ``(c0, c1)`` of key block ``blk``: paged ``(page, -shift)``, dense
        ``(b, 64 * blk - shift)`` (see :func:`_tail_shift`)."""
        shift = _tail_shift(blk, n_blk, L)
        if PAGED:
            return page, -shift
        else:
            return b, blk * 64 - shift

    @gluon.jit
    def _scores(q_tile, qr_tile, z_tile, kr_tile, ready, buf: gl.constexpr, phase, wait_pred, s_zero,
                NZ: gl.constexpr):
        """``Q . Z^T + Qpe . kpe^T`` of buffer ``buf`` ([64, 64] fp32), one wgmma group per 64
        columns; each half of Z (and the RoPE piece) is waited for just before its first group."""
        tok = s_zero
        for c in gl.static_range(NZ):
            if c % (NZ // 2) == 0:
                mbarrier.wait(ready[buf * 3 + c // (NZ // 2)], phase, pred=wait_pred)
            tok = warpgroup_mma(q_tile.slice(c * 64, 64, dim=1), z_tile.slice(c * 64, 64, dim=1).permute((1, 0)),
                                tok, use_acc=c > 0, is_async=True)
        mbarrier.wait(ready[buf * 3 + 2], phase, pred=wait_pred)
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
    def _item(items_ptr, seqlens_ptr, item, T, MAX_BLOCKS, HAS_SEQLENS: gl.constexpr):
        """Plan item ``item``: ``(b, blk_lo, n_iter, slot, L, n_blk)`` (its sequence, first block,
        blocks, partial slot or -1; the sequence's keys, clamped to T, and blocks)."""
        b = gl.load(items_ptr + item * 4)
        blk_lo = gl.load(items_ptr + item * 4 + 1)
        n_iter = gl.load(items_ptr + item * 4 + 2) - blk_lo
        slot = gl.load(items_ptr + item * 4 + 3)
        if HAS_SEQLENS:
            L = gl.minimum(gl.load(seqlens_ptr + gl.maximum(b, 0)), T)
        else:
            L = T
        n_blk = gl.minimum(gl.cdiv(L, 64), MAX_BLOCKS)
        return b, blk_lo, n_iter, slot, L, n_blk

    @gluon.jit
    def _issue_item(q_desc, qr_desc, z_desc, kr_desc, ready, q_bar, q_smem, qr_smem, z_smem, kr_smem, pages_row,
                    table_ptr, stride_tb, stride_tc, b, row0, blk_lo, n_iter, n_blk, L,
                    PAGED: gl.constexpr, PARTS: gl.constexpr):
        """An item's prologue: its pages from the block table into shared memory
        (paged caches: the refills then need one shared-memory read and no table address
        arithmetic), then TMA for its query tile (``q_bar``), block 0 into X and block 1 (block 0
        again when there is no block 1) into Y. ``PARTS``: bit 0 the pages, the query tile and X,
        bit 1 Y (a packed plan's loader issues them as the buffers come free)."""
        K: gl.constexpr = z_smem.shape[3]
        NZ: gl.constexpr = K // 64
        NP: gl.constexpr = pages_row.shape[1]
        one_d: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        if PARTS & 1:
            if PAGED:
                W: gl.constexpr = gl.num_warps()
                pl: gl.constexpr = gl.BlockedLayout([NP // (32 * W)], [32], [W], [0])
                jj = gl.arange(0, NP, layout=pl)
                blk = blk_lo + jj
                pg = gl.load(table_ptr + b.to(gl.int64) * stride_tb + blk.to(gl.int64) * stride_tc,
                             mask=(jj < n_iter) & (blk < n_blk), other=0)
                pages_row.index(0).store(pg)
                gl.thread_barrier()
        pages_smem = pages_row._reinterpret(gl.int32, [NP, 1], one_d)
        has0 = n_iter > 0
        if PARTS & 1:
            mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
            for c in gl.static_range(2):
                tma.async_copy_global_to_shared(q_desc, [b, row0, c * (K // 2)], q_bar,
                                                q_smem.slice(c * (K // 2), K // 2, dim=2))
            tma.async_copy_global_to_shared(qr_desc, [b, row0, 0], q_bar, qr_smem)
            x0, x1 = _coords(b, blk_lo, _page_at(pages_smem, 0, PAGED), n_blk, L, PAGED)
            _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, x0, x1, has0, 0, False, NZ)
            _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, x0, x1, has0, 1, True, NZ)
        if PARTS & 2:
            blk_y = blk_lo + gl.minimum(1, gl.maximum(n_iter - 1, 0))
            y0, y1 = _coords(b, blk_y, _page_at(pages_smem, blk_y - blk_lo, PAGED), n_blk, L, PAGED)
            _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, y0, y1, has0, 0, False, NZ)
            _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, y0, y1, has0, 1, True, NZ)

    @gluon.jit
    def _seesaw_segment(ROLE: gl.constexpr,
                        q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar,
                        z_desc, kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_smem,
                        b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, qk_scale_log2,
                        stride_lb, stride_lh, stride_ls, causal, cx, cy, kq,
                        PAGED: gl.constexpr, HEAD_MAJOR: gl.constexpr, PERSISTENT: gl.constexpr):
        """One warpgroup of the seesaw on one item (``ROLE`` 0: even blocks, output columns
        ``0 .. K/2``; ``ROLE`` 1: odd blocks, columns ``K/2 .. K``, the row sum and the LSE).
        ``cx``, ``cy``: loads of X and Y by the program's earlier items (the phases of their
        barriers and of the pair exchange), ``kq``: the phase of the item's ``q_bar`` and final
        row-sum exchange."""
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
        VIEWS: gl.constexpr = _PACKED_VIEWS if PERSISTENT else _ITEM_VIEWS

        rows = row0 + gl.arange(0, BM, layout=s_rows)
        if HEAD_MAJOR:
            token = rows % S
        else:
            token = rows // H
        limit = gl.where(causal != 0, L - S + token, L - 1)
        cols = gl.arange(0, BN, layout=s_cols)
        m_i = gl.full([BM], float("-inf"), gl.float32, s_rows)
        l_o = gl.full([BM], 0.0, gl.float32, o_rows)
        acc = gl.zeros([BM, KH], gl.float32, o_layout)
        s_zero = gl.zeros([BM, BN], gl.float32, s_layout)

        mbarrier.wait(q_bar, kq)
        n_pairs = (n_iter + 1) // 2
        for i in range(n_pairs):
            if VIEWS != 0:
                # the packed kernel builds the key buffers' views per pair from an opaque zero (an
                # inline-asm constant the compiler cannot fold), so the wgmma descriptors are
                # computed per pair instead of hoisted out of the loop into registers: its WG0 pair
                # loop reloads no spilled value (11 before) and it folds the scale as the item kernel
                # does; measured on an H200 6.5 % faster on a packed plan (b = 16, s = 2, t = 32768).
                # The item kernel builds only WG0's own views so (``_ITEM_VIEWS``): all four there
                # cut its reloads 20 -> 1 but added ~45 instructions and measured 0.5-4.6 % slower;
                # WG0's own alone, 20 -> 4, measured faster
                # (``docs/kernels/flash-mla/stalls.md``, "The two held-back changes, timed")
                z0 = gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
                if (VIEWS >> (2 * ROLE)) & 1:
                    own_z = z_smem.index(OWN + z0).reshape([BN, K])
                    own_r = kr_smem.index(OWN + z0).reshape([BN, P])
                if (VIEWS >> (2 * ROLE + 1)) & 1:
                    oth_z = z_smem.index(OTHER + z0).reshape([BN, K])
                    oth_r = kr_smem.index(OTHER + z0).reshape([BN, P])
            ph = (cx + i) & 1                     # the pair exchange's phase (one per pair, as X's loads)
            ph_own = (cx + i) & 1 if ROLE == 0 else (cy + i) & 1
            j = 2 * i + ROLE
            has_own = j < n_iter
            has_y = 2 * i + 1 < n_iter
            # Y was loaded in pair 0 even without a block 1 (a copy of block 0, masked below)
            raw = _scores(q_tile, qr_tile, own_z, own_r, ready, OWN, ph_own, has_own | (i == 0), s_zero, NZ)
            if has_own & ((blk_lo + j + 1) * BN - 1 <= L - S * (causal != 0) - (causal == 0)):
                sc = raw                          # every row sees every key of the block: no mask
            else:
                # column c holds key first + c; a shifted tail block's leading rows are not its own
                first = (blk_lo + j) * BN - _tail_shift(blk_lo + j, n_blk, L)
                keys = first + cols
                visible = (keys[None, :] <= limit[:, None]) & (keys[None, :] >= (blk_lo + j) * BN) & has_own
                sc = gl.where(visible, raw, float("-inf"))
            # scores in log2 units: the scale is folded into exp2's argument (one FFMA per score; the
            # row max is scaled once per row: the scale is positive, so the max commutes with it)
            row_max = gl.max(sc, axis=1) * qk_scale_log2
            if ROLE == 0:
                m_a = gl.maximum(m_i, row_max)
                m_a_safe = gl.where(m_a == float("-inf"), 0.0, m_a)
                p_f = gl.exp2(sc * qk_scale_log2 - m_a_safe[:, None])
                p = p_f.to(dtype)
                alpha = gl.convert_layout(gl.exp2(m_i - m_a_safe), o_rows)
                xrow.index(3).store(gl.sum(p_f, axis=1))      # p0's fp32 row sum, for WG1's l
                _publish(bar_a, xrow.index(0), m_a, own_r, p)
                acc = acc * alpha[:, None]
                p_op = gl.convert_layout(p, p_layout)
                tok = warpgroup_mma(p_op, own_z.slice(0, KH, dim=1), acc, is_async=True)
                mbarrier.wait(bar_b, ph)
                m_b = xrow.index(1).load(s_rows)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(tok, p_op))
                # X_L is free: its pieces of block 2i + 2
                cx0, cx1 = _coords(b, blk_lo + 2 * i + 2, _page_at(pages_smem, 2 * i + 2, PAGED), n_blk, L, PAGED)
                _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, cx0, cx1,
                           2 * i + 2 < n_iter, 0, False, NZ)
                m_b_safe = gl.where(m_b == float("-inf"), 0.0, m_b)
                beta = gl.convert_layout(gl.exp2(m_a - m_b_safe), o_rows)
                acc = acc * beta[:, None]
                if has_y:
                    tok = warpgroup_mma(oth_r, oth_z.slice(0, KH, dim=1), acc, is_async=True)
                    # Y_L and Y's RoPE piece (p1) are free once it has retired: block 2i + 3
                    cy0, cy1 = _coords(b, blk_lo + 2 * i + 3, _page_at(pages_smem, 2 * i + 3, PAGED), n_blk, L,
                                       PAGED)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
                    _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, cy0, cy1,
                               2 * i + 3 < n_iter, 0, True, NZ)
                m_i = m_b
            else:
                mbarrier.wait(bar_a, ph)
                m_a = xrow.index(0).load(s_rows)
                m_b = gl.maximum(m_a, row_max)
                m_b_safe = gl.where(m_b == float("-inf"), 0.0, m_b)
                p_f = gl.exp2(sc * qk_scale_log2 - m_b_safe[:, None])
                p = p_f.to(dtype)
                alpha = gl.convert_layout(gl.exp2(m_i - m_b_safe), o_rows)
                beta_s = gl.exp2(m_a - m_b_safe)
                beta = gl.convert_layout(beta_s, p_rows)
                # the row sum in fp32 (the LSE's accuracy), of p1 and of p0 rescaled to mB
                l_new = gl.convert_layout(gl.sum(p_f, axis=1) + xrow.index(3).load(s_rows) * beta_s, o_rows)
                # p0 (over X's RoPE piece, at scale mA) -> registers, rescaled to mB; read before
                # publishing, since WG0 may overwrite it once it has mB
                p0 = (oth_r.load(p_layout).to(gl.float32) * beta[:, None]).to(dtype)
                _publish(bar_b, xrow.index(1), m_b, own_r, p)
                p_op = gl.convert_layout(p, p_layout)
                l_o = l_o * alpha + l_new
                acc = acc * alpha[:, None]
                # p0 . X_R first: X (WG0's next block, on the critical path) is released before Y
                tok = warpgroup_mma(p0, oth_z.slice(KH, KH, dim=1), acc, is_async=True)
                tok = warpgroup_mma(p_op, own_z.slice(KH, KH, dim=1), tok, is_async=True)
                acc, p0 = warpgroup_mma_wait(num_outstanding=1, deps=(tok, p0))
                # X_R and X's RoPE piece (p0) are free: block 2i + 2
                cx0, cx1 = _coords(b, blk_lo + 2 * i + 2, _page_at(pages_smem, 2 * i + 2, PAGED), n_blk, L, PAGED)
                _load_half(z_desc, kr_desc, ready, z_smem.index(0), kr_smem.index(0), 0, cx0, cx1,
                           2 * i + 2 < n_iter, 1, True, NZ)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(tok, p_op))
                # Y_R is free: block 2i + 3
                cy0, cy1 = _coords(b, blk_lo + 2 * i + 3, _page_at(pages_smem, 2 * i + 3, PAGED), n_blk, L, PAGED)
                _load_half(z_desc, kr_desc, ready, z_smem.index(1), kr_smem.index(1), 1, cy0, cy1,
                           2 * i + 3 < n_iter, 1, False, NZ)
                m_i = m_b

        if PERSISTENT:
            # every MMA of the item has retired (the loop's last waits): Q, X and the page list
            # are free, and the loader issues the next item's prologue during the epilogue
            gl.thread_barrier()
            mbarrier.arrive(seg_bar.index(0), count=1)
        # ---- epilogue: normalise, stage in a free buffer, TMA store (rows >= ROWS are clipped)
        o_rows_idx = row0 + gl.arange(0, BM, layout=o_rows)
        if ROLE == 1:
            l_ok = l_o > 0
            m_o = gl.convert_layout(m_i, o_rows)
            # no visible key: -inf; an empty sequence: +inf, as FlashMLA reports it
            lse = gl.where(l_ok, (m_o + gl.log2(gl.where(l_ok, l_o, 1.0))) * 0.6931471805599453,
                           gl.where(L == 0, float("inf"), float("-inf")))
            if slot < 0:
                if HEAD_MAJOR:
                    l_off = (o_rows_idx // S) * stride_lh + (o_rows_idx % S) * stride_ls
                else:
                    l_off = (o_rows_idx % H) * stride_lh + (o_rows_idx // H) * stride_ls
                gl.store(lse_ptr + b.to(gl.int64) * stride_lb + l_off, lse, mask=o_rows_idx < ROWS)
            else:
                gl.store(lse_part_ptr + slot.to(gl.int64) * ROWS + o_rows_idx, lse, mask=o_rows_idx < ROWS)
            xrow.index(2).store(gl.convert_layout(l_o, s_rows))
            gl.thread_barrier()
            mbarrier.arrive(bar_e, count=1)
            l_fin = l_o
        else:
            mbarrier.wait(bar_e, kq)
            l_fin = xrow.index(2).load(o_rows)
        out = acc * (1.0 / gl.where(l_fin > 0, l_fin, 1.0))[:, None]
        # the item kernel: every MMA reading Q is done (WG0's last scores precede mA), so WG1 stages
        # its half there; WG1 is done with X, so WG0 stages in X. The packed kernel stages in Y
        # (its loader is refilling Q and X): WG1 once WG0's last MMA over Y has retired (seg_bar[0]),
        # WG0 after WG1's row sum (bar_e, after WG1's last MMA); a split item's fp32 partial (its
        # half is Y's size) WG1 only, WG0 storing its own straight from its registers
        if slot < 0:
            if PERSISTENT:
                if ROLE == 1:
                    mbarrier.wait(seg_bar.index(0), kq)
                o_smem = z_smem.index(1)._reinterpret(o_desc.dtype, [2, 1, BM, KH], o_desc.layout).index(ROLE)
            elif ROLE == 1:
                o_smem = q_smem._reinterpret(o_desc.dtype, [1, BM, KH], o_desc.layout)
            else:
                o_smem = z_smem._reinterpret(o_desc.dtype, [1, BM, KH], o_desc.layout)
            o_smem.reshape([BM, KH]).store(out.to(o_desc.dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(o_desc, [b, row0, ROLE * KH], o_smem)
        elif PERSISTENT and ROLE == 0:
            x_cols = gl.arange(0, KH, layout=gl.SliceLayout(0, o_layout))
            x_off = (slot.to(gl.int64) * ROWS + o_rows_idx)[:, None] * K + x_cols[None, :]
            gl.store(op_ptr + x_off, out, mask=(o_rows_idx < ROWS)[:, None])
        else:
            if PERSISTENT:
                mbarrier.wait(seg_bar.index(0), kq)
                x_smem = z_smem.index(1)._reinterpret(op_desc.dtype, [1, BM, KH], op_desc.layout)
            elif ROLE == 1:
                x_smem = q_smem._reinterpret(op_desc.dtype, [1, BM, KH], op_desc.layout)
            else:
                x_smem = z_smem._reinterpret(op_desc.dtype, [1, BM, KH], op_desc.layout)
            x_smem.reshape([BM, KH]).store(out)
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(op_desc, [slot, row0, ROLE * KH], x_smem)
        tma.store_wait(pendings=0)
        if PERSISTENT:
            # the stores have read Y: the loader may refill it
            gl.thread_barrier()
            mbarrier.arrive(seg_bar.index(1), count=1)

    @gluon.jit
    def _seesaw_wg(ROLE: gl.constexpr, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc,
                   qr_desc, z_desc, kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem,
                   items_ptr, seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T,
                   MAX_BLOCKS, qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED,
                   HEAD_MAJOR, HAS_SEQLENS, PERSISTENT: gl.constexpr):
        """One warpgroup's work: the program's item, or (``PERSISTENT``, a packed plan) its items
        ``it0 .. it1`` in turn; each item's segment releases the buffers as it is done with them
        (``seg_bar``, two arrivals each) and the loader warp (:func:`_seesaw_loader`) issues the
        next item's prologue."""
        if PERSISTENT:
            cx = 0
            cy = 0
            for it in range(it0, it1):
                k = it - it0
                if k > 0:
                    b, blk_lo, n_iter, slot, L, n_blk = _item(items_ptr, seqlens_ptr, it, T, MAX_BLOCKS, HAS_SEQLENS)
                _seesaw_segment(ROLE, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, z_desc,
                                kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_smem, b, row0, slot,
                                blk_lo, n_iter, n_blk, S, H, ROWS, L, qk_scale_log2, stride_lb, stride_lh, stride_ls,
                                causal, cx, cy, k & 1, PAGED, HEAD_MAJOR, True)
                cx += (n_iter + 1) // 2
                cy += gl.maximum(n_iter // 2, gl.minimum(n_iter, 1))
        else:
            _seesaw_segment(ROLE, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, z_desc, kr_desc,
                            o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_smem, b, row0, slot, blk_lo, n_iter,
                            n_blk, S, H, ROWS, L, qk_scale_log2, stride_lb, stride_lh, stride_ls, causal, 0, 0, 0,
                            PAGED, HEAD_MAJOR, False)

    @gluon.jit
    def _seesaw_loader(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                       kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                       seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T,
                       MAX_BLOCKS, qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED,
                       HEAD_MAJOR, HAS_SEQLENS):
        """A packed plan's loader (one warp): the next item's prologue, in two parts: its pages,
        query tile and block 0 once both warpgroups have released Q, X and the page list
        (``seg_bar[0]``, when their pair loops end), block 1 once they have released Y
        (``seg_bar[1]``, after the output stores staged there). The first item's prologue is the
        program's, before the partitions start. The compute warpgroups thus hold no query
        descriptors or block table across their pair loops."""
        for it in range(it0 + 1, it1):
            b, blk_lo, n_iter, slot, L, n_blk = _item(items_ptr, seqlens_ptr, it, T, MAX_BLOCKS, HAS_SEQLENS)
            mbarrier.wait(seg_bar.index(0), (it - it0 - 1) & 1)
            _issue_item(q_desc, qr_desc, z_desc, kr_desc, ready, q_bar, q_smem, qr_smem, z_smem, kr_smem, pages_row,
                        table_ptr, stride_tb, stride_tc, b, row0, blk_lo, n_iter, n_blk, L, PAGED, 1)
            mbarrier.wait(seg_bar.index(1), (it - it0 - 1) & 1)
            _issue_item(q_desc, qr_desc, z_desc, kr_desc, ready, q_bar, q_smem, qr_smem, z_smem, kr_smem, pages_row,
                        table_ptr, stride_tb, stride_tc, b, row0, blk_lo, n_iter, n_blk, L, PAGED, 2)

    # the partitions' entry points: warp_specialize hands its arguments over as values, so a flag
    # must be a literal in the call below to stay a compile-time constant (ROLE, PERSISTENT)
    @gluon.jit
    def _seesaw_wg0(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                    kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                    seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T,
                    MAX_BLOCKS, qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED,
                    HEAD_MAJOR, HAS_SEQLENS):
        _seesaw_wg(0, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                   kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                   seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T, MAX_BLOCKS,
                   qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED, HEAD_MAJOR,
                   HAS_SEQLENS, False)

    @gluon.jit
    def _seesaw_wg1(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                    kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                    seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T,
                    MAX_BLOCKS, qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED,
                    HEAD_MAJOR, HAS_SEQLENS):
        _seesaw_wg(1, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                   kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                   seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T, MAX_BLOCKS,
                   qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED, HEAD_MAJOR,
                   HAS_SEQLENS, False)

    @gluon.jit
    def _seesaw_wg0_packed(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                           kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                           seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T,
                           MAX_BLOCKS, qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal,
                           PAGED, HEAD_MAJOR, HAS_SEQLENS):
        _seesaw_wg(0, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                   kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                   seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T, MAX_BLOCKS,
                   qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED, HEAD_MAJOR,
                   HAS_SEQLENS, True)

    @gluon.jit
    def _seesaw_wg1_packed(q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                           kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                           seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T,
                           MAX_BLOCKS, qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal,
                           PAGED, HEAD_MAJOR, HAS_SEQLENS):
        _seesaw_wg(1, q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc,
                   kr_desc, o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr,
                   seqlens_ptr, table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T, MAX_BLOCKS,
                   qk_scale_log2, stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, causal, PAGED, HEAD_MAJOR,
                   HAS_SEQLENS, True)

    @gluon.jit
    def _flash_mla_seesaw(
        q_desc, qr_desc,          # TMA: queries [B, ROWS, K] / [B, ROWS, P], boxes [1, 64, K/2] / [1, 64, P]
        z_desc, kr_desc,          # TMA: keys [B, T, K] / [B, T, P] (dense) or [pages, 64, K] / [pages, 64, P]
        o_desc,                   # TMA: output [B, ROWS, K] (q's dtype), boxes [1, 64, K/2]
        op_desc,                  # TMA: fp32 partials [slots, ROWS, K], boxes [1, 64, K/2]
        lse_ptr, lse_part_ptr, op_ptr, seqlens_ptr, table_ptr, items_ptr, starts_ptr, packed_ptr,
        ROWS, S, H, T, MAX_BLOCKS, qk_scale_log2,
        stride_lb, stride_lh, stride_ls, stride_tb, stride_tc,
        K: gl.constexpr, P: gl.constexpr, CAUSAL: gl.constexpr, PAGED: gl.constexpr, HAS_SEQLENS: gl.constexpr,
        HEAD_MAJOR: gl.constexpr, PERSISTENT: gl.constexpr, GATED: gl.constexpr,
    ):
        """One program: the 64 rows ``program_id(0)`` of plan item ``program_id(1)`` =
        ``(b, blk_lo, blk_hi, slot)`` (:mod:`mla_var3.kernel.decode_plan`), or with ``PERSISTENT``
        (a packed plan) of items ``starts[p] .. starts[p + 1]`` for ``p = program_id(1)``, in turn;
        the default partition is WG0, the worker WG1 (see the module docstring). Rows are
        ``head * S + token`` (``HEAD_MAJOR``) or ``token * H + head``, as in the query and output
        tensors. ``GATED``: the GPU chose the plan's kind (``packed_ptr[0]``, 1: packed) and both
        kernels are launched, the item kernel first; a program of the other kind's kernel exits
        at once — in the packed kernel (launched second, a programmatic dependent launch) program
        (0, 0) only once the item kernel has ended, so that the combine, which waits for this
        grid, waits for that one too."""
        BM: gl.constexpr = 64
        BN: gl.constexpr = 64
        dtype: gl.constexpr = q_desc.dtype
        # the combine that merges split items is a programmatic dependent launch: it may start
        # (and wait for this grid) once every program has begun, not once the last has ended
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        if GATED:
            packed = gl.load(packed_ptr)
            if PERSISTENT:
                if packed == 0:
                    # one waiting program keeps this grid from ending before the item kernel
                    # has; the others leave at once, in that kernel's tail
                    if gl.program_id(0) + gl.program_id(1) == 0:
                        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32,
                                                  is_pure=False, pack=1)
                    return
            else:
                if packed != 0:
                    return
        if PERSISTENT:
            it0 = gl.load(starts_ptr + gl.program_id(1))
            it1 = gl.load(starts_ptr + gl.program_id(1) + 1)
        else:
            it0 = gl.program_id(1)
            it1 = it0 + 1
        if it0 >= it1:
            return
        b, blk_lo, n_iter, slot, L, n_blk = _item(items_ptr, seqlens_ptr, it0, T, MAX_BLOCKS, HAS_SEQLENS)
        if b < 0:
            return
        row0 = gl.program_id(0) * BM

        zl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BN, K], dtype)
        q_smem = gl.allocate_shared_memory(dtype, [1, BM, K], zl)
        qr_smem = gl.allocate_shared_memory(dtype, [1, BM, P], qr_desc.layout)
        z_smem = gl.allocate_shared_memory(dtype, [2, 1, BN, K], zl)
        kr_smem = gl.allocate_shared_memory(dtype, [2, 1, BN, P], kr_desc.layout)
        # the key buffers' six load barriers (X, Y: Z's halves and the RoPE piece) as six
        # allocations, not one of six: the compiler's shared-memory hazard analysis then tells
        # them apart and fences (bar.sync) only between the ops on one barrier
        ready = (gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
                 gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
                 gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
                 gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
                 gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
                 gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()))
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        xbar = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
        # a packed plan's item transitions: [0] Q, X and the page list free, [1] Y free (two arrivals each)
        seg_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        xrow = gl.allocate_shared_memory(gl.float32, [4, BM], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        # the item's pages (paged caches), [1, NP]; element j is the page of the item's block j
        NP: gl.constexpr = MAX_ITEM_PAGES if PAGED or PERSISTENT else 128
        pages_row = gl.allocate_shared_memory(gl.int32, [1, NP], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        mbarrier.init(q_bar, count=1)
        mbarrier.init(seg_bar.index(0), count=2)
        mbarrier.init(seg_bar.index(1), count=2)
        for i0 in gl.static_range(6):
            mbarrier.init(ready[i0], count=1)
        for i1 in gl.static_range(3):
            mbarrier.init(xbar.index(i1), count=1)
        _issue_item(q_desc, qr_desc, z_desc, kr_desc, ready, q_bar, q_smem, qr_smem, z_smem, kr_smem, pages_row,
                    table_ptr, stride_tb, stride_tc, b, row0, blk_lo, n_iter, n_blk, L, PAGED, 3)
        pages_smem = pages_row._reinterpret(gl.int32, [NP, 1], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

        args = (q_smem, qr_smem, z_smem, kr_smem, ready, q_bar, xbar, xrow, seg_bar, q_desc, qr_desc, z_desc, kr_desc,
                o_desc, op_desc, lse_ptr, lse_part_ptr, op_ptr, pages_row, pages_smem, items_ptr, seqlens_ptr,
                table_ptr, it0, it1, b, row0, slot, blk_lo, n_iter, n_blk, S, H, ROWS, L, T, MAX_BLOCKS, qk_scale_log2,
                stride_lb, stride_lh, stride_ls, stride_tb, stride_tc, gl.to_tensor(CAUSAL).to(gl.int32), PAGED,
                HEAD_MAJOR, HAS_SEQLENS)
        if PERSISTENT:
            gl.warp_specialize([(_seesaw_wg0_packed, args), (_seesaw_wg1_packed, args), (_seesaw_loader, args)],
                               [4, 1], [_PACKED_WORKER_REGS, _LOADER_REGS])
        else:
            gl.warp_specialize([(_seesaw_wg0, args), (_seesaw_wg1, args)], [4], [_WORKER_REGS])


# ---------------------------------------------------------------------------------------------
# host side

if GLUON_AVAILABLE:
    LAUNCH = CachedLaunch(_flash_mla_seesaw)
    #: the packed kernel after the item kernel, for a plan whose kind the GPU chose
    LAUNCH_AFTER = CachedLaunch(_flash_mla_seesaw, launch_pdl=True)


def compile_for_sm90(*, k: int = 512, p: int = 64, dtype: str = "bf16", causal: bool = True, paged: bool = False,
                     has_seqlens: bool = False, head_major: bool = True, persistent: bool = False,
                     gated: bool = False, capability: int = 90):
    """Compile the seesaw kernel for sm_90 without a GPU; returns Triton's CompiledKernel.
    Must run in a process without ``TRITON_INTERPRET`` set."""
    def desc(cols: int, rows: int, ty: str = dtype) -> str:
        return _gluon.desc_type([1, rows, cols], ty)

    signature = {
        "q_desc": desc(k // 2, BLOCK_M), "qr_desc": desc(p, BLOCK_M), "z_desc": desc(k // 2, BLOCK_N),
        "kr_desc": desc(p, BLOCK_N), "o_desc": desc(k // 2, BLOCK_M), "op_desc": desc(k // 2, BLOCK_M, "fp32"),
        "lse_ptr": "*fp32", "lse_part_ptr": "*fp32", "op_ptr": "*fp32", "seqlens_ptr": "*i32", "table_ptr": "*i32",
        "items_ptr": "*i32", "starts_ptr": "*i32", "packed_ptr": "*i64",
        "ROWS": "i32", "S": "i32", "H": "i32", "T": "i32", "MAX_BLOCKS": "i32", "qk_scale_log2": "fp32",
        "stride_lb": "i32", "stride_lh": "i32", "stride_ls": "i32", "stride_tb": "i32", "stride_tc": "i32",
        "K": "constexpr", "P": "constexpr", "CAUSAL": "constexpr", "PAGED": "constexpr", "HAS_SEQLENS": "constexpr",
        "HEAD_MAJOR": "constexpr", "PERSISTENT": "constexpr", "GATED": "constexpr",
    }
    constexprs = {"K": k, "P": p, "CAUSAL": causal, "PAGED": paged, "HAS_SEQLENS": has_seqlens or paged,
                  "HEAD_MAJOR": head_major, "PERSISTENT": persistent, "GATED": gated}
    # pointers 16-byte aligned, as every launch's are (torch allocations; the launch key holds the
    # alignment of the caller's lengths and block table): the partials' stores are vectorised on it
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(signature.values()) if ty.startswith("*")}
    return _gluon.compile_sm90(_flash_mla_seesaw, signature, constexprs, num_warps=NUM_WARPS // 2, attrs=attrs,
                               capability=capability)

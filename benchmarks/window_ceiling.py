"""The hybrid's window kernel against the ceilings it could hit, per SM count (sm_90).

Eight parts, in one process (`--parts` picks some), on the window as the hybrid stores it (k, v ``[B, N, H, D]``,
kpe ``[B, N, P]``):

1. **The ring probe**: a Gluon kernel that streams exactly the window kernel's TMA boxes (per
   (sequence, head) item, blocks of ``BN`` keys: k, v and kpe) through a ring of ``slots``
   shared-memory buffers, with a consumer that only waits for a slot and frees it. Its GB/s per
   SM is what the window kernel's loads alone can pull with that ring.
2. **The plain read** of ``runtime.ceilings`` (a streaming Triton read, one program per SM).
3. **The window kernel** (``expanded_window_gluon``) alone at s in {16, 32, 64}, checked against
   an fp32 reference first; GB/s per SM (k and v per head, kpe once per token, q and o) and
   TFLOP/s.
4. **The MMA rate of its tile shapes**: the window's score MMAs (``[64, N] = K . Q^T + Kpe .
   Qpe^T`` from shared memory, one wait per pair, N = 16, 32, 64 padded query tokens) in a loop
   on one or two warpgroups per program, TFLOP/s per program (programs at most the SM count;
   the block scheduler spreads them, nothing pins one per SM).
5. **The stream and the products together**: the ring probe's stream (4 slots of 64 keys)
   consumed by the window kernel's two products per block (``S^T`` and ``O^T += V^T . P^T``,
   one wait each) on two consumer warpgroups, with no softmax: what the kernel's loads and
   MMAs, which share the SM's shared memory (TMA writes, wgmma operand reads), allow together.
6. **The register-A form**: the same two products with k, kpe and v loaded from global memory
   straight into the wgmma's A-operand registers (16-byte loads, the contraction index permuted
   so they land where the fragment wants them), with and without L2 prefetch ahead, v as stored
   ``[B, N, H, D]`` or transposed ``[B, H, D, N]``: the loads and products of a window kernel
   whose only shared-memory bytes are the B operands.
7. **The rows form** (``window_rows_gluon``): the query rows on the wgmma's M side, Q and P in
   registers, k, kpe and v read once from shared memory as B operands, two independent pipelines
   per program; checked against an fp32 reference first, then GB/s per SM and TFLOP/s at
   s in {64, 48, 32} beside part 3's swap-AB kernel, with one and (32-key blocks) two ring blocks
   per softmax step, the latter also with keys and values on their own barriers (``split``);
   ``--rows-baseline FILE`` (repeatable) times other versions of the kernel's file (earlier
   commits', written out with ``git show``) beside them in the same process, each at its defaults
   and named by its file's stem.
8. **The rows form's products alone**: part 7's program (its producers, ring and Q in
   registers) with consumers that issue its two products per block in its order but skip the
   softmax (P = the raw scores in bf16): what its loads and register-A products allow without the
   max, exponentials, sums and rescale. Checked against torch on one item first.

    python benchmarks/window_ceiling.py --out benchmarks/results/h200/window/ceiling-<commit>.json

About 70-100 s on an H200. Prints a table per part last.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

from common import environment, require_cuda, write_json

from mla_var3 import reference as R
from mla_var3.kernel.hopper import GLUON_AVAILABLE, GLUON_IMPORT_ERROR
from mla_var3.runtime.ceilings import measure_read_by_sms
from mla_var3.runtime.timing import time_fn

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )
    from mla_var3.kernel.hopper.window_rows_gluon import rows_mma_layout, rows_producer, rows_state

    @gluon.jit
    def _probe_producer(k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, n_items, H, N):
        NSLOT: gl.constexpr = k_smem.shape[0]
        BN: gl.constexpr = k_smem.shape[2]
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nb = gl.cdiv(N, BN)
        c = 0
        for item in range(pid, n_items, G):
            b = item // H
            h = item % H
            for j in range(nb):
                slot = c % NSLOT
                mbarrier.wait(empty.index(slot), ((c // NSLOT) & 1) ^ 1, pred=c >= NSLOT)
                bar = ready.index(slot)
                mbarrier.expect(bar, 2 * k_desc.block_type.nbytes + kr_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [b, j * BN, h, 0], bar, k_smem.index(slot))
                tma.async_copy_global_to_shared(v_desc, [b, j * BN, h, 0], bar, v_smem.index(slot))
                tma.async_copy_global_to_shared(kr_desc, [b, j * BN, 0], bar, kr_smem.index(slot))
                c += 1

    @gluon.jit
    def _probe_consumer(k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, n_items, H, N):
        NSLOT: gl.constexpr = k_smem.shape[0]
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        mine = gl.cdiv(n_items - pid, G) * gl.cdiv(N, k_smem.shape[2])
        for c in range(mine):
            slot = c % NSLOT
            mbarrier.wait(ready.index(slot), (c // NSLOT) & 1)
            mbarrier.arrive(empty.index(slot), count=1)

    @gluon.jit
    def _ring_probe(k_desc, v_desc, kr_desc, n_items, H, N, SLOTS: gl.constexpr):
        """Grid ``(programs,)``: stream the (sequence, head) items' k / v / kpe blocks."""
        BN: gl.constexpr = k_desc.block_type.shape[1]
        D: gl.constexpr = k_desc.block_type.shape[3]
        P: gl.constexpr = kr_desc.block_type.shape[2]
        dtype: gl.constexpr = k_desc.dtype
        k_smem = gl.allocate_shared_memory(dtype, [SLOTS, 1, BN, 1, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [SLOTS, 1, BN, 1, D], v_desc.layout)
        kr_smem = gl.allocate_shared_memory(dtype, [SLOTS, 1, BN, P], kr_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        args = (k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, n_items, H, N)
        gl.warp_specialize([(_probe_consumer, args), (_probe_producer, args)], [1], [24])


    @gluon.jit
    def _mma_probe(out_ptr, iters, BM: gl.constexpr, SP: gl.constexpr, D: gl.constexpr, P: gl.constexpr):
        """Grid ``(programs,)``: ``iters`` times, the window kernel's score MMAs from shared memory
        (``[BM, SP] = K[BM, D] . Q^T + Kpe[BM, P] . Qpe^T``, one wait per pair, as its consumers
        issue them), on ``num_warps // 4`` warpgroups side by side (``BM = 64`` per warpgroup)."""
        dtype: gl.constexpr = gl.bfloat16
        wg: gl.constexpr = gl.num_warps() // 4
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * wg, 1],
                                                         instr_shape=[16, SP, 16])
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        k = gl.allocate_shared_memory(dtype, [BM, D], gl.NVMMASharedLayout.get_default_for([BM, D], dtype))
        kr = gl.allocate_shared_memory(dtype, [BM, P], gl.NVMMASharedLayout.get_default_for([BM, P], dtype))
        q = gl.allocate_shared_memory(dtype, [SP, D], gl.NVMMASharedLayout.get_default_for([SP, D], dtype))
        qr = gl.allocate_shared_memory(dtype, [SP, P], gl.NVMMASharedLayout.get_default_for([SP, P], dtype))
        k.store(gl.full([BM, D], 0.001, dtype, fill))
        kr.store(gl.full([BM, P], 0.001, dtype, fill))
        q.store(gl.full([SP, D], 0.001, dtype, fill))
        qr.store(gl.full([SP, P], 0.001, dtype, fill))
        fence_async_shared()
        gl.thread_barrier()
        acc = gl.zeros([BM, SP], gl.float32, layout)
        for _ in range(iters):
            tok = warpgroup_mma(k, q.permute((1, 0)), acc, is_async=True)
            tok = warpgroup_mma(kr, qr.permute((1, 0)), tok, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        gl.store(out_ptr + gl.program_id(0), gl.max(gl.max(acc, axis=1), axis=0))


    @gluon.jit
    def _stream_mma_consumer(W: gl.constexpr, k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty,
                             q_smem, qr_smem, p_smem, out_ptr, n_items, H, N):
        """Consumer ``W`` of :func:`_stream_mma_probe`: the blocks ``W, W + 2, ...`` of its program,
        each through the window kernel's two products (``S^T = K . Q^T + Kpe . Qpe^T`` and
        ``O^T += V^T . P^T``), one wait each, with no softmax between them."""
        NSLOT: gl.constexpr = k_smem.shape[0]
        BN: gl.constexpr = k_smem.shape[2]
        D: gl.constexpr = k_smem.shape[4]
        P: gl.constexpr = kr_smem.shape[3]
        SP: gl.constexpr = q_smem.shape[0]
        layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, SP, 16])
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        mine = gl.cdiv(n_items - pid, G) * gl.cdiv(N, BN)
        s_zero = gl.zeros([BN, SP], gl.float32, layout)
        acc = gl.zeros([D, SP], gl.float32, layout)
        q_t = q_smem.permute((1, 0))
        qr_t = qr_smem.permute((1, 0))
        best = gl.max(gl.max(s_zero, axis=1), axis=0)
        for c in range(W, mine, 2):
            slot = c % NSLOT
            mbarrier.wait(ready.index(slot), (c // NSLOT) & 1)
            tok = warpgroup_mma(k_smem.index(slot).reshape([BN, D]), q_t, s_zero, use_acc=False, is_async=True)
            tok = warpgroup_mma(kr_smem.index(slot).reshape([BN, P]), qr_t, tok, is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
            tok = warpgroup_mma(v_smem.index(slot).reshape([BN, D]).permute((1, 0)), p_smem.index(W), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
            mbarrier.arrive(empty.index(slot), count=1)
            best = gl.maximum(best, gl.max(gl.max(sc, axis=1), axis=0))
        gl.store(out_ptr + 2 * pid + W, best + gl.max(gl.max(acc, axis=1), axis=0))

    @gluon.jit
    def _stream_mma_consumer0(k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, q_smem, qr_smem,
                              p_smem, out_ptr, n_items, H, N):
        _stream_mma_consumer(0, k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, q_smem, qr_smem,
                             p_smem, out_ptr, n_items, H, N)

    @gluon.jit
    def _stream_mma_consumer1(k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, q_smem, qr_smem,
                              p_smem, out_ptr, n_items, H, N):
        _stream_mma_consumer(1, k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, q_smem, qr_smem,
                             p_smem, out_ptr, n_items, H, N)

    @gluon.jit
    def _stream_mma_producer(k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, q_smem, qr_smem,
                             p_smem, out_ptr, n_items, H, N):
        _probe_producer(k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, n_items, H, N)

    @gluon.jit
    def _stream_mma_probe(k_desc, v_desc, kr_desc, out_ptr, n_items, H, N, SLOTS: gl.constexpr, SP: gl.constexpr):
        """Grid ``(programs,)``: the ring probe's stream, each block consumed by the window kernel's
        products on two consumer warpgroups (queries and ``P^T`` fixed in shared memory): the
        kernel's loads and MMAs without its softmax."""
        BN: gl.constexpr = k_desc.block_type.shape[1]
        D: gl.constexpr = k_desc.block_type.shape[3]
        P: gl.constexpr = kr_desc.block_type.shape[2]
        dtype: gl.constexpr = k_desc.dtype
        k_smem = gl.allocate_shared_memory(dtype, [SLOTS, 1, BN, 1, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [SLOTS, 1, BN, 1, D], v_desc.layout)
        kr_smem = gl.allocate_shared_memory(dtype, [SLOTS, 1, BN, P], kr_desc.layout)
        q_smem = gl.allocate_shared_memory(dtype, [SP, D], gl.NVMMASharedLayout.get_default_for([SP, D], dtype))
        qr_smem = gl.allocate_shared_memory(dtype, [SP, P], gl.NVMMASharedLayout.get_default_for([SP, P], dtype))
        p_smem = gl.allocate_shared_memory(dtype, [2, BN, SP], gl.NVMMASharedLayout.get_default_for([BN, SP], dtype))
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        q_smem.store(gl.full([SP, D], 0.001, dtype, fill))
        qr_smem.store(gl.full([SP, P], 0.001, dtype, fill))
        p_smem.index(0).store(gl.full([BN, SP], 0.001, dtype, fill))
        p_smem.index(1).store(gl.full([BN, SP], 0.001, dtype, fill))
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()
        gl.thread_barrier()
        args = (k_desc, v_desc, kr_desc, k_smem, v_smem, kr_smem, ready, empty, q_smem, qr_smem, p_smem, out_ptr,
                n_items, H, N)
        gl.warp_specialize([(_stream_mma_consumer0, args), (_stream_mma_consumer1, args),
                            (_stream_mma_producer, args)], [4, 1], [224, 24])


    # 8. the rows form's products without its softmax: the rows kernel's producers and ring, and
    # consumers that run its two products per block in its order (block j's scores with
    # P_{j-1} . V_{j-1}, one wait for the scores, one for the output product) with P the raw
    # scores converted to the operand's dtype and layout: no max, exp, sums or rescale.
    @gluon.jit
    def _rows_products_consumer(W: gl.constexpr, STEP: gl.constexpr, q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem,
                                qr_smem, k_smem, v_smem, kr_smem, q_ready, q_empty, kv_ready, kv_empty, n_items, H, N,
                                o_ptr, lse_ptr, S, qk_scale_log2, strides, causal):
        NS: gl.constexpr = k_smem.shape[0] // 2
        BN: gl.constexpr = k_smem.shape[2]
        D: gl.constexpr = k_smem.shape[4]
        P: gl.constexpr = kr_smem.shape[3]
        SP: gl.constexpr = q_smem.shape[2]
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = rows_mma_layout(BN)
        o_layout: gl.constexpr = rows_mma_layout(D)
        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nb = gl.cdiv(N, BN)
        s_zero = gl.zeros([SP, BN], gl.float32, s_layout)
        o_r = gl.arange(0, SP, layout=gl.SliceLayout(1, o_layout))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        it = 0
        c = 0
        for item in range(pid + W * G, n_items, 2 * G):
            mbarrier.wait(q_ready.index(W), it & 1)
            q_op = q_smem.index(W).reshape([SP, D]).load(q_layout)
            qr_op = qr_smem.index(W).reshape([SP, P]).load(q_layout)
            mbarrier.arrive(q_empty.index(W), count=1)
            acc = gl.zeros([SP, D], gl.float32, o_layout)
            p_op = gl.zeros([SP, BN], dtype, p_layout)
            prev = 0
            for j in range(nb):
                slot = W * NS + c % NS
                mbarrier.wait(kv_ready.index(slot), (c // NS) & 1)
                s_tok = warpgroup_mma(q_op, k_smem.index(slot).reshape([BN, D]).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
                s_tok = warpgroup_mma(qr_op, kr_smem.index(slot).reshape([BN, P]).permute((1, 0)), s_tok,
                                      is_async=True)
                # block 0 has no P . V before it: a product of zeros with this block's (loaded) v
                o_slot = gl.where(j > 0, prev, slot)
                o_tok = warpgroup_mma(p_op, v_smem.index(o_slot).reshape([BN, D]), acc, use_acc=j > 0, is_async=True)
                raw = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                mbarrier.arrive(kv_empty.index(prev), count=1, pred=j > 0)
                p_op = gl.convert_layout(raw.to(dtype), p_layout)
                prev = slot
                c += 1
            o_tok = warpgroup_mma(p_op, v_smem.index(prev).reshape([BN, D]), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))[0]
            mbarrier.arrive(kv_empty.index(prev), count=1)
            ptrs = o_ptr + item * SP * D + o_r[:, None] * D + o_d[None, :]
            gl.store(ptrs, acc.to(o_ptr.dtype.element_ty), mask=(o_r < S)[:, None])
            it += 1

    @gluon.jit
    def _rows_products_probe(q_desc, qr_desc, k_desc, v_desc, kr_desc, o_ptr, H, S, N, n_items,
                             STAGES: gl.constexpr):
        """Grid ``(programs,)``: :mod:`window_rows_gluon`'s program (its producers, ring and shared
        memory) with :func:`_rows_products_consumer` as its consumers."""
        q_smem, qr_smem, k_smem, v_smem, kr_smem, q_ready, q_empty, kv_ready, kv_empty = rows_state(
            q_desc, qr_desc, k_desc, v_desc, kr_desc, STAGES)
        causal = gl.to_tensor(1).to(gl.int32)
        strides = (0, 0, 0, 0, 0, 0)
        args = (q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, o_ptr, o_ptr, S, 1.0, strides, causal)
        gl.warp_specialize([(_rows_products_consumer, (0, 1) + args), (_rows_products_consumer, (1, 1) + args),
                            (rows_producer, (0, 1, 0) + args), (rows_producer, (1, 1, 0) + args)], [4, 1, 1],
                           [224, 24, 24])


    # 6. the register-A form: k, kpe and v loaded from global memory straight into the wgmma's
    # A-operand registers, so the only shared-memory bytes per block are the B operands (the
    # queries and P^T). A 16-byte load holds 8 consecutive d (or keys, with v stored transposed);
    # the contraction index is permuted so that those 8 elements are the ones the A fragment
    # wants in its registers (the queries would be permuted the same way), a permutation the
    # compiler checks is free (``assert_trivial``).
    REG_BN = gl.constexpr(64)
    @gluon.jit
    def _perm_k(x, R: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
        """[R, D] physical (d = 32m + 8c + 4i + 2h + b) -> [R, D] logical (k = 32m + 16i + 8h + 2c + b)."""
        y = x.reshape([R, D // 32, 4, 2, 2, 2]).permute((0, 1, 3, 4, 2, 5)).reshape([R, D])
        return gl.convert_layout(y, layout, assert_trivial=True)


    @gluon.jit
    def _perm_vt(x, R: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
        """[keys R, D] physical (d = 64 w1 + 32 w0 + 4 g + 2 a + r) -> [D, R] logical V^T rows
        d' = 64 a + 32 w1 + 16 w0 + 8 r + g."""
        y = x.reshape([R, 2, 2, 8, 2, 2]).permute((4, 1, 2, 5, 3, 0)).reshape([D, R])
        return gl.convert_layout(y, layout, assert_trivial=True)


    @gluon.jit
    def _prefetch(ptrs):
        """Prefetch the L2 lines of ``ptrs`` (one per element)."""
        return gl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=gl.int32,
                                         is_pure=False, pack=1)


    _VT_L = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32], [64, 0]],
        lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]], block_bases=[],
        shape=[128, 64]))
    _V_L = gl.constexpr(gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 4], [0, 8], [0, 16]], warp_bases=[[0, 32], [0, 64]], block_bases=[],
        shape=[64, 128]))


    @gluon.jit
    def _v_offsets(N, skn, VT: gl.constexpr):
        if VT:
            off = (gl.arange(0, 128, gl.SliceLayout(1, _VT_L))[:, None] * N
                   + gl.arange(0, 64, gl.SliceLayout(0, _VT_L))[None, :])
        else:
            off = (gl.arange(0, 64, gl.SliceLayout(1, _V_L))[:, None] * skn
                   + gl.arange(0, 128, gl.SliceLayout(0, _V_L))[None, :])
        return off


    @gluon.jit
    def _vbase(item, blk, H, N, skb, skn, VT: gl.constexpr):
        if VT:
            r = item * (128 * N) + blk * 64
        else:
            r = (item // H) * skb + blk * 64 * skn + (item % H) * 128
        return r


    @gluon.jit
    def _reg_block(item, blk, H, N, skb, skn, skrb, skrn, VT: gl.constexpr):
        """Element offsets of block ``blk`` of item ``item``: k's and v's (as stored) and kpe's."""
        kb = (item // H) * skb + blk * REG_BN * skn + (item % H) * 128
        return kb, _vbase(item, blk, H, N, skb, skn, VT), (item // H) * skrb + blk * REG_BN * skrn


    @gluon.jit
    def _reg_consumer(W: gl.constexpr, k_ptr, v_ptr, kr_ptr, q_smem, qr_smem, p_smem, out_ptr, n_items, H,
                      N, skb, skn, skrb, skrn, PF: gl.constexpr, VT: gl.constexpr, LOADS_ONLY: gl.constexpr):
        """Consumer ``W`` of :func:`_reg_stream_probe`: its program's blocks ``W, W + 2, ...``, the
        next one's loads issued before this one's products; with ``PF`` > 0 it also prefetches
        its block ``PF`` ahead into L2."""
        SP: gl.constexpr = q_smem.shape[0]
        D: gl.constexpr = q_smem.shape[1]
        P: gl.constexpr = qr_smem.shape[1]
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, SP, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(0, acc_l, 2)
        # k [BN keys, D]: 8 consecutive d per thread (16 B); lanes d8, d16 and rows; warps rows 16, 32
        k_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32], [0, 64]],
            lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]], block_bases=[],
            shape=[REG_BN, D])
        kr_l: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0], [0, 32]],
            lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]], block_bases=[],
            shape=[REG_BN, P])
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nb = N // REG_BN
        mine = gl.cdiv(n_items - pid, G) * nb
        k_off = (gl.arange(0, REG_BN, gl.SliceLayout(1, k_l))[:, None] * skn
                 + gl.arange(0, D, gl.SliceLayout(0, k_l))[None, :])
        kr_off = (gl.arange(0, REG_BN, gl.SliceLayout(1, kr_l))[:, None] * skrn
                  + gl.arange(0, P, gl.SliceLayout(0, kr_l))[None, :])
        v_off = _v_offsets(N, skn, VT)
        # prefetch: one L2 line of k and one of v per thread and block (k: 64 rows of 256 B;
        # v^T: 128 rows of 128 B; v as stored: as k)
        line_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        t = gl.arange(0, 128, line_l)
        k_line = (t // 2) * skn + (t % 2) * 64
        if VT:
            v_line = t * N
        else:
            v_line = k_line
        s_zero = gl.zeros([REG_BN, SP], gl.float32, acc_l)
        acc = gl.zeros([D, SP], gl.float32, acc_l)
        q_t = q_smem.permute((1, 0))
        qr_t = qr_smem.permute((1, 0))
        best = gl.max(s_zero, axis=1)

        c = gl.maximum(gl.minimum(W, mine - 1), 0)
        kb, vb, rb = _reg_block(pid + (c // nb) * G, c % nb, H, N, skb, skn, skrb, skrn, VT)
        kn = gl.load(k_ptr + kb + k_off)
        vn = gl.load(v_ptr + vb + v_off)
        krn = gl.load(kr_ptr + rb + kr_off)
        for c in range(W, mine, 2):
            k = kn
            v = vn
            kr = krn
            c2 = gl.minimum(c + 2, mine - 1)
            kb, vb, rb = _reg_block(pid + (c2 // nb) * G, c2 % nb, H, N, skb, skn, skrb, skrn, VT)
            kn = gl.load(k_ptr + kb + k_off)
            vn = gl.load(v_ptr + vb + v_off)
            krn = gl.load(kr_ptr + rb + kr_off)
            if PF > 0:
                cp = gl.minimum(c + 2 * PF, mine - 1)
                kb, vb, rb = _reg_block(pid + (cp // nb) * G, cp % nb, H, N, skb, skn, skrb, skrn, VT)
                _prefetch(k_ptr + kb + k_line)
                _prefetch(v_ptr + vb + v_line)
            if LOADS_ONLY:
                # the loads alone: each block's registers reduced within the thread
                best = gl.maximum(best, gl.convert_layout(gl.max(k.to(gl.float32), axis=1), best.type.layout))
                best = gl.maximum(best, gl.convert_layout(gl.max(kr.to(gl.float32), axis=1), best.type.layout))
                if VT:
                    acc += gl.convert_layout(gl.max(v.to(gl.float32), axis=1)[:, None], acc.type.layout)
                else:
                    best = gl.maximum(best, gl.convert_layout(gl.max(v.to(gl.float32), axis=1), best.type.layout))
            else:
                tok = warpgroup_mma(_perm_k(k, REG_BN, D, a_l), q_t, s_zero, use_acc=False, is_async=True)
                tok = warpgroup_mma(_perm_k(kr, REG_BN, P, a_l), qr_t, tok, is_async=True)
                sc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
                if VT:
                    va = _perm_k(v, D, REG_BN, a_l)
                else:
                    va = _perm_vt(v, REG_BN, D, a_l)
                tok = warpgroup_mma(va, p_smem.index(W), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
                best = gl.maximum(best, gl.max(sc, axis=1))
        gl.store(out_ptr + 2 * pid + W, gl.max(best, axis=0) + gl.max(gl.max(acc, axis=1), axis=0))


    @gluon.jit
    def _reg_consumer0(k_ptr, v_ptr, kr_ptr, q_smem, qr_smem, p_smem, out_ptr, n_items, H, N, skb, skn, skrb,
                       skrn, sel):
        _reg_consumer(0, k_ptr, v_ptr, kr_ptr, q_smem, qr_smem, p_smem, out_ptr, n_items, H, N, skb, skn,
                      skrb, skrn, sel.shape[0] - 1, sel.shape[1] - 1, sel.shape[2] - 1)


    @gluon.jit
    def _reg_consumer1(k_ptr, v_ptr, kr_ptr, q_smem, qr_smem, p_smem, out_ptr, n_items, H, N, skb, skn, skrb,
                       skrn, sel):
        _reg_consumer(1, k_ptr, v_ptr, kr_ptr, q_smem, qr_smem, p_smem, out_ptr, n_items, H, N, skb, skn,
                      skrb, skrn, sel.shape[0] - 1, sel.shape[1] - 1, sel.shape[2] - 1)


    @gluon.jit
    def _reg_stream_probe(k_ptr, v_ptr, kr_ptr, out_ptr, n_items, H, N, skb, skn, skrb, skrn,
                          SP: gl.constexpr, PF: gl.constexpr, REGS: gl.constexpr, VT: gl.constexpr,
                          LOADS_ONLY: gl.constexpr):
        """Grid ``(programs,)``: the register-A form of the window's loads and products on two
        consumer warpgroups (queries and ``P^T`` fixed in shared memory, no softmax), each
        prefetching its own blocks ``PF`` ahead into L2 when ``PF`` > 0."""
        dtype: gl.constexpr = gl.bfloat16
        D: gl.constexpr = 128
        P: gl.constexpr = 64
        q_smem = gl.allocate_shared_memory(dtype, [SP, D], gl.NVMMASharedLayout.get_default_for([SP, D], dtype))
        qr_smem = gl.allocate_shared_memory(dtype, [SP, P], gl.NVMMASharedLayout.get_default_for([SP, P], dtype))
        p_smem = gl.allocate_shared_memory(dtype, [2, REG_BN, SP],
                                           gl.NVMMASharedLayout.get_default_for([REG_BN, SP], dtype))
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        q_smem.store(gl.full([SP, D], 0.001, dtype, fill))
        qr_smem.store(gl.full([SP, P], 0.001, dtype, fill))
        p_smem.index(0).store(gl.full([REG_BN, SP], 0.001, dtype, fill))
        p_smem.index(1).store(gl.full([REG_BN, SP], 0.001, dtype, fill))
        fence_async_shared()
        gl.thread_barrier()
        # a constexpr does not cross into warp-specialised partitions (it arrives as a runtime
        # value), a shared-memory descriptor's shape does: PF, VT and LOADS_ONLY travel as this one's
        sel = gl.allocate_shared_memory(gl.int8, [PF + 1, VT + 1, LOADS_ONLY + 1],
                                        gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        args = (k_ptr, v_ptr, kr_ptr, q_smem, qr_smem, p_smem, out_ptr, n_items, H, N, skb, skn, skrb, skrn,
                sel)
        gl.warp_specialize([(_reg_consumer0, args), (_reg_consumer1, args)], [4], [REGS])


def reg_stream_probe(k, v, kpe, programs: int, *, sp: int, prefetch: int = 0, v_transposed: bool = False,
                     loads_only: bool = False, regs: int = 232) -> "torch.Tensor":
    """Launch :func:`_reg_stream_probe` (part 6) over k [B, N, H, D], kpe [B, N, P] and v, either
    [B, N, H, D] or, with ``v_transposed``, [B, H, D, N] (keys contiguous), on ``programs``
    programs of two consumer warpgroups; with ``prefetch`` > 0 each consumer also prefetches k and
    v into L2 that many of its blocks ahead; ``loads_only`` drops the products (the loads alone). N must be a multiple of 64. Returns the consumers' outputs."""
    b, n, h, d = k.shape
    if n % 64 or d != 128 or kpe.shape[-1] != 64:
        raise ValueError(f"the probe takes N % 64 == 0, D = 128, P = 64; got {tuple(k.shape)}, {tuple(kpe.shape)}")
    out = torch.empty(2 * programs, dtype=torch.float32, device=k.device)
    _reg_stream_probe[(programs,)](k, v, kpe, out, b * h, h, n, k.stride(0), k.stride(1), kpe.stride(0),
                                  kpe.stride(1), SP=sp, PF=prefetch, REGS=regs, VT=int(v_transposed),
                                  LOADS_ONLY=int(loads_only), num_warps=4)
    return out


def stream_mma_probe(k, v, kpe, programs: int, *, sp: int, slots: int = 4, block_n: int = 64) -> "torch.Tensor":
    """Launch :func:`_stream_mma_probe` over k, v [B, N, H, D] and kpe [B, N, P] (bf16) on
    ``programs`` programs with ``sp`` padded query columns; returns the consumers' outputs."""
    b, n, h, _ = k.shape
    out = torch.empty(2 * programs, dtype=torch.float32, device=k.device)
    _stream_mma_probe[(programs,)](*_box_descs(k, v, kpe, block_n), out, b * h, h, n, SLOTS=slots, SP=sp,
                                   num_warps=4)
    return out


def rows_products_probe(q, qpe, k, v, kpe, programs: int, *, block_n: int = 32, stages: int = 4) -> "torch.Tensor":
    """Launch :func:`_rows_products_probe` (part 8) on q [B, H, S, D], qpe [B, H, S, P], k, v
    [B, N, H, D] and kpe [B, N, P] (bf16) on ``programs`` programs; returns its output rows
    ``[B * H, 64, D]`` (rows past S unwritten)."""
    from mla_var3.kernel.hopper.window_rows_gluon import ROWS

    b, h, s, d = q.shape
    n, p = k.shape[1], kpe.shape[-1]
    out = torch.empty((b * h, ROWS, d), dtype=q.dtype, device=q.device)
    q3, qr3 = q.contiguous().view(b * h, s, d), qpe.contiguous().view(b * h, s, p)
    descs = (_desc(q3, [1, ROWS, d]), _desc(qr3, [1, ROWS, p]), *_box_descs(k, v, kpe, block_n))
    _rows_products_probe[(min(programs, b * h),)](*descs, out, h, s, n, b * h, STAGES=stages, num_warps=4)
    return out


def _desc(x, block):
    """A TMA descriptor of a bf16 tensor ``x`` (its own shape and strides) in boxes of ``block``."""
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)


def _box_descs(k, v, kpe, block_n: int) -> tuple:
    """TMA descriptors of k, v [B, N, H, D] and kpe [B, N, P] in the window kernel's boxes."""
    return (_desc(k, [1, block_n, 1, k.shape[-1]]), _desc(v, [1, block_n, 1, v.shape[-1]]),
            _desc(kpe, [1, block_n, kpe.shape[-1]]))


def mma_probe(programs: int, *, sp: int, warpgroups: int, iters: int = 20000, d: int = 128,
              p: int = 64) -> "torch.Tensor":
    """Launch :func:`_mma_probe` on ``programs`` programs; returns their outputs (one each)."""
    out = torch.empty(programs, dtype=torch.float32, device="cuda")
    _mma_probe[(programs,)](out, iters, BM=64 * warpgroups, SP=sp, D=d, P=p, num_warps=4 * warpgroups)
    return out


def mma_flops(programs: int, *, sp: int, warpgroups: int, iters: int = 20000, d: int = 128, p: int = 64) -> float:
    """The FLOPs one :func:`mma_probe` call issues (its padded query columns included)."""
    return 2.0 * programs * iters * 64 * warpgroups * sp * (d + p)


def ring_probe(k, v, kpe, programs: int, *, block_n: int, slots: int) -> None:
    """Stream k, v [B, N, H, D] and kpe [B, N, P] (bf16) once in the window kernel's boxes."""
    if not k.dtype == v.dtype == kpe.dtype == torch.bfloat16:
        raise ValueError(f"the probe streams bf16, got {k.dtype}, {v.dtype}, {kpe.dtype}")
    b, n, h, _ = k.shape
    _ring_probe[(programs,)](*_box_descs(k, v, kpe, block_n), b * h, h, n, SLOTS=slots, num_warps=4)


#: the rows form's configurations of part 7: (keys per block, ring slots per consumer, blocks per
#: softmax step, keys and values on their own barriers); records of 8340550-04637c7 also hold the
#: lazy rescale's rows (``lazy_rescale``, removed after it measured 0.90x step 1 on an H100)
ROWS_CONFIGS = ((32, 4, 1, False), (32, 4, 2, False), (32, 4, 2, True), (64, 2, 1, False))

def window_bytes(b, h, s, n, d, p, kpe_per_head: bool = False) -> int:
    """Bytes the window call must move: k and v per head, kpe once per token (or per head, as the
    kernel reads it), q / qpe and o."""
    kv = 2 * b * n * h * d * 2
    kr = b * n * p * 2 * (h if kpe_per_head else 1)
    return kv + kr + b * h * s * (2 * d + p) * 2


def window_flops(b, h, s, n, d, p, causal=True) -> float:
    """Score and value MMA FLOPs of the window (causal: each of the s rows sees n - s + i + 1 keys)."""
    keys = sum(n - s + i + 1 for i in range(s)) if causal else s * n
    return 2.0 * b * h * keys * ((d + p) + d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--b", type=int, default=32)
    ap.add_argument("--n", type=int, default=1344, help="window keys")
    ap.add_argument("--programs", default="8,16,44,66,132")
    ap.add_argument("--max-seconds", type=float, default=0.3, help="timing budget per point")
    ap.add_argument("--parts", default="1,2,3,4,5,6,7,8", help="which parts to run (comma list of 1-8)")
    ap.add_argument("--rows-baseline", metavar="FILE", action="append", default=[],
                    help="part 7: another version of window_rows_gluon.py (e.g. `git show REV:src/mla_var3/kernel/"
                         "hopper/window_rows_gluon.py > FILE`), timed beside this tree's at its defaults and named "
                         "by the file's stem; repeatable")
    args = ap.parse_args(argv)
    require_cuda()
    if not GLUON_AVAILABLE:
        print(f"needs triton's Gluon: {GLUON_IMPORT_ERROR}", file=sys.stderr)
        return 2
    from mla_var3.kernel.hopper.window_gluon import choose_block, expanded_window_gluon
    from mla_var3.kernel.hopper.window_rows_gluon import window_rows_gluon

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = [m for m in map(int, args.programs.split(",")) if m <= sms]
    b, n, h, d, p = args.b, args.n, 128, 128, 64
    g = torch.Generator(device=dev).manual_seed(0)

    def rn(*shape):
        return (torch.randn(*shape, device=dev, generator=g) * 0.5).to(torch.bfloat16)

    k, v, kpe = rn(b, n, h, d), rn(b, n, h, d), rn(b, n, p)
    parts = {int(x) for x in args.parts.split(",")}
    record = {"environment": environment(), "shape": dict(b=b, n=n, h=h, d=d, p=p), "parts": sorted(parts),
              "probe": [], "read": [], "window": [], "checks": [], "mma": [], "stream_mma": [], "reg_stream": [],
              "rows": [], "rows_products": []}

    def per_sm(nbytes, us, m):
        return nbytes / (us * 1e-6) / 1e9 / m

    def sweep(into: str, label: str, call, nbytes: float, flops: float, **fields) -> None:
        """Time ``call(m)`` on each program count ``m``; one row per count in ``record[into]``
        (``fields``, the time, GB/s per SM of ``nbytes`` and TFLOP/s of ``flops``), printed."""
        for m in programs:
            t = time_fn(lambda: call(m), warmup=2, reps=20, min_reps=3, max_seconds=args.max_seconds, flush_l2=False)
            r = dict(fields, programs=m, us=t.median_us, gbs_per_sm=per_sm(nbytes, t.median_us, m),
                     tflops=flops / (t.median_us * 1e-6) / 1e12)
            record[into].append(r)
            print(f"{label} m={m}: {t.median_us:.1f} us {r['gbs_per_sm']:.1f} GB/s per SM {r['tflops']:.1f} TFLOP/s",
                  flush=True)

    # 1. the ring probe: the window kernel's boxes through rings of several depths
    probe_cfgs = [(64, 2), (64, 3), (64, 4), (64, 5), (32, 4), (32, 8), (32, 10)] if 1 in parts else []
    for bn, slots in probe_cfgs:
        # HBM bytes count kpe once (its re-reads per head hit L2), as the window kernel's do;
        # ``tma_gbs_per_sm`` counts every byte the copies move
        nbytes = window_bytes(b, h, 0, n, d, p)
        tma_bytes = window_bytes(b, h, 0, n, d, p, kpe_per_head=True)
        for m in programs:
            try:
                t = time_fn(lambda: ring_probe(k, v, kpe, m, block_n=bn, slots=slots), warmup=2,
                            reps=20, min_reps=3, max_seconds=args.max_seconds, flush_l2=False)
            except Exception as exc:  # a configuration the shared memory cannot hold
                record["probe"].append(dict(block_n=bn, slots=slots, programs=m,
                                            error=f"{type(exc).__name__}: {exc}"[:200]))
                print(f"probe bn={bn} slots={slots} m={m}: {type(exc).__name__}", flush=True)
                break
            row = dict(block_n=bn, slots=slots, programs=m, us=t.median_us,
                       ring_kib=slots * bn * (2 * d + p) * 2 / 1024, gbs_per_sm=per_sm(nbytes, t.median_us, m),
                       tma_gbs_per_sm=per_sm(tma_bytes, t.median_us, m))
            record["probe"].append(row)
            print(f"probe bn={bn} slots={slots} m={m}: {t.median_us:.1f} us "
                  f"{row['gbs_per_sm']:.1f} GB/s per SM", flush=True)
    write_json(args.out, record)

    # 2. the plain read
    if 2 in parts:
        reads, desc = measure_read_by_sms(sorted(set(programs)), nbytes=4 * 2**30, max_seconds=args.max_seconds)
        record["read"] = [dict(programs=m, gbs=gbs, gbs_per_sm=gbs / m) for m, gbs in reads]
        record["read_source"] = desc
        write_json(args.out, record)

    # 3. the window kernel alone, checked first
    for s in (16, 32, 64) if 3 in parts else ():
        q, qpe = rn(b, h, s, d), rn(b, h, s, p)
        scale = (d + p) ** -0.5
        block = choose_block(q, qpe, k, v, kpe, True)
        if block is None:
            record["checks"].append(dict(s=s, skipped="the kernel does not take it"))
            print(f"window s={s}: not taken by the kernel", flush=True)
            continue
        bn, stages = block
        o, lse = expanded_window_gluon(q, qpe, k, v, kpe, scale=scale, causal=True, programs=44, block_n=bn,
                                       stages=stages)
        # the package's reference on the first two sequences
        ref_o, ref_lse = R.flash_attention(q[:2], qpe[:2], k[:2], v[:2], kpe[:2], scale, True)
        errs = [(o[:2].float() - ref_o.float()).abs().max().item(), (lse[:2] - ref_lse.float()).abs().max().item()]
        ok = max(errs) < 2e-2 and bool(torch.isfinite(o).all())
        record["checks"].append(dict(s=s, block_n=bn, stages=stages, max_err=max(errs), ok=ok))
        print(f"window s={s}: max err {max(errs):.2e} {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            continue
        nbytes = window_bytes(b, h, s, n, d, p)
        flops = window_flops(b, h, s, n, d, p)
        sweep("window", f"window s={s}", lambda m: expanded_window_gluon(q, qpe, k, v, kpe, scale=scale, causal=True,
                                                                        programs=m, block_n=bn, stages=stages),
              nbytes, flops, s=s, block_n=bn, stages=stages)
        del q, qpe, o, lse
    # 4. the MMA rate of the window's score MMAs (N = the padded query tokens) on 1 or 2 warpgroups
    for sp in (16, 32, 64) if 4 in parts else ():
        for wgs in (1, 2):
            for m in programs:
                t = time_fn(lambda: mma_probe(m, sp=sp, warpgroups=wgs), warmup=2, reps=10, min_reps=3,
                            max_seconds=args.max_seconds, flush_l2=False)
                tf = mma_flops(m, sp=sp, warpgroups=wgs) / (t.median_us * 1e-6) / 1e12
                record["mma"].append(dict(sp=sp, warpgroups=wgs, programs=m, us=t.median_us, tflops=tf,
                                          tflops_per_sm=tf / m))
                print(f"mma n={sp} warpgroups={wgs} m={m}: {tf / m:.2f} TFLOP/s per SM", flush=True)
    write_json(args.out, record)
    # 5. the stream and the products together (no softmax)
    nbytes = window_bytes(b, h, 0, n, d, p)
    for sp in (16, 32, 64) if 5 in parts else ():
        flops = 2.0 * b * h * n * sp * ((d + p) + d)
        sweep("stream_mma", f"stream+mma n={sp}", lambda m: stream_mma_probe(k, v, kpe, m, sp=sp), nbytes, flops,
              sp=sp)
    write_json(args.out, record)
    # 6. the register-A form: loads straight into the A operand's registers, the same products
    reg_cfgs = [(0, False, False), (0, True, False), (2, True, False), (4, True, False), (0, True, True),
                (2, True, True)] if 6 in parts else []
    v_t = v.permute(0, 2, 3, 1).contiguous() if reg_cfgs else None
    for prefetch, transposed, loads_only in reg_cfgs:
        for sp in ((16,) if loads_only else (16, 32, 64)):
            flops = 2.0 * b * h * n * sp * ((d + p) + d)
            for m in programs:
                try:
                    t = time_fn(lambda: reg_stream_probe(k, v_t if transposed else v, kpe, m, sp=sp, prefetch=prefetch,
                                                         v_transposed=transposed, loads_only=loads_only),
                                warmup=2, reps=20, min_reps=3, max_seconds=args.max_seconds, flush_l2=False)
                except Exception as exc:
                    record["reg_stream"].append(dict(sp=sp, programs=m, prefetch=prefetch, v_transposed=transposed,
                                                     loads_only=loads_only, error=f"{type(exc).__name__}: {exc}"[:300]))
                    print(f"reg n={sp} pf={prefetch} vt={transposed} m={m}: {type(exc).__name__}: {exc}"[:300],
                          flush=True)
                    break
                row = dict(sp=sp, programs=m, prefetch=prefetch, v_transposed=transposed, loads_only=loads_only,
                           us=t.median_us,
                           gbs_per_sm=per_sm(nbytes, t.median_us, m), tflops=flops / (t.median_us * 1e-6) / 1e12)
                record["reg_stream"].append(row)
                print(f"reg n={sp} pf={prefetch} vt={int(transposed)} loads_only={int(loads_only)} m={m}: {t.median_us:.1f} us "
                      f"{row['gbs_per_sm']:.1f} GB/s per SM", flush=True)
        write_json(args.out, record)

    # 7. the rows form, checked first, with one and two ring blocks per softmax step (and another
    # version of the kernel at its defaults, ``--rows-baseline``, in the same process)
    rows_forms, baselines = {"this": window_rows_gluon}, {}
    for path in args.rows_baseline if 7 in parts else ():
        name = Path(path).stem
        if name in baselines or name == "this":
            raise SystemExit(f"--rows-baseline {path}: a second file named {name!r}")
        spec = importlib.util.spec_from_file_location(f"rows_baseline_{len(baselines)}", path)
        baselines[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baselines[name])
        rows_forms[name] = baselines[name].window_rows_gluon
    if baselines:
        record["rows_baselines"] = {name: path for name, path in zip(baselines, args.rows_baseline)}
    for s_rows in (64, 48, 32) if 7 in parts else ():
        q, qpe = rn(b, h, s_rows, d), rn(b, h, s_rows, p)
        scale = (d + p) ** -0.5
        # (tree, its configuration, the call's options): a baseline runs at its own defaults
        configs = [("this", c, dict(block_n=c[0], stages=c[1], step=c[2], split=c[3])) for c in ROWS_CONFIGS]
        configs += [(name, (mod.DEFAULT_BLOCK_N, mod.DEFAULT_STAGES, getattr(mod, "DEFAULT_STEP", 1), False), {})
                    for name, mod in baselines.items()]
        for tree, (bn, stages, step, split), options in configs:
            form = rows_forms[tree]
            o, lse = form(q, qpe, k, v, kpe, scale=scale, causal=True, programs=44, **options)
            ref_o, ref_lse = R.flash_attention(q[:2], qpe[:2], k[:2], v[:2], kpe[:2], scale, True)
            errs = [(o[:2].float() - ref_o.float()).abs().max().item(), (lse[:2] - ref_lse.float()).abs().max().item()]
            ok = max(errs) < 2e-2 and bool(torch.isfinite(o).all())
            label = f"rows s={s_rows} bn={bn} step {step} split {split:d}" if tree == "this" else \
                f"rows s={s_rows} {tree}"
            record["checks"].append(dict(form="rows", tree=tree, s=s_rows, block_n=bn, stages=stages, step=step,
                                         split=split, max_err=max(errs), ok=ok))
            print(f"{label}: max err {max(errs):.2e} {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                continue
            nbytes, flops = window_bytes(b, h, s_rows, n, d, p), window_flops(b, h, s_rows, n, d, p)
            sweep("rows", label, lambda m: form(q, qpe, k, v, kpe, scale=scale, causal=True, programs=m, **options),
                  nbytes, flops, tree=tree, s=s_rows, block_n=bn, stages=stages, step=step, split=split)
        write_json(args.out, record)
        del q, qpe

    # 8. the rows form's products without its softmax, checked against the same products in torch
    for s_rows in (64, 32) if 8 in parts else ():
        q, qpe = rn(b, h, s_rows, d), rn(b, h, s_rows, p)
        for bn, stages in ((32, 4), (64, 2)):
            out = rows_products_probe(q, qpe, k, v, kpe, 44, block_n=bn, stages=stages)
            # item 0 (sequence 0, head 0); the probe's P is the raw scores in bf16
            sc = (q[0, 0].float() @ k[0, :, 0].float().T + qpe[0, 0].float() @ kpe[0].float().T)
            ref = sc.to(torch.bfloat16).float() @ v[0, :, 0].float()
            err = ((out[0, :s_rows].float() - ref).abs().max() / ref.abs().max()).item()
            ok = err < 2e-2
            record["checks"].append(dict(form="rows products", s=s_rows, block_n=bn, stages=stages, max_rel_err=err,
                                         ok=ok))
            print(f"rows products s={s_rows} bn={bn}: max rel err {err:.2e} {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                continue
            nbytes, flops = window_bytes(b, h, s_rows, n, d, p), 2.0 * b * h * 64 * n * (2 * d + p)
            sweep("rows_products", f"rows products s={s_rows} bn={bn} (64 rows)",
                  lambda m: rows_products_probe(q, qpe, k, v, kpe, m, block_n=bn, stages=stages), nbytes, flops,
                  s=s_rows, block_n=bn, stages=stages)
        write_json(args.out, record)
        del q, qpe

    def row(label: str, rows: list[dict], cell) -> None:
        by_programs = {r["programs"]: r for r in rows}
        print(f"| {label} | " + " | ".join(cell(by_programs[m]) if m in by_programs else "-" for m in programs) + " |")

    print("\n| GB/s per SM | " + " | ".join(f"{m} SMs" for m in programs) + " |")
    print("|---" * (len(programs) + 1) + "|")
    for bn, slots in probe_cfgs:
        row(f"probe {bn} keys x {slots} slots",
            [r for r in record["probe"] if (r["block_n"], r["slots"]) == (bn, slots) and "gbs_per_sm" in r],
            lambda r: f"{r['gbs_per_sm']:.0f}")
    row("plain read", record["read"], lambda r: f"{r['gbs_per_sm']:.0f}")
    for sp in (16, 32, 64):
        row(f"stream + products, n = {sp}", [r for r in record["stream_mma"] if r["sp"] == sp],
            lambda r: f"{r['gbs_per_sm']:.0f}")
    for prefetch, transposed, loads_only in reg_cfgs:
        for sp in ((16,) if loads_only else (16, 32, 64)):
            what = "loads alone" if loads_only else f"n = {sp}"
            row(f"register A, {what}, prefetch {prefetch}, v{'^T' if transposed else ''}",
                [r for r in record["reg_stream"]
                 if (r["sp"], r["prefetch"], r["v_transposed"], r["loads_only"]) == (sp, prefetch, transposed, loads_only)
                 and "gbs_per_sm" in r], lambda r: f"{r['gbs_per_sm']:.0f}")
    for s in (16, 32, 64):
        row(f"window s={s}", [r for r in record["window"] if r["s"] == s],
            lambda r: f"{r['gbs_per_sm']:.0f} ({r['tflops']:.0f} TF)")
    for s_rows in (64, 48, 32):
        for bn, stages, step, split in ROWS_CONFIGS:
            row(f"rows s={s_rows}, {bn} keys x {stages}, step {step}{', split' if split else ''}",
                [r for r in record["rows"] if r.get("tree", "this") == "this"
                 and (r["s"], r["block_n"], r.get("step"), r.get("split", False)) == (s_rows, bn, step, split)],
                lambda r: f"{r['gbs_per_sm']:.0f} ({r['tflops']:.0f} TF)")
        for name in baselines:
            row(f"rows s={s_rows}, {name} at its defaults",
                [r for r in record["rows"] if r.get("tree") == name and r["s"] == s_rows],
                lambda r: f"{r['gbs_per_sm']:.0f} ({r['tflops']:.0f} TF)")
    for s_rows in (64, 32):
        for bn, stages in ((32, 4), (64, 2)):
            row(f"rows products, no softmax, s={s_rows}, {bn} keys x {stages}",
                [r for r in record["rows_products"] if (r["s"], r["block_n"]) == (s_rows, bn)],
                lambda r: f"{r['gbs_per_sm']:.0f} ({r['tflops']:.0f} TF)")
    print("\n| TFLOP/s per SM, score MMAs | " + " | ".join(f"{m} SMs" for m in programs) + " |")
    print("|---" * (len(programs) + 1) + "|")
    for sp in (16, 32, 64):
        for wgs in (1, 2):
            row(f"n = {sp}, {wgs} warpgroup(s)", [r for r in record["mma"] if (r["sp"], r["warpgroups"]) == (sp, wgs)],
                lambda r: f"{r['tflops_per_sm']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

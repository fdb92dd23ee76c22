"""The hybrid's expanded part on Hopper (sm_90): a persistent Gluon kernel that streams the
expanded window from a few SMs, for the few query tokens of decode and speculative decoding.

The hybrid overlaps its compute-bound latent part with this memory-bound part by giving the
latter a fixed set of SMs (``programs`` persistent programs, issued first; the latent kernel
fills the others). That pays only if a few SMs pull most of the copy bandwidth, so the kernel
is built for bytes in flight per SM rather than for FLOPs:

* **Swap-AB.** With S <= 64 query tokens per (sequence, head) a 64-row wgmma tile would be
  mostly padding, so the keys are the M side: ``S^T = K . Q^T`` (``[BLOCK_N, SP]``, K + P
  deep; ``SP = max(16, next_pow2(S))``) and ``O^T += V^T . P^T`` (``[D, SP]``, V read
  transposed from shared memory, ``P^T`` written to shared memory as the B operand). The
  softmax runs along the key axis (per column).
* **Persistent split-K.** Program ``g`` of ``programs`` takes the (sequence, head) items
  ``g, g + programs, ...``. Its two consumer warpgroups take alternate key blocks of an item,
  each with its own running max, sum and ``O^T``; at the end of the item consumer 1 hands its
  state over shared memory and consumer 0 merges the two and writes ``o`` and ``lse``.
* **One barrier per block.** The keys of a block lie across the warpgroup's four warps, so a
  column max or sum over them crosses warps through shared memory. A block's probabilities use
  the running max, which stays put unless a block's max passes it by more than
  ``_LAZY_LOG2`` (then the block is redone with the new max, and ``O^T`` and the sums are
  rescaled; always the first block of an item). Each warp writes its partial block max beside
  ``P^T``, and the one barrier that publishes ``P^T`` publishes them too; the row sums stay per
  warp until the item ends. The result is exact either way: probabilities are at most ``2^8``
  before the final division.
* **Producer warp.** One warp issues every TMA copy: each consumer's Q / Qpe of the item (two
  buffers per consumer where shared memory allows, s <= 16, so the next item's queries load
  under this item's blocks instead of after its last one) and
  the k, v, kpe tiles of its blocks into that consumer's ring of ``STAGES`` buffers, running
  ahead across item boundaries.

Causal masking (query i of S sees window key j <= N - S + i) only in blocks that can hold a
masked key; keys past N read as zeros (TMA) and are masked.

Limits: S <= 64 (and N >= S when causal: every row sees a key), D a multiple of 64 up to 256,
P a multiple of 16 (``P <= D``), bf16/fp16, TMA-addressable k / v / kpe (unit last stride,
16-byte aligned strides).

Example
-------
>>> o, lse = expanded_window_gluon(q, qpe, k_new, v_new, kpe_new, scale=192 ** -0.5, programs=40)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from mla_var3.kernel._common import SMEM_LIMIT as _SMEM_LIMIT, check_scale, next_pow2
from mla_var3.kernel._launch import CachedLaunch, current_stream, int_classes, tma_arg_of
from mla_var3.kernel.expanded import tma_compatible
from mla_var3.kernel.hopper import _gluon as _base
from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )

__all__ = ["BLOCKS", "DEFAULT_BLOCK_N", "DEFAULT_STAGES", "MAX_S", "choose_block", "window_applies", "smem_bytes",
           "compile_for_sm90", "expanded_window_gluon", "launch_window"]

DEFAULT_BLOCK_N = 64    # keys per block (the M side of the score MMA)
DEFAULT_STAGES = 2      # ring depth per consumer: 4 blocks of 40 KiB per program
#: (keys per block, ring depth) tried in order by :func:`choose_block`. 64 keys are one wgmma's M;
#: 128-key blocks (measured at 43-44 GB/s per program against 51-57 for 64 x 2 on an H200 at
#: b = 32, s = 16, N = 1,344, with the per-block reductions of the first version) are not offered
BLOCKS = ((64, 2), (64, 1))
MAX_S = 64              # query tokens per (sequence, head)
_CONSUMER_REGS = gl.constexpr(224) if GLUON_AVAILABLE else 224
_PRODUCER_REGS = gl.constexpr(24) if GLUON_AVAILABLE else 24
#: a block's probabilities use the running max as long as no score passes it by more than this
#: (log2 units: probabilities up to 2^8 before the final division; exact either way)
_LAZY_LOG2 = gl.constexpr(8.0) if GLUON_AVAILABLE else 8.0


def _pad_s(s: int) -> int:
    return max(16, next_pow2(s))


def smem_bytes(s: int, d: int, p: int, block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
               elem_bytes: int = 2, q_bufs: int = 1) -> int:
    """Shared memory of one program: per consumer its ``q_bufs`` Q / Qpe tiles, ``stages`` k, v,
    kpe buffers and its ``P^T`` tile, plus the hand-over of consumer 1's ``O^T`` (fp32) and the
    per-warp block maxima (fp32, two parities per consumer)."""
    sp = _pad_s(s)
    per_consumer = q_bufs * sp * (d + p) + stages * block_n * (2 * d + p) + block_n * sp
    return 2 * per_consumer * elem_bytes + (d + 2) * sp * 4 + 16 * sp * 4


if GLUON_AVAILABLE:

    @gluon.jit
    def _win_producer(q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                      q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                      o_ptr, lse_ptr, S, qk_scale_log2, strides, causal):
        """The TMA warp: for each item, both consumers' Q / Qpe, then block j into consumer
        j % 2's ring."""
        NS: gl.constexpr = k_smem.shape[0] // 2
        QB: gl.constexpr = q_smem.shape[0] // 2
        BN: gl.constexpr = k_smem.shape[2]
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nb = gl.cdiv(N, BN)
        it = 0
        c0 = 0
        c1 = 0
        for item in range(pid, n_items, G):
            b = item // H
            h = item % H
            qph = ((it // QB) & 1) ^ 1
            for wq in gl.static_range(2):
                qs = wq * QB + it % QB
                mbarrier.wait(q_empty.index(qs), qph, pred=it >= QB)
                bar = q_ready.index(qs)
                mbarrier.expect(bar, q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [item, 0, 0], bar, q_smem.index(qs))
                tma.async_copy_global_to_shared(qr_desc, [item, 0, 0], bar, qr_smem.index(qs))
            for j in range(nb):
                w = j % 2
                cw = gl.where(w == 0, c0, c1)
                st = cw % NS
                ph = ((cw // NS) & 1) ^ 1
                slot = w * NS + st
                mbarrier.wait(kv_empty.index(slot), ph, pred=cw >= NS)
                bar = kv_ready.index(slot)
                mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes + kr_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [b, j * BN, h, 0], bar, k_smem.index(slot))
                tma.async_copy_global_to_shared(v_desc, [b, j * BN, h, 0], bar, v_smem.index(slot))
                tma.async_copy_global_to_shared(kr_desc, [b, j * BN, 0], bar, kr_smem.index(slot))
                c0 += gl.where(w == 0, 1, 0)
                c1 += gl.where(w == 1, 1, 0)
            it += 1

    @gluon.jit
    def _win_consumer(W: gl.constexpr, q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem,
                      kr_smem, q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                      o_ptr, lse_ptr, S, qk_scale_log2, strides, causal):
        """Consumer ``W``: blocks ``W, W + 2, ...`` of each item; consumer 0 merges and stores."""
        NS: gl.constexpr = k_smem.shape[0] // 2
        QB: gl.constexpr = q_smem.shape[0] // 2
        BN: gl.constexpr = k_smem.shape[2]
        D: gl.constexpr = k_smem.shape[4]
        P: gl.constexpr = kr_smem.shape[3]
        SP: gl.constexpr = q_smem.shape[2]
        dtype: gl.constexpr = q_smem.dtype
        # S^T [BN, SP] and O^T [D, SP]: the same wgmma accumulator layout (N = SP)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, SP, 16])
        o_layout: gl.constexpr = s_layout
        s_keys: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_toks: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_toks: gl.constexpr = gl.SliceLayout(0, o_layout)
        o_dims: gl.constexpr = gl.SliceLayout(1, o_layout)
        stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls = strides

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nb = gl.cdiv(N, BN)
        keys0 = gl.arange(0, BN, layout=s_keys)
        toks = gl.arange(0, SP, layout=s_toks)
        # last window key each query token sees (tokens past S: all keys; they are not stored)
        limit = gl.where((causal != 0) & (toks < S), N - S + toks, N - 1)
        limit = gl.minimum(limit, N - 1)
        # keys [0, full_keys) are seen by every token
        full_keys = gl.where(causal != 0, N - S + 1, N)
        s_zero = gl.zeros([BN, SP], gl.float32, s_layout)
        # the block's column max crosses warps through ``xmax`` (one [4, SP] row of per-warp maxima
        # per parity), read back replicated in every thread (``rep``), so one barrier per block
        # serves both the max and the ``P^T`` store
        rep: gl.constexpr = gl.BlockedLayout([4, 1], [1, 32], [4, 1], [1, 0])
        rep_toks: gl.constexpr = gl.SliceLayout(0, rep)
        p_smem = hand.index(W)
        it = 0
        cw = 0
        for item in range(pid, n_items, G):
            b = item // H
            h = item % H
            qs = W * QB + it % QB
            mbarrier.wait(q_ready.index(qs), (it // QB) & 1)
            q_t = q_smem.index(qs).reshape([SP, D]).permute((1, 0))      # [D, SP]: the B operand of S^T
            qr_t = qr_smem.index(qs).reshape([SP, P]).permute((1, 0))
            # m: the reference max of each token (log2 units), the same in every thread; the block's
            # probabilities use it unless a block's max passes it by more than _LAZY_LOG2 (then the
            # reference moves and the block is redone); l_w holds each warp's partial row sums
            m_r = gl.full([SP], float("-inf"), gl.float32, rep_toks)
            m_s = gl.full([SP], 0.0, gl.float32, s_toks)            # m_r with -inf read as 0, in S's layout
            l_w = gl.sum(gl.reshape(s_zero, [4, BN // 4, SP]), axis=1)  # [4, SP] zeros, one row per warp
            acc = gl.zeros([D, SP], gl.float32, o_layout)
            for j in range(W, nb, 2):
                st = cw % NS
                slot = W * NS + st
                mbarrier.wait(kv_ready.index(slot), (cw // NS) & 1)
                k_tile = k_smem.index(slot).reshape([BN, D])
                kr_tile = kr_smem.index(slot).reshape([BN, P])
                tok = warpgroup_mma(k_tile, q_t, s_zero, use_acc=False, is_async=True)
                tok = warpgroup_mma(kr_tile, qr_t, tok, is_async=True)
                sc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,)) * qk_scale_log2
                if (j + 1) * BN > full_keys:
                    keys = j * BN + keys0
                    sc = gl.where(keys[:, None] <= limit[None, :], sc, float("-inf"))
                p = gl.exp2(sc - m_s[None, :])
                p_smem.store(p.to(dtype))
                xmax.index(2 * W + (cw & 1)).store(gl.max(gl.reshape(sc, [4, BN // 4, SP]), axis=1))
                fence_async_shared()
                gl.thread_barrier()
                blk = gl.max(xmax.index(2 * W + (cw & 1)).load(rep), axis=0)
                grow = gl.max(gl.where(blk > m_r + _LAZY_LOG2, 1, 0), axis=0)
                if grow > 0:
                    m_new = gl.maximum(m_r, blk)
                    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                    alpha = gl.exp2(m_r - m_safe)
                    m_s = gl.convert_layout(m_safe, s_toks)
                    l_w = l_w * gl.convert_layout(alpha, gl.SliceLayout(0, l_w.type.layout))[None, :]
                    acc = acc * gl.convert_layout(alpha, o_toks)[None, :]
                    m_r = m_new
                    p = gl.exp2(sc - m_s[None, :])
                    p_smem.store(p.to(dtype))
                    fence_async_shared()
                    gl.thread_barrier()
                l_w = l_w + gl.sum(gl.reshape(p, [4, BN // 4, SP]), axis=1)
                v_t = v_smem.index(slot).reshape([BN, D]).permute((1, 0))   # [D, BN]
                tok = warpgroup_mma(v_t, p_smem, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
                mbarrier.arrive(kv_empty.index(slot), count=1)
                cw += 1
            m_i = gl.convert_layout(m_r, s_toks)
            l_i = gl.convert_layout(gl.sum(l_w, axis=0), s_toks)
            mbarrier.arrive(q_empty.index(qs), count=1)
            # ---- hand-over (consumer 1) / merge and store (consumer 0)
            if W == 1:
                mbarrier.wait(xbar.index(1), (it & 1) ^ 1, pred=it > 0)     # consumer 0 has read the last one
                xrow.index(0).store(m_i)
                xrow.index(1).store(l_i)
                xacc.store(acc)
                gl.thread_barrier()
                mbarrier.arrive(xbar.index(0), count=1)
            else:
                mbarrier.wait(xbar.index(0), it & 1)
                m_o = xrow.index(0).load(s_toks)
                l_o = xrow.index(1).load(s_toks)
                acc_o = xacc.load(o_layout)
                gl.thread_barrier()
                mbarrier.arrive(xbar.index(1), count=1)
                m_all = gl.maximum(m_i, m_o)
                m_ref = gl.where(m_all == float("-inf"), 0.0, m_all)
                a_me = gl.exp2(m_i - m_ref)
                a_ot = gl.exp2(m_o - m_ref)
                l_all = l_i * a_me + l_o * a_ot
                l_ok = l_all > 0
                inv = 1.0 / gl.where(l_ok, l_all, 1.0)
                w_me = gl.convert_layout(a_me * inv, o_toks)
                w_ot = gl.convert_layout(a_ot * inv, o_toks)
                o_t = acc * w_me[None, :] + acc_o * w_ot[None, :]
                lse = gl.where(l_ok, (m_all + gl.log2(gl.where(l_ok, l_all, 1.0))) * 0.6931471805599453,
                               float("-inf"))
                gl.store(lse_ptr + b * stride_lb + h * stride_lh + toks * stride_ls, lse, mask=toks < S)
                t_o = gl.arange(0, SP, layout=o_toks)
                d_o = gl.arange(0, D, layout=o_dims)
                ptrs = o_ptr + b * stride_ob + h * stride_oh + t_o[None, :] * stride_os + d_o[:, None] * stride_od
                gl.store(ptrs, o_t.to(o_ptr.dtype.element_ty), mask=(t_o < S)[None, :])
            it += 1

    @gluon.jit
    def _win_consumer0(q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                       q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                       o_ptr, lse_ptr, S, qk_scale_log2, strides, causal):
        _win_consumer(0, q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                      q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                      o_ptr, lse_ptr, S, qk_scale_log2, strides, causal)

    @gluon.jit
    def _win_consumer1(q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                       q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                       o_ptr, lse_ptr, S, qk_scale_log2, strides, causal):
        _win_consumer(1, q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                      q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                      o_ptr, lse_ptr, S, qk_scale_log2, strides, causal)

    @gluon.jit
    def _expanded_window(
        q_desc, qr_desc,        # TMA: [B*H, S, D], [B*H, S, P], boxes [1, SP, *]
        k_desc, v_desc,         # TMA: [B, N, H, D], boxes [1, BLOCK_N, 1, D]
        kr_desc,                # TMA: [B, N, P], boxes [1, BLOCK_N, P]
        o_ptr, lse_ptr, H, S, N, n_items, qk_scale_log2,
        stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
        STAGES: gl.constexpr, QBUF: gl.constexpr, CAUSAL: gl.constexpr,
    ):
        """Grid ``(programs,)``: persistent over the ``B * H`` (sequence, head) items."""
        BN: gl.constexpr = k_desc.block_type.shape[1]
        D: gl.constexpr = k_desc.block_type.shape[3]
        P: gl.constexpr = kr_desc.block_type.shape[2]
        SP: gl.constexpr = q_desc.block_type.shape[1]
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2 * QBUF, 1, SP, D], q_desc.layout)
        qr_smem = gl.allocate_shared_memory(dtype, [2 * QBUF, 1, SP, P], qr_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, 1, BN, 1, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, 1, BN, 1, D], v_desc.layout)
        kr_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, 1, BN, P], kr_desc.layout)
        hand_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, SP], dtype)
        hand = gl.allocate_shared_memory(dtype, [2, BN, SP], hand_layout)
        xrow = gl.allocate_shared_memory(gl.float32, [2, SP], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        xacc = gl.allocate_shared_memory(gl.float32, [D, SP], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        xmax = gl.allocate_shared_memory(gl.float32, [4, 4, SP], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        q_ready = gl.allocate_shared_memory(gl.int64, [2 * QBUF, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [2 * QBUF, 1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
        xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2 * QBUF):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(xbar.index(i), count=1)
        for i in gl.static_range(2 * STAGES):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=1)
        causal = gl.to_tensor(CAUSAL).to(gl.int32)
        strides = (stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls)
        args = (q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, hand, xbar, xrow, xacc, xmax,
                o_ptr, lse_ptr, S, qk_scale_log2, strides, causal)
        gl.warp_specialize([(_win_consumer0, args), (_win_consumer1, args), (_win_producer, args)], [4, 1],
                           [_CONSUMER_REGS, _PRODUCER_REGS])

    #: the window kernel's compiled launches, keyed by what it is specialised on (no per-call binding)
    _WINDOW_LAUNCH = CachedLaunch(_expanded_window)


# ---------------------------------------------------------------------------------------------
# host side


def window_applies(q: torch.Tensor, qpe: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                   kpe_new: torch.Tensor, causal: bool, *, block_n: int = DEFAULT_BLOCK_N,
                   stages: int = DEFAULT_STAGES) -> bool:
    """Whether :func:`expanded_window_gluon` takes this call (see the module's limits)."""
    b, h, s, d = q.shape
    n, p = k_new.shape[1], qpe.shape[-1]
    return (GLUON_AVAILABLE and q.dtype in (torch.bfloat16, torch.float16) and 0 < s <= MAX_S and n > 0
            and (n >= s or not causal) and d % 64 == 0 and d <= 256 and p % 16 == 0 and 0 < p <= d
            and smem_bytes(s, d, p, block_n, stages) + 1024 <= _SMEM_LIMIT
            and tma_compatible(k_new, v_new, kpe_new))


def choose_block(q, qpe, k_new, v_new, kpe_new, causal: bool) -> tuple[int, int] | None:
    """The first of :data:`BLOCKS` that :func:`window_applies` accepts for this call (larger S
    needs more shared memory for its Q and ``P^T`` tiles), or None when none does."""
    for bn, stages in BLOCKS:
        if window_applies(q, qpe, k_new, v_new, kpe_new, causal, block_n=bn, stages=stages):
            return bn, stages
    return None


def expanded_window_gluon(q: torch.Tensor, qpe: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                          kpe_new: torch.Tensor, *, scale: float, causal: bool = True, programs: int,
                          block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
                          out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Expanded attention over a window of N keys for S <= 64 query tokens, on ``programs``
    persistent programs (sm_90).

    Parameters
    ----------
    q : [B, H, S, D], qpe : [B, H, S, P]     queries (bf16/fp16)
    k_new, v_new : [B, N, H, D]               the window's expanded keys and values
    kpe_new : [B, N, P]                       the window's RoPE keys (shared by the heads)
    scale : float                             softmax scale
    causal : bool                             query i sees window key j <= N - S + i
    programs : int                            persistent programs (at most one per SM runs)
    block_n, stages : int                     keys per block (64: one wgmma's M), ring depth per consumer
    out : [B, H, S, D], optional              output buffer (any strides, any float dtype)

    Returns ``(o [B, H, S, D] in q's dtype or ``out``, lse [B, H, S] float32)``; inputs must
    satisfy :func:`window_applies` (ValueError otherwise).
    """
    _base.require_gluon()
    if q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}: the Gluon kernel needs CUDA tensors on an sm_90 GPU")
    if block_n != 64 or stages < 1 or programs < 1:
        raise ValueError(f"block_n must be 64, stages and programs >= 1; got {block_n}, {stages}, {programs}")
    b, h, s, d = q.shape
    n, p = k_new.shape[1], kpe_new.shape[-1]
    if qpe.shape != (b, h, s, p) or k_new.shape != (b, n, h, d) or v_new.shape != (b, n, h, d) \
            or kpe_new.shape != (b, n, p):
        raise ValueError(f"shapes do not agree: q {tuple(q.shape)}, qpe {tuple(qpe.shape)}, k_new "
                         f"{tuple(k_new.shape)}, v_new {tuple(v_new.shape)}, kpe_new {tuple(kpe_new.shape)}")
    if not window_applies(q, qpe, k_new, v_new, kpe_new, causal, block_n=block_n, stages=stages):
        raise ValueError("this call does not satisfy window_applies (S, N, dtype, D/P, shared memory or TMA strides)")
    return launch_window(q, qpe, k_new, v_new, kpe_new, scale=check_scale(scale), causal=bool(causal),
                         programs=programs, block_n=block_n, stages=stages, out=out)


def launch_window(q: torch.Tensor, qpe: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                  kpe_new: torch.Tensor, *, scale: float, causal: bool, programs: int, block_n: int, stages: int,
                  out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The launch of :func:`expanded_window_gluon` (same arguments and returns) on inputs the
    caller has checked: :func:`window_applies` holds for ``block_n`` and ``stages``, the shapes
    agree, ``scale`` is a positive finite float and ``programs >= 1`` (the hybrid's sm_90 path,
    which chose the block with :func:`choose_block`, calls it so, once per call).

    After its first call of a specialisation (compiled through Triton's own launcher) a call
    encodes its five TMA descriptors from the compiled kernel's descriptor boxes and this call's
    shapes and strides (:func:`~mla_var3.kernel._launch.tma_arg_of`), and issues the C launcher
    directly (:class:`~mla_var3.kernel._launch.FlatLaunch`): Triton's launcher would build five
    descriptor objects and convert them in Python at every call."""
    b, h, s, d = q.shape
    n, p = k_new.shape[1], kpe_new.shape[-1]
    o = torch.empty((b, h, s, d), dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    if b * h * s == 0:
        return o, lse
    sp = _pad_s(s)
    q3 = _base.tma_operand(q).view(b * h, s, d)
    qr3 = _base.tma_operand(qpe).view(b * h, s, p)
    ints = (h, s, n, b * h)
    strides = (*o.stride(), *lse.stride())
    # the descriptors are specialised on their dtype, box and layout (q's dtype, sp, d, p, block_n)
    # two Q / Qpe buffers per consumer where they fit: the next item's queries load under this item's blocks
    q_bufs = 2 if smem_bytes(s, d, p, block_n, stages, q_bufs=2) + 1024 <= _SMEM_LIMIT else 1
    # every constexpr is in the key (causal and the ring depth too: a causal call's kernel must never
    # serve a later non-causal call of the same shapes)
    key = (q.dtype, sp, d, p, block_n, stages, q_bufs, causal, o.dtype, o.data_ptr() % 16,
           lse.data_ptr() % 16, int_classes(ints + strides))
    grid = (min(programs, b * h), 1, 1)
    tail = (*ints, scale * _base.LOG2E, *strides)
    flat = _WINDOW_LAUNCH.flat(key)
    operands = (q3, qr3, k_new, v_new, kpe_new)
    if flat is None or flat.desc_boxes is None:
        # the first call of this key (it compiles), the interpreter, a launch hook, or a Triton whose
        # descriptor metadata this package cannot read: Triton's own launcher
        blocks = ([1, sp, d], [1, sp, p], [1, block_n, 1, d], [1, block_n, 1, d], [1, block_n, p])
        descs = tuple(_base.descriptor(x, block) for x, block in zip(operands, blocks))
        _WINDOW_LAUNCH(key, grid, (*descs, o, lse, *tail), dict(STAGES=stages, QBUF=q_bufs, CAUSAL=causal),
                       num_warps=4)
        return o, lse
    boxes = flat.desc_boxes
    encoded = []
    for i, x in enumerate(operands):
        encoded += tma_arg_of(boxes[i], x.data_ptr(), x.shape, x.stride())
    flat.launch(grid, current_stream(q.device.index), (*encoded, o.data_ptr(), lse.data_ptr(), *tail))
    return o, lse


def compile_for_sm90(*, s: int = 16, d: int = 128, p: int = 64, block_n: int = DEFAULT_BLOCK_N,
                     stages: int = DEFAULT_STAGES, q_bufs: int = 1, dtype: str = "bf16", causal: bool = True,
                     capability: int = 90):
    """Compile the kernel for sm_90 without a GPU; returns Triton's CompiledKernel.
    Must run in a process without ``TRITON_INTERPRET`` set."""
    sp = _pad_s(s)

    def desc(block: list[int]) -> str:
        return _base.desc_type(block, dtype)

    signature = {
        "q_desc": desc([1, sp, d]), "qr_desc": desc([1, sp, p]),
        "k_desc": desc([1, block_n, 1, d]), "v_desc": desc([1, block_n, 1, d]), "kr_desc": desc([1, block_n, p]),
        "o_ptr": f"*{dtype}", "lse_ptr": "*fp32", "H": "i32", "S": "i32", "N": "i32", "n_items": "i32",
        "qk_scale_log2": "fp32", "stride_ob": "i32", "stride_oh": "i32", "stride_os": "i32", "stride_od": "i32",
        "stride_lb": "i32", "stride_lh": "i32", "stride_ls": "i32", "STAGES": "constexpr", "QBUF": "constexpr",
        "CAUSAL": "constexpr",
    }
    return _base.compile_sm90(_expanded_window, signature, {"STAGES": stages, "QBUF": q_bufs, "CAUSAL": causal},
                              num_warps=4, capability=capability)

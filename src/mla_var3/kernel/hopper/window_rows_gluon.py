"""The hybrid's expanded window on Hopper (sm_90) with the query rows as the wgmma's M side: a
persistent Gluon kernel for 33-64 query tokens, where :mod:`window_gluon`'s swap-AB form runs
out of shared-memory bandwidth.

Why another form. :mod:`window_gluon` puts the keys on the M side (``S^T = K . Q^T``) so that few
query tokens do not pad a 64-row tile. Each key then crosses shared memory three times (the TMA
write and the A operand of both products), and a wgmma re-reads its A operand for every N it
multiplies; with N = 64 query columns that caps one SM at about 84 GB/s of keys at 1.98 GHz and
its one ring stage per consumer leaves it at 20 GB/s per SM (measured on an H200; docs/kernels/
mla-var6-plus/window.md). With 64 query tokens the rows fill an M = 64 tile anyway, so this
kernel takes FlashAttention-3's orientation and keeps both A operands in registers:

* ``S = Q . K^T + Qpe . Kpe^T`` (``[64, BLOCK_N]``): Q and Qpe are the A operand *in registers*,
  loaded from shared memory once per item; k and kpe are the B operand, read once.
* ``O += P . V`` (``[64, D]``): P in registers (the softmax's output, converted in place), v the
  B operand, read once.

A key's bytes cross shared memory twice (the TMA write and one B read) and nothing is re-read per
block, about 40 KiB of shared-memory traffic per 20 KiB block of keys instead of three times that.
The products are what bounds it instead: 2.6 MFLOP per 40 KiB of keys at s = 64 (about 115 GB/s
per SM at the dense rate). Below 64 tokens the rows are padding (the same products for fewer
tokens); :func:`mla_var3.kernel.hopper.window_gluon` stays the form there.

Measured on an H100 (docs/kernels/mla-var6-plus/window.md, "The rows form"): 49-53 GB/s per SM at
s = 64 on 8-66 SMs, 2.1-2.5x the swap-AB kernel, and level with it at s = 32; flat over the SM
count at half the dense MMA rate, so its limit is inside the SM. That was 0cf0c90's kernel: the
two-block steps, the raw-unit max, the row sums by MMA and ``split`` came after it and are not
yet timed. Not on the hybrid's default path: no partition measured with it beats the expanded
kernel at s = 64 yet.

* **Program.** Persistent over the ``B * H`` (sequence, head) items. Its two consumer warpgroups
  take alternate items of the program (consumer ``W`` the items ``pid + (2 i + W) G``), each
  with its own Q buffer, its own ring of ``STAGES`` buffers of ``BLOCK_N`` keys (k, kpe and v of a
  block under one mbarrier) and its own producer warp, so the two pipelines share nothing but
  the SM. An item's output is one consumer's: no hand-over, no merge.
* **Consumer** (software-pipelined as FA3's intra-warpgroup overlap): in iteration ``j`` it
  issues step ``j``'s score products, then ``P_{j-1} . V_{j-1}`` and ``P_{j-1} . 1`` (the row sums,
  on the tensor cores: a ``[BLOCK_N, 8]`` fp16 shared-memory tile of ones, so ``l`` is an
  ``[64, 8]`` accumulator rescaled with the output instead of a row reduction per step; ``P`` is
  rounded to fp16 for it, not to the bf16 of the output product: summed in bf16 the LSE missed the
  fp32 reference by 1.6e-4 relative at n = 20, over the suite's 1e-4 (measured on an H100 and an
  H200), waits for the scores only, runs step ``j``'s softmax
  while the output products run, then waits for them, frees step ``j - 1``'s buffers (one
  barrier per step) and rescales. A step is one ring block, or two (``step=2``: one running-max
  update and one rescale of the output per two 32-key blocks). With ``split=True`` the keys and
  the values of a slot have their own barriers: the keys are freed once the step's scores are
  done, and the producer loads them one step ahead of the values (with two blocks per step and
  one barrier per slot, a step's scores and the previous step's output product hold all four
  slots of the ring). The running max is kept in raw score units, so the softmax scale costs
  one FFMA per score with the exponent's subtraction. The Q buffer is freed as soon as Q is in
  registers, so the producer loads the next item's queries under this item's blocks.
* **Epilogue.** ``o`` and ``lse`` stored from registers (rows past S masked; ``o`` rows contiguous).

Shared memory (bf16, D = 128, P = 64, 64 rows, BLOCK_N = 32, 4 stages): per consumer Q + Qpe
24 KiB and 4 x 20 KiB of keys, 208 KiB per program (and the 512-byte tile of ones): one program per SM.

Causal masking as :mod:`window_gluon`: query i of S sees window key j <= N - S + i, only in
blocks that can hold a masked key; keys past N read as zeros (TMA) and are masked.

Limits: 1 <= S <= 64 (N >= S when causal), D a multiple of 64 up to 128 (the output's registers),
P a multiple of 16 (``P <= D``), bf16/fp16, TMA-addressable k / v / kpe.

Example
-------
>>> o, lse = window_rows_gluon(q, qpe, k_new, v_new, kpe_new, scale=192 ** -0.5, programs=66)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from mla_var3.kernel._common import SMEM_LIMIT as _SMEM_LIMIT, check_scale
from mla_var3.kernel._launch import CachedLaunch, int_classes
from mla_var3.kernel.expanded import tma_compatible
from mla_var3.kernel.hopper import _gluon as _base
from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)

__all__ = ["DEFAULT_BLOCK_N", "DEFAULT_STAGES", "DEFAULT_STEP", "MAX_S", "ROWS", "STEPS", "compile_for_sm90",
           "rows_applies", "smem_bytes", "window_rows_gluon"]

DEFAULT_BLOCK_N = 32    # keys per block (the score product's N, the output product's K)
#: ring blocks per softmax step (:func:`_step_softmax`): 1, or 2 (one max, rescale and set of row
#: reductions per two blocks, from the same 32-key ring slots)
STEPS = (1, 2)
DEFAULT_STEP = 1
DEFAULT_STAGES = 4      # ring depth per consumer
ROWS = 64               # query rows per item tile: one wgmma's M
MAX_S = ROWS
#: the second consumer's registers (a worker partition); the first consumer is the default partition
#: and gets what is left of the 64,512 (256). 224 + 256 with the producers' warp group at 24 fills it.
_CONSUMER_REGS = gl.constexpr(224) if GLUON_AVAILABLE else 224
_PRODUCER_REGS = gl.constexpr(24) if GLUON_AVAILABLE else 24


def smem_bytes(d: int, p: int, block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
               elem_bytes: int = 2) -> int:
    """Shared memory of one program: per consumer its Q / Qpe tile (``ROWS`` rows) and ``stages``
    buffers of k, v and kpe (``block_n`` keys); the row sums' ``[block_n, 8]`` fp16 tile of ones."""
    return 2 * (ROWS * (d + p) + stages * block_n * (2 * d + p)) * elem_bytes + block_n * 8 * 2


if GLUON_AVAILABLE:

    @gluon.constexpr_function
    def rows_mma_layout(n):
        """The accumulator layout of a consumer's ``[64, n]`` wgmma product (one warpgroup)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _masked(raw, j, full_keys, limit, cols, BN: gl.constexpr):
        """Block ``j``'s raw scores with the keys a row does not see at -inf (only in a block that
        can hold one: past ``full_keys``)."""
        if (j + 1) * BN > full_keys:
            keys = j * BN + cols
            raw = gl.where(keys[None, :] <= limit[:, None], raw, float("-inf"))
        return raw

    @gluon.jit
    def _exp(raw, m_scaled, qk_scale_log2):
        """``exp2(raw * scale - m_scaled)``: one FFMA and one MUFU per score (the scale is folded in)."""
        return gl.exp2(raw * qk_scale_log2 - m_scaled[:, None])

    @gluon.jit
    def _step_softmax(raw_a, raw_b, m_i, j, full_keys, limit, cols, qk_scale_log2, BN: gl.constexpr,
                      STEP: gl.constexpr):
        """The softmax of one step: block ``j``'s scores (``raw_a``), and with ``STEP = 2`` block
        ``j + 1``'s (``raw_b``) under one running max. The max ``m_i`` is kept in raw score units
        (the scale is positive), so the scale costs nothing apart from the FFMA of :func:`_exp`.
        Returns ``(p_a, p_b, m_new, alpha)`` (``p_b`` is ``p_a`` when ``STEP = 1``); the row sums
        are the tensor cores' (``P . 1`` beside ``P . V``, see :func:`_rows_consumer`)."""
        raw_a = _masked(raw_a, j, full_keys, limit, cols, BN)
        if STEP == 2:
            # one row reduction for both blocks
            raw_b = _masked(raw_b, j + 1, full_keys, limit, cols, BN)
            m_new = gl.maximum(m_i, gl.max(gl.maximum(raw_a, raw_b), axis=1))
        else:
            m_new = gl.maximum(m_i, gl.max(raw_a, axis=1))
        m_scaled = gl.where(m_new == float("-inf"), 0.0, m_new * qk_scale_log2)
        p_a = _exp(raw_a, m_scaled, qk_scale_log2)
        p_b = p_a
        if STEP == 2:
            p_b = _exp(raw_b, m_scaled, qk_scale_log2)
        alpha = gl.exp2(m_i * qk_scale_log2 - m_scaled)
        return p_a, p_b, m_new, alpha

    @gluon.jit
    def _scores(q_op, qr_op, k_smem, kr_smem, slot, s_zero):
        """Issue one block's score product ``Q . K^T + Qpe . Kpe^T`` (two wgmma groups)."""
        BN: gl.constexpr = k_smem.shape[2]
        D: gl.constexpr = k_smem.shape[4]
        P: gl.constexpr = kr_smem.shape[3]
        tok = warpgroup_mma(q_op, k_smem.index(slot).reshape([BN, D]).permute((1, 0)), s_zero, use_acc=False,
                            is_async=True)
        return warpgroup_mma(qr_op, kr_smem.index(slot).reshape([BN, P]).permute((1, 0)), tok, is_async=True)

    @gluon.jit
    def _step_scores(W: gl.constexpr, STEP: gl.constexpr, q_op, qr_op, k_smem, kr_smem, kv_ready, c, s_zero):
        """Wait for the ring slots of the step that starts at block counter ``c`` of consumer ``W``
        and issue their score products: ``(slot_a, slot_b, tok_a, tok_b)`` (``tok_b`` is ``tok_a``
        when ``STEP = 1``)."""
        NS: gl.constexpr = k_smem.shape[0] // 2
        slot_a = W * NS + c % NS
        slot_b = W * NS + (c + 1) % NS
        mbarrier.wait(kv_ready.index(slot_a), (c // NS) & 1)
        tok_a = _scores(q_op, qr_op, k_smem, kr_smem, slot_a, s_zero)
        tok_b = tok_a
        if STEP == 2:
            mbarrier.wait(kv_ready.index(slot_b), ((c + 1) // NS) & 1)
            tok_b = _scores(q_op, qr_op, k_smem, kr_smem, slot_b, s_zero)
        return slot_a, slot_b, tok_a, tok_b

    @gluon.jit
    def _step_output(SPLIT: gl.constexpr, STEP: gl.constexpr, pa_op, pb_op, pa_16, pb_16, v_smem, ones_smem,
                     kv_ready, slot_a, slot_b, c, acc, l_acc):
        """Issue the output products of the step at block counter ``c`` (in slots ``slot_a`` /
        ``slot_b``): ``P . V`` into ``acc`` (P in the inputs' dtype) and the row sums ``P . 1`` into
        ``l_acc`` (P in fp16, ``pa_16`` / ``pb_16``), each block's after its values are in
        (``SPLIT``: their own barrier). Returns their tokens."""
        NS: gl.constexpr = v_smem.shape[0] // 2
        BN: gl.constexpr = v_smem.shape[2]
        D: gl.constexpr = v_smem.shape[4]
        if SPLIT:
            mbarrier.wait(kv_ready.index(slot_a + 2 * NS), (c // NS) & 1)
        o_tok = warpgroup_mma(pa_op, v_smem.index(slot_a).reshape([BN, D]), acc, is_async=True)
        l_tok = warpgroup_mma(pa_16, ones_smem, l_acc, is_async=True)
        if STEP == 2:
            if SPLIT:
                mbarrier.wait(kv_ready.index(slot_b + 2 * NS), ((c + 1) // NS) & 1)
            o_tok = warpgroup_mma(pb_op, v_smem.index(slot_b).reshape([BN, D]), o_tok, is_async=True)
            l_tok = warpgroup_mma(pb_16, ones_smem, l_tok, is_async=True)
        return o_tok, l_tok

    @gluon.jit
    def rows_producer(W: gl.constexpr, STEP: gl.constexpr, SPLIT: gl.constexpr, q_desc, qr_desc, k_desc, v_desc,
                      kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem, q_ready, q_empty, kv_ready, kv_empty,
                      n_items, H, N, o_ptr, lse_ptr, S, qk_scale_log2, strides, causal):
        """Producer ``W``: for each of consumer ``W``'s items, its Q / Qpe (once the consumer holds
        the last ones in registers), then every block into the consumer's ring (a whole number of
        steps: with ``STEP = 2`` and an odd block count, one more block past N, which TMA fills with
        zeros and the consumer masks). With ``SPLIT`` the keys (k, kpe) and the values go on their
        own barriers (the values' at ``+ 2 * STAGES``) and the values follow one step behind the
        keys, so a free key slot is refilled without waiting for a value slot."""
        NS: gl.constexpr = k_smem.shape[0] // 2
        BN: gl.constexpr = k_smem.shape[2]
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        nb = gl.cdiv(gl.cdiv(N, BN), STEP) * STEP
        it = 0
        c = 0
        for item in range(pid + W * G, n_items, 2 * G):
            b = item // H
            h = item % H
            mbarrier.wait(q_empty.index(W), (it & 1) ^ 1, pred=it > 0)
            bar = q_ready.index(W)
            mbarrier.expect(bar, q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [item, 0, 0], bar, q_smem.index(W))
            tma.async_copy_global_to_shared(qr_desc, [item, 0, 0], bar, qr_smem.index(W))
            for j in range(nb + SPLIT * STEP):
                if j < nb:
                    slot = W * NS + c % NS
                    # a step's blocks are freed together: their first slot's barrier (see _rows_consumer)
                    mbarrier.wait(kv_empty.index(slot), ((c // NS) & 1) ^ 1, pred=(c >= NS) & (c % STEP == 0))
                    bar = kv_ready.index(slot)
                    if SPLIT:
                        mbarrier.expect(bar, k_desc.block_type.nbytes + kr_desc.block_type.nbytes)
                    else:
                        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes
                                        + kr_desc.block_type.nbytes)
                        tma.async_copy_global_to_shared(v_desc, [b, j * BN, h, 0], bar, v_smem.index(slot))
                    tma.async_copy_global_to_shared(k_desc, [b, j * BN, h, 0], bar, k_smem.index(slot))
                    tma.async_copy_global_to_shared(kr_desc, [b, j * BN, 0], bar, kr_smem.index(slot))
                if SPLIT:
                    if j >= STEP:
                        cv = c - STEP       # the values of block j - STEP
                        vslot = W * NS + cv % NS
                        mbarrier.wait(kv_empty.index(vslot + 2 * NS), ((cv // NS) & 1) ^ 1,
                                      pred=(cv >= NS) & (cv % STEP == 0))
                        bar = kv_ready.index(vslot + 2 * NS)
                        mbarrier.expect(bar, v_desc.block_type.nbytes)
                        tma.async_copy_global_to_shared(v_desc, [b, (j - STEP) * BN, h, 0], bar, v_smem.index(vslot))
                c += 1
            c -= SPLIT * STEP
            it += 1

    @gluon.jit
    def _rows_consumer(W: gl.constexpr, STEP: gl.constexpr, SPLIT: gl.constexpr, q_desc,
                       qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem, q_ready, q_empty,
                       kv_ready, kv_empty, n_items, H, N, o_ptr, lse_ptr, S, qk_scale_log2, strides, causal, ones_smem):
        """Consumer ``W``: its items whole (the module docstring's pipelined loop, over steps of
        ``STEP`` blocks), then ``o`` and ``lse``. With ``SPLIT`` (see :func:`rows_producer`) a step's
        key slots are freed once its scores are done, its value slots once its output product is."""
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
        l_layout: gl.constexpr = rows_mma_layout(8)
        p8_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l_layout, k_width=2)
        l_rows: gl.constexpr = gl.SliceLayout(1, l_layout)
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)
        stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls = strides

        pid = gl.program_id(0)
        G = gl.num_programs(0)
        steps = gl.cdiv(gl.cdiv(N, BN), STEP)
        rows = gl.arange(0, SP, layout=s_rows)
        cols = gl.arange(0, BN, layout=s_cols)
        # last window key each query row sees (rows past S: every key; they are not stored)
        limit = gl.minimum(gl.where((causal != 0) & (rows < S), N - S + rows, N - 1), N - 1)
        # keys [0, full_keys) are seen by every row
        full_keys = gl.where(causal != 0, N - S + 1, N)
        s_zero = gl.zeros([SP, BN], gl.float32, s_layout)
        o_r = gl.arange(0, SP, layout=o_rows)
        o_d = gl.arange(0, D, layout=o_cols)
        it = 0
        c = 0
        for item in range(pid + W * G, n_items, 2 * G):
            b = item // H
            h = item % H
            mbarrier.wait(q_ready.index(W), it & 1)
            q_op = q_smem.index(W).reshape([SP, D]).load(q_layout)
            qr_op = qr_smem.index(W).reshape([SP, P]).load(q_layout)
            mbarrier.arrive(q_empty.index(W), count=1)
            # step 0: scores and softmax; its P . V is issued in the next iteration
            slot_a, slot_b, tok_a, tok_b = _step_scores(W, STEP, q_op, qr_op, k_smem, kr_smem, kv_ready, c, s_zero)
            raw_a, raw_b = warpgroup_mma_wait(num_outstanding=0, deps=(tok_a, tok_b))
            if SPLIT:
                mbarrier.arrive(kv_empty.index(slot_a), count=1)
            m_i = gl.full([SP], float("-inf"), gl.float32, s_rows)
            p_a, p_b, m_i, alpha = _step_softmax(raw_a, raw_b, m_i, 0, full_keys, limit, cols, qk_scale_log2, BN,
                                                 STEP)
            pa_op = gl.convert_layout(p_a.to(dtype), p_layout)
            pb_op = gl.convert_layout(p_b.to(dtype), p_layout)
            pa_16 = gl.convert_layout(p_a.to(gl.float16), p8_layout)
            pb_16 = gl.convert_layout(p_b.to(gl.float16), p8_layout)
            acc = gl.zeros([SP, D], gl.float32, o_layout)
            l_acc = gl.zeros([SP, 8], gl.float32, l_layout)
            prev_a = slot_a
            prev_b = slot_b
            c += STEP
            for t in range(1, steps):
                slot_a, slot_b, tok_a, tok_b = _step_scores(W, STEP, q_op, qr_op, k_smem, kr_smem, kv_ready, c,
                                                            s_zero)
                o_tok, l_tok = _step_output(SPLIT, STEP, pa_op, pb_op, pa_16, pb_16, v_smem, ones_smem, kv_ready,
                                            prev_a, prev_b, c - STEP, acc, l_acc)
                raw_a, raw_b = warpgroup_mma_wait(num_outstanding=2 * STEP, deps=(tok_a, tok_b))
                if SPLIT:
                    mbarrier.arrive(kv_empty.index(slot_a), count=1)
                p_a, p_b, m_i, alpha = _step_softmax(raw_a, raw_b, m_i, t * STEP, full_keys, limit, cols,
                                                     qk_scale_log2, BN, STEP)
                acc, l_acc, pa_op, pb_op, pa_16, pb_16 = warpgroup_mma_wait(
                    num_outstanding=0, deps=(o_tok, l_tok, pa_op, pb_op, pa_16, pb_16))
                # one release per step: the step's first slot's barrier frees all its blocks (their values)
                mbarrier.arrive(kv_empty.index(prev_a + SPLIT * 2 * NS), count=1)
                acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
                l_acc = l_acc * gl.convert_layout(alpha, l_rows)[:, None]
                pa_op = gl.convert_layout(p_a.to(dtype), p_layout)
                pb_op = gl.convert_layout(p_b.to(dtype), p_layout)
                pa_16 = gl.convert_layout(p_a.to(gl.float16), p8_layout)
                pb_16 = gl.convert_layout(p_b.to(gl.float16), p8_layout)
                prev_a = slot_a
                prev_b = slot_b
                c += STEP
            o_tok, l_tok = _step_output(SPLIT, STEP, pa_op, pb_op, pa_16, pb_16, v_smem, ones_smem, kv_ready, prev_a,
                                        prev_b, c - STEP, acc, l_acc)
            acc, l_acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, l_tok, pa_op, pb_op, pa_16, pb_16))[:2]
            l_i = gl.convert_layout(gl.max(l_acc, axis=1), s_rows)
            mbarrier.arrive(kv_empty.index(prev_a + SPLIT * 2 * NS), count=1)
            # ---- epilogue: lse, then o, straight from registers
            l_ok = l_i > 0
            lse = gl.where(l_ok, (m_i * qk_scale_log2 + gl.log2(gl.where(l_ok, l_i, 1.0))) * 0.6931471805599453,
                           float("-inf"))
            gl.store(lse_ptr + b * stride_lb + h * stride_lh + rows * stride_ls, lse, mask=rows < S)
            inv = gl.convert_layout(1.0 / gl.where(l_ok, l_i, 1.0), o_rows)
            ptrs = o_ptr + b * stride_ob + h * stride_oh + o_r[:, None] * stride_os + o_d[None, :]
            gl.store(ptrs, (acc * inv[:, None]).to(o_ptr.dtype.element_ty), mask=(o_r < S)[:, None])
            it += 1

    @gluon.jit
    def rows_state(q_desc, qr_desc, k_desc, v_desc, kr_desc, STAGES: gl.constexpr):
        """A program's shared memory and barriers, initialised: per consumer its Q / Qpe buffer and
        ``STAGES`` ring slots of k, v and kpe; ``q_ready`` / ``q_empty`` per buffer and ``kv_ready`` /
        ``kv_empty`` twice per slot (the second half the values' own, used with ``SPLIT``)."""
        BN: gl.constexpr = k_desc.block_type.shape[1]
        D: gl.constexpr = k_desc.block_type.shape[3]
        P: gl.constexpr = kr_desc.block_type.shape[2]
        SP: gl.constexpr = q_desc.block_type.shape[1]
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, 1, SP, D], q_desc.layout)
        qr_smem = gl.allocate_shared_memory(dtype, [2, 1, SP, P], qr_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, 1, BN, 1, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, 1, BN, 1, D], v_desc.layout)
        kr_smem = gl.allocate_shared_memory(dtype, [2 * STAGES, 1, BN, P], kr_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [4 * STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [4 * STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
        for i in gl.static_range(4 * STAGES):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=1)
        return q_smem, qr_smem, k_smem, v_smem, kr_smem, q_ready, q_empty, kv_ready, kv_empty

    @gluon.jit
    def _window_rows(
        q_desc, qr_desc,        # TMA: [B*H, S, D], [B*H, S, P], boxes [1, ROWS, *]
        k_desc, v_desc,         # TMA: [B, N, H, D], boxes [1, BLOCK_N, 1, D]
        kr_desc,                # TMA: [B, N, P], boxes [1, BLOCK_N, P]
        o_ptr, lse_ptr, H, S, N, n_items, qk_scale_log2,
        stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
        STAGES: gl.constexpr, CAUSAL: gl.constexpr, STEP: gl.constexpr, SPLIT: gl.constexpr,
    ):
        """Grid ``(programs,)``: persistent over the ``B * H`` (sequence, head) items."""
        q_smem, qr_smem, k_smem, v_smem, kr_smem, q_ready, q_empty, kv_ready, kv_empty = rows_state(
            q_desc, qr_desc, k_desc, v_desc, kr_desc, STAGES)
        causal = gl.to_tensor(CAUSAL).to(gl.int32)
        BN: gl.constexpr = k_desc.block_type.shape[1]
        ones_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, 8], gl.float16)
        ones_smem = gl.allocate_shared_memory(gl.float16, [BN, 8], ones_layout)
        ones_smem.store(gl.full([BN, 8], 1.0, gl.float16, gl.BlockedLayout([1, 8], [32, 1], [4, 1], [1, 0])))
        fence_async_shared()
        strides = (stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls)
        args = (q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, v_smem, kr_smem,
                q_ready, q_empty, kv_ready, kv_empty, n_items, H, N, o_ptr, lse_ptr, S, qk_scale_log2, strides, causal)
        gl.warp_specialize([(_rows_consumer, (0, STEP, SPLIT) + args + (ones_smem,)),
                            (_rows_consumer, (1, STEP, SPLIT) + args + (ones_smem,)),
                            (rows_producer, (0, STEP, SPLIT) + args), (rows_producer, (1, STEP, SPLIT) + args)],
                           [4, 1, 1],
                           [_CONSUMER_REGS, _PRODUCER_REGS, _PRODUCER_REGS])

    #: the kernel's compiled launches, keyed by what it is specialised on
    _ROWS_LAUNCH = CachedLaunch(_window_rows)


# ---------------------------------------------------------------------------------------------
# host side


def rows_applies(q: torch.Tensor, qpe: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                 kpe_new: torch.Tensor, causal: bool, *, block_n: int = DEFAULT_BLOCK_N,
                 stages: int = DEFAULT_STAGES, step: int = DEFAULT_STEP) -> bool:
    """Whether :func:`window_rows_gluon` takes this call (see the module's limits)."""
    b, h, s, d = q.shape
    n, p = k_new.shape[1], qpe.shape[-1]
    return (GLUON_AVAILABLE and q.dtype in (torch.bfloat16, torch.float16) and 0 < s <= MAX_S and n > 0
            and (n >= s or not causal) and d % 64 == 0 and d <= 128 and p % 16 == 0 and 0 < p <= d
            and block_n in (32, 64) and stages >= 1 and step in STEPS and stages % step == 0
            and (step == 1 or block_n == 32)
            and smem_bytes(d, p, block_n, stages) + 1024 <= _SMEM_LIMIT
            and tma_compatible(k_new, v_new, kpe_new))


def window_rows_gluon(q: torch.Tensor, qpe: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                      kpe_new: torch.Tensor, *, scale: float, causal: bool = True, programs: int,
                      block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
                      step: int = DEFAULT_STEP, split: bool = False,
                      out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Expanded attention over a window of N keys for S <= 64 query tokens (query rows on the
    wgmma's M side), on ``programs`` persistent programs (sm_90).

    Parameters
    ----------
    q : [B, H, S, D], qpe : [B, H, S, P]     queries (bf16/fp16)
    k_new, v_new : [B, N, H, D]               the window's expanded keys and values
    kpe_new : [B, N, P]                       the window's RoPE keys (shared by the heads)
    scale : float                             softmax scale
    causal : bool                             query i sees window key j <= N - S + i
    programs : int                            persistent programs (at most one per SM runs)
    block_n : int                             keys per block, 32 or 64
    stages : int                              ring depth per consumer
    step : int                                ring blocks per softmax step, 1 or 2 (2: one running-max
                                              update and rescale per two blocks; ``stages`` a multiple of it)
    split : bool                              keys and values on their own barriers, the values loaded
                                              one step behind the keys and each freed as soon as read
                                              (for two blocks per step, where one barrier per slot
                                              holds all four slots of the ring; see the devlog)
    out : [B, H, S, D], optional              output buffer (any float dtype; written in place when its
                                              last stride is 1, else through a copy)

    Returns ``(o [B, H, S, D] in q's dtype or ``out``, lse [B, H, S] float32)``; inputs must
    satisfy :func:`rows_applies` (ValueError otherwise).
    """
    _base.require_gluon()
    if q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}: the Gluon kernel needs CUDA tensors on an sm_90 GPU")
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    b, h, s, d = q.shape
    n, p = k_new.shape[1], kpe_new.shape[-1]
    if qpe.shape != (b, h, s, p) or k_new.shape != (b, n, h, d) or v_new.shape != (b, n, h, d) \
            or kpe_new.shape != (b, n, p):
        raise ValueError(f"shapes do not agree: q {tuple(q.shape)}, qpe {tuple(qpe.shape)}, k_new "
                         f"{tuple(k_new.shape)}, v_new {tuple(v_new.shape)}, kpe_new {tuple(kpe_new.shape)}")
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    if not rows_applies(q, qpe, k_new, v_new, kpe_new, causal, block_n=block_n, stages=stages, step=step):
        raise ValueError("this call does not satisfy rows_applies (S, N, dtype, D/P, block, shared memory or TMA "
                         "strides)")
    scale = check_scale(scale)
    # the kernel stores o rows with unit stride along D: an ``out`` with another layout is written through a copy
    direct = out is None or out.stride(-1) == 1
    o = torch.empty((b, h, s, d), dtype=q.dtype if out is None else out.dtype, device=q.device) if not direct or \
        out is None else out
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    if b * h * s == 0:
        return (o if direct else out), lse
    q3 = _base.tma_operand(q).view(b * h, s, d)
    qr3 = _base.tma_operand(qpe).view(b * h, s, p)
    blocks = ([1, ROWS, d], [1, ROWS, p], [1, block_n, 1, d], [1, block_n, 1, d], [1, block_n, p])
    descs = tuple(_base.descriptor(x, blk) for x, blk in zip((q3, qr3, k_new, v_new, kpe_new), blocks))
    ints = (h, s, n, b * h)
    strides = (*o.stride()[:3], *lse.stride())
    # every constexpr and every class Triton specialises the integers and pointers on is in the key:
    # a kernel compiled for one must never serve a call of another
    key = (q.dtype, d, p, block_n, stages, bool(causal), step, bool(split), o.dtype,
           o.data_ptr() % 16, lse.data_ptr() % 16, int_classes(ints + strides))
    _ROWS_LAUNCH(key, (min(programs, b * h), 1, 1), (*descs, o, lse, *ints, scale * _base.LOG2E, *strides),
                 dict(STAGES=stages, CAUSAL=bool(causal), STEP=step, SPLIT=int(bool(split))), num_warps=4)
    if not direct:
        out.copy_(o)
        return out, lse
    return o, lse


def compile_for_sm90(*, d: int = 128, p: int = 64, block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
                     dtype: str = "bf16", causal: bool = True, step: int = DEFAULT_STEP, split: bool = False,
                     capability: int = 90):
    """Compile the kernel for sm_90 without a GPU; returns Triton's CompiledKernel.
    Must run in a process without ``TRITON_INTERPRET`` set."""
    def desc(block: list[int]) -> str:
        return _base.desc_type(block, dtype)

    signature = {
        "q_desc": desc([1, ROWS, d]), "qr_desc": desc([1, ROWS, p]),
        "k_desc": desc([1, block_n, 1, d]), "v_desc": desc([1, block_n, 1, d]), "kr_desc": desc([1, block_n, p]),
        "o_ptr": f"*{dtype}", "lse_ptr": "*fp32", "H": "i32", "S": "i32", "N": "i32", "n_items": "i32",
        "qk_scale_log2": "fp32", "stride_ob": "i32", "stride_oh": "i32", "stride_os": "i32",
        "stride_lb": "i32", "stride_lh": "i32", "stride_ls": "i32", "STAGES": "constexpr", "CAUSAL": "constexpr",
        "STEP": "constexpr", "SPLIT": "constexpr",
    }
    constexprs = {"STAGES": stages, "CAUSAL": causal, "STEP": step, "SPLIT": int(bool(split))}
    return _base.compile_sm90(_window_rows, signature, constexprs, num_warps=4, capability=capability)

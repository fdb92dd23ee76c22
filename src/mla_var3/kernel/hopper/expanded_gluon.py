"""Expanded attention on Hopper (sm_90): a warp-specialised Gluon kernel in the FlashAttention-3 style.

Same contract as :func:`mla_var3.kernel.expanded.flash_attention` (q/k head ``D + P`` with the
RoPE key ``kpe`` shared by all heads, v head ``D``), for dense caches (no ``seqlens``)::

    score[i, j] = (q[i] . k[j] + qpe[i] . kpe[j]) * scale
    o[i]        = sum_j softmax_j(score[i, :]) v[j]

Design
------
* **Program.** ``BLOCK_M = 128`` query rows of one (sequence, head), row blocks last-first (in
  causal prefill the longest programs start first). Three partitions (``gl.warp_specialize``):
  two *consumer* warpgroups, each owning 64 of the rows (its own ``[64, D]`` fp32 output in
  registers), and a one-warp *producer* that only issues TMA copies.
* **Producer.** Q and Qpe once (each consumer's 64 rows), then for every key block ``j`` the
  ``[BLOCK_N, D]`` k tile with its ``[BLOCK_N, P]`` kpe tile (one mbarrier) and the v tile (its
  own mbarrier) into a ring of ``NUM_STAGES`` buffers. k and v are freed separately: a k buffer
  as soon as both consumers' score MMAs have read it, a v buffer after both ``P . V`` MMAs.
* **Consumer** (software-pipelined as FA3's intra-warpgroup overlap): in iteration ``j`` it
  issues the score MMAs of block ``j`` (``Q . K^T`` then ``Qpe . Kpe^T`` into one accumulator),
  then ``P_{j-1} . V_{j-1}``; it waits for the scores only, so block ``j``'s softmax (exp2 on
  the scaled scores, running max and sum) runs while ``P_{j-1} . V_{j-1}`` is on the tensor
  cores, then waits for it and rescales the output. The causal / tail mask is applied only in
  blocks where some of this warpgroup's rows can see a masked key. The two consumers share the
  key ring but not a barrier, so one's softmax also runs under the other's MMAs.
* **Epilogue.** Each consumer normalises its rows, stages them in its own Q buffer (its last
  score MMA has retired) and stores them by TMA (rows past S are clipped); the LSE (natural
  log) is stored directly.

Shared memory (bf16, D = 128, P = 64, BLOCK_N = 128, 2 stages): Q + Qpe 48 KiB, per stage
k 32 + kpe 16 + v 32 KiB: 208 KiB, one program per SM.

Limits: ``D`` a multiple of 16 up to 256 (the output MMA's N), ``P`` a multiple of 16, the
shared memory above within the sm_90 limit, inputs TMA-addressable (unit last stride, 16-byte
aligned strides), no ``seqlens`` (keys past ``seqlens[b]`` would be read; a real cache may
hold non-finite values there).

Example
-------
>>> o, lse = flash_attention_gluon(q, qpe, k, v, kpe, scale=192 ** -0.5)   # doctest: +SKIP
"""

from __future__ import annotations

import torch

from mla_var3.kernel import backends
from mla_var3.kernel._common import SMEM_LIMIT as _SMEM_LIMIT, cdiv, check_scale
from mla_var3.kernel.expanded import flash_attention_portable, tma_compatible
from mla_var3.kernel.hopper import _gluon as _base
from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )

__all__ = ["BLOCK_M", "DEFAULT_BLOCK_N", "DEFAULT_STAGES", "GLUON_MIN_S", "smem_bytes", "gluon_applies",
           "compile_for_sm90", "flash_attention_gluon", "flash_attention_hopper"]

BLOCK_M = 128          # query rows per program: two consumer warpgroups of 64
HALF_M = 64            # rows per consumer warpgroup (one wgmma M tile)
DEFAULT_BLOCK_N = 128  # keys per block
DEFAULT_STAGES = 2     # key-ring depth
DEFAULT_PINGPONG = False  # consumers alternate their MMA issue (see flash_attention_gluon)
_CONSUMER_REGS = gl.constexpr(224) if GLUON_AVAILABLE else 224  # setmaxnreg of the worker consumer warpgroup
_PRODUCER_REGS = gl.constexpr(24) if GLUON_AVAILABLE else 24     # setmaxnreg of the producer warp


def smem_bytes(d: int, p: int, block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
               elem_bytes: int = 2) -> int:
    """Shared memory of one program: the Q / Qpe tiles once and ``stages`` k, kpe, v buffers
    (the mbarriers add < 100 bytes)."""
    return (BLOCK_M * (d + p) + stages * block_n * (2 * d + p)) * elem_bytes


if GLUON_AVAILABLE:

    @gluon.jit
    def _producer(q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, kr_smem, v_smem,
                  q_bar, k_ready, v_ready, k_empty, v_empty, bh, b, h, m0, n_blocks, causal):
        """The TMA warp: Q / Qpe of both consumers, then k + kpe and v of every key block."""
        NS: gl.constexpr = k_smem.shape[0]
        BN: gl.constexpr = k_smem.shape[2]
        HM: gl.constexpr = q_smem.shape[2]
        mbarrier.expect(q_bar, 2 * (q_desc.block_type.nbytes + qr_desc.block_type.nbytes))
        for w in gl.static_range(2):
            tma.async_copy_global_to_shared(q_desc, [bh, m0 + w * HM, 0], q_bar, q_smem.index(w))
            tma.async_copy_global_to_shared(qr_desc, [bh, m0 + w * HM, 0], q_bar, qr_smem.index(w))
        for j in range(n_blocks):
            st = j % NS
            ph = ((j // NS) & 1) ^ 1
            key0 = j * BN
            mbarrier.wait(k_empty.index(st), ph, pred=j >= NS)
            bar = k_ready.index(st)
            mbarrier.expect(bar, k_desc.block_type.nbytes + kr_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, key0, h, 0], bar, k_smem.index(st))
            tma.async_copy_global_to_shared(kr_desc, [b, key0, 0], bar, kr_smem.index(st))
            mbarrier.wait(v_empty.index(st), ph, pred=j >= NS)
            bar = v_ready.index(st)
            mbarrier.expect(bar, v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [b, key0, h, 0], bar, v_smem.index(st))

    @gluon.jit
    def _scores(q_tile, qr_tile, k_smem, kr_smem, st, s_zero):
        """Issue ``Q . K^T + Qpe . Kpe^T`` of ring slot ``st`` (async; returns the token)."""
        BN: gl.constexpr = k_smem.shape[2]
        D: gl.constexpr = k_smem.shape[4]
        P: gl.constexpr = kr_smem.shape[3]
        k_tile = k_smem.index(st).reshape([BN, D])
        kr_tile = kr_smem.index(st).reshape([BN, P])
        tok = warpgroup_mma(q_tile, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        return warpgroup_mma(qr_tile, kr_tile.permute((1, 0)), tok, is_async=True)

    @gluon.jit
    def _softmax(raw, m_i, j, full_keys, limit, cols, qk_scale_log2, BN: gl.constexpr):
        """Scaled, masked (only where some row of the warpgroup sees a masked key) scores of
        block ``j``; returns ``(p, m_new, alpha)`` with ``p = exp2(score - m_new)`` in fp32."""
        sc = raw * qk_scale_log2
        if (j + 1) * BN > full_keys:
            keys = j * BN + cols
            sc = gl.where(keys[None, :] <= limit[:, None], sc, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(sc - m_safe[:, None])
        alpha = gl.exp2(m_i - m_safe)
        return p, m_new, alpha

    @gluon.jit
    def _consumer(WG: gl.constexpr, q_smem, qr_smem, k_smem, kr_smem, v_smem,
                  q_bar, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse_ptr,
                  bh, m0, n_blocks, S, L, qk_scale_log2, stride_lbh, stride_ls, causal, pingpong):
        """Consumer warpgroup ``WG``: rows ``m0 + 64 WG ..`` of the program (see the module docstring)."""
        NS: gl.constexpr = k_smem.shape[0]
        BN: gl.constexpr = k_smem.shape[2]
        D: gl.constexpr = k_smem.shape[4]
        P: gl.constexpr = kr_smem.shape[3]
        HM: gl.constexpr = q_smem.shape[2]
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BN, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

        q_tile = q_smem.index(WG).reshape([HM, D])
        qr_tile = qr_smem.index(WG).reshape([HM, P])
        r0 = m0 + WG * HM
        rows = r0 + gl.arange(0, HM, layout=s_rows)
        cols = gl.arange(0, BN, layout=s_cols)
        # last key each row sees (rows past S are clipped at the store; keys past L never count)
        limit = gl.minimum(gl.where(causal != 0, L - S + rows, L - 1), L - 1)
        # keys [0, full_keys) are seen by every row of this warpgroup: no mask there
        full_keys = gl.minimum(gl.where(causal != 0, L - S + r0 + 1, L), L)
        s_zero = gl.zeros([HM, BN], gl.float32, s_layout)

        my_turn = turn.index(WG)
        other_turn = turn.index(1 - WG)
        alternate = pingpong != 0
        mbarrier.wait(q_bar, 0)
        # block 0: scores and softmax; its P . V is issued in the next iteration
        mbarrier.wait(k_ready.index(0), 0)
        mbarrier.wait(my_turn, 0, pred=alternate)
        tok = _scores(q_tile, qr_tile, k_smem, kr_smem, 0, s_zero)
        mbarrier.arrive(other_turn, count=1, pred=alternate)
        raw = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        mbarrier.arrive(k_empty.index(0), count=1)
        m_i = gl.full([HM], float("-inf"), gl.float32, s_rows)
        p, m_i, alpha = _softmax(raw, m_i, 0, full_keys, limit, cols, qk_scale_log2, BN)
        l_i = gl.sum(p, axis=1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = gl.zeros([HM, D], gl.float32, o_layout)
        for j in range(1, n_blocks):
            st = j % NS
            pst = (j - 1) % NS
            mbarrier.wait(k_ready.index(st), (j // NS) & 1)
            mbarrier.wait(v_ready.index(pst), ((j - 1) // NS) & 1)
            mbarrier.wait(my_turn, j & 1, pred=alternate)
            s_tok = _scores(q_tile, qr_tile, k_smem, kr_smem, st, s_zero)
            v_tile = v_smem.index(pst).reshape([BN, D])
            o_tok = warpgroup_mma(p_op, v_tile, acc, is_async=True)
            mbarrier.arrive(other_turn, count=1, pred=alternate)
            raw = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(st), count=1)
            p, m_i, alpha = _softmax(raw, m_i, j, full_keys, limit, cols, qk_scale_log2, BN)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            mbarrier.arrive(v_empty.index(pst), count=1)
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
        last = (n_blocks - 1) % NS
        mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // NS) & 1)
        mbarrier.wait(my_turn, n_blocks & 1, pred=alternate)
        o_tok = warpgroup_mma(p_op, v_smem.index(last).reshape([BN, D]), acc, is_async=True)
        mbarrier.arrive(other_turn, count=1, pred=alternate)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
        mbarrier.arrive(v_empty.index(last), count=1)

        # ---- epilogue: lse, then o through this warpgroup's Q buffer (its score MMAs are done)
        l_ok = l_i > 0
        lse = gl.where(l_ok, (m_i + gl.log2(gl.where(l_ok, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        gl.store(lse_ptr + bh * stride_lbh + rows * stride_ls, lse, mask=rows < S)
        inv_l = gl.convert_layout(1.0 / gl.where(l_ok, l_i, 1.0), o_rows)
        o_smem = q_smem.index(WG)
        o_smem.reshape([HM, D]).store((acc * inv_l[:, None]).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [bh, r0, 0], o_smem)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _consumer0(q_smem, qr_smem, k_smem, kr_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                   turn, o_desc, lse_ptr, bh, m0, n_blocks, S, L, qk_scale_log2, stride_lbh, stride_ls, causal,
                   pingpong):
        _consumer(0, q_smem, qr_smem, k_smem, kr_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                  turn, o_desc, lse_ptr, bh, m0, n_blocks, S, L, qk_scale_log2, stride_lbh, stride_ls, causal,
                  pingpong)

    @gluon.jit
    def _consumer1(q_smem, qr_smem, k_smem, kr_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                   turn, o_desc, lse_ptr, bh, m0, n_blocks, S, L, qk_scale_log2, stride_lbh, stride_ls, causal,
                   pingpong):
        _consumer(1, q_smem, qr_smem, k_smem, kr_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                  turn, o_desc, lse_ptr, bh, m0, n_blocks, S, L, qk_scale_log2, stride_lbh, stride_ls, causal,
                  pingpong)

    @gluon.jit
    def _flash_attention_ws(
        q_desc, qr_desc,            # TMA: [B*H, S, D], [B*H, S, P], boxes of 64 rows
        k_desc, v_desc,             # TMA: [B, T, H, D], boxes [1, BLOCK_N, 1, D]
        kr_desc,                    # TMA: [B, T, P], boxes [1, BLOCK_N, P]
        o_desc,                     # TMA: [B*H, S, D], boxes of 64 rows
        lse_ptr, H, S, T, qk_scale_log2, stride_lbh, stride_ls,
        NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
    ):
        """Grid ``(cdiv(S, 128), B * H)``: one program per 128 query rows of one (sequence, head)."""
        BN: gl.constexpr = k_desc.block_type.shape[1]
        D: gl.constexpr = k_desc.block_type.shape[3]
        P: gl.constexpr = kr_desc.block_type.shape[2]
        HM: gl.constexpr = q_desc.block_type.shape[1]
        dtype: gl.constexpr = q_desc.dtype
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        m0 = pid_m * (2 * HM)
        L = T
        if CAUSAL:
            hi = gl.minimum(L - S + m0 + 2 * HM, L)
        else:
            hi = L
        n_blocks = gl.cdiv(hi, BN)

        q_smem = gl.allocate_shared_memory(dtype, [2, 1, HM, D], q_desc.layout)
        qr_smem = gl.allocate_shared_memory(dtype, [2, 1, HM, P], qr_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BN, 1, D], k_desc.layout)
        kr_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BN, P], kr_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BN, 1, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_empty.index(i), count=2)
        # with PINGPONG the consumers take turns issuing their MMAs, consumer 0 first
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        mbarrier.arrive(turn.index(0), count=1, pred=PINGPONG)

        causal = gl.to_tensor(CAUSAL).to(gl.int32)
        pingpong = gl.to_tensor(PINGPONG).to(gl.int32)
        c_args = (q_smem, qr_smem, k_smem, kr_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                  turn, o_desc, lse_ptr, bh, m0, n_blocks, S, L, qk_scale_log2, stride_lbh, stride_ls, causal,
                  pingpong)
        p_args = (q_desc, qr_desc, k_desc, v_desc, kr_desc, q_smem, qr_smem, k_smem, kr_smem, v_smem,
                  q_bar, k_ready, v_ready, k_empty, v_empty, bh, b, h, m0, n_blocks, causal)
        gl.warp_specialize([(_consumer0, c_args), (_consumer1, c_args), (_producer, p_args)], [4, 1],
                           [_CONSUMER_REGS, _PRODUCER_REGS])


# ---------------------------------------------------------------------------------------------
# host side


def gluon_applies(q: torch.Tensor, qpe: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kpe: torch.Tensor,
                  seqlens=None, *, block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES) -> bool:
    """Whether :func:`flash_attention_gluon` can take this call: Gluon present, bf16/fp16, ``D``
    and ``P`` multiples of 16 with ``D <= 256``, the shared memory within the sm_90 limit,
    k / v / kpe TMA-addressable in place, and no ``seqlens``."""
    d, p = q.shape[-1], qpe.shape[-1]
    return (GLUON_AVAILABLE and q.dtype in (torch.bfloat16, torch.float16) and seqlens is None
            and d % 16 == 0 and 16 <= d <= 256 and p % 16 == 0 and 16 <= p <= 256
            and smem_bytes(d, p, block_n, stages) + 1024 <= _SMEM_LIMIT
            and tma_compatible(k, v, kpe))


def flash_attention_gluon(q: torch.Tensor, qpe: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kpe: torch.Tensor,
                          *, scale: float, causal: bool = True, out: torch.Tensor | None = None,
                          block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
                          pingpong: bool = DEFAULT_PINGPONG) -> tuple[torch.Tensor, torch.Tensor]:
    """Expanded attention with a shared RoPE key, warp-specialised Gluon kernel (sm_90).

    Parameters
    ----------
    q : [B, H, S, D] bf16/fp16    no-RoPE query
    qpe : [B, H, S, P]            RoPE query
    k, v : [B, T, H, D]           expanded keys and values (T includes the S new tokens)
    kpe : [B, T, P]               RoPE key, one per token, shared by all heads
    scale : float                 softmax scale
    causal : bool                 query i sees keys j <= T - S + i
    out : [B, H, S, D], optional  output buffer in q's dtype (any strides)
    block_n, stages : int         keys per block and key-ring depth
    pingpong : bool               the consumers take turns issuing their MMAs (FA3's inter-
                                  warpgroup schedule); without it they run freely

    Inputs must satisfy :func:`gluon_applies` (checked; ValueError otherwise).

    Returns
    -------
    o : [B, H, S, D] in q's dtype;  lse : [B, H, S] float32 (natural log)
    """
    _base.require_gluon()
    if q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}: the Gluon kernel needs CUDA tensors on an sm_90 GPU")
    b, h, s, d = q.shape
    t, p = k.shape[1], kpe.shape[-1]
    if qpe.shape != (b, h, s, p) or k.shape != (b, t, h, d) or v.shape != (b, t, h, d) or kpe.shape != (b, t, p):
        raise ValueError(f"shapes do not agree: q {tuple(q.shape)}, qpe {tuple(qpe.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, kpe {tuple(kpe.shape)}")
    if s > t:
        raise ValueError(f"S = {s} new tokens cannot exceed T = {t} keys")
    if block_n not in (64, 128) or stages < 2:
        raise ValueError(f"block_n must be 64 or 128 and stages >= 2, got {block_n}, {stages}")
    if not gluon_applies(q, qpe, k, v, kpe, block_n=block_n, stages=stages):
        raise ValueError("this call does not satisfy gluon_applies (dtype, D/P, shared memory or TMA strides)")
    scale = check_scale(scale)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    direct = out is not None and out.is_contiguous() and tma_compatible(out)
    o = out if direct else torch.empty((b, h, s, d), dtype=q.dtype, device=q.device)
    if b * h * s == 0:
        return (o if out is None else out), lse

    q3 = _base.tma_operand(q).view(b * h, s, d)
    qr3 = _base.tma_operand(qpe).view(b * h, s, p)
    descs = (
        _base.descriptor(q3, [1, HALF_M, d]), _base.descriptor(qr3, [1, HALF_M, p]),
        _base.descriptor(k, [1, block_n, 1, d]), _base.descriptor(v, [1, block_n, 1, d]),
        _base.descriptor(kpe, [1, block_n, p]), _base.descriptor(o.view(b * h, s, d), [1, HALF_M, d]),
    )
    grid = (cdiv(s, BLOCK_M), b * h)
    _flash_attention_ws[grid](
        *descs, lse, h, s, t, scale * _base.LOG2E, lse.stride(1), lse.stride(2),
        NUM_STAGES=stages, CAUSAL=bool(causal), PINGPONG=bool(pingpong), num_warps=4,
    )
    if out is not None and not direct:
        out.copy_(o)
        o = out
    return o, lse


#: the Hopper kernel takes calls with more query rows than this (a program owns 128 rows; at
#: s <= 64 the portable kernel streams the keys at the copy bandwidth with 16-64-row tiles)
GLUON_MIN_S = 64


def flash_attention_hopper(q, qpe, k, v, kpe, *, scale, causal, seqlens, config, out):
    """The sm_90 backend of :func:`mla_var3.kernel.expanded.flash_attention`: the
    warp-specialised Gluon kernel for ``S > GLUON_MIN_S`` without ``seqlens`` or a portable
    ``config`` where its TMA loads apply, else the portable kernel."""
    if config is None and q.shape[2] > GLUON_MIN_S and gluon_applies(q, qpe, k, v, kpe, seqlens):
        return flash_attention_gluon(q, qpe, k, v, kpe, scale=scale, causal=causal, out=out)
    return flash_attention_portable(q, qpe, k, v, kpe, scale=scale, causal=causal, seqlens=seqlens, config=config,
                                   out=out)


backends.register("flash_attention", "gluon", flash_attention_hopper, supports=backends.gluon_hopper, priority=10)


def compile_for_sm90(*, d: int = 128, p: int = 64, block_n: int = DEFAULT_BLOCK_N, stages: int = DEFAULT_STAGES,
                     dtype: str = "bf16", causal: bool = True, pingpong: bool = DEFAULT_PINGPONG,
                     capability: int = 90):
    """Compile the kernel for sm_90 without a GPU; returns Triton's CompiledKernel.
    Must run in a process without ``TRITON_INTERPRET`` set."""
    def desc(block: list[int]) -> str:
        return _base.desc_type(block, dtype)

    signature = {
        "q_desc": desc([1, HALF_M, d]), "qr_desc": desc([1, HALF_M, p]),
        "k_desc": desc([1, block_n, 1, d]), "v_desc": desc([1, block_n, 1, d]), "kr_desc": desc([1, block_n, p]),
        "o_desc": desc([1, HALF_M, d]),
        "lse_ptr": "*fp32", "H": "i32", "S": "i32", "T": "i32", "qk_scale_log2": "fp32",
        "stride_lbh": "i32", "stride_ls": "i32", "NUM_STAGES": "constexpr", "CAUSAL": "constexpr",
        "PINGPONG": "constexpr",
    }
    return _base.compile_sm90(_flash_attention_ws, signature,
                              {"NUM_STAGES": stages, "CAUSAL": causal, "PINGPONG": pingpong},
                              num_warps=4, capability=capability)

"""Absorbed (FlashMLA-style) attention on Hopper (sm_90), written in Gluon.

Same contract as :func:`mla_var3.kernel.absorbed.flash_mla` (dense latent cache), with
explicit layouts, TMA and asynchronous warpgroup MMA (wgmma) instead of the compiler's choices.

Design (no warp specialisation)
-------------------------------
* **Rows.** A program (CTA, 8 warps = 2 warpgroups) owns ``BLOCK_M = 64`` rows of one sequence,
  ordered head-major: ``row = head * S + token`` — exactly ``qc.view(B, H*S, K)``, so the query
  block is one TMA box. Rows past ``H*S`` are zero-filled by TMA and never stored.
* **Keys.** The program streams 64-key blocks of ``Z`` (``[64, K]``) and ``kpe`` (``[64, P]``)
  through a 2-stage ring in shared memory, each stage filled by TMA and signalled by an
  mbarrier. Keys past ``T`` are zero-filled by TMA (3-D descriptors ``[B, T, *]``).
* **Scores** ``S = Qc . Z^T + Qpe . kpe^T`` ([64, 64], K + P = 576 deep): two async wgmma from
  shared memory (operand B is the key block viewed transposed). Warps ``[4, 2]``: each
  warpgroup computes 32 of the 64 key columns — no duplicated tensor work.
* **Online softmax** in the log2 domain (``scale * log2 e`` folded into one multiply), causal
  and length mask per row: token ``i`` of a sequence with ``L`` keys sees ``j <= L - S + i``.
* **Output** ``O += P . Z`` ([64, 512] fp32, K = 64 keys deep): P goes to registers in the
  wgmma operand layout, ``Z`` is the same shared-memory stage that fed the scores. Each
  warpgroup holds 64 x 256 of the accumulator (128 registers per thread).
* **Schedule** (constexpr ``PIPELINE``). Sequential: per key block, wait for the stage, scores,
  softmax, ``P . Z``, barrier, refill the stage. Pipelined: the scores of block ``j + 1`` are
  issued as soon as ``P . Z`` of block ``j`` is issued, so the tensor pipe runs the two back to
  back while the warps wait, synchronise and issue the refill; the scores of block 0 are
  computed before the loop (the score MMA appears twice in the code).
* **Split-KV.** When ``B * ceil(H*S / 64)`` programs fill at most half the SMs, each sequence's
  key blocks are cut into ``num_splits`` ranges (aiming at two waves); each range writes its
  normalised fp32 partial output and LSE, and :func:`mla_var3.kernel.combine.combine` merges them.
* **Ragged batches** (constexpr ``ZERO_TAIL``, with ``seqlens``). Keys ``L ..`` of the last,
  partial key block of a sequence are read by TMA like any other; their scores are masked to
  ``-inf``, and their ``Z`` rows are zeroed in shared memory before ``P . Z`` (one extra pass
  over one 64 x K tile per sequence), so non-finite values stored past ``seqlens[b]`` never reach
  the output.

Shared memory: Q 64 x 576 + 2 stages x 64 x 576 (bf16) = 216 KiB, plus compiler scratch for
the P layout change — just under the 227 KiB per CTA, so one CTA per SM.

Limits: ``K`` a multiple of 64 and ``P`` a multiple of 16 with ``3 * 64 * (K + P) * 2`` bytes
within shared memory (DeepSeek 512 + 64 fits); ``K`` rows of ``Z`` must be 16-byte aligned.
Keys between ``seqlens[b]`` and ``T`` are read and masked; with ``zero_tail=False`` they must
be finite, because ``0 * NaN`` would reach the output.

Example
-------
>>> o_latent, lse = flash_mla_gluon(qc, qpe, z, kpe, scale=192 ** -0.5)   # doctest: +SKIP
"""

from __future__ import annotations

import torch

from mla_var3.kernel import backends
from mla_var3.kernel._common import SMEM_LIMIT as _SMEM_LIMIT, bind_shape, cdiv, check_scale, check_seqlens, num_sms
from mla_var3.kernel.absorbed import flash_mla_paged_portable, flash_mla_portable, gluon_applies
from mla_var3.kernel.combine import combine
from mla_var3.kernel.decode import AbsorbedDecode
from mla_var3.kernel.hopper import seesaw_host as seesaw

from mla_var3.kernel.hopper._gluon import (
    GLUON_AVAILABLE, GLUON_IMPORT_ERROR, LOG2E as _LOG2E, TORCH_TO_GL as _TORCH_TO_GL, compile_sm90 as _compile_sm90,
    desc_type as _desc_type, descriptor as _descriptor, tma_operand as _tma_operand,
)

if GLUON_AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
    )

__all__ = ["GLUON_AVAILABLE", "GLUON_IMPORT_ERROR", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "SCHEDULES", "DEFAULT_SCHEDULE",
           "ZERO_TAIL_DEFAULT", "choose_num_splits", "compile_for_sm90", "flash_mla_gluon"]

BLOCK_M = 64          # rows (head x token) per program: one wgmma M tile
BLOCK_N = 64          # keys per block
NUM_STAGES = 2        # key-block ring depth
NUM_WARPS = 8         # two warpgroups
ZERO_TAIL_DEFAULT = True  # with seqlens: zero keys past seqlens[b] in the last block (NaN-robust)
#: "sequential" and "pipelined" are this module's kernel (``PIPELINE`` constexpr); "seesaw" is the
#: warp-specialised kernel of :mod:`mla_var3.kernel.hopper.absorbed_seesaw`, taken where
#: ``seesaw_applies`` (K == 512, P == 64, rows TMA can address; ragged too); other calls run the
#: pipelined schedule.
#: Measured on an H200 (b in {32, 64}, s = 1..32, t = 4096): seesaw 0.84-0.94x FlashMLA, pipelined
#: 0.68-0.79x, sequential 0.64-0.70x; the seesaw is also the fastest at every small-batch point.
SCHEDULES = ("sequential", "pipelined", "seesaw")
DEFAULT_SCHEDULE = "seesaw"


if GLUON_AVAILABLE:
    @gluon.jit
    def _zero_rows_from(z_tile, n_valid, BN: gl.constexpr, K: gl.constexpr, NW: gl.constexpr):
        """Zero rows ``n_valid ..`` of a ``[BN, K]`` key tile in shared memory (64 columns at a time,
        8 registers per thread), then make the stores visible to the tensor cores."""
        zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        r = gl.arange(0, BN, layout=gl.SliceLayout(1, zl))
        keep = (r < n_valid)[:, None]
        for c in gl.static_range(K // 64):
            chunk = z_tile.slice(c * 64, 64, dim=1)
            x = chunk.load(zl)
            chunk.store(gl.where(keep, x, gl.zeros_like(x)))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _flash_mla_fwd(
        q_desc, qr_desc, z_desc, kr_desc,        # TMA: [B, H*S, K], [B, H*S, P], [B, T, K], [B, T, P]
        o_desc,                                   # TMA: [B, H*S, NS*K] (fp32 if SPLIT, else the input dtype)
        lse_ptr, seqlens_ptr,
        HS, S, T, qk_scale_log2, blocks_per_split,
        stride_lb, stride_lr, stride_ls,          # lse: [B, H*S, (NS)]
        K: gl.constexpr, P: gl.constexpr,
        CAUSAL: gl.constexpr, HAS_SEQLENS: gl.constexpr, SPLIT: gl.constexpr, PIPELINE: gl.constexpr,
        ZERO_TAIL: gl.constexpr,
    ):
        """One program: 64 rows of sequence ``program_id(2)``, key blocks of split ``program_id(1)``.

        Reads 64*(K+P) query elements once and n*64*(K+P) key elements (n key blocks); writes
        64*K outputs (+ 64 LSE). 2*64*64*(2K+P) FLOPs per key block.
        """
        BM: gl.constexpr = 64
        BN: gl.constexpr = 64
        STAGES: gl.constexpr = 2
        dtype: gl.constexpr = q_desc.dtype

        # wgmma accumulators: warps [4, 2] -> each warpgroup owns half of the columns
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 32, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, K // 2, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
        s_cols: gl.constexpr = gl.SliceLayout(0, s_layout)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)

        pid_m = gl.program_id(0)
        pid_s = gl.program_id(1)
        pid_b = gl.program_id(2)
        row0 = pid_m * BM

        if HAS_SEQLENS:
            L = gl.load(seqlens_ptr + pid_b)
        else:
            L = T
        blk_lo = pid_s * blocks_per_split
        blk_hi = gl.minimum(blk_lo + blocks_per_split, gl.cdiv(L, BN))
        n_iter = gl.maximum(blk_hi - blk_lo, 0)

        # ---- shared memory: Q (latent + rope), the key ring, barriers
        q_smem = gl.allocate_shared_memory(dtype, [1, BM, K], q_desc.layout)
        qr_smem = gl.allocate_shared_memory(dtype, [1, BM, P], qr_desc.layout)
        z_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BN, K], z_desc.layout)
        kr_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BN, P], kr_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i0 in gl.static_range(STAGES):
            mbarrier.init(ready.index(i0), count=1)

        # ---- issue the query load and the first STAGES key blocks
        mbarrier.expect(q_bar, q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [pid_b, row0, 0], q_bar, q_smem)
        tma.async_copy_global_to_shared(qr_desc, [pid_b, row0, 0], q_bar, qr_smem)
        kv_bytes: gl.constexpr = z_desc.block_type.nbytes + kr_desc.block_type.nbytes
        for i1 in gl.static_range(STAGES):
            pred1 = i1 < n_iter
            key1 = (blk_lo + i1) * BN
            mbarrier.expect(ready.index(i1), kv_bytes, pred=pred1)
            tma.async_copy_global_to_shared(z_desc, [pid_b, key1, 0], ready.index(i1), z_smem.index(i1), pred=pred1)
            tma.async_copy_global_to_shared(kr_desc, [pid_b, key1, 0], ready.index(i1), kr_smem.index(i1), pred=pred1)

        q_tile = q_smem.reshape([BM, K])      # the TMA box [1, 64, K] seen as the [64, K] MMA operand
        qr_tile = qr_smem.reshape([BM, P])

        # per-row state; row r is (head r // S, token r % S); token i sees keys j <= L - S + i
        rows = row0 + gl.arange(0, BM, layout=s_rows)
        if CAUSAL:
            limit = L - S + rows % S
        else:
            limit = gl.full([BM], 0, gl.int32, s_rows) + (L - 1)
        m_i = gl.full([BM], float("-inf"), gl.float32, s_rows)
        l_i = gl.full([BM], 0.0, gl.float32, s_rows)
        acc = gl.zeros([BM, K], gl.float32, o_layout)
        s_zero = gl.zeros([BM, BN], gl.float32, s_layout)
        cols = gl.arange(0, BN, layout=s_cols)

        mbarrier.wait(q_bar, 0)
        if PIPELINE:
            # scores of block 0 up front; inside the loop the scores of block it + 1 are issued right
            # behind P.Z of block it, so the tensor pipe runs both back to back while the barrier
            # and the refill of block it's stage are issued
            mbarrier.wait(ready.index(0), 0, pred=n_iter > 0)
            if ZERO_TAIL:  # keys L.. of the last, partial block: zero (finite) for P.Z
                if (n_iter > 0) & ((blk_lo + 1) * BN > L):
                    _zero_rows_from(z_smem.index(0).reshape([BN, K]), L - blk_lo * BN, BN, K, gl.num_warps())
            s_tok0 = warpgroup_mma(q_tile, z_smem.index(0).reshape([BN, K]).permute((1, 0)), s_zero,
                                   use_acc=False, is_async=True)
            s_tok0 = warpgroup_mma(qr_tile, kr_smem.index(0).reshape([BN, P]).permute((1, 0)), s_tok0,
                                   is_async=True)
            scores_raw = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok0,))
            for it in range(n_iter):
                st = it % STAGES
                z_tile = z_smem.index(st).reshape([BN, K])

                keys = (blk_lo + it) * BN + cols
                visible = keys[None, :] <= limit[:, None]
                scores = gl.where(visible, scores_raw * qk_scale_log2, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(scores, axis=1))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = gl.exp2(m_i - m_safe)
                p = gl.exp2(scores - m_safe[:, None])
                m_i = m_new

                alpha_o = gl.convert_layout(alpha, o_rows)
                acc = acc * alpha_o[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                # the row sum of the fp32 P, as the unpipelined loop and FlashMLA take it (the sum of
                # the bf16-rounded MMA operand put the LSE 2.1e-4 off at 80 rows, measured on an H200)
                l_i = l_i * alpha + gl.sum(p, axis=1)
                o_tok = warpgroup_mma(p_op, z_tile, acc, is_async=True)
                if it + 1 < n_iter:
                    st1 = (it + 1) % STAGES
                    mbarrier.wait(ready.index(st1), ((it + 1) // STAGES) & 1)
                    if ZERO_TAIL:  # P.Z of block it reads the other stage: this one is free to patch
                        if (blk_lo + it + 2) * BN > L:
                            _zero_rows_from(z_smem.index(st1).reshape([BN, K]), L - (blk_lo + it + 1) * BN,
                                            BN, K, gl.num_warps())
                    s_tok = warpgroup_mma(q_tile, z_smem.index(st1).reshape([BN, K]).permute((1, 0)), s_zero,
                                          use_acc=False, is_async=True)
                    s_tok = warpgroup_mma(qr_tile, kr_smem.index(st1).reshape([BN, P]).permute((1, 0)), s_tok,
                                          is_async=True)
                    # wgmma groups retire in order: <= 2 outstanding means P.Z of block it is done
                    acc, p_op = warpgroup_mma_wait(num_outstanding=2, deps=(o_tok, p_op))
                    gl.thread_barrier()
                    nxt = it + STAGES
                    pred = nxt < n_iter
                    key0 = (blk_lo + nxt) * BN
                    mbarrier.expect(ready.index(st), kv_bytes, pred=pred)
                    tma.async_copy_global_to_shared(z_desc, [pid_b, key0, 0], ready.index(st), z_smem.index(st),
                                                    pred=pred)
                    tma.async_copy_global_to_shared(kr_desc, [pid_b, key0, 0], ready.index(st),
                                                    kr_smem.index(st), pred=pred)
                    scores_raw = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
                else:
                    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                    scores_raw = s_zero
        else:
            for it in range(n_iter):
                st = it % STAGES
                mbarrier.wait(ready.index(st), (it // STAGES) & 1)
                z_tile = z_smem.index(st).reshape([BN, K])
                kr_tile = kr_smem.index(st).reshape([BN, P])
                if ZERO_TAIL:  # keys L.. of the last, partial block: zero (finite) for P.Z
                    if (blk_lo + it + 1) * BN > L:
                        _zero_rows_from(z_tile, L - (blk_lo + it) * BN, BN, K, gl.num_warps())

                # S = Qc . Z^T + Qpe . kpe^T  (64 x 64, K + P deep)
                s_tok = warpgroup_mma(q_tile, z_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                s_tok = warpgroup_mma(qr_tile, kr_tile.permute((1, 0)), s_tok, is_async=True)
                scores = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))

                keys = (blk_lo + it) * BN + cols
                visible = keys[None, :] <= limit[:, None]
                scores = gl.where(visible, scores * qk_scale_log2, float("-inf"))

                # online softmax (log2 domain); rows with no visible key so far keep m = -inf, p = 0
                m_new = gl.maximum(m_i, gl.max(scores, axis=1))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = gl.exp2(m_i - m_safe)
                p = gl.exp2(scores - m_safe[:, None])
                l_i = l_i * alpha + gl.sum(p, axis=1)
                m_i = m_new

                # O = alpha * O + P . Z
                acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                o_tok = warpgroup_mma(p_op, z_tile, acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))

                # both warpgroups are done with this stage: refill it with block it + STAGES
                gl.thread_barrier()
                nxt = it + STAGES
                pred = nxt < n_iter
                key0 = (blk_lo + nxt) * BN
                mbarrier.expect(ready.index(st), kv_bytes, pred=pred)
                tma.async_copy_global_to_shared(z_desc, [pid_b, key0, 0], ready.index(st), z_smem.index(st),
                                                pred=pred)
                tma.async_copy_global_to_shared(kr_desc, [pid_b, key0, 0], ready.index(st), kr_smem.index(st),
                                                pred=pred)

        mbarrier.invalidate(q_bar)
        for i2 in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i2))

        # ---- epilogue: normalise; o goes registers -> shared (the free key ring) -> TMA store
        l_ok = l_i > 0
        lse = gl.where(l_ok, (m_i + gl.log2(gl.where(l_ok, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        inv_l = gl.convert_layout(1.0 / gl.where(l_ok, l_i, 1.0), o_rows)
        out = acc * inv_l[:, None]
        # the ring holds STAGES * 64 * K * 2 bytes >= 64 * K * 4: room for the fp32 tile too
        o_smem = z_smem._reinterpret(o_desc.dtype, [1, BM, K], o_desc.layout)
        o_smem.reshape([BM, K]).store(out.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [pid_b, row0, pid_s * K], o_smem)  # rows >= HS are clipped
        gl.store(lse_ptr + pid_b * stride_lb + rows * stride_lr + pid_s * stride_ls, lse, mask=rows < HS)
        tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------------------------
# host side


def _smem_bytes(k: int, p: int, elem_bytes: int = 2) -> int:
    """Explicit shared memory of one program: Q + NUM_STAGES key stages + the P tile scratch."""
    return (1 + NUM_STAGES) * BLOCK_M * (k + p) * elem_bytes + BLOCK_M * BLOCK_N * elem_bytes


def choose_num_splits(b: int, rows: int, t: int, *, sms: int, min_blocks_per_split: int = 4,
                      max_splits: int = 64, waves: int = 1) -> int:
    """Split-KV count for ``b`` sequences of ``rows = h * s`` rows and ``t`` keys on ``sms`` SMs.

    One program runs per SM (shared memory). With ``b * ceil(rows / 64)`` programs filling at most
    half a wave, the keys are cut into the most ranges that still fit in ``waves`` waves, each at
    least ``min_blocks_per_split`` key blocks long (each range re-reads its 64 x (K+P) query block
    and writes a 64 x K fp32 partial output that the combine reads back). Measured on an H200 with
    CUDA-graph timing at b = 32, s = 1 (64 programs): 2 splits (one wave) 96 us, 4 splits (two
    waves) 108 us — hence one wave. More than half a wave: no split (b = 64, s = 1: 167 us
    unsplit, 186 us with 2 splits).
    """
    programs = b * cdiv(rows, BLOCK_M)
    if programs <= 0 or 2 * programs > sms:
        return 1
    n_blocks = max(1, cdiv(t, BLOCK_N))
    return max(1, min((waves * sms) // programs, n_blocks // min_blocks_per_split, max_splits))


def _operand_descriptors(qc, qpe, z, kpe, key_box: int) -> tuple:
    """TMA descriptors of the four inputs: queries as ``[B, H*S, *]`` (row = head * S + token) in
    boxes of ``[1, 64, key_box]`` / ``[1, 64, P]``, keys as ``[B, T, *]`` in ``[1, 64, key_box]`` /
    ``[1, 64, P]`` (``key_box`` = K for one box per block, K/2 for half blocks)."""
    b, h, s, k = qc.shape
    p = qpe.shape[-1]
    q3 = _tma_operand(qc).view(b, h * s, k)
    qr3 = _tma_operand(qpe).view(b, h * s, p)
    return (_descriptor(q3, [1, BLOCK_M, key_box]), _descriptor(qr3, [1, BLOCK_M, p]),
            _descriptor(_tma_operand(z), [1, BLOCK_N, key_box]), _descriptor(_tma_operand(kpe), [1, BLOCK_N, p]))


def _split_plan(o_latent: torch.Tensor, lse: torch.Tensor, t: int, num_splits: int | None):
    """Split-KV layout of one call: ``(num_splits, per_split, o_buf, lse_buf)`` — the key blocks
    cut into ``num_splits`` ranges of ``per_split`` (default :func:`choose_num_splits`; no empty
    range), and where each range writes: fp32 partials ``[B, H*S, NS, K]`` / ``[B, H*S, NS]`` for
    :func:`_finish` to combine, or views of ``o_latent`` / ``lse`` when unsplit."""
    b, h, s, k = o_latent.shape
    hs = h * s
    n_blocks = cdiv(t, BLOCK_N)
    if num_splits is None:
        num_splits = choose_num_splits(b, hs, t, sms=num_sms(o_latent.device.index))
    num_splits = max(1, min(int(num_splits), n_blocks))
    per_split = cdiv(n_blocks, num_splits)
    num_splits = cdiv(n_blocks, per_split)
    if num_splits == 1:
        return 1, per_split, o_latent.view(b, hs, 1, k), lse.view(b, hs, 1)
    dev = o_latent.device
    return (num_splits, per_split, torch.empty((b, hs, num_splits, k), dtype=torch.float32, device=dev),
            torch.empty((b, hs, num_splits), dtype=torch.float32, device=dev))


def _finish(o_buf: torch.Tensor, lse_buf: torch.Tensor, o_latent: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge the split partials into ``o_latent`` / ``lse`` (nothing to do when unsplit)."""
    b, hs, num_splits, k = o_buf.shape
    if num_splits > 1:
        combine(o_buf, lse_buf, o_latent.view(b, hs, k), lse.view(b, hs))  # reads NS*(K+1) fp32 per row


def _validate(qc, qpe, z, kpe, seqlens):
    sizes: dict[str, int] = {}
    bind_shape("qc", qc, "B H S K", sizes, dtypes=tuple(_TORCH_TO_GL))
    dev = qc.device
    if dev.type != "cuda":
        raise ValueError(f"qc is on {dev}: the Gluon kernel needs CUDA tensors on an sm_90 GPU")
    bind_shape("qpe", qpe, "B H S P", sizes, dtypes=(qc.dtype,), device=dev)
    bind_shape("z", z, "B T K", sizes, dtypes=(qc.dtype,), device=dev)
    bind_shape("kpe", kpe, "B T P", sizes, dtypes=(qc.dtype,), device=dev)
    k, p, s, t = sizes["K"], sizes["P"], sizes["S"], sizes["T"]
    if k % 64 or not 64 <= k <= 512:  # each warpgroup's output MMA is 64 x K/2 (wgmma N <= 256)
        raise ValueError(f"qc/z: K must be a multiple of 64 in [64, 512], got {k}")
    if p % 16 or p > 256:
        raise ValueError(f"qpe/kpe: P must be a multiple of 16 and <= 256, got {p}")
    if _smem_bytes(k, p) > _SMEM_LIMIT:
        raise ValueError(f"K + P = {k + p} needs {_smem_bytes(k, p)} B of shared memory (> {_SMEM_LIMIT})")
    if s > t:
        raise ValueError(f"S = {s} new tokens cannot exceed T = {t} keys")
    seqlens = check_seqlens(seqlens, sizes["B"], t, s, dev)
    return sizes, seqlens


def flash_mla_gluon(qc: torch.Tensor, qpe: torch.Tensor, z: torch.Tensor, kpe: torch.Tensor, *, scale: float,
                    causal: bool = True, seqlens: torch.Tensor | None = None,
                    num_splits: int | None = None, schedule: str | None = None,
                    zero_tail: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA attention over a dense latent cache, Gluon kernel for Hopper.

    Parameters
    ----------
    qc : [B, H, S, K] bf16/fp16   absorbed no-RoPE query
    qpe : [B, H, S, P]            RoPE query
    z : [B, T, K]                 latent cache (key and value), T includes the S new tokens
    kpe : [B, T, P]               RoPE key, shared by all heads
    scale : float                 softmax scale
    causal : bool                 query i of S sees keys j <= L - S + i (L = T or seqlens[b])
    seqlens : [B] int, optional   valid keys per sequence, S <= seqlens[b] <= T
    num_splits : int, optional    split-KV count (default: :func:`choose_num_splits`)
    schedule : str, optional      one of ``SCHEDULES`` (default ``DEFAULT_SCHEDULE``): "sequential";
                                  "pipelined" issues block j+1's score MMA behind block j's P.Z;
                                  "seesaw" the warp-specialised kernel (where it applies; the
                                  pipelined one otherwise)
    zero_tail : bool, optional    with seqlens: zero the keys L.. of each sequence's last, partial
                                  key block in shared memory, so non-finite values stored past
                                  seqlens[b] cannot reach the output (default: ``ZERO_TAIL_DEFAULT``)

    Returns
    -------
    o_latent : [B, H, S, K] in qc's dtype;  lse : [B, H, S] float32 (natural log)
    """
    if not GLUON_AVAILABLE:
        raise RuntimeError(f"triton.experimental.gluon is unavailable: {GLUON_IMPORT_ERROR}")
    schedule = DEFAULT_SCHEDULE if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    sizes, seqlens = _validate(qc, qpe, z, kpe, seqlens)
    scale = check_scale(scale)
    b, h, s, t, k, p = (sizes[x] for x in "BHSTKP")
    if schedule == "seesaw":
        if seesaw.seesaw_applies(qc, qpe, (z, kpe)):
            return seesaw.seesaw_attention(qc, qpe, (z, kpe), scale=scale, causal=causal, seqlens=seqlens,
                                           decode=AbsorbedDecode.for_one_call(qc.device),
                                           num_splits=num_splits if seqlens is None else None)
        schedule = "pipelined"
    hs = h * s
    dev = qc.device
    o_latent = torch.empty((b, h, s, k), dtype=qc.dtype, device=dev)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=dev)
    if b == 0 or hs == 0:
        return o_latent, lse

    num_splits, per_split, o_buf, lse_buf = _split_plan(o_latent, lse, t, num_splits)
    descs = _operand_descriptors(qc, qpe, z, kpe, k)
    split = num_splits > 1
    o_desc = _descriptor(o_buf.view(b, hs, num_splits * k), [1, BLOCK_M, k])
    l_strides = (lse_buf.stride(0), lse_buf.stride(1), lse_buf.stride(2))
    seq_arg = seqlens if seqlens is not None else lse_buf  # unused pointer when HAS_SEQLENS=False

    grid = (cdiv(hs, BLOCK_M), num_splits, b)
    _flash_mla_fwd[grid](
        *descs, o_desc, lse_buf, seq_arg,
        hs, s, t, scale * _LOG2E, per_split, *l_strides,
        K=k, P=p, CAUSAL=bool(causal), HAS_SEQLENS=seqlens is not None, SPLIT=split,
        PIPELINE=schedule == "pipelined",
        ZERO_TAIL=seqlens is not None and (ZERO_TAIL_DEFAULT if zero_tail is None else bool(zero_tail)),
        num_warps=NUM_WARPS,
    )
    _finish(o_buf, lse_buf, o_latent, lse)
    return o_latent, lse


def compile_for_sm90(*, k: int = 512, p: int = 64, dtype: str = "bf16", causal: bool = True,
                     has_seqlens: bool = False, split: bool = False, pipeline: bool = True,
                     zero_tail: bool | None = None, capability: int = 90):
    """Compile the kernel for an sm_90 target without a GPU; returns Triton's CompiledKernel
    (``.asm["cubin"]``, ``.asm["ptx"]``, ``.metadata.shared``, ``.n_regs`` after loading).

    Must run in a process without ``TRITON_INTERPRET`` set.
    """
    def desc(cols: int, rows: int, ty: str = dtype) -> str:
        return _desc_type([1, rows, cols], ty)

    signature = {
        "q_desc": desc(k, BLOCK_M), "qr_desc": desc(p, BLOCK_M), "z_desc": desc(k, BLOCK_N),
        "kr_desc": desc(p, BLOCK_N), "o_desc": desc(k, BLOCK_M, "fp32" if split else dtype),
        "lse_ptr": "*fp32", "seqlens_ptr": "*i32",
        "HS": "i32", "S": "i32", "T": "i32", "qk_scale_log2": "fp32", "blocks_per_split": "i32",
        "stride_lb": "i32", "stride_lr": "i32", "stride_ls": "i32",
        "K": "constexpr", "P": "constexpr", "CAUSAL": "constexpr", "HAS_SEQLENS": "constexpr", "SPLIT": "constexpr",
        "PIPELINE": "constexpr", "ZERO_TAIL": "constexpr",
    }
    zero_tail = has_seqlens if zero_tail is None else bool(zero_tail) and has_seqlens
    constexprs = {"K": k, "P": p, "CAUSAL": causal, "HAS_SEQLENS": has_seqlens, "SPLIT": split, "PIPELINE": pipeline,
                  "ZERO_TAIL": zero_tail}
    return _compile_sm90(_flash_mla_fwd, signature, constexprs, num_warps=NUM_WARPS, capability=capability)


# ---------------------------------------------------------------------------------------------
# the sm_90 backends of the absorbed design


def _flash_mla_hopper(qc, qpe, z, kpe, *, scale, causal, seqlens, config, out, decode, source=None,
                      num_splits=None, entry=None):
    """The sm_90 backend of :func:`flash_mla`: the warp-specialised seesaw kernel where it
    applies (K = 512, P = 64, no portable ``config``; dense or ragged), the pipelined Gluon
    kernel for other widths without ``seqlens`` or a caller's plan, else the portable kernel."""
    if config is None and seesaw.seesaw_applies(qc, qpe, (z, kpe)):
        return seesaw.seesaw_attention(qc, qpe, (z, kpe), scale=scale, causal=causal, seqlens=seqlens, decode=decode,
                                       source=source, out=out, num_splits=num_splits, checked=True, entry=entry)
    if not decode.given and num_splits is None and gluon_applies(qc, qpe, seqlens, config, out):
        return flash_mla_gluon(qc, qpe, z, kpe, scale=scale, causal=causal, schedule="pipelined")
    return flash_mla_portable(qc, qpe, z, kpe, scale=scale, causal=causal, seqlens=seqlens, config=config, out=out,
                             decode=decode, source=source, num_splits=num_splits)


def _flash_mla_paged_hopper(qc, qpe, kv_cache, block_table, seqlens, *, scale, causal, config, out, decode,
                            source=None, entry=None):
    """The sm_90 backend of :func:`flash_mla_paged`: the seesaw kernel over FlashMLA's layout
    (64-token pages, K = 512, P = 64), else the portable kernel."""
    if config is None and seesaw.seesaw_applies(qc, qpe, (kv_cache, None), paged=True):
        return seesaw.seesaw_attention(qc, qpe, (kv_cache, None), scale=scale, causal=causal, seqlens=seqlens,
                                       decode=decode, source=source, block_table=block_table, out=out, checked=True,
                                       entry=entry)
    return flash_mla_paged_portable(qc, qpe, kv_cache, block_table, seqlens, scale=scale, causal=causal,
                                   config=config, out=out, decode=decode, source=source)


backends.register("flash_mla", "gluon", _flash_mla_hopper, supports=backends.gluon_hopper, priority=10)
backends.register("flash_mla_paged", "gluon", _flash_mla_paged_hopper, supports=backends.gluon_hopper, priority=10)

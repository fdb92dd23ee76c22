"""Absorbed (FlashMLA-style) attention over the latent cache: the portable Triton kernel.

Design
------
* **Head grouping.** A program owns ``BLOCK_M`` rows of one sequence, a row being one
  (head, query token) pair, ordered ``row = head * S + token``. Each key block of ``Z`` is read
  once per row block and feeds every head in it — the point of the absorbed design.
* **Score split.** ``score = qc . z^T`` (K wide) ``+ qpe . kpe^T`` (P wide): two dots, because
  ``tl.arange`` needs powers of two and 576 = 512 + 64 is not one.
* **Online softmax** in the log2 domain (``scale * log2 e`` folded into the scores), from
  :mod:`mla_var3.kernel._jit`; ``Z`` is also the value, so ``acc += p . z``.
* **Causal mask per row**: query token ``i`` of a sequence with ``L`` keys sees ``j <= L - S + i``.
* **Work items.** A program runs one item of a decode plan (:mod:`mla_var3.kernel.decode_plan`,
  shared with the sm_90 kernel): keys ``[blk_lo, blk_hi) * 64`` of one sequence, written to the
  output when the item covers it, else as a normalised fp32 partial and its LSE to a slot that
  :func:`mla_var3.kernel.combine.combine_planned` merges. Plans come from the GPU (ragged
  ``seqlens``: no host synchronisation), from the host once per shape (uniform), or from a
  portable ``config.num_splits`` (autotuning: that many items per sequence).
* **Paged** caches (FlashMLA's layout) run the same kernel with ``PAGED=True``: the page of
  each key comes from the block table (both of its strides honoured).
* **Interpreter.** ``UPCAST`` (True under ``TRITON_INTERPRET=1``) converts operands to float32,
  because the interpreter computes garbage on bf16; ``p`` is still rounded to the storage dtype
  before ``p . z`` so the numerics follow the GPU path.

Requirements: K and P powers of two, each >= 16 (DeepSeek: 512, 64; MiniCPM3: 256, 32); any H,
S <= T, any T. Inputs may be non-contiguous (strides are passed through).

Example
-------
>>> o_latent, lse = flash_mla(qc, qpe, z, kpe, scale=192 ** -0.5)   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mla_var3.kernel import backends
from mla_var3.kernel._common import SMEM_LIMIT, cdiv, interpreting, next_pow2, num_sms
from mla_var3.kernel._jit import LOG2E, finalize_lse, online_softmax_step, operand, to_storage
from mla_var3.kernel.combine import combine_planned
from mla_var3.kernel.decode import AbsorbedDecode
from mla_var3.kernel.decode_plan import PLAN_BLOCK, DecodePlan, uniform_plan

__all__ = [
    "FlashMLAConfig", "candidate_configs", "choose_num_splits", "default_config", "flash_mla", "flash_mla_paged",
]



# ---------------------------------------------------------------------------------------------
# launch configuration



@dataclass(frozen=True)
class FlashMLAConfig:
    """Launch configuration of the absorbed kernel.

    block_m : rows (heads x query tokens of one sequence) per program; a power of two >= 16.
    block_n : keys per inner step; a power of two >= 16.
    num_warps, num_stages : Triton launch options (software pipelining depth of the key loop).
    num_splits : key ranges per sequence (split-KV); 1 = no split, no combine step.
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    num_splits: int = 1

    def validate(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 16 or value & (value - 1):
                raise ValueError(f"FlashMLAConfig.{name} must be a power of two >= 16, got {value!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"FlashMLAConfig.num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"FlashMLAConfig.num_stages must be a positive int, got {self.num_stages!r}")
        if not isinstance(self.num_splits, int) or self.num_splits < 1:
            raise ValueError(f"FlashMLAConfig.num_splits must be a positive int, got {self.num_splits!r}")

    def replace(self, **changes) -> "FlashMLAConfig":
        return dataclasses.replace(self, **changes)


def choose_num_splits(b: int, rows: int, t: int, *, block_m: int, block_n: int, sms: int,
                      min_blocks_per_split: int = 2, max_splits: int = 64) -> int:
    """Split-KV count for ``b`` sequences of ``rows = h * s`` rows and ``t`` keys on ``sms`` SMs.

    Without splitting there are ``b * ceil(rows / block_m)`` programs. When they leave SMs idle,
    each sequence's keys are cut into as many ranges as fill about one wave, but never ranges
    shorter than ``min_blocks_per_split`` key blocks (each program re-reads its query block,
    BLOCK_M*(K+P) elements, which must stay small next to the keys it streams).
    """
    programs = b * cdiv(rows, block_m)
    if programs <= 0 or programs >= sms:
        return 1
    by_sms = sms // programs
    by_len = t // (block_n * min_blocks_per_split)
    return max(1, min(by_sms, by_len, max_splits))


def _device_sms(device) -> int:
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        return num_sms(device.index)
    return 132  # the benchmark GPU (H200), so the interpreter splits as it would


def default_config(b: int, rows: int, t: int, k: int = 512, p: int = 64, *, device=None,
                   sms: int | None = None) -> FlashMLAConfig:
    """The analytic default for ``b`` sequences, ``rows = h * s``, ``t`` keys, widths k, p.

    64-row blocks (the wgmma tile height on Hopper; FlashMLA's choice) unless there are fewer
    rows; 8 warps so the [64, K] fp32 accumulator fits in registers at K = 512 (128 registers
    per thread); 32-key steps when the accumulator is that large (64-key steps spill a few
    registers at K = 512 on sm_90, compiled with triton 3.6), else 64; two pipeline stages
    (three 64-key stages of a 576-wide cache exceed the 227 KB of shared memory);
    split-KV from :func:`choose_num_splits`.
    """
    block_m = min(64, max(16, next_pow2(rows)))
    big_acc = block_m * k >= 64 * 512
    block_n = 32 if big_acc else 64
    num_warps = 8 if block_m * k >= 64 * 256 else 4
    num_stages = 2
    sms = sms if sms is not None else _device_sms(device)
    ns = choose_num_splits(b, rows, t, block_m=block_m, block_n=block_n, sms=sms)
    return FlashMLAConfig(block_m, block_n, num_warps, num_stages, ns)


def smem_estimate(config: FlashMLAConfig, k: int, p: int, elem_bytes: int = 2) -> int:
    """Rough shared memory of a config: the query block plus ``num_stages`` key blocks."""
    return elem_bytes * (k + p) * (config.block_m + max(1, config.num_stages) * config.block_n)


def candidate_configs(b: int, rows: int, t: int, k: int = 512, p: int = 64, *, device=None,
                      sms: int | None = None) -> list[FlashMLAConfig]:
    """Configs worth timing for this problem (for an autotuner), the default first.

    Block shapes x warps x stages, filtered by a shared-memory estimate and by the register
    budget of the fp32 accumulator (block_m * k * 4 bytes over num_warps * 32 threads must stay
    within ~128 registers); each with its heuristic split count and with twice / half of it.
    """
    sms = sms if sms is not None else _device_sms(device)
    first = default_config(b, rows, t, k, p, device=device, sms=sms)
    found = [first]
    top_m = min(64, max(16, next_pow2(rows)))
    for block_m in (16, 32, 64):
        if block_m > top_m:
            continue
        for block_n in (32, 64, 128):
            for num_warps in (4, 8):
                if block_m * k > num_warps * 32 * 128:
                    continue
                for num_stages in (1, 2, 3):
                    base = FlashMLAConfig(block_m, block_n, num_warps, num_stages, 1)
                    if smem_estimate(base, k, p) > SMEM_LIMIT:
                        continue
                    ns = choose_num_splits(b, rows, t, block_m=block_m, block_n=block_n, sms=sms)
                    for n in sorted({ns, max(1, ns // 2), min(64, 2 * ns)}):
                        if n > 1 and n * block_n > t:
                            continue
                        cfg = base.replace(num_splits=n)
                        if cfg not in found:
                            found.append(cfg)
    return found


@triton.jit
def _flash_mla_kernel(
    qc_ptr, qpe_ptr, z_ptr, kpe_ptr, block_table_ptr, seqlens_ptr, items_ptr,
    out_ptr, lse_ptr, o_part_ptr, lse_part_ptr,
    scale_log2, S, T, ROWS, MAX_BLOCKS,
    stride_qb, stride_qh, stride_qs, stride_qk,
    stride_pb, stride_ph, stride_ps, stride_pp,
    stride_zb, stride_zt, stride_zk,
    stride_kb, stride_kt, stride_kp,
    stride_btb, stride_btc,
    stride_ob, stride_oh, stride_os, stride_ok,
    stride_lb, stride_lh, stride_ls,
    K: tl.constexpr, P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ITEM_BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Grid (row blocks, plan items). Item ``program_id(1)`` of the decode plan is
    ``(b, blk_lo, blk_hi, slot)``: keys ``[blk_lo, blk_hi) * ITEM_BLOCK`` of sequence b; ``b < 0``:
    nothing to do; ``slot < 0``: the item covers the sequence and writes the output, else fp32
    partials ``o_part [slot, ROWS, K]``, ``lse_part [slot, ROWS]`` for the combine.
    Dense: z/kpe strides are (batch, token, dim). Paged: z_ptr/kpe_ptr point into kv_cache
    (kpe_ptr = z_ptr + K), the "batch" stride is the page stride, the token stride the in-page
    stride; the page of key j is ``block_table[b, j // PAGE_SIZE]`` (both table strides honoured;
    entries past the sequence's last page are never read).

    Per program: reads BLOCK_M*(K+P) query elements once, then (K+P) per key of its range;
    2*BLOCK_M*(2K+P) FLOPs per key; writes BLOCK_M*K outputs (fp32 partials for a split item).
    """
    pid_m = tl.program_id(0)
    item = tl.program_id(1)
    b32 = tl.load(items_ptr + item * 4)
    if b32 < 0:
        return
    b = b32.to(tl.int64)
    blk_lo = tl.load(items_ptr + item * 4 + 1)
    blk_hi = tl.load(items_ptr + item * 4 + 2)
    slot = tl.load(items_ptr + item * 4 + 3)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < ROWS
    head = rows // S
    tok = rows % S
    offs_k = tl.arange(0, K)
    offs_p = tl.arange(0, P)

    if HAS_SEQLENS:
        L = tl.minimum(tl.load(seqlens_ptr + b), T)
    else:
        L = T
    # keys visible to this block: [0, kv_end); per row [0, row_end)
    if CAUSAL:
        row_end = L - S + tok + 1
        kv_end = L - S + 1 + tl.max(tl.where(row_ok, tok, 0), 0)
    else:
        row_end = tl.zeros([BLOCK_M], tl.int32) + L
        kv_end = L
    kv_lo = blk_lo * ITEM_BLOCK
    kv_hi = tl.minimum(blk_hi * ITEM_BLOCK, kv_end)

    # the query block stays on chip for the whole key loop: BLOCK_M * (K + P) elements
    q_rows = b * stride_qb + head * stride_qh + tok * stride_qs
    qc = tl.load(qc_ptr + q_rows[:, None] + offs_k[None, :] * stride_qk, mask=row_ok[:, None], other=0.0)
    p_rows = b * stride_pb + head * stride_ph + tok * stride_ps
    qpe = tl.load(qpe_ptr + p_rows[:, None] + offs_p[None, :] * stride_pp, mask=row_ok[:, None], other=0.0)
    qc = operand(qc, UPCAST)
    qpe = operand(qpe, UPCAST)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, K], tl.float32)

    for start in range(kv_lo, kv_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < kv_hi
        if PAGED:
            col = offs_n // PAGE_SIZE
            page = tl.load(block_table_ptr + b * stride_btb + col.to(tl.int64) * stride_btc,
                           mask=n_ok & (col < MAX_BLOCKS), other=0)
            z_tok = page.to(tl.int64) * stride_zb + (offs_n % PAGE_SIZE) * stride_zt
            k_tok = page.to(tl.int64) * stride_kb + (offs_n % PAGE_SIZE) * stride_kt
        else:
            z_tok = b * stride_zb + offs_n.to(tl.int64) * stride_zt
            k_tok = b * stride_kb + offs_n.to(tl.int64) * stride_kt
        # read BLOCK_N * (K + P) cache elements; z serves as key and value
        z = tl.load(z_ptr + z_tok[:, None] + offs_k[None, :] * stride_zk, mask=n_ok[:, None], other=0.0)
        kpe = tl.load(kpe_ptr + k_tok[:, None] + offs_p[None, :] * stride_kp, mask=n_ok[:, None], other=0.0)
        zop = operand(z, UPCAST)
        # 2 * BLOCK_M * BLOCK_N * (K + P) FLOPs: the latent part and the RoPE part
        scores = tl.dot(qc, tl.trans(zop))
        scores += tl.dot(qpe, tl.trans(operand(kpe, UPCAST)))
        scores = scores * scale_log2
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] < row_end[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(scores, m_i, l_i)
        # round p to the storage dtype as the tensor-core path does, then p . z
        pv = operand(to_storage(p, z_ptr.dtype.element_ty, UPCAST), UPCAST)
        acc = acc * alpha[:, None] + tl.dot(pv, zop)

    inv_l = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    o = acc * inv_l[:, None]
    lse = finalize_lse(m_i, l_i)
    if L == 0:  # an empty sequence: +inf, as FlashMLA reports it
        lse = tl.full([BLOCK_M], float("inf"), tl.float32)
    if slot >= 0:
        # fp32 partials: o_part [slots, ROWS, K], lse_part [slots, ROWS] (rows head-major)
        x_rows = slot.to(tl.int64) * ROWS + rows
        tl.store(o_part_ptr + x_rows[:, None] * K + offs_k[None, :], o, mask=row_ok[:, None])
        tl.store(lse_part_ptr + x_rows, lse, mask=row_ok)
    else:
        o_rows = b * stride_ob + head * stride_oh + tok * stride_os
        tl.store(out_ptr + o_rows[:, None] + offs_k[None, :] * stride_ok,
                 to_storage(o, out_ptr.dtype.element_ty, UPCAST), mask=row_ok[:, None])
        tl.store(lse_ptr + b * stride_lb + head * stride_lh + tok * stride_ls, lse, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# launch


def _prepare(qc, qpe, z_view, kpe_view, z_strides, kpe_strides, block_table, seqlens, out, sizes, *, scale,
             causal, config, plan, page_size, paged, upcast, decode=None):
    """Allocate outputs and build the kernel's arguments: (grid, kwargs, config, out, lse,
    plan, partials). ``plan``: the plan to run (None: a uniform one, for compiling on meta
    tensors); ``decode``: the owner of the partials' workspace (None: fresh ones)."""
    b, h, s, k, p, t = sizes["B"], sizes["H"], sizes["S"], sizes["K"], sizes["P"], sizes["T"]
    device = qc.device
    rows = h * s
    if config is None:
        config = default_config(b, rows, t, k, p, device=device)
    config.validate()
    if plan is None:
        plan = uniform_plan(b, rows, t, k=k, device=device, num_splits=config.num_splits)
    if out is None:
        out = torch.empty((b, h, s, k), dtype=qc.dtype, device=device)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=device)
    if decode is not None and device.type != "meta":
        o_part, lse_part = decode.partials(plan.max_slots, rows, k, device)
    else:
        o_part = torch.empty((plan.max_slots, rows, k), dtype=torch.float32, device=device)
        lse_part = torch.empty((plan.max_slots, rows), dtype=torch.float32, device=device)
    dummy_i32 = seqlens if seqlens is not None else plan.seqs
    bt = block_table if block_table is not None else dummy_i32
    names = ("b", "h", "s", "k")
    kwargs = dict(
        qc_ptr=qc, qpe_ptr=qpe, z_ptr=z_view, kpe_ptr=kpe_view, block_table_ptr=bt, seqlens_ptr=dummy_i32,
        items_ptr=plan.items, out_ptr=out, lse_ptr=lse, o_part_ptr=o_part, lse_part_ptr=lse_part,
        scale_log2=float(scale * LOG2E), S=s, T=t, ROWS=rows,
        MAX_BLOCKS=block_table.shape[1] if block_table is not None else cdiv(t, PLAN_BLOCK),
        **{f"stride_q{n}": v for n, v in zip(names, qc.stride())},
        **{f"stride_p{n}": v for n, v in zip(("b", "h", "s", "p"), qpe.stride())},
        **{f"stride_z{n}": v for n, v in zip(("b", "t", "k"), z_strides)},
        **{f"stride_k{n}": v for n, v in zip(("b", "t", "p"), kpe_strides)},
        **dict(zip(("stride_btb", "stride_btc"), block_table.stride() if block_table is not None else (0, 0))),
        **{f"stride_o{n}": v for n, v in zip(names, out.stride())},
        **{f"stride_l{n}": v for n, v in zip(("b", "h", "s"), lse.stride())},
        K=k, P=p, BLOCK_M=config.block_m, BLOCK_N=config.block_n, ITEM_BLOCK=PLAN_BLOCK, PAGE_SIZE=page_size,
        PAGED=paged, HAS_SEQLENS=seqlens is not None, CAUSAL=bool(causal), UPCAST=upcast,
    )
    grid = (cdiv(rows, config.block_m), plan.max_items)
    return grid, kwargs, config, out, lse, plan, (o_part, lse_part)


def _launch(qc, *args, **kw):
    b, h, s, k = qc.shape
    if b == 0 or h * s == 0:        # nothing to attend: empty outputs, no plan
        out = args[7]
        if out is None:
            out = torch.empty((b, h, s, k), dtype=qc.dtype, device=qc.device)
        return out, torch.empty((b, h, s), dtype=torch.float32, device=qc.device)
    grid, kwargs, config, out, lse, plan, (o_part, lse_part) = _prepare(qc, *args, **kw, upcast=interpreting())
    _flash_mla_kernel[grid](**kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
    if plan.may_split:
        combine_planned(o_part, lse_part, plan.seqs, out, lse, head_major=True)
    return out, lse


def example_launch(b: int, h: int, s: int, t: int, k: int = 512, p: int = 64, *, dtype: torch.dtype = torch.bfloat16,
                   causal: bool = True, paged: bool = False, page_size: int = 64, ragged: bool = False,
                   config: FlashMLAConfig | None = None, sms: int = 132) -> tuple[dict, FlashMLAConfig]:
    """The GPU launch arguments of the main kernel for a problem (contiguous inputs), with
    pointers as type strings: feed to :func:`mla_var3.kernel.sass.compile_launch_in_subprocess`
    to check the compiled kernel (registers, spills, HGMMA) without a GPU. Also returns the
    config used (default: :func:`default_config` with ``sms`` SMs)."""
    meta = dict(device="meta")
    qc = torch.empty(b, h, s, k, dtype=dtype, **meta)
    qpe = torch.empty(b, h, s, p, dtype=dtype, **meta)
    seqlens = torch.empty(b, dtype=torch.int32, **meta) if (ragged or paged) else None
    if config is None:
        config = default_config(b, h * s, t, k, p, sms=sms)
    sizes = dict(B=b, H=h, S=s, K=k, P=p, T=t)
    if paged:
        nblocks = cdiv(t, page_size)
        cache = torch.empty(b * nblocks, page_size, 1, k + p, dtype=dtype, **meta)
        table = torch.empty(b, nblocks, dtype=torch.int32, **meta)
        strides = (cache.stride(0), cache.stride(1), cache.stride(3))
        views = (cache, cache[..., k:], strides, strides, table)
    else:
        z = torch.empty(b, t, k, dtype=dtype, **meta)
        kpe = torch.empty(b, t, p, dtype=dtype, **meta)
        views = (z, kpe, z.stride(), kpe.stride(), None)
    _, kwargs, config, *_ = _prepare(qc, qpe, *views, seqlens, None, sizes, scale=0.07, causal=causal, config=config,
                                     plan=None, page_size=page_size if paged else 1, paged=paged, upcast=False)
    type_names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
    args = {name: f"*{type_names[v.dtype]}" if isinstance(v, torch.Tensor) else v for name, v in kwargs.items()}
    return args, config


def _portable_plan(decode, seqlens, source, sizes: dict, config, num_splits):
    """The plan of a portable call: the owner's (one program per item here), or, for a uniform
    batch with a portable ``config``, its ``num_splits`` items per sequence."""
    b, rows, t = sizes["B"], sizes["H"] * sizes["S"], sizes["T"]
    if num_splits is None and config is not None and seqlens is None and config.num_splits != 1:
        num_splits = config.num_splits
    return decode.plan_for(seqlens, source if source is not None else seqlens, b, rows, t, k=sizes["K"],
                           device=sizes["device"], packed=False, num_splits=num_splits)


def flash_mla_portable(qc, qpe, z, kpe, *, scale, causal, seqlens, config, out, decode, source=None,
                       num_splits=None, entry=None):
    """The portable Triton backend of :func:`flash_mla` (inputs already validated)."""
    b, h, s, k = qc.shape
    sizes = dict(B=b, H=h, S=s, K=k, P=qpe.shape[-1], T=z.shape[1], device=qc.device)
    plan = None if b == 0 or h * s == 0 else _portable_plan(decode, seqlens, source, sizes, config, num_splits)
    return _launch(qc, qpe, z, kpe, (z.stride(0), z.stride(1), z.stride(2)), kpe.stride(), None, seqlens, out,
                   sizes, scale=scale, causal=causal, config=config, plan=plan, page_size=1, paged=False,
                   decode=decode)


def flash_mla_paged_portable(qc, qpe, kv_cache, block_table, seqlens, *, scale, causal, config, out, decode,
                             source=None, entry=None):
    """The portable Triton backend of :func:`flash_mla_paged` (inputs already validated)."""
    b, h, s, k = qc.shape
    nb, page, _, width = kv_cache.shape
    sizes = dict(B=b, H=h, S=s, K=k, P=qpe.shape[-1], T=block_table.shape[1] * page, device=qc.device)
    plan = None if b == 0 or h * s == 0 else _portable_plan(decode, seqlens, source, sizes, config, None)
    strides = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(3))
    return _launch(qc, qpe, kv_cache, kv_cache[..., k:], strides, strides, block_table, seqlens, out, sizes,
                   scale=scale, causal=causal, config=config, plan=plan, page_size=page, paged=True, decode=decode)


def gluon_applies(qc: torch.Tensor, qpe: torch.Tensor, seqlens, config, out) -> bool:
    """Whether the pipelined Gluon kernel (:mod:`mla_var3.kernel.hopper.absorbed_gluon`, for the
    widths the seesaw kernel does not take) can run this call: bf16/fp16, K a multiple of 64 up
    to 512, P a multiple of 16 up to 256, no per-sequence lengths, no portable ``config`` and no
    ``out`` buffer. Everything else runs the portable kernel."""
    k, p = qc.shape[-1], qpe.shape[-1]
    return (qc.dtype in (torch.bfloat16, torch.float16) and k % 64 == 0 and 64 <= k <= 512
            and p % 16 == 0 and p <= 256 and seqlens is None and config is None and out is None)


backends.register("flash_mla", "triton", flash_mla_portable)
backends.register("flash_mla_paged", "triton", flash_mla_paged_portable)


def flash_mla(qc: torch.Tensor, qpe: torch.Tensor, z: torch.Tensor, kpe: torch.Tensor, *, scale: float,
              causal: bool = True, seqlens: torch.Tensor | None = None, config: FlashMLAConfig | None = None,
              out: torch.Tensor | None = None, backend: str = "auto", plan: DecodePlan | None = None,
              decode: AbsorbedDecode | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA attention over a dense latent cache.

    Parameters
    ----------
    qc : [B, H, S, K]   absorbed no-RoPE query (bf16/fp16; fp32 too under the interpreter)
    qpe : [B, H, S, P]  RoPE query
    z : [B, T, K]       latent cache (key and value), T includes the S new tokens
    kpe : [B, T, P]     RoPE key, one per token, shared by all heads
    scale : float       softmax scale (DeepSeek: 1/sqrt(d + p), times mscale^2 with YaRN)
    causal : bool       query i of S sees keys j <= L - S + i (L = T or seqlens[b])
    seqlens : [B] int32, optional   valid keys per sequence: 0 (empty) or S <= seqlens[b] <= T
    config : FlashMLAConfig, optional   portable launch config (default: :func:`default_config`;
                        passing one selects the portable kernel)
    out : [B, H, S, K], optional        output buffer (any strides, no overlapping elements), qc's dtype
    backend : str       ``"auto"`` or a registered backend name (see :mod:`mla_var3.kernel.backends`)
    plan : DecodePlan, optional     the split of the batch's key blocks over the SMs
                        (:func:`mla_var3.kernel.decode_plan.plan_decode`), built by the caller for
                        these lengths (a run over other lengths raises ValueError)
    decode : AbsorbedDecode, optional   the caller's decode state (:mod:`mla_var3.kernel.decode`:
                        the step's plan, the workspace): pass one object to every layer of a
                        step; default: one made for this call (its plan built on the GPU with
                        ``seqlens``, on the host once per shape without). Not with ``plan``.

    Returns
    -------
    o_latent : [B, H, S, K] in qc's dtype (decompress with W_UV to get [B, H, S, D])
    lse : [B, H, S] float32, natural-log LSE of the scaled scores

    K and P must be powers of two >= 16. Raises ValueError on any invalid input; the values of
    ``seqlens`` are checked on CPU tensors, and on CUDA only with ``MLA_VAR3_CHECK=1`` (a check
    needs a host synchronisation, which an eager decode call cannot afford and a CUDA graph
    forbids). No host synchronisation otherwise: the call can be captured in a CUDA graph.
    Inference only: the outputs carry no gradient.
    """
    return _owner(decode, plan, qc, backend).run(qc, qpe, z, kpe, scale=scale, causal=causal, seqlens=seqlens,
                                                 out=out, config=config)


def flash_mla_paged(qc: torch.Tensor, qpe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                    seqlens: torch.Tensor, *, scale: float, causal: bool = True,
                    config: FlashMLAConfig | None = None, out: torch.Tensor | None = None,
                    backend: str = "auto", plan: DecodePlan | None = None,
                    decode: AbsorbedDecode | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA attention over a paged latent cache (FlashMLA's layout).

    Parameters
    ----------
    qc : [B, H, S, K], qpe : [B, H, S, P]   as in :func:`flash_mla`
    kv_cache : [num_blocks, page_block_size, 1, K + P]   first K = latent z, last P = RoPE key
    block_table : [B, max_blocks] int32 (any strides)   page of each block of each sequence;
        entries past a sequence's last block are never read (may be -1 or garbage)
    seqlens : [B] int32   valid keys per sequence: 0 (empty) or S <= seqlens[b] <= max_blocks * page_block_size
    scale, causal, config, out, backend, plan, decode : as in :func:`flash_mla`

    Returns (o_latent [B, H, S, K] in qc's dtype, lse [B, H, S] float32). On sm_90 with 64-token
    pages, K = 512 and P = 64 the warp-specialised Gluon kernel runs; other shapes the portable
    one. The values of ``seqlens`` and ``block_table`` are checked as in :func:`flash_mla`.
    """
    return _owner(decode, plan, qc, backend).run_paged(qc, qpe, kv_cache, block_table, seqlens, scale=scale,
                                                       causal=causal, out=out, config=config)


def _owner(decode: AbsorbedDecode | None, plan: DecodePlan | None, qc, backend: str) -> AbsorbedDecode:
    """The decode state a call runs with: the caller's, or one made for this call (holding the
    caller's ``plan`` if given)."""
    if decode is not None:
        if not isinstance(decode, AbsorbedDecode):
            raise ValueError(f"decode must be an AbsorbedDecode (mla_var3.kernel.decode), got {type(decode).__name__}")
        if plan is not None:
            raise ValueError("pass either plan or decode (an AbsorbedDecode holds its plan: decode.use_plan(plan))")
        if backend != "auto" and backend != decode.backend:
            raise ValueError(f"backend={backend!r} differs from the decode object's {decode.backend!r}: the "
                             f"AbsorbedDecode fixes its backend")
        return decode
    owner = AbsorbedDecode.for_one_call(qc.device if isinstance(qc, torch.Tensor) else None, backend=backend)
    return owner if plan is None else owner.use_plan(plan)

"""Measured ceilings of the current GPU: copy bandwidth and bf16 matmul rate.

Both are measured in the same process with :func:`mla_var3.runtime.timing.time_fn`:

* **copy bandwidth** — ``dst.copy_(src)`` of a large device buffer (default 2 GiB); the bytes
  counted are read + write (2 x size). This is the bandwidth a streaming kernel can reach,
  below the datasheet's number.
* **bf16 matmul rate** — ``torch.matmul`` of two 8192 x 8192 bf16 matrices of random normal
  values (2·n³ FLOPs). Random data matters: zeros let the GPU lower its clock less.

* **HBM read bandwidth by SM count** — one persistent program per SM on m SMs (grid = m
  programs, program i reading blocks i, i + m, ...) over a large buffer (8 GiB by default): what
  m SMs can pull from HBM. Two ways of reading, the higher kept per count: a plain Triton
  streaming read (32 warps, 32 KB per iteration into registers) and, on sm_90 with Gluon, TMA
  copies of 32 KB blocks through a four-slot shared-memory ring (what the Hopper kernels do; on
  an H100 the plain read pulled 40-66 GB/s per SM from 1-16 SMs, where the window kernel's TMA
  stream pulled 85-92). A kernel confined to part of the GPU (the hybrid's window on an SM
  partition) is bounded by this curve, not by the copy rate shared by all SMs (``read_by_sms``
  in ``conf/devices.json``).

Roofline reports say whether they used these (``"measured"``) or the datasheet's numbers.
"""

from __future__ import annotations

import functools

from mla_var3.analysis.devices import Ceilings
from mla_var3.runtime.timing import time_fn

#: the SM counts :func:`measure_read_by_sms` times by default (those of the H200's record); counts
#: above the device's SMs are dropped, its own count is always timed
READ_SMS = (1, 16, 32, 44, 66, 88, 132)
#: bytes one program reads per iteration, and its warps (16 KB / 16 warps reached 59 GB/s per SM on
#: an H200 where these reach 110; 64 KB spills)
READ_BLOCK_BYTES = 32 * 1024
READ_WARPS = 32


class NoGPUError(RuntimeError):
    """Raised when a measurement needs a CUDA device and there is none."""


def _require_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise NoGPUError("measuring ceilings needs a CUDA GPU; none is visible here (torch.cuda.is_available() is False)")


def measure_copy_bandwidth(nbytes: int = 2 * 2**30, *, max_seconds: float = 2.0) -> tuple[float, str]:
    """Device-to-device copy bandwidth in GB/s (read + write counted), and a description."""
    _require_gpu()
    import torch

    n = nbytes // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    # No graph capture: a memcpy captured into a CUDA graph may run on the copy engines, which
    # are far slower than the SM copy kernel a plain launch uses (measured on an H200: 2.8 vs
    # ~4.3 TB/s); the plain-launch overhead is negligible against a 2 GiB copy.
    timing = time_fn(lambda: dst.copy_(src), warmup=3, reps=50, max_seconds=max_seconds, flush_l2=False,
                     use_graph=False)
    gbs = 2 * src.numel() * src.element_size() / (timing.median_us * 1e-6) / 1e9
    del src, dst
    return gbs, f"D2D copy of {nbytes / 2**30:.1f} GiB, read+write counted, median of {timing.reps} ({timing.method})"


def measure_matmul_rate(n: int = 8192, *, max_seconds: float = 2.0) -> tuple[float, str]:
    """bf16 ``torch.matmul`` rate in TFLOP/s on n x n random matrices, and a description."""
    _require_gpu()
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
    timing = time_fn(lambda: torch.matmul(a, b, out=c), warmup=5, reps=50, max_seconds=max_seconds)
    tflops = 2 * n**3 / (timing.median_us * 1e-6) / 1e12
    del a, b, c
    return tflops, f"bf16 matmul {n}^3, random normal data, median of {timing.reps} ({timing.method})"


@functools.cache
def _stream_read_kernel():
    """The streaming-read kernel, compiled on first use (importing this module needs no triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
        """Program i sums blocks i, i + P, i + 2P, ... of x (P programs): reads every element once,
        writes one fp32 partial per program (so the reads cannot be dropped)."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        start = pid.to(tl.int64) * BLOCK                # int64: an 8 GiB buffer has > 2**31 elements
        step = programs.to(tl.int64) * BLOCK
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for _ in range(pid, tl.cdiv(n_elements, BLOCK), programs):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n_elements, other=0.0).to(tl.float32)
            start += step
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    return stream_read


def stream_read(x, programs: int, *, block_bytes: int = READ_BLOCK_BYTES, num_warps: int = READ_WARPS):
    """Read the 1-D tensor ``x`` once with ``programs`` persistent programs (one per SM when
    ``programs`` <= SMs); returns their fp32 partial sums [programs] (their sum is ``x.sum()``)."""
    import torch

    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous 1-D tensor, got shape {tuple(x.shape)}")
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    block = max(16, block_bytes // x.element_size())
    if block & (block - 1):
        raise ValueError(f"block_bytes / element size must be a power of two, got {block}")
    out = torch.empty(programs, dtype=torch.float32, device=x.device)
    _stream_read_kernel()[(programs,)](x, out, x.numel(), BLOCK=block, num_warps=num_warps)
    return out


#: the TMA read's ring: slots of :data:`TMA_BLOCK_ROWS` rows of :data:`TMA_ROW_ELEMENTS` bf16 (32 KB)
TMA_SLOTS = 4
TMA_BLOCK_ROWS = 256
TMA_ROW_ELEMENTS = 64
#: rows of each block the TMA read's consumer sums (its output; 8 = one swizzle group)
TMA_CHECK_ROWS = 8


@functools.cache
def _tma_read_kernel():
    """The TMA ring read (Gluon, sm_90), compiled on first use; None where triton has no Gluon."""
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    except ImportError:
        return None

    @gluon.jit
    def producer(desc, ring, ready, empty, out_ptr, n_blocks):
        slots: gl.constexpr = ring.shape[0]
        rows: gl.constexpr = ring.shape[1]
        c = 0
        for blk in range(gl.program_id(0), n_blocks, gl.num_programs(0)):
            slot = c % slots
            mbarrier.wait(empty.index(slot), ((c // slots) & 1) ^ 1, pred=c >= slots)
            mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
            tma.async_copy_global_to_shared(desc, [blk * rows, 0], ready.index(slot), ring.index(slot))
            c += 1

    @gluon.jit
    def consumer(desc, ring, ready, empty, out_ptr, n_blocks):
        """Waits for each block, sums its first :data:`TMA_CHECK_ROWS` rows (so a test can tell every
        block arrived; a slice of the 128-byte swizzle takes whole groups of 8 rows) and frees its slot."""
        slots: gl.constexpr = ring.shape[0]
        cols: gl.constexpr = ring.shape[2]
        check: gl.constexpr = 8
        row_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
        pid = gl.program_id(0)
        acc = gl.zeros([check, cols], gl.float32, row_l)
        for c in range(gl.cdiv(n_blocks - pid, gl.num_programs(0))):
            slot = c % slots
            mbarrier.wait(ready.index(slot), (c // slots) & 1)
            acc += ring.index(slot).slice(0, check, dim=0).load(row_l).to(gl.float32)
            mbarrier.arrive(empty.index(slot), count=1)
        gl.store(out_ptr + pid, gl.sum(gl.sum(acc, axis=1), axis=0))

    @gluon.jit
    def tma_read(desc, out_ptr, n_blocks, SLOTS: gl.constexpr):
        """Grid ``(programs,)``: program i streams blocks i, i + P, ... of ``desc``'s tensor."""
        rows: gl.constexpr = desc.block_type.shape[0]
        cols: gl.constexpr = desc.block_type.shape[1]
        ring = gl.allocate_shared_memory(desc.dtype, [SLOTS, rows, cols], desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()
        args = (desc, ring, ready, empty, out_ptr, n_blocks)
        gl.warp_specialize([(consumer, args), (producer, args)], [1], [24])

    return tma_read


def tma_read_available() -> bool:
    """Whether :func:`tma_stream_read` can run here: Gluon present and an sm_90 GPU."""
    import torch

    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and _tma_read_kernel() is not None)


def tma_stream_read(x, programs: int):
    """Read the 1-D bf16 tensor ``x`` (a multiple of 32 KB) once with ``programs`` persistent
    programs through a TMA ring; returns their fp32 sums [programs] of each block's first
    :data:`TMA_CHECK_ROWS` rows (their total is ``x.view(-1, 256, 64)[:, :8].sum()``; rows of
    128 B, the widest a 128-byte swizzle takes)."""
    import torch

    if not tma_read_available():
        raise NoGPUError("the TMA read needs triton's Gluon and an sm_90 GPU")
    block = TMA_BLOCK_ROWS * TMA_ROW_ELEMENTS
    if x.dim() != 1 or not x.is_contiguous() or x.dtype != torch.bfloat16 or x.numel() % block:
        raise ValueError(f"x must be a contiguous 1-D bf16 tensor of a multiple of {block} elements, got "
                         f"{x.dtype} {tuple(x.shape)}")
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = x.view(-1, TMA_ROW_ELEMENTS)
    box = [TMA_BLOCK_ROWS, TMA_ROW_ELEMENTS]
    desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), box,
                            gl.NVMMASharedLayout.get_default_for(box, gl.bfloat16))
    out = torch.empty(programs, dtype=torch.float32, device=x.device)
    _tma_read_kernel()[(programs,)](desc, out, rows.shape[0] // TMA_BLOCK_ROWS, SLOTS=TMA_SLOTS, num_warps=4)
    return out


def measure_read_by_sms(sm_counts=None, *, nbytes: int = 8 * 2**30, max_seconds: float = 1.0):
    """HBM read bandwidth from m SMs for each m of ``sm_counts`` (default :data:`READ_SMS` up to the
    device's SMs, and all of them): ``([(m, GB/s in all), ...], description)``. The buffer is
    ``nbytes`` (8 GiB, at most a quarter of the free memory); fewer than 16 SMs read a quarter of
    it (a call still lasts tens of ms). Each count keeps the higher of the plain read and, where
    :func:`tma_read_available`, the TMA ring read; the description gives both per count. Raises
    :class:`NoGPUError` without a GPU."""
    _require_gpu()
    import torch

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    counts = sorted({m for m in (sm_counts or READ_SMS) if 1 <= m <= sms} | ({sms} if sm_counts is None else set()))
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(min(nbytes, free // 4)) // READ_BLOCK_BYTES * READ_BLOCK_BYTES
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    readers = {"plain": stream_read}
    if tma_read_available():
        readers["TMA"] = tma_stream_read
    out, per_reader = [], {name: [] for name in readers}
    for m in counts:
        part = x if m >= 16 else x[: x.numel() // 4]
        for name, read in readers.items():
            timing = time_fn(lambda: read(part, m), warmup=2, reps=20, min_reps=3, max_seconds=max_seconds,
                             flush_l2=False, use_graph=False)
            per_reader[name].append(part.numel() * part.element_size() / (timing.median_us * 1e-6) / 1e9)
        out.append((m, max(gbs[-1] for gbs in per_reader.values())))
    del x
    detail = "; ".join(f"{name}: " + ", ".join(f"{m}: {g / m:,.0f}" for m, g in zip(counts, gbs))
                       for name, gbs in per_reader.items())
    how = (f"a plain Triton streaming read ({READ_WARPS} warps, {READ_BLOCK_BYTES // 1024} KB per iteration)"
           + (f" and TMA copies of {TMA_BLOCK_ROWS * TMA_ROW_ELEMENTS * 2 // 1024} KB through a {TMA_SLOTS}-slot "
              "shared-memory ring, the higher per count" if "TMA" in readers else ""))
    return out, (f"one persistent program per SM: {how}; {nbytes / 2**30:.1f} GiB buffer (a quarter below 16 SMs), "
                 f"median per SM count; GB/s per SM by count, {detail}")


def measure_ceilings(*, copy_bytes: int = 2 * 2**30, matmul_n: int = 8192) -> Ceilings:
    """Measure both ceilings of the current GPU (raises :class:`NoGPUError` without one).

    Returns the analysis' :class:`~mla_var3.analysis.devices.Ceilings` with ``kind="measured"``.
    """
    _require_gpu()
    gbs, copy_detail = measure_copy_bandwidth(copy_bytes)
    tflops, mm_detail = measure_matmul_rate(matmul_n)
    return Ceilings(flops_per_s=tflops * 1e12, bytes_per_s=gbs * 1e9, kind="measured",
                    source=f"measured in-process: {copy_detail}; {mm_detail}")


def device_entry(measured: Ceilings, *, base=None, name: str | None = None, memory_gb: float | None = None,
                 sms: int | None = None, read_by_sms: tuple[list, str] | None = None) -> dict:
    """A devices-file entry (the shape of ``conf/devices.json``) carrying ``measured`` ceilings.

    ``base`` (an :class:`~mla_var3.analysis.devices.Device`) supplies the datasheet fields; a
    device the table does not know gets the measured numbers as its peaks, said so in ``sources``.
    ``read_by_sms``: :func:`measure_read_by_sms`'s result, stored as the entry's ``read_by_sms``.
    """
    measured_block = {
        "bf16_tflops": round(measured.flops_per_s / 1e12, 1),
        "bandwidth_gbs": round(measured.bytes_per_s / 1e9, 1),
        "source": measured.source,
    }
    if base is not None:
        entry = {"name": base.name, "match": list(base.match), "bf16_tflops": base.bf16_tflops,
                 "bandwidth_gbs": base.bandwidth_gbs, "memory_gb": base.memory_gb, "sources": dict(base.sources)}
        for key in ("fp8_tflops", "sms", "l2_mb", "smem_per_sm_kb"):
            if getattr(base, key) is not None:
                entry[key] = getattr(base, key)
    else:
        if not name or not memory_gb:
            raise ValueError("a device unknown to the table needs name= and memory_gb=")
        entry = {"name": name, "match": [name.lower()], "bf16_tflops": measured_block["bf16_tflops"],
                 "bandwidth_gbs": measured_block["bandwidth_gbs"], "memory_gb": memory_gb,
                 "sources": {"bf16_tflops": "no datasheet entry: the measured rate", "bandwidth_gbs":
                             "no datasheet entry: the measured copy bandwidth"}}
        if sms:
            entry["sms"] = sms
    entry["measured"] = measured_block
    if read_by_sms is not None:
        points, detail = read_by_sms
        entry["read_by_sms"] = {"sms": [m for m, _ in points], "gbs": [round(g, 1) for _, g in points],
                                "source": f"measured in-process: {detail}"}
    elif base is not None and base.read_by_sms:
        entry["read_by_sms"] = base.read_by_sms_block()
    if base is not None and base.window_by_sms:
        entry["window_by_sms"] = base.window_by_sms_block()
    return entry


def write_user_device(path, key: str, entry: dict) -> None:
    """Add or replace device ``key`` in the user devices file at ``path`` (created if missing),
    atomically; other devices in the file are kept. Raises ValueError for a file that is not a
    JSON object."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from mla_var3._io import load_json

    path = Path(path)
    data: dict = {}
    if os.path.lexists(path):
        try:
            data = load_json(path, "devices file")
        except ValueError as exc:
            raise ValueError(f"{exc}; not overwriting it") from None
    data[key] = entry
    payload = json.dumps(data, indent=1, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".devices-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

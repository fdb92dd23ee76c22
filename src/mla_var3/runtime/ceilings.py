"""Measured ceilings of the current GPU: copy bandwidth and bf16 matmul rate.

Both are measured in the same process with :func:`mla_var3.runtime.timing.time_fn`:

* **copy bandwidth** — ``dst.copy_(src)`` of a large device buffer (default 2 GiB); the bytes
  counted are read + write (2 x size). This is the bandwidth a streaming kernel can reach,
  below the datasheet's number.
* **bf16 matmul rate** — ``torch.matmul`` of two 8192 x 8192 bf16 matrices of random normal
  values (2·n³ FLOPs). Random data matters: zeros let the GPU lower its clock less.

* **HBM read bandwidth by SM count** — a plain Triton streaming read, one persistent program per
  SM on m SMs (grid = m programs; 32 warps, 32 KB per iteration, program i reading blocks i,
  i + m, ...), over a large buffer (8 GiB by default): what m SMs can pull from HBM. A kernel
  confined to part of the GPU (the hybrid's window on an SM partition) is bounded by this curve,
  not by the copy rate shared by all SMs (``read_by_sms`` in ``conf/devices.json``).

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


def measure_read_by_sms(sm_counts=None, *, nbytes: int = 8 * 2**30, max_seconds: float = 1.0):
    """HBM read bandwidth from m SMs for each m of ``sm_counts`` (default :data:`READ_SMS` up to the
    device's SMs, and all of them): ``([(m, GB/s in all), ...], description)``. The buffer is
    ``nbytes`` (8 GiB, at most a quarter of the free memory); fewer than 16 SMs read a quarter of
    it (a call still lasts tens of ms). Raises :class:`NoGPUError` without a GPU."""
    _require_gpu()
    import torch

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    counts = sorted({m for m in (sm_counts or READ_SMS) if 1 <= m <= sms} | ({sms} if sm_counts is None else set()))
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(min(nbytes, free // 4)) // READ_BLOCK_BYTES * READ_BLOCK_BYTES
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    out = []
    for m in counts:
        part = x if m >= 16 else x[: x.numel() // 4]
        timing = time_fn(lambda: stream_read(part, m), warmup=2, reps=20, min_reps=3, max_seconds=max_seconds,
                         flush_l2=False, use_graph=False)
        out.append((m, part.numel() * part.element_size() / (timing.median_us * 1e-6) / 1e9))
    del x
    return out, (f"Triton streaming read, one persistent program per SM ({READ_WARPS} warps, "
                 f"{READ_BLOCK_BYTES // 1024} KB per iteration), {nbytes / 2**30:.1f} GiB buffer (a quarter below "
                 "16 SMs), median per SM count")


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

"""Per-head batched GEMMs around the absorbed designs: query absorption and output decompression.

Both are ``y[b, h, s, :] = x[b, h, s, :] @ w[h] (+ add[b, h, s, :])`` with one weight matrix per
head; one kernel serves both:

================  ==========================  ===============  ==========================
entry point       x                           w                y
================  ==========================  ===============  ==========================
absorb_query      q_nope [B, H, S, D]         w_uk [H, D, K]   qc [B, H, S, K]
decompress        o_latent [B, H, S, K]       w_uv [H, K, D]   o [B, H, S, D] (+ o given)
================  ==========================  ===============  ==========================

A program computes a ``BLOCK_M x BLOCK_N`` tile of one head's output, its rows running over the
flattened (b, s) pairs of that head (so a weight tile is reused by all of them), accumulating in
float32 over the reduction dim in ``BLOCK_K`` steps; the result is stored in the input dtype.

Example
-------
>>> qc = absorb_query(q_nope, w_uk)                  # doctest: +SKIP
>>> out = decompress(o_latent, w_uv, o)              # the hybrid's final output  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mla_var3.kernel import backends
from mla_var3.kernel._common import allowed_dtypes, bind_output, bind_shape, cdiv, check_device, check_inference, interpreting, next_pow2
from mla_var3.kernel._jit import operand, to_storage
from mla_var3.kernel.expanded import arg_types, named_strides

__all__ = ["GemmConfig", "default_config", "candidate_configs", "example_launch", "absorb_query", "decompress"]


@triton.jit
def _head_gemm_kernel(
    x_ptr, w_ptr, add_ptr, y_ptr,
    S, M, KIN, NOUT,
    stride_xb, stride_xh, stride_xs, stride_xk,
    stride_wh, stride_wk, stride_wn,
    stride_ab, stride_ah, stride_as, stride_an,
    stride_yb, stride_yh, stride_ys, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_ADD: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """Grid (cdiv(B*S, BLOCK_M), cdiv(NOUT, BLOCK_N), H). Reads BLOCK_M*KIN + KIN*BLOCK_N
    (+ BLOCK_M*BLOCK_N) elements, writes BLOCK_M*BLOCK_N; 2*BLOCK_M*BLOCK_N*KIN FLOPs."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    h = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < NOUT
    rb = (rows // S).to(tl.int64)
    rs = (rows % S).to(tl.int64)
    x_rows = x_ptr + h * stride_xh + rb * stride_xb + rs * stride_xs
    w_base = w_ptr + h * stride_wh
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, KIN, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < KIN
        x = tl.load(x_rows[:, None] + kk[None, :] * stride_xk, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + kk[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(operand(x, UPCAST), operand(w, UPCAST), acc, input_precision=PRECISION)
    mask = row_ok[:, None] & col_ok[None, :]
    if HAS_ADD:
        a_ptrs = add_ptr + h * stride_ah + (rb * stride_ab + rs * stride_as)[:, None] + cols[None, :] * stride_an
        acc += tl.load(a_ptrs, mask=mask, other=0.0).to(tl.float32)
    y_ptrs = y_ptr + h * stride_yh + (rb * stride_yb + rs * stride_ys)[:, None] + cols[None, :] * stride_yn
    tl.store(y_ptrs, to_storage(acc, y_ptr.dtype.element_ty, UPCAST), mask=mask)


@dataclass(frozen=True)
class GemmConfig:
    """Launch config of the per-head GEMM: output tile ``block_m x block_n``, reduction step
    ``block_k`` (each a power of two >= 16), Triton's num_warps / num_stages."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two >= 16, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"GemmConfig: bad num_warps/num_stages in {self}")


def default_config(rows: int, kin: int, nout: int) -> GemmConfig:
    """Analytic default for ``rows = B*S`` rows per head: 16-row tiles for decode, up to 128
    for prefill; output tiles up to 128 wide; 8 warps for 128 x 128 tiles."""
    block_m = min(128, max(16, next_pow2(rows)))
    block_n = min(128, max(16, next_pow2(nout)))
    block_k = min(64, max(16, next_pow2(kin)))
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    return GemmConfig(block_m, block_n, block_k, warps, 3)


def candidate_configs(rows: int, kin: int, nout: int) -> tuple[GemmConfig, ...]:
    """The autotuning space around :func:`default_config`."""
    base = default_config(rows, kin, nout)
    out = {base}
    for bm in sorted({base.block_m, min(base.block_m, 64)}):
        for bn in (64, 128):
            for bk in (32, 64, 128):
                for warps in (4, 8):
                    for stages in (2, 3, 4):
                        out.add(GemmConfig(bm, bn, bk, warps, stages))
    return tuple(sorted(out, key=lambda c: (c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages)))


def _validate(x, w, add, out, names: tuple[str, str, str], x_spec: str, w_spec: str, y_spec: str) -> torch.Tensor:
    """Check shapes/dtypes/devices; returns the output buffer (allocated when ``out`` is None)."""
    x_name, w_name, add_name = names
    check_inference(x, w, add)
    sizes: dict[str, int] = {}
    bind_shape(x_name, x, x_spec, sizes)
    check_device(x_name, x)
    dev = x.device
    bind_shape(x_name, x, x_spec, sizes, dtypes=allowed_dtypes(dev))
    bind_shape(w_name, w, w_spec, sizes, dtypes=(x.dtype,), device=dev)
    if add is not None:
        bind_shape(add_name, add, y_spec, sizes, dtypes=(x.dtype,), device=dev)
    shape = tuple(sizes[sym] for sym in y_spec.split())
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=dev)
    bind_output("out", out, y_spec, dict(sizes), dtypes=(x.dtype,), device=dev)
    return out


def _gemm_args(x, w, add, out, config: GemmConfig, upcast: bool) -> tuple[tuple, dict]:
    b, h, s, kin = x.shape
    nout = w.shape[-1]
    a = add if add is not None else out
    args = dict(
        x_ptr=x, w_ptr=w, add_ptr=a, y_ptr=out, S=s, M=b * s, KIN=kin, NOUT=nout,
        **named_strides("stride_xb stride_xh stride_xs stride_xk", x.stride()),
        **named_strides("stride_wh stride_wk stride_wn", w.stride()),
        **named_strides("stride_ab stride_ah stride_as stride_an", a.stride()),
        **named_strides("stride_yb stride_yh stride_ys stride_yn", out.stride()),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        HAS_ADD=add is not None, UPCAST=upcast, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
    )
    return (cdiv(b * s, config.block_m), cdiv(nout, config.block_n), h), args


def _head_gemm_triton(x, w, add, *, config: GemmConfig | None, out: torch.Tensor) -> torch.Tensor:
    """The portable Triton backend of both GEMMs (inputs validated, ``out`` allocated)."""
    b, h, s, kin = x.shape
    nout = w.shape[-1]
    if b * h * s * nout == 0:
        return out
    if kin == 0:
        return out.copy_(add) if add is not None else out.zero_()
    config = config or default_config(b * s, kin, nout)
    grid, args = _gemm_args(x, w, add, out, config, interpreting())
    _head_gemm_kernel[grid](**args, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def _decompress_triton(o_latent, w_uv, o, *, config, out):
    return _head_gemm_triton(o_latent, w_uv, o, config=config, out=out)


def _absorb_query_triton(q_nope, w_uk, *, config, out):
    return _head_gemm_triton(q_nope, w_uk, None, config=config, out=out)


backends.register("decompress", "triton", _decompress_triton)
backends.register("absorb_query", "triton", _absorb_query_triton)


def example_launch(b: int, h: int, s: int, kin: int, nout: int, *, add: bool = False,
                   dtype: torch.dtype = torch.bfloat16, config: GemmConfig | None = None) -> tuple[dict, GemmConfig]:
    """GPU launch arguments (contiguous inputs, pointers as type strings) of the per-head GEMM
    ``[B,H,S,kin] x [H,kin,nout]`` and the config used, for
    :func:`mla_var3.kernel.sass.compile_launch_in_subprocess`."""
    config = config or default_config(b * s, kin, nout)
    meta = dict(dtype=dtype, device="meta")
    out = torch.empty(b, h, s, nout, **meta)
    _, args = _gemm_args(torch.empty(b, h, s, kin, **meta), torch.empty(h, kin, nout, **meta),
                         torch.empty(b, h, s, nout, **meta) if add else None, out, config, False)
    return arg_types(args), config


def decompress(o_latent: torch.Tensor, w_uv: torch.Tensor, o: torch.Tensor | None = None, *,
               config: GemmConfig | None = None, out: torch.Tensor | None = None,
               backend: str = "auto") -> torch.Tensor:
    """Output decompression ``o_latent[b,h,s] @ w_uv[h] (+ o[b,h,s])``.

    o_latent [B, H, S, K], w_uv [H, K, D] (same dtype), o [B, H, S, D] optional (same dtype,
    added in float32 before the one rounding) -> [B, H, S, D] in o_latent's dtype. Any strides.
    ``out`` may alias ``o`` (each element is read before it is written by the same program).
    ``backend``: ``"auto"`` or a registered name (see :mod:`mla_var3.kernel.backends`).
    """
    out = _validate(o_latent, w_uv, o, out, ("o_latent", "w_uv", "o"), "B H S K", "H K D", "B H S D")
    run = backends.select("decompress", o_latent.device, backend)
    return run(o_latent, w_uv, o, config=config, out=out)


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor, *, config: GemmConfig | None = None,
                 out: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """Query absorption ``q_nope[b,h,s] @ w_uk[h]``: q_nope [B, H, S, D], w_uk [H, D, K] (same
    dtype) -> qc [B, H, S, K] in q_nope's dtype. Any strides. ``backend`` as in :func:`decompress`."""
    out = _validate(q_nope, w_uk, None, out, ("q_nope", "w_uk", ""), "B H S D", "H D K", "B H S K")
    run = backends.select("absorb_query", q_nope.device, backend)
    return run(q_nope, w_uk, config=config, out=out)

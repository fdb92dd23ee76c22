"""Compile the kernels' GPU path for the H200 (sm_90) on any machine, GPU or not.

The interpreter does not catch what fails or slows down on a GPU: ``tl.dot`` layout and shape
errors, register spills, shared memory over the 227 KB limit, a matmul that misses the
warpgroup MMA (HGMMA) units. Each entry below is compiled as the launcher would launch it for a
realistic problem (bf16, UPCAST=False, the launcher's default config), in a subprocess with the
interpreter off (:mod:`mla_var3.kernel.sass`), and the compiler's report is printed.

To add a kernel: append a ``Kernel(...)`` to ``KERNELS`` with a factory that returns the launch
arguments (pointers as ``"*bf16"`` strings, ints, floats, constexprs; see
``sass.launch_signature``) and the launch options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mla_var3.kernel._common import SMEM_LIMIT
from mla_var3.kernel.sass import compile_launch_in_subprocess


@dataclass(frozen=True)
class Kernel:
    """One kernel launch to compile.

    factory() -> (args, num_warps, num_stages); hgmma: whether the SASS must use HGMMA.
    """

    id: str
    module: str
    kernel: str
    factory: Callable[[], tuple[dict, int, int]]
    hgmma: bool = True


def _flash_mla(b: int, s: int, paged: bool = False):
    from mla_var3.kernel.absorbed import example_launch

    args, cfg = example_launch(b, 128, s, 4096, 512, 64, causal=s > 1, paged=paged)
    return args, cfg.num_warps, cfg.num_stages


def _combine(rows: int, splits: int, v: int):
    from mla_var3.kernel.combine import _TARGET_PROGRAMS, _plain_tiles

    with _on_gpu():
        block_r, block_v, chunk = _plain_tiles(rows, splits, v)
    args = dict(o_part_ptr="*fp32", lse_part_ptr="*fp32", out_ptr="*bf16", lse_out_ptr="*fp32",
                M=rows, NS=splits, V=v, stride_pm=splits * v, stride_ps=v, stride_pv=1, stride_lm=splits,
                stride_ls=1, stride_om=v, stride_ov=1, stride_lo=1, BLOCK_R=block_r, BLOCK_V=block_v,
                WRITE_LSE=True, CHUNK=chunk)
    assert rows // block_r * v // block_v >= _TARGET_PROGRAMS or block_v == 32
    return args, 4, 2


def _combine_planned(b: int, rows: int, v: int):
    """The planned combine at ``b`` sequences of ``rows`` rows, its tiles as the launcher picks
    them on a GPU (b = 1: 8 rows x 32 columns, 16 splits a step; b = 32: 16 x 128, 2 a step)."""
    from mla_var3.kernel.combine import _tiles

    with _on_gpu():
        block_r, block_v, chunk = _tiles(b, rows, v)
    args = dict(o_part_ptr="*fp32", lse_part_ptr="*fp32", seqs_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32",
                ROWS=rows, S=1, H=rows, V=v, stride_ob=rows * v, stride_oh=v, stride_os=v, stride_ov=1,
                stride_lb=rows, stride_lh=1, stride_ls=1, HEAD_MAJOR=True, BLOCK_R=block_r, BLOCK_V=block_v,
                PDL=True, CHUNK=chunk)
    return args, 4, 2


def _on_gpu():
    """The launchers' GPU choices, here where the interpreter may be on."""
    from unittest import mock

    return mock.patch("mla_var3.kernel.combine.interpreting", return_value=False)


KERNELS = [
    Kernel("flash_mla-b32-s1", "mla_var3.kernel.absorbed", "_flash_mla_kernel", lambda: _flash_mla(32, 1)),
    Kernel("flash_mla-b32-s16", "mla_var3.kernel.absorbed", "_flash_mla_kernel", lambda: _flash_mla(32, 16)),
    Kernel("flash_mla_paged-b32-s1", "mla_var3.kernel.absorbed", "_flash_mla_kernel",
           lambda: _flash_mla(32, 1, paged=True)),
    Kernel("combine-v512", "mla_var3.kernel.combine", "_combine_kernel", lambda: _combine(32 * 128, 2, 512),
           hgmma=False),
    Kernel("combine-v512-ns64", "mla_var3.kernel.combine", "_combine_kernel", lambda: _combine(128, 64, 512),
           hgmma=False),
    Kernel("combine_planned-b1", "mla_var3.kernel.combine", "_combine_planned_kernel",
           lambda: _combine_planned(1, 128, 512), hgmma=False),
    Kernel("combine_planned-b32", "mla_var3.kernel.combine", "_combine_planned_kernel",
           lambda: _combine_planned(32, 128, 512), hgmma=False),
]


def _flash_attention(b: int, s: int, ragged: bool = False):
    from mla_var3.kernel.expanded import example_launch

    args, cfg = example_launch(b, 128, s, 4096, 128, 64, causal=s > 1, ragged=ragged)
    return args, cfg.num_warps, cfg.num_stages


def _mla_var6_plus(part: str, b: int, s: int, n: int):
    from mla_var3.kernel.hybrid import example_launch

    args, opts = example_launch(part, b, 128, s, 4096 - n, n, 128, 64, 512, causal=s > 1)
    return args, opts["num_warps"], opts["num_stages"]


def _gemm(b: int, s: int, kin: int, nout: int, add: bool):
    from mla_var3.kernel.gemm import example_launch

    args, cfg = example_launch(b, 128, s, kin, nout, add=add)
    return args, cfg.num_warps, cfg.num_stages


# Decode tiles (16 rows) and the hybrid's 32-row latent groups run on mma.sync, not HGMMA.
KERNELS += [
    Kernel("flash_attention-b32-s1", "mla_var3.kernel.expanded", "_flash_attention_kernel",
           lambda: _flash_attention(32, 1), hgmma=False),
    Kernel("flash_attention-b4-s1024", "mla_var3.kernel.expanded", "_flash_attention_kernel",
           lambda: _flash_attention(4, 1024, ragged=True)),
    Kernel("mla_var6_plus-latent-b32-s16", "mla_var3.kernel.hybrid", "_latent_part_kernel",
           lambda: _mla_var6_plus("latent", 32, 16, 1250), hgmma=False),
    Kernel("mla_var6_plus-merge-b32-s16", "mla_var3.kernel.hybrid", "_merge_kernel",
           lambda: _mla_var6_plus("merge", 32, 16, 1250), hgmma=False),
    Kernel("decompress-b32-s16", "mla_var3.kernel.gemm", "_head_gemm_kernel", lambda: _gemm(32, 16, 512, 128, True)),
    Kernel("absorb_query-b32-s1", "mla_var3.kernel.gemm", "_head_gemm_kernel", lambda: _gemm(32, 1, 128, 512, False),
           hgmma=False),
]


@pytest.mark.parametrize("spec", KERNELS, ids=[k.id for k in KERNELS])
def test_compiles_for_sm90(spec: Kernel, capsys):
    args, num_warps, num_stages = spec.factory()
    rep = compile_launch_in_subprocess(spec.module, spec.kernel, args, num_warps=num_warps, num_stages=num_stages)
    with capsys.disabled():
        print(f"\n  [{spec.id}] {rep.summary()}")
    assert rep.registers > 0
    assert rep.spills == 0, f"{spec.id}: register spills {rep.spill_stores}/{rep.spill_loads} bytes"
    assert rep.shared_bytes <= SMEM_LIMIT, f"{spec.id}: {rep.shared_bytes} bytes of shared memory > {SMEM_LIMIT}"
    if spec.hgmma:
        assert rep.hgmma, f"{spec.id}: no HGMMA in the SASS (the matmuls miss the warpgroup MMA units)"


def _programs_per_sm(registers: int, shared_bytes: int, num_warps: int) -> int:
    """Programs of one launch that fit on an sm_90 SM: registers (64 K per SM, allocated per warp
    in 256-register units) and shared memory (228 KiB per SM, 1 KiB reserved per program)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = (65536 // per_warp) // num_warps
    by_smem = 233_472 // (shared_bytes + 1024) if shared_bytes else by_regs
    return min(by_regs, by_smem, 32)


@pytest.mark.parametrize("s", [1, 32, 64, 1024])
def test_the_expanded_law_knows_how_many_programs_fit_an_sm(s):
    """``kernel_laws.PORTABLE_EXPANDED_PROGRAMS_PER_SM`` (the expanded law's wave size) is what the
    sm_90 build of the portable kernel's default config allows."""
    from mla_var3.analysis.kernel_laws import PORTABLE_EXPANDED_PROGRAMS_PER_SM

    args, num_warps, num_stages = _flash_attention(32, s, ragged=s > 128)
    rep = compile_launch_in_subprocess("mla_var3.kernel.expanded", "_flash_attention_kernel", args,
                                       num_warps=num_warps, num_stages=num_stages)
    assert _programs_per_sm(rep.registers, rep.shared_bytes, num_warps) == PORTABLE_EXPANDED_PROGRAMS_PER_SM[
        args["BLOCK_M"]], (s, rep.summary())

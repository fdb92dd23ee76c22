"""The hybrid window's rows form (``kernel/hopper/window_rows_gluon.py``): query rows as the
wgmma's M side, Q and P in registers, two independent pipelines per program.

On any machine: it compiles for sm_90 (HGMMA of the expected shapes and counts, register A
operands, no spills at the default block, shared memory as :func:`smem_bytes` says) and its host
side decides and validates. On a Hopper GPU: against the fp32 reference with the output
NaN-poisoned, on s = 64, 33 and 1, ragged N, N = s (one block), not causal, an odd number of
items per program (the second pipeline idle at the end), more programs than items, both block
sizes, an ``out`` whose rows are not contiguous, and a running max that moves across blocks; each
with one and with two ring blocks per softmax step (two: an odd block count reads one block past
N, zero-filled and masked), and with the keys and values on one barrier per slot or their own
(``split``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

wr = pytest.importorskip("mla_var3.kernel.hopper.window_rows_gluon")
if not wr.GLUON_AVAILABLE:
    pytest.skip(f"triton.experimental.gluon unavailable: {wr.GLUON_IMPORT_ERROR}", allow_module_level=True)

import triton  # noqa: E402

from mla_var3 import reference as R  # noqa: E402
from mla_var3.kernel._common import SMEM_LIMIT  # noqa: E402
from mla_var3.kernel.sass import compile_gluon_builds  # noqa: E402
from mla_var3.testing import LSE_TOLERANCE, assert_close, poisoned  # noqa: E402

D, P = 128, 64
_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
COMPILE_VARIANTS = [dict(block_n=32, stages=4, dtype="bf16", causal=True),
                    dict(block_n=32, stages=4, dtype="fp16", causal=False),
                    dict(block_n=64, stages=2, dtype="bf16", causal=True),
                    dict(block_n=32, stages=4, dtype="bf16", causal=True, step=2),
                    dict(block_n=32, stages=4, dtype="bf16", causal=True, step=2, split=True),
                    dict(block_n=32, stages=4, dtype="fp16", causal=False, step=1, split=True)]


@pytest.fixture(scope="module")
def builds():
    if not _CUOBJDUMP.exists():
        pytest.skip(f"cuobjdump not shipped with this triton ({_CUOBJDUMP})")
    return compile_gluon_builds("mla_var3.kernel.hopper.window_rows_gluon", COMPILE_VARIANTS, timeout=600)


@pytest.mark.parametrize("idx", range(len(COMPILE_VARIANTS)),
                         ids=["-".join(f"{k}={x}" for k, x in v.items()) for v in COMPILE_VARIANTS])
def test_compiles_rows_on_m_with_register_operands(builds, idx):
    variant, build = COMPILE_VARIANTS[idx], builds[idx]
    bn, step = variant["block_n"], variant.get("step", 1)
    # per consumer, twice (step 0 before the loop, the loop), once per block of a step: S = Q . K^T
    # over D + P in k16 steps, 64 rows x bn keys; O += P . V: 64 rows x D over bn keys, in the loop
    # and after it
    # and the row sums P . 1 beside it (64 rows x 8 columns of ones over bn keys)
    assert build.hgmma == {f"64x{bn}x16": 2 * 2 * step * (D + P) // 16,
                           f"64x{D}x16": 2 * 2 * step * bn // 16, "64x8x16": 2 * 2 * step * bn // 16}, build.hgmma
    # both products take their A operand from registers: no A descriptor on any HGMMA
    assert all(line.count("gdesc") == 1 for line in build.sass.splitlines() if "HGMMA." in line)
    assert "setmaxnreg.dec" in build.ptx and "setmaxnreg.inc" in build.ptx
    # no wgmma serialised by ptxas (it would follow every HGMMA with its own WARPGROUP.DEPBAR):
    # per consumer, block 0's score wait, the loop's two waits and the last output product's
    assert build.sass.count("WARPGROUP.DEPBAR") == 2 * 4, build.sass.count("WARPGROUP.DEPBAR")
    if bn == wr.DEFAULT_BLOCK_N:
        assert build.stack_bytes == 0, f"spills: {build.stack_bytes} B per thread"
    assert 0 <= build.shared_bytes - wr.smem_bytes(D, P, bn, variant["stages"]) <= 1024, build.shared_bytes
    assert build.shared_bytes <= SMEM_LIMIT


def _inputs(b, h, s, n, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    return randn(b, h, s, D), randn(b, h, s, P), randn(b, n, h, D), randn(b, n, h, D), randn(b, n, P)


def test_applies():
    assert wr.rows_applies(*_inputs(1, 2, 64, 100), True)
    assert wr.rows_applies(*_inputs(1, 2, 1, 100), True)
    assert not wr.rows_applies(*_inputs(1, 2, 65, 100), True)                # S > 64 rows
    assert not wr.rows_applies(*_inputs(1, 2, 64, 40), True)                 # causal N < S
    assert wr.rows_applies(*_inputs(1, 2, 64, 100), True, step=2)
    assert not wr.rows_applies(*_inputs(1, 2, 64, 100), True, step=3)
    assert not wr.rows_applies(*_inputs(1, 2, 64, 100), True, block_n=64, stages=2, step=2)   # spills
    assert not wr.rows_applies(*_inputs(1, 2, 64, 100), True, stages=1, step=2)              # a step's slots
    assert not wr.rows_applies(*_inputs(1, 2, 64, 100), True, stages=3, step=2)              # pairs of slots
    assert wr.rows_applies(*_inputs(1, 2, 64, 40), False)
    assert not wr.rows_applies(*(t.float() for t in _inputs(1, 2, 8, 100)), True)
    assert not wr.rows_applies(*_inputs(1, 2, 8, 100), True, block_n=16)
    assert not wr.rows_applies(*_inputs(1, 2, 8, 100), True, stages=8)       # 8 x 20 KiB per consumer: too much
    assert wr.smem_bytes(D, P) == (2 * (64 * 192 + 4 * 32 * 320) + 32 * 8) * 2


def test_launcher_rejects_cpu_tensors_and_bad_arguments():
    x = _inputs(1, 2, 40, 80)
    with pytest.raises(ValueError, match="CUDA"):
        wr.window_rows_gluon(*x, scale=0.1, programs=4)
    if HOPPER:
        xc = [t.cuda() for t in x]
        with pytest.raises(ValueError, match="programs"):
            wr.window_rows_gluon(*xc, scale=0.1, programs=0)
        with pytest.raises(ValueError, match="rows_applies"):
            wr.window_rows_gluon(*xc, scale=0.1, programs=4, block_n=48)
        with pytest.raises(ValueError, match="step"):
            wr.window_rows_gluon(*xc, scale=0.1, programs=4, step=3)
        with pytest.raises(ValueError, match="shapes"):
            wr.window_rows_gluon(xc[0], xc[1], xc[2][:, :70], xc[3], xc[4], scale=0.1, programs=4)


# (b, h, s, n, causal, programs, (block_n, stages))
SHAPES = [
    (2, 8, 64, 1344, True, 3, (32, 4)),     # s = 64 (no padding), each program walks ~5 items
    (2, 8, 33, 517, True, 5, (32, 4)),      # ragged s and N
    (1, 8, 1, 130, True, 2, (32, 4)),       # s = 1: 63 padding rows
    (2, 4, 64, 64, True, 4, (32, 4)),       # N = s: two blocks, the first unmasked only for the last row
    (1, 4, 16, 20, True, 2, (32, 4)),       # one block (a two-block step reads a zero-filled second)
    (2, 4, 48, 300, False, 6, (32, 4)),     # not causal: only the tail block masked
    (1, 6, 64, 700, True, 3, (32, 4)),      # 6 items on 3 programs: one item per pipeline
    (1, 7, 40, 400, True, 2, (32, 4)),      # 7 items on 2 programs: the second pipeline idle at the end
    (1, 8, 64, 1000, True, 40, (32, 4)),    # more programs asked than items
    (2, 8, 64, 900, True, 3, (64, 2)),      # 64-key blocks
]


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda sh: "b{}-h{}-s{}-n{}-c{:d}-m{}-bn{}x{}".format(*sh[:6], *sh[6]))
@pytest.mark.parametrize("step", wr.STEPS)
@pytest.mark.parametrize("split", [False, True], ids=["one-barrier", "split"])
def test_matches_reference(shape, step, split):
    b, h, s, n, causal, programs, (bn, stages) = shape
    if step == 2 and bn != 32:
        pytest.skip("two-block steps are built for 32-key blocks")
    dtype = torch.bfloat16 if bn == 32 else torch.float16
    q, qpe, k, v, kpe = _inputs(b, h, s, n, dtype, "cuda", seed=n)
    out = poisoned((b, h, s, D), dtype, "cuda")
    scale = (D + P) ** -0.5
    o, lse = wr.window_rows_gluon(q, qpe, k, v, kpe, scale=scale, causal=causal, programs=programs, block_n=bn,
                                  stages=stages, step=step, split=split, out=out)
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, causal, None)
    assert o is out
    assert_close(o, ref_o, dtype, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_an_out_with_strided_rows_is_written_through_a_copy():
    q, qpe, k, v, kpe = _inputs(1, 4, 64, 200, torch.bfloat16, "cuda", seed=5)
    out = poisoned((1, 4, 64, 2 * D), torch.bfloat16, "cuda")[..., ::2]
    scale = (D + P) ** -0.5
    o, lse = wr.window_rows_gluon(q, qpe, k, v, kpe, scale=scale, causal=True, programs=2, out=out)
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, True, None)
    assert o is out
    assert_close(o, ref_o, torch.bfloat16, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[torch.bfloat16], name="lse")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("step", wr.STEPS)
@pytest.mark.parametrize("split", [False, True], ids=["one-barrier", "split"])
@pytest.mark.parametrize("rising", [True, False], ids=["max-rises", "max-falls"])
def test_running_max_moving_across_blocks(rising, step, split):
    """Keys scaled by a ramp (0.05 to 6): the max rises block after block (every step rescales
    the output) or falls."""
    b, h, s, n = 1, 4, 64, 700
    q, qpe, k, v, kpe = _inputs(b, h, s, n, torch.bfloat16, "cuda", seed=7)
    ramp = torch.linspace(0.05, 6.0, n, device="cuda")
    ramp = ramp if rising else ramp.flip(0)
    k = (k.float() * ramp[None, :, None, None]).to(torch.bfloat16)
    kpe = (kpe.float() * ramp[None, :, None]).to(torch.bfloat16)
    out = poisoned((b, h, s, D), torch.bfloat16, "cuda")
    scale = (D + P) ** -0.5
    o, lse = wr.window_rows_gluon(q, qpe, k, v, kpe, scale=scale, causal=True, programs=2, step=step, split=split,
                                  out=out)
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, True, None)
    assert_close(o, ref_o, torch.bfloat16, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[torch.bfloat16], name="lse")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_calls_that_differ_in_what_triton_specialises_on_each_run_their_kernel():
    """One shape called causal and not, with window lengths that are and are not multiples of 16,
    and with an output offset by one element: each call must run a kernel compiled for it (the
    launch key carries the constexprs and Triton's integer and alignment classes)."""
    scale = (D + P) ** -0.5
    for causal, n, offset in ((False, 160, 0), (True, 160, 0), (True, 161, 0), (False, 161, 1), (True, 160, 1)):
        q, qpe, k, v, kpe = _inputs(2, 4, 48, n, torch.bfloat16, "cuda", seed=n)
        flat = poisoned((2 * 4 * 48 * D + offset,), torch.bfloat16, "cuda")
        out = flat[offset:].view(2, 4, 48, D)
        o, lse = wr.window_rows_gluon(q, qpe, k, v, kpe, scale=scale, causal=causal, programs=3, out=out)
        ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, causal, None)
        what = f"causal={causal}, n={n}, offset={offset}"
        assert_close(o, ref_o, torch.bfloat16, name=f"o ({what})")
        assert_close(lse, ref_lse, tol=LSE_TOLERANCE[torch.bfloat16], name=f"lse ({what})")

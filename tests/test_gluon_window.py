"""The hybrid's Gluon window kernel (``kernel/hopper/window_gluon.py``).

On any machine: it compiles for sm_90 (swap-AB wgmma of the expected shapes and counts, no
stack, warp-specialised, shared memory as :func:`smem_bytes` says) and its host side decides
and validates (``window_applies``, ``choose_block``, errors on CPU tensors). On a Hopper GPU:
every ring shape against the fp32 reference on the edge shapes of its tiling — s = 1, ragged s
and N, N = s (one block, the second consumer idle), not causal, s = 32 / 64, few programs each
walking many items — with the output NaN-poisoned, its flat launch against Triton's own, and
the hybrid that runs it as its persistent expanded part against the hybrid's reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

wg = pytest.importorskip("mla_var3.kernel.hopper.window_gluon")
if not wg.GLUON_AVAILABLE:
    pytest.skip(f"triton.experimental.gluon unavailable: {wg.GLUON_IMPORT_ERROR}", allow_module_level=True)

import triton  # noqa: E402

from mla_var3 import reference as R  # noqa: E402
from mla_var3.kernel._common import SMEM_LIMIT  # noqa: E402
from mla_var3.kernel.sass import compile_gluon_in_subprocess  # noqa: E402
from mla_var3.testing import LSE_TOLERANCE, TOLERANCE, assert_close, rel_err  # noqa: E402

D, P = 128, 64
_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9

COMPILE_VARIANTS = [dict(s=16, block_n=64, stages=2, dtype="bf16", causal=True),
                    dict(s=5, block_n=64, stages=1, dtype="fp16", causal=False)]


@pytest.mark.parametrize("variant", COMPILE_VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_compiles_swap_ab_without_spills(variant):
    if not _CUOBJDUMP.exists():
        pytest.skip(f"cuobjdump not shipped with this triton ({_CUOBJDUMP})")
    build = compile_gluon_in_subprocess("mla_var3.kernel.hopper.window_gluon", **variant)
    bn, sp = variant["block_n"], max(16, variant["s"])
    # per consumer: S^T = K . Q^T, BLOCK_N / 64 tiles over D + P (k16 steps); O^T = V^T . P^T,
    # D / 64 tiles over BLOCK_N keys -- all with the query tokens (padded to 16) as N
    per_consumer = (bn // 64) * (D + P) // 16 + (D // 64) * bn // 16
    assert build.hgmma == {f"64x{sp}x16": 2 * per_consumer}, build.hgmma
    assert "setmaxnreg.dec" in build.ptx and "setmaxnreg.inc" in build.ptx
    assert build.stack_bytes == 0, f"spills: {build.stack_bytes} B per thread"
    assert build.shared_bytes <= SMEM_LIMIT
    assert 0 <= build.shared_bytes - wg.smem_bytes(variant["s"], D, P, bn, variant["stages"]) <= 1024, build.shared_bytes


def _inputs(b, h, s, n, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    return randn(b, h, s, D), randn(b, h, s, P), randn(b, n, h, D), randn(b, n, h, D), randn(b, n, P)


def test_applies_and_block_choice():
    x = _inputs(1, 2, 16, 100)
    assert wg.window_applies(*x, True)
    assert wg.choose_block(*x, True) == (64, 2)
    assert wg.choose_block(*_inputs(1, 2, 64, 100), True) == (64, 1)         # larger Q / P^T tiles
    assert not wg.window_applies(*_inputs(1, 2, 65, 100), True)               # S > MAX_S
    assert not wg.window_applies(*_inputs(1, 2, 16, 8), True)                 # causal N < S: rows with no key
    assert wg.window_applies(*_inputs(1, 2, 16, 8), False)
    assert not wg.window_applies(*(t.float() for t in x), True)               # half precision only
    q, qpe, k, v, kpe = x
    assert not wg.window_applies(q, qpe, torch.empty(1, 100, 2, 2 * D, dtype=k.dtype)[..., ::2], v, kpe, True)
    assert wg.choose_block(*_inputs(1, 2, 65, 100), True) is None


def test_launcher_rejects_cpu_tensors_and_bad_arguments():
    x = _inputs(1, 2, 4, 40)
    with pytest.raises(ValueError, match="CUDA"):
        wg.expanded_window_gluon(*x, scale=0.1, programs=4)
    if HOPPER:
        xc = [t.cuda() for t in x]
        with pytest.raises(ValueError, match="block_n"):
            wg.expanded_window_gluon(*xc, scale=0.1, programs=4, block_n=32)
        with pytest.raises(ValueError, match="programs"):
            wg.expanded_window_gluon(*xc, scale=0.1, programs=0)
        with pytest.raises(ValueError, match="window_applies"):
            wg.expanded_window_gluon(*_inputs(1, 2, 80, 100, device="cuda"), scale=0.1, programs=4)


# ---------------------------------------------------------------------------------------------
# numerics on a Hopper GPU

# (b, h, s, n, causal, programs, (block_n, stages))
SHAPES = [
    (2, 8, 16, 1344, True, 3, (64, 2)),     # the hybrid's shape, each program walks ~5 items
    (2, 8, 1, 130, True, 5, (64, 2)),       # s = 1, ragged last block
    (1, 8, 5, 77, True, 2, (64, 1)),        # ragged s and N, two blocks
    (2, 8, 16, 16, True, 4, (64, 2)),       # N = s: one block, the second consumer has none
    (2, 8, 4, 300, False, 16, (64, 2)),     # not causal: only the tail block masked
    (2, 8, 32, 1000, True, 3, (64, 1)),     # s = 32
    (1, 8, 64, 500, True, 3, (64, 1)),      # s = 64, the largest
    (1, 8, 3, 1000, True, 40, (64, 2)),     # more programs asked than items: one program per item
]


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda sh: "b{}-h{}-s{}-n{}-c{:d}-m{}-bn{}x{}".format(*sh[:6], *sh[6]))
def test_matches_reference(shape):
    b, h, s, n, causal, programs, (bn, stages) = shape
    dtype = torch.bfloat16 if stages == 2 else torch.float16
    q, qpe, k, v, kpe = _inputs(b, h, s, n, dtype, "cuda", seed=n)
    out = torch.full((b, h, s, D), float("nan"), dtype=dtype, device="cuda")
    scale = (D + P) ** -0.5
    o, lse = wg.expanded_window_gluon(q, qpe, k, v, kpe, scale=scale, causal=causal, programs=programs,
                                      block_n=bn, stages=stages, out=out)
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, causal, None)
    assert o is out
    assert_close(o, ref_o, dtype, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_causal_and_not_causal_calls_of_one_shape_each_run_their_kernel():
    """Calls that differ only in ``causal`` (and the ring depth) compile and run their own kernels:
    the launch key once missed ``CAUSAL``, and on an H200 a causal call after a non-causal one of
    the same shapes ran the non-causal kernel (relative error 0.18-0.75 at s = 5-64, n = 130)."""
    q, qpe, k, v, kpe = _inputs(2, 8, 5, 130, torch.bfloat16, "cuda", seed=3)
    scale = (D + P) ** -0.5
    for causal, stages in ((False, 2), (True, 2), (True, 1), (False, 1), (True, 2)):
        out = torch.full((2, 8, 5, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        o, lse = wg.expanded_window_gluon(q, qpe, k, v, kpe, scale=scale, causal=causal, programs=3, stages=stages,
                                          out=out)
        ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, causal, None)
        assert_close(o, ref_o, torch.bfloat16, name=f"o (causal={causal}, stages={stages})")
        assert_close(lse, ref_lse, tol=LSE_TOLERANCE[torch.bfloat16], name=f"lse (causal={causal}, stages={stages})")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
def test_the_flat_launch_equals_tritons_launch(monkeypatch):
    """Once a specialisation is compiled, ``launch_window`` encodes the five descriptors itself
    and calls the C launcher; with a launch hook installed every call takes Triton's own launcher
    instead. Both give the same outputs to the bit, on two window lengths of one specialisation."""
    from triton import knobs

    real, encoded = wg.tma_arg_of, []
    monkeypatch.setattr(wg, "tma_arg_of", lambda box, address, *sizes: encoded.append(address) or real(box, address,
                                                                                                      *sizes))
    scale = (D + P) ** -0.5
    for n, seed in ((333, 1), (200, 2)):
        q, qpe, k, v, kpe = _inputs(2, 6, 7, n, torch.bfloat16, "cuda", seed=seed)
        call = lambda: wg.expanded_window_gluon(q, qpe, k, v, kpe, scale=scale, causal=True, programs=5)  # noqa: E731
        call()                                                  # compiled (if no earlier call did)
        before = len(encoded)
        o_flat, lse_flat = call()
        assert len(encoded) - before == 5                       # q, qpe, k, v, kpe encoded by launch_window
        hook = lambda *args, **kwargs: None                     # noqa: E731
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            before = len(encoded)
            o_triton, lse_triton = call()
            assert len(encoded) == before                       # Triton's launcher encoded them
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
        assert torch.equal(o_flat, o_triton) and torch.equal(lse_flat, lse_triton)
        ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, True, None)
        assert_close(o_flat, ref_o, torch.bfloat16, name=f"o (n={n})")
        assert_close(lse_flat, ref_lse, tol=LSE_TOLERANCE[torch.bfloat16], name=f"lse (n={n})")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("rising", [True, False], ids=["max-rises", "max-falls"])
def test_running_max_moving_across_blocks(rising):
    """Keys whose scale ramps over the window: with a rising ramp the running max passes the
    reference by far more than 2^8 in later blocks (each such block is redone with the new max and
    the sums rescaled); with a falling one the first block holds the max and later blocks'
    probabilities are tiny. Both must match the fp32 reference."""
    b, h, s, n = 1, 4, 16, 700
    q, qpe, k, v, kpe = _inputs(b, h, s, n, torch.bfloat16, "cuda", seed=7)
    ramp = torch.linspace(0.05, 6.0, n, device="cuda")
    ramp = ramp if rising else ramp.flip(0)
    k = (k.float() * ramp[None, :, None, None]).to(torch.bfloat16)
    kpe = (kpe.float() * ramp[None, :, None]).to(torch.bfloat16)
    out = torch.full((b, h, s, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    scale = (D + P) ** -0.5
    o, lse = wg.expanded_window_gluon(q, qpe, k, v, kpe, scale=scale, causal=True, programs=2, out=out)
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, True, None)
    assert_close(o, ref_o, torch.bfloat16, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[torch.bfloat16], name="lse")


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("case", [(2, 16, 1024, 300, 8), (2, 4, 777, 200, 20)], ids=lambda c: "b{}-s{}-t{}-n{}-m{}".format(*c))
def test_hybrid_with_the_window_kernel_matches_reference(case):
    from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper
    from mla_var3.shapes import Problem, get_preset

    b, s, t, n, programs = case
    dtype = torch.bfloat16
    x = R.make_inputs(get_preset("deepseek-v3"), Problem(b=b, s=s, t=t, n=n, causal=True), dtype=dtype, device="cuda")
    o, ol, lse = mla_var6_plus_hopper(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale, causal=True,
                                      expanded_programs=programs)
    f32 = [a.float() for a in (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)]
    ro, rol, rlse = R.mla_var6_plus(*f32, x.scale, True)
    w = x.w_uv.float()
    final = rel_err(R.decompress(ol.float(), w, o.float()), R.decompress(rol, w, ro))
    assert final <= TOLERANCE[dtype], final
    assert_close(o, ro, dtype, name="o")
    assert_close(ol, rol, dtype, name="o_latent")
    assert_close(lse, rlse, tol=LSE_TOLERANCE[dtype], name="lse")

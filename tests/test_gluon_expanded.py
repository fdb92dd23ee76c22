"""The Hopper Gluon expanded kernel (``kernel/hopper/expanded_gluon.py``).

On any machine: it compiles for sm_90 (warp-specialised, HGMMA of the expected shapes and
counts, no stack, shared memory as :func:`smem_bytes` says), and the host side routes and
validates (``gluon_applies``, the ``flash_attention`` backend choice, errors on CPU tensors).
On a Hopper GPU: every ring variant against the fp32 reference on the edge shapes of its tiling
— s = 1, ragged s and t, causal s < t and s = t, not causal, b = 1, a strided ``out`` — with the
output NaN-poisoned so an unwritten element fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

eg = pytest.importorskip("mla_var3.kernel.hopper.expanded_gluon")
if not eg.GLUON_AVAILABLE:
    pytest.skip(f"triton.experimental.gluon unavailable: {eg.GLUON_IMPORT_ERROR}", allow_module_level=True)

import triton  # noqa: E402

from mla_var3 import reference as R  # noqa: E402
from mla_var3.kernel import backends, expanded  # noqa: E402,F401  (expanded registers its backends)
from mla_var3.kernel._common import SMEM_LIMIT  # noqa: E402
from mla_var3.kernel.sass import compile_gluon_in_subprocess  # noqa: E402
from mla_var3.shapes import MLADims, Problem  # noqa: E402
from mla_var3.testing import LSE_TOLERANCE, assert_close  # noqa: E402

D, P = 128, 64
_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
RINGS = [dict(block_n=128, stages=2), dict(block_n=128, stages=2, pingpong=True), dict(block_n=64, stages=3),
         dict(block_n=64, stages=4)]

COMPILE_VARIANTS = [dict(block_n=128, stages=2, dtype="bf16", causal=True, pingpong=False),
                    dict(block_n=64, stages=3, dtype="fp16", causal=False, pingpong=True)]


@pytest.mark.parametrize("variant", COMPILE_VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_compiles_warp_specialised_without_spills(variant):
    if not _CUOBJDUMP.exists():
        pytest.skip(f"cuobjdump not shipped with this triton ({_CUOBJDUMP})")
    build = compile_gluon_in_subprocess("mla_var3.kernel.hopper.expanded_gluon", **variant)
    bn = variant["block_n"]
    # per consumer warpgroup, in the code twice (block 0 / the loop; the loop / the last block):
    # the score chain 64 x BN over D + P (k16 steps) and P . V 64 x D over BN keys
    want: dict[str, int] = {}
    for shape, n in ((f"64x{bn}x16", 2 * 2 * (D + P) // 16), (f"64x{D}x16", 2 * 2 * bn // 16)):
        want[shape] = want.get(shape, 0) + n
    assert build.hgmma == want, build.hgmma
    assert "setmaxnreg.dec" in build.ptx and "setmaxnreg.inc" in build.ptx
    assert build.stack_bytes == 0, f"spills: {build.stack_bytes} B per thread"
    assert build.shared_bytes <= SMEM_LIMIT
    assert 0 <= build.shared_bytes - eg.smem_bytes(D, P, bn, variant["stages"]) <= 1024, build.shared_bytes


def _inputs(b, h, s, t, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    return randn(b, h, s, D), randn(b, h, s, P), randn(b, t, h, D), randn(b, t, h, D), randn(b, t, P)


def test_applies_only_where_the_kernel_is_valid():
    q, qpe, k, v, kpe = _inputs(1, 2, 3, 40)
    assert eg.gluon_applies(q, qpe, k, v, kpe)
    assert not eg.gluon_applies(q, qpe, k, v, kpe, seqlens=torch.tensor([40]))      # reads past seqlens
    assert not eg.gluon_applies(*(x.float() for x in (q, qpe, k, v, kpe)))            # half precision only
    kt = torch.empty(1, 40, 2, 2 * D, dtype=torch.bfloat16)[..., ::2]                 # last stride 2: no TMA
    assert not eg.gluon_applies(q, qpe, kt, v, kpe)
    assert not eg.gluon_applies(q[..., :120], qpe, k[..., :120], v[..., :120], kpe)   # D not a multiple of 16
    assert not eg.gluon_applies(q, qpe, k, v, kpe, block_n=128, stages=3)             # 294 KiB of shared memory


def test_launcher_rejects_cpu_tensors_and_bad_rings():
    q, qpe, k, v, kpe = _inputs(1, 2, 3, 40)
    with pytest.raises(ValueError, match="CUDA"):
        eg.flash_attention_gluon(q, qpe, k, v, kpe, scale=0.1)
    if HOPPER:
        q, qpe, k, v, kpe = (x.cuda() for x in (q, qpe, k, v, kpe))
        with pytest.raises(ValueError, match="block_n"):
            eg.flash_attention_gluon(q, qpe, k, v, kpe, scale=0.1, block_n=32)
        with pytest.raises(ValueError, match="shapes"):
            eg.flash_attention_gluon(q, qpe, k[:, :, :1], v, kpe, scale=0.1)


def test_flash_attention_routes_to_the_kernel_only_on_hopper():
    assert backends.available("flash_attention", "cpu") == ["triton"]
    if HOPPER:
        assert backends.available("flash_attention", "cuda")[0] == "gluon"


# ---------------------------------------------------------------------------------------------
# numerics on a Hopper GPU

# (b, h, s, t, causal, strided out)
SHAPES = [
    (1, 4, 1, 333, True, False),       # s = 1: one row of a 128-row program, ragged t
    (2, 4, 130, 1000, True, False),    # ragged s (two row blocks, the second with 2 rows) and t
    (2, 4, 512, 1024, True, False),    # causal s < t: masked diagonal blocks
    (1, 8, 512, 512, True, False),     # causal prefill s = t, b = 1
    (2, 4, 200, 700, False, False),    # not causal: only the tail block is masked
    (1, 4, 64, 64, True, False),       # one key block, shorter than block_n
    (2, 4, 300, 777, True, True),      # out [B, H, S, D] as a transposed [B, S, H, D] buffer
]


@pytest.mark.skipif(not HOPPER, reason="needs a Hopper (sm_90) GPU")
@pytest.mark.parametrize("ring", RINGS, ids=lambda r: f"n{r['block_n']}s{r['stages']}" + ("p" * r.get("pingpong", 0)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda sh: "b{}-h{}-s{}-t{}-c{:d}-strided{:d}".format(*sh))
def test_matches_reference(shape, ring):
    b, h, s, t, causal, strided = shape
    dtype = torch.bfloat16 if ring["block_n"] == 128 else torch.float16
    q, qpe, k, v, kpe = _inputs(b, h, s, t, dtype, "cuda", seed=b * 1000 + t)
    if strided:
        out = torch.full((b, s, h, D), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
    else:
        out = torch.full((b, h, s, D), float("nan"), dtype=dtype, device="cuda")
    scale = (D + P) ** -0.5
    o, lse = eg.flash_attention_gluon(q, qpe, k, v, kpe, scale=scale, causal=causal, out=out, **ring)
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, causal, None)
    assert o is out and lse.dtype == torch.float32
    assert_close(o, ref_o, dtype, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")


@pytest.mark.skipif(torch.cuda.is_available(), reason="emulates the routing with CPU tensors under the interpreter; "
                                                     "on a GPU the kernel tests above run the real paths")
def test_hopper_backend_routes_long_queries_to_the_gluon_kernel(monkeypatch):
    """The sm_90 backend's routing, run anywhere: the Gluon launcher replaced by a recorder and
    ``gluon_applies`` made to accept float32; s <= GLUON_MIN_S, a portable config and seqlens
    must reach the portable kernel (the interpreter here), which then writes every element."""
    calls = []

    def fake(q, qpe, k, v, kpe, *, scale, causal, out):
        calls.append(q.shape[2])
        return out, torch.zeros(q.shape[:3])

    monkeypatch.setattr(eg, "flash_attention_gluon", fake)
    # true for the float32 test tensors; keeps the real rule's "no seqlens" (tested above)
    monkeypatch.setattr(eg, "gluon_applies", lambda q, qpe, k, v, kpe, seqlens=None, **kw: seqlens is None)
    b, h, t = 1, 2, 80
    for s, config, seqlens, gluon in [(eg.GLUON_MIN_S + 1, None, None, True),
                                      (eg.GLUON_MIN_S, None, None, False),             # short: portable
                                      (70, expanded.default_config(MLADims(h=h, d=16, p=16), Problem(b, 70, t)),
                                       None, False),                                   # a config
                                      (70, None, torch.full((b,), t), False)]:           # seqlens
        g = torch.Generator().manual_seed(s)
        q, qpe = torch.randn(b, h, s, 16, generator=g), torch.randn(b, h, s, 16, generator=g)
        k, v, kpe = (torch.randn(b, t, h, 16, generator=g), torch.randn(b, t, h, 16, generator=g),
                     torch.randn(b, t, 16, generator=g))
        out = torch.full((b, h, s, 16), float("nan"))
        calls.clear()
        o, _ = eg.flash_attention_hopper(q, qpe, k, v, kpe, scale=0.125, causal=True, seqlens=seqlens,
                                         config=config, out=out)
        assert calls == ([s] if gluon else []), (s, config, seqlens)
        if not gluon:                                  # the portable kernel wrote every element
            ref, _ = R.flash_attention(q, qpe, k, v, kpe, 0.125, True, seqlens)
            assert_close(o, ref, torch.float32, name="o")

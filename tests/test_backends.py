"""Every backend of the absorbed design that runs here (the portable kernel everywhere, the
Gluon kernel on sm_90), forced by name, against the fp32 reference; and the selection rule."""

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.kernel import backends
from mla_var3.kernel.absorbed import flash_mla, gluon_applies
from mla_var3.shapes import MLADims, Problem
from mla_var3.testing import assert_close, nan_padded

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HERE = backends.available("flash_mla", DEVICE)
DIMS = MLADims(h=16, d=32, p=64, k=512)  # DeepSeek's latent widths; fewer heads keep the interpreter fast


def test_portable_backend_is_always_available():
    assert "triton" in HERE
    assert backends.available("flash_mla", "cpu") == ["triton"]


@pytest.mark.parametrize("backend", HERE)
@pytest.mark.parametrize("b,s,t,causal", [(1, 1, 65, True), (2, 4, 130, True), (2, 3, 64, False)])
def test_backend_matches_reference(backend, b, s, t, causal):
    x = R.make_inputs(DIMS, Problem(b=b, s=s, t=t), dtype=torch.bfloat16, device=DEVICE, seed=b + s + t)
    z, kpe = nan_padded(x.z, {1: 64}), nan_padded(x.kpe, {1: 64})
    o, lse = flash_mla(x.qc, x.qpe, z, kpe, scale=x.scale, causal=causal, backend=backend)
    ref_o, ref_lse = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, causal)
    assert_close(o, ref_o, torch.bfloat16, name=f"{backend} o_latent")
    assert_close(lse, ref_lse, torch.bfloat16, name=f"{backend} lse")


def test_gluon_applies_only_where_it_is_exact():
    x = R.make_inputs(DIMS, Problem(b=1, s=1, t=8), dtype=torch.bfloat16)
    assert gluon_applies(x.qc, x.qpe, None, None, None)
    assert not gluon_applies(x.qc, x.qpe, torch.tensor([8], dtype=torch.int32), None, None)  # seqlens: portable
    assert not gluon_applies(x.qc.float(), x.qpe.float(), None, None, None)
    small = R.make_inputs(MLADims(h=2, d=16, p=16, k=32), Problem(b=1, s=1, t=8), dtype=torch.bfloat16)
    assert not gluon_applies(small.qc, small.qpe, None, None, None)  # K = 32 is below the kernel's tile


def test_unknown_backend_is_a_clear_error():
    x = R.make_inputs(DIMS, Problem(b=1, s=1, t=8), dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="unknown backend 'cutlass'"):
        flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=x.scale, backend="cutlass")


def test_hopper_backends_register_themselves_on_the_first_lookup():
    """In a fresh process that imports only the portable modules, an sm_90 device (emulated:
    torch reports CUDA with capability 9.0) selects each design's Gluon backend, which its
    Hopper module registered when the registry's first lookup imported the Hopper package."""
    import subprocess
    import sys

    from mla_var3.kernel.hopper import GLUON_AVAILABLE

    if not GLUON_AVAILABLE:
        pytest.skip("triton.experimental.gluon is unavailable")
    code = """
import sys, torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda device=None: (9, 0)
from mla_var3.kernel import absorbed, backends, expanded, hybrid
assert "mla_var3.kernel.hopper" not in sys.modules
assert backends.available("flash_attention", "cuda") == ["gluon", "triton"]
assert backends.available("mla_var6_plus", "cuda") == ["gluon", "triton"]
assert backends.available("flash_mla", "cuda")[0] == "gluon"
assert backends.available("flash_attention", "cpu") == ["triton"]
from mla_var3.kernel.hopper import expanded_gluon, hybrid_hopper
assert backends.select("flash_attention", "cuda") is expanded_gluon.flash_attention_hopper
assert backends.select("mla_var6_plus", "cuda", "gluon") is hybrid_hopper.mla_var6_plus_hopper
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

"""Every design at DeepSeek-V3 size (b = 32, t = 4096, s = 1 and 16, h = 128) on a GPU.

Skipped without CUDA: under the interpreter one such call would take many minutes. The CPU
suite covers the same code paths on small shapes.
"""

import pytest
import torch

import mla_var3 as mv
from mla_var3 import reference as R
from mla_var3.shapes import Problem, get_preset
from mla_var3.testing import assert_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DIMS = get_preset("deepseek-v3")
DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", params=[1, 16], ids=lambda s: f"s{s}")
def inputs(request):
    s = request.param
    problem = Problem(b=32, s=s, t=4096, n=1024)
    return {dt: R.make_inputs(DIMS, problem, dtype=dt, device="cuda", seed=s) for dt in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_mla_large(inputs, dtype):
    x = inputs[dtype]
    o, lse = mv.flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=x.scale, causal=True)
    ref_o, ref_lse = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, True)
    assert_close(o, ref_o, dtype, name="o_latent")
    assert_close(lse, ref_lse, dtype, name="lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_attention_large(inputs, dtype):
    x = inputs[dtype]
    o, lse = mv.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, scale=x.scale, causal=True)
    ref_o, ref_lse = R.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, x.scale, True)
    assert_close(o, ref_o, dtype, name="o")
    assert_close(lse, ref_lse, dtype, name="lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mla_var6_plus_large(inputs, dtype):
    x = inputs[dtype]
    o, o_lat, lse = mv.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale, causal=True)
    ref_o, ref_lat, ref_lse = R.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, x.scale, True)
    assert_close(o, ref_o, dtype, name="o")
    assert_close(o_lat, ref_lat, dtype, name="o_latent")
    assert_close(lse, ref_lse, dtype, name="lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemms_large(inputs, dtype):
    x = inputs[dtype]
    qc = mv.absorb_query(x.q, x.w_uk)
    assert_close(qc, R.absorb_query(x.q, x.w_uk), dtype, name="qc")
    o_lat = x.qc  # any [B,H,S,K] tensor of the right scale
    assert_close(mv.decompress(o_lat, x.w_uv), R.decompress(o_lat, x.w_uv), dtype, name="decompress")

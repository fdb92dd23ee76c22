"""The per-head GEMMs (``mla_var3.kernel.gemm``: ``decompress``, ``absorb_query``) against the
fp32 reference: b = 1 and 3, h = 16 and 5, s = 1, 5, 16, reduction widths that are and are not
multiples of the block (k = 64, 40), outputs poisoned with NaN, inputs in NaN-padded buffers."""

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.kernel.gemm import GemmConfig, absorb_query, candidate_configs, decompress, default_config
from mla_var3.testing import assert_close, nan_padded, poisoned

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32] if DEVICE == "cpu" else [torch.bfloat16, torch.float16]
SHAPES = [(1, 16, 1, 64, 32), (3, 5, 5, 40, 32), (3, 16, 16, 64, 24), (1, 5, 2, 200, 48)]  # b, h, s, k, d


def _randn(*shape, dtype, seed=0, std=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * std).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_o", [False, True], ids=["plain", "plus-o"])
@pytest.mark.parametrize("b,h,s,k,d", SHAPES, ids=[f"b{b}-h{h}-s{s}-k{k}-d{d}" for b, h, s, k, d in SHAPES])
def test_decompress(b, h, s, k, d, with_o, dtype):
    o_latent = _randn(b, h, s, k, dtype=dtype)
    w_uv = _randn(h, k, d, dtype=dtype, seed=1, std=k ** -0.5)
    o = _randn(b, h, s, d, dtype=dtype, seed=2) if with_o else None
    ref = R.decompress(o_latent, w_uv, o)
    out = poisoned((b, h, s, d), dtype, DEVICE)
    got = decompress(nan_padded(o_latent), nan_padded(w_uv), None if o is None else nan_padded(o), out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == dtype
    assert_close(got, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,k,d", SHAPES, ids=[f"b{b}-h{h}-s{s}-k{k}-d{d}" for b, h, s, k, d in SHAPES])
def test_absorb_query(b, h, s, k, d, dtype):
    q = _randn(b, h, s, d, dtype=dtype)
    w_uk = _randn(h, d, k, dtype=dtype, seed=1, std=d ** -0.5)
    out = poisoned((b, h, s, k), dtype, DEVICE)
    got = absorb_query(nan_padded(q), nan_padded(w_uk), out=out)
    assert got.data_ptr() == out.data_ptr()
    assert_close(got, R.absorb_query(q, w_uk), dtype)


def test_decompress_in_place_and_config():
    """``out`` may alias ``o`` (the hybrid's final output); a small explicit tile config."""
    dtype = DTYPES[0]
    o_latent, w_uv = _randn(2, 3, 5, 64, dtype=dtype), _randn(3, 64, 32, dtype=dtype, seed=1, std=0.125)
    o = _randn(2, 3, 5, 32, dtype=dtype, seed=2)
    ref = R.decompress(o_latent, w_uv, o)
    got = decompress(o_latent, w_uv, o, out=o, config=GemmConfig(16, 16, 16, 4, 2))
    assert got.data_ptr() == o.data_ptr()
    assert_close(got, ref, dtype)
    assert default_config(4096, 512, 128).block_m == 128
    assert default_config(32, 512, 128) in candidate_configs(32, 512, 128)
    with pytest.raises(ValueError, match="block_k"):
        GemmConfig(block_k=8)


def _valid(dtype=torch.bfloat16):
    return _randn(2, 3, 4, 64, dtype=dtype), _randn(3, 64, 32, dtype=dtype, seed=1)


@pytest.mark.parametrize("case,match", [
    ("rank", r"o_latent must be \[B, H, S, K\]"),
    ("w_k", r"w_uv must be \[H, K, D\]"),
    ("w_h", r"w_uv must be \[H, K, D\]"),
    ("w_dtype", r"w_uv must have dtype"),
    ("o_shape", r"o must be \[B, H, S, D\]"),
    ("o_device", r"o is on meta"),
    ("out", r"out must be \[B, H, S, D\]"),
])
def test_decompress_bad_inputs(case, match):
    x, w = _valid()
    kwargs = {}
    if case == "rank":
        x = x[0]
    elif case == "w_k":
        w = w[:, :32]
    elif case == "w_h":
        w = w[:2]
    elif case == "w_dtype":
        w = w.to(torch.float16)
    elif case == "o_shape":
        kwargs["o"] = torch.zeros(2, 3, 4, 16, dtype=x.dtype, device=DEVICE)
    elif case == "o_device":
        kwargs["o"] = torch.empty(2, 3, 4, 32, dtype=x.dtype, device="meta")
    elif case == "out":
        kwargs["out"] = torch.empty(2, 3, 5, 32, dtype=x.dtype, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        decompress(x, w, **kwargs)


def test_absorb_query_bad_inputs():
    q, w_uk = _randn(2, 3, 4, 32, dtype=torch.bfloat16), _randn(3, 32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"w_uk must be \[H, D, K\]"):
        absorb_query(q, w_uk[:, :16])
    with pytest.raises(ValueError, match=r"q_nope must have dtype"):
        absorb_query(q.to(torch.int32), w_uk)
    with pytest.raises(ValueError, match=r"w_uk is on meta"):
        absorb_query(q, torch.empty(3, 32, 64, dtype=q.dtype, device="meta"))

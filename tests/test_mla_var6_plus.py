"""The hybrid MLAvar6+ kernel (``mla_var3.kernel.hybrid``) against the fp32 reference.

Dims are shrunk (d = 32, p = 16, k = 64; one case with k = 40, p = 8 to exercise the padded
widths) to keep the interpreter fast. The split n covers n = 0 (latent only), n = s, n = t
(expanded only), values in between, and n < s, where the causal mask reaches into the latent
part. Both outputs start as NaN; inputs are views into NaN-padded buffers.
"""

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.kernel.expanded import FlashAttentionConfig
from mla_var3.kernel.hybrid import (
    LatentPartConfig, MLAVar6PlusConfig, candidate_configs, default_config, mla_var6_plus,
)
from mla_var3.shapes import MLADims, Problem
from mla_var3.testing import assert_close, nan_padded, poisoned

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32] if DEVICE == "cpu" else [torch.bfloat16, torch.float16]
DIMS = MLADims(h=16, d=32, p=16, k=64)


def _run_case(b, h, s, t, n, dtype, *, dims=DIMS, causal=True, config=None):
    x = R.make_inputs(dims.replace(h=h), Problem(b=b, s=s, t=t, n=n, causal=causal), dtype=dtype, device=DEVICE)
    ref_o, ref_ol, ref_lse = R.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, x.scale, causal)
    args = [nan_padded(a) for a in (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)]
    out = poisoned((b, h, s, dims.d), dtype, DEVICE)
    out_latent = poisoned((b, h, s, dims.k), dtype, DEVICE)
    o, o_latent, lse = mla_var6_plus(*args, scale=x.scale, causal=causal, config=config, out=out,
                                     out_latent=out_latent)
    assert o.data_ptr() == out.data_ptr() and o_latent.data_ptr() == out_latent.data_ptr()
    assert_close(o, ref_o, dtype, name="o")
    assert_close(o_latent, ref_ol, dtype, name="o_latent")
    assert_close(lse, ref_lse, torch.float32, tol=1e-5, name="lse")
    # the parts' outputs add up to the attention over all keys
    assert_close(R.decompress(o_latent, x.w_uv, o), R.decompress(ref_ol, x.w_uv, ref_o), dtype, name="final")


CASES = [  # b, h, s, t, n
    (1, 16, 1, 1, 0),         # one old key
    (1, 16, 1, 1, 1),         # one new key
    (3, 5, 1, 65, 0),         # n = 0: latent only
    (3, 5, 1, 65, 1),         # n = s
    (1, 16, 1, 200, 200),     # n = t: expanded only
    (3, 5, 2, 64, 1),         # n < s: the mask reaches into the latent part
    (1, 16, 5, 63, 5),        # n = s
    (3, 5, 5, 65, 2),         # n < s
    (1, 16, 5, 200, 70),      # in between
    (1, 5, 16, 16, 0),        # s = t, latent only
    (1, 5, 16, 16, 16),       # s = t, expanded only
    (3, 5, 16, 63, 7),        # n < s, several blocks
    (1, 16, 16, 200, 64),     # in between
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,t,n", CASES, ids=[f"b{b}-h{h}-s{s}-t{t}-n{n}" for b, h, s, t, n in CASES])
def test_causal(b, h, s, t, n, dtype):
    _run_case(b, h, s, t, n, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 3, 65], ids=lambda n: f"n{n}")
def test_not_causal(n, dtype):
    _run_case(2, 5, 5, 65, n, dtype, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [0, 2, 40], ids=lambda n: f"n{n}")
def test_split_kv(n, dtype):
    """Both parts split over several programs (combine merges them before the hybrid merge),
    with head groups that straddle h and query blocks that straddle s."""
    cfg = MLAVar6PlusConfig(LatentPartConfig(block_h=2, block_s=8, block_n=16, num_splits=3),
                            FlashAttentionConfig(16, 16, num_splits=2))
    _run_case(2, 5, 3, 130, n, dtype, config=cfg)


def test_odd_widths():
    """Latent and RoPE widths that are not powers of two (padded, masked)."""
    _run_case(2, 3, 5, 65, 9, DTYPES[0], dims=MLADims(h=3, d=24, p=8, k=40))


def test_configs():
    cfg = default_config(32, 128, 16, 3000, 1096)
    assert cfg.latent.block_h * cfg.latent.block_s >= 16
    assert default_config(1, 16, 1, 4000, 96).latent.num_splits > 1
    cands = candidate_configs(32, 128, 16, 3000, 1096)
    assert cands[0] == cfg and len(set(cands)) == len(cands)
    with pytest.raises(ValueError, match="block_h"):
        LatentPartConfig(block_h=3)
    with pytest.raises(ValueError, match=">= 16"):
        LatentPartConfig(block_h=2, block_s=4)


def _valid(dtype=torch.bfloat16):
    x = R.make_inputs(MLADims(h=3, d=32, p=16, k=64), Problem(b=2, s=4, t=10, n=6), dtype=dtype, device=DEVICE)
    return [x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new], x.scale


@pytest.mark.parametrize("index,bad,match", [
    (0, lambda x: x[0], r"q must be \[B, H, S, D\]"),                        # wrong rank
    (2, lambda x: x[..., :32], r"z_old must be .*K mismatch"),               # qc binds K first
    (3, lambda x: x[..., :32], r"z_old must be \[B, O, K\]"),
    (4, lambda x: x[:, :9], r"kpe must be \[B, T, P\]"),                     # T != O + N
    (5, lambda x: x[:, :, :2], r"k_new must be \[B, N, H, D\]"),             # H mismatch
    (6, lambda x: x[:, :5], r"v_new must be \[B, N, H, D\]"),                # N mismatch
    (3, lambda x: x.to(torch.float16), r"z_old must have dtype"),            # mixed dtype
    (5, lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta"), r"k_new is on meta"),
])
def test_bad_inputs(index, bad, match):
    args, scale = _valid()
    args[index] = bad(args[index])
    with pytest.raises(ValueError, match=match):
        mla_var6_plus(*args, scale=scale)


def test_bad_ranges():
    (q, qpe, qc, z_old, kpe, k_new, v_new), scale = _valid()
    with pytest.raises(ValueError, match="S <= O \\+ N"):
        mla_var6_plus(q, qpe, qc, z_old[:, :1], kpe[:, :3], k_new[:, :2], v_new[:, :2], scale=scale)
    with pytest.raises(ValueError, match="scale"):
        mla_var6_plus(q, qpe, qc, z_old, kpe, k_new, v_new, scale=-1.0)
    with pytest.raises(ValueError, match="out_latent must be"):
        mla_var6_plus(q, qpe, qc, z_old, kpe, k_new, v_new, scale=scale,
                      out_latent=torch.empty(2, 3, 4, 32, dtype=q.dtype, device=DEVICE))

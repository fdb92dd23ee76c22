"""The hybrid MLAvar6+ kernel (``mla_var3.kernel.hybrid``) against the fp32 reference.

Dims are shrunk (d = 32, p = 16, k = 64; one case with k = 40, p = 8 to exercise the padded
widths) to keep the interpreter fast. The split n covers n = 0 (latent only), n = s, n = t
(expanded only), values in between, and n < s, where the causal mask reaches into the latent
part. Both outputs start as NaN; inputs are views into NaN-padded buffers.
"""

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.kernel._common import SMEM_LIMIT
from mla_var3.kernel.expanded import FlashAttentionConfig
from mla_var3.kernel.hopper.hybrid_hopper import gluon_latent_applies
from mla_var3.kernel.hybrid import (
    LatentPartConfig, MLAVar6PlusConfig, candidate_configs, default_config, merge_partials, mla_var6_plus,
)
from mla_var3.shapes import MLADims, Problem
from mla_var3.testing import LSE_TOLERANCE, assert_close, nan_padded, poisoned

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
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")
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
    cfg = default_config(MLADims(h=128), Problem(b=32, s=16, t=4096, n=1096))
    assert cfg.latent.block_h * cfg.latent.block_s >= 16
    assert default_config(MLADims(h=16), Problem(b=1, s=1, t=4096, n=96)).latent.num_splits > 1
    cands = candidate_configs(MLADims(h=128), Problem(b=32, s=16, t=4096, n=1096))
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


# ----------------------------------------------------------------------------------------------
# the merge of the two partials (used by both backends) and the sm_90 path's applicability rule
# ----------------------------------------------------------------------------------------------

def _merge_ref(o_e, lse_e, o_l, lse_l):
    lse = torch.logaddexp(lse_e, lse_l)
    w_e = torch.nan_to_num(torch.exp(lse_e - lse))[..., None]
    w_l = torch.nan_to_num(torch.exp(lse_l - lse))[..., None]
    return (torch.where(w_e > 0, o_e.float() * w_e, 0.0), torch.where(w_l > 0, o_l.float() * w_l, 0.0), lse)


@pytest.mark.parametrize("part_dtype", [torch.float32, torch.float16], ids=str)
def test_merge_partials(part_dtype):
    """Both partials rescaled to the joint softmax; a part without keys (lse = -inf, output NaN)
    gets weight 0; the lse is the joint log-sum-exp."""
    b, h, s, d, k = 2, 3, 5, 24, 40
    g = torch.Generator().manual_seed(1)
    o_e = torch.randn(b, h, s, d, generator=g).to(DEVICE)
    o_l = torch.randn(b, h, s, k, generator=g).to(part_dtype).to(DEVICE)
    lse_e = (torch.randn(b, h, s, generator=g) * 4).to(DEVICE)
    lse_l = (torch.randn(b, h, s, generator=g) * 4).to(DEVICE)
    lse_e[0, 0, :2] = float("-inf")                 # the first queries see no new key
    o_e[0, 0, :2] = float("nan")
    out_dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    o, o_latent, lse = merge_partials(o_e, lse_e, o_l, lse_l, out_dtype=out_dtype)
    ref_o, ref_ol, ref_lse = _merge_ref(o_e, lse_e, o_l, lse_l)
    assert o.dtype == out_dtype and o_latent.dtype == out_dtype
    assert_close(o, ref_o, out_dtype, name="o")
    assert_close(o_latent, ref_ol, out_dtype, name="o_latent")
    assert_close(lse, ref_lse, torch.float32, tol=1e-6, name="lse")
    assert torch.equal(o[0, 0, :2], torch.zeros_like(o[0, 0, :2]))


def test_merge_partials_bad_inputs():
    o_e, o_l = torch.zeros(1, 2, 3, 8, device=DEVICE), torch.zeros(1, 2, 3, 16, device=DEVICE)
    lse = torch.zeros(1, 2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="o_l must be"):
        merge_partials(o_e, lse, o_l[:, :1], lse)
    with pytest.raises(ValueError, match="lse_l must have dtype"):
        merge_partials(o_e, lse, o_l, lse.double())


@pytest.mark.parametrize("dtype,k,p,s,o,n,causal,config,expected", [
    (torch.bfloat16, 512, 64, 16, 3000, 1096, True, None, True),     # N >= S: latent part non-causal
    (torch.float16, 512, 64, 16, 3000, 0, True, None, True),         # N = 0: the absorbed kernel itself
    (torch.bfloat16, 512, 64, 16, 3000, 8, True, None, False),       # N < S: mask reaches the old keys
    (torch.bfloat16, 512, 64, 16, 3000, 8, False, None, True),       # ... unless not causal
    (torch.bfloat16, 512, 64, 16, 8, 100, True, None, False),        # O < S: Gluon needs S <= O
    (torch.bfloat16, 512, 64, 16, 0, 100, True, None, False),        # no old token: expanded only
    (torch.float32, 512, 64, 16, 3000, 1096, True, None, False),     # dtype
    (torch.bfloat16, 40, 64, 16, 3000, 1096, True, None, False),     # K not a multiple of 64
    (torch.bfloat16, 512, 8, 16, 3000, 1096, True, None, False),     # P not a multiple of 16
    (torch.bfloat16, 512, 64, 16, 3000, 1096, True, MLAVar6PlusConfig(), False),  # portable config
])
def test_gluon_latent_applies(dtype, k, p, s, o, n, causal, config, expected):
    assert gluon_latent_applies(dtype, k, p, s, o, n, causal, config) is expected


def test_backend_signature():
    """Every registered backend takes the keyword arguments the entry point passes (overlap,
    out=None), so the sm_90 backend can be chosen by name wherever it is registered."""
    from mla_var3.kernel import backends

    table = backends.backends("mla_var6_plus")
    assert {"triton", "gluon"} <= set(table)
    args, scale = _valid(torch.float32 if DEVICE == "cpu" else torch.bfloat16)
    o, o_latent, lse = table["triton"].launcher(*args, scale=scale, causal=True, config=None, out=None,
                                                 out_latent=None, overlap=False)
    ref_o, ref_ol, ref_lse = R.mla_var6_plus(*args, scale, True)
    assert_close(o, ref_o, args[0].dtype, name="o")
    assert_close(o_latent, ref_ol, args[0].dtype, name="o_latent")


@pytest.mark.parametrize("b,h,s,t,n,causal,programs", [
    (2, 5, 4, 65, 4, True, "auto"),      # N = S: the latent part is non-causal over its O keys
    (2, 5, 4, 65, 20, True, "auto"),     # N > S
    (1, 16, 5, 63, 0, True, "auto"),     # N = 0: the absorbed kernel with its own causal rule
    (2, 5, 4, 65, 2, False, "auto"),     # N < S, not causal
    (2, 5, 4, 65, 2, True, "auto"),      # N < S, causal: the portable path
    (2, 5, 4, 65, 20, True, 3),          # the persistent expanded part on 3 programs
    (2, 5, 4, 65, 2, False, 3),
])
def test_hopper_path_decomposition(monkeypatch, b, h, s, t, n, causal, programs):
    """The sm_90 path's decomposition (which absorbed call covers the old keys, with which
    causal rule, merged with the expanded part; the expanded part on the default partition or
    persistent on a few programs) against the reference, with the absorbed entry it calls
    replaced by the fp32 reference absorbed attention (rounded to the input dtype as the kernel
    returns it). Runs anywhere: the parts are issued one after the other."""
    from mla_var3.kernel.hopper import hybrid_hopper
    from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper

    calls = []

    def fake_absorbed(qc, qpe, z, kpe, *, scale, causal=True, decode=None):
        calls.append((z.shape[1], causal))
        o, lse = R.flash_mla(qc.float(), qpe.float(), z.float(), kpe.float(), scale, causal)
        return o.to(qc.dtype), lse

    monkeypatch.setattr(hybrid_hopper, "CHECKED_WIDTHS", {(DIMS.k, DIMS.p)})   # the Hopper path at the tests' widths
    monkeypatch.setattr(hybrid_hopper, "flash_mla", fake_absorbed)
    dtype = torch.bfloat16
    x = R.make_inputs(DIMS.replace(h=h), Problem(b=b, s=s, t=t, n=n, causal=causal), dtype=dtype, device=DEVICE)
    ref_o, ref_ol, ref_lse = R.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, x.scale, causal)
    o, o_latent, lse = mla_var6_plus_hopper(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale,
                                            causal=causal, overlap=False, expanded_programs=programs)
    assert_close(o, ref_o, dtype, name="o")
    assert_close(o_latent, ref_ol, dtype, name="o_latent")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")
    expected = [] if (causal and 0 < n < s) else [(t - n, causal and n == 0)]
    assert calls == expected


@pytest.mark.parametrize("b,h,s,n,causal,programs", [
    (2, 5, 4, 20, True, 3),      # tiles spread over a few programs
    (1, 3, 5, 2, True, 2),       # N < S: the first rows see no key (o = 0, lse = -inf)
    (2, 3, 20, 40, False, 7),    # two query blocks per head, not causal
])
def test_expanded_persistent(b, h, s, n, causal, programs):
    """The persistent expanded part against the reference expanded attention over the N keys."""
    from mla_var3.kernel.hybrid import expanded_persistent

    dtype = DTYPES[0]
    x = R.make_inputs(DIMS.replace(h=h), Problem(b=b, s=s, t=s + n, causal=causal), dtype=dtype, device=DEVICE)
    k, v, kpe = x.k[:, s:], x.v[:, s:], x.kpe[:, s:]          # the N keys
    out = poisoned((b, h, s, DIMS.d), dtype, DEVICE)
    o, lse = expanded_persistent(nan_padded(x.q), x.qpe, nan_padded(k), v, kpe, scale=x.scale, causal=causal,
                                 programs=programs, block_n=16, out=out)
    if s <= n or not causal:
        ref_o, ref_lse = R.flash_attention(x.q, x.qpe, k, v, kpe, x.scale, causal)
    else:                                   # rows i < S - N see no key; the others as with S' = N
        ref_o = torch.zeros(b, h, s, DIMS.d, device=DEVICE)
        ref_lse = torch.full((b, h, s), float("-inf"), device=DEVICE)
        ref_o[:, :, s - n:], ref_lse[:, :, s - n:] = R.flash_attention(x.q[:, :, s - n:], x.qpe[:, :, s - n:], k, v,
                                                                       kpe, x.scale, causal)
    assert o.data_ptr() == out.data_ptr()
    assert_close(o, ref_o, dtype, name="o")
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close(lse[seen], ref_lse[seen], torch.float32, tol=1e-5, name="lse")


@pytest.mark.parametrize("s", [16, 64])
def test_expanded_persistent_compiles_for_sm90(s):
    """The persistent expanded part's GPU path (bf16, UPCAST=False) compiles for the H200 without
    register spills and within shared memory (the interpreter does not check this)."""
    from mla_var3.kernel.hybrid import example_launch
    from mla_var3.kernel.sass import compile_launch_in_subprocess

    args, opts = example_launch("persistent", 32, 128, s, 4096 - 1664, 1664)
    report = compile_launch_in_subprocess("mla_var3.kernel.hybrid", "_expanded_persistent_kernel", args, **opts)
    print(report)
    assert report.spill_stores == 0 and report.spill_loads == 0, report
    assert report.shared_bytes <= SMEM_LIMIT, report


def test_default_programs_balance_the_measured_costs():
    """The partition's window share grows with N and shrinks with s (a latent key's cost grows
    with s faster than a window key's); a short window still gets the SMs its items cost (at
    b = 96, s = 2, N = 64 the window's one-block items took 923 us on 29 programs on an H200,
    against 273 us for the absorbed call); it always leaves both parts SMs."""
    from mla_var3.kernel.hopper.hybrid_hopper import default_programs

    assert default_programs(16, 3072, 1024, 132) == 50
    assert default_programs(32, 1536, 2560, 132) == 78
    assert default_programs(16, 3584, 512, 132) == 34 and default_programs(32, 1024, 3072, 132) == 97
    assert default_programs(32, 3072, 1024, 132) < default_programs(32, 2048, 2048, 132)
    assert default_programs(64, 2048, 2048, 132) < default_programs(16, 2048, 2048, 132)
    assert default_programs(2, 3008, 64, 132) == 58 and default_programs(16, 1, 4000, 132) == 124
    assert default_programs(16, 4000, 1, 132) == 19


def test_sm90_default_is_the_hopper_path_at_checked_widths_only(monkeypatch):
    """Widths outside CHECKED_WIDTHS run the portable path (the Hopper path's latent call is not made)."""
    from mla_var3.kernel.hopper import hybrid_hopper

    monkeypatch.setattr(hybrid_hopper, "flash_mla", lambda *a, **k: pytest.fail("Hopper path taken"))
    dtype = torch.bfloat16
    x = R.make_inputs(DIMS.replace(h=4), Problem(b=1, s=4, t=65, n=20, causal=True), dtype=dtype, device=DEVICE)
    o, o_latent, lse = hybrid_hopper.mla_var6_plus_hopper(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new,
                                                          scale=x.scale, overlap=False)
    ref_o, ref_ol, ref_lse = R.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, x.scale, True)
    assert_close(o, ref_o, dtype, name="o")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")


def _on_sm90() -> bool:
    from mla_var3.kernel import backends

    return torch.cuda.is_available() and backends.gluon_hopper(torch.device("cuda"))


@pytest.mark.skipif(not _on_sm90(), reason="needs a Hopper (sm_90) GPU with Gluon")
@pytest.mark.parametrize("s,t,n", [(16, 1024, 300), (32, 1024, 600), (4, 700, 700)],
                         ids=["s16-partition", "s32-partition", "n=t-expanded"])
def test_sm90_default_at_deepseek_widths_captured(s, t, n):
    """The default call on sm_90 at DeepSeek-V3 widths (the SM-partitioned Hopper path; at n = t
    the expanded kernel alone) against the fp32 reference, then captured in a CUDA graph and
    replayed on new queries: the eager result on them."""
    from mla_var3.kernel.hybrid import mla_var6_plus
    from mla_var3.shapes import get_preset

    dtype = torch.bfloat16
    x = R.make_inputs(get_preset("deepseek-v3"), Problem(b=2, s=s, t=t, n=n, causal=True), dtype=dtype,
                      device="cuda")
    args = [x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new]
    o, o_latent, lse = mla_var6_plus(*args, scale=x.scale)
    ref_o, ref_ol, ref_lse = R.mla_var6_plus(*[a.float() for a in args], x.scale, True)
    assert_close(o, ref_o, dtype, name="o")
    assert_close(o_latent, ref_ol, dtype, name="o_latent")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")
    static = [a.clone() for a in args]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_o, g_ol, g_lse = mla_var6_plus(*static, scale=x.scale)
    for i in (0, 2):                                     # new queries (q and the absorbed qc)
        static[i].copy_(torch.randn(static[i].shape, device="cuda").to(dtype) * args[i].float().std())
    graph.replay()
    torch.cuda.synchronize()
    e_o, e_ol, e_lse = mla_var6_plus(*static, scale=x.scale)
    assert_close(g_o, e_o, dtype, name="graph o")
    assert_close(g_ol, e_ol, dtype, name="graph o_latent")
    assert_close(g_lse, e_lse, tol=LSE_TOLERANCE[dtype], name="graph lse")


@pytest.mark.skipif(not _on_sm90(), reason="needs a Hopper (sm_90) GPU with Gluon")
def test_sm90_partition_with_a_callers_hybrid_decode(monkeypatch):
    """The SM-partitioned call with the caller's HybridDecode: the same outputs to the bit as
    without one, its one side stream at every call, the latent part's launches bound in its
    decode state after an eager call, and a capture replaying the eager result."""
    from mla_var3.kernel.hybrid import HybridDecode, mla_var6_plus
    from mla_var3.shapes import get_preset

    monkeypatch.delenv("MLA_VAR3_CHECK", raising=False)        # value checks keep calls off the fast path
    dtype = torch.bfloat16
    x = R.make_inputs(get_preset("deepseek-v3"), Problem(b=2, s=16, t=1024, n=300, causal=True), dtype=dtype,
                      device="cuda")
    # qc contiguous, laid out as qpe (make_inputs' qc is a transposed product): the seesaw latent kernel,
    # which runs on the object's AbsorbedDecode, takes only queries whose rows qc and qpe order alike
    args = [x.q, x.qpe, x.qc.contiguous(), x.z_old, x.kpe, x.k_new, x.v_new]
    dec = HybridDecode("cuda")
    want = mla_var6_plus(*args, scale=x.scale)
    for _ in range(3):
        got = mla_var6_plus(*args, scale=x.scale, decode=dec)
        for a, b_ in zip(got, want):
            assert torch.equal(a, b_)
    assert dec.side_stream(x.q.device) is dec.side_stream(x.q.device) and len(dec._side) == 1
    assert dec.latent._bound                                    # the latent part's launches bound in its state
    static = [a.clone() for a in args]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_o, g_ol, g_lse = mla_var6_plus(*static, scale=x.scale, decode=dec)
    static[2].copy_(torch.randn(static[2].shape, device="cuda").to(dtype) * args[2].float().std())
    graph.replay()
    torch.cuda.synchronize()
    e_o, e_ol, e_lse = mla_var6_plus(*static, scale=x.scale, decode=dec)
    assert_close(g_o, e_o, dtype, name="graph o")
    assert_close(g_ol, e_ol, dtype, name="graph o_latent")
    assert_close(g_lse, e_lse, tol=LSE_TOLERANCE[dtype], name="graph lse")


@pytest.mark.parametrize("n", [0, 20], ids=["n0-absorbed", "n20"])
def test_a_callers_hybrid_decode_gives_the_same_outputs(monkeypatch, n):
    """A HybridDecode passed to the default call: the same outputs as without one; at n = 0 (the
    absorbed call) the absorbed entry runs on the object's latent state; anything else as decode
    is refused."""
    from mla_var3.kernel import absorbed
    from mla_var3.kernel.hybrid import HybridDecode

    seen = []
    real = absorbed.flash_mla

    def spy(*a, decode=None, **k):
        seen.append(decode)
        return real(*a, decode=decode, **k)

    monkeypatch.setattr(absorbed, "flash_mla", spy)
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    x = R.make_inputs(DIMS.replace(h=5), Problem(b=2, s=3, t=65, n=n), dtype=dtype, device=DEVICE)
    args = (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)
    dec = HybridDecode(DEVICE)
    want = mla_var6_plus(*args, scale=x.scale)
    got = mla_var6_plus(*args, scale=x.scale, decode=dec)
    for a, b_ in zip(got, want):
        assert torch.equal(a, b_)
    assert seen == ([None, dec.latent] if n == 0 else [])
    assert_close(got[1], R.mla_var6_plus(*args, x.scale, True)[1], dtype, name="o_latent")
    with pytest.raises(ValueError, match="decode must be a HybridDecode"):
        mla_var6_plus(*args, scale=x.scale, decode=dec.latent)


# ----------------------------------------------------------------------------------------------
# n = 0: the default call is the absorbed design
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,t,causal", [(3, 5, 1, 65, True), (2, 16, 4, 130, True), (1, 5, 16, 16, True),
                                            (2, 5, 5, 65, False)])
@pytest.mark.parametrize("buffers", [False, True], ids=["new outputs", "out buffers"])
def test_n0_runs_the_absorbed_kernel(b, h, s, t, causal, buffers, dtype):
    """With no window the default call is the absorbed design: its outputs are exactly what
    ``flash_mla`` over the latent cache returns (the hybrid's own latent part would round
    differently), ``o`` is zero, both against the fp32 reference with NaN-padded inputs and
    NaN-poisoned output buffers."""
    from mla_var3.kernel.absorbed import flash_mla

    x = R.make_inputs(DIMS.replace(h=h), Problem(b=b, s=s, t=t, n=0, causal=causal), dtype=dtype, device=DEVICE)
    ref_o, ref_ol, ref_lse = R.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, x.scale, causal)
    args = [nan_padded(a) for a in (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)]
    out = poisoned((b, h, s, DIMS.d), dtype, DEVICE) if buffers else None
    out_latent = poisoned((b, h, s, DIMS.k), dtype, DEVICE) if buffers else None
    o, o_latent, lse = mla_var6_plus(*args, scale=x.scale, causal=causal, out=out, out_latent=out_latent)
    want_ol, want_lse = flash_mla(args[2], args[1], args[3], args[4], scale=x.scale, causal=causal)
    assert torch.equal(o_latent, want_ol) and torch.equal(lse, want_lse)
    assert torch.equal(o, torch.zeros_like(o)) and o.shape == (b, h, s, DIMS.d) and o.dtype == dtype
    if buffers:
        assert o.data_ptr() == out.data_ptr() and o_latent.data_ptr() == out_latent.data_ptr()
    assert_close(o_latent, ref_ol, dtype, name="o_latent")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")
    assert_close(R.decompress(o_latent, x.w_uv, o), R.decompress(ref_ol, x.w_uv, ref_o), dtype, name="final")


def _valid_n0(dtype=torch.bfloat16):
    x = R.make_inputs(MLADims(h=3, d=32, p=16, k=64), Problem(b=2, s=4, t=10, n=0), dtype=dtype, device=DEVICE)
    return [x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new], x.scale


def _with_grad(x):
    return x.detach().clone().requires_grad_(True)


def _set(index, bad):
    """A change of one argument of a valid call."""
    def mutate(args):
        args[index] = bad(args[index])
    return mutate


def _too_short(args):
    """O = 3 old tokens for S = 4 queries."""
    args[3], args[4] = args[3][:, :3], args[4][:, :3]


@pytest.mark.parametrize("mutate,match", [
    (_set(0, lambda x: x[0]), r"q must be \[B, H, S, D\]"),
    (_set(1, lambda x: x[..., :8]), r"kpe must be .*P mismatch"),                    # qpe binds P first
    (_set(2, lambda x: x[..., :32]), r"z_old must be .*K mismatch"),
    (_set(3, lambda x: x[..., :32]), r"z_old must be \[B, O, K\]"),
    (_too_short, r"S <= O \+ N"),
    (_set(4, lambda x: x[:, :9]), r"kpe must be \[B, T, P\]"),
    (_set(5, lambda x: x[:, :, :2]), r"k_new must be \[B, N, H, D\]"),
    (_set(6, lambda x: torch.empty(x.shape[0], 1, *x.shape[2:], dtype=x.dtype, device=x.device)),
     r"v_new must be \[B, N, H, D\]"),
    (_set(3, lambda x: x.to(torch.float16)), r"z_old must have dtype"),
    (_set(5, lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta")), r"k_new is on meta"),
    (_set(6, _with_grad), r"inference only"),
    (_set(0, _with_grad), r"inference only"),
])
def test_bad_inputs_at_n0(mutate, match):
    """An N = 0 call skips the hybrid's checks only when it would pass them all
    (``_absorbed_shaped``): every bad input still reaches the checked path and its error."""
    from mla_var3.kernel import hybrid

    args, scale = _valid_n0()
    assert hybrid._absorbed_shaped(*args)
    mutate(args)
    assert not hybrid._absorbed_shaped(*args)
    with pytest.raises(ValueError, match=match):
        mla_var6_plus(*args, scale=scale)


def test_n0_fast_path_checks_the_scale_and_widths():
    """The N = 0 call without the hybrid's checks still refuses a bad scale (the absorbed call
    checks it), and K or P not a power of two >= 16 stays on the hybrid's own latent part."""
    from mla_var3.kernel import hybrid

    args, scale = _valid_n0()
    for bad in (-1.0, float("nan"), 0.0):
        with pytest.raises(ValueError, match="scale"):
            mla_var6_plus(*args, scale=bad)
    x = R.make_inputs(MLADims(h=3, d=32, p=24, k=64), Problem(b=2, s=4, t=10, n=0), dtype=torch.bfloat16, device=DEVICE)
    assert not hybrid._absorbed_shaped(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)


def test_n0_with_a_config_or_a_named_backend_runs_the_hybrids_latent_part(monkeypatch):
    """The absorbed path is the default call's: a portable config or a named backend keeps the
    hybrid's own latent kernel (what autotuning and the backend tests time)."""
    from mla_var3.kernel import absorbed, hybrid

    calls = []
    monkeypatch.setattr(absorbed, "flash_mla", lambda *a, **k: calls.append(1))
    x = R.make_inputs(DIMS.replace(h=5), Problem(b=2, s=3, t=65, n=0), dtype=torch.float32 if DEVICE == "cpu"
                      else torch.bfloat16, device=DEVICE)
    args = (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)
    cfg = MLAVar6PlusConfig(LatentPartConfig(block_h=2, block_s=8, block_n=16), FlashAttentionConfig(16, 16))
    for kw in (dict(config=cfg), dict(backend="triton")):
        o, o_latent, _ = mla_var6_plus(*args, scale=x.scale, **kw)
        assert_close(o_latent, R.mla_var6_plus(*args, x.scale, True)[1], x.q.dtype, name="o_latent")
    assert calls == []
    with pytest.raises(TypeError):     # the default call does go through flash_mla (patched to return None)
        hybrid.mla_var6_plus(*args, scale=x.scale)
    assert calls == [1]

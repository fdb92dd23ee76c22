"""The absorbed (FlashMLA-style) kernel on a dense latent cache, against the fp32 reference.

Runs under the Triton interpreter on CPU (bf16/fp16/fp32) and natively on a GPU (bf16/fp16).
Grid trimmed for the interpreter (~10 ms per program x key block): most cases use small widths
(K = 64, P = 16, h = 16); the real widths (DeepSeek K = 512 / P = 64, MiniCPM3 K = 256 / P = 32)
run at one or two shapes each. Every output buffer starts as NaN and every input is a view into
a NaN-padded buffer, so an unwritten output or a read past a valid length fails the check.
"""

import pytest
import torch

from mla_var3 import reference as ref
from mla_var3.kernel import backends
from mla_var3.kernel.absorbed import (
    FlashMLAConfig, candidate_configs, choose_num_splits, default_config, flash_mla, smem_estimate,
)
from mla_var3.shapes import MLADims, Problem, get_preset
from mla_var3.testing import TOLERANCE, assert_close, nan_padded, poisoned

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float16] + ([torch.float32] if DEVICE == "cpu" else [])
SMALL = MLADims(h=16, d=16, p=16, k=64)


def _inputs(dims, b, s, t, dtype, seed=0):
    x = ref.make_inputs(dims, Problem(b=b, s=s, t=t), dtype=dtype, device=DEVICE, seed=seed)
    # views into NaN-padded buffers: padding after the token, head and width dims
    return (x, nan_padded(x.qc, {1: 1, 3: 16}), nan_padded(x.qpe, {2: 1, 3: 16}),
            nan_padded(x.z, {1: 3, 2: 16}), nan_padded(x.kpe, {1: 3}))


def _check(dims, b, s, t, dtype, causal, *, seqlens=None, config=None, seed=0, z_nan_past=False):
    x, qc, qpe, z, kpe = _inputs(dims, b, s, t, dtype, seed)
    if z_nan_past and seqlens is not None:
        for i, n in enumerate(seqlens.tolist()):  # keys past a sequence's length are NaN
            z[i, n:] = float("nan")
            kpe[i, n:] = float("nan")
    out = poisoned((b, dims.h, s, dims.k), dtype, DEVICE)
    o, lse = flash_mla(qc, qpe, z, kpe, scale=x.scale, causal=causal, seqlens=seqlens, config=config, out=out)
    assert o.data_ptr() == out.data_ptr() and o.dtype == dtype and lse.dtype == torch.float32
    ro, rl = ref.flash_mla(qc, qpe, z, kpe, x.scale, causal, seqlens)
    assert_close(o, ro, dtype, name="o_latent")
    assert_close(lse, rl, tol=TOLERANCE[torch.float32] * 10 if dtype == torch.float32 else 1e-4, name="lse")


CASES = [  # (b, s, t, causal)
    (1, 1, 1, True),
    (1, 1, 63, True),
    (3, 1, 64, False),
    (1, 2, 65, True),
    (3, 5, 200, True),
    (1, 16, 16, True),     # s == t: a full causal triangle
    (1, 16, 65, True),
    (3, 2, 63, False),
]


@pytest.mark.parametrize("b,s,t,causal", CASES, ids=[f"b{b}-s{s}-t{t}-{'c' if c else 'nc'}" for b, s, t, c in CASES])
def test_bf16_matches_reference(b, s, t, causal):
    _check(SMALL, b, s, t, torch.bfloat16, causal)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.bfloat16], ids=str)
@pytest.mark.parametrize("b,s,t,causal", [(1, 1, 65, True), (3, 5, 200, True), (1, 16, 64, False)])
def test_other_dtypes_match_reference(dtype, b, s, t, causal):
    _check(SMALL, b, s, t, dtype, causal)


@pytest.mark.parametrize("h,s", [(5, 3), (40, 2)])
def test_heads_not_power_of_two(h, s):
    _check(SMALL.replace(h=h), 2, s, 70, torch.bfloat16, True)


@pytest.mark.parametrize("preset,s,t", [("deepseek-v3", 1, 65), ("deepseek-v3", 4, 40), ("minicpm3-4b", 2, 33)])
def test_preset_widths(preset, s, t):
    """The real latent/RoPE widths (K = 512, P = 64; K = 256, P = 32), fewer heads for time."""
    _check(get_preset(preset).replace(h=8), 1, s, t, torch.bfloat16, True)


@pytest.mark.parametrize("causal", [True, False])
def test_ragged_seqlens(causal):
    seqlens = torch.tensor([5, 130, 64], dtype=torch.int32, device=DEVICE)
    _check(SMALL, 3, 5, 130, torch.bfloat16, causal, seqlens=seqlens, z_nan_past=True)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_split_kv_forced(num_splits):
    """Split-KV on and off give the reference; with ragged lengths some splits are empty."""
    seqlens = torch.tensor([3, 200, 97], dtype=torch.int32, device=DEVICE)
    cfg = FlashMLAConfig(block_m=32, block_n=16, num_warps=4, num_stages=2, num_splits=num_splits)
    _check(SMALL, 3, 3, 200, torch.bfloat16, True, seqlens=seqlens, config=cfg, z_nan_past=True)


def test_split_kv_fp32_exact():
    """In fp32 the split and unsplit paths agree with the reference to fp32 rounding."""
    if DEVICE != "cpu":
        pytest.skip("float32 inputs run only under the interpreter")
    cfg = FlashMLAConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, num_splits=4)
    _check(SMALL, 1, 2, 100, torch.float32, True, config=cfg)


def test_non_contiguous_layouts():
    """qc / qpe from a [B, S, H, .] tensor, out written through a transposed view."""
    b, s, t, dtype = 2, 3, 70, torch.bfloat16
    x = ref.make_inputs(SMALL, Problem(b=b, s=s, t=t), dtype=dtype, device=DEVICE)
    qc = x.qc.transpose(1, 2).contiguous().transpose(1, 2)
    qpe = x.qpe.transpose(1, 2).contiguous().transpose(1, 2)
    out_bshk = poisoned((b, s, SMALL.h, SMALL.k), dtype, DEVICE)
    o, lse = flash_mla(qc, qpe, x.z, x.kpe, scale=x.scale, out=out_bshk.transpose(1, 2),
                       config=default_config(b, SMALL.h * s, t, SMALL.k, SMALL.p).replace(num_splits=3))
    ro, rl = ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale)
    assert_close(out_bshk.transpose(1, 2), ro, dtype)
    assert_close(lse, rl, tol=1e-4)


def test_backend_selection():
    x = ref.make_inputs(SMALL, Problem(b=1, s=1, t=8), dtype=torch.bfloat16, device=DEVICE)
    o, _ = flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=x.scale, backend="triton")
    assert_close(o, ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale)[0], torch.bfloat16)
    assert "triton" in backends.available("flash_mla", DEVICE)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=x.scale, backend="nope")


# ------------------------------------------------------------------------------------------
# launch configuration


def test_split_heuristic():
    # b=32, h=128, s=1: 64 programs of 64 rows leave SMs idle -> 2 splits; s=16 fills the GPU
    assert choose_num_splits(32, 128, 4096, block_m=64, block_n=32, sms=132) == 2
    assert choose_num_splits(32, 2048, 4096, block_m=64, block_n=32, sms=132) == 1
    # b=1, long context: many splits, capped by the context length
    assert choose_num_splits(1, 128, 32768, block_m=64, block_n=32, sms=132) == 64
    assert choose_num_splits(1, 128, 100, block_m=64, block_n=32, sms=132) == 1
    assert default_config(32, 128, 4096, sms=132).num_splits == 2


def test_configs_are_valid():
    cands = candidate_configs(8, 128, 4096, 512, 64, sms=132)
    assert cands[0] == default_config(8, 128, 4096, 512, 64, sms=132)
    assert len(cands) == len(set(cands)) > 5
    for c in cands:
        c.validate()
        assert smem_estimate(c, 512, 64) <= 232_448
    with pytest.raises(ValueError, match="block_n"):
        FlashMLAConfig(block_n=48).validate()
    with pytest.raises(ValueError, match="num_splits"):
        FlashMLAConfig(num_splits=0).validate()


# ------------------------------------------------------------------------------------------
# bad inputs


def _good(b=2, s=2, t=10, dtype=torch.bfloat16):
    x = ref.make_inputs(SMALL, Problem(b=b, s=s, t=t), dtype=dtype, device=DEVICE)
    return dict(qc=x.qc, qpe=x.qpe, z=x.z, kpe=x.kpe), x.scale


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(qc=a["qc"][0]), r"qc must be \[B, H, S, K\].*3-d"),
    (lambda a: a.update(qpe=a["qpe"][:, :3]), r"qpe must be \[B, H, S, P\].*H mismatch"),
    (lambda a: a.update(z=a["z"][..., :32]), r"z must be \[B, T, K\].*K mismatch"),
    (lambda a: a.update(kpe=a["kpe"][:, :7]), r"kpe must be \[B, T, P\].*T mismatch"),
    (lambda a: a.update(z=a["z"].half()), r"z must have dtype in \(bfloat16\), got float16"),
    (lambda a: a.update(qc=a["qc"].int(), qpe=a["qpe"].int()), r"qc must have dtype"),
    (lambda a: a.update(kpe=torch.empty(a["kpe"].shape, dtype=a["kpe"].dtype, device="meta")), r"kpe is on meta"),
    (lambda a: a.update(qc=a["qc"][..., :48], z=a["z"][..., :48]), r"power of two >= 16.*48"),
    (lambda a: a.update(z=a["z"][:, :1], kpe=a["kpe"][:, :1]), r"S=2 query tokens.*T=1"),
    (lambda a: a.update(seqlens=torch.tensor([10, 11], dtype=torch.int32, device=DEVICE)), r"seqlens must lie in"),
    (lambda a: a.update(seqlens=torch.tensor([1, 5], dtype=torch.int32, device=DEVICE)), r"seqlens must lie in"),
    (lambda a: a.update(seqlens=torch.tensor([5], dtype=torch.int32, device=DEVICE)), r"seqlens must be \[B\]"),
    (lambda a: a.update(seqlens=torch.tensor([5, 5.0], device=DEVICE)), r"seqlens must have dtype"),
    (lambda a: a.update(scale=-1.0), r"scale must be a positive"),
    (lambda a: a.update(out=torch.empty(2, 16, 2, 32, dtype=torch.bfloat16, device=DEVICE)), r"out must be"),
    (lambda a: a.update(config=FlashMLAConfig(block_m=24)), r"block_m must be a power of two"),
], ids=["rank", "dim-h", "dim-k", "dim-t", "dtype-mixed", "dtype-int", "device", "k-not-pow2", "s-gt-t",
        "seqlens-gt-t", "seqlens-lt-s", "seqlens-shape", "seqlens-dtype", "scale", "out-shape", "config"])
def test_bad_inputs(change, match):
    args, scale = _good()
    args["scale"] = scale
    change(args)
    with pytest.raises(ValueError, match=match):
        flash_mla(**args)

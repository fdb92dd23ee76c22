"""The expanded kernel (``mla_var3.kernel.expanded``) against the fp32 reference.

Dims are shrunk (d = 32, p = 16) so the interpreter stays fast; the edge cases are in the
sizes that matter for masking and tiling: t = 1, 63, 64, 65, 200 around the 64-key block, s = 1,
2, 5, 16 (causal), b = 1 and 3, h = 16 and a non-power-of-two h = 5, ragged ``seqlens``, split-KV,
several row blocks (prefill), non-power-of-two head dims. The grid is a curated list instead of
the full product: each case runs ~0.1-1 s under the interpreter.

Every output buffer starts as NaN and every input is a view into a NaN-padded buffer; keys
past a sequence's length are NaN too, so a read past a valid length fails the test.
"""

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.kernel.expanded import (
    FlashAttentionConfig, candidate_configs, default_config, flash_attention, tma_compatible,
)
from mla_var3.shapes import MLADims, Problem
from mla_var3.testing import assert_close, nan_padded, poisoned

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32] if DEVICE == "cpu" else [torch.bfloat16, torch.float16]


def _inputs(b, h, s, t, d, p, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    return randn(b, h, s, d), randn(b, h, s, p), randn(b, t, h, d), randn(b, t, h, d), randn(b, t, p)


def _poison_tail(x, seqlens):
    """NaN in every key position j >= seqlens[b] (dim 1 is T)."""
    x = x.clone()
    for i, n in enumerate(seqlens.tolist()):
        x[i, n:] = float("nan")
    return x


def _run_case(b, h, s, t, dtype, *, d=32, p=16, causal=True, seqlens=None, config=None, ramp=0.0,
              tma_layout=False):
    """Kernel vs reference on NaN-padded inputs. ``ramp`` scales key j by ``1 + ramp * j / t`` so
    the row max keeps growing along the keys (exercises the rescale); ``tma_layout`` pads every
    dim but the last, which keeps the strides TMA-compatible (the default padding breaks them)."""
    q, qpe, k, v, kpe = _inputs(b, h, s, t, d, p, dtype)
    if ramp:
        grow = 1.0 + ramp * torch.arange(t, dtype=torch.float32, device=DEVICE) / t
        k = (k.float() * grow[None, :, None, None]).to(dtype)
        kpe = (kpe.float() * grow[None, :, None]).to(dtype)
    scale = (d + p) ** -0.5
    ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, scale, causal, seqlens)
    if seqlens is not None:
        k, v, kpe = (_poison_tail(x, seqlens) for x in (k, v, kpe))
    args = [nan_padded(x, {i: 1 for i in range(x.dim() - 1)} if tma_layout else 1) for x in (q, qpe, k, v, kpe)]
    assert tma_compatible(*args) == tma_layout  # the default padding exercises the pointer fallback
    out = poisoned((b, h, s, d), dtype, DEVICE)
    o, lse = flash_attention(*args, causal=causal, seqlens=seqlens, config=config, out=out)
    assert o.data_ptr() == out.data_ptr() and o.dtype == dtype and lse.dtype == torch.float32
    assert_close(o, ref_o, dtype, name="o")
    assert_close(lse, ref_lse, torch.float32, tol=1e-5, name="lse")


CASES = [  # b, h, s, t
    (1, 16, 1, 1),
    (3, 5, 1, 63),
    (1, 16, 1, 200),
    (3, 5, 2, 64),
    (1, 16, 2, 65),
    (3, 5, 5, 65),
    (1, 16, 5, 200),
    (1, 5, 16, 16),
    (3, 5, 16, 63),
    (1, 16, 16, 200),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,t", CASES, ids=[f"b{b}-h{h}-s{s}-t{t}" for b, h, s, t in CASES])
def test_causal(b, h, s, t, dtype):
    _run_case(b, h, s, t, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,s,t", [(3, 5, 5, 65), (1, 16, 1, 200)], ids=["b3-s5-t65", "b1-s1-t200"])
def test_not_causal(b, h, s, t, dtype):
    _run_case(b, h, s, t, dtype, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("s,lens,causal", [
    (1, [1, 64, 65], True),
    (5, [5, 130, 200], True),
    (2, [63, 2, 200], False),
], ids=["decode", "spec-causal", "not-causal"])
def test_ragged_seqlens(s, lens, causal, dtype):
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    _run_case(3, 5, s, max(lens), dtype, causal=causal, seqlens=seqlens)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_kv(dtype):
    """num_splits > 1 (decode path for small batches), with ragged lengths: some splits empty."""
    seqlens = torch.tensor([3, 200], dtype=torch.int32, device=DEVICE)
    _run_case(2, 3, 3, 200, dtype, seqlens=seqlens, config=FlashAttentionConfig(16, 16, num_splits=5))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_row_blocks(dtype):
    """Several row blocks per head: the fully masked key blocks above the diagonal are skipped,
    the diagonal ones masked (block_n < block_m and > block_m both)."""
    _run_case(1, 2, 70, 100, dtype, config=FlashAttentionConfig(32, 16))
    _run_case(1, 2, 70, 70, dtype, config=FlashAttentionConfig(16, 32))


def test_odd_head_dims():
    """Head dims that are not powers of two are padded and masked."""
    _run_case(2, 3, 5, 65, DTYPES[0], d=24, p=8)


def test_default_scale_and_configs():
    q, qpe, k, v, kpe = _inputs(1, 2, 3, 20, 32, 16, torch.float32 if DEVICE == "cpu" else torch.bfloat16)
    o1, _ = flash_attention(q, qpe, k, v, kpe)
    o2, _ = flash_attention(q, qpe, k, v, kpe, scale=48 ** -0.5)
    assert torch.equal(o1, o2)
    cfg = default_config(MLADims(h=128), Problem(b=32, s=16, t=4096))
    assert cfg.block_m == 16 and cfg.num_splits == 1
    assert default_config(MLADims(h=16), Problem(b=1, s=1, t=4096)).num_splits > 1
    cands = candidate_configs(MLADims(h=16), Problem(b=2, s=512, t=4096))
    assert cands and all(isinstance(c, FlashAttentionConfig) for c in cands)
    with pytest.raises(ValueError, match="block_m"):
        FlashAttentionConfig(block_m=24)


def _valid(dtype=torch.bfloat16):
    return list(_inputs(2, 3, 4, 10, 32, 16, dtype))


@pytest.mark.parametrize("index,bad,match", [
    (0, lambda x: x[0], r"q must be \[B, H, S, D\]"),                               # wrong rank
    (4, lambda x: x[..., :8], r"kpe must be \[B, T, P\]"),                           # P mismatch
    (2, lambda x: x[:, :, :2], r"k must be \[B, T, H, D\]"),                         # H mismatch
    (3, lambda x: x[:, :9], r"v must be \[B, T, H, D\]"),                            # T mismatch
    (1, lambda x: x.to(torch.float16), r"qpe must have dtype"),                      # mixed dtype
    (0, lambda x: x.to(torch.int32), r"q must have dtype"),                          # integer dtype
    (3, lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta"), r"v is on meta"),  # mixed devices
])
def test_bad_inputs(index, bad, match):
    args = _valid()
    args[index] = bad(args[index])
    with pytest.raises(ValueError, match=match):
        flash_attention(*args)


def test_bad_ranges():
    q, qpe, k, v, kpe = _valid()
    with pytest.raises(ValueError, match="S <= T"):
        flash_attention(q, qpe, k[:, :3], v[:, :3], kpe[:, :3])
    with pytest.raises(ValueError, match="seqlens must lie"):
        flash_attention(q, qpe, k, v, kpe, seqlens=torch.tensor([4, 11], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="seqlens must lie"):
        flash_attention(q, qpe, k, v, kpe, seqlens=torch.tensor([3, 10], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="seqlens must be"):
        flash_attention(q, qpe, k, v, kpe, seqlens=torch.tensor([4, 5, 6], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="scale"):
        flash_attention(q, qpe, k, v, kpe, scale=0.0)
    with pytest.raises(ValueError, match="out must be"):
        flash_attention(q, qpe, k, v, kpe, out=torch.empty(2, 3, 4, 16, dtype=q.dtype, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_masked_stages_and_reversed_row_blocks(dtype):
    """A single-stage masked loop (masked_stages=1) and the last-first row-block order give the
    same results: causal prefill with several row blocks, queries at the end of a longer cache."""
    cfg = FlashAttentionConfig(32, 16, masked_stages=1)
    _run_case(1, 2, 70, 70, dtype, config=cfg)
    _run_case(2, 3, 40, 100, dtype, config=cfg, seqlens=torch.tensor([40, 97], dtype=torch.int32, device=DEVICE))


def test_compute_bound_configs():
    """The defaults measured fastest on an H200: s = 128 gets 64-row tiles on 4 warps (two
    programs per SM); s > 128 gets 128-row tiles, 3 stages, a single-stage masked loop, within
    the shared-memory limit. Candidates stay under the sm_90 limit and include the single-stage
    masked loop for 128-row tiles; labels are distinct."""
    from mla_var3.kernel._common import SMEM_LIMIT
    from mla_var3.kernel.expanded import SMEM_PER_SM, smem_bytes

    for b, s, t in [(32, 512, 4096), (32, 1024, 4096), (4, 4096, 4096)]:
        cfg = default_config(MLADims(h=128), Problem(b=b, s=s, t=t))
        assert cfg == FlashAttentionConfig(128, 64, 8, 3, 1, masked_stages=1)
        assert smem_bytes(cfg.block_m, cfg.block_n, cfg.num_stages) <= SMEM_LIMIT
    cfg = default_config(MLADims(h=128), Problem(b=32, s=128, t=4096))
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_splits) == (64, 64, 4, 1)
    assert 2 * (smem_bytes(cfg.block_m, cfg.block_n, cfg.num_stages) + 1024) <= SMEM_PER_SM
    assert smem_bytes(128, 64, 3) == 172_032 and smem_bytes(64, 64, 2) == 106_496  # as Triton reports them
    cands = candidate_configs(MLADims(h=128), Problem(b=32, s=512, t=4096))
    assert all(smem_bytes(c.block_m, c.block_n, c.num_stages) <= SMEM_LIMIT for c in cands)
    assert any(c.masked_stages == 1 for c in cands)
    assert default_config(MLADims(h=128), Problem(b=32, s=512, t=4096)) in cands
    assert len({c.label() for c in cands}) == len(cands)
    with pytest.raises(ValueError, match="masked_stages"):
        FlashAttentionConfig(masked_stages=-1)


SM90_CONFIGS = [None, FlashAttentionConfig(64, 64, 4, 2),
                FlashAttentionConfig(128, 64, 8, 3, masked_stages=1, rescale_threshold=8.0),
                FlashAttentionConfig(128, 64, 8, 3, rescale_threshold=8.0, tma=True)]


@pytest.mark.parametrize("cfg", SM90_CONFIGS, ids=["default-s512"] + [c.label() for c in SM90_CONFIGS[1:]])
def test_compute_bound_compiles_for_sm90(cfg):
    """The GPU path of the compute-bound configs (bf16, b = 32, s = 512, t = 4096): HGMMA, no
    spills, and the shared memory :func:`smem_bytes` predicts (the 64-row tile fits two per SM;
    TMA adds its mbarriers, < 1 KiB); the lazy-rescale and TMA candidates too."""
    from mla_var3.kernel.expanded import SMEM_PER_SM, example_launch, smem_bytes
    from mla_var3.kernel.sass import compile_launch_in_subprocess

    args, cfg = example_launch(32, 128, 512, 4096, config=cfg)
    rep = compile_launch_in_subprocess("mla_var3.kernel.expanded", "_flash_attention_kernel", args,
                                       num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    print(rep.summary())
    assert rep.hgmma and rep.spills == 0, rep.summary()
    expect = smem_bytes(cfg.block_m, cfg.block_n, cfg.num_stages)
    assert expect <= rep.shared_bytes <= expect + (1024 if cfg.tma or cfg.rescale_threshold else 0), rep.summary()
    if cfg.num_warps == 4:
        assert 2 * (rep.shared_bytes + 1024) <= SMEM_PER_SM and rep.registers * 128 * 2 <= 65536, rep.summary()


# -- lazy rescale and TMA loads (config fields rescale_threshold, tma) ---------------------------

LAZY_TMA = [  # (config, tma_layout): thresholds that rescale often / almost never; TMA and its fallback
    (FlashAttentionConfig(32, 16, rescale_threshold=0.5), False),
    (FlashAttentionConfig(32, 16, rescale_threshold=16.0, masked_stages=1), False),
    (FlashAttentionConfig(32, 16, tma=True), True),
    (FlashAttentionConfig(32, 16, tma=True), False),
    (FlashAttentionConfig(16, 32, rescale_threshold=8.0, tma=True), True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg,tma_layout", LAZY_TMA, ids=[c.label() + ("-aligned" if a else "-fallback")
                                                          for c, a in LAZY_TMA])
def test_lazy_rescale_and_tma_prefill(cfg, tma_layout, dtype):
    """Causal prefill with several row blocks and a row max that grows along the keys (the lazy
    rescale must fire mid-loop), then queries at the end of a longer ragged cache: same results
    as the reference for both thresholds, with TMA descriptors and with the pointer fallback."""
    _run_case(1, 2, 70, 70, dtype, config=cfg, ramp=12.0, tma_layout=tma_layout)
    _run_case(2, 3, 40, 100, dtype, config=cfg, ramp=12.0, tma_layout=tma_layout,
              seqlens=torch.tensor([40, 97], dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lazy_rescale_and_tma_decode(dtype):
    """Decode-shaped problems on the new paths: s = 1 padded to a 16-row tile (TMA zero-fills the
    missing query rows), not causal, ragged lengths and split-KV with empty splits."""
    cfg = FlashAttentionConfig(16, 16, rescale_threshold=8.0, tma=True)
    _run_case(3, 5, 1, 65, dtype, config=cfg, tma_layout=True, ramp=12.0)
    _run_case(3, 5, 2, 64, dtype, config=cfg, tma_layout=True, causal=False,
              seqlens=torch.tensor([63, 2, 64], dtype=torch.int32, device=DEVICE))
    _run_case(2, 3, 3, 200, dtype, config=FlashAttentionConfig(16, 16, num_splits=5, rescale_threshold=8.0, tma=True),
              tma_layout=True, seqlens=torch.tensor([3, 200], dtype=torch.int32, device=DEVICE))


def test_lazy_tma_config_fields():
    """Labels name the new fields; bad thresholds are rejected; the candidates carry TMA and
    lazy-rescale variants of the 128-row tiles within the shared-memory limit; the TMA path is
    chosen only for TMA-compatible inputs."""
    from mla_var3.kernel._common import SMEM_LIMIT
    from mla_var3.kernel.expanded import _kernel_args, smem_bytes

    assert FlashAttentionConfig(128, 64, 8, 3, masked_stages=1, rescale_threshold=8.0, tma=True).label() == \
        "m128n64w8s3k1r8t"
    assert FlashAttentionConfig(rescale_threshold=0.5).label() == "m64n64w4s2r0.5"
    for bad in (-1.0, 17.0):
        with pytest.raises(ValueError, match="rescale_threshold"):
            FlashAttentionConfig(rescale_threshold=bad)
    cands = candidate_configs(MLADims(h=128), Problem(b=32, s=512, t=4096))
    new = [c for c in cands if c.tma]
    assert new and any(c.rescale_threshold == 8.0 for c in new) and all(c.block_m == 128 for c in new)
    assert all(smem_bytes(c.block_m, c.block_n, c.num_stages) + 1024 <= SMEM_LIMIT for c in new)
    assert len({c.label() for c in cands}) == len(cands)
    default = default_config(MLADims(h=128), Problem(b=32, s=512, t=4096))
    assert not default.tma and not default.rescale_threshold

    q, qpe, k, v, kpe = _inputs(1, 2, 4, 32, 32, 16, torch.bfloat16)
    lse = torch.empty(1, 2, 4)
    cfg = FlashAttentionConfig(16, 16, tma=True)
    _, args = _kernel_args(q, qpe, k, v, kpe, q, lse, None, 0.1, True, cfg, True)
    assert args["USE_TMA"] and args["RESCALE_THRESHOLD"] == 0.0
    k_off = torch.empty(k.numel() + 1, dtype=k.dtype, device=DEVICE)[1:].view(k.shape)  # base 2 bytes off
    assert not tma_compatible(k_off) and not tma_compatible(k.transpose(-1, -2))
    _, args = _kernel_args(q, qpe, k_off, v, kpe, q, lse, None, 0.1, True, cfg, True)
    assert not args["USE_TMA"]

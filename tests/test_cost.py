"""Cost models pinned to hand-computed values (DeepSeek-V3, bf16) and to the seed's statements."""

import pytest

from mla_var3.analysis.cost import (
    COST_MODELS, DESIGN_MODELS, Cost, absorb_query, cost, decompress, design_pipeline, flash_attention,
    flash_attention_shared_kpe, flash_mla, get_cost_model, mla_var6_plus, split_kv_combine,
)
from mla_var3.shapes import MLADims, Problem, get_preset

V3 = get_preset("deepseek-v3")


# --- hand-computed values: b=32, h=128, d=128, p=64, k=512, w=2 -----------------------------

def test_flash_attention_decode_exact():
    c = flash_attention(V3, Problem(b=32, s=1, t=4096))
    assert c.flops == 2 * 32 * 128 * 1 * 4096 * 320 == 10_737_418_240
    assert c.bytes == 2 * 32 * 128 * (1 + 4096) * 320 == 10_740_039_680


def test_flash_attention_prefill_exact():
    c = flash_attention(V3, Problem(b=32, s=1024, t=4096))
    assert c.flops == 10_995_116_277_760
    assert c.bytes == 13_421_772_800


def test_flash_attention_shared_kpe_exact():
    c = flash_attention_shared_kpe(V3, Problem(b=32, s=16, t=4096))
    assert c.flops == flash_attention(V3, Problem(b=32, s=16, t=4096)).flops == 171_798_691_840
    # Q, QPE, O per head + K, V per head + one RoPE key per token
    assert c.bytes == 2 * (32 * 128 * 16 * 320 + 32 * 4096 * (2 * 128 * 128 + 64)) == 8_648_654_848


def test_flash_mla_exact():
    c = flash_mla(V3, Problem(b=32, s=1, t=4096))
    assert c.flops == 2 * 32 * 128 * 4096 * 1088 == 36_507_222_016
    assert c.bytes == 2 * (32 * 128 * 1088 + 32 * 4096 * 576) == 159_907_840


def test_mla_var6_plus_exact():
    c = mla_var6_plus(V3, Problem(b=32, s=16, t=4096, n=1024))
    b, h, s, t, d, p, k, n, o = 32, 128, 16, 4096, 128, 64, 512, 1024, 3072
    assert c.flops == 2 * b * h * s * t * p + 4 * b * h * s * n * d + 4 * b * h * s * o * k == 481_036_337_152
    assert c.bytes == 2 * (b * h * s * p + b * h * s * d + b * h * s * k + b * o * k + b * t * p
                           + 2 * b * h * n * d + b * h * s * d + b * h * s * k) == 2_441_084_928


def test_stage_models_exact():
    pr = Problem(b=32, s=16, t=4096)
    assert absorb_query(V3, pr) == Cost(2 * 32 * 128 * 16 * 128 * 512, 2 * (32 * 128 * 16 * 128 + 128 * 128 * 512 + 32 * 128 * 16 * 512))
    assert absorb_query(V3, pr) == Cost(8_589_934_592, 100_663_296)
    assert decompress(V3, pr) == Cost(8_589_934_592, 100_663_296)
    acc = decompress(V3, pr, accumulate=True)
    assert acc.flops == 8_589_934_592 + 32 * 128 * 16 * 128
    assert acc.bytes == 100_663_296 + 2 * 32 * 128 * 16 * 128
    comb = split_kv_combine(V3, Problem(b=32, s=1, t=4096), splits=4)
    assert comb == Cost(2 * 4 * 32 * 128 * 512, 4 * 4 * 32 * 128 * 513 + 2 * 32 * 128 * 512) == Cost(16_777_216, 37_814_272)


def test_split_kv_combine_rejects_bad_splits():
    with pytest.raises(ValueError, match="splits"):
        split_kv_combine(V3, Problem(b=1, s=1, t=8), splits=0)


def test_fp8_halves_bytes_not_flops():
    pr = Problem(b=4, s=2, t=300)
    c16, c8 = flash_mla(V3, pr), flash_mla(V3.with_dtype("fp8"), pr)
    assert c8.flops == c16.flops and 2 * c8.bytes == c16.bytes


# --- the seed's statements --------------------------------------------------------------------

@pytest.mark.parametrize("b", [32, 64])
def test_seed_fa_intensity(b):
    ai1 = flash_attention(V3, Problem(b=b, s=1, t=4096)).intensity
    ai1024 = flash_attention(V3, Problem(b=b, s=1024, t=4096)).intensity
    assert ai1 == pytest.approx(4096 / 4097, rel=1e-12)          # 0.99976 ≈ 1
    assert ai1024 == pytest.approx(819.2, rel=1e-12)              # = 1024·4096 / 5120


@pytest.mark.parametrize("b", [32, 64])
def test_seed_flash_mla_intensity(b):
    ai = flash_mla(V3, Problem(b=b, s=1, t=4096)).intensity
    assert ai == pytest.approx(228.3016393442623, rel=1e-12)      # ≈ 228 (b cancels)
    assert round(ai) == 228


def test_seed_flops_ratio_per_token():
    pr = Problem(b=32, s=16, t=4096)
    assert flash_mla(V3, pr).flops / flash_attention(V3, pr).flops == pytest.approx(1088 / 320) == 3.4


@pytest.mark.parametrize("s", [1, 16, 128])
def test_seed_hybrid_end_points(s):
    pr = Problem(b=32, s=s, t=4096)
    assert mla_var6_plus(V3, pr.with_n(0)).flops == flash_mla(V3, pr).flops
    assert mla_var6_plus(V3, pr.with_n(4096)).flops == flash_attention(V3, pr).flops


def test_hybrid_linear_in_n():
    pr = Problem(b=3, s=5, t=100)
    c = [mla_var6_plus(V3, pr.with_n(n)) for n in (0, 40, 80)]
    assert c[1].flops - c[0].flops == c[2].flops - c[1].flops
    assert c[1].bytes - c[0].bytes == c[2].bytes - c[1].bytes


def test_custom_dims_everywhere():
    dims = MLADims(h=16, d=64, p=32, k=256, dv=64, layers=2, hidden=512, q_lora_rank=None)
    c = flash_mla(dims, Problem(b=2, s=3, t=50))
    assert c.flops == 2 * 2 * 16 * 3 * 50 * (2 * 256 + 32)
    assert c.bytes == 2 * (2 * 16 * 3 * (2 * 256 + 32) + 2 * 50 * (256 + 32))


def test_registry_and_pipeline():
    assert set(DESIGN_MODELS) == {"flash_attention", "flash_mla", "mla_var6_plus"}
    assert set(DESIGN_MODELS) <= set(COST_MODELS)
    pr = Problem(b=2, s=4, t=64, n=16)
    assert cost("flash_mla", V3, pr) == flash_mla(V3, pr)
    assert design_pipeline("flash_mla", V3, pr) == flash_mla(V3, pr) + absorb_query(V3, pr) + decompress(V3, pr)
    assert design_pipeline("flash_attention", V3, pr) == flash_attention(V3, pr)
    with pytest.raises(ValueError, match="unknown design 'nope'"):
        get_cost_model("nope")

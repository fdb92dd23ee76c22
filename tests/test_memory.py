"""KV-cache accounting and the capacity planner, pinned to hand-computed values."""

import math

import pytest

from mla_var3.analysis.memory import (
    cache_layouts, cache_total_bytes, expanded_cache_bytes, gqa_bytes_per_token, hybrid_cache_bytes, max_window_n,
    mha_bytes_per_token, mla_bytes_per_token, mla_cache_bytes, mqa_bytes_per_token, paged_cache_bytes, plan_capacity,
)
from mla_var3.shapes import MLADims, get_preset

V3 = get_preset("deepseek-v3")


def test_agreed_per_layer_formulas():
    assert mla_cache_bytes(V3, 2, 10) == 2 * 10 * 576 * 2 == 23_040
    assert expanded_cache_bytes(V3, 2, 10) == 2 * 10 * (2 * 128 * 128 + 64) * 2 == 1_313_280
    assert hybrid_cache_bytes(V3, 2, o=7, n=3) == 2 * (7 * 576 + 3 * 32_832) * 2 == 410_112
    assert hybrid_cache_bytes(V3, 2, o=7, n=3, keep_latent_window=True) == 410_112 + 2 * 3 * 512 * 2 == 416_256
    assert paged_cache_bytes(V3, 5) == 5 * 64 * 576 * 2 == 368_640
    assert paged_cache_bytes(V3, 5, block_size=16) == 5 * 16 * 576 * 2


def test_hybrid_end_points():
    assert hybrid_cache_bytes(V3, 3, o=100, n=0) == mla_cache_bytes(V3, 3, 100)
    assert hybrid_cache_bytes(V3, 3, o=0, n=100) == expanded_cache_bytes(V3, 3, 100)


def test_rope_key_counts():
    """Forgetting p undercounts MLA's cache: 576 elements per token per layer, not 512."""
    assert mla_bytes_per_token(V3) == 576 * 2
    assert mla_bytes_per_token(V3.with_dtype("fp8")) == 576


def test_classic_layouts():
    assert mha_bytes_per_token(32, 128, 2) == 2 * 32 * 128 * 2 == 16_384
    assert gqa_bytes_per_token(8, 128, 2) == 4_096
    assert mqa_bytes_per_token(128, 2) == 512
    assert mha_bytes_per_token(128, 192, 2, v_head=128) == 128 * 320 * 2 == 81_920
    assert cache_total_bytes(1152, layers=61, batch=4, context=1000) == 1152 * 61 * 4 * 1000


def test_cache_layouts_rows():
    rows = {r.layout: r.bytes_per_token_layer for r in cache_layouts(V3, context=4096, n=1024, gqa_groups=8)}
    assert rows["MLA latent"] == 1152
    assert rows["MHA (h=128)"] == 81_920
    assert rows["GQA (g=8)"] == 5_120
    assert rows["hybrid (n=1024 of 4096)"] == pytest.approx((3072 * 1152 + 1024 * 65_664) / 4096)
    with pytest.raises(ValueError, match="exceeds"):
        cache_layouts(V3, context=10, n=11)


def test_bad_sizes():
    with pytest.raises(ValueError, match="b must be"):
        mla_cache_bytes(V3, -1, 10)
    with pytest.raises(ValueError, match="n must be"):
        hybrid_cache_bytes(V3, 1, 1, 2.5)


def test_capacity_deepseek_v3_h200_tp8():
    plan = plan_capacity(V3, 141e9, tp=8, context=32768)
    assert plan.weights_bytes == pytest.approx(671e9 / 8)         # FP8 checkpoint: 1 byte per parameter
    assert plan.reserve_bytes == pytest.approx(14.1e9)
    assert plan.cache_budget_bytes == pytest.approx(141e9 - 83.875e9 - 14.1e9)
    assert plan.cache_bytes_per_token == 61 * 1152 == 70_272
    assert plan.tokens == int((141e9 - 83.875e9 - 14.1e9) // 70_272) == 612_263
    assert plan.sequences == 612_263 // 32768 == 18
    exp = plan_capacity(V3, 141e9, tp=8, context=32768, layout="expanded")
    assert exp.cache_bytes_per_token == 61 * (2 * 16 * 128 + 64) * 2      # heads split over the ranks
    assert exp.tokens < plan.tokens


def test_capacity_does_not_fit_and_explicit_inputs():
    assert not plan_capacity(V3, 141e9, tp=1).fits
    assert plan_capacity(V3, 141e9, tp=1).tokens == 0
    plan = plan_capacity(get_preset("deepseek-v2-lite"), 80e9, params=16e9, weight_dtype="bf16", reserve_bytes=8e9, context=4096)
    per_tok = 27 * 576 * 2
    assert plan.tokens == int((80e9 - 32e9 - 8e9) // per_tok)
    assert plan.sequences == plan.tokens // 4096


def test_capacity_errors():
    custom = MLADims()
    with pytest.raises(ValueError, match="no published parameter count"):
        plan_capacity(custom, 80e9)
    with pytest.raises(ValueError, match="divisor"):
        plan_capacity(V3, 80e9, tp=3)
    with pytest.raises(ValueError, match="layout"):
        plan_capacity(V3, 80e9, tp=8, layout="gqa")


def test_window_bytes_and_cap_by_hand():
    """The window n·(h/tp)·2d·w per sequence per layer; its cap under a budget, by hand."""
    from mla_var3.analysis.memory import max_window_n, window_bytes

    assert window_bytes(V3, 1) == 128 * 256 * 2 == 65_536
    assert window_bytes(V3, 1250) == 81_920_000                      # ~82 MB per sequence per layer
    assert window_bytes(V3, 1250, tp=8) == 1250 * 16 * 256 * 2 == 10_240_000
    latent = 4096 * 576 * 2                                           # the latent cache of t = 4096
    assert latent == mla_cache_bytes(V3, 1, 4096) == 4_718_592
    assert max_window_n(V3, latent) == 72                             # 4,718,592 / 65,536 = 72.0
    assert max_window_n(V3, latent, tp=8) == 576                      # / 8,192
    assert max_window_n(V3, latent - 1) == 71
    assert max_window_n(V3, 0) == 0
    with pytest.raises(ValueError, match="divisor"):
        window_bytes(V3, 4, tp=3)
    with pytest.raises(ValueError, match=">= 0 bytes"):
        max_window_n(V3, -1.0)


@pytest.mark.parametrize("kwargs,words", [
    (dict(device_memory_bytes=math.nan), "device memory"),
    (dict(device_memory_bytes=math.inf), "device memory"),
    (dict(device_memory_bytes=0.0), "device memory"),
    (dict(reserve_bytes=math.nan), "reserve"),
    (dict(reserve_bytes=-1.0), "reserve"),
    (dict(reserve_bytes=math.inf), "reserve"),
    (dict(params=math.nan), "params"),
    (dict(params="1e9"), "params"),
    (dict(reserve_fraction=math.nan), "reserve_fraction"),
    (dict(reserve_fraction=1.5), "reserve_fraction"),
    (dict(tp=True), "tp"),
])
def test_plan_capacity_refuses_nan_infinite_and_wrong_amounts(kwargs, words):
    """NaN made every comparison false: the plan came back silently empty (0 tokens)."""
    args = dict(device_memory_bytes=141e9) | kwargs
    with pytest.raises(ValueError, match=f"plan_capacity: {words}"):
        plan_capacity(get_preset("deepseek-v3"), **args)


@pytest.mark.parametrize("budget", [math.nan, math.inf, -1.0, "4MB"])
def test_max_window_n_refuses_non_finite_budgets(budget):
    with pytest.raises(ValueError, match="window budget"):
        max_window_n(get_preset("deepseek-v3"), budget)


def test_cache_layouts_needs_kv_groups():
    with pytest.raises(ValueError, match="gqa_groups"):
        cache_layouts(get_preset("deepseek-v3"), gqa_groups=0)

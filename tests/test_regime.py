"""Regime guide: closed-form hybrid split vs brute force, crossovers, the seed's regimes."""

import pytest

from mla_var3.analysis.cost import flash_attention, flash_mla
from mla_var3.analysis.devices import get_device, parse_devices
from mla_var3.analysis.memory import hybrid_cache_bytes
from mla_var3.analysis.regime import (
    best_hybrid_n, choose_n, crossover_s, max_hybrid_n, regime_guide, scan_hybrid_n,
)
from mla_var3.analysis.roofline import predict
from mla_var3.shapes import MLADims, Problem, get_preset

V3 = get_preset("deepseek-v3")


@pytest.mark.parametrize("device,ceilings", [("h200", "measured"), ("h200", "datasheet"), ("rtx-5090", "datasheet"), ("h20", "datasheet")])
@pytest.mark.parametrize("s", [1, 3, 16, 64, 300])
def test_best_n_matches_brute_force(device, ceilings, s):
    pr = Problem(b=8, s=s, t=700)
    fast, slow = best_hybrid_n(V3, pr, device, ceilings), scan_hybrid_n(V3, pr, device, ceilings)
    assert fast.time_s == pytest.approx(slow.time_s, rel=1e-12)
    assert fast.n == slow.n
    assert 0 <= fast.n <= pr.t


def test_best_n_matches_brute_force_full_size():
    pr = Problem(b=32, s=16, t=4096)
    fast, slow = best_hybrid_n(V3, pr, "h200"), scan_hybrid_n(V3, pr, "h200")
    assert (fast.n, fast.time_s) == (slow.n, pytest.approx(slow.time_s, rel=1e-12))
    assert fast.n == 1190                       # where compute and memory time balance
    assert fast.n_balance == pytest.approx(1190.08, abs=0.01)


def test_best_n_custom_dims_small_heads():
    dims = MLADims(h=2, d=16, p=8, k=256, dv=16, layers=1, hidden=64, q_lora_rank=None)   # 2hd < k: expanded is lighter
    pr = Problem(b=2, s=4, t=97)
    assert best_hybrid_n(dims, pr, "h200").time_s == pytest.approx(scan_hybrid_n(dims, pr, "h200").time_s, rel=1e-12)


def test_crossover_is_first_s_where_fa_wins():
    dev = get_device("h200")
    ceil = dev.ceilings("measured")
    sx = crossover_s(V3, 32, 4096, "h200")

    def time(model, s):
        c = model(V3, Problem(b=32, s=s, t=4096))
        return max(c.flops / ceil.flops_per_s, c.bytes / ceil.bytes_per_s)

    assert sx == 50
    assert time(flash_attention, sx) < time(flash_mla, sx)
    assert all(time(flash_attention, s) >= time(flash_mla, s) for s in range(1, sx))


def test_crossover_h200_datasheet():
    assert crossover_s(V3, 32, 4096, "h200", "datasheet") == 62


def test_rtx5090_crossover_and_why():
    """The datasheet roofline puts the crossover at s = 35, just above the seed's 16-32.

    The seed's kernels did not run at the roofline: its FlashMLA reached ~113 TFLOP/s at s = 16
    (54 % of 209.5) while its FlashAttention streamed ~1.58 TB/s at s = 1 (88 % of 1,792 GB/s).
    With those achieved rates as ceilings the model lands inside the seed's band.
    """
    assert crossover_s(V3, 32, 4096, "rtx-5090", "datasheet") == 35
    mla16 = flash_mla(V3, Problem(b=32, s=16, t=4096))
    fa1 = flash_attention(V3, Problem(b=32, s=1, t=4096))
    achieved_tflops = mla16.flops / 5161e-6 / 1e12
    achieved_gbs = fa1.bytes / 6781e-6 / 1e9
    assert achieved_tflops == pytest.approx(113.2, abs=0.1)
    assert achieved_gbs == pytest.approx(1583.8, abs=0.1)
    seed = parse_devices(
        f'{{"seed-5090": {{"name": "seed", "bf16_tflops": {achieved_tflops}, "bandwidth_gbs": {achieved_gbs}, "memory_gb": 32}}}}'
    )["seed-5090"]
    sx = crossover_s(V3, 32, 4096, seed, "datasheet")
    assert 16 <= sx <= 32 and sx == 22


def test_rtx5090_seed_decode_ratio():
    """The seed measured FlashMLA ~16x faster than FlashAttention at s = 1 on the RTX 5090."""
    fa = predict("flash_attention", V3, Problem(b=32, s=1, t=4096), "rtx-5090").time_s
    mla = predict("flash_mla", V3, Problem(b=32, s=1, t=4096), "rtx-5090").time_s
    assert fa / mla == pytest.approx(34.3, abs=0.1)          # the model: 34x; the seed measured 6781/419 = 16x


def test_regime_guide_h200():
    g = regime_guide(V3, "h200", b=32, t=4096)
    by_s = {r.s: r for r in g.rows}
    assert [r.s for r in g.rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert by_s[1].best == "flash_mla"
    assert by_s[16].best == "mla_var6_plus" and by_s[16].hybrid.n == 1190
    assert by_s[1024].best == "flash_attention"
    assert g.crossover_s == 50
    regimes = {e.regime: e for e in g.regimes}
    assert regimes["decode"].best == "flash_mla"
    assert regimes["speculative"].best == "mla_var6_plus"
    assert regimes["prefill"].best == "flash_attention"
    d = g.to_dict()
    assert d["crossover_s"] == 50 and d["rows"][0]["times_s"]["flash_mla"] == by_s[1].times["flash_mla"]


def test_regime_guide_custom_s_and_fa_model():
    g = regime_guide(V3, "h200", b=4, t=256, s_values=[8, 1, 8], fa_model="flash_attention_shared_kpe")
    assert [r.s for r in g.rows] == [1, 8]
    assert g.crossover_s == crossover_s(V3, 4, 256, "h200", fast="flash_attention_shared_kpe")


def test_choose_n_without_budget_is_time_optimum():
    pr = Problem(b=32, s=16, t=4096)
    assert choose_n(V3, pr, "h200").n == best_hybrid_n(V3, pr, "h200").n


def test_choose_n_memory_cap():
    pr = Problem(b=32, s=16, t=4096)
    budget = V3.layers * hybrid_cache_bytes(V3, 32, 4096 - 500, 500)
    assert max_hybrid_n(V3, 32, 4096, budget) == 500
    ch = choose_n(V3, pr, "h200", memory_budget_bytes=budget)
    assert ch.n == 500 and ch.limited_by == "memory"
    assert ch.time_s > best_hybrid_n(V3, pr, "h200").time_s
    with pytest.raises(ValueError, match="latent cache alone"):
        choose_n(V3, pr, "h200", memory_budget_bytes=1e6)


def test_choose_n_tensor_parallel():
    pr = Problem(b=32, s=16, t=4096)
    split = choose_n(V3, pr, "h200", tp=8)
    assert split.n == best_hybrid_n(V3.replace(h=16), pr, "h200").n
    with pytest.raises(ValueError, match="divisor"):
        choose_n(V3, pr, "h200", tp=3)

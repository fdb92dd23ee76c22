"""Regime guide: closed-form hybrid split vs brute force, crossovers, the seed's regimes."""

import math

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


# --- the n chooser under a memory budget: expected values from the formulas ---------------

P_H200, W_H200 = 710e12, 4257e9          # the H200's measured ceilings (conf/devices.json)


def hybrid_time_by_hand(h, n, b=32, s=16, t=4096, d=128, dv=128, p=64, k=512, w=2):
    """MLAvar6+'s roofline time written out: FLOPs 2bhstp + 2bhsn(d+dv) + 4bhsok, bytes
    w·(bhs(p+d+k) + bok + btp + bhn(d+dv) + bhs(dv+k))."""
    o = t - n
    flops = 2 * b * h * s * t * p + 2 * b * h * s * n * (d + dv) + 4 * b * h * s * o * k
    nbytes = w * (b * h * s * (p + d + k) + b * o * k + b * t * p + b * h * n * (d + dv) + b * h * s * (dv + k))
    return max(flops / P_H200, nbytes / W_H200)


def best_by_hand(h, n_max=4096):
    times = [hybrid_time_by_hand(h, n) for n in range(n_max + 1)]
    return min(range(n_max + 1), key=lambda n: (times[n], n))


def test_budget_table_b32_s16_t4096_h200():
    """Unconstrained, window <= the latent cache (4,718,592 B per sequence per layer), and the
    same with tp = 8 (16 heads per rank: the window per token shrinks 8x, the latent does not)."""
    from mla_var3.analysis.regime import budget_table, latent_window_budget

    pr = Problem(b=32, s=16, t=4096)
    assert latent_window_budget(V3, 4096) == 4096 * 576 * 2
    rows = budget_table(V3, pr, "h200", tps=(1, 8))
    got = [(r.tp, r.split.n, r.split.limited_by) for r in rows]
    assert best_by_hand(128) == 1190 and best_by_hand(16) == 868
    assert got == [(1, 1190, "time"), (1, 72, "memory"), (8, 868, "time"), (8, 576, "memory")]
    for r in rows:
        h = 128 // r.tp
        assert r.split.time_s == pytest.approx(hybrid_time_by_hand(h, r.split.n), rel=1e-12)
        assert r.latent_time_s == pytest.approx(hybrid_time_by_hand(h, 0), rel=1e-12)
        assert r.window_bytes == r.split.n * h * 256 * 2
    assert rows[0].split.time_s * 1e6 == pytest.approx(654.0, abs=0.05)
    assert rows[1].split.time_s * 1e6 == pytest.approx(812.5, abs=0.05)
    assert rows[1].speedup == pytest.approx(hybrid_time_by_hand(128, 0) / hybrid_time_by_hand(128, 72), rel=1e-12)


@pytest.mark.parametrize("budget,tp,want", [(65_536 * 100, 1, 100), (65_536 * 100 - 1, 1, 99), (0, 1, 0),
                                            (10**12, 1, 1190), (8_192 * 700, 8, 700), (8_192 * 900, 8, 868)])
def test_choose_n_window_budget(budget, tp, want):
    pr = Problem(b=32, s=16, t=4096)
    split = choose_n(V3, pr, "h200", tp=tp, window_budget_bytes=budget)
    assert split.n == want
    assert split.limited_by == ("time" if want in (1190, 868) else "memory")
    assert split.time_s == pytest.approx(hybrid_time_by_hand(128 // tp, want), rel=1e-12)


def test_hybrid_split_auto_is_default_and_given_n_checked():
    from mla_var3.analysis.regime import hybrid_split

    pr = Problem(b=32, s=16, t=4096)
    assert hybrid_split(V3, pr, "h200").n == 1190                                   # n="auto" by default
    assert hybrid_split(V3, pr, "h200", window_budget_bytes=4_718_592).n == 72
    given = hybrid_split(V3, pr, "h200", 100)
    assert (given.n, given.limited_by) == (100, "given")
    assert given.time_s == pytest.approx(hybrid_time_by_hand(128, 100), rel=1e-12)
    with pytest.raises(ValueError, match="at most n=72"):
        hybrid_split(V3, pr, "h200", 73, window_budget_bytes=4_718_592)
    with pytest.raises(ValueError, match="'auto' or an integer"):
        hybrid_split(V3, pr, "h200", "best")
    with pytest.raises(ValueError, match="divisor"):
        hybrid_split(V3, pr, "h200", 10, tp=3)


def test_cli_regime_and_cost_with_window_budget(capsys):
    import json

    from mla_var3 import cli

    code = cli.main(["regime", "--b", "32", "--s", "16", "--t", "4096", "--window-budget", "latent", "--tp", "8",
                     "--device", "h200", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    rows = json.loads(out)["window_budget"]
    assert [(r["s"], r["tp"], r["n"], r["window_budget_bytes"]) for r in rows] == [
        (16, 1, 1190, None), (16, 1, 72, 4_718_592), (16, 8, 868, None), (16, 8, 576, 4_718_592)]
    code = cli.main(["cost", "--design", "mla_var6_plus", "--s", "16", "--n", "auto", "--window-budget", "4.5MiB",
                     "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["n"] == 72                 # 4.5 MiB = 4,718,592 B
    code = cli.main(["cost", "--design", "mla_var6_plus", "--s", "16", "--n", "auto", "--tp", "8", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["n"] == 868 and json.loads(out)["dims"]["h"] == 16
    for argv, msg in ((["cost", "--design", "mla_var6_plus", "--window-budget", "lots"], "'latent' or bytes"),
                      (["cost", "--design", "flash_mla", "--window-budget", "latent"], "mla_var6_plus only"),
                      (["cost", "--design", "mla_var6_plus", "--s", "16", "--n", "80", "--window-budget", "latent"],
                       "at most n=72")):
        assert cli.main(argv) == 2
        assert msg in capsys.readouterr().err


def test_plot_time_vs_n_model_and_sweep(tmp_path):
    """The plot is written from the model alone and from a measured sweep (hybrid_check layout)."""
    import json

    from mla_var3.analysis.plots import load_n_sweep, plot_time_vs_n

    sweep = {"sweep": [{"label": "absorbed alone", "b": 32, "s": 16, "n": 0, "us": 1361.7},
                       {"label": "hybrid overlapped", "b": 32, "s": 16, "n": 0, "us": 1381.4},
                       {"label": "hybrid overlapped", "b": 32, "s": 16, "n": 1024, "us": 1582.7},
                       {"label": "hybrid overlapped", "b": 64, "s": 16, "n": 512, "us": 3000.0}]}
    src = tmp_path / "hybrid_check.json"
    src.write_text(json.dumps(sweep))
    measured = load_n_sweep(src)
    assert measured == {"hybrid overlapped": [(0, 1381.4), (1024, 1582.7)]}
    dev = get_device("h200")
    for name, m in (("model.png", None), ("sweep.png", measured)):
        out = plot_time_vs_n(V3, dev, 32, 16, 4096, tmp_path / name, measured=m, window_budget_bytes=4_718_592)
        assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kwargs,words", [
    (dict(memory_budget_bytes=math.nan), "memory budget"),
    (dict(memory_budget_bytes=math.inf), "memory budget"),
    (dict(memory_budget_bytes=-1.0), "memory budget"),
    (dict(tp=0), "tp must be a positive divisor"),
    (dict(tp=True), "tp must be a positive divisor"),
    (dict(t=0), "t must be a positive integer"),
])
def test_max_hybrid_n_refuses_bad_budgets_and_sizes(kwargs, words):
    """NaN gave 'cannot convert float NaN to integer', tp = 0 a ZeroDivisionError."""
    args = dict(b=32, t=4096, memory_budget_bytes=1e12) | kwargs
    with pytest.raises(ValueError, match=words):
        max_hybrid_n(V3, **args)


@pytest.mark.parametrize("b,t", [(32, 0), (0, 4096), (32, 2.5)])
def test_crossover_refuses_sizes_instead_of_saying_never(b, t):
    with pytest.raises(ValueError, match="must be a positive integer"):
        crossover_s(V3, b, t)

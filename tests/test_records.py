"""Result records: roofline arithmetic, results.json round trip, Markdown, crossovers, plots."""

import math


from mla_var3.analysis.cost import Cost
from mla_var3.analysis.devices import Ceilings
from mla_var3.runtime import records as R
from mla_var3.runtime.timing import summarize

CEIL = Ceilings(flops_per_s=500e12, bytes_per_s=4e12, kind="measured", source="test")


def rec(name, b, s, time_us, kind=R.DESIGN, **kw):
    r = R.Record(name=name, kind=kind, model="deepseek-v3", b=b, s=s, t=4096, **kw)
    R.fill_timing(r, summarize([time_us * 0.9, time_us, time_us * 1.2], method="fake", gpu=True, l2="-"))
    R.fill_roofline(r, Cost(flops=1_000_000_000, bytes=4_000_000), CEIL, predicted_s=1e-6)
    return r


def test_fill_roofline_hand_computed():
    r = rec("flash_mla", 32, 1, 4.0)
    # compute 1e9 / 500e12 = 2 µs; memory 4e6 / 4e12 = 1 µs -> compute-bound, 2 µs
    assert r.bound == "compute" and math.isclose(r.bound_us, 2.0)
    assert math.isclose(r.tflops, 1e9 / 4e-6 / 1e12)          # 250 TFLOP/s
    assert math.isclose(r.gbs, 4e6 / 4e-6 / 1e9)              # 1000 GB/s
    assert math.isclose(r.pct_of_bound, 50.0)
    assert math.isclose(r.predicted_us, 1.0) and math.isclose(r.pred_over_meas, 0.25)
    assert r.intensity == 250.0 and r.ceilings == "measured"
    assert r.p10_us < r.time_us < r.p90_us


def test_skipped_record_keeps_model_numbers_only():
    r = R.Record(name="x", kind=R.BASELINE, model="m", b=1, s=1, t=64, status="skipped", note="why")
    R.fill_roofline(r, Cost(10, 10), CEIL)
    assert r.time_us is None and r.tflops is None and r.pct_of_bound is None and r.bound_us > 0


def test_results_roundtrip(tmp_path):
    recs = [rec("flash_mla", 32, 1, 4.0, config={"block_m": 64}), rec("torch_sdpa_expanded", 32, 1, 9.0, kind=R.BASELINE)]
    path = R.write_results(tmp_path / "out" / "results.json", recs, {"environment": {"device": "X"}})
    meta, back = R.load_results(path)
    assert meta["environment"]["device"] == "X"
    assert [r.to_dict() for r in back] == [r.to_dict() for r in recs]
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]      # no temp file left


def test_crossovers_interpolates_geometrically():
    recs = [rec("flash_mla", 32, 8, 100.0), rec("flash_attention", 32, 8, 200.0),
            rec("flash_mla", 32, 32, 400.0), rec("flash_attention", 32, 32, 200.0),
            rec("flash_mla", 64, 8, 100.0), rec("flash_attention", 64, 8, 300.0)]
    cross = R.crossovers(recs, "flash_mla", "flash_attention")
    # log ratio goes from log 2 to -log 2: halfway in log s between 8 and 32 -> 16
    assert math.isclose(cross[32], 16.0)
    assert cross[64] is None


def test_markdown_table(tmp_path):
    recs = [rec("flash_mla", 32, 1, 4.0), rec("flash_attention", 32, 1, 9.0),
            rec("torch_sdpa_expanded", 32, 1, 3.0, kind=R.BASELINE, backend="sdpa:cudnn_attention"),
            R.Record(name="flashmla_official", kind=R.BASELINE, model="m", b=32, s=1, t=4096, status="skipped",
                     note="flash_mla package not importable")]
    md = R.markdown_table(recs, {"environment": {"device": "NVIDIA H200", "gpu": True, "torch": "2.11"},
                                 "ceilings": {"kind": "measured", "tflops": 710, "gbs": 4257, "source": "s"}})
    assert "NVIDIA H200" in md and "**measured**" in md
    summary = [l for l in md.splitlines() if l.startswith("| 32 | 1 |")]
    assert len(summary) == 1 and "**3.0**" in summary[0] and summary[0].endswith("torch_sdpa_expanded |")
    assert "skipped: flash_mla package not importable" in md
    assert "sdpa:cudnn_attention" in md
    # a point timed beside official FlashMLA shows their paired ratio in its row
    paired = rec("flash_mla", 64, 1, 140.0, extra={"flashmla_ratio": 0.9134})
    row = next(l for l in R.markdown_table([paired]).splitlines() if l.startswith("| flash_mla | attention | 64 |"))
    assert "| 0.91 |" in row


def test_plots_written(tmp_path):
    recs = []
    for s, (tm, tf) in {1: (10.0, 100.0), 16: (100.0, 120.0), 64: (400.0, 150.0)}.items():
        recs += [rec("flash_mla", 32, s, tm), rec("flash_attention", 32, s, tf)]
    for n, tm in [(0, 100.0), (256, 90.0), (1024, 120.0)]:
        recs.append(rec("mla_var6_plus", 32, 16, tm, n=n, extra={"sweep": "n", "model_best_n": 256}))
    paths = [R.plot_roofline(recs, [CEIL], tmp_path / "roofline.png"),
             R.plot_time_vs_s(recs, tmp_path / "time_vs_s.png"),
             R.plot_hybrid_n(recs, tmp_path / "hybrid_n.png", {32: 256})]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000

"""The stall profile's summary (``benchmarks/stall_profile.py``) of an Nsight Compute source-page
export: it finds the pair loop (a backward branch over 44 HGMMA that runs once per iteration,
not a try-wait's retry branch placed past the kernel's end) and prices each cause per 1,000
iterations."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import stall_profile  # noqa: E402

REASONS = ["stall_barrier", "stall_long_sb", "stall_short_sb", "stall_mio", "stall_wait"]
COLUMNS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"] + REASONS


def _export(rows: list[tuple[str, int, int, dict]]) -> str:
    """A source-page CSV of ``(sass, samples, executions, {reason: samples})`` at 16-byte steps."""
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(["Kernel Name", "k", ""])
    w.writerow(COLUMNS)
    for i, (sass, samples, executed, reasons) in enumerate(rows):
        w.writerow([hex(0x1000 + 16 * i), f"      {sass}", samples, executed] + [reasons.get(r, 0) for r in REASONS])
    return out.getvalue()


def _kernel(iterations: int = 2000) -> list:
    top = hex(0x1000 + 16 * 1)            # the loop's first instruction
    retry = hex(0x1000 + 16 * 2)          # the try-wait's retry target
    rows = [("LDC R1, c[0x0][0x28]", 5, 10, {"stall_wait": 5}),
            ("SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R0+URZ+0x37590], R1", 10, iterations, {"stall_wait": 10}),
            ("@!P2 BRA 0x9000", 300, iterations, {"stall_long_sb": 300})]
    rows += [("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR8], R152", 4, iterations, {"stall_mio": 4})] * 44
    rows += [("WARPGROUP.DEPBAR.LE gsb0, 0x0", 120, iterations, {"stall_barrier": 120}),
             ("FMNMX R5, R5, R11, !PT", 60, iterations, {"stall_short_sb": 60}),
             ("LDL R13, [R1+0x1c]", 20, iterations, {"stall_wait": 20}),
             (f"@P1 BRA {top}", 2, iterations, {"stall_wait": 2}),
             ("EXIT", 1, 10, {}),
             # the retry block past the end: jumps back over the whole loop, runs rarely
             ("SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R0+URZ+0x37590], R1", 0, 3, {}),
             (f"@!P2 BRA {retry}", 0, 3, {})]
    return rows


def test_summary_finds_the_pair_loop_and_prices_each_cause():
    s = stall_profile.summarise(_export(_kernel(2000)))
    assert s["instructions"] == len(_kernel())
    assert len(s["pair_loops"]) == 1                       # the retry branch's span is not a loop
    loop = s["pair_loops"][0]
    assert (loop["first"], loop["instructions"], loop["iterations"]) == (1, 50, 2000)
    per = loop["per_1000_iterations"]
    assert per["mbarrier wait"] == pytest.approx(150.0)   # 300 samples over 2,000 iterations
    assert per["wgmma wait"] == pytest.approx(60.0)
    assert per["HGMMA issue"] == pytest.approx(44 * 4 / 2)
    assert per["other, short_sb"] == pytest.approx(30.0)
    assert per["local memory"] == pytest.approx(10.0)
    assert loop["samples"] == 10 + 300 + 44 * 4 + 120 + 60 + 20 + 2
    assert loop["hottest"][0]["sass"].startswith("@!P2 BRA")
    assert s["reasons"]["long_sb"] == 300


def test_summary_without_a_source_table_says_so():
    assert "error" in stall_profile.summarise('"Kernel Name","k"\n"nothing","here"\n')


def test_each_profiled_launch_gets_its_own_summary():
    one = _export(_kernel(2000))
    two = _export(_kernel(1000))
    parts = stall_profile.summarise_all(one + two)      # a gated call: the item and the packed kernel
    assert [p["pair_loops"][0]["iterations"] for p in parts] == [2000, 1000]
    assert parts[1]["pair_loops"][0]["per_1000_iterations"]["mbarrier wait"] == pytest.approx(300.0)


def _details(launches: list[tuple[int, str]]) -> str:
    """A details-page CSV of ``(block threads, theoretical active warps per SM)`` per launch."""
    out = io.StringIO()
    cols = ["ID", "Kernel Name", "Block Size", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(cols)
    for i, (threads, warps) in enumerate(launches):
        w.writerow([str(i), "k", f"({threads}, 1, 1)", "Launch Statistics", "Block Size", "", str(threads)])
        w.writerow([str(i), "k", f"({threads}, 1, 1)", "Launch Statistics", "Grid Size", "", "132"])
        w.writerow([str(i), "k", f"({threads}, 1, 1)", "Occupancy", "Theoretical Active Warps per SM", "warp", warps])
        w.writerow([str(i), "k", f"({threads}, 1, 1)", "Occupancy", "Achieved Active Warps Per SM", "warp", "7.62"])
    return out.getvalue()


def test_launch_statistics_scale_each_launch_to_eight_resident_warps():
    """A gated call's item kernel (256 threads, 8 warps per SM) and packed kernel (384 threads,
    12 warps): the sampler shares its samples among the resident warps, so the packed loop's
    numbers are scaled by 12 / 8 and the item loop's are left as they are."""
    assert stall_profile.launch_stats(_details([(256, "8"), (384, "12")])) == [
        {"block_threads": 256, "active_warps_per_sm": 8.0}, {"block_threads": 384, "active_warps_per_sm": 12.0}]
    pages = {"source": _export(_kernel(2000)) + _export(_kernel(1000)), "details": _details([(256, "8"), (384, "12")])}
    item, packed = stall_profile.summarise_pages(pages)
    assert item["launch"] == {"block_threads": 256, "active_warps_per_sm": 8.0, "scale": 1.0}
    assert packed["launch"]["scale"] == pytest.approx(1.5)
    assert item["pair_loops"][0]["scaled_per_1000_iterations"]["mbarrier wait"] == pytest.approx(150.0)
    assert packed["pair_loops"][0]["per_1000_iterations"]["mbarrier wait"] == pytest.approx(300.0)
    assert packed["pair_loops"][0]["scaled_per_1000_iterations"]["mbarrier wait"] == pytest.approx(450.0)


def test_a_launch_without_occupancy_stays_unscaled():
    (s,) = stall_profile.summarise_pages({"source": _export(_kernel(2000))})
    assert s["launch"]["scale"] is None and "scaled_per_1000_iterations" not in s["pair_loops"][0]


def test_a_point_names_its_batch():
    """``--point``: a uniform batch, a serving_check ragged row's own lengths, or seesaw_ab.py's
    threshold batch N of a seed (the same lengths as its A/B rows); anything else refused."""
    import seesaw_ab
    from plan_order_sim import ragged_lengths

    assert stall_profile.point_batch("uniform:32:16:4096") == (32, 16, 4096, [4096] * 32)
    assert stall_profile.point_batch("ragged:64:1:8192") == (64, 1, 8192, ragged_lengths()[(64, 1, 8192)])
    label, _, b, s, t, lengths = seesaw_ab.threshold_points(seed=7)[9]
    assert label == "paged ragged b16 s2 t8192 est 0.853"
    assert stall_profile.point_batch("threshold:7:9") == (b, s, t, lengths) == (16, 2, 8192, lengths)
    for bad in ("dense:1:1:1", "uniform:32:16", "threshold:7"):
        with pytest.raises(ValueError, match="--point must be"):
            stall_profile.point_batch(bad)
    with pytest.raises(IndexError):
        stall_profile.point_batch("threshold:7:99")

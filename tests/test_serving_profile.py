"""The serving profile's per-call timeline (``benchmarks/serving_profile.py --timeline``): the
kernels of each call in start order, their starts from the call's first kernel and durations as
medians over the calls, from a ``torch.profiler`` chrome trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import serving_profile  # noqa: E402


def _trace(calls: list[list[tuple[str, list, float, float]]]) -> dict:
    """A chrome trace of calls, each ``[(name, grid, ts, dur)]``, with a CPU event mixed in."""
    events = [{"cat": "cpu_op", "name": "aten::empty", "ts": 0.0, "dur": 1.0}]
    for call in calls:
        events += [{"cat": "kernel", "name": f"{n}(int, int)", "ts": ts, "dur": dur, "args": {"grid": grid}}
                   for n, grid, ts, dur in call]
    return {"traceEvents": events[::-1]}            # out of order: the timeline sorts by start


def test_timeline_orders_each_calls_kernels_and_takes_medians():
    calls = [[("_flash_mla_seesaw", [2, 196, 1], t0, 6.0), ("_flash_mla_seesaw", [2, 66, 1], t0 + 7.0 + d, 160.0),
              ("_combine_planned_kernel", [64, 1, 1], t0 + 170.0 + d, 3.0)]
             for t0, d in ((1000.0, 0.0), (2000.0, 1.0), (3000.0, 5.0))]
    tl = serving_profile.call_timelines(_trace(calls), 3)
    assert [k["name"] for k in tl["kernels"]] == ["_flash_mla_seesaw", "_flash_mla_seesaw", "_combine_planned_kernel"]
    assert [k["grid"] for k in tl["kernels"]] == [[2, 196, 1], [2, 66, 1], [64, 1, 1]]
    assert [k["start_us"] for k in tl["kernels"]] == [0.0, 8.0, 171.0]       # medians of the offsets
    assert [k["dur_us"] for k in tl["kernels"]] == [6.0, 160.0, 3.0]
    assert tl["span_us"] == 174.0


def test_timeline_refuses_calls_of_different_kernels():
    calls = [[("a", [1, 1, 1], 0.0, 1.0)], [("a", [1, 1, 1], 10.0, 1.0), ("b", [1, 1, 1], 12.0, 1.0)]]
    with pytest.raises(ValueError, match="not the same kernels per call"):
        serving_profile.call_timelines(_trace(calls), 2)


def test_the_points_are_the_serving_rows_or_the_named_threshold_batches():
    """By default the serving rows (uniform lengths, or serving_check's ragged ones); with
    ``--threshold`` seesaw_ab.py's threshold batches whose label holds one of the pieces, labelled
    by it and with its lengths ("all": every one)."""
    import seesaw_ab
    from plan_order_sim import ragged_lengths

    rows = serving_profile._points(None)
    assert [r[:4] for r in rows] == list(serving_profile.POINTS)
    assert rows[0][4] == [4096] * 32 and rows[3][4] == ragged_lengths()[rows[3][1:4]]
    every = seesaw_ab.threshold_points()
    assert serving_profile._points("all") == [(p[0], p[2], p[3], p[4], p[5]) for p in every]
    some = serving_profile._points("b16 s2, b96")
    assert [r[0] for r in some] == [p[0] for p in every if "b16 s2" in p[0] or "b96" in p[0]] and len(some) == 4

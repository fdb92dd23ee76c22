"""The timing primitive's CPU fallback and its statistics (no timing assertions)."""

import math

import pytest
import torch

from mla_var3.runtime.timing import Timing, percentile, summarize, time_fn


def test_percentile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 5.0
    assert percentile(xs, 50) == 3.0
    assert math.isclose(percentile(xs, 10), 1.4)
    assert math.isclose(percentile(xs, 90), 4.6)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_fields():
    t = summarize([10.0, 20.0, 30.0, 40.0], method="perf-counter", gpu=False, l2="x")
    assert t.median_us == 25.0 and t.min_us == 10.0 and t.reps == 4
    assert math.isclose(t.p10_us, 13.0) and math.isclose(t.p90_us, 37.0)
    assert math.isclose(t.spread, (37.0 - 13.0) / 25.0)
    d = t.to_dict()
    assert d["method"] == "perf-counter" and d["gpu"] is False and "spread" in d


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; on a GPU time_fn takes the CUDA path")
def test_cpu_fallback_calls_fn_and_marks_not_gpu():
    calls = []
    t = time_fn(lambda: calls.append(1), warmup=2, reps=7, min_reps=3)
    assert isinstance(t, Timing)
    assert t.gpu is False and t.method == "perf-counter"
    assert t.reps == 7 and len(calls) == 2 + 7
    assert 0 <= t.min_us <= t.p10_us <= t.median_us <= t.p90_us
    assert "not a GPU timing" in str(t)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; on a GPU time_fn takes the CUDA path")
def test_wall_time_bound_cuts_reps():
    import time

    t = time_fn(lambda: time.sleep(0.01), warmup=1, reps=1000, min_reps=2, max_seconds=0.05)
    assert 2 <= t.reps <= 10


@pytest.mark.parametrize("kwargs", [{"reps": 0}, {"min_reps": 0}, {"max_seconds": 0}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        time_fn(lambda: None, **kwargs)


def test_setup_runs_before_every_call_outside_the_timed_window():
    """A call that consumes state (here: a list it empties) is timed with the state restored by
    ``setup`` before each call (warm-up included); the setup's time is not in the samples."""
    import time

    state, seen = [], []

    def setup():
        time.sleep(0.005)
        state.append(1)

    def fn():
        seen.append(len(state))
        state.clear()

    t = time_fn(fn, setup=setup, warmup=2, reps=5, min_reps=5, max_seconds=10.0, flush_l2=False)
    assert seen and all(n == 1 for n in seen)            # every call found the state restored
    if not t.gpu:
        assert len(seen) == 2 + 5 and t.median_us < 4000   # the 5 ms setup is not timed

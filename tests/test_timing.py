"""The timing primitive's CPU fallback and its statistics (no timing assertions)."""

import math

import pytest
import torch

from mla_var3.runtime.timing import Interleaved, Timing, percentile, summarize, time_fn, time_interleaved


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


def test_interleaved_rotates_the_order_every_repetition():
    """Each repetition times every callable once, the order rotated by one per repetition, so
    no callable is always timed first (after an idle pause) or last (after the others' load)."""
    log = []
    fns = {n: (lambda n=n: log.append(n)) for n in "abc"}
    r = time_interleaved(fns, warmup=2, reps=7, min_reps=7, max_seconds=10.0, device="cpu")
    timed = log[2 * 3:]                       # after the warm-up calls (every callable, in order)
    assert log[:6] == list("abcabc")
    assert [timed[3 * i: 3 * i + 3] for i in range(7)] == [list("abc"), list("bca"), list("cab"), list("abc"),
                                                           list("bca"), list("cab"), list("abc")]
    assert set(r.timings) == set("abc") and all(len(v) == 7 for v in r.samples_us.values())
    assert r["a"].reps == 7 and not r["a"].gpu


def test_interleaved_ratio_is_the_median_of_same_repetition_ratios():
    """Two callables whose times drift together (a clock falling over the run) keep a steady
    ratio per repetition; the ratio of the medians would not."""
    a = [100.0, 110.0, 150.0, 200.0, 210.0]
    b = [50.0, 55.0, 75.0, 100.0, 105.0]
    t = {n: summarize(v, method="perf-counter", gpu=False, l2="-") for n, v in (("a", a), ("b", b))}
    r = Interleaved(t, {"a": a, "b": b})
    assert r.ratio("a", "b") == 2.0 and r.ratio("b", "a") == 0.5
    skewed = Interleaved(t, {"a": a, "b": [50.0, 55.0, 75.0, 100.0, 1000.0]})
    assert skewed.ratio("a", "b") == 2.0
    with pytest.raises(ValueError, match="positive"):
        Interleaved(t, {"a": a, "b": [0.0] * 5}).ratio("a", "b")


def test_interleaved_refuses_an_empty_set():
    with pytest.raises(ValueError, match="at least one"):
        time_interleaved({})


def test_graphs_are_asked_for_unless_a_setup_runs_between_calls(monkeypatch):
    """The GPU path is handed ``use_graph`` as given, and False with a ``setup`` (a graph
    would replay without it); checked with the GPU path replaced, so it runs on the CPU too."""
    import mla_var3.runtime.timing as T

    seen = []

    def fake_cuda(fns, warmup, reps, min_reps, max_seconds, use_graph, flush_l2, device, setup, back_to_back,
                  replays):
        seen.append((use_graph, back_to_back, replays))
        floors = {n: {"floor_us": 1.5, "floored": 1} for n in fns} if back_to_back and not use_graph else {}
        if replays and use_graph:
            floors = {n: {"replays_b2b_us": 2.5} for n in fns}
        return ({n: [1.5, 2.0] for n in fns}, {n: "cuda-graph" if use_graph else "cuda-events" for n in fns}, "-",
                floors)

    monkeypatch.setattr(T, "_time_cuda", fake_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    graph = T.time_fn(lambda: None)
    assert graph.method == "cuda-graph" and (graph.floor_us, graph.floored) == (None, 0)
    eager = T.time_fn(lambda: None, use_graph=False)
    assert eager.method == "cuda-events" and (eager.floor_us, eager.floored) == (1.5, 1)
    assert T.time_fn(lambda: None, setup=lambda: None).method == "cuda-events"
    assert graph.replays_b2b_us is None and T.time_fn(lambda: None, replays=True).replays_b2b_us == 2.5
    # the back-to-back floor of plain launches: not with a setup between calls; replays only when asked
    assert seen == [(True, True, False), (False, True, False), (False, False, False), (True, True, True)]


def test_back_to_back_time_is_wall_time_per_call_between_synchronisations(monkeypatch):
    """``_back_to_back_us``: the device synchronised before the first call and after the last,
    the wall time divided among the calls (checked with the synchronisation recorded, on the CPU)."""
    import mla_var3.runtime.timing as T

    log = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    clock = iter([10.0, 10.0 + 16 * 300e-6])
    monkeypatch.setattr(T.time, "perf_counter", lambda: next(clock))
    us = T._back_to_back_us(lambda: log.append("call"), None)
    assert log == ["sync"] + ["call"] * T.BACK_TO_BACK_CALLS + ["sync"]
    assert us == pytest.approx(300.0)


def test_back_to_back_time_is_the_median_of_interleaved_rounds(monkeypatch):
    """``_back_to_back_rounds``: every round reads each callable once, the order rotated from one
    round to the next, and each callable's time is the median of its rounds (an outlying round
    moves nothing); no callables, no rounds."""
    import mla_var3.runtime.timing as T

    order = []
    readings = {"a": iter([100.0, 90.0, 400.0, 95.0, 92.0]), "b": iter([50.0, 55.0, 52.0, 51.0, 500.0])}

    def fake(fn, device):
        order.append(fn())
        return next(readings[order[-1]])

    monkeypatch.setattr(T, "_back_to_back_us", fake)
    out = T._back_to_back_rounds({"a": lambda: "a", "b": lambda: "b"}, None, 5)
    assert out == {"a": 95.0, "b": 52.0}
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert T._back_to_back_rounds({}, None, 5) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_graph_timing_reads_its_replays_back_to_back_when_asked():
    """``replays=True``: a CUDA-graph timing also reads its graph's replays issued back to back,
    a positive time of the same order as the graph's; a plain-launch timing has none."""
    from mla_var3.runtime.timing import time_fn

    x = torch.zeros(1 << 22, device="cuda")
    graph = time_fn(lambda: x.mul_(1.0001), reps=20, warmup=2, replays=True)
    assert graph.method == "cuda-graph" and graph.replays_b2b_us is not None
    assert 0.2 * graph.median_us < graph.replays_b2b_us < 5 * graph.median_us + 50
    assert time_fn(lambda: x.mul_(1.0001), reps=5, use_graph=False, replays=True).replays_b2b_us is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_plain_launches_of_a_host_bound_call_read_its_host_time():
    """A call with 400 us of host work and a tiny kernel: between events after the flush its
    host work hides behind the flush's GPU time; the eager time (plain launches) reads at least
    the host work, the graph time only the kernel."""
    import time as _time

    from mla_var3.runtime.timing import time_fn

    x = torch.zeros(16, device="cuda")

    def call():
        t0 = _time.perf_counter()
        while _time.perf_counter() - t0 < 400e-6:
            pass
        x.add_(1.0)

    eager = time_fn(call, use_graph=False, reps=20, warmup=2)
    graph = time_fn(call, reps=20, warmup=2)
    assert eager.method == "cuda-events" and eager.median_us >= 390.0
    assert eager.floor_us >= 390.0 and 0 <= eager.floored <= eager.reps   # the floor recorded with the time
    assert graph.method == "cuda-graph" and graph.median_us < 100.0


def test_host_times_are_the_median_of_interleaved_rounds(monkeypatch):
    """``host_times_us``: each callable's calls split over up to five rounds (as many as give a
    round one burst), every round times each callable once in an order rotated from one round to
    the next, warm-up calls only before a callable's first round; each time the median of its
    rounds (an outlying round moves nothing)."""
    import mla_var3.runtime.timing as T

    seen = []
    readings = {"a": iter([100.0, 90.0, 400.0, 95.0, 92.0]), "b": iter([50.0, 55.0, 52.0, 51.0, 500.0]),
                "slow": iter([700.0])}

    def fake(fn, *, calls, warmup, burst):
        seen.append((fn(), calls, warmup, burst))
        return next(readings[seen[-1][0]])

    monkeypatch.setattr(T, "host_time_us", fake)
    fns = {"a": lambda: "a", "b": lambda: "b", "slow": lambda: "slow"}
    out = T.host_times_us(fns, calls={"a": 300, "b": 300, "slow": 3}, warmup=2)
    assert out == {"a": 95.0, "b": 52.0, "slow": 700.0}
    assert [x[0] for x in seen] == ["a", "b", "slow", "b", "a", "a", "b", "a", "b", "b", "a"]
    assert {x[1] for x in seen if x[0] != "slow"} == {60} and next(x for x in seen if x[0] == "slow")[1] == 3
    assert [x[2] for x in seen if x[0] == "a"] == [2, 0, 0, 0, 0] and {x[3] for x in seen} == {8}
    assert T.host_times_us({}) == {}
    with pytest.raises(ValueError):
        T.host_times_us(fns, rounds=0)


def test_host_time_is_timed_in_bursts_with_a_synchronisation_before_each(monkeypatch):
    """``host_time_us`` times bursts of calls, synchronising before each burst outside the timed
    window (so that queued GPU work never blocks the timed host), and reports a burst's median
    time per call: here every call sleeps 2 ms and a synchronisation 20 ms, which must not count."""
    import time

    from mla_var3.runtime import timing

    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: (events.append("sync"), time.sleep(0.02)))
    us = timing.host_time_us(lambda: (events.append("call"), time.sleep(0.002)), calls=12, warmup=1, burst=4)
    assert events == ["call"] + (["sync"] + ["call"] * 4) * 3 + ["sync"]
    assert 2000 <= us < 15000
    with pytest.raises(ValueError):
        timing.host_time_us(lambda: None, burst=0)

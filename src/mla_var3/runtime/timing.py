"""The one timing primitive of the package: :func:`time_interleaved` (one or several callables),
and :func:`time_fn`, its view of a single callable.

Every time the package reports (benchmarks, autotuning, ``python -m mla_var3.kernel``) comes
from here, measured the same way:

* **GPU** — warm-up launches first (Triton compiles, caches settle). Then, when the callable can
  be captured, a CUDA graph of one call is replayed; each repetition is bracketed by two CUDA
  events, so the launch overhead of Python and of the launcher's checks is not in the number
  (method ``"cuda-graph"``). A callable that cannot be captured (a host sync, an allocation
  pattern the graph refuses), or any callable with ``use_graph=False`` (the eager time), is timed
  as plain launches between the same events (method ``"cuda-events"``), and no repetition reads
  below the callable's **back-to-back time**: the wall time per call of 16 calls issued one after
  the other, the device synchronised before and after (the median of up to 5 such rounds, the
  callables' rounds interleaved). Between events alone, a call whose host
  work outlasts the flush before it would hide that work behind the flush's GPU time (measured
  on an H100: a hybrid call with about 330 µs of host work read 279 µs between events after the
  flush, 334 µs without it); the back-to-back time is what a caller issuing calls one after the
  other waits, max(host, GPU) per call. The floor only raises a repetition: a call whose host
  work outlasts the flush but not its own GPU time can still read up to (host − flush) above
  max(host, GPU) between events (on an H200 an expanded call with 229 µs of host work and
  461 µs in a graph read 689 µs eager).
* **Replays back to back** — with ``replays=True`` a graph timing also reads its graph's
  replays issued back to back (:attr:`Timing.replays_b2b_us`): the kernels of a call without its
  launch path, so an eager time above it is the host's and one above the graph time but not
  above it is the GPU's (measured on an H100: absorbed calls' replays read −3 to +12 % beside
  their graph time after a flush, +12 % on the longest compute-bound one; official FlashMLA's
  2–4 % above).
* **L2** — before every repetition a flush buffer of at least twice the device's L2 is
  written (``zero_``), outside the timed window, so no repetition finds its inputs in L2 from
  the previous one. Inputs are not rotated.
* **Statistics** — median and the 10th / 90th percentiles over the repetitions (microseconds).
* **Bounded** — the number of repetitions is cut so the timed loop fits in ``max_seconds``
  (estimated from the warm-up), with at least ``min_reps``.
* **CPU** — without CUDA, ``time.perf_counter`` around plain calls (method ``"perf-counter"``,
  ``gpu=False``): it makes the CPU path and the tests run; it is not a GPU timing.
* **Several callables** (:func:`time_interleaved`) — each repetition times every callable once,
  in an order rotated from one repetition to the next, so all of them meet the same clock and
  power state (on an H200, a call timed right after a second of another kernel's load ran up to
  10 % slower than one timed after an idle pause; timed one after the other, the second pays
  it). :meth:`Interleaved.ratio` is the median over repetitions of two callables' times in the
  same repetition.

Example
-------
>>> t = time_fn(lambda: sum(range(1000)), reps=20, warmup=2)   # doctest: +SKIP
>>> t.median_us, t.method
(12.3, 'perf-counter')
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

#: minimum flush buffer (bytes) when the device does not report its L2 size.
_MIN_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    """One timed callable.

    Attributes
    ----------
    median_us, p10_us, p90_us, min_us : float
        Median, 10th / 90th percentile and minimum over ``reps`` repetitions, in microseconds.
    reps : int
        Repetitions that were timed.
    method : str
        ``"cuda-graph"``, ``"cuda-events"`` or ``"perf-counter"``.
    gpu : bool
        True for a GPU timing (CUDA events); False for the CPU fallback.
    l2 : str
        How the L2 cache was kept cold between repetitions.
    floor_us : float or None
        A plain-launch GPU timing's back-to-back time, the floor no repetition reads below (None:
        a graph replay, the CPU, or a ``setup`` between calls).
    floored : int
        Repetitions the floor raised: the eager time is the back-to-back time where most were
        (host-bound), the time between events where none was.
    replays_b2b_us : float or None
        A CUDA-graph timing's back-to-back time of its graph's replays, asked for with
        ``replays=True`` (None otherwise): the same kernels issued one after the other without the
        launch path, so an eager time above it is the host's and one above the graph time but
        not above it is the GPU's (on an H100 absorbed calls' replays read −3 to +12 % beside
        their graph time after a flush).
    """

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    reps: int
    method: str
    gpu: bool
    l2: str
    floor_us: float | None = None
    floored: int = 0
    replays_b2b_us: float | None = None

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread of the repetitions."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "spread": self.spread}

    def __str__(self) -> str:
        tag = "" if self.gpu else " (CPU, not a GPU timing)"
        return f"{self.median_us:,.1f} µs [p10 {self.p10_us:,.1f}, p90 {self.p90_us:,.1f}; {self.reps} reps, {self.method}]{tag}"


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile (0..100) of ``values``."""
    if not values:
        raise ValueError("percentile of an empty list")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples_us: list[float], *, method: str, gpu: bool, l2: str, floor_us: float | None = None,
              floored: int = 0, replays_b2b_us: float | None = None) -> Timing:
    """A :class:`Timing` from raw per-repetition times in microseconds (``floor_us``, ``floored``:
    the back-to-back floor they were raised to, and how many of them were; ``replays_b2b_us``: a
    graph's replays' back-to-back time)."""
    if not samples_us:
        raise ValueError("no samples to summarize")
    return Timing(
        median_us=float(statistics.median(samples_us)),
        p10_us=percentile(samples_us, 10),
        p90_us=percentile(samples_us, 90),
        min_us=float(min(samples_us)),
        reps=len(samples_us),
        method=method,
        gpu=gpu,
        l2=l2,
        floor_us=floor_us,
        floored=floored,
        replays_b2b_us=replays_b2b_us,
    )


def _plan_reps(estimate_s: float, reps: int, min_reps: int, max_seconds: float) -> int:
    """Repetitions that fit ``max_seconds`` at ``estimate_s`` each, within [min_reps, reps]."""
    if estimate_s <= 0:
        return reps
    return max(min_reps, min(reps, int(max_seconds / estimate_s)))


def _order(names: list[str], rep: int) -> list[str]:
    """The callables' order in repetition ``rep``: rotated by one each repetition."""
    k = rep % len(names)
    return names[k:] + names[:k]


def _time_cpu(fns: dict, warmup: int, reps: int, min_reps: int, max_seconds: float,
              setup: Callable[[], object]) -> dict[str, list[float]]:
    names = list(fns)

    def once(name: str) -> float:
        setup()
        start = time.perf_counter()
        fns[name]()
        return time.perf_counter() - start

    estimate = sum(once(n) for _ in range(max(1, warmup)) for n in names) / max(1, warmup)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(_plan_reps(estimate, reps, min_reps, max_seconds)):
        for name in _order(names, rep):
            samples[name].append(once(name) * 1e6)
    return samples


def flush_buffer(device) -> "torch.Tensor":  # noqa: F821
    """A byte buffer of at least twice the device's L2 (>= 256 MiB) to overwrite between reps."""
    import torch

    props = torch.cuda.get_device_properties(device)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    nbytes = max(_MIN_FLUSH_BYTES, 2 * l2)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _capture(fn: Callable[[], object], device):
    """A CUDA graph of one call of ``fn``, or None when the call cannot be captured."""
    import torch

    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream):          # one eager call on the capture stream first
            fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize(device)
        return graph
    except Exception:                             # host sync, unsupported op, allocator refusal
        try:
            torch.cuda.synchronize(device)
        except Exception:
            pass
        return None


#: calls issued back to back for a plain-launch callable's back-to-back time (:func:`_back_to_back_us`)
BACK_TO_BACK_CALLS = 16


#: a callable's back-to-back time is the median of this many rounds of :data:`BACK_TO_BACK_CALLS`
#: calls (fewer where they would take more than a quarter of the timing's ``max_seconds``). One
#: round is one sample, and a floor that raises every repetition is the whole eager time: read
#: once each on an H100, the same absorbed kernel took 108.1 us through its own entry point and
#: 93.3 us through the hybrid's with N = 0, beside host times of 78.3 and 100.8 us.
BACK_TO_BACK_ROUNDS = 5


def _median_of_rounds(rounds: dict[str, int], read: Callable[[str, int], float]) -> dict[str, float]:
    """Each name's median of ``read(name, round)`` over its ``rounds[name]`` rounds: round ``r``
    reads every name that has one, in an order rotated from one round to the next (as the
    repetitions are), so all of them meet the same clock, power and host state."""
    names = list(rounds)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(max(rounds.values(), default=0)):
        for n in _order(names, r):
            if r < rounds[n]:
                times[n].append(read(n, r))
    return {n: float(statistics.median(v)) for n, v in times.items()}


def _back_to_back_rounds(fns: dict[str, Callable[[], object]], device, rounds: int) -> dict[str, float]:
    """Each callable's :func:`_back_to_back_us`, the median of ``rounds`` rounds (at least one),
    the callables interleaved (:func:`_median_of_rounds`)."""
    return _median_of_rounds({n: max(1, rounds) for n in fns}, lambda n, r: _back_to_back_us(fns[n], device))


def _back_to_back_us(fn: Callable[[], object], device, calls: int = BACK_TO_BACK_CALLS) -> float:
    """Wall time per call, in microseconds, of ``calls`` calls of ``fn`` issued one after the other
    with the device synchronised before the first and after the last: max(host, GPU) per call,
    plus one call's drain shared among them."""
    import torch

    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def _time_cuda(fns: dict, warmup, reps, min_reps, max_seconds, use_graph, flush_l2, device, setup,
               back_to_back: bool = True, replays: bool = False):
    """``(samples_us per name, method per name, l2, floors)``; with ``back_to_back`` no plain-launch
    repetition reads below the callable's :func:`_back_to_back_us` (no setup may run between its
    calls); ``floors``: name -> ``{"floor_us": that time, "floored": repetitions it raised}`` (the
    :class:`Timing` fields), for the callables it applied to; with ``replays``, each graphed
    callable's ``{"replays_b2b_us": its graph's replays' back-to-back time}``."""
    import torch

    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    flush = flush_buffer(device) if flush_l2 else None
    names = list(fns)

    def prepare() -> None:                       # outside the timed window
        setup()
        if flush is not None:
            flush.zero_()                         # write > 2x L2: the inputs are evicted

    for _ in range(max(1, warmup)):
        for name in names:
            setup()
            fns[name]()
    torch.cuda.synchronize(device)

    graphs = {n: _capture(fns[n], device) if use_graph else None for n in names}
    runs = {n: graphs[n].replay if graphs[n] is not None else fns[n] for n in names}
    methods = {n: "cuda-graph" if graphs[n] is not None else "cuda-events" for n in names}

    # Estimate one repetition of every callable (flushes included) to bound the loop in wall time.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        for name in names:
            prepare()
            runs[name]()
    end.record()
    torch.cuda.synchronize(device)
    rep_s = start.elapsed_time(end) / 3 / 1e3
    n_reps = _plan_reps(rep_s, reps, min_reps, max_seconds)

    events = {n: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n_reps)] for n in names}
    for rep in range(n_reps):
        for name in _order(names, rep):
            prepare()
            events[name][rep][0].record()
            runs[name]()
            events[name][rep][1].record()
    torch.cuda.synchronize(device)
    samples = {n: [s.elapsed_time(e) * 1e3 for s, e in events[n]] for n in names}
    floors = {}
    # rounds of back-to-back calls within a quarter of the budget (one repetition's estimate per call)
    rounds = min(BACK_TO_BACK_ROUNDS, int(0.25 * max_seconds / max(BACK_TO_BACK_CALLS * rep_s, 1e-9)))
    if back_to_back:
        plain = {n: fns[n] for n in names if graphs[n] is None}
        for n, floor in _back_to_back_rounds(plain, device, rounds).items():
            floors[n] = {"floor_us": floor, "floored": sum(x < floor for x in samples[n])}
            samples[n] = [max(x, floor) for x in samples[n]]
    if replays:
        graphed = {n: graphs[n].replay for n in names if graphs[n] is not None}
        for n, b2b in _back_to_back_rounds(graphed, device, rounds).items():
            floors[n] = {"replays_b2b_us": b2b}
    l2 = f"flushed: {flush.numel() / 2**20:.0f} MiB written before each rep" if flush is not None else "not flushed"
    return samples, methods, l2, floors


@dataclass(frozen=True)
class Interleaved:
    """Several callables timed in the same repetitions (:func:`time_interleaved`).

    Attributes
    ----------
    timings : dict[str, Timing]
        Each callable's statistics over the repetitions.
    samples_us : dict[str, list[float]]
        Each callable's time in every repetition (index ``i``: repetition ``i``).
    """

    timings: dict[str, Timing]
    samples_us: dict[str, list[float]]

    def ratio(self, num: str, den: str) -> float:
        """The median over repetitions of ``num``'s time ÷ ``den``'s in the same repetition."""
        pairs = [a / b for a, b in zip(self.samples_us[num], self.samples_us[den]) if b > 0]
        if not pairs:
            raise ValueError(f"no repetition with a positive time for {den!r}")
        return float(statistics.median(pairs))

    def __getitem__(self, name: str) -> Timing:
        return self.timings[name]


def time_interleaved(fns: dict[str, Callable[[], object]], *, warmup: int = 3, reps: int = 100, min_reps: int = 5,
                     max_seconds: float = 1.0, use_graph: bool = True, flush_l2: bool = True, device=None,
                     setup: Callable[[], object] | None = None, replays: bool = False) -> Interleaved:
    """Time every callable of ``fns`` (name -> ``fn()``, no arguments) in the same repetitions:
    repetition ``i`` times each once, in the names' order rotated by ``i`` (see the module
    docstring). The arguments are :func:`time_fn`'s; ``reps`` and ``max_seconds`` bound the
    repetitions of the whole set (each callable is timed ``reps`` times at most), and each
    callable is captured in its own CUDA graph where it can be (its :class:`Timing`'s
    ``method`` says which)."""
    if not fns:
        raise ValueError("time_interleaved needs at least one callable")
    if reps < 1 or min_reps < 1:
        raise ValueError(f"reps and min_reps must be >= 1, got reps={reps}, min_reps={min_reps}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    min_reps = min(min_reps, reps)
    import torch

    graphs_ok = use_graph and setup is None        # a setup between calls rules a graph out
    back_to_back = setup is None                   # ... and the back-to-back time
    setup = setup or (lambda: None)
    on_gpu = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    if not on_gpu:
        samples = _time_cpu(fns, warmup, reps, min_reps, max_seconds, setup)
        timings = {n: summarize(v, method="perf-counter", gpu=False, l2="not flushed (CPU fallback)")
                   for n, v in samples.items()}
        return Interleaved(timings, samples)
    samples, methods, l2, floors = _time_cuda(fns, warmup, reps, min_reps, max_seconds, graphs_ok, flush_l2, device,
                                              setup, back_to_back, replays)
    return Interleaved({n: summarize(v, method=methods[n], gpu=True, l2=l2, **floors.get(n, {}))
                        for n, v in samples.items()}, samples)


def time_fn(fn: Callable[[], object], *, warmup: int = 3, reps: int = 100, min_reps: int = 5,
            max_seconds: float = 1.0, use_graph: bool = True, flush_l2: bool = True, device=None,
            setup: Callable[[], object] | None = None, replays: bool = False) -> Timing:
    """Time ``fn()`` (no arguments; its result is ignored) with the package's one primitive.

    Parameters
    ----------
    fn : callable
        The work to time; it must be repeatable (outputs may be overwritten each call).
    warmup : int
        Untimed calls first (compilation, autotuning, allocator warm-up).
    reps, min_reps : int
        At most ``reps`` timed repetitions; at least ``min_reps`` even past ``max_seconds``.
    max_seconds : float
        Wall-time budget for the timed loop; ``reps`` is cut to fit it.
    use_graph : bool
        Try to capture a CUDA graph and time its replays (GPU only).
    flush_l2 : bool
        Overwrite a > 2x L2 buffer before every repetition (GPU only).
    device : torch.device or None
        CUDA device to time on (default: the current one). CPU when CUDA is unavailable.
    setup : callable, optional
        Run before every call, outside the timed window, e.g. to restore state a call consumes
        (a cache it extends in place); no CUDA graph then, nor the back-to-back floor of the plain
        launches (see the module docstring).
    replays : bool
        With a CUDA graph, also its replays' back-to-back time (:attr:`Timing.replays_b2b_us`).

    Returns
    -------
    Timing
        ``gpu=False`` marks the CPU ``perf_counter`` fallback.
    """
    return time_interleaved({"fn": fn}, warmup=warmup, reps=reps, min_reps=min_reps, max_seconds=max_seconds,
                            use_graph=use_graph, flush_l2=flush_l2, device=device, setup=setup,
                            replays=replays)["fn"]


def host_time_us(fn: Callable[[], object], *, calls: int = 300, warmup: int = 10, burst: int = 8) -> float:
    """Host time per call of ``fn`` in microseconds: the median, over bursts of ``burst`` calls
    issued back to back, of a burst's wall time per call.

    This is the launch cost an eager caller pays on the CPU (argument checks, planning, kernel
    launches); when it exceeds the GPU time of a call, the eager call is host-bound. On a GPU
    the device is synchronised before each burst, outside the timed window: a call whose GPU
    work outlasts its host work queues launches, and hundreds of calls issued back to back fill
    the driver's launch queue, which then blocks the host until the GPU drains it — the loop
    would time the GPU, not the host (measured on an H200: official FlashMLA's b = 32, s = 1
    call, 82 µs on the GPU, read 40.6 µs per call over 300 back-to-back calls and 28.6 µs in
    bursts in one run; another host read 37.4 and 38.3). ``calls`` (at least one burst) sets how
    many are timed.
    """
    if calls < 1 or burst < 1:
        raise ValueError(f"calls and burst must be >= 1, got calls={calls}, burst={burst}")
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    per_call = []
    for _ in range(max(1, calls // burst)):
        sync()
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        per_call.append((time.perf_counter() - t0) / burst)
    sync()
    return statistics.median(per_call) * 1e6


#: :func:`host_times_us` splits each callable's calls over up to this many rounds
HOST_ROUNDS = 5


def host_times_us(fns: dict[str, Callable[[], object]], *, calls: int | dict[str, int] = 300, warmup: int = 10,
                  burst: int = 8, rounds: int = HOST_ROUNDS) -> dict[str, float]:
    """:func:`host_time_us` of several callables, interleaved: each callable's ``calls`` (one
    count for all, or name -> count) are split over up to ``rounds`` rounds (as many as give
    each round at least one burst); every round times each callable once, in an order rotated
    from one round to the next, and a callable's host time is the median of its rounds. So a
    slow period of the host (another process, a frequency step) reaches every callable of the
    set, or the median passes over it, where timing them one after the other gives it to one
    (measured on an H200's host: at one shape the hybrid's N = 0 call, which runs the absorbed
    call and more, read 106 µs against the absorbed call's 117). ``warmup`` calls precede each
    callable's first round."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    want = {n: calls[n] if isinstance(calls, dict) else calls for n in fns}
    per = {n: max(1, min(rounds, want[n] // burst)) for n in fns}
    return _median_of_rounds(per, lambda n, r: host_time_us(fns[n], calls=max(1, want[n] // per[n]),
                                                            warmup=warmup if r == 0 else 0, burst=burst))

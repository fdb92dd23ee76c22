"""The sweep runner behind ``mla-var3 bench``: every design (and baseline) over a grid of shapes.

It sits with the commands, above every layer it drives: the kernels by name
(:mod:`mla_var3.kernel.launchers`), the baselines (:mod:`mla_var3.runtime.baselines`) and, on
ragged paged batches, the FlashMLA-compatible call (:mod:`mla_var3.compat`).

The points of one shape (every design and baseline at the same b, s, t and lengths) are timed
together with :func:`~mla_var3.runtime.timing.time_interleaved` — every call in every
repetition, the order rotated — so each meets the same clock and power state; with official
FlashMLA among them, each other point also records FlashMLA ÷ it as the median of the
per-repetition ratios (``extra["flashmla_ratio"]``, ``["flashmla_ratio_eager"]``). Each point
fills a :class:`~mla_var3.runtime.records.Record` (achieved TFLOP/s and GB/s from the cost
models, % of the roofline bound, the model's prediction ÷ measured) and ``results.json`` is
rewritten after every point, so an interrupted run (Ctrl-C) keeps what it finished. At the end
it writes ``results.md`` and the plots.

Budget: each point gets ``point_seconds`` of timing (a shape's points share their sum;
repetitions are cut to fit); a point whose
single call is so slow that ``min_reps`` calls would not fit in ``slow_point_seconds`` is
skipped with a note; the whole sweep stops at ``max_seconds`` (the rest recorded as skipped).
The default grid (3 designs + 2 torch baselines, b = 32 and 64, ten s values, t = 4096, plus
the hybrid's n sweep at s = 16) is about 115 points and is planned to take ~5–8 minutes on an
H200 with autotuning off or cached, Triton compilation included.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mla_var3.analysis.regime import align_n, aligned_best_n, calibrated_split
from mla_var3.designs import ATTENTION_KERNELS, KERNELS
from mla_var3.kernel import launchers as D
from mla_var3.reference.inputs import design_inputs
from mla_var3.runtime.records import BASELINE, DESIGN, Record, fill_roofline, fill_timing
from mla_var3.shapes import MLADims, Problem

DEFAULT_S = (1, 2, 4, 8, 16, 32, 64, 128, 512, 1024)
DEFAULT_B = (32, 64)
#: the hybrid's n sweep, as fractions of t (plus the model's optimum).
N_SWEEP_FRACTIONS = (0.0, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0)
#: the design a ragged point runs: the FlashMLA-compatible call on a paged cache
RAGGED_DESIGN = "flash_mla_paged"
RAGGED_BASELINES = ("flashmla_official",)


@dataclass
class BenchSpec:
    """What to measure and under which budget (see ``mla-var3 bench --help``)."""

    dims: MLADims
    designs: tuple[str, ...] = ATTENTION_KERNELS
    bs: tuple[int, ...] = DEFAULT_B
    ss: tuple[int, ...] = DEFAULT_S
    t: int = 4096
    n: str | tuple[int, ...] = "auto"
    sweep_s: int | None = 16
    baselines: tuple[str, ...] = ()
    dtype: str = "bf16"
    causal: bool = True
    point_seconds: float = 0.3
    slow_point_seconds: float = 3.0
    max_seconds: float = 480.0
    warmup: int = 2
    reps: int = 100
    min_reps: int = 5
    autotune: bool = False
    retune: bool = False
    tune_seconds: float = 30.0
    interpret: bool = False
    #: ragged paged batches (FlashMLA's layout, the compat call against official FlashMLA):
    #: "random:LO:HI" (lengths uniform in [LO, HI], seeded per b) or "L1,L2,..." (cycled over b); t is
    #: the capacity
    seqlens: str | None = None
    #: also time each point as plain eager calls and its host time per call
    eager: bool = True

    def __post_init__(self) -> None:
        def ints(name: str, values, low: int) -> None:
            if not isinstance(values, tuple) or not values or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
                raise ValueError(f"BenchSpec: {name} must be a non-empty tuple of integers >= {low}, got {values!r}")

        ints("bs", self.bs, 1)
        ints("ss", self.ss, 1)
        ints("t", (self.t,), 1)
        if self.n != "auto":
            ints("n", self.n, 0)
        if self.sweep_s is not None:
            ints("sweep_s", (self.sweep_s,), 1)
        bad = [d for d in self.designs if d not in ATTENTION_KERNELS]
        if bad:
            raise ValueError(f"BenchSpec: unknown design(s) {bad}; known: {', '.join(ATTENTION_KERNELS)}")
        for name in ("point_seconds", "slow_point_seconds", "max_seconds", "tune_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"BenchSpec: {name} must be a finite positive number of seconds, got {value!r}")
        for name in ("warmup", "reps", "min_reps"):
            ints(name, (getattr(self, name),), 0 if name == "warmup" else 1)
        if self.seqlens is not None:
            ragged_lengths(self.seqlens, 1, self.t)          # a bad spec is refused here, by name


def ragged_lengths(spec: str, b: int, t: int, seed: int = 0) -> list[int]:
    """The ``b`` lengths of a ragged batch from ``spec``: ``"random:LO:HI"`` (uniform in [LO, HI],
    seeded by ``seed``) or a comma list of lengths cycled over the batch; each in [1, t]."""
    import random

    text = str(spec).strip()
    try:
        if text.startswith("random:"):
            lo, hi = (int(v) for v in text[len("random:"):].split(":"))
            if not 1 <= lo <= hi:
                raise ValueError
            rng = random.Random(seed)
            lengths = [rng.randint(lo, hi) for _ in range(b)]
        else:
            values = [int(v) for v in text.split(",")]
            lengths = [values[i % len(values)] for i in range(b)]
    except ValueError:
        raise ValueError(f"seqlens must be 'random:LO:HI' (1 <= LO <= HI) or a comma list of lengths, got {spec!r}") \
            from None
    if any(not 1 <= n <= t for n in lengths):
        raise ValueError(f"seqlens {spec!r}: every length must lie in [1, t={t}] (t is the cache's capacity), "
                         f"got {min(lengths)}..{max(lengths)}")
    return lengths


@dataclass
class Point:
    name: str
    kind: str
    problem: Problem
    extra: dict = field(default_factory=dict)


def plan_points(spec: BenchSpec, device, calibration=None) -> list[Point]:
    """The grid, in order: for each b and s every design then every baseline; then the n sweep.
    The hybrid's ``"auto"`` n is the one the guide runs (:func:`model_n`)."""
    points: list[Point] = []
    for b in spec.bs:
        for s in spec.ss:
            if s > spec.t:
                continue
            base = Problem(b=b, s=s, t=spec.t, causal=spec.causal)
            for name in spec.designs:
                if name == "mla_var6_plus":
                    ns = spec.n if isinstance(spec.n, tuple) else (model_n(spec.dims, base, device, calibration),)
                    for n in ns:
                        points.append(Point(name, DESIGN, base.with_n(min(n, spec.t)),
                                            {"n_choice": _n_choice(calibration) if spec.n == "auto" else "given"}))
                else:
                    points.append(Point(name, DESIGN, base))
            for name in spec.baselines:
                points.append(Point(name, BASELINE, base))
    if spec.seqlens is not None:
        for b in spec.bs:
            lengths = ragged_lengths(spec.seqlens, b, spec.t, seed=b)
            for s in spec.ss:
                if s > min(lengths):
                    continue
                base = Problem(b=b, s=s, t=spec.t, causal=spec.causal)
                extra = {"lengths": lengths, "mean_len": sum(lengths) / b, "seqlens_spec": spec.seqlens}
                points.append(Point(RAGGED_DESIGN, DESIGN, base, dict(extra)))
                for name in spec.baselines:
                    if name in RAGGED_BASELINES:
                        points.append(Point(name, BASELINE, base, dict(extra)))
    if "mla_var6_plus" in spec.designs and spec.sweep_s is not None and spec.sweep_s <= spec.t:
        for b in spec.bs:
            base = Problem(b=b, s=spec.sweep_s, t=spec.t, causal=spec.causal)
            best = model_n(spec.dims, base, device, calibration)
            ns = sorted({align_n(f * spec.t, spec.t) for f in N_SWEEP_FRACTIONS} | {best})
            for n in ns:
                points.append(Point("mla_var6_plus", DESIGN, base.with_n(n),
                                    {"sweep": "n", "model_best_n": best}))
    return points


def model_n(dims, problem: Problem, device, calibration=None) -> int:
    """The hybrid's n at ``problem``: the calibrated model's best split, as ``explain`` and the
    dispatcher run it, where ``calibration`` is given; else the roofline's, aligned."""
    if calibration is not None:
        return calibrated_split(calibration, dims, problem, device)[0]
    return aligned_best_n(dims, problem, device)


def _n_choice(calibration) -> str:
    return "calibrated model optimum" if calibration is not None else "roofline optimum"


def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _free(device) -> None:
    gc.collect()
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


class Runner:
    """Runs a :class:`BenchSpec` on ``device`` ("cuda" or "cpu" under the interpreter).

    ``device_entry`` is the analysis ``Device`` whose ``measured`` block holds the ceilings in
    use (measured in this process, or the table's); ``ceilings`` the analysis ``Ceilings``;
    ``calibration`` (or None) gives each design record its calibrated prediction
    (``extra["calibrated_us"]``, ``extra["calibrated_source"]``).
    """

    def __init__(self, spec: BenchSpec, device: str, device_entry, ceilings, *, cache=None,
                 log: Callable[[str], None] | None = None, calibration=None):
        self.spec, self.device, self.dev, self.ceil = spec, device, device_entry, ceilings
        self.calibration = calibration
        self.cache = cache
        self.log = log or (lambda _m: None)
        self.records: list[Record] = []

    # ---- one point -------------------------------------------------------------------------

    def _config(self, name: str, problem: Problem):
        return D.pick_config(name, self.spec.dims, problem, self.spec.dtype, self.device, cache=self.cache,
                           tune=self.spec.autotune, retune=self.spec.retune, log=self.log,
                           budget_s=self.spec.tune_seconds)

    def _callable(self, point: Point, rec: Record):
        lengths = point.extra.get("lengths")
        if lengths is not None and point.kind == DESIGN:
            from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
            from mla_var3.runtime.baselines import paged_inputs

            x = paged_inputs(self.spec.dims, point.problem, lengths, self.spec.dtype, self.device)
            meta, _ = get_mla_metadata()
            causal = point.problem.causal and point.problem.s > 1
            rec.backend = D.backend_name("flash_mla", self.device, tuned=False) + " (paged, compat call)"
            return lambda: flash_mla_with_kvcache(x["q"], x["cache"], x["table"], x["seqlens"], self.spec.dims.k,
                                                  meta, softmax_scale=x["scale"], causal=causal)
        if point.kind == DESIGN:
            cfg, how = self._config(point.name, point.problem)
            from mla_var3.runtime.autotune import config_to_dict

            rec.config = config_to_dict(cfg) if cfg is not None else None
            rec.extra["config_source"] = how
            rec.backend = D.backend_name(point.name, self.device, tuned=cfg is not None, s=point.problem.s)
            inputs = design_inputs(point.name, self.spec.dims, point.problem, dtype=self.spec.dtype,
                                     device=self.device)
            return lambda: D.run(point.name, inputs, cfg)
        from mla_var3.runtime.baselines import make_baseline

        bl = make_baseline(point.name, self.spec.dims, point.problem, self.spec.dtype, self.device, lengths=lengths)
        rec.backend = bl.backend
        return bl.call

    def run_point(self, point: Point) -> Record:
        """Measure one point alone; never raises for a failure of the point itself."""
        return self.run_group([point])[0]

    def _record(self, point: Point, **fields) -> Record:
        """A fresh record of ``point`` (its shape, the model, the dtype, a copy of its extras)."""
        pr = point.problem
        return Record(name=point.name, kind=point.kind, model=self.spec.dims.name, b=pr.b, s=pr.s, t=pr.t, n=pr.n,
                      dtype=self.spec.dtype, extra=dict(point.extra), **fields)

    def _prepare(self, point: Point) -> _Prepared:
        """The point's record and callable, compiled and called twice (its single-call time);
        ``fn`` is None when the point is skipped or failed (``rec.status`` says why)."""
        import torch

        from mla_var3.runtime.baselines import COST_MODEL as BL_COST, BaselineUnavailable

        spec = self.spec
        rec = self._record(point)
        ragged = point.extra.get("lengths") is not None
        rec.cost_model = ("flash_mla" if ragged else KERNELS[point.name].cost_model) if point.kind == DESIGN \
            else BL_COST[point.name]
        fn, one = None, 0.0
        try:
            fn = self._callable(point, rec)
            t0 = time.perf_counter()
            fn()                                     # compile / first call
            _sync(self.device)
            t1 = time.perf_counter()
            fn()
            _sync(self.device)
            one = time.perf_counter() - t1
            rec.extra["first_call_s"] = round(t1 - t0, 3)
            if one * (spec.min_reps + spec.warmup) > spec.slow_point_seconds:
                rec.status = "skipped"
                rec.note = (f"one call takes {one * 1e3:,.0f} ms: {spec.min_reps + spec.warmup} calls exceed the "
                            f"per-point budget of {spec.slow_point_seconds:g} s")
                fn = None
        except BaselineUnavailable as exc:
            rec.status, rec.note, fn = "skipped", str(exc), None
        except torch.cuda.OutOfMemoryError:
            rec.status, rec.note, fn = "skipped", _OOM, None
        except ImportError as exc:
            rec.status, rec.note, fn = "skipped", f"not available: {exc}", None
        except Exception as exc:                     # a failing kernel must not end the sweep
            rec.status, rec.note, fn = "failed", _failure(exc), None
        return _Prepared(point, rec, fn, one)

    def _time_together(self, live: list[_Prepared]) -> None:
        """Time ``live`` points' calls in the same repetitions (``time_interleaved``): CUDA-graph
        (else event) time, eager time and host time per call; with official FlashMLA among them,
        each other point's FlashMLA ÷ it as the median of per-repetition ratios."""
        from mla_var3.runtime.timing import host_times_us, time_interleaved

        spec = self.spec
        fns = {str(i): p.fn for i, p in enumerate(live)}
        budget = spec.point_seconds * len(fns)
        graph = time_interleaved(fns, warmup=spec.warmup, reps=spec.reps, min_reps=spec.min_reps, max_seconds=budget,
                                 replays=spec.eager)
        eager = time_interleaved(fns, warmup=0, reps=spec.reps, min_reps=spec.min_reps, max_seconds=budget,
                                 use_graph=False) if spec.eager else None
        names = [p.point.name for p in live]
        fm = str(names.index(FLASHMLA)) if FLASHMLA in names else None
        # the host time per call (calls issued without a synchronisation), the points' calls
        # interleaved over rounds so that a slow period of the host reaches them all
        calls = {key: int(max(3, min(300, spec.point_seconds / max(p.one, 1e-7)))) for key, p in zip(fns, live)}
        hosts = host_times_us(fns, calls=calls, warmup=1) if eager is not None else {}
        for key, p in zip(fns, live):
            rec = p.rec
            fill_timing(rec, graph[key])
            if len(live) > 1:
                rec.extra["timed_with"] = [n for n in names if n != p.point.name]
            if eager is not None:
                # what an eager caller sees: plain calls between events (host work included),
                # and the host time per call
                rec.extra.update(graph_us=graph[key].median_us if graph[key].method == "cuda-graph" else None,
                                 eager_us=eager[key].median_us, host_us=hosts[key], host_calls=calls[key])
                if eager[key].floor_us is not None:   # the eager time's back-to-back floor and how often it held
                    rec.extra.update(eager_floor_us=eager[key].floor_us, eager_floored=eager[key].floored,
                                     eager_reps=eager[key].reps)
                if graph[key].replays_b2b_us is not None:   # the same kernels back to back, no launch path
                    rec.extra["graph_b2b_us"] = graph[key].replays_b2b_us
            if fm is not None and key != fm and graph[key].gpu:
                rec.extra["flashmla_ratio"] = graph.ratio(fm, key)
                if eager is not None:
                    rec.extra["flashmla_ratio_eager"] = eager.ratio(fm, key)

    def run_group(self, points: list[Point]) -> list[Record]:
        """Measure points of one shape (see :func:`shape_groups`) together: each prepared in
        turn, then all timed in the same repetitions, so each meets the clock and power state the
        others do (timed one after the other, a call after a second of another's load ran up to
        10 % slower on an H200). When their joint timing fails (out of GPU memory, say), each is
        timed alone; a call that ran out of memory beside the others is prepared and timed again
        once they are freed. Never raises for a failure of a point."""
        preps = [self._prepare(p) for p in points]
        live = [p for p in preps if p.fn is not None]
        try:
            if len(live) > 1:
                try:
                    self._time_together(live)
                except Exception as exc:
                    _free(self.device)
                    for p in live:
                        p.rec.extra["timed_alone"] = f"timed with the shape's other calls: {_failure(exc)}"
                        self._time_alone(p)
            elif live:
                self._time_alone(live[0])
        finally:
            for p in preps:
                p.fn = None
            _free(self.device)
        if len(preps) > 1:
            for i, p in enumerate(preps):
                if p.rec.note == _OOM:
                    preps[i] = alone = self._prepare(p.point)
                    if alone.fn is not None:
                        alone.rec.extra["timed_alone"] = f"{_OOM} beside the shape's other calls"
                        self._time_alone(alone)
                        alone.fn = None
                        _free(self.device)
        return [self._finish(p) for p in preps]

    def _time_alone(self, p: _Prepared) -> None:
        """Time one prepared point by itself, its failure recorded on it."""
        import torch

        try:
            self._time_together([p])
        except torch.cuda.OutOfMemoryError:
            p.rec.status, p.rec.note = "skipped", _OOM
        except Exception as exc:
            p.rec.status, p.rec.note = "failed", _failure(exc)

    def _finish(self, p: _Prepared) -> Record:
        """The record's cost, roofline, model prediction and calibrated prediction."""
        from mla_var3.analysis.cost import cost
        from mla_var3.analysis.roofline import predict

        point, rec, spec = p.point, p.rec, self.spec
        pr = point.problem
        ragged = point.extra.get("lengths") is not None
        if ragged:  # the cost and roofline of the batch's mean length (the lengths are recorded)
            pr = Problem(b=pr.b, s=pr.s, t=max(pr.s, round(point.extra["mean_len"])), causal=pr.causal)
        c = cost(rec.cost_model, spec.dims, pr)
        try:
            pred = predict(point.name if point.kind == DESIGN else rec.cost_model, spec.dims, pr, self.dev,
                           "measured").time_s
        except ValueError:
            pred = None
        fill_roofline(rec, c, self.ceil, pred)
        if point.kind == DESIGN and not ragged:
            from mla_var3.analysis.calibration import predict as calibrated_predict

            cal = calibrated_predict(self.calibration, point.name, spec.dims, pr, device=self.dev)
            rec.extra["calibrated_us"], rec.extra["calibrated_source"] = cal.time_s * 1e6, cal.source
        return rec

    # ---- the sweep ---------------------------------------------------------------------------

    def run(self, points: list[Point], on_record: Callable[[Record], None] | None = None,
            progress: bool = True) -> tuple[list[Record], bool]:
        """Run ``points``, each shape's together (:func:`shape_groups`); returns (records,
        interrupted). ``on_record`` is called after each point."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        start = time.perf_counter()
        interrupted = False
        cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*cols, disable=not progress, transient=False) as bar:
            task = bar.add_task("bench", total=len(points))
            try:
                for group in shape_groups(points):
                    pr = group[0].problem
                    names = ", ".join(p.name for p in group)
                    bar.update(task, description=f"b={pr.b} s={pr.s}: {names}")
                    if time.perf_counter() - start > self.spec.max_seconds:
                        recs = [self._record(p, status="skipped",
                                             note=f"total budget of {self.spec.max_seconds:g} s exhausted")
                                for p in group]
                    else:
                        recs = self.run_group(group)
                    for rec in recs:
                        self.records.append(rec)
                        if on_record:
                            on_record(rec)
                        bar.advance(task)
            except KeyboardInterrupt:
                interrupted = True
        return self.records, interrupted


#: the baseline whose paired ratio every other point of its shape records
FLASHMLA = "flashmla_official"
#: the note of a point skipped for want of GPU memory
_OOM = "out of GPU memory"


@dataclass
class _Prepared:
    point: Point
    rec: Record
    fn: Callable[[], object] | None
    one: float


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


def shape_groups(points: list[Point]) -> list[list[Point]]:
    """``points`` cut into runs of consecutive points of one shape — the same b, s, t, mask and
    ragged lengths (a hybrid's n may differ): the designs and baselines :func:`plan_points`
    lists together, timed in the same repetitions by :meth:`Runner.run`."""
    groups: list[list[Point]] = []
    key = None
    for p in points:
        lengths = p.extra.get("lengths")
        k = (p.problem.b, p.problem.s, p.problem.t, p.problem.causal, tuple(lengths) if lengths else None)
        if groups and k == key:
            groups[-1].append(p)
        else:
            groups.append([p])
            key = k
    return groups


def interpret_spec(spec: BenchSpec) -> BenchSpec:
    """The tiny grid for ``--interpret`` (CPU, Triton interpreter): tests the plumbing only.

    h = min(h, 16) heads, b = 1 (2 with ragged batches, lengths in [2, 64]), s = 1 and 2 (or the
    given s when at most two values <= 16), t = 64, n = 32, no n sweep, two repetitions.
    """
    h = min(spec.dims.h, 16)
    dims = spec.dims if h == spec.dims.h else spec.dims.replace(h=h, name=f"{spec.dims.name}(h={h})")
    ss = spec.ss if len(spec.ss) <= 2 and max(spec.ss) <= 16 else (1, 2)
    seqlens = None if spec.seqlens is None else "random:2:64"   # a ragged batch within t = 64
    return dataclasses.replace(spec, dims=dims, bs=(2,) if seqlens else (1,), ss=ss, t=64, n=(32,), sweep_s=None,
                               seqlens=seqlens,
                               warmup=1, reps=2, min_reps=1, point_seconds=5.0, slow_point_seconds=60.0,
                               max_seconds=min(spec.max_seconds, 120.0))

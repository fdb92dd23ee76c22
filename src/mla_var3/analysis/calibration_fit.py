"""Fit a :class:`~mla_var3.analysis.calibration.Calibration` from timed records.

:func:`fit` takes the records that ``mla_var3.runtime.records`` writes (``results.json`` of
``mla-var3 bench``: dicts or ``Record`` objects) or :class:`Point` objects, and fits every
kernel's law (:mod:`mla_var3.analysis.kernel_laws`) by least squares on the log of
predicted ÷ measured time (Levenberg–Marquardt, deterministic; bounds from each parameter's
:class:`~mla_var3.analysis.kernel_laws.Spec`).

What a record needs (other fields are ignored):

===============  ==============================================================================
``name``         the design (``flash_mla``, ``flash_attention``, ``mla_var6_plus``)
``kind``         ``"design"`` (baselines are skipped), ``status`` ``"ok"``
``backend``      the kernel that ran (``"gluon"``, ``"triton"``); required
``model``        a preset name (``deepseek-v3``); ``dtype`` (``bf16``); the heads ``extra.h`` (or
                 the results meta's ``dims.h``) when the call ran other heads than the preset's
                 (a tensor-parallel rank's h/tp)
``b, s, t, n``   the shape (``n``: the hybrid's window)
``time_us``      with ``method`` ``"cuda-graph"``: a GPU time; ``"cuda-events"`` or ``"eager"``:
                 an eager time; ``"perf-counter"`` (CPU) is skipped
``extra``        optional: ``graph_us``, ``eager_us``, ``host_us`` (each overrides the above;
                 host = wall time of many calls issued without a sync ÷ calls), ``causal``
                 (default: the meta's ``spec.causal``, else True), ``source`` (file name)
===============  ==============================================================================

GPU-group parameters are fitted from GPU times, host-group ones from host times (or, without
them, from host-bound eager calls: eager ≥ 1.25 × GPU time), and the eager law's two shares
(``eager_lead``, ``eager_tail``) together from the eager times, to the least mean log error
(:func:`_fit_eager`); ``fit(..., base=cal,
only={"host"})`` re-fits the host costs alone. :func:`compare` lists predicted ÷ measured per
point (the table of ``docs/cost-analysis.md``, "Fit quality and the bar").
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from mla_var3._io import check_field, load_json, show_path
from mla_var3.analysis.calibration import Calibration, Parameter, eager_time_s, host_time_s, law_breakdown
from mla_var3.analysis.devices import Device, get_device
from mla_var3.analysis.kernel_laws import DEPENDS, LAWS, SPECS, call_kernel, spec_of, splits_of
from mla_var3.shapes import Problem, get_preset

#: an eager time this much above the GPU time means the call was host-bound.
HOST_BOUND = 1.25


@dataclass(frozen=True)
class Point:
    """One measured call, normalised for the fit.

    ``gpu_us`` (a CUDA-graph replay), ``eager_us`` (plain calls timed with events) and
    ``host_us`` (host time per call) may each be missing. ``best_n``: a hybrid time that is the
    best over the window n (n unknown; the prediction takes the best n too). ``h``: the heads of
    the call when not the preset's (None: the preset's).
    """

    design: str
    backend: str
    b: int
    s: int
    t: int
    n: int | None = None
    causal: bool = True
    model: str = "deepseek-v3"
    dtype: str = "bf16"
    gpu_us: float | None = None
    eager_us: float | None = None
    host_us: float | None = None
    best_n: bool = False
    source: str = ""
    note: str = ""
    h: int | None = None

    @property
    def problem(self) -> Problem:
        return Problem(b=self.b, s=self.s, t=self.t, n=self.n, causal=self.causal)

    @property
    def dims(self):
        dims = get_preset(self.model, self.dtype)
        return dims if self.h in (None, dims.h) else dataclasses.replace(dims, h=self.h, name=f"{dims.name} h={self.h}")

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, "", False) or k == "causal"}

    @classmethod
    def from_dict(cls, d: dict) -> "Point":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _get(r, key, default=None):
    return r.get(key, default) if isinstance(r, dict) else getattr(r, key, default)


def points_from_records(records: Iterable, *, meta: dict | None = None, source: str = "",
                        backends: dict[str, str] | None = None, allow_cpu: bool = False) -> list[Point]:
    """:class:`Point` objects from result records (dicts or ``Record``); see the module docstring.
    ``backends`` names, per design, the kernel of records that do not say (older results files);
    ``allow_cpu`` keeps CPU (``perf-counter``) timings, for a calibration marked as a CPU's."""
    meta = meta or {}
    causal_default = bool((meta.get("spec") or {}).get("causal", True))
    out = []
    for r in records:
        if isinstance(r, Point):
            out.append(r)
            continue
        if _get(r, "kind", "design") != "design" or _get(r, "status", "ok") != "ok" or not _get(r, "time_us"):
            continue
        extra = _get(r, "extra") or {}
        method = _get(r, "method") or ""
        if method == "perf-counter" and not allow_cpu:
            continue
        backend = _get(r, "backend") or (backends or {}).get(_get(r, "name"))
        if not backend:
            raise ValueError(f"record {_get(r, 'name')} b={_get(r, 'b')} s={_get(r, 's')} has no backend: "
                             "the fit needs the kernel that ran")
        time_us = float(_get(r, "time_us"))
        # a run with overridden dims names its model "deepseek-v3(h=16)" (or "deepseek-v3 tp=8"):
        # the preset is the name before the override, the heads the run's dims
        model = re.split(r"[( ]", _get(r, "model") or "deepseek-v3", maxsplit=1)[0]
        heads = extra.get("h", (meta.get("dims") or {}).get("h"))
        if heads is not None and heads == get_preset(model).h:
            heads = None
        gpu = extra.get("graph_us", time_us if method == "cuda-graph" else None)
        eager = extra.get("eager_us", time_us if method in ("cuda-events", "eager", "perf-counter") else None)
        out.append(Point(
            design=_get(r, "name"), backend=backend, b=int(_get(r, "b")), s=int(_get(r, "s")), t=int(_get(r, "t")),
            n=_get(r, "n"), causal=bool(extra.get("causal", causal_default)), model=model,
            dtype=_get(r, "dtype") or "bf16", gpu_us=gpu, eager_us=eager, host_us=extra.get("host_us"),
            best_n=bool(extra.get("best_n", False)), source=extra.get("source", source), note=extra.get("note", ""),
            h=None if heads is None else int(heads),
        ))
    return out


def points_from_results(path, name: str | None = None, backends: dict[str, str] | None = None) -> list[Point]:
    """Points from a ``results.json`` (``{"meta": ..., "records": [...]}``); their source is
    ``name`` (default the file name) and the measurements' commit; ``backends`` as in
    :func:`points_from_records`."""
    data = load_json(path, "results file")
    meta = check_field(data, "meta", "dict", f"results file {show_path(path)}", optional=True) or {}
    check_field(data, "records", "list", f"results file {show_path(path)}", optional=True)
    commit = (meta.get("environment") or {}).get("commit")
    label = (name or Path(path).name) + (f" ({commit})" if commit else "")
    return points_from_records(data.get("records") or [], meta=meta, source=label, backends=backends)


# ----------------------------------------------------------------------------------------------
# prediction of a point
# ----------------------------------------------------------------------------------------------

def _n_grid(t: int) -> range:
    return range(0, t + 1, max(1, t // 256))


def point_gpu_s(cal: Calibration, pt: Point) -> tuple[float, int | None]:
    """Predicted GPU time of a point (best over n for ``best_n`` points) and the n used."""
    dims, pb = pt.dims, pt.problem
    if not pt.best_n:
        return law_breakdown(cal, pt.design, pt.backend, dims, pb).gpu_s, pt.n
    return min((law_breakdown(cal, pt.design, pt.backend, dims, pb.with_n(n)).gpu_s, n) for n in _n_grid(pt.t))


def point_eager_s(cal: Calibration, pt: Point, gpu_s: float | None = None) -> float:
    """Predicted eager time (:func:`~mla_var3.analysis.calibration.eager_time_s`)."""
    gpu_s = point_gpu_s(cal, pt)[0] if gpu_s is None else gpu_s
    return eager_time_s(cal, pt.design, pt.backend, pt.problem, gpu_s,
                        host_time_s(cal, pt.design, pt.backend, pt.dims, pt.problem))


def compare(cal: Calibration, points: Iterable[Point]) -> list[dict]:
    """Predicted ÷ measured for every GPU and eager time of ``points``: one row each with
    design, backend, shape, kind (``gpu``/``eager``), measured and predicted µs, ratio, source."""
    rows = []
    for pt in points:
        if not cal.has(pt.design, pt.backend):
            continue
        gpu_s, n = point_gpu_s(cal, pt)
        for kind, measured in (("gpu", pt.gpu_us), ("eager", pt.eager_us)):
            if measured is None:
                continue
            pred = gpu_s if kind == "gpu" else point_eager_s(cal, pt, gpu_s)
            rows.append({"design": pt.design, "backend": pt.backend, "h": pt.dims.h, "b": pt.b, "s": pt.s, "t": pt.t,
                         "n": n, "best_n": pt.best_n, "kind": kind, "measured_us": measured,
                         "predicted_us": pred * 1e6, "ratio": pred * 1e6 / measured, "source": pt.source,
                         "note": pt.note})
    return rows


# ----------------------------------------------------------------------------------------------
# the fit
# ----------------------------------------------------------------------------------------------

def _lm(residuals, x0, lo, hi, iters: int = 200) -> np.ndarray:
    """Levenberg–Marquardt with box bounds (clipped steps) and forward-difference Jacobians."""
    x, lo, hi = np.array(x0, float), np.array(lo, float), np.array(hi, float)
    r = residuals(x)
    cost, lam = float(r @ r), 1e-2
    for _ in range(iters):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            step = 1e-6 * max(abs(x[j]), 1e-3)
            xj = x.copy()
            xj[j] = xj[j] + step if xj[j] + step <= hi[j] else xj[j] - step
            jac[:, j] = (residuals(xj) - r) / (xj[j] - x[j])
        a, g = jac.T @ jac, jac.T @ r
        for _ in range(30):
            delta = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            xn = np.clip(x + delta, lo, hi)
            rn = residuals(xn)
            cn = float(rn @ rn)
            if cn < cost:
                break
            lam *= 4.0
        else:
            return x
        converged = cost - cn < 1e-12 * max(cost, 1e-30)
        x, r, cost, lam = xn, rn, cn, max(lam / 3.0, 1e-12)
        if converged:
            break
    return x


def _matches(full: str, group: str, only) -> bool:
    if only is None:
        return True
    return any(item == full or item == group or full.startswith(item + ".") for item in only)


def _sources(points: list[Point]) -> str:
    files = sorted({p.source for p in points if p.source})
    return ", ".join(files) if files else "records given to fit()"


def _order(kernels: set) -> list:
    out: list = []

    def visit(k):
        for dep in DEPENDS.get(k, ()):
            visit(dep)
        if k not in out:
            out.append(k)

    for k in sorted(kernels):
        visit(k)
    return out


def fit(records: Iterable, *, device: str | Device = "h200", base: Calibration | None = None, only: Iterable[str] | None = None,
        hold: Iterable[str] = (), default_backends: dict | None = None, versions: dict | None = None,
        commits: dict | None = None, notes: str | None = None, meta: dict | None = None,
        allow_cpu: bool = False) -> Calibration:
    """Fit a calibration of ``device`` from timed records (see the module docstring).

    ``base``: parameters not fitted here keep its values (and sources); without it they start
    at their priors. ``only``: fit just these — full parameter names, kernel prefixes
    (``"flash_mla.gluon"``) or groups (``"host"``, ``"gpu"``). ``hold``: full names kept at the
    base's value and source (the records cannot identify them). ``device``: a key of the devices
    table or a :class:`~mla_var3.analysis.devices.Device` (one measured with ``mla-var3 devices
    --measure --write``), whose measured ceilings a fit without ``base`` takes. ``default_backends``,
    ``versions``, ``commits``, ``notes`` go into the file (default: the base's). ``allow_cpu``
    fits CPU timings too (the base must then be marked ``gpu=False``).
    """
    points = points_from_records(records, meta=meta, allow_cpu=allow_cpu)
    if allow_cpu and (base is None or base.gpu):
        raise ValueError("fit(allow_cpu=True) needs a base calibration marked gpu=False: CPU timings never make a "
                         "GPU's calibration")
    only = set(only) if only is not None else None
    hold = set(hold)
    if (only is not None or hold) and base is None:
        raise ValueError("fit(only=..., hold=...) needs a base calibration for the parameters it does not fit")
    missing = sorted(hold - set(base.parameters)) if hold else []
    if missing:
        raise ValueError(f"fit(hold=...): the base has no parameter {', '.join(missing)}")
    if base is not None:
        cal = base
    else:
        dev = get_device(device)
        ceil = dev.ceilings("measured", 2)
        cal = Calibration(dev.key, dev.name, int(dev.sms or 0) or 1,
                          {"kind": ceil.kind, "flops_per_s": ceil.flops_per_s, "bytes_per_s": ceil.bytes_per_s,
                           "source": ceil.source}, {}, {})
    kernels = _order({(p.design, p.backend) for p in points if (p.design, p.backend) in LAWS})
    params = dict(cal.parameters)
    quality = dict(cal.fit)
    for design, backend in kernels:
        specs = SPECS[(design, backend)]
        for s in specs:                       # start every parameter at the base or its prior
            full = f"{design}.{backend}.{s.name}"
            if full not in params:
                why = s.why or "not identified by the records given"
                params[full] = Parameter(full, s.unit, s.prior, f"prior, not fitted: {why}", s.meaning, False, s.group)
            elif not params[full].meaning:    # a base parameter given by value and source only
                params[full] = dataclasses.replace(params[full], unit=s.unit, meaning=s.meaning, group=s.group)
        cal = cal.with_parameters(params)
        mine = [p for p in points if (p.design, p.backend) == (design, backend)]
        gpu_pts = [p for p in mine if p.gpu_us is not None]
        free = [s for s in specs if s.fit and s.group == "gpu" and _matches(f"{design}.{backend}.{s.name}", s.group, only)
                and f"{design}.{backend}.{s.name}" not in hold]
        if gpu_pts and free:
            cal, params = _fit_gpu(cal, params, design, backend, free, gpu_pts)
        hosts = [s for s in specs if s.fit and s.group == "host" and _matches(f"{design}.{backend}.{s.name}", s.group, only)
                 and f"{design}.{backend}.{s.name}" not in hold]
        if hosts:
            cal, params = _fit_host(cal, params, design, backend, {s.name for s in hosts}, mine)
        quality[f"{design}.{backend}"] = _quality(cal, mine)
    return dataclasses.replace(
        cal, parameters=params, fit=quality,
        default_backends=default_backends if default_backends is not None else cal.default_backends,
        versions=versions if versions is not None else cal.versions,
        commits=commits if commits is not None else cal.commits,
        notes=notes if notes is not None else cal.notes,
        points=tuple(p.to_dict() for p in points) if only is None else tuple(cal.points) + tuple(
            p.to_dict() for p in points if p.to_dict() not in cal.points),
    )


def _fit_gpu(cal: Calibration, params: dict, design: str, backend: str, free: list, pts: list[Point]):
    names = [f"{design}.{backend}.{s.name}" for s in free]
    measured = np.array([p.gpu_us * 1e-6 for p in pts])

    def with_values(x) -> Calibration:
        return cal.with_parameters({n: dataclasses.replace(params[n], value=float(v)) for n, v in zip(names, x)})

    def residuals(x):
        c = with_values(x)
        return np.log(np.array([point_gpu_s(c, p)[0] for p in pts]) / measured)

    x0 = [params[n].value for n in names]
    seen = _identified(residuals, x0, [s.lo for s in free], [s.hi for s in free])
    if not any(seen):
        return cal, params
    free_seen, names_seen = [s for s, ok in zip(free, seen) if ok], [n for n, ok in zip(names, seen) if ok]
    x_seen = _lm(lambda y: residuals(_merge(x0, seen, y)), [v for v, ok in zip(x0, seen) if ok],
                 [s.lo for s in free_seen], [s.hi for s in free_seen])
    src = f"fitted to {len(pts)} GPU times: {_sources(pts)}"
    for n, v, s in zip(names_seen, x_seen, free_seen):
        params[n] = Parameter(n, s.unit, float(v), src, s.meaning, True, s.group)
    return cal.with_parameters(params), params


def _merge(x0: list[float], mask: list[bool], y) -> list[float]:
    """``x0`` with the entries where ``mask`` holds replaced, in order, by ``y``."""
    it = iter(y)
    return [float(next(it)) if m else v for v, m in zip(x0, mask)]


def _identified(residuals, x0: list[float], lo: list[float], hi: list[float]) -> list[bool]:
    """Which parameters the points can identify: moving one alone by 5 % (of its value, or of its
    range where it is 0) either way changes some point's residual. One no point's time depends on
    near its value (a term the calls never reach, such as a last wave of few programs in a grid
    with none) keeps its value and source instead of being reported as fitted."""
    r0 = residuals(x0)
    out = []
    for j, v in enumerate(x0):
        moved = False
        step = 0.05 * (abs(v) if v else hi[j] - lo[j])
        for cand in (v - step, v + step):
            c = min(max(cand, lo[j]), hi[j])
            if c == v:
                continue
            x = list(x0)
            x[j] = c
            if np.max(np.abs(residuals(x) - r0)) > 1e-9:
                moved = True
                break
        out.append(moved)
    return out


def low_quartile(vals: list[float]) -> float:
    """The lower quartile of ``vals``: a host time's estimate across one launch path's calls.
    Noise on the host only adds time (on an H200's host one path read 130-299 us across nine
    calls of one run), so the median of a noisy run reads high."""
    return float(np.quantile(vals, 0.25))


def _fit_host(cal: Calibration, params: dict, design: str, backend: str, names: set, pts: list[Point]):
    """host_us from unsplit calls, host_split_us = split calls' host time - host_us (each the
    :func:`low_quartile` of its calls): explicit host times when the records have them, else
    host-bound eager calls; else kept."""
    samples = [(p.host_us, p) for p in pts if p.host_us is not None]
    how = "host times"
    if not samples:
        how = f"host-bound eager calls (eager >= {HOST_BOUND} x GPU time)"
        samples = [(p.eager_us, p) for p in pts if p.eager_us is not None and p.eager_us >= HOST_BOUND * (
            p.gpu_us if p.gpu_us is not None else point_gpu_s(cal, p)[0] * 1e6)]
    classes: dict[bool, list[tuple[float, Point]]] = {False: [], True: []}
    # a hybrid call at n = 0 runs the absorbed kernel (kernel_laws.call_kernel): its host time is
    # that kernel's (fitted before, kernel_laws.DEPENDS) plus n0_host_us, fitted from the difference
    n0: list[tuple[float, Point]] = []
    for v, p in samples:
        if call_kernel(design, backend, p.problem) != (design, backend):
            n0.append((v, p))
        else:
            classes[splits_of(design, backend, p.dims, p.problem, cal.sms) > 1].append((v, p))
    full = f"{design}.{backend}."
    if "n0_host_us" in names and n0:
        kernel = call_kernel(design, backend, n0[0][1].problem)
        vals = [v - host_time_s(cal, *kernel, p.dims, p.problem) * 1e6 for v, p in n0]
        spec = spec_of(full + "n0_host_us")
        params[full + "n0_host_us"] = Parameter(
            full + "n0_host_us", "us", max(0.0, low_quartile(vals)),
            f"lower quartile of {len(vals)} {how} at n = 0 minus the absorbed call's host time: "
            f"{_sources([p for _, p in n0])}", spec.meaning, True, "host")
    if "host_us" in names and classes[False]:
        vals = [v for v, _ in classes[False]]
        spec = spec_of(full + "host_us")
        params[full + "host_us"] = Parameter(full + "host_us", "us", low_quartile(vals),
                                             f"lower quartile of {len(vals)} {how}: "
                                             f"{_sources([p for _, p in classes[False]])}", spec.meaning, True, "host")
    if "host_split_us" in names and classes[True]:
        vals = [v for v, _ in classes[True]]
        base_host = params[full + "host_us"]
        spec = spec_of(full + "host_split_us")
        params[full + "host_split_us"] = Parameter(
            full + "host_split_us", "us", max(0.0, low_quartile(vals) - base_host.value),
            f"lower quartile of {len(vals)} split-KV {how} minus host_us: {_sources([p for _, p in classes[True]])}",
            spec.meaning, True, "host")
    if names & {"eager_lead", "eager_tail"}:
        _fit_eager(cal.with_parameters(params), params, design, backend, names, pts)
    return cal.with_parameters(params), params


#: the fewest calls on one side of the GPU/host balance that fit its eager parameter
EAGER_MIN_CALLS = 2
#: the grid the eager law's two shares are chosen on (both in [0, 1])
EAGER_GRID = np.linspace(0.0, 1.0, 101)


def _fit_eager(cal: Calibration, params: dict, design: str, backend: str, names: set, pts: list[Point]) -> None:
    """eager_lead and eager_tail chosen together on :data:`EAGER_GRID` to minimise the mean
    |log(predicted ÷ measured eager time)| over this kernel's calls, the law evaluated at each
    call's measured GPU time and predicted host time: the error the guide's bar scores. A share
    is fitted only when at least :data:`EAGER_MIN_CALLS` calls lie on its side of the balance
    (lead: GPU-bound, measured GPU time at least the predicted host time; tail: host-bound),
    else it is held; ties go to the smaller shares. Calls of this kernel with a measured GPU and
    eager time (a hybrid call at n = 0 runs the absorbed kernel: not this kernel's).

    Why not the median of (eager - GPU) / host over the GPU-bound calls (the rule until
    f3eeb86): on an H200 the eager excess of long calls grows with their GPU time (3-14 % at
    0.9-4 ms, 50-550 µs), a ratio to the host time no share of it explains; those calls moved
    the median to 0.41 where the short calls the share matters for read 0.2, and held-out eager
    predictions ran 10-25 % high. Under the log error a long call's excess weighs what it costs
    the prediction, and the share it cannot be fitted by does not pull on it."""
    full = f"{design}.{backend}."
    rows, sides = [], {"eager_lead": [], "eager_tail": []}
    for p in pts:
        if p.gpu_us is None or p.eager_us is None or call_kernel(design, backend, p.problem) != (design, backend):
            continue
        host = host_time_s(cal, design, backend, p.dims, p.problem) * 1e6
        rows.append((p.gpu_us, host, p.eager_us))
        sides["eager_lead" if p.gpu_us >= host else "eager_tail"].append(p)
    free = [name for name in ("eager_lead", "eager_tail") if name in names and len(sides[name]) >= EAGER_MIN_CALLS]
    if not free:
        return
    gpu, host, eager = (np.array(col) for col in zip(*rows))
    held = {name: cal.parameters[full + name].value if full + name in cal.parameters else 0.0
            for name in ("eager_lead", "eager_tail")}
    leads = EAGER_GRID if "eager_lead" in free else np.array([held["eager_lead"]])
    tails = EAGER_GRID if "eager_tail" in free else np.array([held["eager_tail"]])
    # mean |log| for every (lead, tail) pair at once: [leads, tails, calls]
    pred = np.maximum(gpu + leads[:, None, None] * host, host + tails[None, :, None] * gpu)
    err = np.abs(np.log(pred / eager)).mean(axis=-1)
    i, j = np.unravel_index(np.argmin(err), err.shape)   # first minimum: the smallest shares
    chosen = {"eager_lead": float(leads[i]), "eager_tail": float(tails[j])}
    for name in free:
        what = "GPU-bound" if name == "eager_lead" else "host-bound"
        params[full + name] = Parameter(
            full + name, "1", chosen[name],
            f"least mean |log eager error| over {len(rows)} calls ({len(sides[name])} {what}): "
            f"{_sources([p for p in sides[name]])}", spec_of(full + name).meaning, True, "host")


def _quality(cal: Calibration, pts: list[Point]) -> dict:
    rows = compare(cal, pts)
    out = {}
    for kind in ("gpu", "eager"):
        ratios = [r["ratio"] for r in rows if r["kind"] == kind]
        if ratios:
            logs = [math.log(x) for x in ratios]
            out[kind] = {"points": len(ratios), "rms_log": math.sqrt(sum(v * v for v in logs) / len(logs)),
                         "min_ratio": min(ratios), "max_ratio": max(ratios)}
    return out

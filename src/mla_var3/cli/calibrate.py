"""``mla-var3 calibrate``: time a short grid of each design's *default* call on this GPU, fit the
calibrated model (:func:`mla_var3.analysis.calibration_fit.fit`) to it and write a calibration file
keyed by device, backend, versions and commit.

Per point, with the package's timing primitive (:mod:`mla_var3.runtime.timing`): the CUDA-graph
time (``time_fn``), the eager time (``time_fn(use_graph=False)``: plain calls between events,
host work included) and the host time per call (``host_time_us``; for a call under
:data:`HOST_RETIME_BELOW_US` of GPU time, the lower of that and a second pass after the grid); the
backend a default call selects is recorded with it. The grid covers what the laws need to tell their parameters apart
(several t for the per-program cost, small batches for split-KV, each tile family of the
expanded kernel, the hybrid at several n; each design also at 16 heads, the absorbed one at 16,
32 and 64: DeepSeek-V3's heads per GPU at TP 8, 4 and 2) and stops at a time budget (150 s by
default).

On a machine without a GPU it runs a few tiny calls of a small preset under Triton's CPU
interpreter and writes a calibration keyed by device ``"cpu"`` and marked ``gpu: false``: it
tests the plumbing (timing, records, fit, file) and is never a GPU's calibration.

Example
-------
>>> result = run_calibration(quick=True)              # doctest: +SKIP
>>> save_calibration(result.calibration, "calibration-h200.json")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from mla_var3._argtypes import path_arg, positive_float
from mla_var3.cli import _common as C
from mla_var3.designs import DESIGNS
from mla_var3.shapes import Problem, get_preset

_ABSORBED, _EXPANDED, _HYBRID = (next(d.kernel for d in DESIGNS if f(d)) for f in (
    lambda d: d.latent and not d.split, lambda d: not d.latent, lambda d: d.split))

#: heads per GPU the grid times besides the model's 128: DeepSeek-V3 at TP 8, 4 and 2.
TP_HEADS = (16, 32, 64)
#: (kernel, b, s, t, n, h) of the GPU grid (h None: the model's heads); QUICK is a part of it.
GRID = tuple((_ABSORBED, b, s, 4096, None, None) for b in (32, 64) for s in (1, 2, 4, 8, 16, 32)) + (
    (_ABSORBED, 8, 1, 4096, None, None), (_ABSORBED, 1, 1, 32768, None, None), (_ABSORBED, 8, 4, 16384, None, None),
    (_ABSORBED, 4, 16, 1024, None, None), (_ABSORBED, 32, 16, 16384, None, None),
    (_ABSORBED, 20, 4, 10240, None, None), (_ABSORBED, 48, 2, 8192, None, None),    # uniform batches the plan packs
    # past the crossover: the a6efe19 fit, up to s = 32, predicted s = 96 at 0.83-0.89 of its time
    (_ABSORBED, 32, 64, 4096, None, None), (_ABSORBED, 8, 128, 4096, None, None),
) + tuple((_EXPANDED, 32, s, 4096, None, None) for s in (1, 8, 16, 32, 64, 128, 512, 1024)) + (
    (_EXPANDED, 64, 16, 4096, None, None), (_EXPANDED, 64, 64, 4096, None, None), (_EXPANDED, 8, 16, 1024, None, None),
    (_EXPANDED, 9, 1, 32768, None, 16),       # 144 programs (unsplit), one short wave: one program's rate (program_gbs_m16)
    # the smallest calls, where the launch and drain are most of the time: without them the fit traded fixed_us
    # against the stream rate (H100: 45.8 us and 1.09x the copy rate) and priced b2 t1024 at 1.42x its time
    (_EXPANDED, 2, 1, 2048, None, None), (_EXPANDED, 4, 16, 1024, None, None), (_ABSORBED, 2, 1, 2048, None, None),
) + tuple((_HYBRID, 32, 16, 4096, n, None) for n in (0, 1024, 2048, 3072, 4096)) + (
    (_HYBRID, 32, 4, 4096, 256, None), (_HYBRID, 32, 4, 4096, 1024, None), (_HYBRID, 64, 16, 4096, 2048, None),
    (_HYBRID, 32, 64, 4096, 2048, None),
) + tuple((_HYBRID, 32, 32, 4096, n, None) for n in (1024, 2048, 3072)) + (   # where the model alone put the
    (_HYBRID, 64, 32, 4096, 2048, None),                                      # hybrid's win (s = 32)
) + tuple((_ABSORBED, b, s, t, None, h) for h in TP_HEADS for b, s, t in ((32, 1, 4096), (64, 2, 8192), (96, 4, 2048))
          ) + tuple((_EXPANDED, 32, s, 4096, None, 16) for s in (16, 128)) + (
    (_HYBRID, 32, 16, 4096, 1024, 16), (_HYBRID, 32, 32, 4096, 2048, 16),
)
QUICK = tuple(p for p in GRID if (p[0] == _ABSORBED and p[1] == 32 and p[2] in (1, 2, 16) and p[3] == 4096)
              or (p[0] == _ABSORBED and p[1:4] in ((8, 1, 4096), (4, 16, 1024)) and p[5] is None)
              or (p[0] == _EXPANDED and p[1] == 32 and p[2] in (1, 64, 512))
              or (p[0] == _HYBRID and p[2] == 16 and p[1] == 32 and p[4] in (0, 2048, 4096))
              or (p[5] == 16 and p[0] != _ABSORBED and p[2] == 16))
#: the CPU grid (Triton interpreter): a small preset, tiny shapes (one at fewer heads).
CPU_MODEL = "deepseek-v2-lite"
CPU_GRID = ((_ABSORBED, 1, 1, 64, None, None), (_ABSORBED, 1, 2, 64, None, 8), (_EXPANDED, 1, 1, 64, None, None),
            (_HYBRID, 1, 2, 64, 32, None))


@dataclass
class CalibrationRun:
    """What :func:`run_calibration` returns: the fitted calibration, the records it was fitted
    from (``runtime.records.Record``) and the run's environment."""

    calibration: object
    records: list
    environment: dict
    skipped: list


def default_backends(records) -> dict[str, list[dict]]:
    """Rules ``[{"backend": ..., "s_gt": ...}, ...]`` per design from the backends the default calls
    ran: each change of backend along s becomes a threshold (the largest s of the one below)."""
    out = {}
    for name in sorted({r.name for r in records}):
        pairs = sorted({(r.s, r.backend) for r in records if r.name == name and r.backend})
        segments: list[tuple[str, int]] = []           # (backend, largest s) from small s up
        for s, backend in pairs:
            if segments and segments[-1][0] == backend:
                segments[-1] = (backend, s)
            else:
                segments.append((backend, s))
        rules = [{"backend": b, "s_gt": segments[i - 1][1]} for i, (b, _) in reversed(list(enumerate(segments))) if i]
        out[name] = rules + ([{"backend": segments[0][0]}] if segments else [])
    return out


def _time_point(name: str, dims, problem: Problem, dtype: str, device: str, budget_s: float):
    """(graph timing, eager timing, host µs, backend) of one default call."""
    from mla_var3.kernel import launchers as D
    from mla_var3.reference.inputs import design_inputs
    from mla_var3.runtime.timing import host_time_us, time_fn

    inputs = design_inputs(name, dims, problem, dtype=dtype, device=device)

    def call():
        return D.run(name, inputs)

    gpu = device.startswith("cuda")
    graph = time_fn(call, warmup=3 if gpu else 1, reps=100 if gpu else 3, min_reps=5 if gpu else 1,
                    max_seconds=budget_s, replays=gpu)
    eager = time_fn(call, warmup=1, reps=100 if gpu else 3, min_reps=5 if gpu else 1, max_seconds=budget_s,
                    use_graph=False) if gpu else graph
    host = host_time_us(call, calls=100 if gpu else 2, warmup=3 if gpu else 0)
    return graph, eager, host, D.backend_name(name, device, s=problem.s)


def _call_dims(dims, h: int | None):
    """``dims`` with the heads of a grid point that overrides them (``h``), named for it."""
    return dims if h is None else dataclasses.replace(dims, h=h, name=f"{dims.name} h={h}")


#: calls whose GPU time is below this have their host time timed a second time after the grid
HOST_RETIME_BELOW_US = 1500.0


def _retime_host(records, dims, device: str, log) -> None:
    """Time again, after the grid, the host time of each call whose GPU time is short enough for
    the host to matter, and keep the lower of the two: on an H200 the first ~25 s of a run on a
    freshly started machine read host times up to twice the later ones for the same kind of call
    (at 2e8bf19: the absorbed b = 32 calls at s = 2-32 at 78-108 µs, then 46-48 µs for the b = 64
    calls that followed), and host time only ever gains from the host's other work."""
    import torch

    from mla_var3.kernel import launchers as D
    from mla_var3.reference.inputs import design_inputs
    from mla_var3.runtime.timing import host_time_us

    for rec in records:
        if rec.time_us >= HOST_RETIME_BELOW_US:
            continue
        inputs = design_inputs(rec.name, _call_dims(dims, rec.extra.get("h")), Problem(b=rec.b, s=rec.s, t=rec.t, n=rec.n), dtype="bf16",
                               device=device)
        again = host_time_us(lambda: D.run(rec.name, inputs), calls=100, warmup=3)
        first = rec.extra["host_us"]
        rec.extra["host_us"] = min(first, again)
        rec.extra["host_us_passes"] = [first, again]
        del inputs
        torch.cuda.empty_cache()
    log("host times timed again after the grid (calls under "
        f"{HOST_RETIME_BELOW_US:,.0f} µs of GPU time): the lower of the two passes is kept")


def run_calibration(*, quick: bool = False, max_seconds: float = 150.0, point_seconds: float = 0.25,
                    log: Callable[[str], None] = lambda _m: None, devices_file=None):
    """Time the grid on this machine (the GPU, else tiny shapes under the interpreter) and fit.

    Returns a :class:`CalibrationRun`. On a GPU the device must be in the devices table (add an
    unknown one with ``mla-var3 devices --measure --write``); the calibration the package ships
    for it, when there is one, gives the starting values and the kernels the grid does not time.
    """
    import torch

    from mla_var3.analysis.calibration import load_calibration
    from mla_var3.analysis.devices import DEFAULT_DEVICE, get_device, match_device_name
    from mla_var3.runtime.environment import environment
    from mla_var3.runtime.records import Record

    gpu = torch.cuda.is_available()
    if not gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before the kernel modules load
    env = environment()
    if gpu:
        dev = match_device_name(env["device"], devices_file)
        if dev is None:
            raise ValueError(f"{env['device']!r} is not in the devices table: add it with `mla-var3 devices --measure "
                             "--write FILE` and pass --devices-file FILE")
        dims, grid, device = get_preset("deepseek-v3"), (QUICK if quick else GRID), "cuda"
    else:
        dev = get_device(DEFAULT_DEVICE)
        dims, grid, device = get_preset(CPU_MODEL), CPU_GRID, "cpu"
    start = time.perf_counter()
    records, skipped = [], []
    for name, b, s, t, n, h in grid:
        pb = Problem(b=b, s=s, t=t, n=n)
        call_dims = _call_dims(dims, h)
        label = f"{name} b={b} s={s} t={t}" + (f" n={n}" if n is not None else "") + (f" h={h}" if h else "")
        if time.perf_counter() - start > max_seconds:
            skipped.append(f"{label}: the time budget of {max_seconds:g} s is spent")
            continue
        try:
            graph, eager, host, backend = _time_point(name, call_dims, pb, "bf16", device, point_seconds)
        except torch.cuda.OutOfMemoryError:
            skipped.append(f"{label}: out of GPU memory")
            continue
        except Exception as exc:        # one failing call costs its point, not the run (listed at the end)
            skipped.append(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        finally:
            if gpu:
                torch.cuda.empty_cache()
        extra = {"graph_us": graph.median_us, "eager_us": eager.median_us, "host_us": host, "causal": pb.causal,
                 **({"graph_b2b_us": graph.replays_b2b_us} if graph.replays_b2b_us is not None else {}),
                 "source": f"mla-var3 calibrate ({env['commit'][:7]})", **({"h": h} if h else {})}
        records.append(Record(name=name, kind="design", model=dims.name, b=b, s=s, t=t, n=n, time_us=graph.median_us,
                              p10_us=graph.p10_us, p90_us=graph.p90_us, reps=graph.reps, method=graph.method,
                              gpu=graph.gpu, backend=backend, extra=extra))
        floor = (f" (back-to-back {eager.floor_us:,.1f} us, raising {eager.floored} of {eager.reps} repetitions"
                 + (f"; the graph's replays back to back {graph.replays_b2b_us:,.1f} us"
                    if graph.replays_b2b_us is not None else "") + ")" if eager.floor_us is not None else "")
        log(f"{label} [{backend}]: graph {graph.median_us:,.1f} us, eager {eager.median_us:,.1f} us{floor}, "
            f"host {host:,.1f} us")
    if gpu:
        _retime_host(records, dims, device, log)
    shipped = load_calibration(None, device=dev) if gpu and not os.environ.get("MLA_VAR3_CALIBRATION") else None
    cal = calibration_from_records(records, env, dev, gpu=gpu, quick=quick, shipped=shipped)
    return CalibrationRun(cal, records, env, skipped)


def records_of_points(points, backend_of=None) -> list:
    """The run's records (``runtime.records.Record``, as ``mla-var3 calibrate`` writes them) back from
    a calibration file's stored ``points``, to refit them with :func:`calibration_from_records`.
    ``backend_of(point)``: the backend to record (default: the point's own)."""
    from mla_var3.runtime.records import Record

    return [Record(name=p["design"], kind="design", model=p["model"], b=p["b"], s=p["s"], t=p["t"], n=p.get("n"),
                   time_us=p["gpu_us"], method="cuda-graph", gpu=True,
                   backend=backend_of(p) if backend_of else p["backend"],
                   extra={"graph_us": p["gpu_us"], "eager_us": p["eager_us"], "host_us": p["host_us"],
                          "causal": p["causal"], "source": p["source"], **({"h": p["h"]} if p.get("h") else {})})
            for p in points]


def calibration_from_records(records, env: dict, dev, *, gpu: bool, quick: bool = False, shipped=None,
                             hold: tuple[str, ...] = ()):
    """Fit the records of a calibration run into a calibration keyed by device, the backends the
    default calls ran, versions and commit (``env``: :func:`~mla_var3.runtime.environment.environment`).

    ``gpu``: GPU records, a calibration of ``dev`` (``shipped``: the package's calibration of it,
    the starting values and the kernels the records do not cover; ``hold``: full parameter names
    kept at its values, for a run whose grid cannot tell them apart). Else CPU records: a
    calibration of device ``"cpu"`` marked ``gpu: false``, the ceilings of ``dev`` as units.
    """
    from mla_var3.analysis.calibration import Calibration, kernel_hashes
    from mla_var3.analysis.calibration_fit import fit

    versions = {"torch": env["torch"], "triton": env["triton"], "cuda": env["cuda"]}
    commits = {"measurements": [str(env["commit"])[:7]], "dirty": env.get("dirty")}
    backends = default_backends(records)
    timed = sorted({r.name for r in records})
    kernels = {"commit": str(env["commit"])[:7], "dirty": env.get("dirty"), "files": kernel_hashes(timed),
               "note": "sha256 of the kernel files of the designs this run timed, as they were when it ran"}
    if gpu:
        notes = (f"Fitted by `mla-var3 calibrate{' --quick' if quick else ''}` on {env['device']} at "
                 f"{env['timestamp']}: {len(records)} default calls timed (CUDA-graph, eager and host time)"
                 + ("; kernels it did not time keep the shipped calibration's values and sources" if shipped else ""))
        base = dataclasses.replace(shipped, points=(), fit={}) if shipped else None
        args = dict(device=dev, base=base, default_backends={**(shipped.default_backends if shipped else {}),
                                                                 **backends},
                    versions=versions, commits=commits, notes=notes)
        kept = list(hold) if base is not None else []
        if kept:
            notes += f"; held at the shipped values (its grid cannot tell them apart): {', '.join(kept)}"
            args["notes"] = notes
        cal, held = fit(records, hold=kept, **args), []
        # the points do not bound these (the calls never spend that resource): keep the shipped
        # values, or on a first fit the priors, one round per parameter freed
        start = base if base is not None else _priors_of(cal)
        while True:
            pinned = _at_bounds(cal, start)
            if not pinned:
                break
            held += pinned
            what = "the shipped values" if base is not None else "their priors"
            cal = fit(records, hold=kept + held, **{**args, "base": _with_values_of(cal, start, held),
                                                   "notes": notes + f"; held at {what} (the run's fit ran them to a "
                                                                    f"bound): {', '.join(held)}"})
        return dataclasses.replace(cal, kernels=kernels)
    ceil = dev.ceilings("measured", 2)
    base = Calibration("cpu", env["platform"], int(dev.sms or 1),
                       {"kind": ceil.kind, "flops_per_s": ceil.flops_per_s, "bytes_per_s": ceil.bytes_per_s,
                        "source": f"the {dev.key}'s ceilings, as units only: a CPU run has none of its own"},
                       {}, {}, gpu=False)
    notes = ("CPU run under the Triton interpreter (no GPU): tiny shapes of the deepseek-v2-lite preset, "
             "perf_counter times. A test of the calibration plumbing, not a GPU calibration: never ship it.")
    cal = fit(records, base=base, default_backends=backends, versions=versions, commits=commits, notes=notes,
              allow_cpu=True)
    return dataclasses.replace(cal, kernels=kernels)


def _priors_of(cal):
    """``cal`` with every GPU parameter at its law's prior (``kernel_laws.SPECS``), sourced so."""
    from mla_var3.analysis.kernel_laws import SPECS

    specs = {f"{d}.{b}.{sp.name}": sp for (d, b), sps in SPECS.items() for sp in sps}
    return cal.with_parameters({
        name: dataclasses.replace(p, value=specs[name].prior, fitted=False,
                                  source="prior, not fitted: the run's fit ran it to a bound (the calls never spend "
                                         "that resource enough to tell it)")
        for name, p in cal.parameters.items() if name in specs and p.group == "gpu"})


def _with_values_of(cal, start, names: list[str]):
    """``cal`` with the parameters ``names`` taken from ``start`` (value and source), the base of a
    refit that holds them."""
    return dataclasses.replace(cal, points=(), fit={}).with_parameters({n: start.parameters[n] for n in names})


def _at_bounds(cal, base) -> list[str]:
    """The GPU parameters this fit moved to a bound of their range (``kernel_laws.SPECS``) away
    from ``base``'s value."""
    from mla_var3.analysis.kernel_laws import SPECS

    out = []
    for (design, backend), specs in SPECS.items():
        for spec in specs:
            name = f"{design}.{backend}.{spec.name}"
            p, before = cal.parameters.get(name), base.parameters.get(name)
            if (p is not None and before is not None and p.group == "gpu" and p.value != before.value
                    and min(abs(p.value - spec.lo), abs(p.value - spec.hi)) <= 1e-6 * (1 + abs(p.value))):
                out.append(name)
    return sorted(out)


# --------------------------------------------------------------------------------------------
# the command


def run(args) -> int:
    from mla_var3.analysis.calibration import calibration_file_name, save_calibration
    from mla_var3.analysis.calibration_fit import compare, Point
    from mla_var3.analysis.devices import load_devices

    # every input and the output's folder before the timing run (minutes on a GPU), not after it
    try:
        load_devices(args.devices_file)
    except ValueError as exc:
        raise ValueError(f"--devices-file: {exc}" if args.devices_file else str(exc)) from None
    if args.out:
        C.check_output_file("--out", args.out)
    else:
        C.check_output_folder("--out (default ./calibration-<device>.json)", ".")
    result = run_calibration(quick=args.quick, max_seconds=args.max_seconds, devices_file=args.devices_file, log=print)
    cal = result.calibration
    path = save_calibration(cal, args.out or calibration_file_name(cal.device))
    rows = [[r["design"], r["backend"], r["h"], r["b"], r["s"], r["t"], "-" if r["n"] is None else r["n"], r["kind"],
             f"{r['measured_us']:,.1f}", f"{r['predicted_us']:,.1f}", f"{r['ratio']:.2f}"]
            for r in compare(cal, [Point.from_dict(p) for p in cal.points])]
    con = C.console()
    con.print(C.table(f"calibrated ÷ measured on {cal.device_name} ({'GPU' if cal.gpu else 'CPU interpreter: not GPU timings'})",
                      ["design", "backend", "h", "b", "s", "t", "n", "kind", "measured µs", "calibrated µs", "÷"], rows,
                      right_from=2))
    for line in result.skipped:
        print(f"skipped: {line}")
    here = "" if args.out or not cal.gpu else "; the commands run in this folder use it by default"
    print(f"wrote {path} ({cal.label}); use it with --calibration {path} or $MLA_VAR3_CALIBRATION{here}")
    return 0


def add(sub) -> None:
    p = sub.add_parser("calibrate", help="time each design's default call on this GPU and fit the calibrated model",
                       description="Times a short grid of each design's default call (CUDA-graph, eager and host "
                                   "time; DeepSeek-V3 at 128 heads and at 16-64, the heads per GPU of TP 8-2) in "
                                   "under 3 minutes, fits the calibrated model and writes a calibration "
                                   "file. Without a GPU: tiny shapes under the Triton interpreter, a file marked as "
                                   "a CPU calibration (a test of the plumbing).")
    p.add_argument("--out", type=path_arg, metavar="PATH", help="calibration file to write (default "
                                                             "./calibration-<device>.json)")
    p.add_argument("--quick", action="store_true", help="a third of the grid (under a minute)")
    p.add_argument("--max-seconds", type=positive_float, default=150.0,
                   help="time budget of the grid; later points are skipped (default 150)")
    C.add_devices_file_arg(p)
    p.set_defaults(func=run)

"""``mla-var3 calibrate``: time a short grid of each design's default call on this GPU, fit the
calibrated model and write a calibration file keyed by device, backend, versions and commit
(:mod:`mla_var3.runtime.calibrate`). Without a GPU: tiny shapes under the Triton interpreter, a
file marked as a CPU calibration (the plumbing; never a GPU's)."""

from __future__ import annotations

from mla_var3._argtypes import path_arg, positive_float
from mla_var3.cli import _common as C


def run(args) -> int:
    from mla_var3.analysis.calibration import save_calibration
    from mla_var3.analysis.calibration_fit import compare, Point
    from mla_var3.analysis.devices import load_devices
    from mla_var3.runtime.calibrate import run_calibration

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
    path = save_calibration(cal, args.out or f"calibration-{cal.device}.json")
    rows = [[r["design"], r["backend"], r["h"], r["b"], r["s"], r["t"], "-" if r["n"] is None else r["n"], r["kind"],
             f"{r['measured_us']:,.1f}", f"{r['predicted_us']:,.1f}", f"{r['ratio']:.2f}"]
            for r in compare(cal, [Point.from_dict(p) for p in cal.points])]
    con = C.console()
    con.print(C.table(f"calibrated ÷ measured on {cal.device_name} ({'GPU' if cal.gpu else 'CPU interpreter: not GPU timings'})",
                      ["design", "backend", "h", "b", "s", "t", "n", "kind", "measured µs", "calibrated µs", "÷"], rows,
                      right_from=2))
    for line in result.skipped:
        print(f"skipped: {line}")
    print(f"wrote {path} ({cal.label}); use it with --calibration {path} or $MLA_VAR3_CALIBRATION")
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

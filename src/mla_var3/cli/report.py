"""``mla-var3 report``: the regime guide (roofline, calibrated, and measured with ``--results``),
memory table and plots written to a folder, the same tables printed, and every kernel checked
once against the fp32 reference."""

from __future__ import annotations

import argparse

from mla_var3._argtypes import path_arg, positive_int
from mla_var3._io import quote
from mla_var3.analysis.devices import detect_device, get_device
from mla_var3.cli import _common as C, memory, regime
from mla_var3.shapes import Problem


def run(args) -> int:
    from mla_var3.analysis.report import write_report

    dims = C.dims_from_args(args)
    C.per_rank(dims, args.tp)                   # --tp must divide h: the guide is one GPU's call (h/tp heads)
    if args.device:
        dev, note = get_device(args.device, args.devices_file), f"{args.device} (chosen)"
    else:
        dev, note = detect_device(args.devices_file)
    Problem(b=args.b, s=1, t=args.t)
    C.check_results_files("--results", args.results)
    from mla_var3.analysis.regime import DEFAULT_S

    measured = C.measured_by_s(args.results or (), dev.key, dims.per_gpu(args.tp), args.b, args.t,
                               [s for s in DEFAULT_S if s <= args.t], args.dtype)
    paths = write_report(args.out, dims, dev, args.b, args.t, args.ceilings, args.format, args.context, note,
                         calibration=C.calibration_from_args(args, dev), measured=measured, tp=args.tp)
    _print_tables(args, dev)
    status = 0
    if args.kernel_check:
        check_path, status = _kernel_check(args.out)
        paths.append(check_path)
    print(f"device: {note}")
    for p in paths:
        print(p)
    return status


def report_formats_arg(text: str) -> list[str]:
    """A non-empty comma list of report formats (md, json)."""
    from mla_var3.analysis.report import REPORT_FORMATS

    formats = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in REPORT_FORMATS]
    if bad or not formats:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(REPORT_FORMATS)}, got {quote(text)}")
    return formats


def _print_tables(args, dev) -> None:
    """The report's regime guide and memory table on the terminal: the ``regime`` and
    ``memory`` commands run with the report's model, device and sizes (the capacity plan at
    tp = 8, a common serving layout, when 8 divides h, or at --tp; report.md has tp = 1 and 8). A model
    without a published parameter count (dims overridden) has no capacity plan, as in report.md."""
    from mla_var3.analysis.memory import PUBLISHED_WEIGHTS

    dims = C.dims_from_args(args)
    shared = ["--model", args.model, "--dtype", args.dtype, "--device", dev.key]
    for dim in ("h", "d", "p", "k"):
        if getattr(args, dim) is not None:
            shared += [f"--{dim}", str(getattr(args, dim))]
    if args.devices_file:
        shared += ["--devices-file", args.devices_file]
    commands = [["regime", "--b", str(args.b), "--t", str(args.t), "--ceilings", args.ceilings, "--tp", str(args.tp)]
                + (["--calibration", args.calibration] if args.calibration else [])
                + [x for path in args.results or () for x in ("--results", path)]]
    if dims.name in PUBLISHED_WEIGHTS:
        tp = args.tp if args.tp != 1 else 8 if dims.h % 8 == 0 else 1
        commands.append(["memory", "--context", str(args.context), "--n", str(min(1024, args.context)), "--tp", str(tp)])
    else:
        print(f"no capacity plan: no published parameter count for {dims.name}")
    parser = C.Parser(prog=C.PROG)
    sub = parser.add_subparsers()
    regime.add(sub)
    memory.add(sub)
    for command in commands:
        sub_args = parser.parse_args(command + shared)
        sub_args.func(sub_args)


def _kernel_check(out_dir) -> tuple[str, int]:
    """Run every kernel once against the fp32 reference (on the GPU, or small shapes under the
    interpreter); print a table, write kernel_check.json; status 1 if any check fails."""
    import dataclasses
    import json
    import os

    from mla_var3.kernel.selfcheck import run_selfcheck  # imports torch + triton (and picks the interpreter)

    where = "GPU" if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") else "CPU, Triton interpreter"
    print(f"kernel check ({where}): each design against the fp32 reference ...", flush=True)
    results = run_selfcheck()
    rows = [[r.design, r.shape, r.dtype, f"{r.error:.2e}", f"{r.tolerance:.0e}", f"{r.seconds:.1f}",
             "PASS" if r.passed else "FAIL"] for r in results]
    C.console().print(C.table(f"kernel check ({where})",
                              ["design", "shape", "dtype", "rel. error", "tolerance", "s", "result"], rows))
    path = os.path.join(out_dir, "kernel_check.json")
    with open(path, "w") as f:
        json.dump({"where": where, "results": [dataclasses.asdict(r) | {"passed": r.passed} for r in results]}, f,
                  indent=2)
    return path, 0 if all(r.passed for r in results) else 1


def add(sub) -> None:
    p = sub.add_parser("report", help="write the regime guide, memory table and plots to a folder",
                       description="Regime guide + memory table (Markdown/JSON) and PNG plots for the detected GPU "
                                   "(or h200 when there is none).")
    p.add_argument("--out", type=path_arg, default="mla_var3_report", help="output folder (default ./mla_var3_report/)")
    C.add_model_args(p)
    C.add_device_args(p, default=None)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--t", type=positive_int, default=4096, help="context (default 4096)")
    p.add_argument("--context", type=positive_int, default=32768, help="memory table: tokens per sequence (default 32768)")
    p.add_argument("--format", type=report_formats_arg, default="md,json", help="md, json or md,json (default)")
    C.add_tp_arg(p)
    C.add_calibration_arg(p)
    C.add_results_arg(p, "(a column per design, points on the plots)")
    p.add_argument("--kernel-check", action=argparse.BooleanOptionalAction, default=True,
                   help="also run every kernel once against the fp32 reference (default on; exit 1 on a failure)")
    p.set_defaults(func=run)

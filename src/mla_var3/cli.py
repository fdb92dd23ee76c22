"""The ``mla-var3`` command (also ``python -m mla_var3``).

Commands: ``cost``, ``regime``, ``memory``, ``devices``, ``report``. Each prints a table, or
exact numbers as one JSON value with ``--json``. Bad input gives one error line on stderr and
exit status 2. Other modules add commands by appending a function ``add(subparsers)`` to
:data:`_EXTRA_COMMANDS` (or decorating it with :func:`register_command`); the function adds
its subparser and sets ``func=handler`` where ``handler(args) -> int``.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Callable

from mla_var3._argtypes import (  # noqa: F401  (re-exported: the command modules use cli.<type>)
    MAX_BYTES, MAX_INT, MAX_NUMBER, int_list, n_arg, nonneg_float, nonneg_int, nonneg_int_list, path_arg,
    positive_float, positive_int, window_budget_arg,
)
from mla_var3._io import finite_json, quote, show_path

from mla_var3.analysis.devices import DEFAULT_DEVICE, DEVICES_ENV, detect_device, get_device, load_devices
from mla_var3.shapes import DEFAULT_MODEL, DTYPE_BYTES, Problem, get_preset

PROG = "mla-var3"

#: functions ``add(subparsers)`` that register extra commands (bench, explain, kernels, ...).
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def register_command(add: Callable[[argparse._SubParsersAction], None]):
    """Register ``add(subparsers)`` so :func:`build_parser` includes its command."""
    _EXTRA_COMMANDS.append(add)
    return add


class CLIError(Exception):
    """A usage error: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise CLIError(f"{self.prog}: {message}")


# --- the hybrid's window budget ---------------------------------------------------------------


def window_budget_bytes(value, dims, t: int) -> float | None:
    """Resolve a :func:`window_budget_arg` value (None stays None)."""
    if value == "latent":
        from mla_var3.analysis.regime import latent_window_budget

        return latent_window_budget(dims, t)
    return value


def add_budget_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window-budget", type=window_budget_arg, metavar="BYTES|latent",
                   help="cap the hybrid's expanded window per sequence per layer per rank (n·(h/tp)·2d·w): bytes "
                        "(4.5MB, 4.5MiB) or 'latent' = the latent cache's own size t·(k+p)·w")
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel degree: each rank holds h/tp heads of the window (default 1)")


# --- shared options -------------------------------------------------------------------------


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, --dtype and the dim overrides (--h --d --p --k)."""
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model preset (default {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES), help="element type (default bf16)")
    for dim, what in (("h", "heads"), ("d", "no-RoPE head dim"), ("p", "RoPE dim"), ("k", "latent rank")):
        p.add_argument(f"--{dim}", type=positive_int, help=f"override {what}")


def add_devices_file_arg(p: argparse.ArgumentParser) -> None:
    """--devices-file."""
    p.add_argument("--devices-file", type=path_arg, metavar="JSON", help=f"JSON file of extra devices (also ${DEVICES_ENV})")


def add_device_args(p: argparse.ArgumentParser, default: str | None = DEFAULT_DEVICE) -> None:
    """--device, --devices-file, --ceilings."""
    p.add_argument("--device", default=default, help=f"device key (see `{PROG} devices`; default {default or 'detected'})")
    add_devices_file_arg(p)
    p.add_argument("--ceilings", default="measured", choices=("measured", "datasheet"),
                   help="roofline ceilings: measured when the device has them (default), or datasheet")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exact numbers as JSON")


def dims_from_args(args):
    """The MLADims for --model/--dtype and any overrides."""
    dims = get_preset(args.model, args.dtype)
    overrides = {k: getattr(args, k) for k in ("h", "d", "p", "k") if getattr(args, k, None) is not None}
    if overrides:
        if "d" in overrides:
            overrides.setdefault("dv", overrides["d"])
        label = ",".join(f"{k}={v}" for k, v in overrides.items() if k != "dv")
        dims = dims.replace(**overrides, name=f"{dims.name}({label})")
    return dims


def device_from_args(args):
    return get_device(args.device, args.devices_file)


def _console():
    from rich.console import Console

    width = None if sys.stdout.isatty() else 160
    return Console(width=width, highlight=False)


def _table(title: str, columns: list[str], rows: list[list], right_from: int = 1):
    from rich.table import Table

    tbl = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        tbl.add_column(col, justify="right" if i >= right_from else "left")
    for row in rows:
        tbl.add_row(*[str(x) for x in row])
    return tbl


def _print_json(obj) -> None:
    """``obj`` as JSON on stdout. NaN and infinity (which JSON lacks) are written as null."""
    print(json.dumps(finite_json(obj), indent=2, allow_nan=False))


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


# --- cost ------------------------------------------------------------------------------------


def _cmd_cost(args) -> int:
    from mla_var3.analysis.cost import COST_MODELS
    from mla_var3.analysis.roofline import predict

    if args.design not in COST_MODELS:
        raise ValueError(f"unknown design {args.design!r}; known: {', '.join(COST_MODELS)}")
    dims, dev = dims_from_args(args), device_from_args(args)
    if args.n is not None and args.design != "mla_var6_plus":
        raise ValueError(f"--n applies to mla_var6_plus only, not {args.design}")
    if (args.window_budget is not None or args.tp != 1) and args.design != "mla_var6_plus":
        raise ValueError(f"--window-budget and --tp apply to mla_var6_plus only, not {args.design}")
    auto = args.n in (None, "auto")
    problem = Problem(b=args.b, s=args.s, t=args.t, n=None if auto else args.n)
    n_note = ""
    if args.design == "mla_var6_plus":
        from mla_var3.analysis.regime import hybrid_split

        budget = window_budget_bytes(args.window_budget, dims, args.t)
        split = hybrid_split(dims, problem, dev, "auto" if auto else args.n, window_budget_bytes=budget, tp=args.tp,
                             ceilings=args.ceilings)
        problem = problem.with_n(split.n)
        if auto:
            n_note = " (best n" + (", capped by the window budget" if split.limited_by == "memory" else "") + ")"
        if args.tp != 1:
            dims = dims.replace(h=dims.h // args.tp, name=dims.name)
            n_note += f", per rank of tp={args.tp}"
    pred = predict(args.design, dims, problem, dev, args.ceilings, stages=args.stages)
    if args.json:
        from mla_var3.analysis.calibration import load_calibration, predict as predict_calibrated

        # the default call of the kernel alone (no absorption or decompression), eager
        cal = predict_calibrated(load_calibration(args.calibration, device=dev), args.design, dims, problem,
                                 device=dev, ceilings=args.ceilings)
        _print_json({**pred.to_dict(), "model": dims.name, "b": problem.b, "s": problem.s, "t": problem.t,
                     "n": problem.n, "stages": args.stages,
                     "dims": {"h": dims.h, "d": dims.d, "p": dims.p, "k": dims.k, "dv": dims.dv, "w": dims.w},
                     "calibrated_time_s": cal.time_s, "calibrated_source": cal.source})
        return 0
    c, ceil = pred.cost, pred.ceilings
    shape = f"b={problem.b} s={problem.s} t={problem.t}" + (f" n={problem.n}{n_note}" if problem.n is not None else "")
    rows = [
        ["design", args.design + (" + absorb/decompress" if args.stages else "")],
        ["model", f"{dims.name} (h={dims.h} d={dims.d} p={dims.p} k={dims.k} w={dims.w})"],
        ["problem", shape],
        ["device", f"{dev.name} ({ceil.kind} ceilings: {ceil.flops_per_s / 1e12:,.1f} TFLOP/s, {ceil.bytes_per_s / 1e9:,.0f} GB/s)"],
        ["FLOPs", f"{c.flops:,} ({c.flops / 1e9:,.2f} GFLOP)"],
        ["bytes", f"{c.bytes:,} ({c.bytes / 1e6:,.2f} MB)"],
        ["intensity", f"{c.intensity:,.2f} FLOP/byte (ridge {ceil.ridge:,.1f})"],
        ["compute time", _us(pred.compute_s)],
        ["memory time", _us(pred.memory_s)],
        ["predicted time", f"{_us(pred.time_s)} ({pred.bound}-bound)"],
    ]
    _console().print(_table("roofline prediction", ["quantity", "value"], rows, right_from=9))
    return 0


def _add_cost(sub) -> None:
    from mla_var3.analysis.cost import COST_MODELS

    p = sub.add_parser("cost", help="FLOPs, bytes, intensity and predicted time of one design",
                       description="FLOPs, bytes, arithmetic intensity and roofline time of one design.")
    p.add_argument("--design", required=True, choices=list(COST_MODELS), metavar="DESIGN",
                   help=f"one of {', '.join(COST_MODELS)}")
    add_model_args(p)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--s", type=positive_int, default=1, help="query tokens per sequence (default 1)")
    p.add_argument("--t", type=positive_int, default=4096, help="context incl. the s new tokens (default 4096)")
    p.add_argument("--n", type=n_arg, help="mla_var6_plus: newest tokens kept expanded, or 'auto' (default: the "
                                          "model's best n, capped by --window-budget)")
    p.add_argument("--stages", action="store_true", help="add query absorption and output decompression")
    add_budget_args(p)
    add_device_args(p)
    p.add_argument("--calibration", metavar="PATH", help="calibration file for --json's calibrated_time_s (default: "
                                                        "the one shipped for the device, else the roofline)")
    add_json_arg(p)
    p.set_defaults(func=_cmd_cost)


# --- regime -----------------------------------------------------------------------------------


def _cmd_regime(args) -> int:
    from mla_var3.analysis.regime import regime_guide

    dims, dev = dims_from_args(args), device_from_args(args)
    for s in args.s or []:
        Problem(b=args.b, s=s, t=args.t)  # validates s <= t
    if args.sweep and not args.plot_n:
        raise ValueError("--sweep is the measured sweep drawn by --plot-n; give --plot-n PNG too")
    guide = regime_guide(dims, dev, args.b, args.t, args.s, args.ceilings, args.fa_model)
    budget_rows, budget_note = _budget_rows(args, dims, dev)
    if args.plot_n:
        _plot_n(args, dims, dev)
    if args.json:
        out = guide.to_dict()
        if budget_rows:
            out["window_budget"] = [{"s": s, **r.to_dict()} for s, rows_s in budget_rows for r in rows_s]
        _print_json(out)
        return 0
    c = guide.ceilings
    rows = []
    for r in guide.rows:
        p = r.predictions
        rows.append([r.s, f"{_us(p['flash_attention'].time_s)} {p['flash_attention'].bound[:3]}",
                     f"{_us(p['flash_mla'].time_s)} {p['flash_mla'].bound[:3]}",
                     f"{_us(r.hybrid.time_s)} {r.hybrid.bound[:3]}", r.hybrid.n, r.best])
    title = (f"{dims.name} on {dev.name}, b={args.b} t={args.t}, {c.kind} ceilings "
             f"({c.flops_per_s / 1e12:,.1f} TFLOP/s, {c.bytes_per_s / 1e9:,.0f} GB/s, ridge {c.ridge:.1f})")
    con = _console()
    con.print(_table(title, ["s", "FlashAttention", "FlashMLA", "MLAvar6+ (best n)", "best n", "best"], rows, right_from=0))
    cross = guide.crossover_s
    con.print(f"crossover: FlashAttention overtakes FlashMLA at s = {cross}" if cross
              else "crossover: FlashAttention never overtakes FlashMLA for s <= t")
    con.print(_table("regimes", ["regime", "s", "best", "why"], [[e.regime, e.s_range, e.best, e.why] for e in guide.regimes],
                     right_from=99))
    if budget_rows:
        con.print(_table(f"hybrid n under a window budget ({budget_note}; times per rank of h/tp heads)",
                         ["s", "tp", "window budget", "n", "window / seq / layer", "MLAvar6+", "n = 0", "speed-up",
                          "limited by"],
                         [[s, r.tp, "-" if r.window_budget_bytes is None else _mb(r.window_budget_bytes), r.split.n,
                           _mb(r.window_bytes), _us(r.split.time_s), _us(r.latent_time_s), f"{r.speedup:.3f}x",
                           "budget" if r.split.limited_by == "memory" else "time"]
                          for s, rows_s in budget_rows for r in rows_s], right_from=0))
    return 0


def _plot_n(args, dims, dev) -> None:
    """--plot-n: time vs n at the first --s (default 16), the model's optimum marked, the
    measured sweep of --sweep (a hybrid_check.py JSON) when given."""
    from pathlib import Path

    from mla_var3.analysis.plots import load_n_sweep, plot_time_vs_n

    s = (args.s or [16])[0]
    out = Path(args.plot_n)
    if out.is_dir() or not out.suffix:
        raise ValueError(f"--plot-n {show_path(out)}: expected an image file name such as time_vs_n.png")
    measured = None
    if args.sweep:
        try:
            measured = load_n_sweep(args.sweep, args.b, s)
        except ValueError as exc:
            raise ValueError(f"--sweep: {exc}") from None
        if not measured:
            raise ValueError(f"--sweep {show_path(args.sweep)} has no n sweep (one label measured at two or more n) "
                             f"at b={args.b}, s={s}; pick them with --b and --s")
    budget = window_budget_bytes(args.window_budget, dims, args.t)
    path = plot_time_vs_n(dims, dev, args.b, s, args.t, out, args.ceilings, measured, budget, args.tp)
    print(f"wrote {path}" + (f" (measured: {', '.join(measured)})" if measured else " (model only)"), file=sys.stderr)


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.2f} MB"


def _budget_rows(args, dims, dev):
    """(s, [BudgetedSplit]) per s of the guide when --window-budget or --tp is given."""
    from mla_var3.analysis.regime import budget_table

    if args.window_budget is None and args.tp == 1:
        return [], ""
    budget = window_budget_bytes(args.window_budget or "latent", dims, args.t)
    note = ("window <= the latent cache's own size" if args.window_budget in (None, "latent") else "window")
    note += f" = {budget / 1e6:,.2f} MB per sequence per layer"
    tps = sorted({1, args.tp})
    s_values = args.s or [r for r in (1, 2, 4, 8, 16, 32, 64) if r <= args.t]
    return [(s, budget_table(dims, Problem(b=args.b, s=s, t=args.t), dev, budget, tps, args.ceilings))
            for s in s_values], note


def _add_regime(sub) -> None:
    p = sub.add_parser("regime", help="best design per query length s, crossover, best hybrid n",
                       description="The regime guide: predicted time of each design per s.")
    add_model_args(p)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--t", type=positive_int, default=4096, help="context (default 4096)")
    p.add_argument("--s", type=int_list, help="comma-separated query lengths (default 1,2,4,...,t)")
    p.add_argument("--fa-model", default="flash_attention", choices=("flash_attention", "flash_attention_shared_kpe"),
                   help="FlashAttention byte count: seed (RoPE key per head) or shared RoPE key")
    add_budget_args(p)
    p.add_argument("--plot-n", type=path_arg, metavar="PNG", help="also plot the hybrid's time vs n at the first --s (default 16), "
                                                  "the predicted optimum marked")
    p.add_argument("--sweep", type=path_arg, metavar="JSON", help="--plot-n: measured n sweep (a benchmarks/hybrid_check.py result)")
    add_device_args(p)
    add_json_arg(p)
    p.set_defaults(func=_cmd_regime)


# --- memory -----------------------------------------------------------------------------------


def _cmd_memory(args) -> int:
    from mla_var3.analysis.memory import cache_layouts, mla_bytes_per_token, plan_capacity

    dims, dev = dims_from_args(args), device_from_args(args)
    if args.n > args.context:
        raise ValueError(f"--n {args.n} exceeds --context {args.context}")
    layouts = cache_layouts(dims, context=args.context, n=args.n)
    mem_bytes = args.memory_gb * 1e9 if args.memory_gb else dev.memory_bytes
    reserve = args.reserve_gb * 1e9 if args.reserve_gb is not None else None
    plans = [plan_capacity(dims, mem_bytes, args.tp, args.params, args.weight_dtype, reserve, context=args.context,
                           layout=layout) for layout in ("mla", "expanded")]
    if args.json:
        _print_json({
            "model": dims.name, "device": dev.key, "context": args.context, "layers": dims.layers,
            "layouts": [{"layout": x.layout, "bytes_per_token_layer": x.bytes_per_token_layer, "formula": x.formula,
                         "bytes_per_token": x.bytes_per_token_layer * dims.layers,
                         "bytes_per_sequence": x.total(dims.layers, 1, args.context)} for x in layouts],
            "plans": [pl.to_dict() for pl in plans],
        })
        return 0
    mla = mla_bytes_per_token(dims)
    rows = [[x.layout, x.formula, f"{x.bytes_per_token_layer:,.0f}", f"{x.bytes_per_token_layer * dims.layers / 1e3:,.1f}",
             f"{x.total(dims.layers, 1, args.context) / 1e9:,.2f}", f"{x.bytes_per_token_layer / mla:,.1f}x"] for x in layouts]
    con = _console()
    con.print(_table(f"KV cache of {dims.name} (w={dims.w} B, {dims.layers} layers, context {args.context:,})",
                     ["layout", "formula", "B / token / layer", "KB / token", "GB / sequence", "vs MLA"], rows, right_from=2))
    prow = [[pl.layout, f"{pl.weights_bytes / 1e9:,.1f}", f"{pl.reserve_bytes / 1e9:,.1f}",
             f"{pl.cache_budget_bytes / 1e9:,.1f}", f"{pl.cache_bytes_per_token / 1e3:,.1f}", f"{pl.tokens:,}",
             f"{pl.sequences:,}"] for pl in plans]
    pl = plans[0]
    con.print(_table(
        f"capacity per GPU: {dev.name} {mem_bytes / 1e9:,.0f} GB, tp={args.tp}, {pl.params / 1e9:,.1f}B params x "
        f"{pl.weight_bytes_per_param:g} B",
        ["cache", "weights GB", "reserve GB", "cache GB", "KB / token", "tokens", f"seqs of {args.context:,}"], prow))
    if not pl.fits:
        con.print("weights and reserve exceed the device memory: raise --tp or use fewer bytes per weight")
    return 0


def _add_memory(sub) -> None:
    p = sub.add_parser("memory", help="KV cache per token (MHA/GQA/MLA/hybrid) and the capacity plan",
                       description="KV-cache accounting and how much cache fits next to the weights.")
    add_model_args(p)
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"device key (default {DEFAULT_DEVICE})")
    add_devices_file_arg(p)
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--context", type=positive_int, default=32768, help="tokens per sequence (default 32768)")
    p.add_argument("--n", type=nonneg_int, default=1024, help="hybrid: newest tokens kept expanded (default 1024)")
    p.add_argument("--params", type=positive_float, help="total parameter count (default: the preset's published count)")
    p.add_argument("--weight-dtype", choices=sorted(DTYPE_BYTES), help="weight element type (default: the checkpoint's)")
    p.add_argument("--reserve-gb", type=nonneg_float, help="activation/workspace reserve in GB (default 10%% of memory)")
    p.add_argument("--memory-gb", type=positive_float, help="device memory in GB (default: the device's)")
    add_json_arg(p)
    p.set_defaults(func=_cmd_memory)


# --- devices ----------------------------------------------------------------------------------


def _cmd_devices(args) -> int:
    devices = load_devices(args.devices_file)
    if args.json:
        out = []
        for dev in devices.values():
            ds = dev.ceilings("datasheet")
            ms = dev.ceilings("measured")
            out.append({
                "key": dev.key, "name": dev.name, "bf16_tflops": dev.bf16_tflops, "fp8_tflops": dev.fp8_tflops,
                "bandwidth_gbs": dev.bandwidth_gbs, "memory_gb": dev.memory_gb, "sms": dev.sms, "l2_mb": dev.l2_mb,
                "smem_per_sm_kb": dev.smem_per_sm_kb, "ridge_datasheet": ds.ridge,
                "ridge_measured": ms.ridge if ms.kind == "measured" else None,
                "measured": dev.measured, "sources": dev.sources,
            })
        _print_json(out)
        return 0
    rows = []
    for dev in devices.values():
        ms = dev.ceilings("measured")
        measured = (f"{ms.flops_per_s / 1e12:,.0f} / {ms.bytes_per_s / 1e9:,.0f} / {ms.ridge:.1f}"
                    if ms.kind == "measured" else "-")
        rows.append([dev.key, dev.name, f"{dev.bf16_tflops:,.1f}", f"{dev.fp8_tflops:,.1f}" if dev.fp8_tflops else "-",
                     f"{dev.bandwidth_gbs:,.0f}", f"{dev.memory_gb:g}", dev.sms or "-", f"{dev.l2_mb:g}" if dev.l2_mb else "-",
                     f"{dev.smem_per_sm_kb:g}" if dev.smem_per_sm_kb else "-", f"{dev.ridge('datasheet'):.1f}", measured])
    _console().print(_table(
        "devices (dense tensor-core peaks; ridge = peak FLOP/s / bandwidth, FLOP/byte)",
        ["key", "name", "bf16 TFLOP/s", "fp8 TFLOP/s", "GB/s", "memory GB", "SMs", "L2 MB", "smem/SM KB", "ridge",
         "measured TFLOP/s / GB/s / ridge"], rows, right_from=2))
    return 0


def _add_devices(sub) -> None:
    p = sub.add_parser("devices", help="the devices table with ridge points", description="Known devices and their ceilings.")
    add_devices_file_arg(p)
    add_json_arg(p)
    p.set_defaults(func=_cmd_devices)


# --- report -----------------------------------------------------------------------------------


def _cmd_report(args) -> int:
    from mla_var3.analysis.report import write_report

    dims = dims_from_args(args)
    if args.device:
        dev, note = get_device(args.device, args.devices_file), f"{args.device} (chosen)"
    else:
        dev, note = detect_device(args.devices_file)
    Problem(b=args.b, s=1, t=args.t)
    paths = write_report(args.out, dims, dev, args.b, args.t, args.ceilings, args.format, args.context, note)
    _print_report_tables(args, dev)
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


def _print_report_tables(args, dev) -> None:
    """The report's regime guide and memory table on the terminal: the ``regime`` and
    ``memory`` commands run with the report's model, device and sizes (the capacity plan at
    tp = 8, a common serving layout, when 8 divides h; report.md has tp = 1 and 8). A model
    without a published parameter count (dims overridden) has no capacity plan, as in report.md."""
    from mla_var3.analysis.memory import PUBLISHED_WEIGHTS

    dims = dims_from_args(args)
    shared = ["--model", args.model, "--dtype", args.dtype, "--device", dev.key]
    for dim in ("h", "d", "p", "k"):
        if getattr(args, dim) is not None:
            shared += [f"--{dim}", str(getattr(args, dim))]
    if args.devices_file:
        shared += ["--devices-file", args.devices_file]
    commands = [["regime", "--b", str(args.b), "--t", str(args.t), "--ceilings", args.ceilings]]
    if dims.name in PUBLISHED_WEIGHTS:
        commands.append(["memory", "--context", str(args.context), "--n", str(min(1024, args.context)),
                         "--tp", "8" if dims.h % 8 == 0 else "1"])
    else:
        print(f"no capacity plan: no published parameter count for {dims.name}")
    parser = build_parser()
    for command in commands:
        sub = parser.parse_args(command + shared)
        sub.func(sub)


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
    _console().print(_table(f"kernel check ({where})",
                            ["design", "shape", "dtype", "rel. error", "tolerance", "s", "result"], rows))
    path = os.path.join(out_dir, "kernel_check.json")
    with open(path, "w") as f:
        json.dump({"where": where, "results": [dataclasses.asdict(r) | {"passed": r.passed} for r in results]}, f,
                  indent=2)
    return path, 0 if all(r.passed for r in results) else 1


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="write the regime guide, memory table and plots to a folder",
                       description="Regime guide + memory table (Markdown/JSON) and PNG plots for the detected GPU "
                                   "(or h200 when there is none).")
    p.add_argument("--out", type=path_arg, default="mla_var3_report", help="output folder (default ./mla_var3_report/)")
    add_model_args(p)
    add_device_args(p, default=None)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--t", type=positive_int, default=4096, help="context (default 4096)")
    p.add_argument("--context", type=positive_int, default=32768, help="memory table: tokens per sequence (default 32768)")
    p.add_argument("--format", type=report_formats_arg, default="md,json", help="md, json or md,json (default)")
    p.add_argument("--kernel-check", action=argparse.BooleanOptionalAction, default=True,
                   help="also run every kernel once against the fp32 reference (default on; exit 1 on a failure)")
    p.set_defaults(func=_cmd_report)


# --- entry point ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The full parser: the built-in commands plus every function in :data:`_EXTRA_COMMANDS`."""
    import mla_var3.runtime.commands  # noqa: F401  (registers bench, autotune, devices --measure; no torch)
    import mla_var3.dispatch.explain  # noqa: F401  (registers explain; no torch)

    parser = _Parser(prog=PROG, description="MLA analysis: cost models, roofline, regime guide, KV-cache memory.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_cost, _add_regime, _add_memory, _add_devices, _add_report, *_EXTRA_COMMANDS):
        add(sub)
    return parser


def _one_line(message: str) -> str:
    """A message of several lines (a list of problems) as one line."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _error(message: str) -> int:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)
    return 2


def _warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input). Warnings are one line each."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as e:
        return _error(str(e).removeprefix(f"{PROG}: ").removeprefix(f"{PROG} "))
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    shown = warnings.showwarning
    warnings.showwarning = _warning
    try:
        return int(args.func(args) or 0)
    except (ValueError, CLIError, argparse.ArgumentTypeError) as e:   # DeviceFileError is a ValueError
        return _error(str(e))
    except OSError as e:
        return _error(f"{e.strerror or e}: {e.filename}" if getattr(e, "filename", None) else str(e))
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    raise SystemExit(main())

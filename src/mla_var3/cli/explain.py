"""``mla-var3 explain``: the dispatcher's choice for one call, every design's predicted (and, when
cached, measured) time, and why. No torch is imported unless measured times are looked up (the
autotune cache reader lives in the runtime package).

Example::

    mla-var3 explain --model deepseek-v3 --b 32 --s 16 --t 4096 --device h200
"""

from __future__ import annotations

from mla_var3._argtypes import nonneg_int, path_arg, positive_int, window_budget_arg
from mla_var3.cli import _common as C
from mla_var3.dispatch.decide import ALIASES, CACHE_KINDS, DESIGNS, KERNEL, CacheInfo, Dispatcher, regime_of
from mla_var3.shapes import Problem


def _check_results_files(flag: str, paths) -> None:
    """Read each benchmark results file once up front: a bad one is one error naming the flag,
    the file and what is wrong with it."""
    from mla_var3.runtime.records import load_results

    for path in paths:
        try:
            load_results(path)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None


def _grid(args, dims, dev) -> int:
    """``--grid RESULTS``: the model's choice vs the measured-fastest design at every point."""
    from mla_var3.dispatch.decide import grid_check

    _check_results_files("--grid", args.grid)
    rows = grid_check(args.grid, dims, dev, dtype=args.dtype)
    if args.json:
        C.print_json(rows)
        return 0
    table = []
    for r in rows:
        miss = "-" if r["miss_pct"] is None else ("agrees" if r["miss_pct"] == 0 else f"miss, +{r['miss_pct']:.1f} %")
        fmt = lambda d, n: "-" if d is None else d + ("" if n is None else f" n={n}")  # noqa: E731
        table.append([r["b"], r["s"], r["t"], fmt(r["model"], r["model_n"]),
                      fmt(r["measured_best"], r["measured_best_n"]), miss])
    misses = [r for r in rows if r["miss_pct"]]
    con = C.console()
    con.print(C.table(f"dispatcher (model) vs measured-fastest on {dev.name}",
                         ["b", "s", "t", "model's choice", "measured fastest", "cost of the choice"], table,
                         right_from=0))
    con.print(f"{len(rows) - len(misses)} of {len(rows)} points agree" + (
        f"; worst miss +{max(r['miss_pct'] for r in misses):.1f} %" if misses else ""))
    return 0


def run(args) -> int:
    dims = C.dims_from_args(args)
    dev = C.device_from_args(args)
    if args.grid:
        return _grid(args, dims, dev)
    problem = Problem(b=args.b, s=args.s, t=args.t)
    window = 0
    if args.cache == "hybrid":
        window = args.t if args.window is None else args.window
    elif args.window is not None:
        raise ValueError(f"--window applies to --cache hybrid only, not {args.cache}")
    elif args.no_latent_window:
        raise ValueError(f"--no-latent-window applies to --cache hybrid only, not {args.cache}")
    info = CacheInfo(args.cache, window, not args.no_latent_window)
    _check_results_files("--results", args.results or [])
    if args.autotune_cache is not None:           # a named cache must exist; a corrupt one only warns
        from mla_var3._io import check_file

        try:
            check_file(args.autotune_cache, "autotune cache")
        except ValueError as exc:
            raise ValueError(f"--autotune-cache: {exc}") from None
    dispatcher = Dispatcher(dev, ceilings=args.ceilings, use_measured=not args.no_measured,
                            results=tuple(args.results or ()), autotune_path=args.autotune_cache, dtype=args.dtype,
                            window_budget_bytes=C.window_budget_bytes(args.window_budget, dims, args.t))
    dec = dispatcher.decide(dims, problem, info, args.design, args.n)
    ceil = dispatcher.ceilings_for(dims)
    if args.json:
        C.print_json({
            "model": dims.name, "device": dev.key, "dtype": args.dtype, "b": problem.b, "s": problem.s,
            "t": problem.t, "regime": regime_of(problem.s),
            "cache": {"kind": info.kind, "window": info.window, "latent_window": info.latent_window},
            "ceilings": {"kind": ceil.kind, "peak_flops_per_s": ceil.flops_per_s,
                         "bandwidth_bytes_per_s": ceil.bytes_per_s, "ridge": ceil.ridge},
            **dec.to_dict(),
        })
        return 0
    rows = []
    for e in dec.estimates:
        mark = "→ " if e.design == dec.design else "  "
        note = e.why_not or ("chosen" if e.design == dec.design else "")
        measured = "-"
        if e.measured_s is not None:
            measured = C.us(e.measured_s) + (f" (n={e.measured_n})" if e.measured_n is not None else "")
        if e.possible:
            rows.append([mark + e.design, KERNEL[e.design], "-" if e.n is None else e.n, C.us(e.predicted_s),
                         e.bound, f"{e.flops / e.bytes:,.1f}", measured, note])
        else:
            rows.append([mark + e.design, KERNEL[e.design], "-", "-", "-", "-", "-", "impossible: " + note])
    cache_txt = info.kind + (f", window n <= {info.window}" + ("" if info.latent_window else " (no latent copies)")
                             if info.kind == "hybrid" else "")
    title = (f"{dims.name}, b={problem.b} s={problem.s} t={problem.t} ({regime_of(problem.s)}), {args.dtype}, "
             f"{cache_txt} cache, on {dev.name}: {ceil.kind} ceilings {ceil.flops_per_s / 1e12:,.0f} TFLOP/s, "
             f"{ceil.bytes_per_s / 1e9:,.0f} GB/s, ridge {ceil.ridge:,.1f} FLOP/byte")
    con = C.console()
    con.print(C.table(title, ["design", "kernel", "n", "predicted", "bound", "FLOP/byte", "measured", "note"],
                         rows, right_from=2))
    choice = dec.design + (f" (n={dec.n})" if dec.n is not None else "")
    con.print(f"choice: {choice}, decided by the {dec.source}" + (" (forced)" if dec.forced else ""))
    con.print(f"why: {dec.reason}")
    con.print("predicted = roofline time of the whole call (query absorption / decompression, or the K/V "
              "expansion of the cached latent, included); measured = kernel time from the benchmark or "
              "autotune cache plus the modelled stages.")
    return 0


def add(sub) -> None:
    p = sub.add_parser("explain", help="which design the dispatcher runs for one call, and why",
                       description="The dispatcher's choice for one attention call: every design's predicted "
                                   "(and measured, when cached) time, the bound and the crossover.")
    C.add_model_args(p)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--s", type=positive_int, default=1, help="query tokens per sequence (default 1)")
    p.add_argument("--t", type=positive_int, default=4096, help="context incl. the s new tokens (default 4096)")
    p.add_argument("--cache", choices=CACHE_KINDS, default="hybrid",
                   help="cache layout: latent, paged (latent) or hybrid (default; a window of expanded tokens)")
    p.add_argument("--window", type=nonneg_int, help="hybrid cache: its window n (default t: any split)")
    p.add_argument("--no-latent-window", action="store_true",
                   help="hybrid cache without latent copies of its window (n fixed, no absorbed design)")
    p.add_argument("--design", default="auto", choices=("auto", *DESIGNS, *ALIASES), metavar="DESIGN",
                   help=f"force a design: {', '.join(DESIGNS)} (default auto)")
    p.add_argument("--n", type=nonneg_int, help="force the hybrid split n (with --design hybrid)")
    p.add_argument("--window-budget", type=window_budget_arg, metavar="BYTES|latent",
                   help="cap the hybrid's window per sequence per layer (n·h·2d·w): bytes or 'latent' = t·(k+p)·w")
    C.add_device_args(p)
    p.add_argument("--results", action="append", type=path_arg, metavar="PATH",
                   help="benchmark results.json with measured times (repeatable)")
    p.add_argument("--autotune-cache", type=path_arg, metavar="PATH", help="autotune cache file (default: the user cache)")
    p.add_argument("--no-measured", action="store_true", help="ignore measured times: the model alone")
    p.add_argument("--grid", action="append", type=path_arg, metavar="RESULTS",
                   help="instead: the model's choice vs the measured-fastest design at every point of a "
                        "benchmark results.json (repeatable)")
    C.add_json_arg(p)
    p.set_defaults(func=run)

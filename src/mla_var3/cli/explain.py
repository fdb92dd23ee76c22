"""``mla-var3 explain``: the dispatcher's choice for one call, every design's predicted (calibrated
where a calibration applies, and the roofline beside it; measured when cached) time, why, and what
each losing design would need to win. No torch is imported unless measured times are looked up
(the autotune cache reader lives in the runtime package).

Example::

    mla-var3 explain --model deepseek-v3 --b 32 --s 16 --t 4096 --device h200
"""

from __future__ import annotations

from mla_var3._argtypes import nonneg_int, path_arg, positive_int, window_budget_arg
from mla_var3.cli import _common as C
from mla_var3.designs import DESIGNS
from mla_var3.dispatch.decide import ALIASES, CACHE_KINDS, KERNEL, CacheInfo, Dispatcher, regime_of
from mla_var3.shapes import Problem


def what_it_takes(dec, dispatcher: Dispatcher, dims, problem: Problem, info: CacheInfo) -> dict[str, str]:
    """Per losing design (possible, calibrated): what its kernel would need to win this call.
    Its kernel must reach the winner's time (measured when the measurement decided) less its
    own stages' time; the hybrid must beat a single design by the margin, and a single design
    the hybrid within it."""
    from mla_var3.analysis.what_it_takes import requirement

    if dec.prediction != "calibrated":
        return {}
    ests = {e.design: e for e in dec.estimates}
    win = ests[dec.design]
    ref = win.measured_s if dec.source == "measured" and win.measured_s is not None else win.predicted_s
    margin = 1 + dispatcher.hybrid_margin
    rng = None
    if info.kind == "hybrid" and info.window:
        top = min(info.window, problem.t)
        rng = (0 if info.latent_window else top, top)
    out = {}
    for e in dec.estimates:
        if e.design == dec.design or not e.possible or e.kernel_s is None:
            continue
        target = ref / margin if e.design == "hybrid" else ref * margin if dec.design == "hybrid" else ref
        text = requirement(dispatcher.resolve_calibration(), KERNEL[e.design], dims, problem,
                           target - (e.predicted_s - e.kernel_s), n_range=rng, device=dispatcher.resolve_device(),
                           ceilings=dispatcher.ceilings)
        if text:
            out[e.design] = text
    return out


def _grid(args, dims, dev) -> int:
    """``--grid RESULTS``: the model's choice vs the measured-fastest design at every point."""
    from mla_var3.dispatch.decide import grid_check

    C.check_results_files("--grid", args.grid)
    rows = grid_check(args.grid, dims, dev, dtype=args.dtype, calibration=C.calibration_from_args(args, dev))
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
    dims = C.rank_dims_from_args(args)          # one GPU's call: h/tp heads, the whole latent cache
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
    C.check_results_files("--results", args.results)
    if args.autotune_cache is not None:           # a named cache must exist; a corrupt one only warns
        from mla_var3._io import check_file

        try:
            check_file(args.autotune_cache, "autotune cache")
        except ValueError as exc:
            raise ValueError(f"--autotune-cache: {exc}") from None
    dispatcher = Dispatcher(dev, ceilings=args.ceilings, use_measured=not args.no_measured,
                            results=tuple(args.results or ()), autotune_path=args.autotune_cache, dtype=args.dtype,
                            window_budget_bytes=C.window_budget_bytes(args.window_budget, dims, args.t),
                            calibration=C.calibration_from_args(args, dev))
    dec = dispatcher.decide(dims, problem, info, args.design, args.n)
    ceil = dispatcher.ceilings_for(dims)
    takes = what_it_takes(dec, dispatcher, dims, problem, info)
    if args.json:
        C.print_json({
            "model": dims.name, "tp": args.tp, "heads": dims.h, "device": dev.key, "dtype": args.dtype,
            "b": problem.b, "s": problem.s,
            "t": problem.t, "regime": regime_of(problem.s),
            "cache": {"kind": info.kind, "window": info.window, "latent_window": info.latent_window},
            "ceilings": {"kind": ceil.kind, "peak_flops_per_s": ceil.flops_per_s,
                         "bandwidth_bytes_per_s": ceil.bytes_per_s, "ridge": ceil.ridge},
            **dec.to_dict(),
            "what_it_takes": takes,
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
            kernel = "-" if e.kernel_s is None else (f"{C.us(e.kernel_s)} (GPU {C.us(e.kernel_gpu_s)}, "
                                                     f"host {C.us(e.kernel_host_s)})")
            rows.append([mark + e.design, KERNEL[e.design], "-" if e.n is None else e.n, C.us(e.predicted_s),
                         kernel, C.us(e.roofline_s), e.bound, f"{e.flops / e.bytes:,.1f}", measured, note])
        else:
            rows.append([mark + e.design, KERNEL[e.design], "-", "-", "-", "-", "-", "-", "-", "impossible: " + note])
    cache_txt = info.kind + (f", window n <= {info.window}" + ("" if info.latent_window else " (no latent copies)")
                             if info.kind == "hybrid" else "")
    title = (f"{dims.name}" + (f" (one GPU of tp={args.tp}: {dims.h} heads, the whole latent cache)" if args.tp != 1
                               else "") + f", b={problem.b} s={problem.s} t={problem.t} ({regime_of(problem.s)}), {args.dtype}, "
             f"{cache_txt} cache, on {dev.name}: {ceil.kind} ceilings {ceil.flops_per_s / 1e12:,.0f} TFLOP/s, "
             f"{ceil.bytes_per_s / 1e9:,.0f} GB/s, ridge {ceil.ridge:,.1f} FLOP/byte")
    con = C.console()
    con.print(C.table(title, ["design", "kernel", "n", f"predicted ({dec.prediction})", "calibrated kernel",
                              "roofline", "bound", "FLOP/byte", "measured", "note"], rows, right_from=2))
    choice = dec.design + (f" (n={dec.n})" if dec.n is not None else "")
    con.print(f"choice: {choice}, decided by the {dec.source} ({dec.prediction})" + (" (forced)" if dec.forced else ""))
    con.print(f"why: {dec.reason}")
    for design, text in takes.items():
        con.print(f"to win: {text}")
    con.print(("predicted = the calibrated eager time of the design's kernel (its default call; "
               f"{dec.calibration}) plus the roofline time of the stages around it" if dec.prediction == "calibrated"
               else f"predicted = the ideal roofline time of the whole call ({dec.calibration})")
              + " (query absorption / decompression, or the K/V expansion of the cached latent); roofline = the "
                "ideal time of the whole call; measured = kernel time from the benchmark or autotune cache plus "
                "the modelled stages.")
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
    names = tuple(d.name for d in DESIGNS)
    p.add_argument("--design", default="auto", choices=("auto", *names, *ALIASES), metavar="DESIGN",
                   help=f"force a design: {', '.join(names)} (default auto)")
    p.add_argument("--n", type=nonneg_int, help="force the hybrid split n (with --design hybrid)")
    p.add_argument("--window-budget", type=window_budget_arg, metavar="BYTES|latent",
                   help="cap the hybrid's window per sequence per layer per GPU (n·(h/tp)·2d·w): bytes or 'latent' "
                        "= t·(k+p)·w")
    C.add_tp_arg(p)
    C.add_device_args(p)
    C.add_calibration_arg(p)
    C.add_results_arg(p, "(they override the model)")
    p.add_argument("--autotune-cache", type=path_arg, metavar="PATH", help="autotune cache file (default: the user cache)")
    p.add_argument("--no-measured", action="store_true", help="ignore measured times: the model alone")
    p.add_argument("--grid", action="append", type=path_arg, metavar="RESULTS",
                   help="instead: the model's choice vs the measured-fastest design at every point of a "
                        "benchmark results.json (repeatable)")
    C.add_json_arg(p)
    p.set_defaults(func=run)

"""``mla-var3 regime``: the regime guide, the predicted time of each design per s: the ideal
roofline, the calibrated model (the roofline where no calibration applies, and it says so) and
the measured times of a results file when one is given."""

from __future__ import annotations

import sys

from mla_var3._argtypes import int_list, path_arg, positive_int
from mla_var3._io import show_path
from mla_var3.cli import _common as C
from mla_var3.shapes import Problem


def run(args) -> int:
    from mla_var3.analysis.regime import regime_guide
    from mla_var3.designs import DESIGNS

    full, dev = C.dims_from_args(args), C.device_from_args(args)
    dims = C.per_rank(full, args.tp)          # the guide is one GPU's call: h/tp heads, the whole latent
    for s in args.s or []:
        Problem(b=args.b, s=s, t=args.t)  # validates s <= t
    if args.sweep and not args.plot_n:
        raise ValueError("--sweep is the measured sweep drawn by --plot-n; give --plot-n PNG too")
    C.check_results_files("--results", args.results)
    cal = C.calibration_from_args(args, dev)
    guide = regime_guide(dims, dev, args.b, args.t, args.s, args.ceilings, args.fa_model, calibration=cal)
    measured = C.measured_by_s(args.results or (), dev.key, dims, args.b, args.t, [r.s for r in guide.rows],
                               args.dtype)
    budget_rows, budget_note = _budget_rows(args, full, dev)
    if args.plot_n:
        _plot_n(args, dims, dev, cal)
    if args.json:
        out = guide.to_dict()
        out["tp"] = args.tp
        if budget_rows:
            out["window_budget"] = [{"s": s, **r.to_dict()} for s, rows_s in budget_rows for r in rows_s]
        if args.results:
            out["measured"] = [{"s": s, "times_s": {k: v[0] for k, v in m.items()},
                                "n": {k: v[1] for k, v in m.items() if v[1] is not None}} for s, m in measured.items()]
        C.print_json(out)
        return 0
    c, calibrated = guide.ceilings, guide.prediction == "calibrated"
    columns, rows = ["s"], []
    for d in DESIGNS:
        columns += [f"{d.title} roofline"] + ([f"{d.title} calibrated"] if calibrated else []) + \
            ([f"{d.title} measured"] if args.results else [])
    columns += (["best (calibrated)"] if calibrated else []) + ["best (roofline)"]
    for r in guide.rows:
        row = [r.s]
        for d in DESIGNS:
            roof = r.hybrid if d.split else r.predictions[d.kernel]
            row.append(f"{C.us(roof.time_s)} {roof.bound[:3]}" + (f" n={r.hybrid.n}" if d.split else ""))
            if calibrated:
                row.append(C.us(r.calibrated[d.kernel].time_s) + (f" n={r.calibrated_n}" if d.split else ""))
            if args.results:
                m = measured.get(r.s, {}).get(d.kernel)
                row.append("-" if m is None else C.us(m[0]) + (f" n={m[1]}" if m[1] is not None else ""))
        rows.append(row + ([r.calibrated_best] if calibrated else []) + [r.best])
    title = (f"{dims.name}" + (f" (one GPU of tp={args.tp}: {dims.h} heads, the whole latent cache)" if args.tp != 1
                               else "") + f" on {dev.name}, b={args.b} t={args.t}, {c.kind} ceilings "
             f"({c.flops_per_s / 1e12:,.1f} TFLOP/s, {c.bytes_per_s / 1e9:,.0f} GB/s, ridge {c.ridge:.1f})")
    con = C.console()
    con.print(C.table(title, columns, rows, right_from=0))
    con.print(f"calibrated: the default call of each design's kernel alone, eager ({guide.calibration})" if calibrated
              else f"no calibrated prediction: {guide.calibration}")
    cross = guide.crossover_s
    con.print(f"crossover: FlashAttention overtakes FlashMLA at s = {cross} (roofline)" if cross
              else "crossover: FlashAttention never overtakes FlashMLA for s <= t (roofline)")
    if calibrated:
        cx = guide.calibrated_crossover_s
        con.print(f"crossover: FlashAttention overtakes FlashMLA at s = {cx} (calibrated)" if cx
                  else "crossover: FlashAttention never overtakes FlashMLA for s <= t (calibrated)")
    regimes = guide.calibrated_regimes if calibrated else guide.regimes
    con.print(C.table(f"regimes ({guide.prediction})", ["regime", "s", "best", "why"],
                      [[e.regime, e.s_range, e.best, e.why] for e in regimes], right_from=99))
    if budget_rows:
        con.print(C.table(f"hybrid n under a window budget ({budget_note}; times per rank of h/tp heads)",
                          ["s", "tp", "window budget", "n", "window / seq / layer",
                           next(d.title for d in DESIGNS if d.split), "n = 0", "speed-up", "limited by"],
                          [[s, r.tp, "-" if r.window_budget_bytes is None else C.mb(r.window_budget_bytes), r.split.n,
                            C.mb(r.window_bytes), C.us(r.split.time_s), C.us(r.latent_time_s), f"{r.speedup:.3f}x",
                            "budget" if r.split.limited_by == "memory" else "time"]
                           for s, rows_s in budget_rows for r in rows_s], right_from=0))
    return 0


def _plot_n(args, dims, dev, cal) -> None:
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
    budget = C.window_budget_bytes(args.window_budget, dims, args.t)
    path = plot_time_vs_n(dims, dev, args.b, s, args.t, out, args.ceilings, measured, budget, calibration=cal)
    print(f"wrote {path}" + (f" (measured: {', '.join(measured)})" if measured else " (model only)"), file=sys.stderr)


def _budget_rows(args, dims, dev):
    """(s, [BudgetedSplit]) per s of the guide when --window-budget is given: the model's
    dims (all h heads) split at tp = 1 and at --tp, each per rank."""
    from mla_var3.analysis.regime import budget_table

    if args.window_budget is None:
        return [], ""
    budget = C.window_budget_bytes(args.window_budget, dims, args.t)
    note = ("window <= the latent cache's own size" if args.window_budget == "latent" else "window")
    note += f" = {budget / 1e6:,.2f} MB per sequence per layer"
    tps = sorted({1, args.tp})
    s_values = args.s or [r for r in (1, 2, 4, 8, 16, 32, 64) if r <= args.t]
    return [(s, budget_table(dims, Problem(b=args.b, s=s, t=args.t), dev, budget, tps, args.ceilings))
            for s in s_values], note


def add(sub) -> None:
    p = sub.add_parser("regime", help="best design per query length s, crossover, best hybrid n",
                       description="The regime guide: predicted time of each design per s.")
    C.add_model_args(p)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--t", type=positive_int, default=4096, help="context (default 4096)")
    p.add_argument("--s", type=int_list, help="comma-separated query lengths (default 1,2,4,...,t)")
    p.add_argument("--fa-model", default="flash_attention", choices=("flash_attention", "flash_attention_shared_kpe"),
                   help="FlashAttention byte count: seed (RoPE key per head) or shared RoPE key")
    C.add_budget_args(p)
    p.add_argument("--plot-n", type=path_arg, metavar="PNG", help="also plot the hybrid's time vs n at the first --s (default 16), "
                                                  "the predicted optimum marked")
    p.add_argument("--sweep", type=path_arg, metavar="JSON", help="--plot-n: measured n sweep (a benchmarks/hybrid_check.py result)")
    C.add_device_args(p)
    C.add_calibration_arg(p)
    C.add_results_arg(p, "(a column per design)")
    C.add_json_arg(p)
    p.set_defaults(func=run)

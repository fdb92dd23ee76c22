"""``mla-var3 cost``: FLOPs, bytes, arithmetic intensity and roofline time of one design."""

from __future__ import annotations

from mla_var3._argtypes import n_arg, positive_int
from mla_var3.cli import _common as C
from mla_var3.designs import DESIGNS
from mla_var3.shapes import Problem

#: the cost model that takes the hybrid split n.
HYBRID = next(d.kernel for d in DESIGNS if d.split)


def run(args) -> int:
    from mla_var3.analysis.cost import COST_MODELS
    from mla_var3.analysis.roofline import predict

    if args.design not in COST_MODELS:
        raise ValueError(f"unknown design {args.design!r}; known: {', '.join(COST_MODELS)}")
    dims, dev = C.rank_dims_from_args(args), C.device_from_args(args)
    if args.n is not None and args.design != HYBRID:
        raise ValueError(f"--n applies to {HYBRID} only, not {args.design}")
    if args.window_budget is not None and args.design != HYBRID:
        raise ValueError(f"--window-budget applies to {HYBRID} only, not {args.design}")
    auto = args.n in (None, "auto")
    problem = Problem(b=args.b, s=args.s, t=args.t, n=None if auto else args.n)
    n_note = ""
    if args.design == HYBRID:
        from mla_var3.analysis.regime import hybrid_split

        budget = C.window_budget_bytes(args.window_budget, dims, args.t)
        # dims are one rank's (h/tp heads): the window budget is per rank
        split = hybrid_split(dims, problem, dev, "auto" if auto else args.n, window_budget_bytes=budget,
                             ceilings=args.ceilings)
        problem = problem.with_n(split.n)
        if auto:
            n_note = " (best n" + (", capped by the window budget" if split.limited_by == "memory" else "") + ")"
    pred = predict(args.design, dims, problem, dev, args.ceilings, stages=args.stages)
    from mla_var3.analysis.calibration import predict as predict_calibrated

    # the default call of the kernel alone (no absorption or decompression), eager
    cal = predict_calibrated(C.calibration_from_args(args, dev), args.design, dims, problem, device=dev,
                             ceilings=args.ceilings)
    if args.json:
        C.print_json({**pred.to_dict(), "model": dims.name, "b": problem.b, "s": problem.s, "t": problem.t,
                      "n": problem.n, "stages": args.stages, "tp": args.tp,
                      "dims": {"h": dims.h, "d": dims.d, "p": dims.p, "k": dims.k, "dv": dims.dv, "w": dims.w},
                      "calibrated_time_s": cal.time_s, "calibrated_source": cal.source,
                      "calibrated_gpu_s": cal.gpu_s, "calibrated_host_s": cal.host_s, "calibrated_backend": cal.backend,
                      "calibration": cal.calibration if cal.source == "calibrated" else cal.note})
        return 0
    c, ceil = pred.cost, pred.ceilings
    shape = f"b={problem.b} s={problem.s} t={problem.t}" + (f" n={problem.n}{n_note}" if problem.n is not None else "")
    rows = [
        ["design", args.design + (" + absorb/decompress" if args.stages else "")],
        ["model", f"{dims.name} (h={dims.h} d={dims.d} p={dims.p} k={dims.k} w={dims.w})"
                  + (f": one GPU of tp={args.tp}, h/tp heads, the whole latent cache" if args.tp != 1 else "")],
        ["problem", shape],
        ["device", f"{dev.name} ({ceil.kind} ceilings: {ceil.flops_per_s / 1e12:,.1f} TFLOP/s, {ceil.bytes_per_s / 1e9:,.0f} GB/s)"],
        ["FLOPs", f"{c.flops:,} ({c.flops / 1e9:,.2f} GFLOP)"],
        ["bytes", f"{c.bytes:,} ({c.bytes / 1e6:,.2f} MB)"],
        ["intensity", f"{c.intensity:,.2f} FLOP/byte (ridge {ceil.ridge:,.1f})"],
        ["compute time", C.us(pred.compute_s)],
        ["memory time", C.us(pred.memory_s)],
        ["predicted time", f"{C.us(pred.time_s)} ({pred.bound}-bound)"],
        ["calibrated time", f"{C.us(cal.time_s)} eager (GPU {C.us(cal.gpu_s)}, host {C.us(cal.host_s)}; the default "
                            f"call of {args.design} alone, backend {cal.backend}; {cal.calibration})"
         if cal.source == "calibrated" else f"- ({cal.note})"],
    ]
    C.console().print(C.table("roofline and calibrated prediction", ["quantity", "value"], rows, right_from=9))
    return 0


def add(sub) -> None:
    from mla_var3.analysis.cost import COST_MODELS

    p = sub.add_parser("cost", help="FLOPs, bytes, intensity and predicted time of one design",
                       description="FLOPs, bytes, arithmetic intensity and roofline time of one design (with --tp: "
                                   "on one GPU of a tensor-parallel group, h/tp heads).")
    p.add_argument("--design", required=True, choices=list(COST_MODELS), metavar="DESIGN",
                   help=f"one of {', '.join(COST_MODELS)}")
    C.add_model_args(p)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--s", type=positive_int, default=1, help="query tokens per sequence (default 1)")
    p.add_argument("--t", type=positive_int, default=4096, help="context incl. the s new tokens (default 4096)")
    p.add_argument("--n", type=n_arg, help=f"{HYBRID}: newest tokens kept expanded, or 'auto' (default: the "
                                          "model's best n, capped by --window-budget)")
    p.add_argument("--stages", action="store_true", help="add query absorption and output decompression")
    C.add_budget_args(p)
    C.add_device_args(p)
    C.add_calibration_arg(p)
    C.add_json_arg(p)
    p.set_defaults(func=run)

"""Where a serving-shaped decode call's GPU time goes: each kernel's device time, ours and
official FlashMLA's, on the paged points of ``serving_check.py``.

For every point the compat call (``mla_var3.compat.flash_mla_with_kvcache``, its plan built once
as an engine's decode step does) and FlashMLA's call run ``--calls`` times each under
``torch.profiler``; the kernels' device times are summed per kernel name and divided by the
calls. Our plan's work list is read back (a host read, outside the profiled calls): items,
split items, programs and the item lengths. The sum of kernel times is not the call's wall time
(launch gaps are left out); ``serving_check.py`` measures that. With ``--timeline`` each call
also runs alone (synchronised after it) under the profiler, and the trace gives every kernel's
grid, start (from the call's first kernel) and duration, medians over the calls: the gaps
between a gated plan's two kernels and the combine, which the per-name sums hide (both seesaw
kernels have one name).

Usage::

    python benchmarks/serving_profile.py --out prof.json --flash-mla <folder of flash_mla>
"""

from __future__ import annotations

import json
from collections import defaultdict

import torch

from common import baseline_parser, import_flash_mla
from plan_order_sim import ragged_lengths
from serving_check import K, RAGGED, environment, make_paged

POINTS = [("uniform", 32, 1, 4096), ("uniform", 64, 1, 4096), ("uniform", 32, 16, 4096)] + [
    ("ragged", b, s, t) for b, s, t in RAGGED]


def _profiled(fn, calls: int, sync_each: bool):
    """``torch.profiler`` over ``calls`` calls of ``fn`` (CUDA activity), after three warm-up
    calls; each call synchronised when ``sync_each``, else once after the last."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return prof


def kernel_times(fn, calls: int) -> dict[str, float]:
    """Mean device µs per call of each kernel ``fn`` launches (summed over its launches)."""
    prof = _profiled(fn, calls, sync_each=False)
    total: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            total[ev.name[:90]] += ev.device_time
    return {name: us / calls for name, us in sorted(total.items(), key=lambda kv: -kv[1])}


def call_timelines(trace: dict, calls: int) -> dict:
    """The kernels of ``calls`` calls in a chrome trace (``torch.profiler``'s export), each call's
    kernels in start order: ``{"kernels": [{"name", "grid", "start_us", "dur_us"}], "span_us"}``,
    start (from the call's first kernel start), duration and the span (first start to last end)
    the medians over the calls. The calls must each launch the same kernels, one call after the
    other (each synchronised)."""
    import statistics

    ev = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ev or len(ev) % calls:
        raise ValueError(f"{len(ev)} kernels in the trace for {calls} calls: not the same kernels per call")
    n = len(ev) // calls
    groups = [ev[i * n:(i + 1) * n] for i in range(calls)]
    med = lambda xs: round(statistics.median(xs), 2)
    kernels = []
    for j in range(n):
        first = groups[0][j]
        kernels.append({"name": first["name"].split("(")[0][-60:], "grid": first.get("args", {}).get("grid"),
                        "start_us": med([g[j]["ts"] - g[0]["ts"] for g in groups]),
                        "dur_us": med([g[j]["dur"] for g in groups])})
    span = med([max(e["ts"] + e["dur"] for e in g) - g[0]["ts"] for g in groups])
    return {"kernels": kernels, "span_us": span}


def timeline(fn, calls: int) -> dict:
    """:func:`call_timelines` of ``calls`` calls of ``fn``, each synchronised, under the profiler."""
    import tempfile

    prof = _profiled(fn, calls, sync_each=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            return call_timelines(json.load(trace), calls)


def plan_stats(meta) -> dict:
    """Items, split items, programs and item lengths (blocks) of our plan (host read)."""
    plan = meta.plan
    items = plan.items.cpu()
    live = items[items[:, 0] >= 0]
    lens = (live[:, 2] - live[:, 1]).tolist()
    tiles = -(-plan.rows // 64)
    return {"items": len(lens), "split_items": int((live[:, 3] >= 0).sum()), "programs": len(lens) * tiles,
            "item_blocks_max": max(lens, default=0), "item_blocks_min": min(lens, default=0),
            "item_blocks_mean": sum(lens) / max(1, len(lens)), "row_tiles": tiles,
            "packed": None if plan.packed is None else int(plan.packed.item()),
            "starts": None if plan.starts is None else plan.starts.tolist()}


def _points(threshold: str | None) -> list:
    """``[(kind, b, s, t, lengths)]``: :data:`POINTS` with serving_check's ragged lengths, or with
    ``threshold`` the threshold batches of ``seesaw_ab.py`` (kind: their label) whose label
    contains one of its comma-separated pieces ("all": every one)."""
    if threshold is None:
        ragged = ragged_lengths()
        return [(kind, b, s, t, [t] * b if kind == "uniform" else ragged[(b, s, t)]) for kind, b, s, t in POINTS]
    from seesaw_ab import threshold_points

    pieces = [x.strip() for x in threshold.split(",")]
    return [(label, b, s, t, lengths) for label, _, b, s, t, lengths in threshold_points()
            if threshold == "all" or any(x in label for x in pieces)]


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--timeline", action="store_true", help="also each call's kernels in order: grid, start, duration")
    ap.add_argument("--points", default=None,
                    help="only these points, e.g. 'ragged:64:1:8192,uniform:32:1:4096' (default: all)")
    ap.add_argument("--threshold", default=None,
                    help="instead, seesaw_ab.py's threshold batches whose label contains one of these comma-separated "
                         "pieces (e.g. 'b32 s1,est 0.85'; 'all' for every one)")
    args = ap.parse_args()
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata

    fm = import_flash_mla(args.flash_mla)
    scale = (K + 64) ** -0.5
    rows = []
    only = None if args.points is None else {tuple(x.split(":")) for x in args.points.split(",")}
    known = {(kind, str(b), str(s), str(t)) for kind, b, s, t in POINTS}
    if only is not None and only - known:
        ap.error(f"--points: {', '.join(':'.join(x) for x in sorted(only - known))} not among the points "
                 f"({', '.join(':'.join(x) for x in sorted(known))})")
    for kind, b, s, t, lengths in _points(args.threshold):
        if only is not None and (kind, str(b), str(s), str(t)) not in only:
            continue
        q, cache, table, seqlens = make_paged(lengths, s, capacity=t, seed=b * 100 + s, poison=False)
        causal = s > 1
        meta, _ = get_mla_metadata()
        ours = lambda: flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=causal)
        row = {"kind": kind, "b": b, "s": s, "t_max": t, "mean_len": sum(lengths) / b, "lengths": lengths,
               "ours": kernel_times(ours, args.calls)}
        row["plan"] = plan_stats(meta)
        if args.timeline:
            row["ours_timeline"] = timeline(ours, args.calls)
        if fm is not None:
            meta_f, _ = fm.get_mla_metadata()
            theirs = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta_f, None, softmax_scale=scale,
                                                       causal=causal)
            row["flashmla"] = kernel_times(theirs, args.calls)
            if args.timeline:
                row["flashmla_timeline"] = timeline(theirs, args.calls)
        rows.append(row)
        fmt = lambda d: " + ".join(f"{n.split('(')[0][-28:]} {us:.1f}" for n, us in d.items())
        print(f"{kind} b{b} s{s} t{t}: plan {row['plan']}\n  ours  {fmt(row['ours'])}\n"
              f"  flash {fmt(row.get('flashmla', {}))}", flush=True)
        for who in ("ours", "flashmla"):
            tl = row.get(f"{who}_timeline")
            if tl:
                steps = " | ".join(f"{k['name'][-24:]} grid {k['grid']} at {k['start_us']} for {k['dur_us']}"
                                   for k in tl["kernels"])
                print(f"  {who} timeline (span {tl['span_us']} us): {steps}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"env": environment(), "calls": args.calls, "rows": rows}, f, indent=1)
    print("\n| kind | b | s | t | ours: kernels µs (sum) | FlashMLA: kernels µs (sum) | items (split) | programs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        o, f, p = r["ours"], r.get("flashmla", {}), r["plan"]
        print(f"| {r['kind']} | {r['b']} | {r['s']} | {r['t_max']} | "
              f"{' + '.join(f'{v:.1f}' for v in o.values())} ({sum(o.values()):.1f}) | "
              f"{' + '.join(f'{v:.1f}' for v in f.values())} ({sum(f.values()):.1f}) | "
              f"{p['items']} ({p['split_items']}) | {p['programs']} |")


if __name__ == "__main__":
    main()

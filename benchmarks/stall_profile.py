"""Where the decode kernels' warps wait: Nsight Compute's stall sampling of our seesaw kernel and
of official FlashMLA's kernel on one serving-shaped point, per SASS instruction.

The script runs itself under ``ncu`` once per kernel (``--child ours|flashmla``): the compat call
(``mla_var3.compat.flash_mla_with_kvcache``, plan built once) or FlashMLA's call on the same
paged inputs, ``--warmup`` calls, then one profiled call. ncu samples the warps' program
counters (``SourceCounters``) and reads the warp-state and throughput sections; the clocks are
left as they are (``--clock-control none``). For each kernel the report is exported as the
details page and the SASS source page (CSV, one row per instruction with its stall samples),
and :func:`summarise` writes each pair loop's samples by cause to ``--out``. Where the GPU
chooses the plan's kind, a call launches two seesaw kernels (``--our-launches 2`` profiles both).

The sampler shares its samples among an SM's resident warps, so a warp of a 12-warp program is
sampled 2/3 as often as one of an 8-warp program. Each launch's summary therefore carries its
block size and theoretical active warps per SM (the details page), and each pair loop's numbers
also come scaled to 8 resident warps (``scaled_per_1000_iterations``: × active warps / 8), the
figure to compare between kernels.

    python benchmarks/stall_profile.py --out stall.json --flash-mla <folder of flash_mla> \\
        --dir <folder for the reports> [--point uniform:32:16:4096]
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict

KERNELS = {"ours": "_flash_mla_seesaw", "flashmla": "flash_fwd_splitkv_mla_kernel"}
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats", "SourceCounters",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")


def point_batch(point: str) -> tuple[int, int, int, list]:
    """``(b, s, t_max, lengths)`` of a ``--point``: ``uniform:B:S:T``; ``ragged:B:S:T``
    (serving_check's own lengths for its rows, else lengths drawn as its first row's are); or
    ``threshold:SEED:N``, seesaw_ab.py's threshold batch N (from 0) of that seed."""
    import torch

    from plan_order_sim import ragged_lengths

    kind, *rest = point.split(":")
    if kind == "threshold" and len(rest) == 2:
        from seesaw_ab import threshold_points

        _, _, b, s, t, lengths = threshold_points(seed=int(rest[0]))[int(rest[1])]
        return b, s, t, lengths
    if kind not in ("uniform", "ragged") or len(rest) != 3:
        raise ValueError(f"--point must be uniform:B:S:T, ragged:B:S:T or threshold:SEED:N, got {point!r}")
    b, s, t = (int(x) for x in rest)
    if kind == "uniform":
        return b, s, t, [t] * b
    lengths = ragged_lengths().get((b, s, t)) or \
        torch.randint(t // 8, t + 1, (b,), generator=torch.Generator().manual_seed(5)).tolist()
    return b, s, t, lengths


def child(who: str, point: str, warmup: int, flash_mla: str | None) -> None:
    """Build the point's inputs and make ``warmup + 1`` calls of ``who``'s decode."""
    import torch

    from common import import_flash_mla
    from serving_check import K, make_paged

    b, s, t, lengths = point_batch(point)
    q, cache, table, seqlens = make_paged(lengths, s, capacity=t, seed=b * 100 + s, poison=False)
    causal = s > 1
    if who == "ours":
        from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata

        meta, _ = get_mla_metadata()
        call = lambda: flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=causal)
    else:
        fm = import_flash_mla(flash_mla)
        if fm is None:
            raise SystemExit("official FlashMLA is needed for --child flashmla")
        meta_f, _ = fm.get_mla_metadata()
        call = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta_f, None,
                                                 softmax_scale=(K + 64) ** -0.5, causal=causal)
    for _ in range(warmup + 1):
        call()
    torch.cuda.synchronize()


def profile(who: str, args, ncu: str) -> dict:
    """Run the child under ncu and export its report; returns the exported texts."""
    rep = os.path.join(args.dir, f"{who}")
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "-f", "-o", rep,
           "-k", f"regex:{KERNELS[who]}", "--launch-skip", str(args.warmup * args.launches[who]),
           "--launch-count", str(args.launches[who]),
           "--import-source", "no"]
    for sec in SECTIONS:
        cmd += ["--section", sec]
    cmd += [sys.executable, os.path.abspath(__file__), "--child", who, "--point", args.point,
            "--warmup", str(args.warmup), "--out", "-"]
    if args.flash_mla:
        cmd += ["--flash-mla", args.flash_mla]
    print(" ".join(cmd), flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    print(run.stdout[-3000:], run.stderr[-3000:], flush=True)
    out = {}
    for page, extra in (("details", []), ("source", ["--print-source", "sass"])):
        exp = subprocess.run([ncu, "-i", rep + ".ncu-rep", "--page", page, "--csv", *extra], capture_output=True,
                             text=True, timeout=args.timeout)
        out[page] = exp.stdout
        with open(os.path.join(args.dir, f"{who}-{page}.csv"), "w") as f:
            f.write(exp.stdout)
        if exp.returncode:
            print(f"ncu -i {page}: {exp.stderr[-2000:]}", flush=True)
    return out


def _number(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def _category(op: str, row: dict, samples: float) -> str:
    """Where an instruction's samples go: the mbarrier waits (a branch on a try-wait's
    predicate, long scoreboard), the tensor-core waits (``WARPGROUP.DEPBAR``), HGMMA issue,
    warpgroup barriers, local-memory traffic, or the rest by their main stall reason."""
    if op.startswith("BRA") and row["stall_long_sb"] > samples / 2:
        return "mbarrier wait"
    for prefix, name in (("WARPGROUP.DEPBAR", "wgmma wait"), ("HGMMA", "HGMMA issue"), ("BAR", "BAR"),
                         ("LDL", "local memory"), ("STL", "local memory")):
        if op.startswith(prefix):
            return name
    for reason in ("barrier", "short_sb", "long_sb"):
        if row[f"stall_{reason}"] > samples / 2:
            return f"other, {reason}"
    return "other"


#: the resident warps per SM the scaled numbers refer to: two warpgroups, one program per SM (the
#: item kernel's and FlashMLA's)
REFERENCE_WARPS = 8


def launch_stats(details_csv: str) -> list[dict]:
    """Per profiled launch of a details-page export (``ncu --page details --csv``), in launch
    order: ``block_threads`` (the launch's block size) and ``active_warps_per_sm`` (theoretical
    occupancy), None where the page lacks the metric."""
    per: dict[str, dict] = {}
    for r in csv.DictReader(io.StringIO(details_csv)):
        if "ID" not in r or r.get("ID") == "ID":
            continue
        d = per.setdefault(r["ID"], {"block_threads": None, "active_warps_per_sm": None})
        name = r.get("Metric Name")
        if name == "Block Size":
            d["block_threads"] = int(_number(r["Metric Value"]))
        elif name == "Theoretical Active Warps per SM":
            d["active_warps_per_sm"] = _number(r["Metric Value"])
    return [per[k] for k in sorted(per, key=int)]


def scale_to_reference(summary: dict, stats: dict) -> dict:
    """``summary`` (of one launch) with its launch statistics and each pair loop's samples per
    1,000 iterations also scaled to :data:`REFERENCE_WARPS` resident warps (× active warps / 8:
    the sampler shares its samples among the resident warps). Unscaled when the occupancy is
    unknown (then ``scale`` is None)."""
    warps = stats.get("active_warps_per_sm")
    scale = warps / REFERENCE_WARPS if warps else None
    summary = dict(summary, launch=dict(stats, scale=scale))
    if scale is not None:
        summary["pair_loops"] = [dict(lp, scaled_per_1000_iterations={k: round(v * scale, 1) for k, v in
                                                                      lp["per_1000_iterations"].items()})
                                 for lp in summary.get("pair_loops", [])]
    return summary


def summarise_pages(pages: dict) -> list[dict]:
    """Each launch's :func:`summarise` of a kernel's exported pages (``source``, and ``details``
    when there is one), scaled by :func:`scale_to_reference`."""
    parts = summarise_all(pages["source"])
    stats = launch_stats(pages.get("details", ""))
    return [scale_to_reference(p, stats[i] if i < len(stats) else {}) for i, p in enumerate(parts)]


def summarise_all(source_csv: str, **kw) -> list[dict]:
    """:func:`summarise` of each kernel of a source-page export (one table per profiled launch,
    each opened by its ``"Kernel Name"`` row), in launch order."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] or [0]
    out = io.StringIO()
    parts = []
    for a, b in zip(starts, starts[1:] + [len(rows)]):
        out.seek(0)
        out.truncate()
        csv.writer(out, quoting=csv.QUOTE_ALL).writerows(rows[a:b])
        parts.append(summarise(out.getvalue(), **kw))
    return parts


def summarise(source_csv: str, loop_hgmma: int = 44, top: int = 30) -> dict:
    """Per-instruction stall samples of a source-page CSV (ncu ``--page source --print-source
    sass``): the totals per stall reason, and per pair loop (a backward branch's body holding
    ``loop_hgmma`` HGMMA) its samples, its iterations (the first instruction's executions, per
    warp), the samples per 1,000 iterations by :func:`_category` and by stall reason, and its
    ``top`` instructions by samples."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        return {"error": "no source table", "first_lines": rows[:5]}
    cols = rows[head]
    body = [dict(zip(cols, r)) for r in rows[head + 1:] if len(r) == len(cols)]
    reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    for r in body:
        for c in reasons + ["Warp Stall Sampling (All Samples)", "Instructions Executed"]:
            r[c] = _number(r[c])
        toks = r["Source"].split()
        r["op"] = (toks[1] if toks and toks[0].startswith("@") and len(toks) > 1 else (toks[0] if toks else ""))
    samples = "Warp Stall Sampling (All Samples)"
    total = sum(r[samples] for r in body)
    where = {int(r["Address"], 16): i for i, r in enumerate(body)}
    loops = []
    for i, r in enumerate(body):
        m = re.search(r"BRA(?:\.\w+)* (0x[0-9a-f]+)", r["Source"])
        if m and int(m.group(1), 16) in where and where[int(m.group(1), 16)] < i:
            a = where[int(m.group(1), 16)]
            # a pair loop's branch runs once per iteration, as its first instruction does (a
            # try-wait's retry branch, placed past the kernel's end, runs far less often)
            if sum(x["op"].startswith("HGMMA") for x in body[a:i + 1]) == loop_hgmma and \
                    r["Instructions Executed"] >= 0.5 * body[a]["Instructions Executed"]:
                loops.append((a, i))
    loops = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    out_loops = []
    for a, b in loops:
        part = body[a:b + 1]
        iters = max(1.0, part[0]["Instructions Executed"])
        cats: dict[str, float] = defaultdict(float)
        for r in part:
            cats[_category(r["op"], r, r[samples])] += r[samples]
        per = lambda v: round(1000 * v / iters, 1)
        out_loops.append({
            "first": a, "last": b, "instructions": b - a + 1, "iterations": iters,
            "samples": sum(r[samples] for r in part), "share": sum(r[samples] for r in part) / max(total, 1),
            "per_1000_iterations": {k: per(v) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
            "reasons_per_1000_iterations": {c[6:]: per(sum(r[c] for r in part)) for c in reasons
                                            if sum(r[c] for r in part)},
            "hottest": [{"index": a + j, "sass": r["Source"].strip(), "share": r[samples] / max(total, 1),
                         "reasons": {c[6:]: r[c] for c in reasons if r[c]}}
                        for j, r in sorted(enumerate(part), key=lambda jr: -jr[1][samples])[:top]],
        })
    return {"instructions": len(body), "samples": total,
            "reasons": {c[6:]: sum(r[c] for r in body) for c in reasons},
            "pair_loops": out_loops}


def report(record: dict) -> None:
    """Print each profiled kernel's pair loops: samples per 1,000 iterations by category, scaled
    to 8 resident warps where the launch's occupancy is known."""
    for who, k in record["kernels"].items():
        for n, s in enumerate(k["summaries"]):
            launch = s.get("launch", {})
            print(f"{who} (launch {n} of the call): {s.get('instructions')} instructions, "
                  f"{s.get('samples', 0):.0f} samples, {launch.get('block_threads')} threads per program, "
                  f"{launch.get('active_warps_per_sm')} active warps per SM")
            for lp in s.get("pair_loops", []):
                key = "scaled_per_1000_iterations" if "scaled_per_1000_iterations" in lp else "per_1000_iterations"
                cats = "  ".join(f"{c} {v}" for c, v in lp[key].items())
                print(f"  loop {lp['first']}-{lp['last']} ({lp['instructions']} instructions, {lp['share']:.1%} of "
                      f"samples, {sum(lp[key].values()):.0f} per 1,000 iterations"
                      f"{' at 8 resident warps' if key.startswith('scaled') else ''}): {cats}")


def main() -> None:
    from common import baseline_parser, environment

    ap = baseline_parser(__doc__)
    ap.add_argument("--point", default="uniform:32:16:4096",
                    help="kind:b:s:t_max (kind uniform or ragged), or threshold:SEED:N (seesaw_ab.py's threshold "
                         "batch N, from 0, of that seed)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dir", default="stall-reports", help="folder for the ncu reports and CSV exports")
    ap.add_argument("--child", choices=sorted(KERNELS), default=None)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--our-launches", type=int, default=1,
                    help="our seesaw kernels per call, all profiled (2 where the GPU chooses the plan's kind: "
                         "the item kernel and the packed kernel)")
    ap.add_argument("--from-csv", action="store_true",
                    help="summarise the exports already in --dir (ours-source.csv, ours-details.csv, "
                         "flashmla-source.csv, ...)")
    args = ap.parse_args()
    try:
        lengths = point_batch(args.point)[3]
    except (ValueError, IndexError) as e:
        ap.error(f"--point: {e}")
    args.launches = {"ours": args.our_launches, "flashmla": 1}
    if args.child:
        child(args.child, args.point, args.warmup, args.flash_mla)
        return
    if args.from_csv:
        record = {"point": args.point, "kernels": {}}
        for who in KERNELS:
            pages = {}
            for page in ("source", "details"):
                path = os.path.join(args.dir, f"{who}-{page}.csv")
                if os.path.exists(path):
                    with open(path) as f:
                        pages[page] = f.read()
            if "source" in pages:
                record["kernels"][who] = {"name": KERNELS[who], "summaries": summarise_pages(pages)}
        report(record)
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        return
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    os.makedirs(args.dir, exist_ok=True)
    record = {"env": environment(), "point": args.point, "lengths": lengths, "warmup": args.warmup, "kernels": {}}
    for who in ("ours", "flashmla"):
        if who == "flashmla" and not args.flash_mla:
            continue
        pages = profile(who, args, ncu)
        record["kernels"][who] = {"name": KERNELS[who], "summaries": summarise_pages(pages)}
    report(record)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

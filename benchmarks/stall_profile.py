"""Where the decode kernels' warps wait: Nsight Compute's stall sampling of our seesaw kernel and
of official FlashMLA's kernel on one serving-shaped point, per SASS instruction.

The script runs itself under ``ncu`` once per kernel (``--child ours|flashmla``): the compat call
(``mla_var3.compat.flash_mla_with_kvcache``, plan built once) or FlashMLA's call on the same
paged inputs, ``--warmup`` calls, then one profiled call. ncu samples the warps' program
counters (``SourceCounters``) and reads the warp-state and throughput sections; the clocks are
left as they are (``--clock-control none``). For each kernel the report is exported as the
details page and the SASS source page (CSV, one row per instruction with its stall samples),
and :func:`summarise` writes the per-reason totals and the hottest instructions to ``--out``.

    python benchmarks/stall_profile.py --out stall.json --flash-mla <folder of flash_mla> \\
        --dir <folder for the reports> [--point uniform:32:16:4096]
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict

KERNELS = {"ours": "_flash_mla_seesaw", "flashmla": "flash_fwd_splitkv_mla_kernel"}
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats", "SourceCounters",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")


def child(who: str, point: str, warmup: int, flash_mla: str | None) -> None:
    """Build the point's inputs and make ``warmup + 1`` calls of ``who``'s decode."""
    import torch

    from common import import_flash_mla
    from serving_check import K, make_paged

    kind, b, s, t = point.split(":")
    b, s, t = int(b), int(s), int(t)
    if kind == "uniform":
        lengths = [t] * b
    else:
        g = torch.Generator().manual_seed(5)
        lengths = torch.randint(t // 8, t + 1, (b,), generator=g).tolist()
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
           "-k", f"regex:{KERNELS[who]}", "--launch-skip", str(args.warmup), "--launch-count", "1",
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


def summarise(source_csv: str, top: int = 40) -> dict:
    """Per-instruction stall samples of a source-page CSV: the column totals, the opcode totals
    and the ``top`` instructions by samples (address, SASS, samples per column)."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    head = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    if head is None:
        return {"error": "no source table", "first_lines": rows[:5]}
    cols = rows[head]
    body = [r for r in rows[head + 1:] if len(r) == len(cols)]
    src = next(i for i, c in enumerate(cols) if c.startswith("Source"))
    num = [i for i, c in enumerate(cols) if "Samples" in c or "stall" in c.lower() or "Executed" in c]
    totals = {cols[i]: sum(_number(r[i]) for r in body) for i in num}
    samp = next((i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")), num[0] if num else None)
    by_op: dict[str, float] = defaultdict(float)
    for r in body:
        op = r[src].split()[0] if r[src].split() else ""
        if op.startswith("@"):
            op = r[src].split()[1] if len(r[src].split()) > 1 else op
        by_op[op.split(".")[0]] += _number(r[samp]) if samp is not None else 0
    hot = sorted(body, key=lambda r: -_number(r[samp]))[:top] if samp is not None else []
    return {"columns": cols, "instructions": len(body), "totals": totals,
            "by_opcode": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:30]),
            "hottest": [{cols[i]: r[i] for i in [0, src] + num} for r in hot]}


def main() -> None:
    from common import baseline_parser, environment

    ap = baseline_parser(__doc__)
    ap.add_argument("--point", default="uniform:32:16:4096", help="kind:b:s:t_max (kind uniform or ragged)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dir", default="stall-reports", help="folder for the ncu reports and CSV exports")
    ap.add_argument("--child", choices=sorted(KERNELS), default=None)
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.point, args.warmup, args.flash_mla)
        return
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    os.makedirs(args.dir, exist_ok=True)
    record = {"env": environment(), "point": args.point, "warmup": args.warmup, "kernels": {}}
    for who in ("ours", "flashmla"):
        if who == "flashmla" and not args.flash_mla:
            continue
        pages = profile(who, args, ncu)
        record["kernels"][who] = {"name": KERNELS[who], "summary": summarise(pages["source"])}
        s = record["kernels"][who]["summary"]
        print(f"{who}: {s.get('instructions')} instructions; totals {s.get('totals')}", flush=True)
        print("  by opcode:", list(s.get("by_opcode", {}).items())[:12], flush=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()

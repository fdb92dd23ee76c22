"""Profiling reports of one design: the roofline annotation and Nsight Compute.

:func:`annotate` is the seed's "annotation" mode: every stage of the design (absorb →
attention [+ split-KV combine, inside the attention launcher] → decompress) and the whole
pipeline are timed with the one timing primitive and put on the roofline (time, TFLOP/s,
GB/s, % of bound, bound type, config); ``params.json`` and ``report.md`` go to a folder.

:func:`run_ncu` runs Nsight Compute with ``--clock-control none`` (clocks as found) on one run
of the stages (an NVTX range named ``profile``) and adds DRAM throughput, compute / tensor
pipe utilisation, occupancy and registers per kernel to the report.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

from mla_var3.designs import design as design_of
from mla_var3.kernel import launchers as D
from mla_var3.runtime.records import Record, fill_roofline, fill_timing

#: ncu sections collected, and the metrics shown from them.
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")
NCU_METRICS = ("Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
               "Theoretical Occupancy", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Grid Size",
               "Block Size")


def _timer_args(device: str) -> dict:
    if device == "cuda":
        return dict(warmup=3, reps=100, min_reps=5, max_seconds=1.0)
    return dict(warmup=1, reps=2, min_reps=1, max_seconds=60.0)


def stage_records(design: str, dims, problem, dtype: str, device: str, ceilings, dev, *, seed: int = 0,
                  cache=None) -> list[Record]:
    """Time each stage of ``design`` and the whole pipeline; one Record per stage plus 'end-to-end'."""
    from mla_var3.analysis.cost import Cost
    from mla_var3.analysis.roofline import predict
    from mla_var3.runtime.autotune import config_to_dict
    from mla_var3.runtime.timing import time_fn

    picked = {name: D.pick_config(name, dims, problem, dtype, device, cache=cache)
              for name in design_of(design).pipeline}
    stages = D.pipeline(design, dims, problem, dtype=dtype, device=device, seed=seed,
                        configs={name: cfg for name, (cfg, _) in picked.items()})
    records, total = [], Cost(0, 0)
    for st in stages:
        timing = time_fn(st.call, **_timer_args(device))
        c = D.stage_cost(st, dims, problem)
        total = total + c
        rec = Record(name=design, kind="design", model=dims.name, b=problem.b, s=problem.s, t=problem.t, n=problem.n,
                     dtype=dtype, stage=st.name, cost_model=st.cost_model,
                     config=config_to_dict(st.config) if st.config is not None else None)
        rec.extra["config_source"] = picked[st.launcher][1]
        fill_timing(rec, timing)
        fill_roofline(rec, c, ceilings)
        records.append(rec)
    if len(stages) > 1:
        def whole():
            for st in stages:
                st.call()

        timing = time_fn(whole, **_timer_args(device))
        rec = Record(name=design, kind="design", model=dims.name, b=problem.b, s=problem.s, t=problem.t, n=problem.n,
                     dtype=dtype, stage="end-to-end", cost_model="sum of stages")
        fill_timing(rec, timing)
        pred = predict(design, dims, problem, dev, ceilings.kind, stages=True).time_s
        fill_roofline(rec, total, ceilings, pred)
        records.append(rec)
    return records


def report_markdown(design: str, records: list[Record], params: dict, ncu: list[dict] | None = None) -> str:
    ceil = params["ceilings"]
    env = params["environment"]
    lines = [f"# {design}: roofline annotation", "",
             f"{params['problem_text']}", "",
             f"Device: {env['device']} · torch {env['torch']} · triton {env['triton']} · commit "
             f"{str(env['commit'])[:12]}{' (dirty)' if env.get('dirty') else ''}",
             f"Ceilings: **{ceil['kind']}** ({ceil['tflops']:,.0f} TFLOP/s, {ceil['gbs']:,.0f} GB/s, ridge "
             f"{ceil['ridge']:.0f} FLOP/byte; {ceil['source']})", ""]
    if not env.get("gpu"):
        lines += ["**Run under the Triton interpreter on a CPU: times are not GPU timings.**", ""]
    lines += ["| stage | time (µs) | p10–p90 (µs) | TFLOP/s | GB/s | intensity | % of bound | bound | config |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        cfg = " ".join(f"{k}={v}" for k, v in (r.config or {}).items())
        if r.config:
            cfg += f" ({r.extra.get('config_source', '')})"
        lines.append(f"| {r.stage} | {r.time_us:,.1f} | {r.p10_us:,.1f}–{r.p90_us:,.1f} | {r.tflops:,.2f} | "
                     f"{r.gbs:,.1f} | {r.intensity:,.1f} | {r.pct_of_bound:,.1f} | {r.bound} | {cfg} |")
    lines.append("")
    lines.append("The split-KV combine, when the config splits the keys, runs inside the attention stage.")
    if ncu:
        lines += ["", "## Nsight Compute (clock control none)", "", "| kernel | " + " | ".join(NCU_METRICS) + " |",
                  "|---|" + "---|" * len(NCU_METRICS)]
        for k in ncu:
            lines.append(f"| {k['kernel'][:60]} | " + " | ".join(k.get(m, "–") for m in NCU_METRICS) + " |")
    return "\n".join(lines) + "\n"


def annotate(args, dims, problem, device: str, dev, out: Path) -> list[Record]:
    """The annotation report of ``args.design``: print it, write params.json + report.md to ``out``."""
    from mla_var3.runtime.autotune import AutotuneCache
    from mla_var3.runtime.environment import environment

    ceilings = dev.ceilings(args.ceilings, dims.w)
    records = stage_records(args.design, dims, problem, args.dtype, device, ceilings, dev, seed=args.seed,
                            cache=AutotuneCache())
    params = {
        "design": args.design, "dims": dataclasses.asdict(dims),
        "problem": {"b": problem.b, "s": problem.s, "t": problem.t, "n": problem.n, "causal": problem.causal},
        "dtype": args.dtype, "device_key": dev.key,
        "problem_text": f"{dims.name}: h={dims.h} d={dims.d} p={dims.p} k={dims.k}; b={problem.b} s={problem.s} "
                        f"t={problem.t}" + (f" n={problem.n}" if problem.n is not None else "") + f"; {args.dtype}",
        "ceilings": {"kind": ceilings.kind, "tflops": ceilings.flops_per_s / 1e12, "gbs": ceilings.bytes_per_s / 1e9,
                     "ridge": ceilings.ridge, "source": ceilings.source},
        "environment": environment(),
        "stages": [r.to_dict() for r in records],
    }
    md = report_markdown(args.design, records, params)
    out.mkdir(parents=True, exist_ok=True)
    (out / "params.json").write_text(json.dumps(params, indent=1, default=str) + "\n")
    (out / "report.md").write_text(md)
    print(md)
    print(f"wrote {out / 'params.json'} and {out / 'report.md'}")
    return records


def parse_ncu_csv(text: str) -> list[dict]:
    """Per-kernel metrics from ``ncu --csv --page details`` output (rows of interest only)."""
    start = text.find('"ID"')
    if start < 0:
        return []
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = row.get("Metric Name", "")
        if name not in NCU_METRICS and "Tensor" not in name and "Spill" not in name:
            continue
        key = row.get("ID", "")
        entry = kernels.setdefault(key, {"kernel": row.get("Kernel Name", "")})
        unit = row.get("Metric Unit", "")
        entry[name] = f"{row.get('Metric Value', '')} {unit}".strip()
    return list(kernels.values())


def run_ncu(exe: str, args, out: Path) -> int:
    """Profile one run of the design's stages with Nsight Compute; append its metrics to report.md."""
    child = [sys.executable, "-m", "mla_var3.kernel", args.design, "--model", args.model, "--dtype", args.dtype,
             "--b", str(args.b), "--s", str(args.s), "--t", str(args.t), "--seed", str(args.seed), "--run-once"]
    for dim in ("h", "d", "p", "k"):
        if getattr(args, dim, None) is not None:
            child += [f"--{dim}", str(getattr(args, dim))]
    if args.n is not None:
        child += ["--n", str(args.n)]
    if args.no_causal:
        child.append("--no-causal")
    cmd = [exe, "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include", "profile/",
           "--csv", "--page", "details"]
    for sec in NCU_SECTIONS:
        cmd += ["--section", sec]
    print("running: " + " ".join(cmd + child))
    proc = subprocess.run(cmd + child, capture_output=True, text=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ncu.csv").write_text(proc.stdout)
    kernels = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or not kernels:
        print(f"ncu exited with status {proc.returncode} and {len(kernels)} kernels profiled; stderr tail:\n"
              + proc.stderr[-2000:])
        return 1
    lines = ["", "## Nsight Compute (clock control none)", ""]
    for k in kernels:
        lines.append(f"- {k['kernel'][:80]}: " + "; ".join(f"{m} {v}" for m, v in k.items() if m != "kernel"))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(out / "report.md", "a") as f:
        f.write(text)
    print(f"raw ncu output: {out / 'ncu.csv'}; summary appended to {out / 'report.md'}")
    return 0

"""Why a compat call can run slower inside ``serving_check.py`` than the same kernel in ``seesaw_ab.py``.

On the same H200 in one session, uniform b = 64, s = 1 measured 155.5 µs through the compat call in
``serving_check.py`` and 140.8 µs through ``seesaw_attention`` with the same planner in
``seesaw_ab.py``. This times, in one process, every combination of the two scripts' input
builders (``serving_check.make_paged``, ``seesaw_ab.paged_inputs``) and three call paths (the
compat call, ``flash_mla_paged`` with the compat call's plan, ``seesaw_attention`` with that
plan), CUDA-graph time, interleaved over rounds; then the plan each path ran (packed or items,
programs) and the outputs against each other.

    python benchmarks/compat_probe.py --out probe.json [--flash-mla DIR] [--b 64] [--s 1]
"""

from __future__ import annotations

import statistics
import time

import torch

from common import baseline_parser, environment, import_flash_mla, require_cuda, write_json

K, P, PAGE = 512, 64, 64


def gpu_state() -> dict:
    """SM clock (MHz), power (mW) and temperature as NVML reports them now (None where it does not)."""
    out = {}
    for key, fn in (("sm_mhz", torch.cuda.clock_rate), ("power_mw", torch.cuda.power_draw),
                    ("temp_c", torch.cuda.temperature)):
        try:
            out[key] = fn()
        except Exception:
            out[key] = None
    return out


def heat(seconds: float) -> None:
    """Back-to-back b = 32, s = 32 compat calls (the heaviest uniform row) for ``seconds``."""
    import serving_check
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata

    q, cache, table, seqlens = serving_check.make_paged([4096] * 32, 32, capacity=4096, seed=7, poison=False)
    meta, _ = get_mla_metadata()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(50):
            flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=True)
        torch.cuda.synchronize()


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--b", type=int, action="append")
    ap.add_argument("--s", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--heat", type=float, default=0.0,
                    help="then run b = 32, s = 32 compat calls this many seconds and time every call again, "
                         "at once and after 10 s idle (SM clock and power read before each)")
    args = ap.parse_args()
    require_cuda()
    import seesaw_ab
    import serving_check
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3.kernel.absorbed import flash_mla_paged
    from mla_var3.kernel.hopper.absorbed_seesaw import seesaw_attention
    from mla_var3.runtime.timing import time_fn

    fm = import_flash_mla(args.flash_mla)
    scale, s = (K + P) ** -0.5, args.s
    record = {"env": environment(), "rows": []}
    for b in args.b or [64, 32]:
        builders = {"serving_check": lambda: serving_check.make_paged([4096] * b, s, capacity=4096, seed=b * 100 + s,
                                                                      poison=False),
                    "seesaw_ab": lambda: seesaw_ab.paged_inputs([4096] * b, s, 4096, seed=b * 100 + s)}
        calls, outs = {}, {}
        for name, build in builders.items():
            q, cache, table, seqlens = build()
            meta, _ = get_mla_metadata()
            compat = (lambda q, c, t, sl, m: lambda: flash_mla_with_kvcache(q, c, t, sl, K, m, causal=s > 1))(
                q, cache, table, seqlens, meta)
            outs[f"{name}/compat"] = compat()
            plan = meta.plan
            qt = q.transpose(1, 2)
            qc, qpe = qt[..., :K], qt[..., K:]
            calls[f"{name}/compat"] = compat
            calls[f"{name}/flash_mla_paged"] = (lambda: flash_mla_paged(qc, qpe, cache, table, seqlens, scale=scale,
                                                                        causal=s > 1, plan=plan))
            calls[f"{name}/seesaw"] = (lambda: seesaw_attention(qc, qpe, (cache, None), scale=scale, causal=s > 1,
                                                                seqlens=seqlens, plan=plan, block_table=table))
            if fm is not None:
                fmeta, _ = fm.get_mla_metadata()
                calls[f"{name}/flashmla"] = (lambda q, c, t, sl, m: lambda: fm.flash_mla_with_kvcache(
                    q, c, t, sl, K, m, None, softmax_scale=scale, causal=s > 1))(q, cache, table, seqlens, fmeta)
            torch.cuda.synchronize()
            record["rows"].append({"b": b, "inputs": name, "plan_packed": plan.starts is not None,
                                   "programs": int(plan.programs), "may_split": bool(plan.may_split)})
            print(f"b{b} {name}: plan starts={'yes' if plan.starts is not None else 'no'} programs={plan.programs} "
                  f"may_split={plan.may_split}", flush=True)
        for phase in ["cold"] + (["after heat", "after 10 s idle"] if args.heat else []):
            if phase == "after heat":
                heat(args.heat)
            elif phase == "after 10 s idle":
                time.sleep(10)
            state = gpu_state()
            samples = {n: [] for n in calls}
            for _ in range(args.rounds):
                for n, fn in calls.items():
                    samples[n].append(time_fn(fn, use_graph=True, max_seconds=0.25).median_us)
            row = {"b": b, "s": s, "phase": phase, "gpu": state,
                   "graph_us": {n: statistics.median(v) for n, v in samples.items()}, "samples": samples}
            record["rows"].append(row)
            print(f"-- b{b} s{s} {phase}: {state}", flush=True)
            for n, v in row["graph_us"].items():
                print(f"b{b} s{s} {n:32s} {v:8.1f} us  {[round(x, 1) for x in samples[n]]}", flush=True)
    write_json(args.out, record)


if __name__ == "__main__":
    main()

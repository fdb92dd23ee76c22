"""The device planner's own time: ``plan_decode`` on the serving rows' and the threshold batches'
lengths (sm_90), in CUDA graphs and eager, for this package's planner and, with ``--base FILE``,
a copy of an earlier ``decode_plan`` module in the same process.

A decode step builds its plan once and every layer reuses it, so the planner's time is paid once
per step (61 layers for DeepSeek-V3); a call without a plan (``flash_mla_paged`` without
``plan``, ``flash_mla(..., seqlens=...)``) pays it on every call. Each point times
``plan_decode(seqlens, rows, capacity=t)`` (the compat call's metadata: the planner's choice of
kind, without the host readback) and, where the batch's kind is gated, the item plan alone
(``packed=False``). A table last; everything to ``--out`` as JSON.

    python benchmarks/plan_time.py --out benchmarks/results/h200/serving/plan-time.json [--base old_decode_plan.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

from common import environment, interleaved_rounds, require_cuda, write_json
from seesaw_ab import H, points


def load_planner(path: str | None):
    """This package's ``decode_plan`` (``path`` None) or the module at ``path`` (a copy of it)."""
    if path is None:
        from mla_var3.kernel import decode_plan
        return decode_plan
    spec = importlib.util.spec_from_file_location("decode_plan_base", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod       # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", default=None, help="a decode_plan module file to time beside this one")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    require_cuda()
    planners = {"head": load_planner(None)}
    if args.base:
        planners["base"] = load_planner(args.base)
    pts = [p for p in points(False, "serving") if p[5] is not None and "ragged" in p[0]]
    pts += points(False, "threshold", 9)
    record = {"env": environment(), "base": Path(args.base).name if args.base else None, "times": []}
    for label, _, b, s, t, lengths in pts:
        seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        rows = s * H
        fns = {}
        for name, dp in planners.items():
            fns[name] = lambda dp=dp: dp.plan_decode(seqlens, rows, capacity=t, readback=False)
            if dp.packing_may_pay(b, rows, dp._device_sms(seqlens.device)):
                fns[f"{name}/item"] = lambda dp=dp: dp.plan_decode(seqlens, rows, capacity=t, packed=False)
        graph, eager = interleaved_rounds(fns, args.rounds)
        row = {"point": label, "b": b, "s": s, "t": t, "lengths": lengths,
               "us": {n: statistics.median(v) for n, v in graph.items()},
               "eager_us": {n: statistics.median(v) for n, v in eager.items()}}
        record["times"].append(row)
        print(label, " ".join(f"{n} {v:.1f}/{row['eager_us'][n]:.1f}" for n, v in row["us"].items()), flush=True)
    write_json(args.out, record)
    names = list(dict.fromkeys(n for r in record["times"] for n in r["us"]))
    print("\nplanner µs, CUDA graph / eager")
    print("| point | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for r in record["times"]:
        cells = [f"{r['us'][n]:.1f} / {r['eager_us'][n]:.1f}" if n in r["us"] else "-" for n in names]
        print(f"| {r['point']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

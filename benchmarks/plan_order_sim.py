"""The order of a decode plan's items, in a list-scheduling simulation of an H200 (CPU only).

The GPU starts a grid's programs in order as SMs free up (one seesaw program per SM: 216 KiB
of shared memory), so the order of the plan's items decides the tail. The planner emits them
longest first by a counting sort over size classes (:mod:`mla_var3.kernel.decode_plan`). This
compares, for the planner's own cut of each batch, the makespan of

* ``c8``: eight classes relative to the item length C (the planner until 5ee728e),
* ``m16``: sixteen classes relative to the cut's longest item (the planner since),
* ``lpt``: every item sorted by length (no classes),

simulating ``sms`` slots that each take the next (row tile, item) program when free, a program
costing its blocks plus ``--overhead`` blocks. First the simulation is held against the H200's
measured times of ``serving/plan-sweep-ce7b97b.json`` (the same lengths cut at several C, in the
c8 order): per point, measured µs ÷ simulated blocks should be near-constant where few items
are split (the combine adds its own time). Then the serving rows of ``serving_check.py`` (same
lengths) and ``--random`` random batches. A table last; ``--out`` gets the JSON.

    python benchmarks/plan_order_sim.py --out benchmarks/results/h200/serving/plan-order-sim.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
from pathlib import Path

import torch

from serving_check import RAGGED

from mla_var3.kernel import decode_plan as dp
from mla_var3.kernel._common import cdiv

H, K = 128, 512
SWEEP = Path(__file__).parent / "results" / "h200" / "serving" / "plan-sweep-ce7b97b.json"


def classes_of_c(ref: dict) -> dict:
    """An item plan's reference (``plan_reference``) with its sequences re-ordered as the planner
    ordered them before 075d7cb: longest first by eight size classes relative to the item length
    C (a sequence's items stay together, in order, with their slots)."""
    by_seq: dict[int, list] = {}
    for it in ref["items"]:
        if it[0] >= 0:
            by_seq.setdefault(it[0], []).append(it)
    c_len = ref["item_blocks"]

    def cls(b):
        return min(7, max(hi - lo for _, lo, hi, _ in by_seq[b]) * 8 // (c_len + 1))

    items = [it for b in sorted(by_seq, key=lambda b: (-cls(b), b)) for it in by_seq[b]]
    return dict(ref, items=items + [(-1, -1, -1, -1)] * (len(ref["items"]) - len(items)))


def item_sizes(ref: dict, order: str) -> list[int]:
    """The lengths (blocks) of a plan reference's items in ``order``: ``m16`` (the planner's),
    ``c8`` (:func:`classes_of_c`) or ``lpt`` (sorted)."""
    items = classes_of_c(ref)["items"] if order == "c8" else ref["items"]
    sizes = [hi - lo for b, lo, hi, _ in items if b >= 0]
    return sorted(sizes, reverse=True) if order == "lpt" else sizes


def makespan(sizes: list[int], tiles: int, sms: int, overhead: float) -> float:
    """Blocks until the last SM is done: ``tiles`` programs per item in grid order, each taken by
    the SM that frees first."""
    free = [0.0] * sms
    for x in sizes:
        for _ in range(tiles):
            heapq.heapreplace(free, free[0] + x + overhead)
    return max(free)


def ragged_lengths() -> dict[tuple, list[int]]:
    """The ragged rows' lengths as ``serving_check.py`` draws them (seed 5, in its order)."""
    g = torch.Generator().manual_seed(5)
    return {(b, s, t): torch.randint(t // 8, t + 1, (b,), generator=g).tolist() for b, s, t in RAGGED}


def compare(lengths: list[int], s: int, t: int, sms: int, overhead: float) -> dict:
    rows = H * s
    ref = dp.plan_reference(lengths, rows, capacity=t, k=K, sms=sms)
    out = {o: makespan(item_sizes(ref, o), cdiv(rows, dp.ROW_TILE), sms, overhead) for o in ("c8", "m16", "lpt")}
    return {"item_blocks": ref["item_blocks"], **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON record")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=3.0, help="blocks a program costs besides its keys")
    ap.add_argument("--random", type=int, default=400, help="random batches to simulate")
    args = ap.parse_args()
    lengths = ragged_lengths()
    record: dict = {"kind": "simulation", "sms": args.sms, "overhead_blocks": args.overhead}
    if SWEEP.exists():
        sweep = []
        for r in json.loads(SWEEP.read_text())["rows"]:
            if r["impl"] == "flashmla":
                continue
            key = (r["b"], r["s"], r["t_max"])
            ref = dp.plan_reference(lengths[key], H * r["s"], capacity=r["t_max"], k=K, sms=args.sms,
                                    item_blocks=r["item_blocks"])
            sim = makespan(item_sizes(ref, "c8"), cdiv(H * r["s"], dp.ROW_TILE), args.sms, args.overhead)
            sweep.append(dict(point=list(key), item_blocks=r["item_blocks"], split_items=r["split_items"],
                              measured_us=r["us"], simulated_blocks=sim, us_per_block=r["us"] / sim))
        record["against_measured"] = sweep
        print("measured µs ÷ simulated blocks (c8 order), per cut:")
        for row in sweep:
            print(f"  b{row['point'][0]} s{row['point'][1]} t{row['point'][2]} C={row['item_blocks']}: "
                  f"{row['measured_us']:.1f} µs / {row['simulated_blocks']:.0f} = {row['us_per_block']:.3f} "
                  f"({row['split_items']} split)")
    record["serving_rows"] = [dict(point=list(key), **compare(v, key[1], key[2], args.sms, args.overhead))
                              for key, v in lengths.items()]
    rng = random.Random(7)
    ratios: dict[str, list[float]] = {"m16": [], "lpt": []}
    for _ in range(args.random):
        s, b = rng.choice([1, 1, 2, 4, 8]), rng.choice([4, 8, 16, 32, 64, 96, 128, 256])
        t = rng.choice([2048, 4096, 8192, 16384, 32768])
        lo = rng.choice([1, t // 8, t // 2])
        r = compare([rng.randint(lo, t) for _ in range(b)], s, t, args.sms, args.overhead)
        for o in ratios:
            ratios[o].append(r[o] / r["c8"])
    record["random"] = {o: dict(mean=statistics.mean(v), min=min(v), max=max(v), n=len(v)) for o, v in ratios.items()}
    print("\n| row | C | c8 | m16 | lpt | m16 / c8 |\n|---|---|---|---|---|---|")
    for row in record["serving_rows"]:
        b, s, t = row["point"]
        print(f"| b{b} s{s} t{t} | {row['item_blocks']} | {row['c8']:.0f} | {row['m16']:.0f} | {row['lpt']:.0f} | "
              f"{row['m16'] / row['c8']:.3f} |")
    for o, v in record["random"].items():
        print(f"random batches ({v['n']}): {o} / c8 mean {v['mean']:.4f}, min {v['min']:.3f}, max {v['max']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

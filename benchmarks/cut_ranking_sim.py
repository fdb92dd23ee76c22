"""The item cut's rankings (``decode_plan.RANKINGS``) against a list-scheduling simulation of the
item kernel's grid, on the CPU, from measured records.

The sm_90 item kernel runs one program per (item, row tile), row tile fastest, and the GPU starts
each on the first SM to free. :func:`busiest_sm` simulates that (132 SMs, an item costing its
blocks + 0.5). A time model ``fixed + per_block x busiest SM + per_split x split (item, row
tile)`` is fitted by least squares to the item-forced CUDA-graph times of ``seesaw_ab.py``
records (their columns ``head/item``, ``head/itemfit``, ``head/item@R``, the plans rebuilt from
the recorded lengths as each column cut them). Then, over seeded random ragged batches, each
ranking's cut is timed by the model against the best item length: the regret.

    python benchmarks/cut_ranking_sim.py [--record FILE ...] [--item-ranking spread] [--batches 150] [--out sim.json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "h200" / "seesaw"
#: records whose item-forced times the model is fitted on (every column's cut rebuilt from its lengths)
DEFAULT_RECORDS = ["seesaw-itemfit-seed9-bd5d463.json", "seesaw-itemfit-serving-bd5d463.json",
                   "seesaw-threshold-seed9-73df606.json", "seesaw-serving-73df606.json"]
SMS, ROW_TILE, PER_ITEM = 132, 64, 0.5


def busiest_sm(items: list, tiles: int, sms: int = SMS, per_item: float = PER_ITEM) -> float:
    """The busiest SM's blocks when the live ``items`` run one program per row tile, in plan
    order, row tile fastest, each program started on the SM that frees first."""
    free = [0.0] * sms
    for b, lo, hi, _ in items:
        if b < 0:
            continue
        for _ in range(tiles):
            heapq.heappush(free, heapq.heappop(free) + hi - lo + per_item)
    return max(free)


def features(ref: dict, rows: int) -> tuple[float, float]:
    """(busiest SM in blocks, split (item, row tile) pairs) of an item plan."""
    tiles = -(-rows // ROW_TILE)
    split = sum(1 for it in ref["items"] if it[0] >= 0 and it[3] >= 0)
    return busiest_sm(ref["items"], tiles), split * tiles


def column_plan(column: str, lengths: list, rows: int, t: int) -> dict | None:
    """The item plan a record's ``itemfit`` or ``item@R`` column ran, rebuilt on the host (None for
    other columns; a plain ``head/item`` column's ranking is the caller's to say)."""
    import seesaw_ab

    return seesaw_ab.host_item_plan(column.split("/", 1)[1], lengths, rows, t, SMS) if "/" in column else None


def load(records: list[str], item_ranking: str = "spread") -> list[tuple[float, float, float]]:
    """``(busiest SM, split pairs, µs)`` of every item-forced time in ``records``; their plain
    ``head/item`` column was cut by ``item_ranking`` (the default records predate "pairs")."""
    from mla_var3.kernel import decode_plan as dp

    out = []
    for name in records:
        path = Path(name) if Path(name).exists() else RESULTS / name
        for row in json.loads(path.read_text())["times"]:
            lengths = row.get("lengths")
            if lengths is None:
                continue
            rows, t = row["s"] * 128, row["t"]
            for column, us in row["us"].items():
                if column.endswith("/item"):
                    ref = dp.plan_reference(lengths, rows, capacity=t, sms=SMS, ranking=item_ranking)
                else:
                    ref = column_plan(column, lengths, rows, t)
                if ref is not None:
                    out.append((*features(ref, rows), us))
    return out


def fit(data: list[tuple[float, float, float]]) -> dict:
    """Least-squares ``fixed``, ``per_block``, ``per_split`` (µs) and the mean / max relative error."""
    a = np.array([[1.0, m, sp] for m, sp, _ in data])
    y = np.array([us for *_, us in data])
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    err = np.abs(a @ coef / y - 1)
    return {"fixed": float(coef[0]), "per_block": float(coef[1]), "per_split": float(coef[2]),
            "mean_error": float(err.mean()), "max_error": float(err.max()), "rows": len(data)}


def random_batches(n: int, seed: int = 1) -> list[tuple[list[int], int, int]]:
    """``(lengths, s, t)``: b in 8..128, s in 1..4, t up to 32k, half uniform in [t/8, t], half skewed
    (a fifth at t, the rest in [1, t/8])."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        b, s = rng.choice([8, 16, 24, 32, 48, 64, 96, 128]), rng.choice([1, 1, 2, 2, 4])
        t = rng.choice([4096, 8192, 16384, 32768])
        if rng.random() < 0.5:
            lengths = [rng.randint(t // 8, t) for _ in range(b)]
        else:
            lengths = [t if rng.random() < 0.2 else rng.randint(1, t // 8) for _ in range(b)]
        out.append((lengths, s, t))
    return out


#: the model fitted at bd5d463-1cff5c4 (``seesaw/cut-ranking-sim.json``), for :func:`best_sim_cut`
MODEL = {"fixed": 13.5, "per_block": 1.81, "per_split": 0.081}


def best_sim_cut(lengths: list, rows: int, capacity: int, sms: int = SMS, cut: str = "equal",
                 model: dict = MODEL) -> int:
    """The item length C (blocks), over every C from 2 to the longest sequence whose plan fits the
    planner's buffers, whose ``cut`` plan (``decode_plan.CUTS``) the simulation and ``model`` time
    lowest (ties: the longer C)."""
    from mla_var3.kernel import decode_plan as dp

    blocks = dp.seq_blocks(lengths, capacity)
    max_items = dp.plan_capacity(len(lengths), rows, sms, dp.cdiv(capacity, dp.PLAN_BLOCK))[1]
    best = None
    for c in range(dp.MIN_ITEM_BLOCKS, max(max(blocks, default=0), dp.MIN_ITEM_BLOCKS) + 1):
        ref = dp.plan_reference(lengths, rows, capacity=capacity, sms=sms, item_blocks=c, cut=cut)
        live = sum(1 for it in ref["items"] if it[0] >= 0)
        if ref["slots_used"] > ref["max_slots"] or live > max_items:
            continue
        m, sp = features(ref, rows)
        us = model["fixed"] + model["per_block"] * m + model["per_split"] * sp
        if best is None or us <= best[0]:
            best = (us, c)
    return best[1] if best else dp.MIN_ITEM_BLOCKS


def regrets(model: dict, batches: list) -> dict[str, list[float]]:
    """Per ranking, each batch's modelled time of its cut over the best cut's (every item length
    from 2 to the longest sequence whose plan fits the buffers), minus 1."""
    from mla_var3.kernel import decode_plan as dp

    def time(ref, rows):
        m, sp = features(ref, rows)
        return model["fixed"] + model["per_block"] * m + model["per_split"] * sp

    out = {r: [] for r in dp.RANKINGS}
    for lengths, s, t in batches:
        rows = s * 128
        max_items = dp.plan_capacity(len(lengths), rows, SMS, dp.cdiv(t, dp.PLAN_BLOCK))[1]
        top = max(max(dp.seq_blocks(lengths, t), default=0), dp.MIN_ITEM_BLOCKS)
        best = min(time(ref, rows) for c in range(dp.MIN_ITEM_BLOCKS, min(top, dp.MAX_ITEM_BLOCKS) + 1)
                   if (ref := dp.plan_reference(lengths, rows, capacity=t, sms=SMS, item_blocks=c))["slots_used"]
                   <= ref["max_slots"] and sum(1 for it in ref["items"] if it[0] >= 0) <= max_items)
        for r in dp.RANKINGS:
            out[r].append(time(dp.plan_reference(lengths, rows, capacity=t, sms=SMS, ranking=r), rows) / best - 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="append", default=None, help="a seesaw_ab.py record (repeatable)")
    ap.add_argument("--item-ranking", default="spread",
                    help="the ranking the records' plain head/item column was cut by (spread before a9dcb9b)")
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    data = load(args.record or DEFAULT_RECORDS, args.item_ranking)
    model = fit(data)
    print(f"model over {model['rows']} item-forced times: {model['fixed']:.1f} us + {model['per_block']:.2f} us x "
          f"busiest SM + {model['per_split']:.3f} us x split pairs; error mean {100 * model['mean_error']:.1f} % "
          f"max {100 * model['max_error']:.1f} %")
    reg = regrets(model, random_batches(args.batches))
    summary = {r: {"mean_pct": 100 * float(np.mean(v)), "p90_pct": 100 * float(np.percentile(v, 90)),
                   "max_pct": 100 * float(np.max(v))} for r, v in reg.items()}
    for r, v in summary.items():
        print(f"{r:7s}: {v['mean_pct']:.2f} % above the best candidate on average, {v['p90_pct']:.2f} % at the 90th "
              f"percentile, {v['max_pct']:.1f} % at worst")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": model, "regret": summary}, indent=1))


if __name__ == "__main__":
    main()

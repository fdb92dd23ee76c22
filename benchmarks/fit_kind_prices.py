"""Fit the decode planner's plan-kind prices (``decode_plan.ITEM_PRICE`` / ``PACKED_PRICE``) to
measured times, on the CPU, from ``seesaw_ab.py`` records.

Each record's rows are CUDA-graph medians of gated batches with a plan kind forced
(``head/item``, ``head/packed``). For each kind, a grid over its per-item and per-split prices
(in blocks, steps of 0.5) and a least-squares fixed part and block time give the fit of least
mean relative error, the makespans computed as the planner computes them
(``decode_plan.item_makespan``, ``packed_makespan``). The fixed parts then take each kind's gate
(the other kernel's launch in a gated call, measured: ``--gate-item``, ``--gate-packed`` µs), and
everything is expressed in the planner's units (1/256 of the item plan's block time). Last, each
batch with both kinds timed is left out of the fit in turn and the choice on it compared with
the faster kind: the loss a user would see.

    python benchmarks/fit_kind_prices.py [--record FILE:POINTS[:SEED[:OVERHEAD]] ...] [--out fit.json]

``POINTS`` is ``serving`` or ``threshold`` (``seesaw_ab.points``), ``SEED`` the threshold seed
(7), ``OVERHEAD`` the packed layout's blocks per sequence the packed times were measured with
(2); a record's ``head/packed@OVERHEAD`` column, where it has one, is the packed time. A row the
points do not regenerate is an error. The default records are those the committed prices were
fitted on.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "h200" / "seesaw"
#: the records of the committed prices: (file, points, seed, packed layout's overhead)
DEFAULT_RECORDS = ["seesaw-threshold-4447964.json:threshold:7:2", "seesaw-plans-faa1761.json:serving:7:2",
                   "seesaw-cap-4447964.json:serving:7:2"]
#: the price grid, in blocks
GRID = np.arange(0.0, 8.01, 0.5)


@dataclass(frozen=True)
class Row:
    """One timed gated batch: its label, the item and packed plans' makespan inputs, and the
    forced kinds' µs (None where not timed)."""

    label: str
    slots: int
    item_items: list
    packed_items: list
    packed_starts: list
    item_us: float | None
    packed_us: float | None


def load_rows(specs: list[str], sms: int = 132) -> list[Row]:
    """The gated rows of the records ``FILE:POINTS[:SEED[:OVERHEAD]]`` (files under
    ``results/h200/seesaw/`` or paths), their plans rebuilt from the points' seeded lengths."""
    import seesaw_ab
    from mla_var3.kernel import decode_plan as dp

    rows = []
    for spec in specs:
        name, which, *rest = spec.split(":")
        seed, overhead = (int(rest[0]) if rest else 7), (int(rest[1]) if len(rest) > 1 else 2)
        path = Path(name) if Path(name).exists() else RESULTS / name
        times = {r["point"]: r["us"] for r in json.loads(path.read_text())["times"]}
        pts = {p[0]: p for p in seesaw_ab.points(False, which, seed)}
        lost = sorted(set(times) - set(pts))
        if lost:
            raise ValueError(f"{name}: rows not among the {which} points of seed {seed} (drawn otherwise?): "
                             f"{', '.join(lost)}")
        for label, us in times.items():
            _, kind, b, s, t, lengths = pts[label]
            r = s * seesaw_ab.H
            if kind != "paged" or not dp.packing_may_pay(b, r, sms):
                continue
            # the item plans those records ran: cut by the ranking of their time ("spread")
            ri = dp.plan_reference(lengths, r, capacity=t, sms=sms, gated=True, ranking=seesaw_ab.THRESHOLD_RANKING)
            rp = dp.packed_reference(lengths, r, capacity=t, sms=sms, overhead=overhead)
            # the packed column: the layout's own (packed@N) where the record forced it, else the planner's
            rows.append(Row(label, dp.row_slots(r, sms), ri["items"], rp["items"], rp["starts"],
                            us.get("head/item"), us.get(f"head/packed@{overhead}", us.get("head/packed"))))
    return rows


def _makespan(row: Row, packed: bool, per_item: float, per_split: float) -> float:
    """The kind's makespan in blocks with these prices (blocks)."""
    from mla_var3.kernel import decode_plan as dp

    price = dp.KindPrice(0, int(round(per_item * 256)), int(round(per_split * 256)))
    if packed:
        return dp.packed_makespan(row.packed_items, row.packed_starts, row.slots, price) / 256
    return dp.item_makespan(row.item_items, row.slots, price) / 256


def fit_kind(rows: list[Row], packed: bool) -> dict:
    """The kind's fit of least mean relative error: ``{"per_item", "per_split"}`` (blocks),
    ``"fixed_us"``, ``"block_us"``, ``"mean_error"``, ``"max_error"``, ``"rows"``."""
    data = [(r, r.packed_us if packed else r.item_us) for r in rows]
    data = [(r, y) for r, y in data if y is not None]
    if len(data) < 3:
        raise ValueError(f"{'packed' if packed else 'item'}: {len(data)} timed rows, at least 3 needed")
    ys = np.array([y for _, y in data])
    best = None
    for g in GRID:
        for d in GRID:
            xs = np.array([_makespan(r, packed, g, d) for r, _ in data])
            a = np.stack([np.ones(len(xs)), xs], 1)
            coef = np.linalg.lstsq(a, ys, rcond=None)[0]
            err = np.abs(a @ coef - ys) / ys
            if best is None or err.mean() < best["mean_error"] - 1e-12:
                best = {"per_item": float(g), "per_split": float(d), "fixed_us": float(coef[0]),
                        "block_us": float(coef[1]), "mean_error": float(err.mean()), "max_error": float(err.max()),
                        "rows": len(data)}
    return best


def prices(fit_i: dict, fit_p: dict, gate_item: float, gate_packed: float):
    """The two :class:`decode_plan.KindPrice` of these fits, in units of the item plan's block time."""
    from mla_var3.kernel import decode_plan as dp

    unit = fit_i["block_us"] / 256
    item = dp.KindPrice(int(round((fit_i["fixed_us"] + gate_item) / unit)), int(round(fit_i["per_item"] * 256)),
                        int(round(fit_i["per_split"] * 256)))
    packed = dp.KindPrice(int(round((fit_p["fixed_us"] + gate_packed) / unit)), int(round(fit_p["per_item"] * 256)),
                          int(round(fit_p["per_split"] * 256)), int(round(100 * fit_p["block_us"] / fit_i["block_us"])))
    return item, packed


def leave_one_out(rows: list[Row], gate_item: float, gate_packed: float) -> list[dict]:
    """Each row with both kinds timed, fitted without it: the kind chosen and its loss (%) against
    the faster kind, gates counted."""
    out = []
    for row in [r for r in rows if r.item_us is not None and r.packed_us is not None]:
        rest = [r for r in rows if r.label != row.label]
        fi, fp = fit_kind(rest, False), fit_kind(rest, True)
        est_i = fi["fixed_us"] + gate_item + fi["block_us"] * _makespan(row, False, fi["per_item"], fi["per_split"])
        est_p = fp["fixed_us"] + gate_packed + fp["block_us"] * _makespan(row, True, fp["per_item"], fp["per_split"])
        item, packed = row.item_us + gate_item, row.packed_us + gate_packed
        chose = est_p < est_i
        out.append({"label": row.label, "packed": chose, "loss_pct": 100 * ((packed if chose else item)
                                                                            / min(item, packed) - 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="append", default=None, help="FILE:POINTS[:SEED[:OVERHEAD]] (repeatable)")
    ap.add_argument("--gate-item", type=float, default=0.3, help="µs the gate adds to a gated item-plan call")
    ap.add_argument("--gate-packed", type=float, default=2.1, help="µs the gate adds to a gated packed call")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out check")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = load_rows(args.record or DEFAULT_RECORDS)
    print(f"{len(rows)} gated rows", flush=True)
    fi, fp = fit_kind(rows, False), fit_kind(rows, True)
    item, packed = prices(fi, fp, args.gate_item, args.gate_packed)
    for name, f in (("item", fi), ("packed", fp)):
        print(f"{name:6s}: per item {f['per_item']} blocks, per split {f['per_split']}, fixed {f['fixed_us']:.2f} us, "
              f"{f['block_us']:.3f} us/block; error mean {100 * f['mean_error']:.1f} % "
              f"max {100 * f['max_error']:.1f} % over {f['rows']} rows")
    print(f"ITEM_PRICE = {item}\nPACKED_PRICE = {packed}")
    record = {"records": args.record or DEFAULT_RECORDS, "item": fi, "packed": fp,
              "prices": {"item": item.__dict__, "packed": packed.__dict__}}
    if not args.no_loo:
        loo = leave_one_out(rows, args.gate_item, args.gate_packed)
        wrong = [r for r in loo if r["loss_pct"] > 0]
        total = sum(r["loss_pct"] for r in loo) / max(1, len(loo))
        print(f"left out in turn: {len(wrong)} of {len(loo)} on the slower kind, mean loss {total:.2f} %; "
              + ", ".join(f"{r['label']} {r['loss_pct']:.1f} %" for r in wrong))
        record["leave_one_out"] = loo
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

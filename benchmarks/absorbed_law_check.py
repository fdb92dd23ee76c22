"""The sm_90 absorbed kernel's law against the committed H200 serving records (no GPU needed).

    python benchmarks/absorbed_law_check.py            # prints the table
    python benchmarks/absorbed_law_check.py --out benchmarks/results/h200/absorbed-law-check.md

Two forms of the compute term of ``kernel_laws.flash_mla_gluon``, with the shipped H200
calibration's parameters:

* **waves** (the law before): ⌈items x row tiles / SMs⌉ whole waves, each as long as the longest
  item. Ragged batches can only be asked at one t: the longest sequence's (what the dispatcher
  decides at).
* **items** (the law now, ``kernel_laws.latent_items``): the planner's cut, then one program per
  (item, row tile) in the planner's order on the SM that frees first; the time is the busiest
  SM's. Ragged batches: their own lengths.

Records: the serving runs of today's decode planner (``serving/serving-3cfbf71.json``,
``serving-7cfd9ab.json``, commit dd33142: plans bit for bit those of today's planner): the dense
``flash_mla`` rows (b = 32, 64, s = 1 … 32, t = 4,096) and the ragged rows of the paged
FlashMLA-compatible call beside official FlashMLA (lengths uniform in [t/8, t], drawn again
here as ``serving_check.py`` drew them: torch's CPU generator, seed 5; the recorded mean length
checks the draw). The paged call reads its keys through a block table, and a ragged batch the
GPU packs runs the packed kernel (not modelled): both within a few per cent of the item kernel.
Plus issue 42's three held-out shapes, measured on an H200 at a6efe19 (b = 20 runs the packed plan).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mla_var3.analysis import kernel_laws as KL  # noqa: E402
from mla_var3.analysis.calibration import load_calibration  # noqa: E402
from mla_var3.shapes import Problem, get_preset  # noqa: E402

RES = ROOT / "benchmarks" / "results" / "h200" / "serving"
RUNS = ("serving-3cfbf71.json", "serving-7cfd9ab.json")
#: serving_check.py's ragged rows (b, s, t_max), in the order it draws their lengths
RAGGED = [(32, 1, 4096), (64, 1, 8192), (128, 1, 4096), (64, 2, 8192), (32, 4, 16384), (8, 1, 32768), (1, 1, 4096),
          (16, 2, 32768), (256, 1, 2048)]
#: issue 42's held-out shapes, the dense call's CUDA-graph time measured on an H200 at a6efe19, where
#: its uniform plan packs b = 20 (``decode-state/packed-uniform-a6efe19.json``): (b, s, t, µs)
HELD_OUT = [(20, 1, 10240, 119.8), (20, 4, 10240, 384.7), (96, 2, 2048, 194.1)]
V3 = get_preset("deepseek-v3")


def ragged_lengths() -> dict[tuple[int, int, int], list[int]]:
    """The ragged rows' lengths as serving_check.py drew them."""
    import torch

    g = torch.Generator().manual_seed(5)
    return {key: torch.randint(key[2] // 8, key[2] + 1, (key[0],), generator=g).tolist() for key in RAGGED}


def waves_law(cal, b: int, s: int, t: int) -> float:
    """The law before: whole waves of the longest item (``latent_tiles``), µs."""
    m, p, rows = cal.machine(), cal.params_of("flash_mla", "gluon"), V3.h * s
    return KL.latent_tiles(V3, Problem(b, s, t), m, p, tile_rows=64, tiles_per_seq=-(-rows // 64), block_n=64,
                           splits=KL.gluon_latent_splits(b, rows, t, m.sms, V3.k)).gpu_s * 1e6


def items_law(cal, b: int, s: int, t: int, lengths=None) -> float:
    """The law now (``flash_mla_gluon``: the planner's items on the SMs), µs."""
    return KL.flash_mla_gluon(V3, Problem(b, s, t), cal.machine(), cal.params_of("flash_mla", "gluon"),
                              None if lengths is None else tuple(lengths)).gpu_s * 1e6


def rows(cal=None) -> list[dict]:
    """One row per record: what, shape, measured GPU time (µs), the two laws' µs."""
    cal = cal or load_calibration(device="h200")
    lens = ragged_lengths()
    out = []
    for run in RUNS:
        data = json.loads((RES / run).read_text())
        src = f"{run} ({data['env']['commit']})"
        for r in data["times"]:
            b, s, t = r["b"], r["s"], r["t_max"]
            if r["kind"] == "uniform" and "dense" in r:
                out.append({"call": "dense", "b": b, "s": s, "t": t, "mean": t, "measured_us": r["dense"]["graph_us"],
                            "flashmla_us": r["flashmla"]["graph_us"], "waves_us": waves_law(cal, b, s, t),
                            "items_us": items_law(cal, b, s, t), "source": src})
            elif r["kind"] == "ragged":
                lengths = lens[(b, s, t)]
                if abs(sum(lengths) / b - r["mean_len"]) > 1e-6:
                    raise ValueError(f"{run}: the lengths drawn again for b={b} s={s} t={t} do not match the record")
                out.append({"call": "paged, ragged", "b": b, "s": s, "t": t, "mean": r["mean_len"],
                            "measured_us": r["compat"]["graph_us"], "flashmla_us": r["flashmla"]["graph_us"],
                            "waves_us": waves_law(cal, b, s, max(lengths)),
                            "items_us": items_law(cal, b, s, max(lengths), lengths), "source": src})
    for b, s, t, us in HELD_OUT:
        out.append({"call": "dense", "b": b, "s": s, "t": t, "mean": t, "measured_us": us, "flashmla_us": None,
                    "waves_us": waves_law(cal, b, s, t), "items_us": items_law(cal, b, s, t),
                    "source": "measured side by side at a6efe19 (issue 42)"})
    return out


def _range(xs) -> str:
    return f"{min(xs):.2f}–{max(xs):.2f}" if xs else "–"


def render(table: list[dict]) -> str:
    lines = ["# The sm_90 absorbed kernel's law against the H200 serving records", "",
             "Generated by `python benchmarks/absorbed_law_check.py --out ...` from the shipped calibration "
             "(parameters unchanged between the two columns): predicted ÷ measured GPU time (CUDA-graph replays).", "",
             "| call | rows | s = 1: waves | s = 1: items | s > 1: waves | s > 1: items |", "|---|---|---|---|---|---|"]
    for call in ("dense", "paged, ragged"):
        group = [r for r in table if r["call"] == call]
        cells = []
        for one in (True, False):
            sub = [r for r in group if (r["s"] == 1) == one]
            cells += [_range([r["waves_us"] / r["measured_us"] for r in sub]),
                      _range([r["items_us"] / r["measured_us"] for r in sub])]
        lines.append(f"| {call} | {len(group)} | " + " | ".join(cells) + " |")
    lines += ["", "| call | b | s | t (max) | mean length | measured µs | official FlashMLA µs | waves ÷ measured | "
              "items ÷ measured | source |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        fm = "–" if r["flashmla_us"] is None else f"{r['flashmla_us']:,.1f}"
        lines.append(f"| {r['call']} | {r['b']} | {r['s']} | {r['t']} | {r['mean']:,.0f} | {r['measured_us']:,.1f} | "
                     f"{fm} | {r['waves_us'] / r['measured_us']:.2f} | {r['items_us'] / r['measured_us']:.2f} | "
                     f"{r['source']} |")
    ratios = [r["items_us"] / r["measured_us"] for r in table]
    lines += ["", f"Items law over all {len(table)} rows: {_range(ratios)}, median {statistics.median(ratios):.2f}.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the Markdown table here")
    ap.add_argument("--rows-json", type=Path, metavar="PATH", help="also write the rows as JSON (for the tests)")
    args = ap.parse_args(argv)
    table = rows()
    text = render(table)
    if args.out:
        args.out.write_text(text)
    if args.rows_json:
        import json

        args.rows_json.write_text(json.dumps(table))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate docs/regimes.md — the regime guide on the H200 — from the shipped calibration and
the committed measurements (and, for another device with a shipped calibration, its guide alone).

    python benchmarks/regimes.py benchmarks/results/h200/results.json --out docs/regimes.md
    python benchmarks/regimes.py --device h100-sxm      # docs/regimes-h100-sxm.md

First the guide itself: per (b, s) each design's time — measured where the shipped calibration
(``conf/calibration-h200.json``) holds a measurement of today's default call, else its calibrated
prediction — the best design, what the default dispatcher picks, and on which data the row rests.
Then the benchmark grid of a results file written by ``mla-var3 bench`` (every design and
baseline per (b, s)), the official-FlashMLA anchors in ``benchmarks/anchors_h200.json``, the
crossovers and the hybrid's best n by the measurements, the roofline and the calibrated model,
the dispatcher against the grid, and the seed's RTX 5090 table as history.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mla_var3.analysis.calibration import load_calibration, predict
from mla_var3.analysis.calibration_fit import Point
from mla_var3.analysis.devices import get_device
from mla_var3.analysis.regime import HYBRID_MARGIN, calibrated_crossover_s, calibrated_split, crossover_s, regime_of
from mla_var3.designs import DESIGNS as TABLE
from mla_var3.dispatch import CacheInfo, Dispatcher
from mla_var3.runtime.records import Record, crossovers, load_results
from mla_var3.shapes import MLADims, Problem, get_preset

GUIDE_S = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
HYBRID = next(d.kernel for d in TABLE if d.split)

GRID_NAMES = ("flash_mla", "flash_mla_gluon", "mla_var6_plus", "flash_attention")
BASELINES = ("torch_eager_absorbed", "torch_sdpa_expanded")
LABEL = {"flash_mla": "FlashMLA (ours, grid run)", "mla_var6_plus": "MLAvar6+ (ours)", "flash_attention": "FlashAttention (ours)",
         "torch_eager_absorbed": "eager absorbed", "torch_sdpa_expanded": "SDPA expanded (cuDNN)"}
ANCHORS = Path(__file__).with_name("anchors_h200.json")
GLUON = "flash_mla_gluon"
LABEL[GLUON] = "FlashMLA (ours, check run)"


def _gluon_times(results_path: Path, t: int) -> tuple[dict[tuple[int, int], float], str]:
    """(b, s) -> time of the Gluon absorbed kernel's newest timed schedule (seesaw, else pipelined)
    from the ``gluon_flash_mla_check.json`` beside the results (same timing primitive, its own run:
    ``gluon_flash_mla_check.py`` at c289878, a script since retired)."""
    path = results_path.with_name("gluon_flash_mla_check.json")
    if not path.exists():
        return {}, ""
    data = json.loads(path.read_text())
    rows = [r for r in data.get("timings", []) if r.get("t") == t and r.get("num_splits") is None]
    key = next((k for k in ("see", "pipe") if any(r.get(f"{k}_us") for r in rows)), None)
    if key is None:
        return {}, ""
    times = {(r["b"], r["s"]): r[f"{key}_us"] for r in rows if r.get(f"{key}_us")}
    schedule = {"see": "seesaw", "pipe": "pipelined"}[key]
    note = (f"The column {LABEL[GLUON]!r} comes from `{path.name}` (commit {data.get('commit') or '?'}, "
            f"{data.get('date', '?')}, {schedule} schedule, checks passed: {data.get('checks_passed_' + key, '?')}), "
            "timed with the same primitive in its own run; where its commit is newer than the grid's, it is the "
            "newer kernel.")
    return times, note


def _us(x: float | None) -> str:
    return "–" if x is None else f"{x:,.1f}"


def _measured_points(cal, heads: int = 128) -> dict[tuple[str, int, int], dict]:
    """(kernel, b, s) at t = 4096 -> {"us": time, "n": n, "files": ...}: the calibration's own points
    of each design's default call with ``heads`` heads (eager time where recorded, else CUDA-graph
    time; the median over runs per n, the fastest n for the hybrid)."""
    by: dict[tuple, dict[int | None, list]] = {}
    for p in (Point.from_dict(d) for d in cal.points):
        if p.t != 4096 or (p.s > 1 and not p.causal) or p.backend != cal.default_backend(p.design, p.problem):
            continue
        if p.dims.h != heads:
            continue
        us = p.eager_us if p.eager_us is not None else p.gpu_us
        if us is not None:
            n = (p.n or 0) if p.design == HYBRID else None        # a stored point drops n = 0
            by.setdefault((p.design, p.b, p.s), {}).setdefault(n, []).append((us, p.source.split(" [")[0]))
    out = {}
    for key, per_n in by.items():
        med = {n: (sorted(u for u, _ in v)[len(v) // 2], sorted({f for _, f in v})) for n, v in per_n.items()}
        n = min(med, key=lambda m: med[m][0])
        out[key] = {"us": med[n][0], "n": n, "files": med[n][1], "ns": sorted(m for m in med if m is not None)}
    return out


def _guide(cal, tp: int = 1) -> list[str]:
    """The guide: per (b, s) each design's time (measured where today's default call was measured,
    else calibrated), the best, the dispatcher's choice and what the row rests on. ``tp``: the
    call on one GPU of that tensor-parallel degree (h/tp heads, the whole latent cache). The
    device is the calibration's."""
    device = cal.device
    dims, t = get_preset("deepseek-v3").per_gpu(tp), 4096
    measured = _measured_points(cal, dims.h)
    title = ("TP 1 (all 128 heads on one GPU, or DP attention)" if tp == 1 else
             f"TP {tp} (one GPU of {tp}: {dims.h} heads, the latent cache whole on every GPU)")
    lines = [f"## The guide at {title}: b = 32 and 64, t = 4,096 (DeepSeek-V3 dims, bf16, causal)", "",
             f"Each design's time is its default call, eager, in µs: **measured** (m) where the shipped calibration "
             f"holds a measurement of today's default call at that point (its files are named under the table; the "
             f"hybrid at the fastest n measured), else the **calibrated** model (c; `conf/calibration-{device}.json`: "
             f"{cal.label}; the hybrid at its calibrated best n). *best* is the fastest by those numbers (the hybrid "
             f"only if it beats the better single design by more than {HYBRID_MARGIN:.0%} at a split 0 < n < t: at n = 0 "
             f"or t it is that single design); *dispatcher* is what "
             f"`mla-var3 explain --device {device} --b B --s S --t 4096{f' --tp {tp}' if tp != 1 else ''}` picks by "
             "default (the calibrated model alone, no results file, no autotune cache). *rests on* says which data "
             "decided the row.", ""]
    files: set[str] = set()
    guide = Dispatcher(device, use_measured=False, calibration=cal)    # what explain runs: the model, stages included
    for b in (32, 64):
        lines += [f"### b = {b}" + (f", TP {tp}" if tp != 1 else ""), "", "| s | regime | " + " | ".join(d.name + (" (n)" if d.split else "") for d in TABLE)
                  + " | best | dispatcher | rests on |", "|---|---|---|---|---|---|---|---|"]
        for s in GUIDE_S:
            pb = Problem(b=b, s=s, t=t)
            cells, times, kinds = [], {}, {}
            n_cal, hyb = calibrated_split(cal, dims, pb, device)
            calib = {d.kernel: hyb.time_s * 1e6 if d.split else predict(cal, d.kernel, dims, pb, device=device).time_s
                     * 1e6 for d in TABLE}
            for d in TABLE:
                m = measured.get((d.kernel, b, s))
                if m is not None:
                    times[d.name], kinds[d.name] = m["us"], "m"
                    files.update(m["files"])
                    cells.append(f"{_us(m['us'])} m" + (f" (n={m['n']}, best of {len(m['ns'])} measured)" if d.split else ""))
                else:
                    times[d.name], kinds[d.name] = calib[d.kernel], "c"
                    cells.append(f"{_us(calib[d.kernel])} c" + (f" (n={n_cal})" if d.split else ""))
            single = min((d.name for d in TABLE if not d.split), key=times.get)
            hybrid = next(d.name for d in TABLE if d.split)
            # a split at n = 0 or n = t is a single design (the absorbed or the expanded kernel): never "best" over it
            m_h = measured.get((HYBRID, b, s))
            split = 0 < (m_h["n"] if kinds[hybrid] == "m" else n_cal) < t
            best = hybrid if split and times[hybrid] * (1 + HYBRID_MARGIN) < times[single] else single
            dispatcher = guide.decide(dims, pb, CacheInfo("hybrid", t)).design
            m_names = [d for d in times if kinds[d] == "m"]
            rests = ("measurements" if len(m_names) == len(times) else "calibrated model" if not m_names else
                     f"measured {', '.join(m_names)}; calibrated {', '.join(d for d in times if kinds[d] == 'c')}")
            lines.append(f"| {s} | {regime_of(s)} | " + " | ".join(cells) + f" | {best} | {dispatcher} | {rests} |")
        lines += ["", f"By the calibrated model the expanded design overtakes the absorbed one at s = "
                  f"{calibrated_crossover_s(cal, dims, b, t, device)} for b = {b} (the roofline: s = "
                  f"{crossover_s(dims, b, t, device, fast='flash_attention_shared_kpe')}).", ""]
    if files:
        lines += ["Measurements of today's default calls behind the m cells: " + ", ".join(f"`{f}`" for f in sorted(files))
                  + (". Older kernels' measurements (the benchmark grid below among them) are compared in "
                     "`benchmarks/results/h200/calibration.md`, never used here." if device == "h200" else "."), ""]
    else:
        lines += [f"The shipped calibration holds no measurement of a default call with {dims.h} heads at these "
                  "points: every cell is the calibrated model.", ""]
    return lines


def _grid(records) -> dict[tuple[int, int], dict[str, object]]:
    """(b, s) -> name -> the record of the grid point (the hybrid at the bench's n choice)."""
    grid: dict[tuple[int, int], dict[str, object]] = {}
    for r in records:
        if r.status != "ok" or r.stage != "attention" or r.extra.get("sweep") == "n" or r.time_us is None:
            continue
        grid.setdefault((r.b, r.s), {})[r.name] = r
    return grid


def _dispatcher_check(results_path: Path, dims: MLADims, device) -> list[str]:
    """The dispatcher's choice at every grid point: from the model alone, and with this results
    file loaded (measured kernel times override the model), against the measured fastest."""
    from mla_var3.dispatch.decide import CacheInfo, Dispatcher, grid_check

    rows = grid_check([results_path], dims, device)
    roof = {(r["b"], r["s"]): r for r in grid_check([results_path], dims, device, calibration=None)}
    informed = Dispatcher(device, results=(results_path,), use_autotune=False)
    lines = ["## The dispatcher against this grid", "",
             "Over a hybrid cache whose window is t (every design possible); each design's time is the "
             "measured kernel plus the modelled stages around it (absorption/decompression). The calibrated model "
             "is today's kernels', the grid is its commit's: where a kernel has changed since, a miss can be the "
             "kernel's, not the model's.", "",
             "| b | s | measured fastest | calibrated model (default) | its cost | roofline alone | its cost | "
             "with these results loaded |", "|---|---|---|---|---|---|---|---|"]
    agree, agree_roof = 0, 0

    def cost(r):
        return "–" if r["miss_pct"] is None else ("agrees" if r["miss_pct"] == 0 else f"+{r['miss_pct']:.1f} %")

    for r in rows:
        pr = Problem(b=r["b"], s=r["s"], t=r["t"])
        dec = informed.decide(dims, pr, CacheInfo("hybrid", r["t"]))
        agree += dec.design == r["measured_best"]
        ro = roof[(r["b"], r["s"])]
        agree_roof += ro["miss_pct"] == 0
        lines.append(f"| {r['b']} | {r['s']} | {r['measured_best']} | {r['model']} | {cost(r)} | {ro['model']} | "
                     f"{cost(ro)} | {dec.design} ({dec.source}) |")
    lines += ["", f"The calibrated model alone picks the measured-fastest design at "
              f"{sum(r['miss_pct'] == 0 for r in rows)} of {len(rows)} points, the roofline alone at {agree_roof}; "
              f"with the results loaded the dispatcher does at {agree}.", ""]
    return lines


def _repeatability(results_path: Path, meta, records) -> list[str]:
    """How far the medians of a repeated run of the same commit (``repeat-*.json`` beside the
    results) moved; repeats of other commits timed other kernels and are only named."""
    lines = ["## Repeatability", ""]
    commit = meta["environment"].get("commit")
    for path in sorted(results_path.parent.glob("repeat-*.json")):
        again_meta, again = load_results(path)
        other = again_meta["environment"].get("commit")
        if other != commit:
            lines.append(f"`{path.name}` repeated a run at commit {other}, not this grid's ({commit}); it is not "
                         "compared here (the kernels differ).")
            continue
        first = {(r.name, r.b, r.s, r.n): r.time_us for r in records if r.status == "ok" and r.time_us}
        diffs = sorted(abs(r.time_us / first[key] - 1) * 100 for r in again
                       if r.status == "ok" and r.time_us and (key := (r.name, r.b, r.s, r.n)) in first)
        if diffs:
            lines.append(f"`{path.name}` re-ran {len(diffs)} of these points in a second run on the same GPU: medians "
                         f"moved by {diffs[len(diffs) // 2]:.2f} % (median) and {diffs[-1]:.2f} % at most.")
    return lines + [""] if len(lines) > 2 else []


def render(results_path: Path) -> str:
    meta, records = load_results(results_path)
    anchors = json.loads(ANCHORS.read_text())
    env = meta["environment"]
    dims = MLADims(**meta["dims"])
    t = meta["spec"]["t"]
    ceil = meta["ceilings"]
    grid = _grid(records)
    gluon, gluon_note = _gluon_times(results_path, t)
    for (b, s), us in gluon.items():
        if (b, s) in grid:
            grid[(b, s)][GLUON] = Record(name=GLUON, kind="design", model=dims.name, b=b, s=s, t=t, time_us=us)
    lines = [
        "# The regime guide on the H200",
        "",
        f"Generated by `python benchmarks/regimes.py {results_path.as_posix()}` — do not edit by hand.",
        "",
        *_guide(load_calibration(device="h200")),
        *_guide(load_calibration(device="h200"), tp=8),
        f"## The benchmark grid of `{results_path.name}` (commit {env['commit']}): measured history",
        "",
        "These rows are one run of the kernels of that commit, not today's where a kernel has changed since "
        "(the absorbed kernel has; the guide above uses today's). They rest on measurements only.",
        "",
        f"Device: {env['device']} · torch {env['torch']} · triton {env['triton']} · commit {env['commit']} · "
        f"{env['timestamp']}. Model {dims.name} (h={dims.h}, k={dims.k}, p={dims.p}, d={dims.d}), t = {t}, "
        f"{meta['spec']['dtype']}, causal for s > 1. Ceilings ({ceil['kind']}): {ceil['tflops']:.0f} TFLOP/s, "
        f"{ceil['gbs']:,.0f} GB/s. Times are medians in µs ({meta['timing']}).",
        "",
    ]
    flashmla = anchors["flash_mla_us"].get(str(t), {})
    backends = sorted({r.backend for r in records if r.name == "flash_mla" and r.status == "ok" and r.backend})
    lines += [f"The column {LABEL['flash_mla']!r} is the absorbed kernel the benchmark's default path ran "
              f"(backend: {', '.join(backends) or '?'}).", ""]
    if gluon_note:
        lines += [gluon_note, ""]
    for b in sorted({b for b, _ in grid}):
        names = [n for n in (*GRID_NAMES, *BASELINES) if any(n in grid[(b, s)] for bb, s in grid if bb == b)]
        lines += [f"## b = {b}", "",
                  "| s | " + " | ".join(LABEL[n] for n in names) + " | FlashMLA official (anchor) | fastest of ours | "
                  "fastest measured here | ours vs FlashMLA |",
                  "|---|" + "---|" * (len(names) + 4)]
        for s in sorted(s for bb, s in grid if bb == b):
            row = grid[(b, s)]
            cells = []
            for n in names:
                r = row.get(n)
                txt = _us(r.time_us if r else None)
                if r is not None and n == "mla_var6_plus" and r.n is not None:
                    txt += f" (n={r.n})"
                cells.append(txt)
            ours = {n: row[n].time_us for n in GRID_NAMES if n in row}
            everyone = {n: row[n].time_us for n in (*GRID_NAMES, *BASELINES) if n in row}
            best_ours = min(ours, key=ours.get) if ours else None
            best_all = min(everyone, key=everyone.get) if everyone else None
            anchor = flashmla.get(str(b), {}).get(str(s))
            ratio = f"{anchor / ours[best_ours]:.2f}x" if anchor and best_ours else "–"
            lines.append(f"| {s} | " + " | ".join(cells) + f" | {_us(anchor)} | {LABEL.get(best_ours, '–')} | "
                         f"{LABEL.get(best_all, '–')} | {ratio} |")
        lines.append("")

    device = get_device(meta["device_key"])
    measured_x = crossovers(records, "flash_mla", "flash_attention")
    gluon_records = [row[GLUON] for row in grid.values() if GLUON in row]
    gluon_x = crossovers(records + gluon_records, GLUON, "flash_attention") if gluon_records else {}

    def where(s_x):
        return "–" if s_x is None else f"s ≈ {s_x:.1f}"

    cal = load_calibration(device=device.key)
    lines += ["## Crossover: where FlashAttention overtakes FlashMLA", "",
              "| b | measured, grid's absorbed kernel | measured, check run's absorbed kernel | calibrated model | "
              "roofline (shared-RoPE-key bytes), measured ceilings | same, datasheet ceilings |",
              "|---|---|---|---|---|---|"]
    for b, s_x in sorted(measured_x.items()):
        m_meas = crossover_s(dims, b, t, device, ceilings="measured", fast="flash_attention_shared_kpe")
        m_data = crossover_s(dims, b, t, device, ceilings="datasheet", fast="flash_attention_shared_kpe")
        m_cal = calibrated_crossover_s(cal, dims, b, t, device)
        lines.append(f"| {b} | {where(s_x)} | {where(gluon_x.get(b))} | s = {m_cal} | s = {m_meas} | s = {m_data} |")
    lines += ["", "The measured crossover depends on how close each kernel is to its ceiling: with an absorbed "
              "kernel slower than FlashMLA, or an expanded kernel above its copy-bandwidth bound (ours reads the "
              "RoPE key once per token), it moves away from the model's.", ""]

    sweep = [r for r in records if r.status == "ok" and r.extra.get("sweep") == "n"]
    if sweep:
        lines += ["## The hybrid's split n at s = 16", "",
                  "| b | measured best n | its time (µs) | roofline's best n | time at the roofline's n (µs) | calibrated "
                  "best n | its calibrated time (µs) |", "|---|---|---|---|---|---|---|"]
        for b in sorted({r.b for r in sweep}):
            pts = sorted((r for r in sweep if r.b == b), key=lambda r: r.n)
            best = min(pts, key=lambda r: r.time_us)
            model_n = pts[0].extra.get("model_best_n")
            at_model = next((r.time_us for r in pts if r.n == model_n), None)
            n_c, p_c = calibrated_split(cal, dims, Problem(b=b, s=16, t=t), device)
            lines.append(f"| {b} | {best.n} | {_us(best.time_us)} | {model_n} | {_us(at_model)} | {n_c} | "
                         f"{_us(p_c.time_s * 1e6)} |")
        lines.append("")
        lines += ["Swept n: " + ", ".join(str(r.n) for r in sorted((r for r in sweep if r.b == min(r.b for r in sweep)),
                                                                   key=lambda r: r.n)), ""]

    lines += _dispatcher_check(results_path, dims, device)
    lines += _repeatability(results_path, meta, records)
    seed = anchors["seed_rtx5090_us"]
    lines += ["## History: the seed's table (RTX 5090, b = 32, t = 4096)", "", seed["_source"][0].upper() + seed["_source"][1:] + ".", "",
              "| s | FlashMLA | FlashAttention | MLAvar6+ (best) |", "|---|---|---|---|"]
    for s in ("1", "16"):
        lines.append(f"| {s} | {seed[s]['flash_mla']:,} | {seed[s]['flash_attention']:,} | {seed[s]['mla_var6_plus']:,} |")
    lines += ["", "On the seed's GPU the crossover was s = 16–32 and MLAvar6+ won at s = 16 by 14 %. "
              "The tables above say what holds on this device with this project's kernels.", ""]
    return "\n".join(lines)


def render_guide(device: str) -> str:
    """The guide alone (TP 1 and TP 8) on a device with a shipped calibration and no benchmark grid."""
    cal = load_calibration(device=device)
    if cal is None or not cal.gpu:
        raise SystemExit(f"no shipped GPU calibration for {device!r}: the guide needs one")
    name = get_device(device).name
    return "\n".join([
        f"# The regime guide on the {name}",
        "",
        f"Generated by `python benchmarks/regimes.py --device {device}` — do not edit by hand. The measured cells "
        f"are the calibration run's own calls (`mla-var3 calibrate` on this GPU); its held-out checks are under "
        f"`benchmarks/results/{device.split('-')[0]}/`.",
        "",
        *_guide(cal),
        *_guide(cal, tp=8),
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="?", help="results.json written by mla-var3 bench (the H200's guide)")
    ap.add_argument("--device", default="h200",
                    help="another device with a shipped calibration: its guide alone, no results file (default h200)")
    ap.add_argument("--out", type=Path, default=None, help="default docs/regimes.md (docs/regimes-<device>.md)")
    ap.add_argument("--print", action="store_true", help="write the guide to stdout instead of --out")
    args = ap.parse_args()
    if args.device == "h200":
        if args.results is None:
            ap.error("the H200's guide takes the results.json of its benchmark grid")
        text, out = render(args.results), args.out or Path("docs/regimes.md")
    else:
        if args.results is not None:
            ap.error(f"--device {args.device}: the guide alone, no results file")
        text, out = render_guide(args.device), args.out or Path(f"docs/regimes-{args.device}.md")
    args.out = out
    if args.print:
        sys.stdout.write(text)
        return 0
    args.out.write_text(text)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

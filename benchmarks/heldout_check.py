"""The regime guide against held-out measurements on this GPU: predictions first, then timings, then the bar.

    python benchmarks/heldout_check.py --out results/h200/heldout-<commit> [--shapes FILE] [--flash-mla DIR]
    python benchmarks/heldout_check.py --calibrate --out DIR ...   # calibrate this GPU first, predict with that
    python benchmarks/heldout_check.py --compare results/h200/heldout-<commit>   # the table again, no GPU
    python benchmarks/heldout_check.py --dry-run --out DIR                       # the plumbing on a CPU

1. **Predictions, written before anything is timed**: ``mla-var3 explain --json`` for every
   (heads, b, s, t) of the shapes (the guide's pick, each design's calibrated kernel time), in
   ``predicted-before-the-run.json``, with the calibration's label.
2. **Timings**: ``mla-var3 bench --no-n-sweep --baselines`` per (heads, b, t) over its s list, in
   ``<tag>/results.json`` (each design's default call and the baselines interleaved: CUDA-graph,
   eager and host time; official FlashMLA when ``--flash-mla`` holds it).
3. **The bar** (``compared.json``, ``summary.md``; exit status 1 when a point misses): each
   default call's calibrated ÷ measured GPU and eager time (``calibration_fit.compare`` with the
   calibration the predictions used) within [0.85, 1.15] for the absorbed and expanded designs
   and [0.8, 1.25] for the hybrid, and the pick's measured eager time within 5 % of the fastest
   design's. Beside each eager ratio, the eager law alone at the call's measured GPU and host
   time ÷ the measured eager time (``law_at_measured``): it tells a miss of the law from a miss of
   the host or GPU time it is given.

With ``--calibrate`` the run starts with ``mla-var3 calibrate`` on this GPU (``DIR/calibrate.json``,
its log in ``DIR/calibrate.log``) and predicts with that file: the whole bar in one command on a
machine that has no calibration of the commit yet. The file is what gets committed and shipped
(``benchmarks/calibration_h200.py``); ``--compare DIR`` then scores the same timings with the shipped
file, or with the run's own when none is given (a calibration path in the predictions that is
relative is read from the run's folder). Scored with a ``--calibration``, the outcome is written
beside the run's own (``compared-<stem>.json``, ``summary-<stem>.md``), which stays as it was.

Shapes (``--shapes``): one ``heads b s[,s...] t`` per line, ``#`` comments; the default is the set
below, the edges of the guide's range (b = 2 to 224, t = 1k to 60k, TP 2 to 8) and where the
expanded design and the hybrid compete, none of them a point of ``mla-var3 calibrate``'s grid nor
of an earlier held-out run (:data:`USED_SHAPES`: the set of the H200 run at f3eeb86, after which
the eager law's fit was changed, so its points no longer count as held out).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import environment, stop_on_sigterm, write_json

from mla_var3.analysis.calibration import eager_time_s, load_calibration
from mla_var3.analysis.calibration_fit import compare, points_from_results
from mla_var3.cli import main as cli
from mla_var3.shapes import Problem

#: heads, b, s list, t
DEFAULT_SHAPES = """\
128 2 2,8 61440
128 224 1 1152
128 3 1,64 1280
128 80 1,4 5120
128 16 1,8 20480
16 64 1,2 12288
32 24 1,4 8192
64 6 1,16 24576
128 6 96,256 2560
"""
#: sets an earlier held-out run measured (heldout-f3eeb86 on the H200, heldout-4e5c4b4 on the H100)
USED_SHAPES = """\
128 1 1,4 65536
128 256 1,2 1024
128 2 1,32 1024
128 128 1 3072
128 12 1,16 28672
16 96 1,4 16384
64 8 2 49152
128 4 64,128 2048
128 48 24,48 3072
32 40 8 6144
"""
#: calibrated ÷ measured bounds per design (the guide's bar)
BOUNDS = {"flash_mla": (0.85, 1.15), "flash_attention": (0.85, 1.15), "mla_var6_plus": (0.8, 1.25)}
#: explain's design names -> the kernel a bench record names
KERNEL = {"absorbed": "flash_mla", "expanded": "flash_attention", "hybrid": "mla_var6_plus"}
#: the pick's measured eager time may exceed the fastest design's by this fraction
PICK_SLACK = 0.05
PREDICTIONS = "predicted-before-the-run.json"


def parse_shapes(text: str) -> list[tuple[int, int, tuple[int, ...], int]]:
    """``heads b s[,s...] t`` lines (``#`` comments, blank lines skipped) -> (h, b, (s, ...), t)."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            h, b, s, t = int(parts[0]), int(parts[1]), tuple(int(x) for x in parts[2].split(",")), int(parts[3])
        except (IndexError, ValueError):
            raise SystemExit(f"shapes line {i}: expected 'heads b s[,s...] t', got {line!r}") from None
        if len(parts) != 4 or min(h, b, t, *s) < 1 or max(s) > t:
            raise SystemExit(f"shapes line {i}: expected 'heads b s[,s...] t' with 1 <= s <= t, got {line!r}")
        out.append((h, b, s, t))
    return out


def seen_before(shapes) -> list[tuple[int, int, tuple[int, ...], int]]:
    """The points of ``shapes`` an earlier held-out run measured (:data:`USED_SHAPES`), by shape."""
    used = {(h, b, s, t) for h, b, ss, t in parse_shapes(USED_SHAPES) for s in ss}
    out = []
    for h, b, ss, t in shapes:
        hit = tuple(s for s in ss if (h, b, s, t) in used)
        if hit:
            out.append((h, b, hit, t))
    return out


def tag(h: int, b: int, t: int) -> str:
    return f"h{h}-b{b}-t{t}"


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``mla-var3 argv`` in this process: (status, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli(argv)
    return code, buf.getvalue()


def predict_all(shapes, device: str, calibration: str | None) -> list[dict]:
    """``explain --json`` for every point of ``shapes``."""
    extra = ["--calibration", calibration] if calibration else []
    rows = []
    for h, b, ss, t in shapes:
        for s in ss:
            code, out = run_cli(["explain", "--json", "--device", device, "--h", str(h), "--b", str(b), "--s", str(s),
                                 "--t", str(t), *extra])
            if code:
                raise SystemExit(f"explain failed for h={h} b={b} s={s} t={t} (status {code})")
            rows.append({"h": h, "b": b, "s": s, "t": t, "explain": json.loads(out)})
    return rows


def bench_all(shapes, out: Path, *, max_seconds: float, interpret: bool, flash_mla: str | None) -> None:
    """``mla-var3 bench`` per (h, b, t) over its s list, each in its own process (a shape that
    crashes does not end the run; ``--interpret`` must set up Triton before it is imported) into
    ``out/<tag>/``, its output in ``out/<tag>.log``."""
    env = dict(os.environ)
    if flash_mla:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [flash_mla, env.get("PYTHONPATH")]))
    for i, (h, b, ss, t) in enumerate(shapes, 1):
        argv = [sys.executable, "-m", "mla_var3", "bench", "--no-n-sweep", "--baselines", "--no-progress",
                "--max-seconds", str(max_seconds), "--out", str(out / tag(h, b, t)),
                "--h", str(h), "--b", str(b), "--s", ",".join(map(str, ss)), "--t", str(t)]
        argv += ["--interpret"] if interpret else []
        t0 = time.perf_counter()
        with open(out / f"{tag(h, b, t)}.log", "w") as log:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        print(f"[{i}/{len(shapes)}] {tag(h, b, t)} s={','.join(map(str, ss))}: bench status {code} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


def check(out: Path, calibration: str | None = None) -> dict:
    """The bar over the run in ``out``: every prediction's ratio, every pick, and the misses."""
    predicted = json.loads((out / PREDICTIONS).read_text())
    device = predicted["device"]
    recorded = predicted.get("calibration_path")
    if not calibration and recorded:
        calibration = str(out / recorded) if not Path(recorded).is_absolute() else recorded
    cal = load_calibration(calibration or None, device=device)
    ratios = []
    calls = {}          # (heads, b, s, t) -> design name -> its measured eager, GPU and host µs
    for res in sorted(out.glob("*/results.json")):
        ratios += compare(cal, points_from_results(res, f"{res.parent.name}/results.json"))
        data = json.loads(res.read_text())
        h = data["meta"]["dims"]["h"]
        for rec in data["records"]:
            extra = rec.get("extra") or {}
            if rec.get("kind") == "design" and rec.get("status") == "ok" and extra.get("eager_us"):
                calls.setdefault((h, rec["b"], rec["s"], rec["t"]), {})[rec["name"]] = {
                    "eager_us": extra["eager_us"], "gpu_us": rec.get("time_us"), "host_us": extra.get("host_us")}
    for r in ratios:
        lo, hi = BOUNDS[r["design"]]
        r["in_bounds"] = lo <= r["ratio"] <= hi
        call = calls.get((r["h"], r["b"], r["s"], r["t"]), {}).get(r["design"]) if r["kind"] == "eager" else None
        if call and call["gpu_us"] and call["host_us"] and cal is not None:   # the eager law alone, at the measured times
            law = eager_time_s(cal, r["design"], r["backend"], Problem(b=r["b"], s=r["s"], t=r["t"], n=r["n"]),
                               call["gpu_us"] * 1e-6, call["host_us"] * 1e-6) * 1e6
            r["law_at_measured"] = law / r["measured_us"]
    picks = []
    for p in predicted["points"]:
        times = {name: c["eager_us"] for name, c in calls.get((p["h"], p["b"], p["s"], p["t"]), {}).items()}
        pick = KERNEL[p["explain"]["design"]]
        if pick not in times:
            picks.append({**{k: p[k] for k in "hbst"}, "pick": pick, "ok": None, "why": "the pick was not measured"})
            continue
        fastest = min(times, key=times.get)
        picks.append({**{k: p[k] for k in "hbst"}, "pick": pick, "pick_us": times[pick], "fastest": fastest,
                      "fastest_us": times[fastest], "ok": times[pick] <= (1 + PICK_SLACK) * times[fastest]})
    misses = [r for r in ratios if not r["in_bounds"]] + [p for p in picks if p["ok"] is False]
    return {"device": device, "calibration": cal.label if cal else None, "ratios": ratios, "picks": picks,
            "in_bounds": sum(r["in_bounds"] for r in ratios), "predictions": len(ratios),
            "picks_ok": sum(bool(p["ok"]) for p in picks), "picks_measured": sum(p["ok"] is not None for p in picks),
            "misses": len(misses)}


def summary(result: dict) -> str:
    lines = [f"# Held-out check on {result['device']}", "", f"Calibration: {result['calibration']}", "",
             f"- predictions within bounds: {result['in_bounds']} of {result['predictions']}",
             f"- picks within {PICK_SLACK:.0%} of the fastest measured design (eager): {result['picks_ok']} of "
             f"{result['picks_measured']} measured", "",
             "The last column (eager rows): the eager law alone, at the call's measured GPU and host time, "
             "÷ the measured eager time; far from the ratio, the miss is the host time's or the GPU time's "
             "prediction, not the law's.", "",
             "| design | heads | b | s | t | n | kind | measured µs | predicted µs | ratio | | law at measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["ratios"]:
        law = f"{r['law_at_measured']:.3f}" if r.get("law_at_measured") is not None else "-"
        lines.append(f"| {r['design']} | {r['h']} | {r['b']} | {r['s']} | {r['t']} | {r['n'] if r['n'] is not None else '-'}"
                     f" | {r['kind']} | {r['measured_us']:,.1f} | {r['predicted_us']:,.1f} | {r['ratio']:.3f} | "
                     f"{'' if r['in_bounds'] else 'miss'} | {law} |")
    lines += ["", "| heads | b | s | t | pick | its eager µs | fastest | its eager µs | |", "|---|---|---|---|---|---|---|---|---|"]
    for p in result["picks"]:
        if p["ok"] is None:
            lines.append(f"| {p['h']} | {p['b']} | {p['s']} | {p['t']} | {p['pick']} | - | - | - | {p['why']} |")
        else:
            lines.append(f"| {p['h']} | {p['b']} | {p['s']} | {p['t']} | {p['pick']} | {p['pick_us']:,.1f} | "
                         f"{p['fastest']} | {p['fastest_us']:,.1f} | {'' if p['ok'] else 'miss'} |")
    return "\n".join(lines) + "\n"


def finish(out: Path, calibration: str | None, *, rescore: bool = False) -> int:
    """Score the run in ``out`` and write the outcome: ``compared.json`` and ``summary.md``, the
    run's own; with ``rescore`` (``--compare`` with another ``--calibration``) beside them as
    ``compared-<calibration's stem>.json`` and ``summary-<stem>.md``, the run's own left as they
    were."""
    result = check(out, calibration)
    tail = f"-{Path(calibration).stem}" if rescore else ""
    write_json(out / f"compared{tail}.json", result)
    text = summary(result)
    (out / f"summary{tail}.md").write_text(text)
    print(text)
    if rescore:
        print(f"scored with {calibration}: {out / f'compared{tail}.json'}, {out / f'summary{tail}.md'} (the run's "
              f"own compared.json and summary.md are unchanged)")
    return 1 if result["misses"] else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder of the run (predictions, one bench folder per shape, the comparison)")
    ap.add_argument("--compare", metavar="DIR", help="compare a finished run again (no GPU) and stop")
    ap.add_argument("--shapes", help="file of 'heads b s[,s...] t' lines (default: the set in this script's docstring)")
    ap.add_argument("--device", help="device key the predictions ask about (default: the GPU's, see mla-var3 devices)")
    ap.add_argument("--calibration", help="calibration file (default: the one shipped for the device)")
    ap.add_argument("--calibrate", action="store_true",
                    help="run mla-var3 calibrate on this GPU first (DIR/calibrate.json) and predict with it")
    ap.add_argument("--flash-mla", default=None, help="folder holding the official flash_mla package (a baseline)")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="time budget of each shape's bench (default 60)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: one tiny shape, bench under the Triton interpreter")
    args = ap.parse_args(argv)
    if args.compare:
        return finish(Path(args.compare), args.calibration, rescore=bool(args.calibration))
    if not args.out:
        ap.error("--out is required (or --compare DIR)")
    if args.calibrate and (args.dry_run or args.calibration):
        ap.error("--calibrate makes the run's own calibration on a GPU: not with --dry-run or --calibration")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2

    out = Path(args.out)
    if (out / PREDICTIONS).exists():
        print(f"{out / PREDICTIONS} exists: a run's predictions are written once (use --compare, or another --out)",
              file=sys.stderr)
        return 2
    stop_on_sigterm()
    shapes = parse_shapes(Path(args.shapes).read_text() if args.shapes else
                          "16 1 1 64\n" if args.dry_run else DEFAULT_SHAPES)
    for h, b, ss, t in seen_before(shapes):
        print(f"note: heads {h}, b {b}, t {t} (s {','.join(map(str, ss))}) was measured by an earlier held-out "
              f"run (USED_SHAPES): not held out for a fit made after it", file=sys.stderr)
    if args.device:
        device = args.device
    elif args.dry_run:
        device = "h200"
    else:
        from mla_var3.analysis.devices import detect_device

        device = detect_device()[0].key
    out.mkdir(parents=True, exist_ok=True)
    recorded = args.calibration
    if args.calibrate:
        t0 = time.perf_counter()
        with open(out / "calibrate.log", "w") as log:
            code = subprocess.run([sys.executable, "-m", "mla_var3", "calibrate", "--out", str(out / "calibrate.json")],
                                  stdout=log, stderr=subprocess.STDOUT).returncode
        if code or not (out / "calibrate.json").is_file():
            print(f"mla-var3 calibrate failed (status {code}; {out / 'calibrate.log'})", file=sys.stderr)
            return 1
        print(f"calibrated this GPU in {time.perf_counter() - t0:.0f} s: {out / 'calibrate.json'}", flush=True)
        args.calibration, recorded = str(out / "calibrate.json"), "calibrate.json"
    points = predict_all(shapes, device, args.calibration)
    write_json(out / PREDICTIONS, {"device": device, "calibration_path": recorded,
                                   "environment": environment(), "points": points})
    print(f"predictions for {len(points)} points written to {out / PREDICTIONS} before any timing", flush=True)
    try:
        bench_all(shapes, out, max_seconds=args.max_seconds, interpret=args.dry_run, flash_mla=args.flash_mla)
    except KeyboardInterrupt:
        print("stopped: comparing the shapes timed so far", flush=True)
    return finish(out, args.calibration)


if __name__ == "__main__":
    sys.exit(main())

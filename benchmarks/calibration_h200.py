"""Fit the shipped calibrations from committed measurements (no GPU needed).

    python benchmarks/calibration_h200.py            # writes src/mla_var3/conf/calibration-h200.json,
                                                     # calibration-rtx-5090-seed.json and calibration-h100-sxm.json,
                                                     # prints the tables
    python benchmarks/calibration_h200.py --check    # fit and compare only, write nothing
    python benchmarks/calibration_h200.py --stamp-kernels   # also record today's kernel files (sha256)
    python benchmarks/calibration_h200.py --points-json PATH   # only the points it ships, as JSON

H200: every committed timing of a *default* call's kernel at the current code becomes a
:class:`~mla_var3.analysis.calibration_fit.Point` with its file as source. The absorbed kernel
(the seesaw with decode plans, 6a41daa) is fitted to the dense ``flash_mla`` rows of the serving
run (``results/h200/serving/serving-6a41daa.json``: CUDA-graph, eager and host time per point);
the expanded kernels and the portable hybrid to their CUDA-graph times, their host costs to the
side-by-side anchor run (``results/h200/anchors-eager-8a6fad7.json``). A held-out check fits the
same way on part of the points and compares with the rest (:func:`held_out`: b = 8, 16, 64, half
the t other than 4096 including t = 32768, prefill). Points of older kernels (seesaw v4 at
a17a668, v6 before the decode plan, the absorbed anchors of 8a6fad7) and the paged compat call
are compared, never fitted.

A run of ``mla-var3 calibrate`` on an H200, committed under ``results/h200/calibrate/`` (named
``calibrate-<date>-<commit>.json``, the date with its time, ``2026-12-03T1144``, for a second run
on one day; the last name wins), is shipped as it is instead: it timed
today's default calls (at 128 heads and at 16-64), fitted them on top of the committed-measurement
fit that was shipped when it ran, and records the kernel files it timed. The tables below then
compare it with every committed point too.

The H200 file's ``kernels`` block (the commit and the sha256 of each kernel file it describes,
``analysis.calibration.KERNEL_FILES``; a CPU test fails when one of them changes) is carried over
from the shipped file as it is: a re-fit from committed measurements does not measure today's
kernels. ``--stamp-kernels`` records the files as they are now, with the commit checked out; only
for measurements of that code (``mla-var3 calibrate`` writes its own).

H100: the committed ``mla-var3 calibrate`` run (:data:`H100_RUN`), refitted from its own points
by today's fit: no shipped calibration to start from, so parameters its fit runs to a bound are
held at their priors.

RTX 5090: the seed's six numbers alone (``anchors_h200.json`` "seed_rtx5090_us"), the seed's
kernels as backend ``seed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mla_var3.analysis.calibration import (  # noqa: E402
    Calibration, Parameter, kernel_hashes, load_calibration, predict, save_calibration, stale_kernels,
)
from mla_var3.analysis.calibration_fit import Point, compare, fit, points_from_results  # noqa: E402
from mla_var3.analysis.devices import get_device  # noqa: E402
from mla_var3.analysis.kernel_laws import HYBRID_PARTITION_MAX_S, spec_of  # noqa: E402
from mla_var3.analysis.cost import decompress  # noqa: E402
from mla_var3.shapes import Problem, get_preset  # noqa: E402

RES = ROOT / "benchmarks" / "results" / "h200"
CONF = ROOT / "src" / "mla_var3" / "conf"
V3 = get_preset("deepseek-v3")

#: what a default call runs on sm_90 today (kernel.backends and kernel.expanded.GLUON_MIN_S).
H200_DEFAULTS = {
    "flash_mla": [{"backend": "gluon"}],
    "flash_attention": [{"backend": "gluon", "s_gt": 64}, {"backend": "triton"}],
    "mla_var6_plus": [{"backend": "gluon"}],
}
VERSIONS = {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}


def _load(name: str) -> dict:
    return json.loads((RES / name).read_text())


def _check_points(name: str, commit: str, key: str = "see_us") -> list[Point]:
    """The seesaw check runs (gluon_flash_mla_check.py): default splits only."""
    out = []
    for r in _load(name)["timings"]:
        if r.get(key) and r["num_splits"] is None:
            out.append(Point("flash_mla", "gluon", r["b"], r["s"], r["t"], causal=bool(r["causal"]), gpu_us=r[key],
                             source=f"{name} ({commit})"))
    return out


#: a hybrid call with n = 0 timed before the default call at n = 0 became the absorbed kernel (compared only).
N0 = ("the hybrid's own latent kernel at n = 0, an older path: the default call with no window now runs the "
      "absorbed kernel")

#: what marks a point of an older absorbed kernel (compared, never fitted).
V6 = "seesaw v6, before the decode plan (splits by choose_num_splits) and the fp32 row sum of 6a41daa"
SERVING = "serving/serving-6a41daa.json"


def serving_points() -> tuple[list[Point], list[Point]]:
    """(the dense ``flash_mla`` rows: fitted, the paged compat call's uniform rows: compared only)
    of the serving run: b = 32, 64 x s = 1 ... 32, t = 4096, causal for s > 1."""
    data = _load(SERVING)
    src = f"{SERVING} ({data['env']['commit']})"
    dense, compat = [], []
    for r in data["times"]:
        if r["kind"] != "uniform":
            continue
        for key, out, note in (("dense", dense, ""), ("compat", compat, "the paged FlashMLA-compatible call")):
            m = r.get(key)
            if m:
                out.append(Point("flash_mla", "gluon", r["b"], r["s"], r["t_max"], causal=r["s"] > 1,
                                 gpu_us=m["graph_us"], eager_us=m["eager_us"], host_us=m["host_us"],
                                 source=src + ("" if key == "dense" else " [compat]"), note=note))
    return dense, compat


#: the sm_90 hybrid's runs (benchmarks/hybrid_check.py --suite partition, once hybrid_partition.py): t = 4096,
#: decompression included; b = 32 (and 64)
PARTITION_RUNS = ("hybrid/partition-a147d5b.json", "hybrid/partition-01d2b76.json", "hybrid/programs-s32-01c5255.json",
                  "hybrid/programs-s16-01c5255.json", "hybrid/b64-s32-518ebad.json")


def partition_points() -> list[Point]:
    """The sm_90 hybrid's default path, per (run, s, n), the decompression measured in the same run
    taken off: for s <= HYBRID_PARTITION_MAX_S the best of the window partitions tried (the default's programs,
    ``default_programs``, were within 3 % of the best where both ran: docs/kernels/mla-var6-plus/partition.md,
    "Sizing the default partition"), above it the two streams (the default there)."""
    out = []
    for name in PARTITION_RUNS:
        data = _load(name)
        commit = data["info"]["commit"]
        dec = {r["s"]: r["us"] for r in data["rows"] if r.get("impl") == "decompress" and r.get("us")}
        best: dict[tuple[int, int], dict] = {}
        for r in data["rows"]:
            if r.get("part") != "hybrid" or not r.get("us") or r["s"] not in dec:
                continue
            partition = isinstance(r["programs"], int) and r["programs"] > 0
            if partition != (r["s"] <= HYBRID_PARTITION_MAX_S) or ("01d2b76" in name and not partition):
                continue        # 01d2b76's "two streams" row timed the default partition (fixed at 3f9d11d)
            key = (r["s"], r["n"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
        for (s, n), r in sorted(best.items()):
            how = (f"best of {r['programs']} window programs and the others tried" if s <= HYBRID_PARTITION_MAX_S
                   else "two streams")
            out.append(Point("mla_var6_plus", "gluon", r["b"], s, r["t"], n=n, gpu_us=r["us"] - dec[s],
                             source=f"{name} ({commit})",
                             note=f"{how}; decompression {dec[s]:.1f} us (same run) taken off"))
    return out


def h200_points() -> tuple[list[Point], list[Point]]:
    """(points of today's kernels, points of older kernels and other calls: compared only)."""
    dense, compat = serving_points()
    pts: list[Point] = list(dense) + partition_points()
    old: list[Point] = list(compat)
    # absorbed, seesaw v6 (CUDA-graph replays): an older kernel
    for name, commit in (("gluon_flash_mla_check.json", "c289878"), ("seesaw/v6-rerun-bcf7d56-check.json", "bcf7d56"),
                         ("seesaw/v6-ab-check.json", "v6 in the v8 A/B run"),
                         ("seesaw/v6-quick-check.json", "c289878")):
        old += [Point(**{**p.__dict__, "note": V6}) for p in _check_points(name, commit)]
    src = "hybrid_check.json (2590efd)"
    for r in _load("hybrid_check.json")["grid"] + _load("hybrid_check.json")["sweep"]:
        lab, b, s, n, us = r["label"], r["b"], r["s"], r["n"], r["us"]
        if lab == "absorbed (gluon) alone" and r in _load("hybrid_check.json")["grid"]:
            old.append(Point("flash_mla", "gluon", b, s, 4096, gpu_us=us, source=src, note=V6))
        elif lab == "latent part alone":      # the Gluon absorbed kernel over the o old keys, not causal
            old.append(Point("flash_mla", "gluon", b, s, 4096 - n, causal=False, gpu_us=us, source=src,
                             note=V6 + "; the hybrid's latent part alone: the absorbed kernel over o = t - n keys"))
        elif lab == "expanded part alone":    # the portable expanded kernel over the n newest keys
            pts.append(Point("flash_attention", "triton", b, s, n, gpu_us=us, source=src,
                             note="the hybrid's expanded part alone: t = n keys"))
        elif lab == "expanded alone" and r in _load("hybrid_check.json")["grid"]:
            pts.append(Point("flash_attention", "triton", b, s, 4096, gpu_us=us, source=src))
        elif lab == "hybrid overlapped" and r in _load("hybrid_check.json")["grid"]:
            note = N0 if not n else "the default call (portable path since c422feb)"
            (old if not n else pts).append(Point("mla_var6_plus", "triton", b, s, 4096, n=n, gpu_us=us, source=src,
                                                 note=note))
    # bench grids (results.json records)
    for name in ("results.json", "grid-041b365/results.json", "repeat-b32-041b365.json",
                 "dispatch_check/n_sweep_default_path-dc278ef.json"):
        # 041b365 recorded no backend: every design ran its portable kernel there (the bench passed
        # explicit portable configs, docs/kernels/flash-mla/first-kernels.md, "GPU runs")
        for p in points_from_results(RES / name, name, backends=dict.fromkeys(("flash_mla", "flash_attention", "mla_var6_plus"), "triton")):
            if p.design == "flash_mla" and name == "results.json":
                old.append(Point(**{**p.__dict__, "note": "seesaw v4 (a17a668), an older kernel"}))
                continue
            if (p.design, p.backend) == ("flash_mla", "gluon"):
                old.append(Point(**{**p.__dict__, "note": V6}))
                continue
            if p.design == "mla_var6_plus" and not p.n:
                old.append(Point(**{**p.__dict__, "note": N0}))
                continue
            pts.append(p)
    # expanded kernels, check scripts (CUDA-graph replays)
    for name, commit in (("gluon_expanded_check.json", "8c9fbd8"), ("gluon_expanded/run1-55d378d.json", "55d378d")):
        for r in _load(name)["rows"]:
            if r["impl"] == "gluon_n128s2" and r["s"] > 64:
                pts.append(Point("flash_attention", "gluon", r["b"], r["s"], r["t"], gpu_us=r["us"], source=f"{name} ({commit})"))
            elif r["impl"] in ("triton_m16n64w4s2", "triton_m64n64w4s2", "triton_m128n64w8s3k1"):
                pts.append(Point("flash_attention", "triton", r["b"], r["s"], r["t"], gpu_us=r["us"], source=f"{name} ({commit})"))
    return pts, old


def anchor_points() -> list[Point]:
    """The eager anchors (8a6fad7), the hybrid's with the output decompression taken off."""
    path = RES / "anchors-eager-8a6fad7.json"
    out = []
    # the decompression measured beside the hybrid check: absorbed + decompress 987.95 us vs absorbed alone
    # 953.9 us at b = 32, s = 16 (hybrid_check.json); scaled to other s by the decompression's bytes
    hc = _load("hybrid_check.json")
    dec16 = hc["headline"][1]["us"] - [r for r in hc["sweep"] if r["label"] == "absorbed (gluon) alone"][0]["us"]
    for p in points_from_results(path, "anchors-eager-8a6fad7.json"):
        raw = json.loads(path.read_text())["records"]
        rec = next(r for r in raw if (r["name"], r["b"], r["s"], r["n"], r["time_us"]) == (p.design, p.b, p.s, p.n, p.eager_us))
        extra = rec["extra"]
        label = f"anchors-eager-8a6fad7.json (8a6fad7) [{extra['source']}]"
        if extra.get("includes_decompression"):
            scale = decompress(V3, Problem(b=p.b, s=p.s, t=p.t), accumulate=True).bytes / \
                decompress(V3, Problem(b=32, s=16, t=4096), accumulate=True).bytes
            dec = dec16 * scale
            p = Point(**{**p.__dict__, "eager_us": p.eager_us - dec,
                         "note": f"{extra['note']}; decompression {dec:.1f} us taken off (measured {dec16:.1f} us at s = 16, scaled by bytes)"})
        elif extra.get("derived"):
            p = Point(**{**p.__dict__, "note": extra["note"]})
        p = Point(**{**p.__dict__, "source": label})
        out.append(p)
    return out


def fitted_anchors(anchors: list[Point]) -> list[Point]:
    """The eager anchors the fit uses: not the host-table run (it only enters the derived host
    time), not the absorbed call (its kernel and host path changed since 8a6fad7: compared only)."""
    return [p for p in anchors if "host-table" not in p.source and p.design != "flash_mla"]


def held_out(p: Point) -> bool:
    """The held-out split: b = 8, 16, 64; prefill (s = t); of the t other than 4096 every other one
    (t / 256 even: 512, 1024, ..., 32768 — the parts of the hybrid timed alone cover t = 256..3840);
    the host-table run (never fitted; its host times only enter the unsplit host time's derivation)."""
    return (p.b in (8, 16, 64) or p.s == p.t or "host-table" in p.source
            or (p.t != 4096 and (p.t // 256) % 2 == 0))


def host_base(anchors: list[Point]) -> dict[str, Parameter]:
    """The host time of the launchers that were never host-bound in the committed eager data (the
    expanded, the portable absorbed and the hybrid call): the absorbed call's unsplit host time at
    8a6fad7, a Python launcher of the same kind then. The side-by-side eager run cannot identify it
    (no unsplit call was host-bound there; b = 32, s = 2 bounds it at <= 133 us): the split call's
    host-bound eager time of that run x (unsplit / split host time in the host-table run). The
    absorbed call's own host time is fitted to the serving run's host times."""
    table = [p for p in anchors if "host-table" in p.source]
    split = statistics.median(p.host_us for p in table if p.s == 1 and p.b in (1, 32))
    unsplit = statistics.median(p.host_us for p in table if (p.b, p.s) in ((64, 1), (32, 4)))
    side = next(p for p in anchors if "side-by-side" in p.source and (p.b, p.s) == (32, 1)).eager_us
    value = side * unsplit / split
    src = (f"assumed equal to the absorbed call's unsplit host time at 8a6fad7 (a Python launcher of the same "
           f"kind; no committed eager call of this kernel is host-bound), derived: {side:.1f} us (host-bound split "
           f"call b = 32, s = 1 of the side-by-side run, anchors-eager-8a6fad7.json) x {unsplit:.1f} / {split:.1f} "
           f"(unsplit / split host time of the host-table run of the same commit)")
    return {f"{kernel}.host_us": Parameter(f"{kernel}.host_us", "us", value, src, "", False, "host")
            for kernel in ("flash_mla.triton", "flash_attention.triton", "flash_attention.gluon", "mla_var6_plus.triton",
                           "mla_var6_plus.gluon")}


#: absorbed-kernel parameters the serving run cannot identify, held at the values fitted to seesaw v6
#: (the shipped calibration before 6a41daa).
_V6_SOURCES = ("101 CUDA-graph times of seesaw v6 with its own splits: gluon_flash_mla_check.json (c289878), "
               "seesaw/v6-*-check.json (bcf7d56, c289878), hybrid_check.json (2590efd), "
               "n_sweep_default_path-dc278ef.json")
HELD = {
    "flash_mla.gluon.program_us": (9.2681, "every serving point has t = 4,096 (64 key blocks per program), where "
                                           "it is collinear with compute_efficiency; v6 covered t = 256 ... 32,768"),
    "flash_mla.gluon.combine_us_per_split": (0.3395, "one serving point splits (b = 32, s = 1, two items); v6's "
                                                     "small batches split up to 64 ways"),
}


#: the committed ``mla-var3 calibrate`` run on an H100 (SXM5), shipped as ``calibration-h100-sxm.json``
#: refitted from its own points by today's fit (:func:`kernels_that_ran`, no shipped base)
H100_RUN = RES.parent / "h100" / "calibrate" / "calibrate-h100-4db0e9c.json"


#: ``mla-var3 bench`` runs on an H200 at shapes no fit reads (issue 42's bar): compared, never fitted
#: (but for :data:`TAIL`)
HELD_OUT_DIRS = ("heldout-6c01f4b", "heldout-a3ebe94", "heldout-61474be")


#: the portable expanded kernel's per-program stream rate (its last wave of few programs): no
#: committed fit point has such a wave that DRAM does not hide, so it is held at the value fitted to
#: the held-out bench runs' calls that have one (which then no longer test it)
TAIL = {
    "flash_attention.triton.program_gbs_m16": (14.9, (
        "held at the value fitted (rms of the log ratio) to the 22 CUDA-graph times of the held-out bench runs "
        f"({', '.join(HELD_OUT_DIRS)}) whose last wave of programs streams below the copy rate (b5 s1/s8 t20480: "
        "640 programs, a last wave of 112, measured 1,928-1,942 us): 0.979-1.039 of their times, these calls no "
        "longer held out for it; no fitted point has such a wave")),
}


def held_parameters() -> dict[str, Parameter]:
    return {**{name: Parameter(name, "", value, f"held at the value fitted to {_V6_SOURCES}: {why}", "", False, "gpu")
               for name, (value, why) in HELD.items()},
            **{name: Parameter(name, "", value, why, "", False, "gpu") for name, (value, why) in TAIL.items()}}


def _base(extra: dict[str, Parameter]) -> Calibration:
    dev = get_device("h200")
    ceil = dev.ceilings("measured", 2)
    return Calibration("h200", dev.name, dev.sms, {"kind": ceil.kind, "flops_per_s": ceil.flops_per_s,
                       "bytes_per_s": ceil.bytes_per_s, "source": ceil.source}, extra, H200_DEFAULTS)


def fit_h200(points: list[Point], anchors: list[Point], all_anchors: list[Point]) -> Calibration:
    """Fit to ``points`` and the eager ``anchors`` (:func:`fitted_anchors`; the host-table run only
    sets the derived host time, from ``all_anchors``)."""
    fit_anchors = fitted_anchors(anchors)
    commits = sorted({c for p in points + fit_anchors for c in re.findall(r"\(([0-9a-f]{7})\)", p.source)})
    notes = ("Fitted by benchmarks/calibration_h200.py from committed H200 measurements (no GPU run of its own). "
             "GPU parameters: CUDA-graph times of the default calls' kernels (the absorbed kernel: the dense rows of "
             "the serving run at 6a41daa); host costs: the serving run's host times for the absorbed call, the "
             "eager times of the side-by-side anchor run (8a6fad7) for the others. Re-fit the host costs alone "
             "(fit(..., only={'host'})) when the host path changes, and everything when a kernel's speed does.")
    return fit(points + fit_anchors, base=_base({**host_base(all_anchors), **held_parameters()}), hold=set(HELD) | set(TAIL),
               default_backends=H200_DEFAULTS, versions=VERSIONS,
               commits={"measurements": commits}, notes=notes)


# ----------------------------------------------------------------------------------------------
# the RTX 5090 (seed)
# ----------------------------------------------------------------------------------------------

def seed_points() -> list[Point]:
    seed = json.loads((ROOT / "benchmarks" / "anchors_h200.json").read_text())["seed_rtx5090_us"]
    src = "anchors_h200.json seed_rtx5090_us (seed 000, RTX 5090)"
    out = []
    for s in ("1", "16"):
        row = seed[s]
        out.append(Point("flash_mla", "seed", 32, int(s), 4096, gpu_us=row["flash_mla"], source=src))
        out.append(Point("flash_attention", "seed", 32, int(s), 4096, gpu_us=row["flash_attention"], source=src))
        out.append(Point("mla_var6_plus", "seed", 32, int(s), 4096, gpu_us=row["mla_var6_plus"], best_n=True, source=src,
                         note="the seed's best version and n (V2 at s = 1, V3 at s = 16); n not given"))
    return out


def fit_5090() -> Calibration:
    notes = ("The seed's RTX 5090 table alone (b = 32, t = 4096, bf16, s = 1 and 16): the seed's kernels (not in this "
             "repository) as backend 'seed', assumed tiled as our portable kernels. Six numbers, so most parameters are "
             "held; not shipped as the rtx-5090 default (our kernels were never timed there).")
    return fit(seed_points(), device="rtx-5090", versions={}, commits={"measurements": ["seed 000"]}, notes=notes,
               default_backends={d: [{"backend": "seed"}] for d in ("flash_mla", "flash_attention", "mla_var6_plus")})


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{x:,.1f}"


def table(rows: list[dict], role_of=None) -> str:
    lines = ["| design | backend | b | s | t | n | kind | measured µs | calibrated µs | ÷ | split | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["design"], r["backend"], r["kind"], r["t"], r["b"], r["s"], r["n"] or 0)):
        ho = role_of(r) if role_of else ""
        n = ("best " if r["best_n"] else "") + (str(r["n"]) if r["n"] is not None else "–")
        lines.append(f"| {r['design']} | {r['backend']} | {r['b']} | {r['s']} | {r['t']} | {n} | {r['kind']} | "
                     f"{_fmt(r['measured_us'])} | {_fmt(r['predicted_us'])} | {r['ratio']:.2f} | {ho} | {r['source']} |")
    return "\n".join(lines)


def summary(rows: list[dict], label: str) -> str:
    out = []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["design"], r["backend"], r["kind"]), []).append(r["ratio"])
    for (d, b, k), ratios in sorted(groups.items()):
        rms = math.sqrt(sum(math.log(x) ** 2 for x in ratios) / len(ratios))
        out.append(f"| {label} | {d} | {b} | {k} | {len(ratios)} | {min(ratios):.2f} | {max(ratios):.2f} | {rms:.3f} |")
    return "\n".join(out)


def bar_table(cal: Calibration, pts: list[Point], anchors: list[Point], split: Calibration) -> str:
    """One row per (design, b, s) of the bar's grid: calibrated ÷ measured (median over runs) for
    the shipped fit and the held-out fit, GPU and eager."""
    lines = ["| design | b | s | measured GPU µs (runs) | ÷ shipped | ÷ held-out fit | measured eager µs | ÷ shipped | ÷ held-out fit |",
             "|---|---|---|---|---|---|---|---|---|"]
    for design, backend_of in (("flash_mla", lambda s: "gluon"), ("flash_attention", lambda s: "gluon" if s > 64 else "triton")):
        for b in (32, 64):
            for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
                bk = backend_of(s)
                g = [p for p in pts if (p.design, p.backend, p.b, p.s, p.t, p.n) == (design, bk, b, s, 4096, None)
                     and (p.causal or s == 1) and p.gpu_us]
                e = [p for p in pts + fitted_anchors(anchors) if (p.design, p.b, p.s, p.t) == (design, b, s, 4096)
                     and p.eager_us]
                if not g and not e:
                    continue
                cells = [design, str(b), str(s)]
                for kind, group in (("gpu", g), ("eager", e)):
                    if not group:
                        cells += ["–", "–", "–"]
                        continue
                    meas = statistics.median(p.gpu_us if kind == "gpu" else p.eager_us for p in group)
                    pb = Problem(b=b, s=s, t=4096, causal=group[0].causal)
                    r1 = predict(cal, design, V3, pb, backend=bk, eager=kind == "eager").time_s * 1e6 / meas
                    r2 = predict(split, design, V3, pb, backend=bk, eager=kind == "eager").time_s * 1e6 / meas
                    cells += [f"{_fmt(meas)} ({len(group)})", f"{r1:.2f}", f"{r2:.2f}"]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hybrid_bar_table(cal: Calibration, pts: list[Point], anchors: list[Point], split: Calibration) -> str:
    """Per (b, s): the hybrid's default call at every measured n, calibrated ÷ measured (range over
    the n and runs) for the shipped and the held-out fit."""
    lines = ["| b | s | measured n | kind | points | ÷ shipped (min–max) | ÷ held-out fit (min–max) |",
             "|---|---|---|---|---|---|---|"]
    every = [p for p in pts + fitted_anchors(anchors) if p.design == "mla_var6_plus" and p.t == 4096]
    for b, s in sorted({(p.b, p.s) for p in every}):
        group = [p for p in every if (p.b, p.s) == (b, s)]
        for kind in ("gpu", "eager"):
            r1 = [r["ratio"] for r in compare(cal, group) if r["kind"] == kind]
            r2 = [r["ratio"] for r in compare(split, group) if r["kind"] == kind]
            if not r1:
                continue
            ns = sorted({p.n for p in group if (p.gpu_us if kind == "gpu" else p.eager_us)})
            lines.append(f"| {b} | {s} | {', '.join(map(str, ns))} | {kind} | {len(r1)} | {min(r1):.2f}–{max(r1):.2f} | "
                         f"{min(r2):.2f}–{max(r2):.2f} |")
    return "\n".join(lines)


#: committed runs of ``mla-var3 calibrate`` on an H200 (the last by name is shipped)
RUN_DIR = RES / "calibrate"


def calibrate_run() -> Calibration | None:
    """The committed ``mla-var3 calibrate`` run to ship (the last file by name under
    :data:`RUN_DIR` that is a GPU calibration of the h200), or None."""
    runs = [load_calibration(p) for p in sorted(RUN_DIR.glob("*.json"))] if RUN_DIR.is_dir() else []
    runs = [r for r in runs if r.gpu and r.device == "h200"]
    return runs[-1] if runs else None


def _measured_by(change: dict, run: Calibration) -> bool:
    """Whether the run timed the code of ``change``: its commit is the run's or an ancestor, or the
    run's kernel files are the change's to the byte (a run of a working tree with the change not
    yet committed)."""
    files = (run.kernels or {}).get("files") or {}
    if change.get("files") and all(files.get(path) == digest for path, digest in change["files"].items()):
        return True
    commit = (run.kernels or {}).get("commit")
    if not commit:
        return False
    done = subprocess.run(["git", "merge-base", "--is-ancestor", change["commit"], commit], cwd=ROOT,
                          capture_output=True)
    return done.returncode == 0


def with_unmeasured(run: Calibration, shipped: Calibration) -> Calibration:
    """``run`` with the shipped file's record of kernel changes not re-measured since the run
    (``kernels["unmeasured"]``, kept by hand where host-only changes land); the records of changes
    the run itself timed (at or before its commit) are dropped."""
    kept = [c for c in (shipped.kernels or {}).get("unmeasured") or [] if not _measured_by(c, run)]
    if not kept:
        return dataclasses.replace(run, kernels={k: v for k, v in run.kernels.items() if k != "unmeasured"})
    return dataclasses.replace(run, kernels={**run.kernels, "unmeasured": kept})


def kernels_that_ran(run: Calibration, base: Calibration | None) -> Calibration:
    """``run`` with every point labelled with the kernel that ran it, refitted from its own points
    on ``base`` (``cli.calibrate.calibration_from_records``: the fit ``mla-var3 calibrate`` makes)
    where that changes anything: before fd82873 ``mla-var3 calibrate`` labelled the expanded
    design's calls at s <= 64 "gluon" (the backend registered for sm_90), where that backend runs
    the portable kernel; since the run the fit takes each launch path's host time as its lower
    quartile; and a law changed since the run fits its points to other values. Same
    measurements; the file's notes say what was refitted and why."""
    from mla_var3.cli.calibrate import calibration_from_records, records_of_points
    from mla_var3.kernel.hopper.expanded_gluon import GLUON_MIN_S
    from mla_var3.kernel.launchers import backend_that_ran

    def ran(p: dict) -> str:
        return backend_that_ran(p["design"], p["backend"], p["s"])
    relabel = any(ran(p) != p["backend"] for p in run.points)
    records = records_of_points(run.points, ran)
    when = re.search(r" at (\S+): \d+ default calls", run.notes)
    env = {**run.versions, "commit": run.commits["measurements"][0], "dirty": run.commits.get("dirty"),
           "device": run.device_name, "timestamp": when.group(1) if when else "?"}
    held = tuple(k for k in TAIL if k not in run.parameters) if base else ()
    again = calibration_from_records(records, env, get_device(run.device), gpu=True, shipped=base, hold=held)
    changed = {g: sorted(k for k, p in run.parameters.items() if p.fitted and p.group == g and k in again.parameters
                         and not math.isclose(again.parameters[k].value, p.value, rel_tol=1e-9))
               for g in ("host", "gpu")}
    # a parameter the laws gained after the run keeps its prior where a kernel file changed since the
    # run: its calls timed the code of its commit, which later changes may have replaced (n0_host_us:
    # the hybrid's n = 0 host path, replaced by 9855a32's fast path after the H200 run); a run of
    # today's kernels fits it from its points
    gained = sorted(k for k in again.parameters if k not in run.parameters and k not in held)
    added = gained if stale_kernels(run) else []
    fitted_new = [k for k in gained if k not in added]
    if added:
        again = again.with_parameters({k: dataclasses.replace(
            again.parameters[k], value=spec_of(k).prior, fitted=False,
            source=f"prior, not fitted: the law gained this parameter after the run ({run.kernels.get('commit')})")
            for k in added})
    if not relabel and not changed["host"] and not changed["gpu"] and not gained:
        return run
    why = []
    if relabel:
        why.append(f"the expanded calls at s <= {GLUON_MIN_S} labelled with the kernel that ran (the portable one; "
                   "the run labelled them gluon)")
    if changed["host"]:
        why.append("its host times taken as each launch path's lower quartile, as the fit takes them since the run")
    bounded = sorted(k for k, p in again.parameters.items() if p.group == "gpu" and "ran it to a bound" in p.source
                     and k in run.parameters and run.parameters[k].fitted)
    if bounded:
        why.append(f"the parameters its fit ran to a bound held at their priors, as a first fit holds them since the "
                   f"run: {', '.join(bounded)}")
        changed["gpu"] = [k for k in changed["gpu"] if k not in bounded]
    if changed["gpu"]:
        why.append(f"today's fit (its estimator and laws) gives these GPU parameters other values than the run's: "
                   f"{', '.join(changed['gpu'])}")
    if added:
        why.append(f"parameters the laws gained since the run, held at their priors: {', '.join(added)}")
    if fitted_new:
        why.append(f"parameters the laws gained since the run, fitted from its points (it timed today's kernel "
                   f"files): {', '.join(fitted_new)}")
    note = f". Refitted from its points by benchmarks/calibration_h200.py: {'; '.join(why)}."
    return dataclasses.replace(again, kernels=run.kernels, notes=again.notes + note, path=run.path)




def held_out_bench_points() -> list[Point]:
    """The held-out bench runs' default calls (their records' backends: the kernel that ran)."""
    return [pt for d in HELD_OUT_DIRS for f in sorted((RES / d).glob("results-*.json"))
            for pt in points_from_results(f, f"{d}/{f.name}")]


def shipped_points() -> list[dict]:
    """The points the shipped H200 file holds: the calibrate run's, else the committed
    measurements this script fits."""
    run = calibrate_run()
    pts, _old = h200_points()
    if run is not None:
        return list(kernels_that_ran(run, fit_h200(pts, anchor_points(), anchor_points())).points)
    return [p.to_dict() for p in pts + fitted_anchors(anchor_points())]


def stamped_kernels(note: str) -> dict:
    """The ``kernels`` block of today's files: the commit checked out (``dirty`` when a kernel file
    differs from it) and the sha256 of every kernel file."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    files = kernel_hashes()
    commit = git("rev-parse", "--short=7", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", *(f"src/mla_var3/{f}" for f in files)))
    return {"commit": commit, "dirty": dirty, "files": files, "note": note}


#: what the shipped H200 file's hashes stand for (it was fitted from committed measurements).
STAMP_NOTE = ("sha256 of the kernel files at this commit, recorded after the measurements (commits.measurements) "
              "were taken: the kernels changed between them; re-measure with `mla-var3 calibrate` on an H200, "
              "which records the files it timed")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fit and compare only; write nothing")
    ap.add_argument("--stamp-kernels", action="store_true",
                    help="record today's kernel files (sha256) in the H200 file instead of keeping the shipped ones")
    ap.add_argument("--tables", help="write the Markdown tables to this file")
    ap.add_argument("--points-json", metavar="PATH",
                    help="write the points the shipped H200 file holds (the committed calibrate run's, else "
                         "those the fit reads from the committed results; sorted) to PATH and stop: what the "
                         "shipped file's points must equal")
    args = ap.parse_args(argv)

    pts, old = h200_points()
    anchors = anchor_points()
    if args.points_json:
        rows = sorted(shipped_points(), key=lambda d: json.dumps(d, sort_keys=True))
        Path(args.points_json).write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    cal = fit_h200(pts, anchors, anchors)
    split = fit_h200([p for p in pts if not held_out(p)], [p for p in anchors if not held_out(p)], anchors)
    fitted = pts + fitted_anchors(anchors)
    unfitted = [p for p in anchors if p not in fitted]
    seed = fit_5090()
    shipped = load_calibration(CONF / "calibration-h200.json")
    cal = dataclasses.replace(cal, kernels=stamped_kernels(STAMP_NOTE) if args.stamp_kernels else shipped.kernels)
    run = calibrate_run()
    if run is not None:
        run = kernels_that_ran(run, cal)
        if not args.stamp_kernels:
            run = with_unmeasured(run, shipped)
    h100 = with_unmeasured(kernels_that_ran(load_calibration(H100_RUN), None),
                           load_calibration(CONF / "calibration-h100-sxm.json"))
    if not args.check:
        save_calibration(run or cal, CONF / "calibration-h200.json")
        save_calibration(seed, CONF / "calibration-rtx-5090-seed.json")
        save_calibration(h100, CONF / "calibration-h100-sxm.json")

    all_pts = fitted + unfitted + old
    check_only = {(p.design, p.backend, p.b, p.s, p.t, p.source, p.note) for p in unfitted + old}

    def role(r: dict) -> str:
        if (r["design"], r["backend"], r["b"], r["s"], r["t"], r["source"], r["note"]) in check_only:
            return "check only"
        pt = Point(r["design"], r["backend"], r["b"], r["s"], r["t"], source=r["source"])
        return "held out" if held_out(pt) else "fit"
    out = []
    if run is not None:
        out += [f"## The shipped file: the calibrate run {Path(run.path).name} ({run.label})", "",
                "| design | backend | kind | points | min | max | rms log |", "|---|---|---|---|---|---|---|"]
        groups: dict = {}
        for r in compare(run, [Point.from_dict(p) for p in run.points]):
            groups.setdefault((r["design"], r["backend"], r["kind"]), []).append(r["ratio"])
        for (d, b, k), ratios in sorted(groups.items()):
            rms = math.sqrt(sum(math.log(x) ** 2 for x in ratios) / len(ratios))
            out.append(f"| {d} | {b} | {k} | {len(ratios)} | {min(ratios):.2f} | {max(ratios):.2f} | {rms:.3f} |")
        out += ["", "### The run against the held-out bench runs (other b, s and t; never fitted)", "",
                "| fit | design | backend | kind | points | min | max | rms log |", "|---|---|---|---|---|---|---|---|",
                summary(compare(run, held_out_bench_points()), "the run"), "",
                "### The run against every committed point", "", summary(compare(run, fitted + unfitted + old),
                                                                          "the run"), "",
                "The tables below are the fit to the committed measurements it started from.", ""]
    out += ["## Parameters (the fit to the committed measurements)", "",
           "| parameter | unit | value | fitted | source |", "|---|---|---|---|---|"]
    for p in cal.parameters.values():
        out.append(f"| {p.name} | {p.unit} | {p.value:.4g} | {'yes' if p.fitted else 'no'} | {p.source} |")
    out += ["", "## Fit quality per kernel (calibrated ÷ measured)", "",
            "| fit | design | backend | kind | points | min | max | rms log |", "|---|---|---|---|---|---|---|---|",
            summary(compare(cal, fitted), "shipped, its points"),
            summary(compare(split, [p for p in fitted if held_out(p)]), "held-out fit, held-out points"),
            summary(compare(cal, [p for p in anchors if "host-table" in p.source]), "shipped vs the host-table run (8a6fad7)"),
            summary(compare(cal, [p for p in unfitted if "host-table" not in p.source]),
                    "shipped vs the absorbed anchors (8a6fad7)"),
            summary(compare(cal, [p for p in old if "compat" in p.source]), "shipped vs the paged compat call"),
            summary(compare(cal, [p for p in old if "compat" not in p.source]),
                    "shipped vs older kernels and paths (v4, v6, the hybrid's own n = 0)"), "",
            "## The bar's grid (b = 32, 64; t = 4096)", "", bar_table(cal, pts, anchors, split), "",
            "## The hybrid's default call at every measured n (t = 4096; b = 64 held out)", "",
            hybrid_bar_table(cal, pts, anchors, split), "",
            "## Every point (shipped fit; split: the point's role in the held-out fit; 'check only': never fitted)", "",
            table(compare(cal, all_pts), role), "",
            "## RTX 5090 (seed), fitted to its six numbers", "",
            "| parameter | unit | value | fitted | source |", "|---|---|---|---|---|"]
    for p in seed.parameters.values():
        out.append(f"| {p.name} | {p.unit} | {p.value:.4g} | {'yes' if p.fitted else 'no'} | {p.source} |")
    out += ["", table(compare(seed, seed_points()))]
    text = "\n".join(out) + "\n"
    if args.tables:
        Path(args.tables).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

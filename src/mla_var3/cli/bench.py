"""``mla-var3 bench``: time every design (and the baselines) over a grid on this GPU; results
JSON, a Markdown table and plots. Without a GPU it refuses unless ``--interpret`` is given."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from mla_var3._argtypes import int_list, nonneg_int_list, path_arg, positive_float, positive_int
from mla_var3._io import quote
from mla_var3.cli import _common as C
from mla_var3.designs import ATTENTION_KERNELS, design

_CEILING_CHOICES = ("measure", "measured", "datasheet")


def n_list(text: str) -> str | tuple[int, ...]:
    """``auto`` or a comma list of non-negative integers (n = 0 is the absorbed design run as
    the hybrid)."""
    if text.strip().lower() == "auto":
        return "auto"
    return tuple(nonneg_int_list(text))


def _designs_arg(text: str) -> tuple[str, ...]:
    """``all`` or a comma list of design names (checked without importing torch)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if text.strip() == "all":
        return ATTENTION_KERNELS
    bad = [x for x in names if x not in ATTENTION_KERNELS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown design(s) {', '.join(bad) or quote(text)}; known: "
                                         f"{', '.join(ATTENTION_KERNELS)} or 'all'")
    return tuple(names)


def _ceilings_for(dev, how: str, gpu: bool):
    """(device entry carrying the ceilings in use, the analysis Ceilings)."""
    if how == "measure" and gpu:
        from mla_var3.runtime.ceilings import measure_ceilings

        c = measure_ceilings()
        dev = dataclasses.replace(dev, measured={"bf16_tflops": c.flops_per_s / 1e12,
                                                 "bandwidth_gbs": c.bytes_per_s / 1e9, "source": c.source})
        return dev, dev.ceilings("measured")
    if how == "datasheet":
        dev = dataclasses.replace(dev, measured=None)
        return dev, dev.ceilings("datasheet")
    return dev, dev.ceilings("measured")          # the table's measured block, else datasheet


def run(args) -> int:
    import torch

    from mla_var3.analysis.devices import detect_device, get_device
    from mla_var3.runtime import records as R
    from mla_var3.runtime.autotune import AutotuneCache
    from mla_var3.runtime.baselines import BASELINES
    from mla_var3.cli.sweep import BenchSpec, Runner, interpret_spec, plan_points
    from mla_var3.kernel.launchers import parse_designs
    from mla_var3.runtime.environment import device_slug, environment

    dims = C.dims_from_args(args)            # every argument is checked before the GPU is looked at
    if args.device:
        dev, dev_note = get_device(args.device, args.devices_file), f"{args.device} (chosen)"
    else:
        dev, dev_note = detect_device(args.devices_file)
    bad = [s for s in args.s if s > args.t]
    if bad:
        raise ValueError(f"--s {','.join(map(str, bad))} exceed the context --t {args.t}")
    if isinstance(args.n, tuple) and max(args.n) > args.t:
        raise ValueError(f"--n {max(args.n)} exceeds the context --t {args.t}")
    gpu = torch.cuda.is_available()
    if not gpu and not args.interpret:
        raise ValueError("bench needs a CUDA GPU: none is visible here. For a plumbing test on this machine, "
                         "`mla-var3 bench --interpret` runs a 2-point grid under the Triton interpreter "
                         "(CPU times, not GPU timings)")
    if args.interpret and gpu:
        raise ValueError("--interpret is for machines without a GPU (the kernels would run on the GPU here)")
    if args.interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = "cuda" if gpu else "cpu"
    dev, ceil = _ceilings_for(dev, args.ceilings, gpu)
    spec = BenchSpec(
        dims=dims, designs=tuple(parse_designs(",".join(args.designs))), bs=tuple(args.b), ss=tuple(args.s), t=args.t,
        n=args.n, sweep_s=None if args.no_n_sweep else args.sweep_s, dtype=args.dtype,
        baselines=BASELINES if args.baselines else (),
        point_seconds=args.point_seconds, slow_point_seconds=args.slow_point_seconds, max_seconds=args.max_seconds,
        autotune=args.autotune, retune=args.retune, tune_seconds=args.tune_seconds, interpret=args.interpret,
        seqlens=args.seqlens, eager=not args.no_eager,
    )
    if args.interpret:
        spec = interpret_spec(spec)
    out = Path(args.out) if args.out else Path("benchmarks") / "results" / (device_slug() if gpu else "cpu-interpret")
    cache = AutotuneCache()
    if args.clear_cache and cache.clear():
        print(f"cleared the autotune cache {cache.path}")
    env = environment()
    meta = {
        "environment": env, "device_key": dev.key, "device_note": dev_note,
        "ceilings": {"kind": ceil.kind, "tflops": ceil.flops_per_s / 1e12, "gbs": ceil.bytes_per_s / 1e9,
                     "ridge": ceil.ridge, "source": ceil.source},
        "spec": {k: v for k, v in dataclasses.asdict(spec).items() if k != "dims"},
        "dims": dataclasses.asdict(dims),
        "timing": "median of CUDA-event timed CUDA-graph replays (plain launches when capture fails); "
                  "a >= 2x L2 buffer is overwritten before every repetition" if gpu else
                  "CPU perf_counter under the Triton interpreter: not GPU timings",
        "autotune_cache": str(cache.path),
    }
    calibration = C.calibration_from_args(args, dev)
    points = plan_points(spec, dev, calibration)
    print(f"bench: {len(points)} points on {env['device']} ({dev_note}); ceilings: {ceil.kind} "
          f"({ceil.flops_per_s / 1e12:,.0f} TFLOP/s, {ceil.bytes_per_s / 1e9:,.0f} GB/s); results -> {out}")
    if not gpu:
        print("running under the Triton interpreter on the CPU: times are CPU timings, not GPU timings")
    runner = Runner(spec, device, dev, ceil, cache=cache, log=print, calibration=calibration)
    results = out / "results.json"
    records, interrupted = runner.run(points, on_record=lambda _r: R.write_results(results, runner.records, meta),
                                      progress=not args.no_progress)
    meta["interrupted"] = interrupted
    meta["crossover_flash_attention_over_flash_mla"] = R.crossovers(records, design("absorbed").kernel,
                                                                    design("expanded").kernel)
    optimum = {r.b: r.extra["model_best_n"] for r in records if r.extra.get("sweep") == "n"}
    meta["hybrid_model_best_n"] = optimum
    paths = [R.write_results(results, records, meta)]
    md = out / "results.md"
    md.write_text(f"# Benchmark: {dims.name}, t = {spec.t}, {spec.dtype}\n\n" + R.markdown_table(records, meta))
    paths.append(md)
    shown = [ceil] + ([dev.ceilings("datasheet")] if ceil.kind != "datasheet" else [])
    paths.append(R.plot_roofline(records, shown, out / "roofline.png"))
    paths.append(R.plot_time_vs_s(records, out / "time_vs_s.png"))
    if optimum:
        paths.append(R.plot_hybrid_n(records, out / "hybrid_n.png", optimum))
    ok = sum(r.status == "ok" for r in records)
    print(f"{ok}/{len(records)} points measured" + (" (interrupted: finished points kept)" if interrupted else ""))
    for p in paths:
        print(p)
    return 130 if interrupted else 0


def add(sub) -> None:
    p = sub.add_parser("bench", help="time every design (and baselines) over a grid on this GPU",
                       description="Times each design over the (b, s) grid on the current GPU, a shape's designs and "
                                   "baselines in the same repetitions (with official FlashMLA among them, each records "
                                   "FlashMLA / it as the median of paired ratios); writes results.json, results.md and "
                                   "PNG plots. Without a GPU it refuses unless --interpret is given.")
    p.add_argument("--designs", type=_designs_arg, default="all", help=f"'all' or a comma list of {', '.join(ATTENTION_KERNELS)}")
    C.add_model_args(p)
    p.add_argument("--device", default=None, help="device key for the datasheet ceilings (default: detected)")
    C.add_devices_file_arg(p)
    p.add_argument("--ceilings", default="measure", choices=_CEILING_CHOICES,
                   help="roofline ceilings: 'measure' them in this process (default, GPU), the table's 'measured' "
                        "block, or 'datasheet'")
    p.add_argument("--b", type=int_list, default="32,64", help="batch sizes (default 32,64)")
    p.add_argument("--s", type=int_list, default="1,2,4,8,16,32,64,128,512,1024", help="query lengths")
    p.add_argument("--t", type=positive_int, default=4096, help="context length (default 4096)")
    p.add_argument("--n", type=n_list, default="auto", help="hybrid split: 'auto' (the n explain and the dispatcher run: the calibrated model's best "
                   "split, the roofline's without a calibration) or a comma list")
    p.add_argument("--sweep-s", type=positive_int, default=16, help="s of the hybrid's n sweep (default 16)")
    p.add_argument("--no-n-sweep", action="store_true", help="skip the hybrid's n sweep")
    p.add_argument("--baselines", action="store_true",
                   help="also time torch eager (absorbed), torch SDPA (expanded), and flash_mla / flashinfer "
                        "when importable")
    C.add_calibration_arg(p)
    p.add_argument("--out", type=path_arg, help="output folder (default benchmarks/results/<device>/)")
    p.add_argument("--max-seconds", type=positive_float, default=480.0,
                   help="total time budget; later points are recorded as skipped (default 480)")
    p.add_argument("--point-seconds", type=positive_float, default=0.3,
                   help="timing budget per point (default 0.3)")
    p.add_argument("--slow-point-seconds", type=positive_float, default=3.0,
                   help="skip a point whose warm-up + minimum repetitions would exceed this (default 3)")
    p.add_argument("--autotune", action="store_true", help="tune configs not in the autotune cache (slow)")
    p.add_argument("--retune", action="store_true", help="tune every point again, ignoring the cache")
    p.add_argument("--tune-seconds", type=positive_float, default=30.0,
                   help="time budget of one point's tuning, compilation included (default 30)")
    p.add_argument("--clear-cache", action="store_true", help="delete the autotune cache first")
    p.add_argument("--interpret", action="store_true",
                   help="CPU only: a 2-point grid under the Triton interpreter, to test the plumbing")
    p.add_argument("--seqlens", default=None, metavar="SPEC",
                   help="also time ragged paged batches (FlashMLA's layout: the compat call, and official FlashMLA "
                        "with --baselines): 'random:LO:HI' (lengths uniform in [LO, HI] per b) or a comma list of "
                        "lengths; --t is the cache's capacity")
    p.add_argument("--no-eager", action="store_true",
                   help="time CUDA-graph replays only (by default each point also records its eager time and its "
                        "host time per call)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

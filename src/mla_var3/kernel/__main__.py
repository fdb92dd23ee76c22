"""``python -m mla_var3.kernel <design> [--b 32 --s 16 --t 4096 --n 1024 --model deepseek-v3 --dtype bf16]``

* ``--check`` runs the design on random inputs against the fp32 reference and prints each
  output's relative error and PASS/FAIL (exit status 1 on FAIL).
* without ``--check``: times the design and prints the cost model's prediction beside it.
* ``--profile``: the annotation report — every stage (absorb → attention [+ split-KV combine]
  → decompress) on the roofline: time, TFLOP/s, GB/s, % of bound, bound type, config; writes
  ``params.json`` and ``report.md`` to ``--out``. ``--profile ncu`` runs Nsight Compute
  (``--clock-control none``) on one run of the stages when ``ncu`` is on the PATH.

Without a CUDA device the kernels run under Triton's interpreter on the CPU (``main`` sets
``TRITON_INTERPRET=1`` first); sizes that would take minutes there are refused with a message
saying which sizes are practical.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mla_var3.designs import ATTENTION_KERNELS, DESIGNS, design
from mla_var3.kernel import use_interpreter_without_gpu
from mla_var3.kernel._common import cdiv, interpreting

#: interpreter cost (seconds, measured on a 2-core CPU) per unit of work: the absorbed kernel per
#: (64 rows of heads x queries) x 64 keys; the expanded kernel per (head x 16 queries) x 64 keys;
#: the hybrid pays both plus a fixed cost for its merge.
INTERP_S_LATENT_BLOCK = 0.25
INTERP_S_EXPANDED_BLOCK = 0.010
INTERP_S_HYBRID_FIXED = 0.5
#: the longest single call accepted under the interpreter (without --force).
INTERP_LIMIT_S = 30.0


def interpreter_estimate(design_name: str, dims, problem) -> float:
    """Rough seconds of one call under the interpreter (see the constants above)."""
    b, s, h = problem.b, problem.s, dims.h
    latent = b * cdiv(h * s, 64) * INTERP_S_LATENT_BLOCK
    expanded = b * h * cdiv(s, 16) * INTERP_S_EXPANDED_BLOCK
    d = design(design_name)
    n = (problem.n or 0) if d.split else 0 if d.latent else problem.t       # keys read expanded
    return latent * cdiv(problem.t - n, 64) + expanded * cdiv(n, 64) + (INTERP_S_HYBRID_FIXED if d.split else 0)


def _parser() -> argparse.ArgumentParser:
    from mla_var3._argtypes import add_model_args, nonneg_int, positive_int

    p = argparse.ArgumentParser(prog="python -m mla_var3.kernel",
                                description="Run, check, time or profile one MLA attention design.")
    p.add_argument("design", choices=ATTENTION_KERNELS)
    add_model_args(p)
    p.add_argument("--b", type=positive_int, default=32, help="batch (default 32)")
    p.add_argument("--s", type=positive_int, default=16, help="query tokens per sequence (default 16)")
    p.add_argument("--t", type=positive_int, default=4096, help="context incl. the s new tokens (default 4096)")
    p.add_argument("--n", type=nonneg_int, default=None,
                   help="mla_var6_plus: newest tokens kept expanded (default: the model's optimum)")
    p.add_argument("--no-causal", action="store_true", help="no causal mask for s > 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="compare with the fp32 reference; exit 1 on FAIL")
    p.add_argument("--profile", nargs="?", const="annotate", choices=("annotate", "ncu"),
                   help="per-stage roofline report (default), or 'ncu' for Nsight Compute")
    p.add_argument("--out", help="report folder (default ./mla_var3_profile/<design>-b..-s..-t..)")
    p.add_argument("--device", default=None, help="device key for the roofline (default: detected, else h200)")
    p.add_argument("--ceilings", default="measured", choices=("measured", "datasheet"),
                   help="roofline ceilings from the devices table (default measured)")
    p.add_argument("--autotune", action="store_true", help="tune launch configs not yet in the autotune cache")
    p.add_argument("--force", action="store_true", help="run sizes the interpreter would take minutes on")
    p.add_argument("--run-once", action="store_true", help=argparse.SUPPRESS)   # the child run under ncu
    return p


def _problem(args, dims):
    from mla_var3.shapes import Problem

    problem = Problem(b=args.b, s=args.s, t=args.t, n=args.n, causal=not args.no_causal)
    split = design(args.design).split
    if split and args.n is None:
        from mla_var3.analysis.regime import aligned_best_n

        problem = problem.with_n(aligned_best_n(dims, problem, _device(args)))
    elif not split and args.n is not None:
        raise ValueError(f"--n applies to {', '.join(d.kernel for d in DESIGNS if d.split)} only")
    return problem


def _device(args):
    from mla_var3.analysis.devices import detect_device, get_device

    return get_device(args.device) if args.device else detect_device()[0]


def _fmt_problem(dims, problem, dtype) -> str:
    n = f" n={problem.n} (o={problem.o})" if problem.n is not None else ""
    return (f"{dims.name}: h={dims.h} d={dims.d} p={dims.p} k={dims.k} | b={problem.b} s={problem.s} t={problem.t}{n}"
            f" | {dtype}{'' if problem.causal else ' non-causal'}")


def _check(args, dims, problem, device) -> int:
    from mla_var3.kernel import launchers as D
    from mla_var3.reference.inputs import torch_dtype
    from mla_var3.testing import TOLERANCE

    tol = TOLERANCE[torch_dtype(args.dtype)]
    ok = True
    for name, (shape, err) in D.check(args.design, dims, problem, dtype=args.dtype, device=device,
                                      seed=args.seed).items():
        ok &= err <= tol
        print(f"  {name:9s} {shape}: relative error {err:.3e} (tolerance {tol:.0e}) "
              f"{'ok' if err <= tol else 'TOO LARGE'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _time(args, dims, problem, device) -> int:
    from mla_var3.analysis.roofline import predict
    from mla_var3.kernel import launchers as D
    from mla_var3.runtime.autotune import AutotuneCache
    from mla_var3.reference.inputs import design_inputs
    from mla_var3.runtime.timing import time_fn

    dev = _device(args)
    cfg, how = D.pick_config(args.design, dims, problem, args.dtype, device, cache=AutotuneCache(), tune=args.autotune)
    inputs = design_inputs(args.design, dims, problem, dtype=args.dtype, device=device, seed=args.seed)
    reps = 3 if interpreting() else 100
    timing = time_fn(lambda: D.run(args.design, inputs, cfg), warmup=1 if interpreting() else 3, reps=reps,
                     min_reps=min(reps, 3), max_seconds=60.0 if interpreting() else 1.0)
    pred = predict(args.design, dims, problem, dev, args.ceilings)
    c = pred.cost
    secs = timing.median_us * 1e-6
    print(f"measured : {timing}")
    print(f"           {c.flops / secs / 1e12:,.2f} TFLOP/s, {c.bytes / secs / 1e9:,.1f} GB/s "
          f"(cost model {args.design}); config {cfg} [{how}]")
    print(f"predicted: {pred.time_s * 1e6:,.1f} µs, {pred.bound}-bound on {dev.key} ({pred.ceilings.kind} ceilings: "
          f"{pred.ceilings.flops_per_s / 1e12:,.0f} TFLOP/s, {pred.ceilings.bytes_per_s / 1e9:,.0f} GB/s); "
          f"predicted / measured = {pred.time_s / secs:.2f}")
    return 0


def _out_dir(args, problem) -> Path:
    if args.out:
        return Path(args.out)
    n = f"-n{problem.n}" if problem.n is not None else ""
    return Path("mla_var3_profile") / f"{args.design}-b{problem.b}-s{problem.s}-t{problem.t}{n}-{args.dtype}"


def _run_once(args, dims, problem, device) -> int:
    """Warm up, then run every stage once inside an NVTX range named 'profile' (for ncu)."""
    import torch

    from mla_var3.kernel import launchers as D

    stages = D.pipeline(args.design, dims, problem, dtype=args.dtype, device=device, seed=args.seed)
    for st in stages:
        st.call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for st in stages:
        st.call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    use_interpreter_without_gpu()
    try:
        return _main(args)
    except ValueError as exc:
        print(f"python -m mla_var3.kernel: error: {exc}", file=sys.stderr)
        return 2


def _main(args) -> int:
    import torch

    from mla_var3._argtypes import dims_from_args

    dims = dims_from_args(args)
    problem = _problem(args, dims)
    gpu = torch.cuda.is_available() and not interpreting()
    device = "cuda" if gpu else "cpu"
    if not gpu:
        if args.profile == "ncu" or args.run_once:
            raise ValueError("--profile ncu needs a CUDA GPU")
        est = interpreter_estimate(args.design, dims, problem)
        print(f"no CUDA device: running under the Triton interpreter on the CPU (TRITON_INTERPRET=1); "
              f"times are CPU timings, not GPU timings. Estimated {est:,.1f} s per call.")
        if est > INTERP_LIMIT_S and not args.force:
            raise ValueError(
                f"{args.design} at b={problem.b} h={dims.h} s={problem.s} t={problem.t} would take ~{est / 60:,.1f} min "
                f"per call under the interpreter (~{INTERP_S_LATENT_BLOCK:g} s per 64 latent rows x 64 keys, "
                f"~{INTERP_S_EXPANDED_BLOCK * 1e3:.0f} ms per head x 16 queries x 64 keys). "
                f"Practical here: a few seconds, e.g. --b 1 --s 2 --t 256 --h 16 "
                f"(~{interpreter_estimate(args.design, dims.replace(h=16), type(problem)(b=1, s=2, t=256, n=None if problem.n is None else 128)):.1f} s); "
                f"--force runs it anyway")
    print(_fmt_problem(dims, problem, args.dtype))
    if args.run_once:
        return _run_once(args, dims, problem, device)
    status = _check(args, dims, problem, device) if args.check else 0
    if args.profile == "annotate":
        from mla_var3.kernel.profile import annotate

        annotate(args, dims, problem, device, _device(args), _out_dir(args, problem))
    elif args.profile == "ncu":
        status = max(status, _ncu(args, problem))
    elif not args.check:
        status = _time(args, dims, problem, device)
    return status


def _ncu(args, problem) -> int:
    from mla_var3.kernel.profile import run_ncu

    exe = shutil.which("ncu")
    if exe is None:
        print("Nsight Compute (ncu) is not on the PATH: no hardware counters. `--profile` (without ncu) gives the "
              "roofline annotation report.")
        return 0
    return run_ncu(exe, args, _out_dir(args, problem))


if __name__ == "__main__":
    raise SystemExit(main())

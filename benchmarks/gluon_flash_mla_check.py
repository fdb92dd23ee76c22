"""Check and time the Hopper Gluon absorbed-attention kernel on an sm_90 GPU.

1. Smoke run in a child process with a time limit (a wrong mbarrier phase hangs the GPU
   instead of failing): small shapes, both schedules, split and unsplit, a ragged batch with
   NaN past the lengths. If it fails or hangs, the Gluon rows are skipped and the portable
   kernel is still timed.
2. Correctness of each schedule (``seq``: sequential; ``pipe``: the next block's score MMA issued
   behind this block's P.Z; ``see``: the warp-specialised seesaw kernel) on 26 shapes, plus ragged batches whose
   keys past ``seqlens[b]`` hold NaN (``zero_tail``), against the fp32 reference
   ``mla_var3.reference.flash_mla`` (relative Frobenius error of ``o_latent`` and ``lse``).
3. Timing with ``mla_var3.runtime.timing.time_fn`` (CUDA-graph replays, L2 flushed before each):
   each schedule, the portable kernel, TFLOP/s with FLOPs = 2 b h s t (2 K + P), and FlashMLA's
   time / ours from the anchors measured on an H200. A variant is timed only if it passed.

Every variant is guarded: a failure prints its error and the script goes on. The record is
written as JSON to ``--out``. ``--quick`` (<= 60 s): the checks and the 12 decode/speculative
rows of both schedules. ``--dry-run`` exercises the plumbing on the CPU with the portable kernel
under the Triton interpreter at tiny shapes (no GPU numbers).

    python benchmarks/gluon_flash_mla_check.py --out benchmarks/results/h200/gluon_flash_mla_check.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback

import torch

H, K, P = 128, 512, 64
SCHEDULES = {"seq": "sequential", "pipe": "pipelined", "see": "seesaw"}   # name -> flash_mla_gluon(schedule=)

#: official FlashMLA on an H200, bf16, h = 128, k = 512, p = 64 (microseconds), keyed (b, s, t).
FLASHMLA_US = {
    (32, 1, 4096): 75.2, (32, 2, 4096): 124.4, (32, 4, 4096): 224.1, (32, 8, 4096): 443.0,
    (32, 16, 4096): 886.0, (32, 32, 4096): 1760.0,
    (64, 1, 4096): 124.5, (64, 2, 4096): 231.5, (64, 4, 4096): 448.4, (64, 8, 4096): 894.7,
    (64, 16, 4096): 1790.0, (64, 32, 4096): 3566.0,
    (1, 1, 4096): 23.7, (4, 1, 4096): 30.8, (8, 1, 4096): 38.1, (16, 1, 4096): 48.5,
    (1, 4, 4096): 31.2, (4, 4, 4096): 49.7, (8, 4, 4096): 74.3, (16, 4, 4096): 114.2,
    (1, 1, 32768): 50.2, (4, 1, 32768): 76.1, (8, 1, 32768): 131.8, (16, 1, 32768): 249.0,
    (1, 4, 32768): 79.2, (4, 4, 32768): 229.7, (8, 4, 32768): 450.8, (16, 4, 32768): 879.9,
}

# (b, h, s, t, seqlens?, num_splits or None) -- the 21 correctness checks
CHECK_SHAPES = [
    (32, H, 1, 4096, False, None), (32, H, 2, 4096, False, None), (32, H, 4, 4096, False, None),
    (32, H, 16, 4096, False, None),
    (64, H, 1, 4096, False, None), (64, H, 2, 4096, False, None), (64, H, 4, 4096, False, None),
    (64, H, 16, 4096, False, None),
    (1, H, 1, 65, False, None), (1, H, 2, 65, False, None), (1, H, 4, 200, False, None),
    (1, H, 16, 200, False, None), (3, H, 1, 200, False, None), (1, H, 1, 4096, False, None),
    (2, 20, 3, 131, False, None),          # h*s = 60 rows: a partial row block
    (2, 16, 1, 1, False, None),            # a single key
    (4, H, 4, 300, True, None),            # per-sequence lengths (split chosen by the launcher)
    (4, H, 1, 1000, True, 3),              # forced split with lengths: some ranges empty
    (2, H, 2, 777, False, 5),              # forced split, ragged last block
    (32, H, 1, 4096, False, 1), (32, H, 1, 4096, False, 4),
    # odd and tiny key-block counts (the seesaw pairs blocks): 1, 3, 13 / 5 splits of 3, 63
    (3, H, 1, 129, False, None), (2, H, 8, 8, False, None), (2, H, 2, 4032, False, None),
    (1, H, 32, 4096, False, None), (2, H, 4, 1000, False, 7),
]
# ragged batches with NaN stored in z and kpe past seqlens[b] (the zero_tail path)
NAN_TAIL_SHAPES = [(4, H, 4, 300, True, None), (6, H, 1, 1000, True, 3), (3, H, 2, 4096, True, None)]

MAIN_SHAPES = [(b, s, 4096, None) for b in (32, 64) for s in (1, 2, 4, 8, 16, 32)]
SMALL_SHAPES = [(b, s, t, None) for t in (4096, 32768) for s in (1, 4) for b in (1, 4, 8, 16)]
SPLIT_SHAPES = [(32, 1, 4096, 2), (32, 1, 4096, 4), (64, 1, 4096, 2)]   # 2 = the former default at b=32 s=1


def flops(b: int, h: int, s: int, t: int, k: int = K, p: int = P) -> float:
    return 2.0 * b * h * s * t * (2 * k + p)


def make_inputs(b, h, s, t, *, seqlens: bool, seed: int = 0, dtype=torch.bfloat16, device="cuda", k=K, p=P):
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * std).to(dtype)

    # entries scaled like an absorbed DeepSeek query (qc = q . W_UK with W_UK ~ k^-1/2)
    qc, qpe = randn(b, h, s, k, std=0.5), randn(b, h, s, p)
    z, kpe = randn(b, t, k), randn(b, t, p)
    lens = None
    if seqlens:
        lens = torch.randint(s, t + 1, (b,), generator=cpu_gen, dtype=torch.int32)
        lens[0] = t
        if b > 1:   # one sequence ending mid-block, one at a block boundary when possible
            lens[1] = max(s, min(t, 64 * (t // 128) + 37))
        lens = lens.to(device)
    return qc, qpe, z, kpe, lens


def _scale():
    try:
        from mla_var3.shapes import get_preset
        return get_preset("deepseek-v3").default_scale
    except Exception:
        return (128 + 64) ** -0.5


def _poison_allocator(nbytes: int = 1 << 30) -> None:
    """Leave NaN in the caching allocator so that an output element the kernel never writes
    tends to read back as NaN."""
    if torch.cuda.is_available():
        x = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device="cuda")
        del x


def _rel(out, ref) -> float:
    from mla_var3.testing import rel_err
    return rel_err(out, ref)


def _kernel(dry: bool):
    """The Gluon launcher; under ``--dry-run`` the portable kernel stands in (same signature)."""
    if not dry:
        from mla_var3.kernel.hopper import flash_mla_gluon
        return flash_mla_gluon
    from mla_var3.kernel.absorbed import flash_mla

    def stand_in(qc, qpe, z, kpe, *, scale, causal=True, seqlens=None, num_splits=None, schedule=None,
                 zero_tail=None):
        return flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal, seqlens=seqlens)
    return stand_in


def run_check(shape, scale, tol, *, schedule="seq", nan_tail=False, dry=False):
    from mla_var3.reference import flash_mla as ref_flash_mla

    b, h, s, t, use_lens, ns = shape
    causal = s > 1
    dev = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    kw = dict(k=64, p=16) if dry else {}
    qc, qpe, z, kpe, lens = make_inputs(b, h, s, t, seqlens=use_lens, device=dev, dtype=dtype, **kw)
    o_ref, lse_ref = ref_flash_mla(qc, qpe, z, kpe, scale, causal, lens)
    if nan_tail and lens is not None and not dry:
        keep = torch.arange(t, device=dev)[None, :] < lens[:, None].long()
        z = z.masked_fill(~keep[..., None], float("nan"))
        kpe = kpe.masked_fill(~keep[..., None], float("nan"))
    _poison_allocator()
    o, lse = _kernel(dry)(qc, qpe, z, kpe, scale=scale, causal=causal, seqlens=lens, num_splits=ns,
                          schedule=SCHEDULES[schedule])
    if not dry:
        torch.cuda.synchronize()
    e_o, e_l = _rel(o, o_ref), _rel(lse, lse_ref)
    ok = e_o <= tol and e_l <= tol and o.dtype == qc.dtype and lse.dtype == torch.float32
    return dict(b=b, h=h, s=s, t=t, causal=causal, seqlens=use_lens, num_splits=ns, schedule=schedule,
                nan_tail=nan_tail, err_o=e_o, err_lse=e_l, tol=tol, ok=bool(ok))


def bench(fn, budget_s: float) -> float:
    from mla_var3.runtime.timing import time_fn
    return time_fn(fn, warmup=3, reps=100, min_reps=5, max_seconds=budget_s).median_us


def run_time(shape, scale, schedules, *, portable: bool, budget_s: float, dry=False):
    from mla_var3.kernel.absorbed import flash_mla

    b, s, t, ns = shape
    causal = s > 1
    dev = "cpu" if dry else "cuda"
    kw = dict(k=64, p=16, dtype=torch.float32) if dry else {}
    h = 16 if dry else H
    qc, qpe, z, kpe, _ = make_inputs(b, h, s, t, seqlens=False, device=dev, **kw)
    row = dict(b=b, s=s, t=t, causal=causal, num_splits=ns, flops=flops(b, h, s, t))
    anchor = FLASHMLA_US.get((b, s, t)) if ns is None and not dry else None
    row["flashmla_us"] = anchor
    kern = _kernel(dry)
    for name in schedules:
        try:
            fn = lambda: kern(qc, qpe, z, kpe, scale=scale, causal=causal, num_splits=ns,  # noqa: E731
                              schedule=SCHEDULES[name])
            row[f"{name}_us"] = bench(fn, budget_s)
        except Exception as exc:  # keep going: record and print
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"  {name} b={b} s={s} t={t} ns={ns}: {row[f'{name}_error']}", flush=True)
    if portable and ns is None:
        try:
            try:
                run = lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal, backend="triton")  # noqa: E731
                run()
            except ValueError:
                run = lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal)  # noqa: E731
            row["portable_us"] = bench(run, budget_s)
        except Exception as exc:
            row["portable_error"] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"  portable b={b} s={s} t={t}: {row['portable_error']}", flush=True)
    for key in (*schedules, "portable"):
        us = row.get(f"{key}_us")
        if us:
            row[f"{key}_tflops"] = row["flops"] / (us * 1e-6) / 1e12
            if anchor:
                row[f"{key}_vs_flashmla"] = anchor / us
    return row


def smoke(schedule: str, timeout_s: float) -> tuple[bool, str]:
    """Run a few small shapes of one schedule in a child process; a hang or a crash there costs
    nothing here but the time limit."""
    cmd = [sys.executable, os.path.abspath(__file__), "--smoke-child", schedule, "--out", os.devnull]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"smoke run timed out after {timeout_s:.0f} s (a hang: mbarrier phase or TMA byte count)"
    tail = (proc.stdout + proc.stderr)[-2000:]
    return proc.returncode == 0, tail


def smoke_child(schedule: str) -> int:
    scale = _scale()
    failed = 0
    for shape, nan_tail in [((1, H, 2, 200, False, None), False), ((1, H, 1, 200, False, 2), False),
                            ((2, 20, 3, 131, True, None), True), ((3, H, 1, 129, False, None), False),
                            ((32, H, 1, 4096, False, None), False)]:
        try:
            r = run_check(shape, scale, 1e-2, schedule=schedule, nan_tail=nan_tail)
            print("smoke", {k: r[k] for k in ("b", "s", "t", "num_splits", "nan_tail", "err_o", "err_lse", "ok")},
                  flush=True)
            failed += not r["ok"]
        except Exception:
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


def _fmt(row, key, fmt):
    v = row.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) and not math.isnan(v) else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="checks + the 12 decode rows, Gluon only (<= 60 s)")
    ap.add_argument("--dry-run", action="store_true", help="CPU plumbing check with the portable kernel")
    ap.add_argument("--smoke-timeout", type=float, default=None, help="seconds per schedule (60; 40 with --quick)")
    ap.add_argument("--no-time", action="store_true", help="correctness only")
    ap.add_argument("--no-portable", action="store_true", help="do not time the portable kernel")
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help=f"comma list from {tuple(SCHEDULES)}")
    ap.add_argument("--smoke-child", choices=tuple(SCHEDULES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    chosen = [n for n in args.schedules.split(",") if n]
    bad = [n for n in chosen if n not in SCHEDULES]
    if bad:
        ap.error(f"unknown schedules {bad}; choose from {tuple(SCHEDULES)}")
    for name in tuple(SCHEDULES):
        if name not in chosen:
            del SCHEDULES[name]
    if args.smoke_child:
        return smoke_child(args.smoke_child)
    dry = args.dry_run
    if dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print("no CUDA device: this script needs a Hopper GPU (or --dry-run)")
        return 2

    import triton
    from mla_var3.testing import TOLERANCE

    t_start = time.perf_counter()
    scale = _scale()
    tol = 1e-4 if dry else TOLERANCE[torch.bfloat16]
    cap = torch.cuda.get_device_capability() if not dry else (0, 0)
    record = dict(device=torch.cuda.get_device_name() if not dry else "cpu (dry run)", capability=list(cap),
                  torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                  date=time.strftime("%Y-%m-%d %H:%M:%S"), scale=scale, tolerance=tol, quick=args.quick,
                  checks=[], timings=[])
    try:
        from mla_var3.kernel.hopper import absorbed_gluon as ag
        record["defaults"] = dict(schedule=ag.DEFAULT_SCHEDULE, zero_tail=ag.ZERO_TAIL_DEFAULT)
    except Exception as exc:
        record["defaults"] = f"{type(exc).__name__}: {exc}"
    try:
        from mla_var3.runtime.environment import environment
        record["commit"] = environment().get("commit")   # honours MLA_VAR3_COMMIT (checkouts without history)
    except Exception:
        record["commit"] = None

    if dry:
        check_shapes, nan_shapes = [(1, 16, 1, 65, False, None), (2, 16, 3, 131, True, 2)], [(2, 16, 3, 131, True, None)]
        passed = {name: True for name in SCHEDULES}
        record["smoke"] = "skipped (dry run)"
    else:
        check_shapes, nan_shapes = CHECK_SHAPES, NAN_TAIL_SHAPES
        passed = {name: cap[0] == 9 for name in SCHEDULES}
        record["smoke"] = {}
        timeout = args.smoke_timeout or (40.0 if args.quick else 60.0)
        for name in SCHEDULES:
            if not passed[name]:
                record["smoke"][name] = f"skipped: capability {cap} is not sm_90"
                continue
            ok, tail = smoke(name, timeout)
            record["smoke"][name] = "ok" if ok else tail
            print(f"smoke {name}: {'ok' if ok else 'FAILED'}\n{tail}", flush=True)
            passed[name] = ok

    print(f"\n== correctness vs fp32 reference (tolerance {tol:g}, relative Frobenius)", flush=True)
    if any(passed.values()):
        jobs = [(sh, name, False) for name in SCHEDULES if passed[name] for sh in check_shapes]
        jobs += [(sh, name, True) for name in SCHEDULES if passed[name] for sh in nan_shapes]
        for shape, name, nan_tail in jobs:
            try:
                r = run_check(shape, scale, tol, schedule=name, nan_tail=nan_tail, dry=dry)
            except Exception as exc:
                r = dict(zip(("b", "h", "s", "t", "seqlens", "num_splits"), shape), schedule=name, nan_tail=nan_tail,
                         ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                traceback.print_exc()
            record["checks"].append(r)
            if not nan_tail:
                passed[name] &= r["ok"]
            errs = (f"err_o {r['err_o']:.2e} err_lse {r['err_lse']:.2e}" if "err_o" in r else r.get("error", ""))
            print(f"  {'PASS' if r['ok'] else 'FAIL'} {name:<4} b={shape[0]:>2} h={shape[1]:>3} s={shape[2]:>2} "
                  f"t={shape[3]:>5} seqlens={shape[4]!s:<5} ns={shape[5]} nan_tail={nan_tail!s:<5} {errs}", flush=True)
            if not dry:
                torch.cuda.empty_cache()
    for name in SCHEDULES:
        rs = [r for r in record["checks"] if r["schedule"] == name]
        record[f"checks_passed_{name}"] = f"{sum(r['ok'] for r in rs)}/{len(rs)}"
    timed = [name for name in SCHEDULES if passed[name]]
    summary = ", ".join(f"{n} {record['checks_passed_' + n]}" for n in SCHEDULES)
    print(f"checks: {summary}; timing {timed}", flush=True)

    if not args.no_time:
        if dry:
            shapes, budget, portable = [(1, 1, 128, None), (1, 2, 128, 2)], 0.05, True
        elif args.quick:
            shapes, budget, portable = MAIN_SHAPES, 0.15, False
        else:
            shapes, budget, portable = MAIN_SHAPES + SMALL_SHAPES + SPLIT_SHAPES, 0.25, not args.no_portable
        print("\n== timing (time_fn: CUDA-graph replays, L2 flushed; median us; FLOPs = 2 b h s t (2K + P))",
              flush=True)
        head = " ".join(f"{n + ' us':>9} {'xFMLA':>6}" for n in (*SCHEDULES, "portable"))
        print(f"{'b':>3} {'s':>3} {'t':>6} {'ns':>4} | {head} | {'FlashMLA':>8}", flush=True)
        for shape in shapes:
            try:
                row = run_time(shape, scale, timed, portable=portable and (dry or shape in MAIN_SHAPES),
                               budget_s=budget, dry=dry)
            except Exception as exc:
                row = dict(zip(("b", "s", "t", "num_splits"), shape), error=f"{type(exc).__name__}: {exc}"[:400])
                traceback.print_exc()
            record["timings"].append(row)
            cells = " ".join(f"{_fmt(row, n + '_us', '9.1f'):>9} {_fmt(row, n + '_vs_flashmla', '6.2f'):>6}"
                             for n in (*SCHEDULES, "portable"))
            print(f"{shape[0]:>3} {shape[1]:>3} {shape[2]:>6} {str(shape[3] or 'auto'):>4} | {cells} | "
                  f"{_fmt(row, 'flashmla_us', '8.1f'):>8}", flush=True)
            if not dry:
                torch.cuda.empty_cache()

    record["wall_s"] = time.perf_counter() - t_start
    if args.out != os.devnull:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=1, default=str)
    print(f"\nchecks: {summary}; {record['wall_s']:.0f} s; wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

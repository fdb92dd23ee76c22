"""Check and time the Hopper Gluon absorbed-attention kernel on an sm_90 GPU.

1. Smoke run in a child process with a time limit (a wrong mbarrier phase hangs the GPU
   instead of failing): small shapes, split and unsplit. If it fails or hangs, the Gluon rows
   are reported as skipped and the portable kernel is still timed.
2. Correctness of every variant against the fp32 reference ``mla_var3.reference.flash_mla``
   (relative Frobenius error of ``o_latent`` and of ``lse``, tolerance of the dtype).
3. Timing: ``triton.testing.do_bench`` medians (L2 flushed between calls) of the Gluon kernel
   and of the portable kernel (``mla_var3.kernel.absorbed.flash_mla``, backend "triton"),
   TFLOP/s with FLOPs = 2 b h s t (2 K + P), and FlashMLA's time / ours from the anchors
   measured on an H200.

Every variant is guarded: a failure prints its error and the script goes on. The table is
written as JSON to ``--out``.

    python benchmarks/gluon_flash_mla_check.py --out benchmarks/results/gluon_flash_mla_h200.json
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

# (b, h, s, t, seqlens?, num_splits or None) -- correctness set
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
]

# (b, s, t, num_splits or None) -- timing set
TIME_SHAPES = [(b, s, 4096, None) for b in (32, 64) for s in (1, 2, 4, 8, 16)] + [
    (b, s, t, None) for t in (4096, 32768) for s in (1, 4) for b in (1, 4, 8, 16)
] + [(32, 1, 4096, 1), (32, 1, 4096, 4), (64, 1, 4096, 2)]


def flops(b: int, h: int, s: int, t: int, k: int = K, p: int = P) -> float:
    return 2.0 * b * h * s * t * (2 * k + p)


def make_inputs(b, h, s, t, *, seqlens: bool, seed: int = 0, dtype=torch.bfloat16, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * std).to(dtype)

    # entries scaled like an absorbed DeepSeek query (qc = q . W_UK with W_UK ~ k^-1/2)
    qc, qpe = randn(b, h, s, K, std=0.5), randn(b, h, s, P)
    z, kpe = randn(b, t, K), randn(b, t, P)
    lens = None
    if seqlens:
        lens = torch.randint(s, t + 1, (b,), generator=cpu_gen, dtype=torch.int32)
        lens[0] = t
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
    x = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del x


def _rel(out, ref) -> float:
    from mla_var3.testing import rel_err
    return rel_err(out, ref)


def run_check(shape, scale, tol):
    from mla_var3.kernel.hopper import flash_mla_gluon
    from mla_var3.reference import flash_mla as ref_flash_mla

    b, h, s, t, use_lens, ns = shape
    causal = s > 1
    qc, qpe, z, kpe, lens = make_inputs(b, h, s, t, seqlens=use_lens)
    _poison_allocator()
    o, lse = flash_mla_gluon(qc, qpe, z, kpe, scale=scale, causal=causal, seqlens=lens, num_splits=ns)
    torch.cuda.synchronize()
    o_ref, lse_ref = ref_flash_mla(qc, qpe, z, kpe, scale, causal, lens)
    e_o, e_l = _rel(o, o_ref), _rel(lse, lse_ref)
    ok = e_o <= tol and e_l <= tol and o.dtype == qc.dtype and lse.dtype == torch.float32
    return dict(b=b, h=h, s=s, t=t, causal=causal, seqlens=use_lens, num_splits=ns, err_o=e_o, err_lse=e_l,
                tol=tol, ok=bool(ok))


def bench(fn) -> float:
    import triton
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # microseconds


def run_time(shape, scale, gluon_ok: bool):
    from mla_var3.kernel.absorbed import flash_mla

    b, s, t, ns = shape
    causal = s > 1
    qc, qpe, z, kpe, _ = make_inputs(b, H, s, t, seqlens=False)
    row = dict(b=b, s=s, t=t, causal=causal, num_splits=ns, flops=flops(b, H, s, t))
    anchor = FLASHMLA_US.get((b, s, t)) if ns is None else None
    row["flashmla_us"] = anchor
    if gluon_ok:
        try:
            from mla_var3.kernel.hopper import flash_mla_gluon
            row["gluon_us"] = bench(lambda: flash_mla_gluon(qc, qpe, z, kpe, scale=scale, causal=causal,
                                                            num_splits=ns))
        except Exception as exc:  # keep going: record and print
            row["gluon_error"] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"  gluon b={b} s={s} t={t} ns={ns}: {row['gluon_error']}", flush=True)
    if ns is None:
        try:
            try:
                run = lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal, backend="triton")  # noqa: E731
                run()
            except ValueError:
                run = lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal)  # noqa: E731
            row["portable_us"] = bench(run)
        except Exception as exc:
            row["portable_error"] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"  portable b={b} s={s} t={t}: {row['portable_error']}", flush=True)
    for key in ("gluon", "portable"):
        us = row.get(f"{key}_us")
        if us:
            row[f"{key}_tflops"] = row["flops"] / (us * 1e-6) / 1e12
            if anchor:
                row[f"{key}_vs_flashmla"] = anchor / us
    return row


def smoke(timeout_s: float) -> tuple[bool, str]:
    """Run a few small shapes in a child process; a hang or a crash there costs nothing here."""
    cmd = [sys.executable, os.path.abspath(__file__), "--smoke-child", "--out", os.devnull]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"smoke run timed out after {timeout_s:.0f} s (a hang: mbarrier phase or TMA byte count)"
    tail = (proc.stdout + proc.stderr)[-3000:]
    return proc.returncode == 0, tail


def smoke_child() -> int:
    scale = _scale()
    failed = 0
    for shape in [(1, H, 2, 200, False, None), (1, H, 1, 200, False, 2), (2, 20, 3, 131, True, None),
                  (32, H, 1, 4096, False, None)]:
        try:
            r = run_check(shape, scale, 1e-2)
            print("smoke", r, flush=True)
            failed += not r["ok"]
        except Exception:
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--smoke-timeout", type=float, default=300.0)
    ap.add_argument("--no-time", action="store_true", help="correctness only")
    ap.add_argument("--smoke-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke_child:
        return smoke_child()
    if not torch.cuda.is_available():
        print("no CUDA device: this script needs a Hopper GPU")
        return 2

    import triton
    from mla_var3.testing import TOLERANCE

    scale = _scale()
    tol = TOLERANCE[torch.bfloat16]
    cap = torch.cuda.get_device_capability()
    record = dict(device=torch.cuda.get_device_name(), capability=list(cap), torch=torch.__version__,
                  triton=triton.__version__, python=platform.python_version(),
                  date=time.strftime("%Y-%m-%d %H:%M:%S"), scale=scale, tolerance=tol, checks=[], timings=[])
    try:
        record["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except Exception:
        record["commit"] = None

    gluon_ok = cap[0] == 9
    if not gluon_ok:
        record["smoke"] = f"skipped: capability {cap} is not sm_90"
    else:
        ok, tail = smoke(args.smoke_timeout)
        record["smoke"] = "ok" if ok else tail
        print(f"smoke: {'ok' if ok else 'FAILED'}\n{tail if not ok else ''}", flush=True)
        gluon_ok = ok

    print(f"\n== correctness vs fp32 reference (tolerance {tol:g}, relative Frobenius)", flush=True)
    if gluon_ok:
        for shape in CHECK_SHAPES:
            try:
                r = run_check(shape, scale, tol)
            except Exception as exc:
                r = dict(zip(("b", "h", "s", "t", "seqlens", "num_splits"), shape), ok=False,
                         error=f"{type(exc).__name__}: {exc}"[:400])
                traceback.print_exc()
            record["checks"].append(r)
            status = "PASS" if r["ok"] else "FAIL"
            errs = (f"err_o {r['err_o']:.2e} err_lse {r['err_lse']:.2e}" if "err_o" in r else r.get("error", ""))
            print(f"  {status} b={shape[0]:>2} h={shape[1]:>3} s={shape[2]:>2} t={shape[3]:>5} "
                  f"seqlens={shape[4]!s:<5} ns={shape[5]}  {errs}", flush=True)
            torch.cuda.empty_cache()
    n_pass = sum(r["ok"] for r in record["checks"])
    record["checks_passed"] = f"{n_pass}/{len(record['checks'])}"

    if not args.no_time:
        print("\n== timing (do_bench median, L2 flushed; FLOPs = 2 b h s t (2K + P))", flush=True)
        print(f"{'b':>3} {'s':>3} {'t':>6} {'ns':>4} | {'gluon us':>9} {'TFLOP/s':>8} {'xFlashMLA':>9} | "
              f"{'portable us':>11} {'TFLOP/s':>8} {'xFlashMLA':>9} | {'FlashMLA us':>11}", flush=True)
        for shape in TIME_SHAPES:
            try:
                row = run_time(shape, scale, gluon_ok)
            except Exception as exc:
                row = dict(zip(("b", "s", "t", "num_splits"), shape), error=f"{type(exc).__name__}: {exc}"[:400])
                traceback.print_exc()
            record["timings"].append(row)

            def f(key, fmt):
                v = row.get(key)
                return format(v, fmt) if isinstance(v, (int, float)) and not math.isnan(v) else "-"

            print(f"{shape[0]:>3} {shape[1]:>3} {shape[2]:>6} {str(shape[3] or 'auto'):>4} | "
                  f"{f('gluon_us', '9.1f'):>9} {f('gluon_tflops', '8.1f'):>8} {f('gluon_vs_flashmla', '9.2f'):>9} | "
                  f"{f('portable_us', '11.1f'):>11} {f('portable_tflops', '8.1f'):>8} "
                  f"{f('portable_vs_flashmla', '9.2f'):>9} | {f('flashmla_us', '11.1f'):>11}", flush=True)
            torch.cuda.empty_cache()

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=1, default=str)
    print(f"\nchecks passed: {record['checks_passed']}; wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

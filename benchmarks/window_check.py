"""Check and time the hybrid's Gluon window kernel (``kernel/hopper/window_gluon.py``) and the
hybrid built on it, on an sm_90 GPU (bf16, DeepSeek-V3 dims).

1. Correctness of :func:`expanded_window_gluon` against the fp32 reference (the window is an
   expanded cache of N keys: ``reference.flash_attention`` with T = N) on edge shapes: s = 1,
   ragged s and N, N = s, not causal, s = 32 and s = 64 (64-key blocks), few programs (each
   walks many items), with the output NaN-poisoned; and of the hybrid with it as its persistent
   expanded part (``mla_var6_plus_hopper(expanded_programs=m)``) against
   ``reference.mla_var6_plus``.
2. Bandwidth of the window kernel alone at b = 32, s = 16 over N = 1,344 window keys, against
   the number of programs (= SMs it holds), next to the portable persistent kernel: GB/s on
   the bytes the cost model counts (k, v per head, kpe once per token, q, o).
3. End to end at b = 32, s = 16, t = 4,096, with the output decompression: the absorbed
   kernel alone, and the hybrid over a grid of (n, programs).

    python benchmarks/window_check.py --out benchmarks/results/h200/window_check.json
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

from common import (D, H, P, Budget, check_hybrid_partition, environment, error_text, randn as seeded_randn, timed,
                    write_json, require_cuda)

CHECKS = [  # (b, h, s, n, causal, programs, block_n, stages)
    (2, 8, 16, 1344, True, 3, 128, 1), (2, 8, 1, 130, True, 5, 128, 1), (1, 8, 5, 77, True, 2, 128, 1),
    (2, 8, 16, 16, True, 4, 128, 1), (2, 8, 4, 300, False, 16, 128, 1), (2, 8, 32, 1000, True, 3, 128, 1),
    (1, 8, 64, 500, True, 3, 64, 1), (2, 8, 16, 1344, True, 7, 64, 2), (2, 8, 3, 1000, True, 5, 64, 2),
    (1, 8, 16, 70, False, 2, 64, 2),
]
HYBRID_CHECKS = [(2, 16, 1024, 300, 8), (2, 4, 777, 200, 20)]   # (b, s, t, n, programs)
BW_PROGRAMS = (16, 33, 44, 66, 132)
WINDOW_BLOCKS = ((128, 1), (64, 2))      # (keys per block, ring depth per consumer)
E2E_N = (512, 768, 1024, 1280, 1536)
E2E_M = (33, 44, 56, 66)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=240.0)
    args = ap.parse_args()
    require_cuda()
    budget = Budget(args.budget)
    from mla_var3 import reference as R
    from mla_var3.kernel.absorbed import flash_mla
    from mla_var3.kernel.gemm import decompress
    from mla_var3.kernel.hopper.window_gluon import expanded_window_gluon
    from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper
    from mla_var3.kernel.hybrid import expanded_persistent
    from mla_var3.shapes import Problem, get_preset
    from mla_var3.testing import LSE_TOLERANCE, TOLERANCE, rel_err

    dtype = torch.bfloat16
    info = environment()
    randn = seeded_randn("cuda", dtype)

    # 1. correctness
    checks, all_ok = [], True
    for b, h, s, n, causal, m, bn, st in CHECKS:
        row = dict(kind="window", b=b, h=h, s=s, n=n, causal=causal, programs=m, block_n=bn, stages=st)
        try:
            q, qpe, k, v, kpe = randn(b, h, s, D), randn(b, h, s, P), randn(b, n, h, D), randn(b, n, h, D), randn(b, n, P)
            out = torch.full((b, h, s, D), float("nan"), dtype=dtype, device="cuda")
            o, lse = expanded_window_gluon(q, qpe, k, v, kpe, scale=(D + P) ** -0.5, causal=causal, programs=m,
                                           block_n=bn, stages=st, out=out)
            ro, rl = R.flash_attention(q, qpe, k, v, kpe, (D + P) ** -0.5, causal, None)
            eo, el = rel_err(o, ro), rel_err(lse, rl)
            row.update(err_o=eo, err_lse=el, ok=bool(eo <= TOLERANCE[dtype] and el <= LSE_TOLERANCE[dtype]))
        except Exception as exc:
            traceback.print_exc()
            row.update(ok=False, error=error_text(exc))
        all_ok &= row["ok"]
        checks.append(row)
        print(f"check window b={b} h={h} s={s} n={n} causal={causal:d} m={m} bn={bn} st={st}: "
              f"{'ok' if row['ok'] else 'FAIL'} {row.get('err_o', float('nan')):.2e} {row.get('err_lse', float('nan')):.2e}",
              flush=True)
    all_ok &= check_hybrid_partition(HYBRID_CHECKS, checks, dtype)
    dims = get_preset("deepseek-v3")

    rows = []
    timing = dict(max_seconds=0.6)

    if all_ok:
        # 2. bandwidth of the window part alone
        b, s, n = 32, 16, 1344
        q, qpe, k, v, kpe = randn(b, H, s, D), randn(b, H, s, P), randn(b, n, H, D), randn(b, n, H, D), randn(b, n, P)
        nbytes = 2 * (b * n * H * 2 * D + b * n * P + 2 * b * H * s * D + b * H * s * P)
        at44 = {}
        for bn, st in WINDOW_BLOCKS:
            for m in BW_PROGRAMS:
                us = timed(rows, f"window gluon n{bn}s{st} b=32 s=16 n=1344, {m} programs",
                           lambda m=m, bn=bn, st=st: expanded_window_gluon(q, qpe, k, v, kpe, scale=(D + P) ** -0.5,
                                                                           programs=m, block_n=bn, stages=st),
                           budget=budget, timing=timing, part="window", impl=f"gluon_n{bn}s{st}", programs=m, n=n,
                           block_n=bn, stages=st)
                if us:
                    rows[-1].update(gbps=nbytes / us / 1e3, gbps_per_program=nbytes / us / 1e3 / m)
                    if m == 44:
                        at44[(bn, st)] = us
        block = min(at44, key=at44.get) if at44 else None
        print(f"window block for the end-to-end grid: {block}", flush=True)
        for m in (33, 66, 132):
            us = timed(rows, f"window portable persistent, {m} programs",
                       lambda m=m: expanded_persistent(q, qpe, k, v, kpe, scale=(D + P) ** -0.5, programs=m),
                       budget=budget, timing=timing, part="window", impl="portable", programs=m, n=n)
            if us:
                rows[-1].update(gbps=nbytes / us / 1e3, gbps_per_program=nbytes / us / 1e3 / m)
        del q, qpe, k, v, kpe
        # 3. end to end with the decompression
        t = 4096
        xa = R.make_inputs(dims, Problem(b=b, s=s, t=t, n=0, causal=True), dtype=dtype, device="cuda")
        timed(rows, "absorbed alone + decompress",
              lambda: decompress(flash_mla(xa.qc, xa.qpe, xa.z_old, xa.kpe, scale=xa.scale)[0], xa.w_uv),
              budget=budget, timing=timing, part="e2e", impl="absorbed", n=0)
        del xa
        for nn in E2E_N:
            x = R.make_inputs(dims, Problem(b=b, s=s, t=t, n=nn, causal=True), dtype=dtype, device="cuda")
            for m in E2E_M:
                def run(x=x, m=m):
                    o, ol, _ = mla_var6_plus_hopper(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale,
                                                    causal=True, expanded_programs=m, window_block=block)
                    return decompress(ol, x.w_uv, o)
                timed(rows, f"hybrid n={nn} window on {m} programs + decompress", run, budget=budget, timing=timing,
                      part="e2e", impl="hybrid", n=nn, programs=m, window_block=block)
            del x
            torch.cuda.empty_cache()

    write_json(args.out, dict(info=info, checks=checks, rows=rows))
    e2e = [r for r in rows if r.get("part") == "e2e" and "us" in r]
    if e2e:
        best = min(e2e, key=lambda r: r["us"])
        print(f"\nbest end to end: {best['label']} {best['us']:.1f} us (bar 750; FlashMLA 886)")
    print(f"checks {sum(c['ok'] for c in checks)}/{len(checks)} ok; {budget.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

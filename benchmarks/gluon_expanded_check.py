"""Check and time the Hopper Gluon expanded kernel (``kernel/hopper/expanded_gluon.py``) against
the portable Triton kernel's default config and cuDNN attention (PyTorch SDPA), on an sm_90 GPU.

1. Correctness of every Gluon variant (``block_n`` x ``stages``, ``pingpong``) against the fp32 reference
   ``mla_var3.reference.flash_attention`` on edge shapes (DeepSeek-V3 head dims d = 128,
   p = 64, 8 heads): causal s < t, causal prefill s = t, ragged s and t (neither a multiple of
   a block), s = 1, non-causal, b = 1, and a non-contiguous ``out``. The output buffer is
   NaN-poisoned, so an unwritten element fails. A variant that fails is never timed.
2. Timing with :func:`mla_var3.runtime.timing.time_fn` (CUDA-graph replays, L2 flushed,
   medians) at b = 32, t = 4096, s in {16, 64, 128, 256, 512, 1024} (bottom-right causal) and the full
   causal prefill b = 4, s = t = 4096: each Gluon variant, the portable kernel's default config,
   and cuDNN SDPA (q/k head 192 with the RoPE key broadcast per head, v head 128).
3. TFLOP/s on the FLOPs the cost model counts, 2 b h s t (2 d + p) (causal not discounted), and
   % of the matmul rate measured in the same process (8192^3 bf16); cuDNN / ours.

    python benchmarks/gluon_expanded_check.py --out benchmarks/results/h200/gluon_expanded_check.json
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

from common import (D, H, P, Budget, environment, error_text, expanded_flops as flops, expanded_inputs, sdpa_call,
                    write_json, require_cuda)

VARIANTS = [dict(block_n=128, stages=2), dict(block_n=128, stages=2, pingpong=True), dict(block_n=64, stages=3),
            dict(block_n=64, stages=4)]
# (b, h, s, t, causal, strided out)
CHECKS = [(2, 8, 512, 1024, True, False), (1, 8, 512, 512, True, False), (2, 8, 130, 1000, True, False),
          (1, 8, 1, 333, True, False), (2, 8, 200, 700, False, False), (1, 8, 64, 64, True, False),
          (2, 8, 300, 777, True, True)]
TIMES = [(32, 512, 4096), (32, 1024, 4096), (4, 4096, 4096), (32, 128, 4096), (32, 256, 4096), (32, 64, 4096),
         (32, 16, 4096)]


def label(v: dict) -> str:
    return f"gluon_n{v['block_n']}s{v['stages']}" + ("p" if v.get("pingpong") else "")


def make_inputs(b, h, s, t, dtype, seed=0):
    return expanded_inputs(b, s, t, h, D, P, dtype, "cuda", seed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; timing stops once exceeded")
    args = ap.parse_args()
    require_cuda()
    budget = Budget(args.budget)
    from mla_var3 import reference as R
    from mla_var3.kernel.expanded import default_config, flash_attention
    from mla_var3.kernel.hopper.expanded_gluon import flash_attention_gluon
    from mla_var3.runtime.ceilings import measure_matmul_rate
    from mla_var3.runtime.timing import time_fn
    from mla_var3.shapes import MLADims, Problem
    from mla_var3.testing import LSE_TOLERANCE, TOLERANCE, rel_err

    info = environment(dims=dict(h=H, d=D, p=P), dtype="bfloat16")
    dtype = torch.bfloat16

    # 1. correctness
    checks, ok = [], {label(v): True for v in VARIANTS}
    for v in VARIANTS:
        for b, h, s, t, causal, strided in CHECKS:
            row = dict(variant=label(v), b=b, h=h, s=s, t=t, causal=causal, strided_out=strided)
            try:
                q, qpe, k, vv, kpe = make_inputs(b, h, s, t, dtype)
                if strided:
                    out = torch.full((b, s, h, D), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
                else:
                    out = torch.full((b, h, s, D), float("nan"), dtype=dtype, device="cuda")
                o, lse = flash_attention_gluon(q, qpe, k, vv, kpe, scale=(D + P) ** -0.5, causal=causal, out=out, **v)
                ref_o, ref_lse = R.flash_attention(q, qpe, k, vv, kpe, (D + P) ** -0.5, causal, None)
                e_o, e_l = rel_err(o, ref_o), rel_err(lse, ref_lse)
                row.update(err_o=e_o, err_lse=e_l, ok=bool(e_o <= TOLERANCE[dtype] and e_l <= LSE_TOLERANCE[dtype]))
            except Exception as exc:
                traceback.print_exc()
                row.update(ok=False, error=error_text(exc))
            ok[label(v)] &= row["ok"]
            checks.append(row)
            print(f"check {row['variant']:14s} b={b} h={h} s={s:4d} t={t:4d} causal={causal:d} strided={strided:d}: "
                  f"{'ok' if row['ok'] else 'FAIL'} {row.get('err_o', float('nan')):.2e} "
                  f"{row.get('err_lse', float('nan')):.2e}", flush=True)

    # 2. timing
    mm = measure_matmul_rate()[0]
    print(f"matmul 8192^3 bf16: {mm:.1f} TFLOP/s", flush=True)
    rows = []
    for b, s, t in TIMES:
        if budget.left() < 0:
            print("time budget exceeded: stopping", flush=True)
            break
        q, qpe, k, vv, kpe = make_inputs(b, H, s, t, dtype)
        out = torch.empty((b, H, s, D), dtype=dtype, device="cuda")
        cfg = default_config(MLADims(h=H, d=D, p=P), Problem(b, s, t))
        impls = [("triton_" + cfg.label(), lambda: flash_attention(q, qpe, k, vv, kpe, config=cfg, out=out,
                                                                   backend="triton"))]
        impls += [(label(v), (lambda v=v: flash_attention_gluon(q, qpe, k, vv, kpe, scale=(D + P) ** -0.5, out=out,
                                                                 **v))) for v in VARIANTS if ok[label(v)]]
        impls.append(("cudnn_sdpa", sdpa_call(q, qpe, k, vv, kpe, True)[0]))
        for name, fn in impls:
            try:
                tm = time_fn(fn, max_seconds=1.5)
                us = tm.median_us
                rows.append(dict(b=b, s=s, t=t, impl=name, us=us, tflops=flops(b, s, t) / us / 1e6,
                                 pct_matmul=100 * flops(b, s, t) / us / 1e6 / mm))
            except Exception as exc:
                traceback.print_exc()
                rows.append(dict(b=b, s=s, t=t, impl=name, error=error_text(exc)))
        sd = [r["us"] for r in rows if (r["b"], r["s"]) == (b, s) and r["impl"] == "cudnn_sdpa" and "us" in r]
        for r in rows:
            if (r["b"], r["s"]) == (b, s) and "us" in r and sd:
                r["cudnn_over_ours"] = sd[0] / r["us"]
        del q, qpe, k, vv, kpe, out
        torch.cuda.empty_cache()

    write_json(args.out, dict(info=info, matmul_tflops=mm, checks=checks, rows=rows))
    print(f"\n{'problem':>16s} {'impl':>24s} {'us':>10s} {'%mm':>6s} {'cuDNN/x':>8s}")
    for r in rows:
        if "us" in r:
            print(f"b={r['b']:2d} s={r['s']:4d} t={r['t']} {r['impl']:>24s} {r['us']:10.1f} {r['pct_matmul']:6.1f} "
                  f"{r.get('cudnn_over_ours', float('nan')):8.2f}")
        else:
            print(f"b={r['b']:2d} s={r['s']:4d} t={r['t']} {r['impl']:>24s} ERROR {r['error'][:60]}")
    print(f"checks: {sum(c['ok'] for c in checks)}/{len(checks)} ok; {budget.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

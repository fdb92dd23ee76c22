"""The expanded (FlashAttention-style) kernels on an sm_90 GPU against cuDNN attention (PyTorch
SDPA): two suites, ``--suite configs`` (the default) and ``--suite gluon``.

``--suite configs``: the portable kernel's launch configs at the compute-bound points.

1. Correctness of every config against the fp32 reference ``mla_var3.reference.flash_attention``
   (relative Frobenius error of ``o`` and ``lse``, the dtype's tolerance) on two causal checks
   with DeepSeek-V3 head dims: queries at the end of a cache (s = 512 < t = 1024) and a full
   prefill (s = t = 512). A config that fails is reported and never timed.
2. Timing with :func:`mla_var3.runtime.timing.time_fn` (CUDA-graph replays, L2 flushed) of the
   default config and the candidate configs at b = 32, t = 4096, s in {512, 1024} (bottom-right
   causal) and the full causal prefill b = 4, s = t = 4096 (candidates: the lazy-rescale and
   TMA variants, ``rescale_threshold`` / ``tma``); the default and a TMA variant at s = 16 and
   s = 128 (regression check of the memory-bound side). cuDNN SDPA is timed on the same
   problems: q/k head 192 (RoPE key broadcast per head), v head 128; ``is_causal=True`` for
   s = t, the bottom-right mask as ``attn_mask`` otherwise.
3. TFLOP/s on the FLOPs the cost model counts, 2 b h s t (2 d + p) (causal not discounted);
   for the prefill also on the halved FLOPs. % of the measured matmul rate (801 TFLOP/s, or
   ``--matmul-tflops``).
4. The fastest config per compute-bound problem and the one with the best geometric-mean
   speedup over the default across them (printed last, JSON key ``winners``): the data to
   re-pick ``default_config`` from.

``--suite gluon``: the warp-specialised Gluon kernel (``kernel/hopper/expanded_gluon.py``).

1. Correctness of every Gluon variant (``block_n`` x ``stages``, ``pingpong``) against the fp32
   reference on edge shapes (DeepSeek-V3 head dims d = 128, p = 64, 8 heads): causal s < t,
   causal prefill s = t, ragged s and t (neither a multiple of a block), s = 1, non-causal,
   b = 1, and a non-contiguous ``out``. The output buffer is NaN-poisoned, so an unwritten
   element fails. A variant that fails is never timed.
2. Timing (``time_fn``) at b = 32, t = 4096, s in {16, 64, 128, 256, 512, 1024} (bottom-right
   causal) and the full causal prefill b = 4, s = t = 4096: each Gluon variant, the portable
   kernel's default config, and cuDNN SDPA.
3. TFLOP/s on the cost model's FLOPs and % of the matmul rate measured in the same process
   (8192^3 bf16); cuDNN / ours.

Every variant is guarded (a failure prints and the suite goes on) and a time budget skips what
is left once exceeded. The rows are written as JSON to ``--out``; a table is printed last.

    python benchmarks/expanded_check.py --out benchmarks/results/h200/expanded_check.json
    python benchmarks/expanded_check.py --suite gluon --out benchmarks/results/h200/gluon_expanded_check.json
    python benchmarks/expanded_check.py --dry-run --out /tmp/x.json    # CPU: plumbing only (configs)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import traceback

import torch

from common import (D, H, P, Budget, environment, error_text, expanded_flops as flops, expanded_inputs, require_cuda,
                    sdpa_call, write_json)

MATMUL_TFLOPS = 801.0

#: configs timed at the compute-bound points (fields of FlashAttentionConfig), the default
#: first; sm_90 compile reports (b = 32, s = 512) in the comments: registers, shared memory.
CANDIDATES = [
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3, masked_stages=1),      # default s > 128: 192, 172,032
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3, masked_stages=1,
         rescale_threshold=8.0),                                                    # lazy rescale: 205, +32 B
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3, tma=True),             # TMA: 163, 173,056
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3, rescale_threshold=8.0, tma=True),   # 161
    dict(block_m=128, block_n=64, num_warps=8, num_stages=3, masked_stages=1, tma=True),         # 177
    dict(block_m=128, block_n=64, num_warps=8, num_stages=4, rescale_threshold=8.0, tma=True),   # 161, 214,016
    dict(block_m=128, block_n=128, num_warps=8, num_stages=2, rescale_threshold=8.0, tma=True),  # 196, 214,016
    dict(block_m=128, block_n=32, num_warps=8, num_stages=3, rescale_threshold=8.0, tma=True),   # 125: 2 / SM
    dict(block_m=64, block_n=64, num_warps=4, num_stages=2, tma=True),              # 142, 107,520: 2 / SM
]
#: also timed at the regression points s = 16 / 128 (besides the default there)
REGRESSION = dict(block_m=64, block_n=64, num_warps=4, num_stages=2, tma=True)

#: ``--suite gluon``: the Gluon kernel's variants
GLUON_VARIANTS = [dict(block_n=128, stages=2), dict(block_n=128, stages=2, pingpong=True), dict(block_n=64, stages=3),
                  dict(block_n=64, stages=4)]
#: ``--suite gluon``: its checks, (b, h, s, t, causal, strided out), and the timed (b, s, t)
GLUON_CHECKS = [(2, 8, 512, 1024, True, False), (1, 8, 512, 512, True, False), (2, 8, 130, 1000, True, False),
                (1, 8, 1, 333, True, False), (2, 8, 200, 700, False, False), (1, 8, 64, 64, True, False),
                (2, 8, 300, 777, True, True)]
GLUON_TIMES = [(32, 512, 4096), (32, 1024, 4096), (4, 4096, 4096), (32, 128, 4096), (32, 256, 4096), (32, 64, 4096),
               (32, 16, 4096)]

# (b, s, t, time all candidates?)
TIME_SHAPES = [(32, 512, 4096, True), (32, 1024, 4096, True), (4, 4096, 4096, True),
               (32, 16, 4096, False), (32, 128, 4096, False)]
CHECK_SHAPES = [(1, 512, 1024), (1, 512, 512)]


def check_config(cfg, dims, dtype, device):
    from mla_var3 import reference as R
    from mla_var3.kernel.expanded import flash_attention
    from mla_var3.testing import TOLERANCE, rel_err

    h, d, p = dims
    worst = 0.0
    for b, s, t in CHECK_SHAPES if h == H else [(1, 5, 40), (1, 40, 40)]:
        q, qpe, k, v, kpe = expanded_inputs(b, s, t, h, d, p, dtype, device)
        out = torch.full((b, h, s, d), float("nan"), dtype=dtype, device=device)
        o, lse = flash_attention(q, qpe, k, v, kpe, causal=True, config=cfg, out=out)
        ref_o, ref_lse = R.flash_attention(q, qpe, k, v, kpe, (d + p) ** -0.5, True, None)
        e_o, e_l = rel_err(o, ref_o), rel_err(lse, ref_lse)
        if not (e_o <= TOLERANCE[dtype] and e_l <= TOLERANCE[dtype]):
            raise AssertionError(f"wrong result at b={b} s={s} t={t}: err_o={e_o:.2e} err_lse={e_l:.2e}")
        worst = max(worst, e_o, e_l)
    return worst


def pick_winners(rows: list[dict], problems: list[tuple[int, int, int]]) -> dict:
    """The fastest timed Triton config per problem, and the config with the best geometric mean
    of (default time / its time) over ``problems`` among those timed on all of them: the data to
    re-pick :func:`default_config` from."""
    per_problem, ratios = [], {}
    for b, s, t in problems:
        timed = [r for r in rows if (r["b"], r["s"], r["t"]) == (b, s, t) and r["impl"] == "triton" and r.get("us")]
        dflt = [r for r in timed if r["default"]]
        if not timed or not dflt:
            continue
        best = min(timed, key=lambda r: r["us"])
        entry = dict(b=b, s=s, t=t, best=best["config"], best_us=best["us"], default=dflt[0]["config"],
                     default_us=dflt[0]["us"])
        sdpa = [r["us"] for r in rows if (r["b"], r["s"], r["t"]) == (b, s, t) and r["impl"] == "sdpa" and r.get("us")]
        if sdpa:
            entry["sdpa_over_best"] = sdpa[0] / best["us"]
        per_problem.append(entry)
        for r in timed:
            ratios.setdefault(r["config"], []).append(dflt[0]["us"] / r["us"])
    full = {c: v for c, v in ratios.items() if len(v) == len(per_problem) and v}
    overall = None
    if full:
        geo = {c: math.exp(sum(math.log(x) for x in v) / len(v)) for c, v in full.items()}
        best = max(geo, key=geo.get)
        overall = dict(best=best, speedup_vs_default=geo[best], problems=len(per_problem), geomean=geo)
    return dict(per_problem=per_problem, overall=overall)


def run_configs(args) -> int:
    """``--suite configs``: the portable kernel's launch configs (the module docstring)."""
    budget = Budget(args.budget or 110.0)

    if args.dry_run:
        from mla_var3.kernel import use_interpreter_without_gpu

        use_interpreter_without_gpu()
    from mla_var3.kernel.expanded import FlashAttentionConfig, default_config, flash_attention
    from mla_var3.runtime.timing import time_fn
    from mla_var3.shapes import MLADims, Problem

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device == "cuda"
    if not gpu and not args.dry_run:
        print("no CUDA device: use --dry-run", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if gpu else torch.float32
    dims = (H, D, P) if not args.dry_run else (4, 32, 16)
    h, d, p = dims
    shapes = TIME_SHAPES if not args.dry_run else [(1, 16, 64, True), (1, 64, 64, True), (1, 4, 64, False)]
    info = environment(dtype=str(dtype), dims=dict(h=h, d=d, p=p), matmul_tflops=args.matmul_tflops,
                       dry_run=args.dry_run)

    # 1. correctness of every config that may be timed
    configs = {}
    for kw in CANDIDATES:
        configs[FlashAttentionConfig(**kw).label()] = FlashAttentionConfig(**kw)
    for b, s, t, all_cands in shapes:
        cfg = default_config(MLADims(h=h, d=d, p=p), Problem(b, s, t))
        configs.setdefault(cfg.label(), cfg)
        if not all_cands:
            extra = FlashAttentionConfig(**REGRESSION) if s > 64 else dataclasses.replace(cfg, tma=True)
            configs.setdefault(extra.label(), extra)
    checks = {}
    for label, cfg in configs.items():
        if budget.left() < 0:
            checks[label] = dict(ok=False, error="skipped: time budget")
            continue
        try:
            err = check_config(cfg, dims, dtype, device)
            checks[label] = dict(ok=True, max_rel_err=err)
            print(f"check {label:16s} ok (max rel err {err:.2e})", flush=True)
        except Exception as exc:
            checks[label] = dict(ok=False, error=error_text(exc, 400))
            print(f"check {label:16s} FAILED: {checks[label]['error']}", flush=True)
            traceback.print_exc(limit=2)
        if gpu:
            torch.cuda.empty_cache()

    # 2. timing
    reps = dict(warmup=2, reps=30, min_reps=3, max_seconds=0.4) if gpu else dict(warmup=0, reps=1, min_reps=1)
    rows = []
    for b, s, t, all_cands in shapes:
        dflt = default_config(MLADims(h=h, d=d, p=p), Problem(b, s, t))
        cand_labels = [FlashAttentionConfig(**kw).label() for kw in CANDIDATES]
        extra = FlashAttentionConfig(**REGRESSION) if s > 64 else dataclasses.replace(dflt, tma=True)
        labels = [dflt.label()] + ([c for c in cand_labels if c != dflt.label()] if all_cands else
                                   [extra.label()] if extra.label() != dflt.label() else [])
        try:
            q, qpe, k, v, kpe = expanded_inputs(b, s, t, h, d, p, dtype, device)
        except Exception as exc:
            print(f"b={b} s={s} t={t}: inputs failed: {exc}", flush=True)
            continue
        fl = flops(b, s, t, h, d, p)
        for label in labels:
            row = dict(b=b, s=s, t=t, impl="triton", config=label, default=label == dflt.label(), flops=fl)
            if not checks.get(label, {}).get("ok"):
                row["error"] = "not timed: " + checks.get(label, {}).get("error", "unchecked")
            elif budget.left() < 0:
                row["error"] = "skipped: time budget"
            else:
                try:
                    out = torch.empty((b, h, s, d), dtype=dtype, device=device)
                    cfg = configs[label]
                    tm = time_fn(lambda: flash_attention(q, qpe, k, v, kpe, causal=True, config=cfg, out=out), **reps)
                    row.update(us=tm.median_us, p10_us=tm.p10_us, p90_us=tm.p90_us, method=tm.method)
                except Exception as exc:
                    row["error"] = error_text(exc, 400)
            rows.append(row)
            print(f"b={b} s={s} t={t} {label:16s} {row.get('us', float('nan')):10.1f} us {row.get('error', '')}",
                  flush=True)
        del q, qpe, k, v, kpe
        if gpu:
            torch.cuda.empty_cache()
        # cuDNN SDPA on the same problem
        row = dict(b=b, s=s, t=t, impl="sdpa", config="", default=False, flops=fl)
        if budget.left() < 0:
            row["error"] = "skipped: time budget"
        else:
            try:
                xs = expanded_inputs(b, s, t, h, d, p, dtype, device)
                call, how = sdpa_call(*xs, causal=True)
                del xs
                row["config"] = how
                tm = time_fn(call, **reps)
                row.update(us=tm.median_us, p10_us=tm.p10_us, p90_us=tm.p90_us, method=tm.method)
            except Exception as exc:
                row["error"] = error_text(exc, 400)
            call = None
            if gpu:
                torch.cuda.empty_cache()
        rows.append(row)
        print(f"b={b} s={s} t={t} sdpa ({row['config']}) {row.get('us', float('nan')):10.1f} us {row.get('error', '')}",
              flush=True)

    # 3. derived numbers and the table
    sdpa_us = {(r["b"], r["s"], r["t"]): r.get("us") for r in rows if r["impl"] == "sdpa"}
    for r in rows:
        if r.get("us"):
            r["tflops"] = r["flops"] / r["us"] / 1e6
            r["pct_matmul"] = 100.0 * r["tflops"] / args.matmul_tflops
            if r["s"] == r["t"]:
                r["tflops_causal_half"] = r["tflops"] / 2
            ref = sdpa_us.get((r["b"], r["s"], r["t"]))
            if ref and r["impl"] == "triton":
                r["sdpa_over_ours"] = ref / r["us"]
    winners = pick_winners(rows, [(b, s, t) for b, s, t, all_cands in shapes if all_cands])
    write_json(args.out, dict(info=info, checks=checks, rows=rows, winners=winners, seconds=budget.elapsed()))

    print(f"\nexpanded kernel, {info['device']}, {info['dtype']}, h={h} d={d} p={p}; "
          f"% of {args.matmul_tflops:.0f} TFLOP/s on 2bhst(2d+p)")
    print(f"{'b':>3} {'s':>5} {'t':>5} {'impl':6} {'config':22} {'us':>10} {'TFLOP/s':>8} {'%mm':>6} {'sdpa/ours':>9}")
    for r in rows:
        mark = "*" if r["default"] else " "
        if r.get("us"):
            print(f"{r['b']:>3} {r['s']:>5} {r['t']:>5} {r['impl']:6} {mark}{r['config']:21} {r['us']:>10,.1f} "
                  f"{r['tflops']:>8.1f} {r['pct_matmul']:>6.1f} {r.get('sdpa_over_ours', float('nan')):>9.3f}")
        else:
            print(f"{r['b']:>3} {r['s']:>5} {r['t']:>5} {r['impl']:6} {mark}{r['config']:21} {r.get('error', '')[:60]}")
    print("\nfastest config per problem (default = today's default_config):")
    for w in winners["per_problem"]:
        print(f"  b={w['b']:>3} s={w['s']:>5} t={w['t']:>5}: {w['best']:22s} {w['best_us']:>10,.1f} us, "
              f"default {w['default']} {w['default_us']:>10,.1f} us ({w['default_us'] / w['best_us']:.3f}x), "
              f"sdpa/best {w.get('sdpa_over_best', float('nan')):.3f}")
    if winners["overall"]:
        o = winners["overall"]
        print(f"  over the compute-bound problems (geometric mean of default/config): best {o['best']} "
              f"({o['speedup_vs_default']:.3f}x the default; timed on all {o['problems']} problems)")
    print(f"(* = default config; {budget.elapsed():.0f} s; wrote {args.out})")
    return 0



def gluon_label(v: dict) -> str:
    return f"gluon_n{v['block_n']}s{v['stages']}" + ("p" if v.get("pingpong") else "")


def run_gluon(args) -> int:
    """``--suite gluon``: the Gluon kernel's variants (the module docstring)."""
    require_cuda()
    budget = Budget(args.budget or 240.0)
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
    checks, ok = [], {gluon_label(v): True for v in GLUON_VARIANTS}
    for v in GLUON_VARIANTS:
        for b, h, s, t, causal, strided in GLUON_CHECKS:
            row = dict(variant=gluon_label(v), b=b, h=h, s=s, t=t, causal=causal, strided_out=strided)
            try:
                q, qpe, k, vv, kpe = expanded_inputs(b, s, t, h, D, P, dtype, "cuda")
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
            ok[gluon_label(v)] &= row["ok"]
            checks.append(row)
            print(f"check {row['variant']:14s} b={b} h={h} s={s:4d} t={t:4d} causal={causal:d} strided={strided:d}: "
                  f"{'ok' if row['ok'] else 'FAIL'} {row.get('err_o', float('nan')):.2e} "
                  f"{row.get('err_lse', float('nan')):.2e}", flush=True)

    # 2. timing
    mm = measure_matmul_rate()[0]
    print(f"matmul 8192^3 bf16: {mm:.1f} TFLOP/s", flush=True)
    rows = []
    for b, s, t in GLUON_TIMES:
        if budget.left() < 0:
            print("time budget exceeded: stopping", flush=True)
            break
        q, qpe, k, vv, kpe = expanded_inputs(b, s, t, H, D, P, dtype, "cuda")
        out = torch.empty((b, H, s, D), dtype=dtype, device="cuda")
        cfg = default_config(MLADims(h=H, d=D, p=P), Problem(b, s, t))
        impls = [("triton_" + cfg.label(), lambda: flash_attention(q, qpe, k, vv, kpe, config=cfg, out=out,
                                                                   backend="triton"))]
        impls += [(gluon_label(v), (lambda v=v: flash_attention_gluon(q, qpe, k, vv, kpe, scale=(D + P) ** -0.5,
                                                                       out=out, **v)))
                  for v in GLUON_VARIANTS if ok[gluon_label(v)]]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--suite", choices=("configs", "gluon"), default="configs",
                    help="the portable kernel's launch configs (default) or the Gluon kernel's variants")
    ap.add_argument("--dry-run", action="store_true", help="configs: tiny shapes, CPU/interpreter allowed: plumbing only")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds; what is left is skipped after it (default 110 for configs, 240 for gluon)")
    ap.add_argument("--matmul-tflops", type=float, default=MATMUL_TFLOPS,
                    help="configs: the matmul rate the %% column is of (gluon measures it)")
    args = ap.parse_args()
    if args.suite == "gluon" and args.dry_run:
        ap.error("--dry-run: the Gluon kernel does not run under the interpreter")
    return run_gluon(args) if args.suite == "gluon" else run_configs(args)


if __name__ == "__main__":
    sys.exit(main())

"""The decode planner's cost constants against the measured kernel time, on ragged paged batches
(sm_90, DeepSeek widths, bf16), beside official FlashMLA in one process.

The planner (:mod:`mla_var3.kernel.decode_plan`) picks each batch's item length C (in 64-key
blocks) by an estimate in block-times. For each ragged row of ``serving_check.py`` (the same
lengths: seed 5) and C at multiples of the estimate's choice (0.5x ... 3x), the plan is built on
the host by the planner's Python reference (at 1x bit-for-bit the device planner's plan),
checked once against the fp32 reference, and ``flash_mla_paged(..., plan=plan)`` is timed in a
CUDA graph (kernel time: the plan is given, so no planning launch). Official FlashMLA's graph
time on the same inputs is the yardstick. A table last; everything to ``--out`` as JSON.

    python benchmarks/plan_sweep.py --out benchmarks/results/h200/serving/plan-sweep.json --flash-mla DIR
"""

from __future__ import annotations

import sys

import torch

from common import baseline_parser, environment, import_flash_mla, require_cuda, timed, write_json
from serving_check import K, RAGGED, make_paged, reference, rel

#: the item length C as a multiple of the estimate's choice (1: the shipped planner)
VARIANTS = [1, 0.5, 0.7, 1.4, 2.0, 3.0]


def plan_for(lengths: list[int], rows: int, capacity: int, scale: float, device) -> tuple:
    """(DecodePlan, stats): the planner's reference plan with its item length C scaled by
    ``scale`` (1: the estimate's own choice)."""
    from mla_var3.kernel import decode_plan as dp

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ref = dp.plan_reference(lengths, rows, capacity=capacity, k=K, sms=sms)
    if scale != 1:
        c = min(max(round(ref["item_blocks"] * scale), dp.MIN_ITEM_BLOCKS), dp.MAX_ITEM_BLOCKS)
        ref = dp.plan_reference(lengths, rows, capacity=capacity, k=K, sms=sms, item_blocks=c)
    live = [it for it in ref["items"] if it[0] >= 0]
    stats = dict(item_blocks=ref["item_blocks"], items=len(live), split_items=sum(1 for it in live if it[3] >= 0))
    return dp.plan_tensors(ref, rows, capacity, device), stats


def main() -> int:
    ap = baseline_parser(__doc__)
    args = ap.parse_args()
    require_cuda()
    from mla_var3 import flash_mla_paged

    fm = import_flash_mla(args.flash_mla)
    scale = (K + 64) ** -0.5
    rows_out, checks = [], []
    timing = dict(max_seconds=0.3)
    g = torch.Generator().manual_seed(5)
    for b, s, tmax in RAGGED:
        lengths = torch.randint(tmax // 8, tmax + 1, (b,), generator=g).tolist()
        q, cache, table, seqlens = make_paged(lengths, s, capacity=tmax, seed=b * 100 + s, poison=False)
        qt = q.transpose(1, 2)
        causal = s > 1
        base = dict(b=b, s=s, t_max=tmax)
        if fm is not None:
            meta, _ = fm.get_mla_metadata()
            timed(rows_out, f"b{b} s{s} t{tmax} FlashMLA", lambda: fm.flash_mla_with_kvcache(
                q, cache, table, seqlens, K, meta, None, softmax_scale=scale, causal=causal),
                timing=timing, impl="flashmla", **base)
        want = reference(q, cache, table, seqlens, causal=causal, scale=scale)
        for variant in VARIANTS:
            plan, stats = plan_for(lengths, 128 * s, tmax, variant, "cuda")

            def call(plan=plan):
                return flash_mla_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, scale=scale, causal=causal,
                                       plan=plan)
            o, lse = call()
            err = rel(o.transpose(1, 2), want[0])
            checks.append(dict(**base, variant=variant, err=err, ok=err < 1e-2))
            if err >= 1e-2:
                print(f"FAIL b{b} s{s} {variant}: {err:.2e}")
                continue
            timed(rows_out, f"b{b} s{s} t{tmax} C x {variant}: C={stats['item_blocks']} items={stats['items']} "
                  f"split={stats['split_items']}", call, timing=timing, impl="ours", variant=variant, **stats, **base)
    write_json(args.out, dict(info=environment(flashmla=fm is not None), checks=checks, rows=rows_out))
    print("\n| b | s | t_max | FlashMLA µs | " + " | ".join(f"C x {v}" for v in VARIANTS) + " |")
    print("|---|---|---|---|" + "---|" * len(VARIANTS))
    for b, s, tmax in RAGGED:
        mine = [r for r in rows_out if (r["b"], r["s"], r["t_max"]) == (b, s, tmax)]
        fmv = next((r.get("us") for r in mine if r["impl"] == "flashmla"), None)
        cells = []
        for v in VARIANTS:
            r = next((r for r in mine if r.get("variant") == v), None)
            us = r.get("us") if r else None
            cells.append(f"{us:.1f} ({fmv / us:.2f})" if us and fmv else (f"{us:.1f}" if us else "-"))
        print(f"| {b} | {s} | {tmax} | {fmv or '-'} | " + " | ".join(cells) + " |")
    print(f"checks {sum(c['ok'] for c in checks)}/{len(checks)} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Packed decode plans against one-item-per-program plans (sm_90, DeepSeek widths, bf16), beside
official FlashMLA in one process.

A packed plan (``plan_decode(..., packed=True)``) gives each program a contiguous range of the
batch's key blocks, several sequences in turn, instead of one item. First every plan is checked
against the fp32 reference on NaN-poisoned paged caches with pages in random order and garbage
block-table entries past each sequence — including plans built for a few SMs, so that each
program walks many items (empty sequences, one-block sequences, split ones). Then, on the
serving points of ``serving_check.py`` (the same lengths: seed 5), ``flash_mla_paged`` with
either plan is timed eagerly (plan given: no planning launch) and in a CUDA graph, and official
FlashMLA's call on the same inputs. A table last; everything to ``--out`` as JSON.

    python benchmarks/packed_check.py --out benchmarks/results/h200/serving/packed-<commit>.json --flash-mla DIR
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from common import baseline_parser, environment, import_flash_mla, require_cuda, write_json
from serving_check import K, RAGGED, make_paged, reference, rel

UNIFORM = [(32, 1), (32, 2), (64, 1), (64, 2), (32, 4), (64, 4), (32, 16), (64, 32)]
#: (lengths, s, sms for the plan): programs that walk many items, empty and one-block sequences
CHECKS = [([0, 70, 5000, 1, 64, 65, 129, 3000], 2, 4), ([4096] * 3, 1, 5), ([1] * 40, 1, 132), ([777, 0, 0, 64], 4, 3),
          ([6000, 100, 2500, 40, 9000, 1], 1, 132), ([300] * 64, 8, 132)]


def main() -> int:
    ap = baseline_parser(__doc__)
    args = ap.parse_args()
    require_cuda()
    from mla_var3 import flash_mla_paged
    from mla_var3.kernel.decode_plan import plan_decode
    from mla_var3.runtime.timing import time_fn

    fm = import_flash_mla(args.flash_mla)
    scale = (K + 64) ** -0.5
    checks, rows_out = [], []
    for i, (lengths, s, sms) in enumerate(CHECKS):
        cap = max(lengths) + 200
        q, cache, table, seqlens = make_paged(lengths, s, capacity=cap, seed=40 + i, table_garbage="garbage")
        qt = q.transpose(1, 2)
        ref = reference(q, cache, table, seqlens, causal=s > 1, scale=scale)
        for packed in (False, True):
            plan = plan_decode(seqlens, 128 * s, capacity=cap, sms=sms, packed=packed)
            o, lse = flash_mla_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, scale=scale, causal=s > 1,
                                     plan=plan)
            torch.cuda.synchronize()
            eo, el = rel(o.transpose(1, 2), ref[0]), rel(lse, ref[1])
            ok = eo < 1e-2 and el < 1e-3
            checks.append(dict(lengths=lengths, s=s, sms=sms, packed=packed, out_err=eo, lse_err=el, ok=ok))
            print(f"{'ok  ' if ok else 'FAIL'} check {i} packed={packed} sms={sms}: out {eo:.2e} lse {el:.2e}", flush=True)

    g = torch.Generator().manual_seed(5)
    points = [("uniform", b, s, 4096, [4096] * b) for b, s in UNIFORM]
    for b, s, t in RAGGED:
        points.append(("ragged", b, s, t, torch.randint(t // 8, t + 1, (b,), generator=g).tolist()))
    for kind, b, s, t, lengths in points:
        q, cache, table, seqlens = make_paged(lengths, s, capacity=t, seed=b * 100 + s, poison=False)
        qt = q.transpose(1, 2)
        qc, qpe = qt[..., :K], qt[..., K:]
        causal = s > 1
        row = dict(kind=kind, b=b, s=s, t_max=t, mean_len=sum(lengths) / b)
        ref = reference(q, cache, table, seqlens, causal=causal, scale=scale)
        for name, packed in (("items", False), ("items_in_packed_kernel", False), ("packed", True), ("auto", None)):
            plan = plan_decode(seqlens, 128 * s, capacity=t, packed=packed)
            if name == "items_in_packed_kernel":    # the item plan, one item per program, in the packed kernel
                plan = dataclasses.replace(plan, starts=torch.arange(plan.max_items + 1, dtype=torch.int32,
                                                                     device=plan.items.device))
            fn = lambda plan=plan: flash_mla_paged(qc, qpe, cache, table, seqlens, scale=scale, causal=causal, plan=plan)
            o, lse = fn()
            eo = rel(o.transpose(1, 2), ref[0])
            checks.append(dict(kind=kind, b=b, s=s, t_max=t, plan=name, out_err=eo, ok=eo < 1e-2))
            row[name] = dict(eager_us=time_fn(fn, use_graph=False, max_seconds=0.4).median_us,
                             graph_us=time_fn(fn, use_graph=True, max_seconds=0.4).median_us, out_err=eo)
            if packed is None:   # which plan the planner chose: packed when a program runs several items
                row[name]["chose_packed"] = bool((plan.starts[1:] - plan.starts[:-1]).max() > 1)
        if fm is not None:
            meta, _ = fm.get_mla_metadata()
            ffn = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, None, softmax_scale=scale,
                                                    causal=causal)
            row["flashmla"] = dict(eager_us=time_fn(ffn, use_graph=False, max_seconds=0.4).median_us,
                                   graph_us=time_fn(ffn, use_graph=True, max_seconds=0.4).median_us)
        rows_out.append(row)
        print(kind, b, s, t, {k: v for k, v in row.items() if isinstance(v, dict)}, flush=True)
    write_json(args.out, dict(env=environment(), checks=checks, rows=rows_out))
    print("\n| kind | b | s | t | FlashMLA eager / graph µs | items eager / graph | items in the packed kernel | "
          "packed eager / graph | chosen (plan) eager / graph | FM÷items graph | FM÷packed graph | FM÷chosen graph |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        f, a, p, c, ip = r.get("flashmla"), r["items"], r["packed"], r["auto"], r["items_in_packed_kernel"]
        fm_s = f"{f['eager_us']:.1f} / {f['graph_us']:.1f}" if f else "-"
        ratio = lambda x: f"{f['graph_us'] / x['graph_us']:.2f}" if f else "-"
        print(f"| {r['kind']} | {r['b']} | {r['s']} | {r['t_max']} | {fm_s} | {a['eager_us']:.1f} / {a['graph_us']:.1f} | "
              f"{ip['eager_us']:.1f} / {ip['graph_us']:.1f} | {p['eager_us']:.1f} / {p['graph_us']:.1f} | {c['eager_us']:.1f} / {c['graph_us']:.1f} "
              f"({'packed' if c['chose_packed'] else 'items'}) | {ratio(a)} | {ratio(p)} | {ratio(c)} |")
    failed = [c for c in checks if not c["ok"]]
    print(f"checks: {len(checks) - len(failed)}/{len(checks)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What a compat call pays over the dense item kernel: the same plan through each kernel and launch shape.

On an H200 the compat call ran uniform b = 32, s = 2 at 146 µs in CUDA graphs and the dense
``flash_mla`` call on the same shape at 132 µs, interleaved in one process
(``serving/serving-cb218ae.json``). The two differ in four ways: the compat call plans on the GPU
and, for batches of at most 1.5x the SMs in (sequence, row tile) pairs, runs the persistent kernel
(an item plan one item per program, with a loader warp); it launches the plan's full program
capacity (most programs exit at once); it launches the combine whatever the plan; and it reads a
paged cache. This times, per point and in one process, official FlashMLA and:

* ``compat``: ``flash_mla_with_kvcache`` with its metadata (the plan built once);
* ``persist``: ``seesaw_attention`` on the paged cache with the compat call's plan in the persistent
  kernel alone (the compat call's launch before the plan's kind was gated; since then a plan whose
  kind the GPU chose runs through both kernels, each exiting unless the plan is its kind);
* ``trim``: that plan with its program list cut to the programs that have work (no empty programs);
* ``items``: that plan's items one program each in the item kernel (no loader warp);
* ``items-nc``: as ``items`` without the combine when no item is split;
* ``packed``: ragged points where the default does not weigh packing (``--points wide``), the
  packed plan forced (``plan_decode(packed=True)``, the persistent kernel alone);
* ``order-c8`` (``--order-ab``): ragged item-plan points, the planner's cut with its items in the
  order before 075d7cb (eight size classes relative to C) — against ``compat``, the order's effect;
* ``c<C>`` (``--cuts C,...``): ragged points, the item plan cut at C blocks per item
  (``plan_reference(item_blocks=C)``) in the item kernel;
* ``itemplan``: where the GPU packed, the item plan it chose against (``plan_decode(packed=False)``)
  in the item kernel; the notes give the planner's estimate ratio (packed / item plan), which
  it compares with ``PACKED_WHEN_BELOW``;
* ``dense``: the cache's contents copied to dense ``[B, T, K]`` / ``[B, T, P]`` tensors, the same
  query views, the host's uniform plan (uniform points only);
* ``cstar`` / ``cstar-persist``: ragged points, the item plan whose item length is the smallest that
  fits the batch in one wave (``plan_reference(item_blocks=C*)``) in the item kernel and, trimmed,
  in the persistent kernel.

Every variant is checked against the fp32 reference, then CUDA-graph and eager time are taken in
rounds, every variant in every repetition with the order rotated (``time_interleaved``; L2
flushed); a table last. (The record ``serving/paths-de2176b.json`` was taken with the variants
one after the other within each round.)

    python benchmarks/plan_paths.py --out paths.json [--flash-mla DIR] [--rounds 2]
"""

from __future__ import annotations

import statistics
import time
import traceback
from dataclasses import replace

import torch

from common import (baseline_parser, environment, import_flash_mla, interleaved_rounds, print_ratio_table, rel,
                    require_cuda, write_json)
from plan_order_sim import classes_of_c, ragged_lengths

H, K, P, PAGE = 128, 512, 64, 64
POINTS = [("uniform", 32, 1, 4096), ("uniform", 32, 2, 4096), ("uniform", 64, 1, 4096), ("uniform", 32, 16, 4096),
          ("ragged", 8, 1, 32768), ("ragged", 32, 1, 4096), ("ragged", 1, 1, 4096),
          # batches the GPU packs (estimate ratios 0.79-0.84 with these lengths)
          ("ragged", 64, 1, 8192), ("ragged", 16, 2, 32768), ("ragged", 48, 1, 8192), ("ragged", 32, 1, 16384),
          ("ragged", 24, 2, 8192)]
#: ``--points wide``: batches with more (sequence, row tile) pairs than the default weighs packing
#: for (estimate ratios 0.81-0.95 with these lengths), timed against the packed plan forced
WIDE = [("ragged", 32, 4, 16384), ("ragged", 64, 2, 8192), ("ragged", 16, 4, 32768), ("ragged", 32, 4, 4096)]


def serving_points() -> list[tuple]:
    """``serving_check.py``'s ragged rows with its lengths (``plan_order_sim.ragged_lengths``)."""
    return [("ragged", b, s, t, lengths) for (b, s, t), lengths in ragged_lengths().items()]


def build(point, fm, cuts=(), order_ab=False):
    """``(calls {name: fn}, reference (out [b, s, H, K], lse [b, H, s]), notes)`` for one point;
    ``cuts``: item lengths (blocks) whose item plans to time too, on ragged points; ``order_ab``:
    also the item plan in its order before 075d7cb (``order-c8``)."""
    import serving_check
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3.kernel import decode_plan as dp
    from mla_var3.kernel.hopper.absorbed_seesaw import seesaw_attention

    cdiv = dp.cdiv

    kind, b, s, t = point[:4]
    g = torch.Generator().manual_seed(5 + b * 100 + s)
    if len(point) > 4:                      # the lengths given (--points serving)
        lengths = list(point[4])
    else:
        lengths = [t] * b if kind == "uniform" else torch.randint(t // 8, t + 1, (b,), generator=g).tolist()
    q, cache, table, seqlens = serving_check.make_paged(lengths, s, capacity=t, seed=b * 100 + s, poison=True)
    scale, causal, rows = (K + P) ** -0.5, s > 1, H * s
    qt = q.transpose(1, 2)
    qc, qpe = qt[..., :K], qt[..., K:]
    meta, _ = get_mla_metadata()
    calls = {"compat": lambda: flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=causal)}
    calls["compat"]()                       # builds the plan into meta
    torch.cuda.synchronize()
    plan = meta.plan
    notes = {"lengths": lengths, "packed_kernel": plan.starts is not None}

    def paged(pl):
        return lambda: seesaw_attention(qc, qpe, (cache, None), scale=scale, causal=causal, seqlens=seqlens, plan=pl,
                                        block_table=table)

    # the persistent kernel alone on the plan (the compat call runs both kernels on a plan whose kind
    # the GPU chose: each exits unless the plan is its kind)
    calls["persist"] = paged(replace(plan, packed=None))
    items_h = plan.items.cpu().tolist()
    live = sum(1 for it in items_h if it[0] >= 0)
    split = any(it[3] >= 0 for it in items_h)
    notes.update(items=live, split=split, programs=plan.programs)
    if plan.starts is not None:
        starts_h = plan.starts.cpu().tolist()
        used = max((p + 1 for p in range(len(starts_h) - 1) if starts_h[p + 1] > starts_h[p]), default=1)
        notes.update(packed=starts_h[:live + 1] != list(range(live + 1)), programs_used=used)
        calls["trim"] = paged(replace(plan, starts=plan.starts[:used + 1].clone(), packed=None))
        if not notes["packed"]:
            calls["items"] = paged(replace(plan, starts=None))
            if not split:
                calls["items-nc"] = paged(replace(plan, starts=None, may_split=False))
        else:
            # what the GPU chose against: the item plan, in the item kernel
            calls["itemplan"] = paged(dp.plan_decode(seqlens, rows, capacity=t, k=K, packed=False))
    elif kind == "ragged":
        # the default runs the item plan without weighing packing: the packed plan, forced
        calls["packed"] = paged(dp.plan_decode(seqlens, rows, capacity=t, k=K, packed=True))
    ref_items = dp.plan_reference(lengths, rows, capacity=t, k=K)      # the item plan, on the host
    if order_ab and kind == "ragged" and not notes.get("packed", False):
        # the planner's own cut in the order before 075d7cb: eight size classes relative to C
        calls["order-c8"] = paged(dp.plan_tensors(classes_of_c(ref_items), rows, t, q.device))
    for c_len in cuts if kind == "ragged" else ():
        # the item plan cut at c_len blocks (the estimate's choice overridden), in the item kernel
        calls[f"c{c_len}"] = paged(dp.plan_tensors(dp.plan_reference(lengths, rows, capacity=t, k=K,
                                                                     item_blocks=c_len), rows, t, q.device))
    if kind == "ragged" or plan.starts is not None:
        notes["estimate_ratio"] = (dp.packed_reference(lengths, rows, capacity=t, k=K)["estimate"]
                                   / ref_items["estimate"])
    if kind == "uniform":
        nb = cdiv(t, PAGE)
        dense = cache[table[:, :nb].long()].reshape(b, nb * PAGE, K + P)[:, :t]
        z, kpe = dense[..., :K].contiguous(), dense[..., K:].contiguous()
        calls["dense"] = lambda: seesaw_attention(qc, qpe, (z, kpe), scale=scale, causal=causal, seqlens=None,
                                                  plan=None)
    else:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        slots = sms // cdiv(rows, 64)
        blocks = [cdiv(n, PAGE) for n in lengths]
        c_star = dp.one_wave_cut(blocks, slots)
        fits = sum(max(1, cdiv(n, c_star)) for n in blocks) <= slots
        notes["c_star"] = c_star if fits else None
        if fits:
            ref = dp.plan_reference(lengths, rows, capacity=t, k=K, item_blocks=c_star, sms=sms)
            cplan = dp.plan_tensors(ref, rows, t, q.device)
            clive = sum(1 for it in ref["items"] if it[0] >= 0)
            notes["c_star_items"] = clive
            calls["cstar"] = paged(cplan)
            calls["cstar-persist"] = paged(replace(cplan, starts=torch.arange(clive + 1, dtype=torch.int32,
                                                                                device=q.device)))
    if fm is not None:
        fmeta, _ = fm.get_mla_metadata()
        calls["flashmla"] = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, fmeta, None,
                                                              softmax_scale=scale, causal=causal)
    want = serving_check.reference(q, cache, table, seqlens, causal=causal, scale=scale)
    return calls, want, notes


def as_flashmla(name, o, lse):
    """Outputs in FlashMLA's layout: out [b, s, H, K], lse [b, H, s]."""
    if name in ("compat", "flashmla"):
        return o, lse
    return o.transpose(1, 2), lse


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cool", type=float, default=2.0, help="idle seconds before each point")
    ap.add_argument("--cuts", default="", help="comma list of item lengths (blocks): also time the item plan cut "
                    "at each on the ragged points (variants c<length>)")
    ap.add_argument("--order-ab", action="store_true",
                    help="on ragged item-plan points, also the plan in the items' order before 075d7cb (order-c8)")
    ap.add_argument("--points", choices=("default", "wide", "all", "serving"), default="default",
                    help="the batches to time: the default list, WIDE (against a forced packed plan), both, or "
                         "serving_check.py's ragged rows with its lengths")
    args = ap.parse_args()
    require_cuda()
    fm = import_flash_mla(args.flash_mla)
    record = {"env": environment(flashmla=fm is not None), "checks": [], "rows": []}
    cuts = [int(c) for c in args.cuts.split(",") if c]
    points = {"default": POINTS, "wide": WIDE, "all": POINTS + WIDE, "serving": serving_points()}[args.points]
    for point in points:
        label = "{} b{} s{} t{}".format(*point[:4])
        try:
            calls, want, notes = build(point, fm, cuts, args.order_ab)
            for name, fn in calls.items():
                o, lse = as_flashmla(name, *fn())
                torch.cuda.synchronize()
                eo, el = rel(o, want[0]), rel(lse, want[1])
                ok = eo <= 1e-2 and el <= 1e-3
                record["checks"].append(dict(point=label, variant=name, rel_out=eo, rel_lse=el, ok=ok))
                print(f"{'ok  ' if ok else 'FAIL'} {label} {name}: out {eo:.2e} lse {el:.2e}", flush=True)
            torch.cuda.synchronize()
            time.sleep(args.cool)
            graph, eager = interleaved_rounds(calls, args.rounds)
            row = dict(point=label, notes={k: v for k, v in notes.items() if k != "lengths"},
                       lengths=notes["lengths"], graph_us={n: statistics.median(v) for n, v in graph.items()},
                       eager_us={n: statistics.median(v) for n, v in eager.items()}, graph_samples=graph,
                       eager_samples=eager)
            record["rows"].append(row)
            print(label, row["notes"], "graph", " ".join(f"{n} {v:.1f}" for n, v in row["graph_us"].items()),
                  "eager", " ".join(f"{n} {v:.1f}" for n, v in row["eager_us"].items()), flush=True)
        except Exception:
            traceback.print_exc()
            record["checks"].append(dict(point=label, ok=False, error=traceback.format_exc()[-600:]))
    write_json(args.out, record)
    names = ["compat", "persist", "trim", "items", "items-nc", "itemplan", "packed", "dense", "cstar", "cstar-persist",
             "order-c8", *(f"c{c}" for c in cuts)]
    for key in ("graph_us", "eager_us"):
        print_ratio_table(f"{key[:-3]} µs (FlashMLA ÷ variant)", record["rows"], key, names)
    bad = [c for c in record["checks"] if not c.get("ok")]
    print(f"\nchecks: {len(record['checks']) - len(bad)} ok, {len(bad)} failed")


if __name__ == "__main__":
    main()

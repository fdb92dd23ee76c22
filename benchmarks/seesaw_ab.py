"""A/B of the seesaw kernel's compile-time schedule constants, side by side with official FlashMLA.

Each variant is a fresh copy of a seesaw module (``--base`` for the reference copy, the
package's ``mla_var3.kernel.hopper.absorbed_seesaw`` or a named copy for the others) whose module
constants are set before its first compile (``name[@file]:CONST=VALUE,...``, e.g.
``fold:_SCHED_FOLD=1``), so every variant runs in one process on the same inputs, with the same
decode plan (``--plans``: the planner's, and/or the item or packed plan forced, each timed as its
own column ``name/kind``):

1. **Smoke**: each variant's smallest dense and paged calls in a child process with a time limit
   (a wrong mbarrier phase hangs the GPU instead of failing); it also fills Triton's cache.
2. **Correctness** of every variant at every point against the fp32 reference
   (:mod:`mla_var3.reference`), dense and paged (pages in random order, lengths ragged).
3. **Timing**: CUDA-graph time (``mla_var3.runtime.timing.time_interleaved``, L2 flushed) of
   every variant and of official FlashMLA at each point, all of them in every repetition (the
   order rotated), in rounds, and the median over rounds. Each row records its batch (b, s, t
   and the lengths).

    python benchmarks/seesaw_ab.py --out ab.json [--flash-mla DIR] [--base FILE] [--base-combine FILE] [--eager] \\
        [--points default|serving|threshold] [--seed N] [--plans auto,item,packed,wide,uncapped,packed@N,itemfit,itemsim,chunksim,item@R] \\
        --variant fold:_SCHED_FOLD=1 --variant g128:_GROUP_K=128,_SCHED_FOLD=1
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import subprocess
import sys
import traceback
from pathlib import Path

import torch

from common import (baseline_parser, environment, import_flash_mla, interleaved_rounds, print_ratio_table, rel,
                    require_cuda, stop_on_sigterm, write_json)

H, K, P, PAGE = 128, 512, 64, 64
DENSE = [(32, 1), (32, 4), (32, 16), (64, 1), (64, 16)]                 # (b, s), t = 4096
PAGED = [("uniform", 32, 1, 4096), ("uniform", 64, 1, 4096), ("uniform", 32, 16, 4096),
         ("ragged", 32, 1, 4096), ("ragged", 64, 2, 8192), ("ragged", 128, 1, 4096), ("ragged", 16, 2, 32768)]
#: ``--points serving``: the paged calls whose plan kind the GPU chooses (both kernels launched),
#: the bar's ragged rows and two uniform rows of the item kernel at s >= 8
SERVING = [("uniform", 32, 1, 4096), ("uniform", 64, 1, 4096), ("uniform", 32, 2, 4096), ("uniform", 32, 16, 4096),
           ("uniform", 64, 8, 4096), ("ragged", 32, 1, 4096), ("ragged", 64, 1, 8192), ("ragged", 8, 1, 32768),
           ("ragged", 1, 1, 4096), ("ragged", 16, 2, 32768), ("ragged", 32, 4, 16384), ("ragged", 48, 1, 8192)]


def load_variant(name: str, path: str, consts: dict):
    """A fresh module from ``path`` named ``seesaw_<name>`` with ``consts`` set as Gluon constexprs."""
    from triton.experimental.gluon import language as gl

    spec = importlib.util.spec_from_file_location(f"seesaw_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    for key, value in consts.items():
        if not hasattr(mod, key):
            raise ValueError(f"variant {name}: {path} has no constant {key}")
        setattr(mod, key, gl.constexpr(value))
    return mod


def use_combine(mod, path: str) -> None:
    """Make the seesaw module ``mod`` merge its split items with the combine of module file ``path``
    (a base commit's copy), loaded fresh."""
    spec = importlib.util.spec_from_file_location(f"combine_{mod.__name__}", path)
    comb = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = comb
    spec.loader.exec_module(comb)
    mod.combine_planned, mod.bind_combine_planned = comb.combine_planned, comb.bind_combine_planned


def parse_variants(specs: list[str], base: str | None) -> list[tuple[str, str, dict]]:
    """``[(name, module file, constants)]``: the base copy first (when given), then each spec
    ``name[@file]:CONST=VALUE,...`` (the package's module unless a file is named); with neither,
    the package's module as ``head``, so that a run always times the kernel."""
    import mla_var3.kernel.hopper.absorbed_seesaw as pkg

    out = [("base", base, {})] if base else []
    for spec in specs:
        head, _, rest = spec.partition(":")
        name, _, path = head.partition("@")
        consts = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            consts[key] = int(value)
        out.append((name, path or pkg.__file__, consts))
    return out or [("head", pkg.__file__, {})]


def dense_inputs(b, s, t, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *shape, std=1.0: (torch.randn(*shape, generator=g, device="cuda") * std).to(torch.bfloat16)
    return r(b, H, s, K, std=0.5), r(b, H, s, P, std=0.5), r(b, t, K), r(b, t, P)


def paged_inputs(lengths, s, capacity, seed):
    """q [b, s, H, K+P], cache [pages, 64, 1, K+P] (pages in random order, NaN in unused rows),
    table [b, max_blocks] int32 (-1 past each sequence), seqlens [b] int32."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    b, max_blocks = len(lengths), math.ceil(capacity / PAGE)
    used = [math.ceil(n / PAGE) for n in lengths]
    n_pages = sum(used) + 1
    cache = torch.randn(n_pages, PAGE, 1, K + P, generator=g).to(torch.bfloat16)
    perm = torch.randperm(n_pages, generator=g)
    table = torch.full((b, max_blocks), -1, dtype=torch.int32)
    nxt = 0
    for i, (n, u) in enumerate(zip(lengths, used)):
        pages = perm[nxt: nxt + u]
        nxt += u
        table[i, :u] = pages.to(torch.int32)
        tail = u * PAGE - n
        if tail:
            cache[pages[-1], PAGE - tail:] = float("nan")
    q = (torch.randn(b, s, H, K + P, generator=g) * 0.5).to(torch.bfloat16)
    return q.cuda(), cache.cuda(), table.cuda(), torch.tensor(lengths, dtype=torch.int32).cuda()


#: ``--points threshold``: gated shapes (at most 1.5 (sequence, row tile) pairs per SM) drawn until
#: the planner's estimate ratio (packed ÷ item) falls in each of :data:`THRESHOLD_BANDS`
THRESHOLD_SHAPES = [(32, 1, 4096), (48, 1, 4096), (64, 1, 4096), (96, 1, 4096), (16, 2, 8192), (24, 2, 16384),
                    (32, 2, 8192), (16, 4, 8192), (8, 1, 16384)]
THRESHOLD_BANDS = [(0.85, 0.88), (0.88, 0.91), (0.91, 0.95)]
#: the packed layout's overhead blocks per sequence that the bands' estimate ratio is computed with by
#: default: 2, the planner's when the seeds' batches were recorded (4447964, 36c56ba), so that a seed keeps
#: its batches whatever ``decode_plan.PACK_OVERHEAD`` is now; 19fd529 drew seed 8 with 4
THRESHOLD_OVERHEAD = 2
#: the item cut ranking the bands' estimate ratio is computed with: "spread", the planner's when the
#: seeds' batches were recorded (up to bd5d463), so that a seed keeps its batches
THRESHOLD_RANKING = "spread"


def estimate_ratio(lengths: list, s: int, t: int, sms: int = 132, overhead: int = THRESHOLD_OVERHEAD) -> float:
    """The planner's estimates, packed plan (laid out with ``overhead`` blocks per sequence) ÷ the
    gated item plan, of a batch of ``s`` query tokens per sequence and capacity ``t``."""
    from mla_var3.kernel import decode_plan as dp

    packed = dp.packed_reference(lengths, s * H, capacity=t, k=K, sms=sms, overhead=overhead)["estimate"]
    return packed / dp.plan_reference(lengths, s * H, capacity=t, k=K, sms=sms, gated=True,
                                      ranking=THRESHOLD_RANKING)["estimate"]


def threshold_points(sms: int = 132, draws: int = 40, seed: int = 7, overhead: int = THRESHOLD_OVERHEAD) -> list:
    """Ragged batches whose estimate ratio (``packed_reference`` ÷ the gated ``plan_reference``)
    lies in each band of :data:`THRESHOLD_BANDS`, at most one per shape and band: the batches
    on which to time both kinds forced (``--plans item,packed``) against the planner's choice (the kind
    prices of ``decode_plan``).
    Lengths uniform in ``[t / 8, t]`` or skewed (a fifth long, the rest short), seeded per shape;
    a shape's draws stop once every band has its batch. ``seed`` 7 gives the batches the kind
    prices were fitted on; another seed, fresh batches to check them on. The ratio is
    :func:`estimate_ratio` with ``overhead``."""
    out = []
    for b, s, t in THRESHOLD_SHAPES:
        g = torch.Generator().manual_seed(seed + b * 1000 + s * 100 + t)
        found = {}
        for d in range(draws):
            if len(found) == len(THRESHOLD_BANDS):
                break
            if d % 2:
                lengths = torch.randint(t // 8, t + 1, (b,), generator=g).tolist()
            else:
                long = torch.rand(b, generator=g) < 0.2
                short = torch.randint(1, t // 8 + 1, (b,), generator=g)
                lengths = torch.where(long, torch.full((b,), t), short).tolist()
            ratio = estimate_ratio(lengths, s, t, sms, overhead)
            for lo, hi in THRESHOLD_BANDS:
                if lo <= ratio < hi and (lo, hi) not in found:
                    found[(lo, hi)] = (f"paged ragged b{b} s{s} t{t} est {ratio:.3f}", "paged", b, s, t, lengths)
        out += [found[band] for band in THRESHOLD_BANDS if band in found]
    return out


def points(quick: bool, which: str = "default", seed: int = 7):
    """``[(label, kind, b, s, t, lengths)]`` with seeded ragged lengths: ``which`` "default" (the
    dense and paged lists, their first two with ``quick``), "serving" (:data:`SERVING`) or
    "threshold" (:func:`threshold_points` drawn with ``seed``)."""
    if which == "threshold":
        return threshold_points(seed=seed)
    g = torch.Generator().manual_seed(5)
    dense, paged = (DENSE[:2], PAGED[:2]) if quick else (DENSE, PAGED)
    if which == "serving":
        dense, paged = [], SERVING
    out = [(f"dense b{b} s{s}", "dense", b, s, 4096, None) for b, s in dense]
    for kind, b, s, t in paged:
        lengths = [t] * b if kind == "uniform" else torch.randint(t // 8, t + 1, (b,), generator=g).tolist()
        out.append((f"paged {kind} b{b} s{s} t{t}", "paged", b, s, t, lengths))
    return out


#: ``--plans``: the plan a paged call runs: the planner's choice, one kind forced, (``wide``) the
#: planner's choice with packing weighed for every batch (``decode_plan.PACKING_PAIRS_PER_SM`` lifted),
#: or (``uncapped``) the planner's choice with a gated item plan's items not capped
#: (``plan_capacity(..., gated=True)`` sized as an ungated one: the gated item kernel's grid before)
PLAN_KINDS = {"auto": None, "item": False, "packed": True, "wide": None, "uncapped": None}


def plan_kind_ok(kind: str) -> bool:
    """A ``--plans`` entry: a key of :data:`PLAN_KINDS`; ``packed@N``: the packed plan laid out
    with ``N`` overhead blocks per sequence (``decode_plan.PACK_OVERHEAD``), built on the host; or
    ``itemfit``: the item plan whose cut the item kind's price (``decode_plan.ITEM_PRICE``) ranks
    cheapest among the planner's candidates (:func:`priced_item_cut`), built on the host; or
    ``item@R``: the item plan cut by ranking ``R`` of ``decode_plan.RANKINGS`` (e.g. ``item@spread``,
    the planner's ranking before "pairs"), built on the host."""
    if kind.startswith("packed@"):
        return kind[7:].isdigit() and int(kind[7:]) >= 1
    if kind.startswith("item@"):
        from mla_var3.kernel.decode_plan import RANKINGS
        return kind[5:] in RANKINGS
    return kind in PLAN_KINDS or kind in HOST_ITEM_KINDS


#: item plans built on the host: ``itemfit`` (above); ``itemsim`` / ``chunksim``: the item plan cut
#: near-equal / in chunks of C blocks and a remainder (``decode_plan.CUTS``), C the one the list-scheduling
#: simulation of ``cut_ranking_sim.py`` times lowest over every C that fits
HOST_ITEM_KINDS = ("itemfit", "itemsim", "chunksim")


#: ``itemfit`` ranks the cuts of the planner it was measured against (bd5d463): "pairs", near-equal items
ITEMFIT_RANKING = "pairs"


def priced_item_cut(lengths: list, rows: int, capacity: int, sms: int) -> int:
    """The item length C (blocks), among the planner's candidates that fit its buffers, whose item
    plan ``decode_plan.item_makespan`` prices cheapest (ties: the planner's own C first)."""
    from mla_var3.kernel import decode_plan as dp

    own = dp.plan_reference(lengths, rows, capacity=capacity, sms=sms, ranking=ITEMFIT_RANKING)
    slots = dp.row_slots(rows, sms)
    best = (dp.item_makespan(own["items"], slots), own["item_blocks"])
    for c in sorted(set(dp.cut_candidates(lengths, rows, capacity=capacity, sms=sms))):
        ref = dp.plan_reference(lengths, rows, capacity=capacity, sms=sms, item_blocks=c, ranking=ITEMFIT_RANKING)
        if ref["slots_used"] > ref["max_slots"] or len(ref["items"]) > len(own["items"]):
            continue
        m = dp.item_makespan(ref["items"], slots)
        if m < best[0]:
            best = (m, c)
    return best[1]


def host_item_plan(kind: str, lengths: list, rows: int, capacity: int, sms: int) -> dict | None:
    """The host reference's item plan of ``itemfit`` or ``item@R`` (``decode_plan.plan_reference``'s
    dict), None for the other kinds (the device planner builds them)."""
    from mla_var3.kernel import decode_plan

    if kind == "itemfit":
        return decode_plan.plan_reference(lengths, rows, capacity=capacity, k=K, sms=sms, ranking=ITEMFIT_RANKING,
                                          item_blocks=priced_item_cut(lengths, rows, capacity, sms))
    if kind.startswith("item@"):
        return decode_plan.plan_reference(lengths, rows, capacity=capacity, k=K, sms=sms, ranking=kind[5:])
    if kind in ("itemsim", "chunksim"):
        from cut_ranking_sim import best_sim_cut

        cut = "equal" if kind == "itemsim" else "chunk"
        return decode_plan.plan_reference(lengths, rows, capacity=capacity, k=K, sms=sms, cut=cut,
                                          item_blocks=best_sim_cut(lengths, rows, capacity, sms, cut))
    return None


def build_plan(seqlens, rows: int, capacity: int, kind: str):
    """The decode plan of ``kind`` (see :data:`PLAN_KINDS`) for these lengths."""
    from mla_var3.kernel import decode_plan

    if kind.startswith("packed@"):
        return _packed_plan_with_overhead(decode_plan, seqlens, rows, capacity, int(kind[7:]))
    if kind in HOST_ITEM_KINDS or kind.startswith("item@"):
        ref = host_item_plan(kind, seqlens.tolist(), rows, capacity, decode_plan._device_sms(seqlens.device))
        return decode_plan.plan_tensors(ref, rows, capacity, seqlens.device)
    limit, capacity_fn = decode_plan.PACKING_PAIRS_PER_SM, decode_plan.plan_capacity
    if kind == "wide":
        decode_plan.PACKING_PAIRS_PER_SM = float("inf")
    if kind == "uncapped":
        decode_plan.plan_capacity = lambda *a, gated=False: capacity_fn(*a)
    try:
        return decode_plan.plan_decode(seqlens, rows, capacity=capacity, k=K, packed=PLAN_KINDS[kind])
    finally:
        decode_plan.PACKING_PAIRS_PER_SM, decode_plan.plan_capacity = limit, capacity_fn


def _packed_plan_with_overhead(dp, seqlens, rows: int, capacity: int, overhead: int):
    """The packed plan of these lengths with ``overhead`` blocks per sequence in its layout: the
    host reference's plan, as device tensors."""
    ref = dp.packed_reference(seqlens.tolist(), rows, capacity=capacity, k=K, sms=dp._device_sms(seqlens.device),
                              overhead=overhead)
    dev, batch = seqlens.device, len(ref["seqs"])
    items = torch.tensor(ref["items"], dtype=torch.int32).reshape(-1, 4).to(dev)
    seqs = torch.tensor(ref["seqs"], dtype=torch.int32).reshape(batch, 2).to(dev)
    starts = torch.tensor(ref["starts"], dtype=torch.int32).to(dev)
    return dp.DecodePlan(items, seqs, batch, rows, dp.cdiv(capacity, dp.PLAN_BLOCK), ref["max_slots"],
                         starts=starts, packed_programs=len(ref["starts"]) - 1)


def build_calls(mods: dict, point, fm, plans=("auto",)):
    """Per variant (and plan kind of ``plans`` on a paged point: ``name`` for "auto", else
    ``name/kind``) a call ``() -> (o_latent, lse)`` on this point's inputs, the FlashMLA call (or
    None), and the fp32 reference ``(o_latent [b, h, s, K], lse [b, h, s])``."""
    from mla_var3 import reference as R

    label, kind, b, s, t, lengths = point
    scale = (K + P) ** -0.5
    calls, fm_call = {}, None
    if kind == "dense":
        qc, qpe, z, kpe = dense_inputs(b, s, t, seed=b * 100 + s)
        for name, mod in mods.items():
            calls[name] = (lambda m: lambda: m.seesaw_attention(qc, qpe, (z, kpe), scale=scale, causal=True,
                                                                seqlens=None, plan=None))(mod)
        ref = R.flash_mla(qc.float(), qpe.float(), z.float(), kpe.float(), scale, True)
        return calls, fm_call, ref
    q, cache, table, seqlens = paged_inputs(lengths, s, t, seed=b * 100 + s)
    qt = q.transpose(1, 2)
    qc, qpe = qt[..., :K], qt[..., K:]

    def paged_call(mod, plan):
        return lambda: mod.seesaw_attention(qc, qpe, (cache, None), scale=scale, causal=True, seqlens=seqlens,
                                            plan=plan, block_table=table)

    for kind in plans:
        plan = build_plan(seqlens, s * H, table.shape[1] * PAGE, kind)
        for name, mod in mods.items():
            calls[name if kind == "auto" else f"{name}/{kind}"] = paged_call(mod, plan)
    if fm is not None:
        meta, _ = fm.get_mla_metadata()
        fm_call = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, None, softmax_scale=scale,
                                                    causal=True)
    ref = R.flash_mla_paged(qc.float(), qpe.float(), cache.float(), table, seqlens, scale, True)
    return calls, fm_call, ref


def load_all(variants, base_combine: str | None) -> dict:
    mods = {name: load_variant(name, path, consts) for name, path, consts in variants}
    if base_combine and "base" in mods:
        use_combine(mods["base"], base_combine)
    return mods


def smoke(variants, base_combine) -> None:
    """Child process: every variant's smallest dense and paged calls, synchronised."""
    mods = load_all(variants, base_combine)
    small = [("dense b2 s2", "dense", 2, 2, 200, None), ("paged b3 s2", "paged", 3, 2, 256, [100, 65, 1]),
             ("paged b1 s1", "paged", 1, 1, 4096, [4096])]
    for point in small:
        calls, _, ref = build_calls(mods, point, None)
        for name, fn in calls.items():
            o, lse = fn()
            torch.cuda.synchronize()
            print(f"smoke {name} {point[0]}: out {rel(o, ref[0]):.2e} lse {rel(lse, ref[1]):.2e}", flush=True)


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--base", default=None, help="a seesaw module file to run as variant 'base' (e.g. a commit's copy)")
    ap.add_argument("--base-combine", default=None, help="the combine module file the base copy uses")
    ap.add_argument("--eager", action="store_true",
                    help="also time plain (eager) calls between CUDA events: seesaw_attention with its full set-up "
                         "every call (no repeat path), so where the host is slower than the kernel they time that "
                         "path, not the compat call's; serving_check times what users call")
    ap.add_argument("--variant", action="append", default=[],
                    help="name[@module file]:CONST=VALUE,... (the package's module, or a copy, with constants set)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--points", choices=["default", "serving", "threshold"], default="default",
                    help="default: dense and paged rows; serving: the serving rows; threshold: ragged batches "
                         "whose planner estimate (packed / item) lies in 0.85-0.95, to time with --plans item,packed")
    ap.add_argument("--seed", type=int, default=7,
                    help="--points threshold: the batches' seed (7: those the plan kind prices were fitted on)")
    ap.add_argument("--only", default=None,
                    help="only the points whose label contains one of these comma-separated pieces (e.g. 'b32 s4,b48')")
    ap.add_argument("--plans", default="auto",
                    help="paged points: the plan kinds to time, a comma list of auto (the planner's), item, packed, "
                         "wide (the planner's, packing weighed for every batch), uncapped (the planner's, a gated "
                         "item plan's items not capped), packed@N (the packed plan laid out with N overhead blocks "
                         "per sequence), itemfit (the item plan cut where the item price ranks cheapest), item@R (the "
                         "item plan cut by ranking R of decode_plan.RANKINGS, e.g. item@spread), itemsim / chunksim (the item "
                         "plan cut near-equal / in chunks and a remainder, C the list-scheduling simulation's best)")
    ap.add_argument("--smoke", action="store_true", help=argparse_suppress())
    args = ap.parse_args()
    plans = tuple(args.plans.split(","))
    if not plans or not all(plan_kind_ok(k) for k in plans):
        ap.error(f"--plans takes a comma list of {', '.join(PLAN_KINDS)}, packed@N, {', '.join(HOST_ITEM_KINDS)} or item@R, "
                 f"got {args.plans!r}")
    require_cuda()
    variants = parse_variants(args.variant, args.base)
    if args.smoke:
        smoke(variants, args.base_combine)
        return
    child = [sys.executable, __file__, "--smoke", "--out", "-"] + (["--base", args.base] if args.base else [])
    child += ["--base-combine", args.base_combine] if args.base_combine else []
    for v in args.variant:
        child += ["--variant", v]
    proc = subprocess.run(child, capture_output=True, text=True, timeout=400)
    print(proc.stdout[-3000:], proc.stderr[-3000:], flush=True)
    if proc.returncode != 0:
        sys.exit("smoke run failed")
    fm = import_flash_mla(args.flash_mla)
    mods = load_all(variants, args.base_combine)
    record = {"env": environment(), "variants": {n: dict(file=Path(f).name, constants=c) for n, f, c in variants},
              "plans": list(plans), "flashmla": fm is not None,
              "checks": [], "times": []}
    only = None if args.only is None else [piece.strip() for piece in args.only.split(",") if piece.strip()]
    stop_on_sigterm()       # a run stopped by its time limit writes the points measured so far
    try:
        measure_points(args, mods, fm, plans, only, record)
    except KeyboardInterrupt:
        record["partial"] = True
        print(f"stopped: {len(record['times'])} points timed", file=sys.stderr)
    write_json(args.out, record)
    names = list(dict.fromkeys(n for row in record["times"] for n in row["us"] if n != "flashmla"))
    for kind in ("us", "eager_us"):
        if not any(kind in row for row in record["times"]):
            continue
        print_ratio_table(f"{'CUDA-graph' if kind == 'us' else 'eager'} us (FlashMLA / ours)", record["times"], kind,
                          names, digits=3)
    bad = [c for c in record["checks"] if not c.get("ok")]
    print(f"\nchecks: {len(record['checks']) - len(bad)} ok, {len(bad)} failed")


def measure_points(args, mods, fm, plans, only, record) -> None:
    """Check and time every selected point, appending to ``record``'s checks and times."""
    for point in points(args.quick, args.points, args.seed):
        label = point[0]
        if only is not None and not any(piece in label for piece in only):
            continue
        try:
            calls, fm_call, ref = build_calls(mods, point, fm, plans)
            for name, fn in calls.items():
                o, lse = fn()
                torch.cuda.synchronize()
                eo, el = rel(o, ref[0]), rel(lse, ref[1])
                ok = eo <= 1e-2 and el <= 1e-3
                record["checks"].append(dict(point=label, variant=name, rel_out=eo, rel_lse=el, ok=ok))
                print(f"{'ok  ' if ok else 'FAIL'} {label} {name}: out {eo:.2e} lse {el:.2e}", flush=True)
            del ref
            row = {"point": label, "b": point[2], "s": point[3], "t": point[4], "lengths": point[5], "us": {}}
            timed = dict(calls, **({"flashmla": fm_call} if fm_call else {}))
            samples, eager = interleaved_rounds(timed, args.rounds, eager=args.eager)
            row["us"] = {n: statistics.median(v) for n, v in samples.items()}
            row["samples"] = samples
            if args.eager:
                row["eager_us"] = {n: statistics.median(v) for n, v in eager.items()}
                row["eager_samples"] = eager
            record["times"].append(row)
            print(label, "graph", " ".join(f"{n} {v:.1f}" for n, v in row["us"].items()),
                  "eager", " ".join(f"{n} {v:.1f}" for n, v in row.get("eager_us", {}).items()), flush=True)
        except Exception:
            traceback.print_exc()
            record["checks"].append(dict(point=label, ok=False, error=traceback.format_exc()[-600:]))


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()

"""Host time per call of every decode entry point, with and without the caller's state, beside official FlashMLA.

What an eager decode step pays on the CPU per attention call, for each way of calling the
absorbed design, on one sm_90 GPU (``runtime.timing.host_time_us``: bursts of 8 calls, the
device synchronised before each, median):

* ``compat reused`` / ``compat fresh``: ``compat.flash_mla_with_kvcache`` with one metadata
  reused by every call (an engine's decode step) / a new ``get_mla_metadata()`` per call;
* ``paged object`` / ``paged none``: ``flash_mla_paged`` with a caller's ``AbsorbedDecode`` /
  without one (a transient object made per call: its plan built on the GPU at every call);
* ``dense object`` / ``dense none``: ``flash_mla`` over a dense cache, every sequence ``t`` keys
  (a host plan kept per shape);
* ``FlashMLA reused`` / ``FlashMLA fresh``: official FlashMLA's call with its metadata reused /
  new per call (the baseline of each pair);
* with ``--window``: the hybrid's window kernel alone at ``--hybrid-shape``, its flat launch
  against Triton's own launcher (outputs checked equal to the bit first);
* with ``--hybrid``: the hybrid's default call (``mla_var6_plus``; on sm_90 its Gluon backend,
  the parts on two streams) at ``--hybrid-shape``, without and with the caller's
  ``HybridDecode``, each with beside its host time its eager and CUDA-graph times
  (``time_interleaved``: the two calls in the same repetitions, L2 flushed) and one call's time
  from issue to completion (the device synchronised, then ``perf_counter`` around the call and a
  synchronisation; median of 20): an eager time below the host time means the timing loop hid
  host work behind queued GPU work, or the bursts overstate it.

* with ``--eager``: beside each absorbed shape's host times, where an eager call's time above its
  CUDA graph's comes from: each call's CUDA-graph time and eager time (``time_interleaved``, L2
  flushed; the eager time is floored by the call's back-to-back time, ``Timing.floor_us``), the
  back-to-back time of its graph's replays (``Timing.replays_b2b_us``: the same kernels without
  the launch path; when it reads the eager call's excess too, the GPU runs the call slower back
  to back, not the launch path), and a ``torch.profiler`` trace of 4 back-to-back eager calls of ``dense none`` and
  ``FlashMLA reused``: the CUDA runtime calls counted (a synchronisation or a copy there would
  serialise host and GPU), the kernels per call and the idle gaps between kernels.

Every call is checked first against official FlashMLA's output on the same inputs (or against
the package's fp32 reference without it). The calls are timed in ``--rounds`` rounds, each
round timing every call once in turn, so a noisy period of the host touches all of them; the
record keeps every round and the median. The JSON record goes to ``--out``; a table is printed
last.

    python benchmarks/host_time.py --out host.json [--flash-mla DIR] [--shapes 32x1x128,64x2x16] [--hybrid]
"""

from __future__ import annotations

import statistics
import sys

import torch

from common import K, P, baseline_parser, environment, import_flash_mla, make_paged, paged_reference, rel, \
    require_cuda, write_json

#: (b, s, heads) of the absorbed calls; t = --t keys per sequence
SHAPES = ((32, 1, 128), (64, 1, 128), (32, 4, 128), (64, 2, 16))


def parse_shapes(text: str) -> tuple:
    try:
        shapes = tuple(tuple(int(x) for x in item.split("x")) for item in text.split(","))
    except ValueError:
        raise SystemExit(f"--shapes takes BxSxH items separated by commas, got {text!r}")
    if not shapes or any(len(sh) != 3 or min(sh) < 1 for sh in shapes):
        raise SystemExit(f"--shapes takes BxSxH items of positive integers, got {text!r}")
    return shapes


def absorbed_calls(fm, b: int, s: int, h: int, t: int) -> tuple[dict, dict]:
    """The entry points' calls on one shape (uniform lengths ``t``) and their outputs' errors
    against official FlashMLA (or the fp32 reference)."""
    from mla_var3 import compat
    from mla_var3.kernel.absorbed import flash_mla, flash_mla_paged
    from mla_var3.kernel.decode import AbsorbedDecode

    q, cache, table, seqlens = make_paged([t] * b, s, capacity=t, seed=b * 7 + s, poison=False)
    q = q[:, :, :h].contiguous()
    scale = (128 + P) ** -0.5
    causal = s > 1
    qt = q.transpose(1, 2)
    qc, qpe = qt[..., :K].contiguous(), qt[..., K:].contiguous()
    # the dense cache holds the paged one's keys in order, so every call computes the same attention
    rows = cache[table.long()].reshape(b, -1, K + P)[:, :t]
    z, kpe = rows[..., :K].contiguous(), rows[..., K:].contiguous()
    meta = compat.get_mla_metadata()[0]
    dense_owner, paged_owner = AbsorbedDecode(q.device), AbsorbedDecode(q.device)
    calls = {
        "compat reused": lambda: compat.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, softmax_scale=scale,
                                                               causal=causal),
        "compat fresh": lambda: compat.flash_mla_with_kvcache(q, cache, table, seqlens, K,
                                                              compat.get_mla_metadata()[0], softmax_scale=scale,
                                                              causal=causal),
        "paged object": lambda: flash_mla_paged(qc, qpe, cache, table, seqlens, scale=scale, causal=causal,
                                                decode=paged_owner),
        "paged none": lambda: flash_mla_paged(qc, qpe, cache, table, seqlens, scale=scale, causal=causal),
        "dense object": lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal, decode=dense_owner),
        "dense none": lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal),
    }
    if fm is not None:
        fmeta = fm.get_mla_metadata()[0]
        calls["FlashMLA reused"] = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, fmeta,
                                                                     softmax_scale=scale, causal=causal)
        calls["FlashMLA fresh"] = lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K,
                                                                    fm.get_mla_metadata()[0], softmax_scale=scale,
                                                                    causal=causal)
        want = calls["FlashMLA reused"]()[0].float()
    else:
        want = paged_reference(q, cache, table, seqlens, causal=causal, scale=scale)[0]
    errors = {}
    for name, fn in calls.items():
        out = fn()[0]
        if name.startswith(("paged", "dense")):
            out = out.transpose(1, 2)                  # [b, h, s, k] -> FlashMLA's [b, s, h, k]
        errors[name] = rel(out.float(), want)
    return calls, errors


def parse_hybrid_shape(text: str) -> tuple[int, int, int, int]:
    """``BxSxN`` or ``BxSxNxH`` as (b, s, n, h), 128 heads by default."""
    try:
        vals = tuple(int(x) for x in text.split("x"))
    except ValueError:
        vals = ()
    if len(vals) not in (3, 4) or min(vals) < 1:
        raise SystemExit(f"--hybrid-shape takes BxSxN or BxSxNxH of positive integers, got {text!r}")
    return vals if len(vals) == 4 else (*vals, 128)


def issue_to_done_us(fn, reps: int = 20) -> float:
    """One call's wall time from issue to completion (median of ``reps``), the device
    synchronised before each: host work and GPU work in series, plus a synchronisation."""
    import time

    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def hybrid_calls(b: int, s: int, n: int, t: int, h: int = 128) -> dict:
    """The hybrid's default call with a window of ``n`` keys and ``h`` heads, without and with the
    caller's :class:`~mla_var3.kernel.hybrid.HybridDecode`."""
    from mla_var3.kernel.hybrid import HybridDecode, mla_var6_plus

    d = 128
    g = torch.Generator(device="cuda").manual_seed(3)
    rnd = lambda *shape: (torch.randn(*shape, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
    q, qpe, qc = rnd(b, h, s, d), rnd(b, h, s, P), rnd(b, h, s, K)
    z_old, kpe = rnd(b, t - n, K), rnd(b, t, P)
    k_new, v_new = rnd(b, n, h, d), rnd(b, n, h, d)
    dec = HybridDecode(q.device)
    args = (q, qpe, qc, z_old, kpe, k_new, v_new)
    return {"hybrid default": lambda: mla_var6_plus(*args, scale=(d + P) ** -0.5, causal=True),
            "hybrid, HybridDecode": lambda: mla_var6_plus(*args, scale=(d + P) ** -0.5, causal=True, decode=dec)}


def window_calls(b: int, s: int, n: int, h: int, programs: int = 44) -> dict:
    """The hybrid's window kernel alone on one shape, launched two ways: its flat launch (the five
    TMA descriptors encoded from boxes kept per compiled kernel, then Triton's C launcher) and
    Triton's own launcher (a launch hook makes every call take it; the hook is added and removed
    around each call, which costs well under a microsecond)."""
    from triton import knobs

    from mla_var3.kernel.hopper import window_gluon as wg

    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)

    d = 128                                     # the no-RoPE head dim, as in hybrid_calls
    q, qpe, k, v, kpe = randn(b, h, s, d), randn(b, h, s, P), randn(b, n, h, d), randn(b, n, h, d), randn(b, n, P)

    def flat():
        return wg.expanded_window_gluon(q, qpe, k, v, kpe, scale=(d + P) ** -0.5, causal=True, programs=programs)

    def tritons():
        knobs.runtime.launch_enter_hook.add(_no_op)
        try:
            return flat()
        finally:
            knobs.runtime.launch_enter_hook.remove(_no_op)
    return {"window flat launch": flat, "window, Triton's launcher": tritons}


def eager_excess(calls: dict) -> dict:
    """Each call's graph, eager and back-to-back times and its graph replays' back-to-back time
    (µs), and a profile of 4 back-to-back eager calls of ``dense none`` and ``FlashMLA reused``."""
    from torch.profiler import ProfilerActivity, profile

    from mla_var3.runtime.timing import time_interleaved

    graph, eager = time_interleaved(calls, replays=True), time_interleaved(calls, use_graph=False)
    out = {name: dict(graph_us=graph[name].median_us, eager_us=eager[name].median_us,
                      b2b_eager_us=eager[name].floor_us, b2b_replay_us=graph[name].replays_b2b_us)
           for name in calls}
    for name in ("dense none", "FlashMLA reused"):
        if name not in calls:
            continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                calls[name]()
            torch.cuda.synchronize()
        runtime, kernels = {}, []
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels.append((e.time_range.start, e.time_range.end, e.name[:80]))
            elif e.name.startswith("cu"):
                runtime[e.name] = runtime.get(e.name, 0) + 1
        kernels.sort()
        t0 = kernels[0][0] if kernels else 0
        out[name]["profile"] = dict(runtime_calls=runtime,
                                    kernels=[(round(a - t0, 1), round(b - a, 1), n) for a, b, n in kernels],
                                    gaps_us=[round(kernels[i + 1][0] - kernels[i][1], 1)
                                             for i in range(len(kernels) - 1)])
    return out


def _no_op(*args, **kwargs) -> None:
    """A launch hook that does nothing: installed, it sends a launch through Triton's launcher."""


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--shapes", default=",".join("x".join(map(str, sh)) for sh in SHAPES),
                    help="BxSxH items of the absorbed calls, or none (default: %(default)s)")
    ap.add_argument("--t", type=int, default=4096, help="keys per sequence (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over every call (default: %(default)s)")
    ap.add_argument("--calls", type=int, default=160, help="calls timed per call and round (default: %(default)s)")
    ap.add_argument("--hybrid", action="store_true", help="also the hybrid's default call")
    ap.add_argument("--hybrid-shape", default="32x32x1024",
                    help="BxSxN or BxSxNxH of the hybrid call (default: %(default)s, 128 heads)")
    ap.add_argument("--window", action="store_true",
                    help="also the hybrid's window kernel alone at --hybrid-shape: its flat launch against "
                         "Triton's launcher")
    ap.add_argument("--eager", action="store_true",
                    help="also where each absorbed call's eager time above its graph time comes from")
    args = ap.parse_args()
    if args.rounds < 1 or args.calls < 8 or args.t < 64:
        raise SystemExit("--rounds >= 1, --calls >= 8 and --t >= 64 are required")
    require_cuda()
    from mla_var3.runtime.timing import host_time_us, time_interleaved

    fm = import_flash_mla(args.flash_mla)
    record = environment(suite="host_time", flash_mla="official (prebuilt)" if fm is not None else None,
                         t=args.t, rounds=args.rounds, calls=args.calls, timing="runtime.timing.host_time_us, "
                         "bursts of 8 calls, device synchronised before each, median; then median over rounds",
                         points=[])
    groups = []
    for b, s, h in (parse_shapes(args.shapes) if args.shapes != "none" else ()):
        calls, errors = absorbed_calls(fm, b, s, h, args.t)
        groups.append((dict(kind="absorbed", b=b, s=s, h=h, t=args.t, errors=errors), calls))
        bad = {n: e for n, e in errors.items() if not e < 2e-2}
        print(f"b{b} s{s} h{h}: errors vs {'FlashMLA' if fm else 'reference'} "
              f"{ {n: f'{e:.1e}' for n, e in errors.items()} }" + (f"  FAILED {bad}" if bad else ""), flush=True)
        if bad:
            record["failed"] = record.get("failed", []) + [f"b{b} s{s} h{h}: {sorted(bad)}"]
    if args.hybrid:
        b, s, n, h = parse_hybrid_shape(args.hybrid_shape)
        calls = hybrid_calls(b, s, n, args.t, h)
        outs = [fn() for fn in calls.values()]
        same = all(torch.equal(x, y) for x, y in zip(*outs))       # the caller's state changes no result
        print(f"hybrid b{b} s{s} h{h} n{n}: with and without HybridDecode {'equal' if same else 'DIFFER'}", flush=True)
        if not same:
            record["failed"] = record.get("failed", []) + [f"hybrid b{b} s{s} h{h} n{n}: HybridDecode changes the result"]
        groups.append((dict(kind="hybrid", b=b, s=s, h=h, n=n, t=args.t, same_outputs=same), calls))
    if args.window:
        b, s, n, h = parse_hybrid_shape(args.hybrid_shape)
        calls = window_calls(b, s, n, h)
        outs = [fn() for fn in calls.values()]
        same = all(torch.equal(x, y) for x, y in zip(*outs))       # the launch path changes no bit
        print(f"window b{b} s{s} h{h} n{n}: flat and Triton's launch {'equal' if same else 'DIFFER'}", flush=True)
        if not same:
            record["failed"] = record.get("failed", []) + [f"window b{b} s{s} h{h} n{n}: the launch paths differ"]
        groups.append((dict(kind="window", b=b, s=s, h=h, n=n, t=n, same_outputs=same), calls))
    for info, calls in groups:
        for fn in calls.values():
            for _ in range(10):
                fn()
        torch.cuda.synchronize()
        rounds = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                rounds[name].append(host_time_us(fn, calls=args.calls, warmup=2))
        info["host_us"] = {name: statistics.median(v) for name, v in rounds.items()}
        if info["kind"] == "hybrid":             # beside its host time: the GPU time, eager and in a graph
            eager, graph = time_interleaved(calls, use_graph=False), time_interleaved(calls)   # side by side
            info["eager_us"] = {name: eager[name].median_us for name in calls}
            info["graph_us"] = {name: graph[name].median_us for name in calls}
            info["issue_to_done_us"] = {name: issue_to_done_us(fn) for name, fn in calls.items()}
        if info["kind"] == "absorbed" and args.eager:
            info["eager_excess"] = eager_excess(calls)
            for name, e in info["eager_excess"].items():
                prof = e.get("profile")
                print(f"  {name}: graph {e['graph_us']:.1f}, eager {e['eager_us']:.1f}, back to back: eager "
                      f"{e['b2b_eager_us']:.1f}, graph replays "
                      + (f"{e['b2b_replay_us']:.1f}" if e['b2b_replay_us'] is not None else "-") + " µs"
                      + (f"; {len(prof['kernels']) / 4:g} kernels per call, runtime calls {prof['runtime_calls']}, "
                         f"gaps {prof['gaps_us'][:8]} µs" if prof else ""), flush=True)
        info["rounds_us"] = rounds
        record["points"].append(info)
        print(f"{info['kind']} b{info['b']} s{info['s']} h{info['h']}: "
              f"{ {n: round(v, 1) for n, v in info['host_us'].items()} }", flush=True)
    write_json(args.out, record)
    names = sorted({n for p in record["points"] if p["kind"] == "absorbed" for n in p["host_us"]})
    print("\nhost µs per call (median over rounds)\n\n| b | s | h | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for p in record["points"]:
        if p["kind"] == "absorbed":
            print(f"| {p['b']} | {p['s']} | {p['h']} | " + " | ".join(f"{p['host_us'].get(n, float('nan')):.1f}"
                                                                    for n in names) + " |")
        elif p["kind"] == "window":
            print(f"\nwindow b{p['b']} s{p['s']} h{p['h']} n{p['n']}: " + ", ".join(
                f"{name} {us:.1f} µs" for name, us in p["host_us"].items()) + " of host time per call")
        else:
            for name in p["host_us"]:
                print(f"\n{name} b{p['b']} s{p['s']} h{p['h']} n{p['n']} t{p['t']}: host {p['host_us'][name]:.1f} µs, "
                      f"eager {p['eager_us'][name]:.1f} µs, graph {p['graph_us'][name]:.1f} µs, issue to done "
                      f"{p['issue_to_done_us'][name]:.1f} µs")
    if record.get("failed"):
        print("FAILED:", record["failed"], file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()

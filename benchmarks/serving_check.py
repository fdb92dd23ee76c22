"""Serving-shaped decode on an sm_90 GPU, side by side with official FlashMLA in one process.

1. **Smoke** (a child process with a time limit: a wrong mbarrier phase hangs the GPU instead
   of failing): one small paged call, one dense call.
2. **Correctness** against an fp32 reference built here from the paged cache (per sequence:
   gather its pages, softmax over its keys, causal bottom-right for s > 1): the compat call and
   ``flash_mla_paged`` on pages in random order whose unused rows, unused pages and table
   entries past each sequence hold NaN / -1 / garbage; block tables with non-unit strides;
   lengths 1, 63, 64, 65, capacity and 0; ``flash_mla`` dense with and without ``seqlens`` (NaN
   past the lengths) and with ``out=``; official FlashMLA on the same inputs.
3. **CUDA graphs**: the compat call (its plan built inside the capture), ``flash_mla_paged`` and
   the dense ``flash_mla`` captured with ``torch.cuda.graph``; the inputs' contents (lengths, pages,
   queries) changed; the replay compared with an eager call on the new contents.
4. **Host time**: where one eager call's host time goes (cProfile over 200 calls of the compat
   call and the dense ``flash_mla``), beside this host's floor (an empty Triton kernel's launch,
   ``torch.empty``, official FlashMLA's call on the same inputs).
5. **Timing** (``mla_var3.runtime.timing``; L2 flushed before each repetition): per point the
   eager time (CUDA events around plain calls: host work included), the CUDA-graph time and the
   host time per call (300 calls without a synchronisation), for official FlashMLA, the compat
   call, and (uniform rows) the dense ``flash_mla``, after ``--cool`` idle seconds, the calls
   interleaved in every repetition (``time_interleaved``: a call timed right after heavy work
   runs up to 10 % slow while the GPU's clock recovers, so none is always timed after the
   others), over ``--rounds`` rounds; FlashMLA ÷ ours is the median over repetitions of the two
   calls' times in the same repetition, then over rounds. Uniform rows: b in {32, 64} x s in {1, 2, 4, 8, 16,
   32}, t = 4096, causal for s > 1; ragged paged rows: lengths uniform in [t_max / 8, t_max],
   pages in random order. ``--threshold SEED`` times the seeded threshold batches of
   ``threshold_batches.json`` instead (short-item ragged batches whose plan kind the GPU chooses).

The record (device, versions, commit, every check and time) goes to ``--out`` as JSON; a short
table is printed last. Official FlashMLA is imported from ``--flash-mla`` (a folder holding the
``flash_mla`` package) when it is there.

    python benchmarks/serving_check.py --out results.json [--flash-mla DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import traceback

import torch

from common import (H, K, P, baseline_parser, environment, import_flash_mla, make_paged, paged_reference as reference,
                    rel, stop_on_sigterm, threshold_batches)

UNIFORM = [(b, s) for b in (32, 64) for s in (1, 2, 4, 8, 16, 32)]
RAGGED = [(32, 1, 4096), (64, 1, 8192), (128, 1, 4096), (64, 2, 8192), (32, 4, 16384), (8, 1, 32768), (1, 1, 4096),
          (16, 2, 32768), (256, 1, 2048)]


def smoke() -> None:
    """Child process: the smallest paged and dense calls."""
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3 import flash_mla
    q, cache, table, seqlens = make_paged([100, 65, 1], 2, capacity=256, seed=1)
    meta, _ = get_mla_metadata()
    out, lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=True)
    torch.cuda.synchronize()
    ref, _ = reference(q, cache, table, seqlens, causal=True, scale=(K + P) ** -0.5)
    print("smoke paged rel", rel(out, ref))
    qc = torch.randn(2, H, 1, K, device="cuda", dtype=torch.bfloat16)
    qpe = torch.randn(2, H, 1, P, device="cuda", dtype=torch.bfloat16)
    z = torch.randn(2, 200, K, device="cuda", dtype=torch.bfloat16)
    kpe = torch.randn(2, 200, P, device="cuda", dtype=torch.bfloat16)
    flash_mla(qc, qpe, z, kpe, scale=0.05)
    torch.cuda.synchronize()
    print("smoke ok")


class Runner:
    def __init__(self, fm) -> None:
        self.fm = fm
        self.checks: list[dict] = []
        self.times: list[dict] = []

    def check(self, name: str, got, ref, tol=1e-2):
        o, l = got
        ro, rl = ref
        eo, el = rel(o, ro), rel(l, rl)
        ok = eo <= tol and el <= tol and not torch.isnan(o.float()).any().item()
        self.checks.append({"name": name, "rel_out": eo, "rel_lse": el, "ok": bool(ok)})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: out {eo:.2e} lse {el:.2e}", flush=True)
        return ok


def correctness(r: Runner) -> None:
    from mla_var3 import flash_mla
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3.kernel.absorbed import flash_mla_paged

    scale = (K + P) ** -0.5
    cases = [
        ("b3 s1 ragged", [1, 63, 4096], 1, 4096), ("b4 s2 ragged", [64, 65, 2, 3000], 2, 4096),
        ("b2 s4 ragged", [4, 4096], 4, 4096), ("b1 s1 t32k", [32768], 1, 32768), ("b5 s16", [16, 100, 700, 64, 129], 16, 1024),
        ("b8 s1 with empty", [0, 5, 64, 0, 1000, 2, 65, 4096], 1, 4096), ("b32 s1 uniform", [4096] * 32, 1, 4096),
        ("b16 s32 ragged", [32 + 97 * i for i in range(16)], 32, 2048),
    ]
    for name, lengths, s, cap in cases:
        for causal in ((True, False) if s > 1 else (False,)):
            q, cache, table, seqlens = make_paged(lengths, s, capacity=cap, seed=hash(name) % 1000)
            ref = reference(q, cache, table, seqlens, causal=causal, scale=scale)
            meta, _ = get_mla_metadata()
            got = flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=causal)
            r.check(f"compat {name} causal={causal}", got, ref)
    q, cache, table, seqlens = make_paged([70, 300, 1, 2000], 2, capacity=4096, seed=7, table_garbage="garbage")
    ref = reference(q, cache, table, seqlens, causal=True, scale=scale)
    qt = q.transpose(1, 2)
    for tname, tab in (("garbage-past-end", table), ("col-major", table.t().contiguous().t()),
                       ("every-other-col", torch.stack([table, table], 2).reshape(table.shape[0], -1)[:, ::2])):
        got = flash_mla_paged(qt[..., :K], qt[..., K:], cache, tab, seqlens, scale=scale, causal=True)
        r.check(f"paged table {tname}", (got[0].transpose(1, 2), got[1]), ref)
    # dense, with NaN past the lengths, and out=
    g = torch.Generator(device="cuda").manual_seed(3)
    for b, s, t, lens in ((4, 1, 1000, [1000, 1, 64, 999]), (3, 4, 4096, [4096, 65, 4]), (32, 1, 4096, None),
                          (2, 16, 300, None), (1, 1, 65, None)):
        qc = torch.randn(b, H, s, K, device="cuda", generator=g).to(torch.bfloat16) * 0.5
        qpe = torch.randn(b, H, s, P, device="cuda", generator=g).to(torch.bfloat16) * 0.5
        z = torch.randn(b, t, K, device="cuda", generator=g).to(torch.bfloat16)
        kpe = torch.randn(b, t, P, device="cuda", generator=g).to(torch.bfloat16)
        seqlens = None
        if lens is not None:
            seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
            for i, n in enumerate(lens):
                z[i, n:] = float("nan")
                kpe[i, n:] = float("nan")
        from mla_var3.reference import flash_mla as ref_flash_mla
        ro, rl = ref_flash_mla(qc.float(), qpe.float(), torch.nan_to_num(z.float()), torch.nan_to_num(kpe.float()),
                               scale, causal=True, seqlens=seqlens)
        r.check(f"dense b{b} s{s} t{t} seqlens={lens is not None}",
                flash_mla(qc, qpe, z, kpe, scale=scale, causal=True, seqlens=seqlens), (ro, rl))
        out = torch.full((b, s, H, K), float("nan"), device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        got = flash_mla(qc, qpe, z, kpe, scale=scale, causal=True, seqlens=seqlens, out=out)
        r.check(f"dense b{b} s{s} out=strided", (out, got[1]), (ro, rl))
    # official FlashMLA on the same inputs, and its answer for an empty sequence
    if r.fm is not None:
        q, cache, table, seqlens = make_paged([0, 100, 4096, 1], 2, capacity=4096, seed=11)
        ref = reference(q, cache, table, seqlens, causal=True, scale=scale)
        meta, _ = r.fm.get_mla_metadata()
        fo, fl = r.fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, None, softmax_scale=scale, causal=True)
        r.checks.append({"name": "FlashMLA empty sequence", "out_abs_max": float(fo[0].float().abs().max()),
                         "lse": [float(x) for x in fl[0].flatten()[:4]], "out_nan": bool(fo[0].isnan().any())})
        print("FlashMLA, length 0: out max |x|", float(fo[0].float().abs().max()), "lse", fl[0].flatten()[:4].tolist())
        meta2, _ = get_mla_metadata()
        oo, ol = flash_mla_with_kvcache(q, cache, table, seqlens, K, meta2, causal=True)
        print("ours, length 0: out max |x|", float(oo[0].float().abs().max()), "lse", ol[0].flatten()[:4].tolist())
        keep = torch.tensor([1, 2, 3], device="cuda")
        r.check("FlashMLA vs reference (non-empty)", (fo[keep], fl[keep]), (ref[0][keep], ref[1][keep]))


def graphs(r: Runner) -> None:
    """Capture, change the inputs' contents, replay, compare with eager."""
    from mla_var3 import flash_mla
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata

    scale = (K + P) ** -0.5
    for s in (1, 4):
        lens_a = [100, 4000, 1, 2048, 65, 3000, 64, 500]
        lens_b = [4096, 3, 1000, 64, 2000, 1, 129, 4000]
        q, cache, table, seqlens = make_paged(lens_a, s, capacity=4096, seed=21, poison=False)
        q2, cache2, table2, seqlens2 = make_paged(lens_b, s, capacity=4096, seed=22, poison=False)
        n = min(cache.shape[0], cache2.shape[0])
        static = dict(q=q.clone(), cache=cache.clone(), table=table.clone(), seqlens=seqlens.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            meta, _ = get_mla_metadata()
            flash_mla_with_kvcache(static["q"], static["cache"], static["table"], static["seqlens"], K, meta,
                                   causal=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                meta_g, _ = get_mla_metadata()
                out_g, lse_g = flash_mla_with_kvcache(static["q"], static["cache"], static["table"], static["seqlens"],
                                                      K, meta_g, causal=True)
        except Exception as exc:
            r.checks.append({"name": f"graph compat s{s}", "ok": False, "error": repr(exc)[:300]})
            print("FAIL graph capture compat", repr(exc)[:300])
            continue
        # new contents in the same buffers
        static["q"].copy_(q2)
        static["cache"][:n].copy_(cache2[:n])
        ok_tab = table2.clamp_max(n - 1)
        static["table"].copy_(torch.where(table2 >= 0, ok_tab, table2))
        static["seqlens"].copy_(seqlens2)
        graph.replay()
        torch.cuda.synchronize()
        meta_e, _ = get_mla_metadata()
        eager = flash_mla_with_kvcache(static["q"], static["cache"], static["table"], static["seqlens"], K, meta_e,
                                       causal=True)
        r.check(f"graph compat s{s} replay == eager on new contents", (out_g, lse_g), eager, tol=1e-6)
        ref = reference(static["q"], static["cache"], static["table"], static["seqlens"], causal=True, scale=scale)
        r.check(f"graph compat s{s} replay vs reference", (out_g, lse_g), ref)
    # dense flash_mla
    b, s, t = 8, 2, 2048
    x = [torch.randn(b, H, s, K, device="cuda").to(torch.bfloat16), torch.randn(b, H, s, P, device="cuda").to(torch.bfloat16),
         torch.randn(b, t, K, device="cuda").to(torch.bfloat16), torch.randn(b, t, P, device="cuda").to(torch.bfloat16)]
    flash_mla(*x, scale=scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, l_g = flash_mla(*x, scale=scale)
    for v in x:
        v.copy_(torch.randn_like(v, dtype=torch.float32).to(v.dtype))
    graph.replay()
    torch.cuda.synchronize()
    r.check("graph dense replay == eager", (o_g, l_g), flash_mla(*x, scale=scale), tol=1e-6)


def timing(r: Runner, quick: bool, rounds: int = 2, cool: float = 2.0, threshold: int | None = None) -> None:
    from mla_var3 import flash_mla
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3.runtime.timing import host_time_us, time_interleaved

    scale = (K + P) ** -0.5

    def measure(fns: dict) -> dict:
        """One round: every call's eager and CUDA-graph time in the same repetitions (the order
        rotated each repetition), FlashMLA ÷ each call per repetition (medians), host times."""
        eager = time_interleaved(fns, use_graph=False, max_seconds=0.5 * len(fns))
        graph = time_interleaved(fns, use_graph=True, max_seconds=0.5 * len(fns))
        out = {}
        for name in fns:
            out[name] = {"eager_us": eager[name].median_us, "graph_us": graph[name].median_us,
                         "graph_method": graph[name].method, "host_us": host_time_us(fns[name], calls=300)}
            if "flashmla" in fns and name != "flashmla":
                out[name]["fm_ratio_eager"] = eager.ratio("flashmla", name)
                out[name]["fm_ratio_graph"] = graph.ratio("flashmla", name)
        return out

    def point(kind, b, s, lengths, cap, dense_too, label=None):
        q, cache, table, seqlens = make_paged(lengths, s, capacity=cap, seed=b * 100 + s, poison=False)
        row = {"kind": kind, "b": b, "s": s, "t_max": cap, "mean_len": sum(lengths) / len(lengths)}
        if label is not None:
            row.update(label=label, lengths=lengths)
        causal = s > 1
        fns = {}
        if r.fm is not None:
            meta_f, _ = r.fm.get_mla_metadata()
            fns["flashmla"] = lambda: r.fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta_f, None,
                                                                  softmax_scale=scale, causal=causal)
        meta, _ = get_mla_metadata()
        fns["compat"] = lambda: flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=causal)
        if dense_too:
            qt = q.transpose(1, 2).contiguous()
            qc, qpe = qt[..., :K].contiguous(), qt[..., K:].contiguous()
            z = torch.randn(b, cap, K, device="cuda").to(torch.bfloat16)
            kpe = torch.randn(b, cap, P, device="cuda").to(torch.bfloat16)
            fns["dense"] = lambda: flash_mla(qc, qpe, z, kpe, scale=scale, causal=causal)
        # the GPU's power state after the last point's heavy calls slows the first call timed
        # after it (measured: 154 against 140 us at b = 64, s = 1 right after 20 s of b = 32,
        # s = 32, back within a second): an idle pause first, then the calls interleaved in every
        # repetition of every round
        torch.cuda.synchronize()
        time.sleep(cool)
        runs: dict[str, list[dict]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, m in measure(fns).items():
                runs[name].append(m)
        for name, ms in runs.items():
            row[name] = {key: (statistics.median(m[key] for m in ms) if key != "graph_method" else ms[0][key])
                         for key in ms[0]}
            row[name]["rounds"] = ms
        r.times.append(row)
        msg = " ".join(f"{k}: eager {v['eager_us']:.1f} graph {v['graph_us']:.1f} host {v['host_us']:.1f}"
                       for k, v in row.items() if isinstance(v, dict))
        print(f"{kind} b{b} s{s} t{cap}: {msg}", flush=True)

    if threshold is not None:   # the seeded threshold batches, instead of the grid
        for x in threshold_batches(threshold):
            point("threshold", x["b"], x["s"], x["lengths"], x["t"], False, label=x["label"])
        return
    uniform = UNIFORM if not quick else [(32, 1), (64, 1), (32, 16)]
    for b, s in uniform:
        point("uniform", b, s, [4096] * b, 4096, True)
    g = torch.Generator().manual_seed(5)
    for b, s, tmax in (RAGGED if not quick else RAGGED[:3]):
        lengths = torch.randint(tmax // 8, tmax + 1, (b,), generator=g).tolist()
        point("ragged", b, s, lengths, tmax, False)


def host_profile(r: Runner) -> None:
    """Where the host time of one eager call goes: cProfile over 200 calls (top functions by own time)."""
    import cProfile
    import io
    import pstats

    from mla_var3 import flash_mla
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3.runtime.timing import host_time_us

    q, cache, table, seqlens = make_paged([4096] * 32, 1, capacity=4096, seed=1, poison=False)
    meta, _ = get_mla_metadata()
    qt = q.transpose(1, 2).contiguous()
    qc, qpe = qt[..., :K].contiguous(), qt[..., K:].contiguous()
    z = torch.randn(32, 4096, K, device="cuda").to(torch.bfloat16)
    kpe = torch.randn(32, 4096, P, device="cuda").to(torch.bfloat16)
    for name, fn in (("compat", lambda: flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=False)),
                     ("dense", lambda: flash_mla(qc, qpe, z, kpe, scale=0.05, causal=False))):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
        print(f"---- host profile: {name}, 200 calls\n" + buf.getvalue()[-3500:])
        r.checks.append({"name": f"host {name}", "host_us": host_time_us(fn)})
        print(f"host time {name}: {r.checks[-1]['host_us']:.1f} us", flush=True)
    host_floor(r, q, cache, table, seqlens)


def host_floor(r: Runner, q, cache, table, seqlens) -> None:
    """This host's floor for a decode call: an empty Triton kernel's launch, ``torch.empty``, and
    official FlashMLA's compat call on the same inputs (its host time per call)."""
    import triton

    from mla_var3.runtime.timing import host_time_us

    @triton.jit
    def _nothing(x_ptr, n):
        pass

    x = torch.empty(16, device="cuda")
    _nothing[(1,)](x, 1, num_warps=4)
    torch.cuda.synchronize()
    floor = {"empty kernel, Triton launch": host_time_us(lambda: _nothing[(1,)](x, 1, num_warps=4))}
    floor["torch.empty"] = host_time_us(lambda: torch.empty(16, device="cuda"))
    fm = r.fm
    if fm is not None:
        meta, _ = fm.get_mla_metadata()
        floor["FlashMLA compat b32 s1"] = host_time_us(
            lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, None, softmax_scale=0.05))
    for part, us in floor.items():
        r.checks.append({"name": f"host floor: {part}", "host_us": us})
        print(f"host floor: {part}: {us:.1f} us", flush=True)


def table(r: Runner) -> None:
    print("\n| kind | b | s | t | FlashMLA eager / graph / host | compat eager / graph / host | FM÷compat eager | FM÷compat graph | dense eager / graph / host |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in r.times:
        f, c, d = row.get("flashmla"), row["compat"], row.get("dense")
        fmt = lambda m: f"{m['eager_us']:.1f} / {m['graph_us']:.1f} / {m['host_us']:.1f}" if m else "-"
        re_ = f"{c['fm_ratio_eager']:.2f}" if f else "-"
        rg = f"{c['fm_ratio_graph']:.2f}" if f else "-"
        print(f"| {row['kind']} | {row['b']} | {row['s']} | {row['t_max']} | {fmt(f)} | {fmt(c)} | {re_} | {rg} | {fmt(d)} |")
    bad = [c["name"] for c in r.checks if c.get("ok") is False]
    print(f"\nchecks: {sum(1 for c in r.checks if c.get('ok'))} ok, {len(bad)} failed {bad}")


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds per point, the calls interleaved")
    ap.add_argument("--cool", type=float, default=2.0, help="idle seconds before each point's timing")
    ap.add_argument("--threshold", type=int, default=None, metavar="SEED",
                    help="time the threshold batches of this seed (7, 8 or 9: short-item ragged batches whose plan "
                         "kind the GPU chooses; threshold_batches.json) instead of the uniform and ragged rows")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    proc = subprocess.run([sys.executable, __file__, "--smoke", "--out", "-"], capture_output=True, text=True,
                          timeout=180)
    print(proc.stdout[-2000:], proc.stderr[-4000:])
    if proc.returncode != 0:
        sys.exit("smoke run failed")
    fm = import_flash_mla(args.flash_mla)
    r = Runner(fm)
    record = {"env": environment(sms=torch.cuda.get_device_properties(0).multi_processor_count),
              "flashmla": fm is not None}
    for step in (host_profile, correctness, graphs):
        try:
            step(r)
        except Exception:
            traceback.print_exc()
            r.checks.append({"name": step.__name__, "ok": False, "error": traceback.format_exc()[-800:]})
    if not args.skip_timing:
        # a run stopped from outside (SIGTERM: a time limit) still writes the points timed so far
        stop_on_sigterm()
        try:
            timing(r, args.quick, args.rounds, args.cool, args.threshold)
        except KeyboardInterrupt:
            record["partial"] = True
            print(f"stopped: {len(r.times)} points timed", file=sys.stderr)
        except Exception:
            traceback.print_exc()
    record.update(checks=r.checks, times=r.times)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    table(r)


if __name__ == "__main__":
    main()

"""Time the hybrid cache's maintenance per decode step beside the attention call, on a GPU.

At b = 32, t = 4096, DeepSeek-V3 dims, bf16, for s in {1, 16} and n in {0, 256, 1024}:

1. Correctness first: a few steps of :meth:`HybridCache.append` (batched, in place) against the
   per-sequence semantics (:func:`legacy_append`: per sequence ``cat`` of the new tokens, keep
   the n newest in the window, pad-stack the batch) on the GPU, uniform and ragged, s = 1 and
   s > n; exact equality (copies only). A failed check is reported and nothing is timed.
2. Per (s, n), the cache holding t - s tokens (reserved for the steps to come):
   * ``maintenance``: one ``cache = cache.append(z, kpe, k, v)`` of s tokens in a decode loop
     (median per step, ``time_fn`` without CUDA graphs) and the amortised mean over 128
     consecutive steps (includes the window's move to a new buffer every ~slack/s steps);
   * ``maintenance_legacy``: the same step done the old way (per-sequence Python loop, copies);
   * ``attention``: ``mla_attention`` over the cache holding the step (design 'hybrid' at this
     n, 'absorbed' at n = 0), CUDA-graph replays when they capture;
   * per s, ``latent_maintenance`` / ``latent_maintenance_legacy``: ``LatentCache.append`` in
     place against the latent cache's old append (a zeroed buffer, a whole-cache copy, the
     scatter of the new rows);
   * ``layer_step``: ``MLALayer`` decode step (projections, K/V expansion, append, attention,
     o_proj), mode 'hybrid' over the HybridCache (n > 0) or 'absorbed' over a LatentCache (n = 0).
   Beside them: the window's bytes per sequence per layer (``n·h·2d·w``) and the bytes the cache
   reserves. A deadline keeps the run under ``--budget`` seconds: later rows are skipped.
3. A table is printed last; everything goes to ``--out`` as JSON.

    python benchmarks/hybrid_maintenance.py --out benchmarks/results/h200/hybrid_maintenance.json
    python benchmarks/hybrid_maintenance.py --dry-run --out /tmp/hybrid_maintenance_dry.json   # CPU plumbing
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from common import environment, error_text, write_json

B, T = 32, 4096
S_VALUES = (1, 16)
N_VALUES = (0, 256, 1024)
AMORTISED_STEPS = 128


def legacy_append(z, kpe, k_win, v_win, n, z_new, kpe_new, k_new, v_new):
    """The per-sequence maintenance the hybrid cache had before (uniform batch, latent copies kept):
    per sequence concatenate the new tokens, keep the n newest in the window, then pad-stack."""
    parts = []
    for b in range(z.shape[0]):
        t_b, n_b = z.shape[1], k_win.shape[1]
        t2 = t_b + z_new.shape[1]
        o2, o_b = t2 - min(n, t2), t_b - n_b
        parts.append((torch.cat((z[b], z_new[b])), torch.cat((kpe[b], kpe_new[b])),
                      torch.cat((k_win[b], k_new[b]))[o2 - o_b:], torch.cat((v_win[b], v_new[b]))[o2 - o_b:]))
    return tuple(torch.stack([p[j] for p in parts]) for j in range(4))


def _setup(dry: bool):
    from mla_var3.model import MLAConfig, MLALayer
    from mla_var3.shapes import get_preset

    dims = get_preset("deepseek-v3")
    if dry:
        dims = dims.replace(h=4, d=16, p=16, k=32, dv=16, hidden=64, q_lora_rank=48,
                            name="deepseek-v3/small").with_dtype("fp32")
    cfg = MLAConfig(hidden=dims.hidden, h=dims.h, d=dims.d, p=dims.p, k=dims.k, dv=dims.dv,
                    q_lora_rank=dims.q_lora_rank)
    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    layer = MLALayer.random(cfg, dtype=dtype, device=device, seed=0).eval()
    if dry:
        layer.backend = "reference"
    return dims, cfg, layer, device, dtype


def run_checks(cfg, layer, device, dtype) -> list[dict]:
    """Batched maintenance == the per-sequence semantics, on this device."""
    from mla_var3.model import HybridCache, LatentCache

    w = layer.absorbed
    gen = torch.Generator(device="cpu").manual_seed(3)
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
    out = []
    for b, t0, n, steps in ((3, 40, 8, (1, 1, 5, 13)), (2, 9, 16, (1, 16, 2)), (3, 20, 0, (1, 4))):
        try:
            lat = LatentCache(rnd(b, t0, cfg.k), rnd(b, t0, cfg.p))
            cache = HybridCache.from_latent(lat, n, w.w_uk, w.w_uv).reserve(t0 + 8)
            ref = (cache.z.clone(), cache.kpe.clone(), cache.k_win.clone(), cache.v_win.clone())
            ok = True
            for s in steps:
                new = (rnd(b, s, cfg.k), rnd(b, s, cfg.p), rnd(b, s, cfg.h, cfg.d), rnd(b, s, cfg.h, cfg.d))
                cache = cache.append(*new)
                ref = legacy_append(*ref, n, *new)
                ok &= all(torch.equal(x, y) for x, y in zip((cache.z, cache.kpe, cache.k_win, cache.v_win), ref))
            # ragged: against per-sequence appends of one-sequence caches
            lens = [t0, t0 // 2, 1][:b]
            singles = [HybridCache.from_latent(LatentCache(lat.z[i:i + 1, :L], lat.kpe[i:i + 1, :L]), n, w.w_uk, w.w_uv)
                       for i, L in enumerate(lens)]
            rag = HybridCache.stack(singles)
            for s in steps:
                new = (rnd(b, s, cfg.k), rnd(b, s, cfg.p), rnd(b, s, cfg.h, cfg.d), rnd(b, s, cfg.h, cfg.d))
                rag = rag.append(*new)
                singles = [c.append(*(x[i:i + 1] for x in new)) for i, c in enumerate(singles)]
                for i, one in enumerate(singles):
                    ok &= all(torch.equal(x, y) for x, y in zip(rag.parts(i), one.parts()))
            out.append(dict(b=b, t0=t0, n=n, steps=list(steps), ok=bool(ok)))
        except Exception as exc:  # noqa: BLE001
            out.append(dict(b=b, t0=t0, n=n, steps=list(steps), ok=False, error=error_text(exc, 400)))
    return out


def run_timing(dims, cfg, layer, device, dtype, b, t, s_values, n_values, deadline, max_seconds) -> list[dict]:
    from mla_var3.analysis.memory import window_bytes
    from mla_var3.model import mla_attention
    from mla_var3.model import HybridCache, LatentCache
    from mla_var3.model.cache import _append_rows   # the latent cache's old append (a whole-cache copy)
    from mla_var3.runtime.timing import time_fn

    gpu = device == "cuda"
    w = layer.absorbed
    gen = torch.Generator(device="cpu").manual_seed(1)
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)  # noqa: E731
    rows = []

    def add(what, s, n, timing=None, **extra):
        row = dict(what=what, b=b, t=t, s=s, n=n, window_bytes_per_seq_layer=window_bytes(dims, n), **extra)
        if timing is not None:
            row.update(median_us=timing.median_us, p10_us=timing.p10_us, p90_us=timing.p90_us, reps=timing.reps,
                       method=timing.method, gpu=timing.gpu)
        rows.append(row)
        print(f"  s={s:>2} n={n:>4} {what:<20} " + (f"{row['median_us']:>10,.1f} µs" if timing else "")
              + (f"  amortised {extra['amortised_us']:,.1f} µs" if "amortised_us" in extra else "")
              + (f"  {extra['error']}" if "error" in extra else ""), flush=True)

    for s in s_values:
        lat = LatentCache(rnd(b, t - s, cfg.k), rnd(b, t - s, cfg.p))
        new = (rnd(b, s, cfg.k), rnd(b, s, cfg.p), rnd(b, s, cfg.h, cfg.d), rnd(b, s, cfg.h, cfg.d))
        q_nope, q_pe = rnd(b, cfg.h, s, cfg.d), rnd(b, cfg.h, s, cfg.p)
        x = rnd(b, s, cfg.hidden)
        pos = torch.arange(t - s, t, device=device).expand(b, s)
        if time.time() < deadline:   # the latent cache alone: in place vs the old whole-cache copy
            try:
                lat_state = {"c": lat.reserve(t + (AMORTISED_STEPS + 120) * s)}

                def lat_step():
                    lat_state["c"] = lat_state["c"].append(new[0], new[1])

                add("latent_maintenance", s, 0, time_fn(lat_step, warmup=3, reps=100, max_seconds=max_seconds,
                                                        use_graph=False, flush_l2=True))
                del lat_state
                sl = lat.seqlens
                add("latent_maintenance_legacy", s, 0,
                    time_fn(lambda: (_append_rows(lat.z, sl, new[0]), _append_rows(lat.kpe, sl, new[1])),
                            warmup=2, reps=30, max_seconds=max_seconds, use_graph=False, flush_l2=True))
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                add("latent_maintenance", s, 0, error=error_text(exc, 400))
        for n in n_values:
            if time.time() > deadline:
                add("skipped", s, n, error="deadline")
                continue
            grow = (AMORTISED_STEPS + 120) * s
            try:
                base = HybridCache.from_latent(lat, n, w.w_uk, w.w_uv)
                state = {"c": base.reserve(t + grow)}

                def step():
                    state["c"] = state["c"].append(*new)

                tm = time_fn(step, warmup=3, reps=100, max_seconds=max_seconds, use_graph=False, flush_l2=True)
                # the mean over consecutive steps from a fresh reservation (buffer moves included)
                amort = time_fn(lambda: [step() for _ in range(AMORTISED_STEPS)], warmup=1, reps=3, min_reps=1,
                                max_seconds=max_seconds, flush_l2=False,
                                setup=lambda: state.update(c=base.reserve(t + grow))).median_us / AMORTISED_STEPS
                add("maintenance", s, n, tm, amortised_us=amort, reserved_bytes=state["c"].reserved_bytes,
                    nbytes=state["c"].nbytes)
                del state
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                add("maintenance", s, n, error=error_text(exc, 400))
            try:
                legacy = {"c": (base.z, base.kpe, base.k_win, base.v_win)}
                t_legacy = time_fn(lambda: legacy_append(*legacy["c"], n, *new), warmup=2, reps=30,
                                   max_seconds=max_seconds, use_graph=False, flush_l2=True)
                add("maintenance_legacy", s, n, t_legacy)
                del legacy
            except Exception as exc:  # noqa: BLE001
                add("maintenance_legacy", s, n, error=error_text(exc, 400))
            try:
                held = base.append(*new)
                design = "hybrid" if n else "absorbed"
                fn = lambda: mla_attention(q_nope, q_pe, held, w.w_uk, w.w_uv, scale=cfg.softmax_scale,  # noqa: E731
                                           design=design, n=n if n else None, backend=layer.backend)
                add("attention", s, n, time_fn(fn, warmup=2, reps=50, max_seconds=max_seconds), design=design)
                del held
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                add("attention", s, n, error=error_text(exc, 400))
            try:
                mode = "hybrid" if n else "absorbed"
                cache0 = base.reserve(t + grow) if n else lat
                st = {"c": cache0}

                def layer_step():
                    st["c"] = layer(x, pos, cache=st["c"], mode=mode)[1]

                with torch.no_grad():
                    add("layer_step", s, n, time_fn(layer_step, warmup=2, reps=30, max_seconds=max_seconds,
                                                    use_graph=False), mode=mode,
                        cache=type(cache0).__name__)
                del st, cache0
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                add("layer_step", s, n, error=error_text(exc, 400))
            del base
            if gpu:
                torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    get = {(r["s"], r["n"], r["what"]): r for r in rows}
    lines = ["   s     n   maintenance  (amortised)   legacy maint.   attention    layer step   window/seq/layer",
             "-" * 100]
    fmt = lambda r, key="median_us": f"{r[key]:>10,.1f}" if r and key in r else f"{'-':>10}"  # noqa: E731
    for s, n in sorted({(r["s"], r["n"]) for r in rows}):
        m = get.get((s, n, "maintenance"))
        lines.append(f"{s:>4} {n:>5}  {fmt(m)}  ({fmt(m, 'amortised_us')})   {fmt(get.get((s, n, 'maintenance_legacy')))}"
                     f"   {fmt(get.get((s, n, 'attention')))}  {fmt(get.get((s, n, 'layer_step')))}"
                     f"   {(m or {}).get('window_bytes_per_seq_layer', 0) / 1e6:>10,.2f} MB")
    lat = [(s, get.get((s, 0, "latent_maintenance")), get.get((s, 0, "latent_maintenance_legacy")))
           for s in sorted({r["s"] for r in rows})]
    lines += ["", "   s   LatentCache.append in place   old whole-cache copy"]
    lines += [f"{s:>4}   {fmt(m):>27}   {fmt(old):>20}" for s, m, old in lat]
    return "\n".join(lines) + "\n(µs per step; maintenance = HybridCache.append of s tokens per sequence)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="hybrid_maintenance.json")
    ap.add_argument("--dry-run", action="store_true", help="tiny dims on the CPU (reference attention): plumbing only")
    ap.add_argument("--budget", type=float, default=100.0, help="seconds after which no new row starts")
    args = ap.parse_args()
    t0 = time.time()
    dry = args.dry_run or not torch.cuda.is_available()
    dims, cfg, layer, device, dtype = _setup(dry)
    env = environment(dry_run=dry)
    print(f"hybrid_maintenance: {env.get('device')} dry_run={dry}", flush=True)
    res = dict(env=env, dims=dict(h=dims.h, d=dims.d, p=dims.p, k=dims.k, w=dims.w),
               b=B if not dry else 2, t=T if not dry else 64, s_values=list(S_VALUES if not dry else (1, 4)),
               n_values=list(N_VALUES if not dry else (0, 8, 16)))
    with torch.no_grad():
        checks = run_checks(cfg, layer, device, dtype)
    res["checks"], res["checks_ok"] = checks, all(c["ok"] for c in checks)
    print(f"correctness: {sum(c['ok'] for c in checks)}/{len(checks)} ok ({time.time() - t0:.0f} s)", flush=True)
    if res["checks_ok"]:
        try:
            with torch.no_grad():
                res["rows"] = run_timing(dims, cfg, layer, device, dtype, res["b"], res["t"], res["s_values"],
                                         res["n_values"], t0 + args.budget, 0.5 if dry else 1.5)
        except Exception as exc:  # noqa: BLE001
            res["timing_error"] = error_text(exc, 600)
            traceback.print_exc()
    else:
        print("  a check failed: nothing is timed", flush=True)
    res["wall_s"] = time.time() - t0
    write_json(args.out, res)
    if res.get("rows"):
        print(table(res["rows"]))
    print(f"wrote {args.out} ({res['wall_s']:.0f} s)")
    return 0 if res["checks_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

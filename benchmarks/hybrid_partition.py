"""The hybrid MLAvar6+ on an sm_90 SM partition, its parts alone and together, beside the three
single designs and official FlashMLA, in one process (bf16, DeepSeek-V3 dims, b = 32 (`--b`),
t = 4,096, causal, the output decompression included everywhere).

Per ``s`` (default 32, 16, 64):

* **baselines** on the same latents: official FlashMLA (``flash_mla_with_kvcache`` over the
  latents seen as 64-token pages, identity block table; when ``--flash-mla`` names its folder)
  then ``decompress``; our absorbed call (``flash_mla``, the seesaw kernel) then ``decompress``;
  our expanded call (``flash_attention`` over all t keys, per-head K/V);
* **parts alone**, per window size n: the latent part (``flash_mla`` non-causal over the
  t - n old keys, whole GPU) and the window part on m programs (``expanded_window_gluon``);
* **together**: ``mla_var6_plus_hopper(expanded_programs=m)`` (the window's persistent launch
  first, the latent part on the SMs it leaves) then ``decompress(o_latent, w_uv, o)``; and
  the two parts on two streams without a partition (``expanded_programs=None``); and the
  default public call (``mla_var6_plus``, its sm_90 default: the partition of
  ``default_programs``).

First a correctness check of the partitioned hybrid against the fp32 reference at s = 32 and
s = 64 (small b and t). Timing: ``time_fn`` (CUDA-graph replays, L2 flushed). Inputs are random
(the speed does not depend on the values). Everything goes to ``--out`` as JSON; a table last.

    python benchmarks/hybrid_partition.py --out benchmarks/results/h200/hybrid/partition.json \
        --flash-mla DIR
"""

from __future__ import annotations

import sys

import torch

from common import (D, H, K, P, Budget, baseline_parser, check_hybrid_partition, environment, import_flash_mla,
                    randn as seeded_randn, timed, write_json, require_cuda)

T = 4096
GRID = {32: ((1536, 2048, 2560, 3072), (44, 66, 88)), 16: ((1024, 2048, 3072), (44, 66, 88)),
        64: ((1024, 2048, 3072), (44, 66, 88))}
CHECKS = [(2, 32, 1024, 512, 8), (2, 64, 1200, 700, 12), (2, 16, 1024, 300, 20)]   # (b, s, t, n, programs)


def main() -> int:
    ap = baseline_parser(__doc__)
    ap.add_argument("--s", default="32,16,64", help="query tokens per sequence, comma-separated")
    ap.add_argument("--b", type=int, default=32, help="sequences (default 32)")
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--n", default=None, help="window sizes, comma-separated (default: the grid per s)")
    ap.add_argument("--programs", default=None, help="window programs, comma-separated (default: 44,66,88)")
    ap.add_argument("--no-parts", action="store_true", help="time the hybrid only, not its parts alone")
    args = ap.parse_args()
    require_cuda()
    budget = Budget(args.budget)
    from mla_var3.kernel.absorbed import flash_mla
    from mla_var3.kernel.expanded import flash_attention
    from mla_var3.kernel.gemm import decompress
    from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper
    from mla_var3.kernel.hopper.window_gluon import expanded_window_gluon
    from mla_var3.kernel.hybrid import mla_var6_plus

    fm = import_flash_mla(args.flash_mla)
    dtype = torch.bfloat16
    scale = (D + P) ** -0.5
    info = environment(flashmla=fm is not None)
    checks, rows = [], []

    all_ok = check_hybrid_partition(CHECKS, checks, dtype)
    if not all_ok:
        write_json(args.out, dict(info=info, checks=checks, rows=rows))
        print("a check failed: nothing timed")
        return 1

    timing = dict(max_seconds=0.4)
    batch = args.b
    randn = seeded_randn("cuda", dtype)
    for s in (int(v) for v in args.s.split(",")):
        ns, ms = GRID.get(s, GRID[32])
        ns = tuple(int(v) for v in args.n.split(",")) if args.n else ns
        ms = tuple(int(v) for v in args.programs.split(",")) if args.programs else ms
        q, qpe, qc = randn(batch, H, s, D), randn(batch, H, s, P), randn(batch, H, s, K, std=0.05)
        z, kpe = randn(batch, T, K), randn(batch, T, P)
        k_all, v_all = randn(batch, T, H, D), randn(batch, T, H, D)
        w_uv = randn(H, K, D, std=K ** -0.5)
        base = dict(b=batch, s=s, t=T)
        print(f"---- s = {s}", flush=True)
        if fm is not None:
            cache = torch.cat([z, kpe], dim=-1).view(batch * T // 64, 64, 1, K + P)
            table = torch.arange(batch * T // 64, dtype=torch.int32, device="cuda").view(batch, T // 64)
            lens = torch.full((batch,), T, dtype=torch.int32, device="cuda")
            q_fm = torch.cat([qc, qpe], dim=-1).transpose(1, 2).contiguous()
            meta, _ = fm.get_mla_metadata()

            def flashmla():
                o, _ = fm.flash_mla_with_kvcache(q_fm, cache, table, lens, K, meta, None, softmax_scale=scale,
                                                 causal=s > 1)
                return decompress(o.transpose(1, 2), w_uv)
            timed(rows, f"s={s} FlashMLA + decompress", flashmla, budget=budget, timing=timing, part="baseline",
                  impl="flashmla", **base)
        timed(rows, f"s={s} absorbed + decompress",
              lambda: decompress(flash_mla(qc, qpe, z, kpe, scale=scale, causal=True)[0], w_uv),
              budget=budget, timing=timing, part="baseline", impl="absorbed", **base)
        timed(rows, f"s={s} decompress alone", lambda: decompress(qc, w_uv), budget=budget, timing=timing,
              part="baseline", impl="decompress", **base)
        timed(rows, f"s={s} expanded (all t keys)",
              lambda: flash_attention(q, qpe, k_all, v_all, kpe, scale=scale, causal=True),
              budget=budget, timing=timing, part="baseline", impl="expanded", **base)
        for n in ns:
            o_len = T - n
            z_old, k_new, v_new = z[:, :o_len], k_all[:, o_len:], v_all[:, o_len:]
            if not args.no_parts:
                timed(rows, f"s={s} n={n} latent part alone (whole GPU)",
                      lambda: flash_mla(qc, qpe, z_old, kpe[:, :o_len], scale=scale, causal=False),
                      budget=budget, timing=timing, part="latent", n=n, **base)
            for m in ms:
                if not args.no_parts:
                    timed(rows, f"s={s} n={n} window part alone on {m} programs",
                          lambda m=m: expanded_window_gluon(q, qpe, k_new, v_new, kpe[:, o_len:], scale=scale,
                                                            causal=True, programs=m),
                          budget=budget, timing=timing, part="window", n=n, programs=m, **base)
                    if rows[-1].get("us"):
                        rows[-1]["gbps"] = 2 * batch * n * H * 2 * D / rows[-1]["us"] / 1e3

                def hybrid(m=m):
                    o, ol, _ = mla_var6_plus_hopper(q, qpe, qc, z_old, kpe, k_new, v_new, scale=scale, causal=True,
                                                    expanded_programs=m)
                    return decompress(ol, w_uv, o)
                timed(rows, f"s={s} n={n} hybrid, window on {m} programs + decompress", hybrid, budget=budget,
                      timing=timing, part="hybrid", n=n, programs=m, **base)

            def default():   # the public call as a user makes it: mla_var6_plus's sm_90 default
                o, ol, _ = mla_var6_plus(q, qpe, qc, z_old, kpe, k_new, v_new, scale=scale)
                return decompress(ol, w_uv, o)
            timed(rows, f"s={s} n={n} default mla_var6_plus call + decompress", default, budget=budget,
                  timing=timing, part="hybrid", n=n, programs="default", **base)

            def streams():
                o, ol, _ = mla_var6_plus_hopper(q, qpe, qc, z_old, kpe, k_new, v_new, scale=scale, causal=True,
                                                expanded_programs=None)
                return decompress(ol, w_uv, o)
            timed(rows, f"s={s} n={n} hybrid, two streams, no partition + decompress", streams, budget=budget,
                  timing=timing, part="hybrid", n=n, programs=0, **base)
        del q, qpe, qc, z, kpe, k_all, v_all
        torch.cuda.empty_cache()

    write_json(args.out, dict(info=info, checks=checks, rows=rows))
    print("\n| s | FlashMLA | absorbed | expanded | best hybrid (n, m) | best single ÷ best hybrid |")
    print("|---|---|---|---|---|---|")
    for s in sorted({r["s"] for r in rows}):
        get = lambda impl: next((r.get("us") for r in rows if r["s"] == s and r.get("impl") == impl), None)  # noqa: E731
        hy = [r for r in rows if r["s"] == s and r.get("part") == "hybrid" and r.get("us")]
        best = min(hy, key=lambda r: r["us"]) if hy else None
        singles = [v for v in (get("flashmla"), get("absorbed"), get("expanded")) if v]
        fmt = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
        print(f"| {s} | {fmt(get('flashmla'))} | {fmt(get('absorbed'))} | {fmt(get('expanded'))} | "
              f"{fmt(best['us']) if best else '-'} ({best['n'] if best else '-'}, {best['programs'] if best else '-'}) | "
              f"{min(singles) / best['us']:.2f}" if best and singles else "-")
    print(f"checks {sum(c['ok'] for c in checks)}/{len(checks)} ok; {budget.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe the seesaw Gluon kernel's limits on an sm_90 GPU: time diagnostic variants that each
remove one cost (the key reloads, the wait for the other warpgroup's max) or change the order of
WG1's two output MMAs, next to the kernel itself, on the decode/speculative shapes.

Diagnostic variants give wrong results by design and are timed only; the order variant is
checked against the fp32 reference first. Writes JSON to ``--out``; ``--dry-run`` checks the
plumbing without a GPU (no kernel runs).

    python benchmarks/seesaw_probe.py --out benchmarks/results/h200/seesaw/probe.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

H, K, P = 128, 512, 64
VARIANTS = {0: "kernel", 1: "WG1 applies p0 first", 2: "diag: no key reloads", 4: "diag: no cross-warpgroup wait",
            6: "diag: neither"}
SHAPES = [(32, 16), (32, 4), (32, 1), (64, 16)]
FLASHMLA_US = {(32, 16): 886.0, (32, 4): 224.1, (32, 1): 75.2, (64, 16): 1790.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--flags", default=",".join(map(str, VARIANTS)))
    args = ap.parse_args()
    flags = [int(f) for f in args.flags.split(",")]
    if args.dry_run:
        print("dry run: variants", {f: VARIANTS.get(f, "?") for f in flags}, "shapes", SHAPES)
        return 0
    import triton
    from mla_var3.kernel.hopper.absorbed_seesaw import flash_mla_seesaw
    from mla_var3.reference import flash_mla as ref
    from mla_var3.runtime.environment import environment
    from mla_var3.runtime.timing import time_fn
    from mla_var3.testing import rel_err

    scale = (128 + 64) ** -0.5
    rec = dict(env=environment(), torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
               variants={str(f): VARIANTS.get(f, "?") for f in flags}, checks=[], rows=[])
    g = torch.Generator(device="cuda").manual_seed(0)

    def inputs(b, s, t):
        qc = (torch.randn(b, H, s, K, generator=g, device="cuda") * 0.5).bfloat16()
        qpe = torch.randn(b, H, s, P, generator=g, device="cuda").bfloat16()
        return qc, qpe, torch.randn(b, t, K, generator=g, device="cuda").bfloat16(), \
            torch.randn(b, t, P, generator=g, device="cuda").bfloat16()

    ok = {f: True for f in flags}
    for f in flags:
        if f & 6:
            continue
        for b, s, t, ns in [(2, 4, 777, 5), (3, 1, 129, None), (4, 16, 4096, None)]:
            x = inputs(b, s, t)
            o_ref, l_ref = ref(*x, scale, s > 1)
            o, lse = flash_mla_seesaw(*x, scale=scale, causal=s > 1, num_splits=ns, _flags=f)
            e = max(rel_err(o, o_ref), rel_err(lse, l_ref))
            ok[f] &= e <= 1e-2
            rec["checks"].append(dict(flags=f, b=b, s=s, t=t, num_splits=ns, err=e, ok=e <= 1e-2))
            print(f"check flags={f} b={b} s={s} t={t}: err {e:.2e}", flush=True)
    xs = {(b, s): inputs(b, s, 4096) for b, s in SHAPES}
    rows = {(b, s): dict(b=b, s=s, t=4096, flashmla_us=FLASHMLA_US[(b, s)]) for b, s in SHAPES}
    rec["rows"] = list(rows.values())
    for f in flags:   # one variant at a time, printed and saved as it goes (a diagnostic may hang)
        if not ok[f]:
            continue
        for (b, s), x in xs.items():
            fn = lambda f=f, x=x, s=s: flash_mla_seesaw(*x, scale=scale, causal=s > 1, _flags=f)  # noqa: E731
            us = time_fn(fn, warmup=3, reps=60, min_reps=5, max_seconds=0.3).median_us
            rows[(b, s)][f"f{f}_us"] = us
            print(f"flags={f} ({VARIANTS.get(f, '?')}) b={b} s={s}: {us:.1f} us (FlashMLA {FLASHMLA_US[(b, s)]})",
                  flush=True)
            with open(args.out, "w") as fh:
                json.dump(rec, fh, indent=1, default=str)
    with open(args.out, "w") as fh:
        json.dump(rec, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sustained load: each call back to back for several seconds, with the GPU's SM clock and power read
as it runs, for official FlashMLA and the compat call on the same inputs.

Timing windows of a fraction of a second (``serving_check.py``) see the clock the previous work
left; a serving engine sees the clock its own sustained load settles at, under the board's power
limit. Per call and point this reports the wall time per call over the last ``--seconds`` of
back-to-back calls (after one second of warm-up), and the median SM clock, power and temperature
read every 20 calls (NVML through torch.cuda).

    python benchmarks/power_probe.py --out power.json [--flash-mla DIR] [--seconds 4]
"""

from __future__ import annotations

import statistics
import time

import torch

from common import baseline_parser, environment, import_flash_mla, require_cuda, write_json

K, P = 512, 64
POINTS = [(32, 16, 4096), (64, 1, 4096), (32, 4, 4096)]


def sustained(fn, seconds: float) -> dict:
    """Back-to-back calls: 1 s of warm-up, then ``seconds`` measured (synchronised every 20 calls)."""
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    clocks, power, temp, calls = [], [], [], 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        calls += 20
        clocks.append(torch.cuda.clock_rate())
        power.append(torch.cuda.power_draw())
        temp.append(torch.cuda.temperature())
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return {"us_per_call": wall / calls * 1e6, "calls": calls, "sm_mhz": statistics.median(clocks),
            "power_w": statistics.median(power) / 1000, "temp_c": statistics.median(temp)}


def main() -> None:
    ap = baseline_parser(__doc__)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    require_cuda()
    import serving_check
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata

    fm = import_flash_mla(args.flash_mla)
    scale = (K + P) ** -0.5
    record = {"env": environment(), "rows": []}
    for b, s, t in POINTS:
        q, cache, table, seqlens = serving_check.make_paged([t] * b, s, capacity=t, seed=b * 100 + s, poison=False)
        meta, _ = get_mla_metadata()
        fns = {"compat": lambda: flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, causal=s > 1)}
        if fm is not None:
            fmeta, _ = fm.get_mla_metadata()
            fns = {"flashmla": lambda: fm.flash_mla_with_kvcache(q, cache, table, seqlens, K, fmeta, None,
                                                                 softmax_scale=scale, causal=s > 1), **fns}
        for name, fn in fns.items():
            time.sleep(3)                                 # each starts from an idle GPU
            row = {"b": b, "s": s, "t": t, "call": name, **sustained(fn, args.seconds)}
            record["rows"].append(row)
            print(f"b{b} s{s} {name:9s} {row['us_per_call']:9.1f} us/call  SM {row['sm_mhz']} MHz  "
                  f"{row['power_w']:.0f} W  {row['temp_c']} C  ({row['calls']} calls)", flush=True)
    write_json(args.out, record)


if __name__ == "__main__":
    main()

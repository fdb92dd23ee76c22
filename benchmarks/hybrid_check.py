"""Check and time the hybrid (``mla_var6_plus``) on an sm_90 GPU (H100/H200), bf16, DeepSeek-V3
dims: three suites, ``--suite check`` (the default), ``--suite partition`` and ``--suite interference``.

``--suite check``:

1. Correctness, in a child process with a time limit (a wrong mbarrier phase in the Gluon
   kernel would hang the GPU instead of failing): :func:`mla_var3.kernel.hybrid.mla_var6_plus`
   against the fp32 reference :func:`mla_var3.reference.mla_var6_plus` (o, o_latent, lse and the
   final ``o + decompress(o_latent)``), for n = 0, n = s, n < s (portable fallback), n in
   between, n = t, causal and not, parts overlapped on two streams and one after the other.
   Every variant whose check failed is not timed.
2. Timing (``mla_var3.runtime.timing.time_fn``: CUDA-graph replays, L2 flushed), t = 4096:
   * b = 32, s = 16: the split sweep n in {0, 256, ..., 2048}: the latent part alone (Gluon,
     non-causal over o = t - n keys), the expanded part alone (n keys), the hybrid with the parts
     one after the other and overlapped on two streams (and with the expanded stream at high
     priority); next to the Gluon absorbed kernel alone and the expanded kernel alone.
   * s in {2, 4, 8, 16, 32, 64}, b in {32, 64}: absorbed alone, expanded alone, the hybrid
     (overlapped) at n in {best n of the sweep scaled, its half, its double}, best kept.
   * the headline with the output decompression ``o + decompress(o_latent, w_uv)``.
   A deadline keeps the whole run under ``--budget`` seconds: later rows are skipped.
3. A table is printed last; everything goes to ``--out`` as JSON.

``--suite partition``: the hybrid on an SM partition, its parts alone and together, beside the
three single designs and official FlashMLA, in one process (b = 32 (``--b``), t = 4,096,
causal, the output decompression included everywhere). Per ``s`` (default 32, 16, 64):

* **baselines** on the same latents: official FlashMLA (``flash_mla_with_kvcache`` over the
  latents seen as 64-token pages, identity block table; when ``--flash-mla`` names its folder)
  then ``decompress``; our absorbed call (``flash_mla``) then ``decompress``; our expanded call
  (``flash_attention`` over all t keys, per-head K/V);
* **parts alone**, per window size n: the latent part (``flash_mla`` non-causal over the
  t - n old keys, whole GPU) and the window part on m programs (``expanded_window_gluon``);
* **together**: ``mla_var6_plus_hopper(expanded_programs=m)`` (the window's persistent launch
  first, the latent part on the SMs it leaves) then ``decompress(o_latent, w_uv, o)``; the two
  parts on two streams without a partition (``expanded_programs=None``); and the default public
  call (``mla_var6_plus``, its sm_90 default: the partition of ``default_programs``).

First a correctness check of the partitioned hybrid against the fp32 reference at s = 16, 32
and 64 (small b and t); nothing is timed when it fails. Timing: ``time_fn`` (CUDA-graph
replays, L2 flushed). Everything goes to ``--out`` as JSON; a table last.

``--suite interference``: what each part of the partitioned hybrid loses to the other when they
run together (b = 32, t = 4,096, causal; per ``s``, default 16, 32, 64, the window size of
:data:`INTERFERENCE_N` on :func:`~mla_var3.kernel.hopper.hybrid_hopper.default_programs`
programs). Each part alone, then both as the partition issues them (the window's persistent
launch first, on its own stream; the latent part on another), eager, the L2 not flushed (each
part streams more than it holds). Every repetition records an event before the parts and one
after each, so the co-run gives each part's own finish time. Beside them: the window's GB/s per
SM alone and together, the latent part's finish time with no interference (its SM-time alone,
on the SMs the window leaves until it ends, then on all), the bytes both read per µs of the
co-run, and the SM clock, memory clock, power and clock-event reasons sampled through NVML
during each loop (:class:`mla_var3.runtime.telemetry.TelemetrySampler`).

    python benchmarks/hybrid_check.py --out benchmarks/results/h200/hybrid_check.json
    python benchmarks/hybrid_check.py --dry-run --out /tmp/hybrid_dry.json    # CPU plumbing check
    python benchmarks/hybrid_check.py --suite partition --out benchmarks/results/h200/hybrid/partition.json \
        --flash-mla DIR
    python benchmarks/hybrid_check.py --suite interference --out benchmarks/results/h200/hybrid/interference.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch

from common import (D, H, K, P, Budget, environment, error_text, import_flash_mla, randn, require_cuda, timed,
                    write_json)

#: official FlashMLA on an H200, bf16, h = 128, k = 512, p = 64, t = 4096 (microseconds), keyed (b, s).
FLASHMLA_US = {(32, 1): 75.2, (32, 2): 124.4, (32, 4): 224.1, (32, 8): 443.0, (32, 16): 886.0, (32, 32): 1760.0,
               (64, 1): 124.5, (64, 2): 231.5, (64, 4): 448.4, (64, 8): 894.7, (64, 16): 1790.0, (64, 32): 3566.0}

T = 4096
SWEEP_N = (0, 256, 512, 768, 1024, 1280, 1536, 1792, 2048)
S_GRID = (2, 4, 8, 16, 32, 64)
B_GRID = (32, 64)

# (b, s, t, n, causal) at full DeepSeek-V3 dims -- correctness set
CHECKS = [(2, 16, 1024, 0, True), (2, 16, 1024, 16, True), (2, 16, 1024, 300, True), (2, 16, 1024, 8, True),
          (2, 4, 777, 200, False), (1, 1, 65, 1, True), (2, 64, 1500, 512, True)]
SMALL_CHECKS = [(2, 16, 200, 40, True)]          # the tests' dims: h=16, d=32, p=16, k=64
DRY_CHECKS = [(1, 2, 20, 5, True), (1, 2, 20, 0, True)]

#: ``--suite partition``: per s, the window sizes n and window programs m timed
PARTITION_GRID = {32: ((1536, 2048, 2560, 3072), (44, 66, 88)), 16: ((1024, 2048, 3072), (44, 66, 88)),
                  64: ((1024, 2048, 3072), (44, 66, 88))}
#: ``--suite interference``: per s, the window size n (its programs: ``default_programs``)
INTERFERENCE_N = {16: 1024, 32: 2048, 64: 2048}
#: ``--suite partition``: its correctness checks, (b, s, t, n, programs)
PARTITION_CHECKS = [(2, 32, 1024, 512, 8), (2, 64, 1200, 700, 12), (2, 16, 1024, 300, 20)]


def _dims(small: bool):
    from mla_var3.shapes import MLADims, get_preset
    return MLADims(h=16, d=32, p=16, k=64) if small else get_preset("deepseek-v3")


# ----------------------------------------------------------------------------------------------
# correctness (child process)


_LAST_INPUTS: dict = {}


def check_one(b, s, t, n, causal, overlap, *, small, device, dtype, programs=None):
    from mla_var3 import reference as R
    from mla_var3.kernel import backends
    from mla_var3.kernel.hopper.hybrid_hopper import gluon_latent_applies
    from mla_var3.kernel.hybrid import mla_var6_plus
    from mla_var3.shapes import Problem
    from mla_var3.testing import TOLERANCE, rel_err

    dims = _dims(small)
    key = (b, s, t, n, causal, small, device, dtype)
    if _LAST_INPUTS.get("key") != key:                # the overlap variants share one set of inputs
        _LAST_INPUTS.update(key=key, x=R.make_inputs(dims, Problem(b=b, s=s, t=t, n=n, causal=causal), dtype=dtype,
                                                     device=device))
    x = _LAST_INPUTS["x"]
    if device == "cuda":
        torch.full((1 << 28,), float("nan"), device=device)  # leave NaN in the allocator's free blocks
    if programs:                                      # the persistent expanded part (an SM partition)
        from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper
        o, ol, lse = mla_var6_plus_hopper(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale,
                                          causal=causal, overlap=overlap, expanded_programs=programs)
    else:
        o, ol, lse = mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale, causal=causal,
                                   overlap=overlap)
    if device == "cuda":
        torch.cuda.synchronize()
    f32 = lambda a: a.float()  # noqa: E731
    ro, rol, rlse = R.mla_var6_plus(*(f32(a) for a in (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)),
                                    x.scale, causal)
    w_uv = x.w_uv.float()
    errs = dict(o=rel_err(o, ro), o_latent=rel_err(ol, rol), lse=rel_err(lse, rlse),
                final=rel_err(R.decompress(ol.float(), w_uv, o.float()), R.decompress(rol, w_uv, ro)))
    tol = TOLERANCE[dtype]
    path = backends.available("mla_var6_plus", device)[0]
    if path == "gluon" and not gluon_latent_applies(dtype, dims.k, dims.p, s, t - n, n, causal, None):
        path = "gluon->triton fallback"
    ok = all(v <= tol for v in errs.values()) and o.dtype == dtype and ol.dtype == dtype
    if programs:
        path += f" + persistent expanded ({programs} programs)"
    return dict(b=b, s=s, t=t, n=n, causal=causal, overlap=overlap, small=small, path=path, tol=tol, ok=bool(ok),
                **{f"err_{k}": v for k, v in errs.items()})


def run_checks(out_path: str, dry: bool) -> None:
    device = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cases = [(c, False) for c in (DRY_CHECKS if dry else CHECKS)] + ([] if dry else [(c, True) for c in SMALL_CHECKS])
    rows = []
    variants = [(True, None)] if dry else [(True, None), (False, None), (True, 16)]
    for (b, s, t, n, causal), small in cases:
        for overlap, programs in variants:
            if programs and not (0 < n and n >= s):
                continue
            try:
                row = check_one(b, s, t, n, causal, overlap, small=small or dry, device=device, dtype=dtype,
                                programs=programs)
            except Exception as exc:
                row = dict(b=b, s=s, t=t, n=n, causal=causal, overlap=overlap, small=small, ok=False,
                           error=error_text(exc, 400))
                traceback.print_exc()
            rows.append(row)
            print(f"  check b={b} s={s} t={t} n={n} causal={causal} overlap={overlap} small={small}: "
                  f"{'ok' if row['ok'] else 'FAIL'} {row.get('path', '')} "
                  f"{ {k: f'{v:.1e}' for k, v in row.items() if k.startswith('err_')} or row.get('error')}",
                  flush=True)
    with open(out_path, "w") as f:
        json.dump(rows, f)


def checks_in_child(dry: bool, timeout: float) -> list[dict]:
    path = f"/tmp/hybrid_check_{os.getpid()}.json"
    cmd = [sys.executable, __file__, "--child-checks", path] + (["--dry-run"] if dry else [])
    try:
        subprocess.run(cmd, timeout=timeout, check=False)
        with open(path) as f:
            return json.load(f)
    except subprocess.TimeoutExpired:
        print(f"  correctness child timed out after {timeout:.0f} s (a hang): nothing of the Gluon path is timed",
              flush=True)
        return [dict(ok=False, error="timeout")]
    except Exception as exc:
        return [dict(ok=False, error=error_text(exc))]


# ----------------------------------------------------------------------------------------------
# timing


class Inputs:
    """Random bf16 inputs of one (b, s) at t keys, generated on the device (timing only)."""

    def __init__(self, b, s, t, dims, device, dtype):
        r = randn(device, dtype)
        h, d, p, k = dims.h, dims.d, dims.p, dims.k
        self.b, self.s, self.t = b, s, t
        self.q, self.qpe, self.qc = r(b, h, s, d), r(b, h, s, p), r(b, h, s, k, std=0.5)
        self.z, self.kpe = r(b, t, k), r(b, t, p)
        self.k, self.v = r(b, t, h, d, std=0.5), r(b, t, h, d)
        self.w_uv = r(h, k, d, std=k ** -0.5)
        self.scale = dims.default_scale
        self._z_old = {}

    def z_old(self, o):
        """The latent cache of the o oldest tokens, stored on its own (as a hybrid cache keeps it)."""
        if o not in self._z_old:                      # kept: a copy inside a timed call would be timed
            self._z_old[o] = self.z[:, :o].contiguous()
        return self._z_old[o]

    def hybrid(self, n, causal, **kw):
        from mla_var3.kernel.hybrid import mla_var6_plus
        o = self.t - n
        return lambda: mla_var6_plus(self.q, self.qpe, self.qc, self.z_old(o), self.kpe, self.k[:, o:], self.v[:, o:],
                                     scale=self.scale, causal=causal, **kw)

    def hybrid_streams(self, n, causal, streams, **kw):
        from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper
        o = self.t - n
        return lambda: mla_var6_plus_hopper(self.q, self.qpe, self.qc, self.z_old(o), self.kpe, self.k[:, o:],
                                            self.v[:, o:], scale=self.scale, causal=causal, streams=streams, **kw)

    def absorbed(self, o, causal):
        """The Gluon absorbed kernel over the o oldest keys (o = t: the absorbed design alone)."""
        from mla_var3.kernel.hopper.absorbed_gluon import flash_mla_gluon
        z, kpe = self.z_old(o), self.kpe[:, :o].contiguous()
        return lambda: flash_mla_gluon(self.qc, self.qpe, z, kpe, scale=self.scale, causal=causal)

    def expanded(self, n, causal):
        from mla_var3.kernel.expanded import flash_attention
        o = self.t - n
        kpe = self.kpe[:, o:]
        return lambda: flash_attention(self.q, self.qpe, self.k[:, o:], self.v[:, o:], kpe, scale=self.scale,
                                       causal=causal)


class Timer:
    """``timer(rows, label, fn, **info)``: a timed row (:func:`common.timed`) within the run's budget."""

    def __init__(self, budget_s: float, dry: bool):
        self.budget = Budget(budget_s)
        self.timing = dict(warmup=2, reps=2 if dry else 40, min_reps=2 if dry else 5, max_seconds=0.01 if dry else 0.3)

    def left(self) -> float:
        return self.budget.left()

    def __call__(self, rows: list, label: str, fn, **info):
        return timed(rows, label, fn, budget=self.budget, timing=self.timing, **info)


def run_timing(dry: bool, budget_s: float, gluon_ok: bool, checks_ok: bool) -> dict:
    from mla_var3.shapes import MLADims

    device = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    dims = _dims(False) if not dry else MLADims(h=4, d=32, p=16, k=64)
    t_len = T if not dry else 64
    timer = Timer(budget_s, dry)
    res = dict(sweep=[], grid=[], headline=[], variants=[])
    sweep_n = SWEEP_N if not dry else (0, 16, 32)
    b0, s0 = (32, 16) if not dry else (1, 4)
    gpu_gluon = gluon_ok          # main() sets it only on an sm_90 GPU with Gluon

    # -- the split sweep at b = 32, s = 16
    x = Inputs(b0, s0, t_len, dims, device, dtype)
    sweep = res["sweep"]
    if gpu_gluon:
        timer(sweep, "absorbed (gluon) alone", x.absorbed(t_len, True), b=b0, s=s0, n=0)
    timer(sweep, "expanded alone", x.expanded(t_len, True), b=b0, s=s0, n=t_len)
    prio = side = None
    if device == "cuda":
        side = torch.cuda.Stream()
        prio = torch.cuda.Stream(priority=-1)        # higher priority than the default 0
    for n in sweep_n:
        info = dict(b=b0, s=s0, n=n)
        if checks_ok:
            timer(sweep, "hybrid overlapped", x.hybrid(n, True, overlap=True), **info)
            timer(sweep, "hybrid sequential", x.hybrid(n, True, overlap=False), **info)
            if gpu_gluon and 0 < n < t_len:
                timer(sweep, "hybrid overlapped, expanded high priority",
                      x.hybrid_streams(n, True, (side, prio)), **info)
        if gpu_gluon and 0 < n < t_len:
            timer(sweep, "latent part alone", x.absorbed(t_len - n, False), **info)
        if 0 < n < t_len:
            timer(sweep, "expanded part alone", x.expanded(n, True), **info)
    ok_rows = [r for r in sweep if r["label"] == "hybrid overlapped" and "us" in r]
    best_n = min(ok_rows, key=lambda r: r["us"])["n"] if ok_rows else (sweep_n[len(sweep_n) // 2])
    res["best_n_b32_s16"] = best_n
    alone = {r["label"]: r["us"] for r in sweep if r.get("n") in (0, t_len) and "us" in r}
    a_us, e_us = alone.get("absorbed (gluon) alone"), alone.get("expanded alone")
    # the split that balances the two measured kernels if they overlapped perfectly
    g = 64 if t_len >= 1024 else 8
    n_bal = round(t_len * a_us / (a_us + e_us) / g) * g if a_us and e_us else t_len // 2
    res["n_balance_b32_s16"] = n_bal
    res["perfect_overlap_us_b32_s16"] = a_us * e_us / (a_us + e_us) if a_us and e_us else None

    # -- an SM partition without green contexts: the expanded part as one persistent launch of m
    #    programs (holds m SMs), issued before the latent part, which takes the other SMs
    if gpu_gluon and checks_ok and 0 < n_bal < t_len:
        from mla_var3.kernel.hybrid import expanded_persistent
        o = t_len - n_bal
        for m in (16, 32, 48, 66, 132):
            timer(res["variants"], f"expanded persistent alone, {m} programs",
                  lambda m=m: expanded_persistent(x.q, x.qpe, x.k[:, o:], x.v[:, o:], x.kpe[:, o:], scale=x.scale,
                                                  causal=True, programs=m), b=b0, s=s0, n=n_bal)
            if m < 132:
                timer(res["variants"], f"hybrid, persistent expanded on {m} programs",
                      x.hybrid_streams(n_bal, True, None, expanded_programs=m), b=b0, s=s0, n=n_bal)
        ok = [r for r in res["variants"] if r["label"].startswith("hybrid, persistent") and "us" in r]
        if ok:
            m_best = int(min(ok, key=lambda r: r["us"])["label"].split(" on ")[1].split()[0])
            res["persistent_best_programs"] = m_best
            for n in (n_bal - 256, n_bal + 256, n_bal + 512):   # the partition moves the balance up
                if 0 < n < t_len:
                    timer(res["variants"], f"hybrid, persistent expanded on {m_best} programs",
                          x.hybrid_streams(n, True, None, expanded_programs=m_best), b=b0, s=s0, n=n)
    # -- the headline, end to end with the output decompression, at the best (n, programs) seen
    cands = [(r["us"], r["n"], None) for r in sweep if r["label"] == "hybrid overlapped" and "us" in r]
    cands += [(r["us"], r["n"], int(r["label"].split(" on ")[1].split()[0])) for r in res["variants"]
              if r["label"].startswith("hybrid, persistent") and "us" in r]
    best_us, best_n, best_m = min(cands, key=lambda c: c[0]) if cands else (None, best_n, None)
    res["best_b32_s16"] = dict(us=best_us, n=best_n, expanded_programs=best_m)
    # the split n includes its ends: n = 0 is the absorbed kernel alone, n = t the expanded one
    ends = [(us, n, label) for label, us, n in (("absorbed (gluon) alone", a_us, 0), ("expanded alone", e_us, t_len))
            if us]
    if ends:
        us, n, label = min(ends)
        res["best_any_n_b32_s16"] = (dict(us=us, n=n, design=label) if best_us is None or us < best_us
                                     else dict(us=best_us, n=best_n, expanded_programs=best_m, design="hybrid"))
    if checks_ok:
        from mla_var3.kernel.gemm import decompress

        run = (x.hybrid(best_n, True, overlap=True) if best_m is None
               else x.hybrid_streams(best_n, True, None, expanded_programs=best_m))
        timer(res["headline"], "hybrid + decompress", lambda: _e2e(run, decompress, x.w_uv), b=b0, s=s0, n=best_n,
              expanded_programs=best_m)
        if gpu_gluon:
            ab = x.absorbed(t_len, True)
            timer(res["headline"], "absorbed (gluon) + decompress", lambda: decompress(ab()[0], x.w_uv),
                  b=b0, s=s0, n=0)
    x = None                                          # free the inputs before the next shapes
    if device == "cuda":
        torch.cuda.empty_cache()

    # -- the s grid at b = 32 and 64
    grid = res["grid"]
    for b in (B_GRID if not dry else (1,)):
        for s in (S_GRID if not dry else (2,)):
            if timer.left() < 8:                     # keep a few seconds for the last variants
                grid.append(dict(b=b, s=s, skipped="time budget"))
                continue
            try:
                x = Inputs(b, s, t_len, dims, device, dtype)
            except Exception as exc:
                grid.append(dict(b=b, s=s, error=error_text(exc)))
                continue
            ab = timer(grid, "absorbed (gluon) alone", x.absorbed(t_len, s > 1), b=b, s=s, n=0) if gpu_gluon else None
            ex = timer(grid, "expanded alone", x.expanded(t_len, s > 1), b=b, s=s, n=t_len)
            if checks_ok:
                # balance point of the measured kernels under perfect overlap: n* = t * A / (A + E)
                # (A, E: absorbed and expanded alone over all t keys); also half of it and a small n
                if ab and ex:
                    guess = round(t_len * ab / (ab + ex) / 64) * 64
                else:
                    guess = round(best_n * s / s0 / 64) * 64
                guess = min(t_len - s, max(s, guess)) if not dry else 8
                for n in sorted({min(t_len - s, max(s, 128)), max(s, guess // 2), guess}):
                    timer(grid, "hybrid overlapped", x.hybrid(n, s > 1, overlap=True), b=b, s=s, n=n)
                    if best_m is not None and n != min(t_len - s, max(s, 128)):
                        timer(grid, f"hybrid, persistent expanded on {best_m} programs",
                              x.hybrid_streams(n, s > 1, None, expanded_programs=best_m), b=b, s=s, n=n)
            x = None
            if device == "cuda":
                torch.cuda.empty_cache()
    # -- last (a context error here must not spoil the rows above): an SM partition with green
    #    contexts, expanded on m SMs and latent on the rest, at the balance n
    if gpu_gluon and checks_ok and 0 < n_bal < t_len and hasattr(torch.cuda, "GreenContext"):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        xg = Inputs(b0, s0, t_len, dims, device, dtype)
        for m in (32, 48, 64):
            try:
                g_e = torch.cuda.GreenContext.create(num_sms=m, device_id=0)
                g_l = torch.cuda.GreenContext.create(num_sms=sms - m, device_id=0)
                timer(res["variants"], f"hybrid, green contexts {m} | {sms - m} SMs",
                      xg.hybrid_streams(n_bal, True, (g_l.Stream(), g_e.Stream())), b=b0, s=s0, n=n_bal)
            except Exception as exc:
                res["variants"].append(dict(label=f"green contexts {m}", error=error_text(exc)))
                print(f"  green contexts m={m}: {exc}", flush=True)
                break

    return res


def _e2e(run, decompress, w_uv):
    o, o_latent, _ = run()
    return decompress(o_latent, w_uv, o)


# ----------------------------------------------------------------------------------------------
# report


def table(res: dict) -> str:
    lines = ["", f"b=32 s=16 t={T} sweep (us; FlashMLA {FLASHMLA_US[(32, 16)]})", f"{'label':44s} {'n':>5s} {'us':>9s}"]
    for r in res["sweep"] + res["variants"] + res["headline"]:
        val = f"{r['us']:9.1f}" if "us" in r else (r.get("error") or r.get("skipped") or "")[:40]
        lines.append(f"{r['label']:44s} {r.get('n', ''):>5} {val:>9s}")
    lines.append(f"best over n, ends included: {res.get('best_any_n_b32_s16')}")
    lines.append(f"best hybrid launch at b=32 s=16: {res.get('best_b32_s16')}; balance n of the kernels alone: "
                 f"{res.get('n_balance_b32_s16')} (perfect overlap would take {res.get('perfect_overlap_us_b32_s16')} us)")
    lines.append("")
    lines.append(f"{'b':>3s} {'s':>3s} {'FlashMLA':>9s} {'absorbed':>9s} {'expanded':>9s} {'hybrid':>9s} {'n':>5s}  best")
    keys = sorted({(r["b"], r["s"]) for r in res["grid"] if "b" in r})
    for b, s in keys:
        rows = [r for r in res["grid"] if r.get("b") == b and r.get("s") == s and "us" in r]
        ab = min((r["us"] for r in rows if r.get("label", "").startswith("absorbed")), default=float("nan"))
        ex = min((r["us"] for r in rows if r.get("label", "").startswith("expanded")), default=float("nan"))
        hy = [r for r in rows if r.get("label", "").startswith("hybrid")]
        hb = min(hy, key=lambda r: r["us"]) if hy else dict(us=float("nan"), n="")
        fm = FLASHMLA_US.get((b, s), float("nan"))
        cands = {"FlashMLA": fm, "absorbed": ab, "expanded": ex, "hybrid": hb["us"]}
        best = min((v, k) for k, v in cands.items() if v == v)[1] if any(v == v for v in cands.values()) else "-"
        mode = " (persistent expanded)" if "persistent" in hb.get("label", "") else ""
        lines.append(f"{b:3d} {s:3d} {fm:9.1f} {ab:9.1f} {ex:9.1f} {hb['us']:9.1f} {hb['n']:>5}  {best}{mode}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# --suite partition


def check_partition(cases, checks: list, dtype=torch.bfloat16) -> bool:
    """The sm_90 hybrid on an SM partition (``mla_var6_plus_hopper(expanded_programs=m)``) against
    the fp32 reference at DeepSeek-V3 dims, per case ``(b, s, t, n, m)``: o, o_latent, lse and the
    decompressed output within the dtype's tolerance. Appends a row per case to ``checks``;
    True when every case passed."""
    from mla_var3 import reference as R
    from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper
    from mla_var3.shapes import Problem, get_preset
    from mla_var3.testing import TOLERANCE, rel_err

    dims, all_ok = get_preset("deepseek-v3"), True
    for b, s, t, n, m in cases:
        row = dict(kind="hybrid", b=b, s=s, t=t, n=n, programs=m)
        try:
            x = R.make_inputs(dims, Problem(b=b, s=s, t=t, n=n, causal=True), dtype=dtype, device="cuda")
            o, ol, lse = mla_var6_plus_hopper(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, scale=x.scale,
                                              causal=True, expanded_programs=m)
            torch.cuda.synchronize()
            f32 = [a.float() for a in (x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new)]
            ro, rol, rlse = R.mla_var6_plus(*f32, x.scale, True)
            w = x.w_uv.float()
            errs = dict(o=rel_err(o, ro), o_latent=rel_err(ol, rol), lse=rel_err(lse, rlse),
                        final=rel_err(R.decompress(ol.float(), w, o.float()), R.decompress(rol, w, ro)))
            row.update(errs=errs, ok=all(e <= TOLERANCE[dtype] for e in errs.values()))
        except Exception as exc:
            traceback.print_exc()
            row.update(ok=False, error=error_text(exc))
        all_ok &= row["ok"]
        checks.append(row)
        print(f"check hybrid b={b} s={s} t={t} n={n} m={m}: {'ok' if row['ok'] else 'FAIL'} {row.get('errs')}",
              flush=True)
    return all_ok


def run_partition(args) -> int:
    """``--suite partition`` (the module docstring)."""
    require_cuda()
    budget = Budget(args.budget or 200.0)
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

    all_ok = check_partition(PARTITION_CHECKS, checks, dtype)
    if not all_ok:
        write_json(args.out, dict(info=info, checks=checks, rows=rows))
        print("a check failed: nothing timed")
        return 1

    timing = dict(max_seconds=0.4)
    batch = args.b
    rand = randn("cuda", dtype)
    for s in (int(v) for v in args.s.split(",")):
        ns, ms = PARTITION_GRID.get(s, PARTITION_GRID[32])
        ns = tuple(int(v) for v in args.n.split(",")) if args.n else ns
        ms = tuple(int(v) for v in args.programs.split(",")) if args.programs else ms
        q, qpe, qc = rand(batch, H, s, D), rand(batch, H, s, P), rand(batch, H, s, K, std=0.05)
        z, kpe = rand(batch, T, K), rand(batch, T, P)
        k_all, v_all = rand(batch, T, H, D), rand(batch, T, H, D)
        w_uv = rand(H, K, D, std=K ** -0.5)
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


# ----------------------------------------------------------------------------------------------
# --suite interference


def corun(parts, *, seconds: float = 0.3, warmup: int = 3, cuda_index: int = 0):
    """Time ``parts`` (a list of ``(stream, fn)``) issued together, eager: each repetition records
    an event on the current stream, issues every ``fn`` on its stream after it (in list order,
    an event after each) and joins them. Repetitions are queued back to back for about
    ``seconds`` while :class:`~mla_var3.runtime.telemetry.TelemetrySampler` samples the GPU.
    Returns (each part's median µs from the common start to its end, the median µs of the whole,
    the telemetry summary as a dict or None)."""
    from mla_var3.runtime.telemetry import TelemetrySampler

    main = torch.cuda.current_stream()

    def once():
        start = torch.cuda.Event(enable_timing=True)
        start.record(main)
        ends = []
        for st, fn in parts:
            st.wait_event(start)
            with torch.cuda.stream(st):
                fn()
                end = torch.cuda.Event(enable_timing=True)
                end.record(st)
            ends.append(end)
        for end in ends:
            main.wait_event(end)
        return start, ends

    for _ in range(warmup):
        once()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    once()
    torch.cuda.synchronize()
    reps = max(10, min(2000, int(seconds / max(time.perf_counter() - t0, 1e-6))))
    with TelemetrySampler(cuda_index) as tel:
        events = [once() for _ in range(reps)]
        torch.cuda.synchronize()
    per = [[start.elapsed_time(end) * 1e3 for end in ends] for start, ends in events]
    summary = tel.summary()
    return ([statistics.median(col) for col in zip(*per)], statistics.median(max(r) for r in per),
            summary.as_dict() if summary else None)


def latent_without_interference(latent_us: float, window_us: float, programs: int, sms: int) -> float:
    """The latent part's finish time beside a window on ``programs`` SMs that ends at
    ``window_us``, with no interference: its SM-time alone (``latent_us`` on all ``sms``) runs on
    the ``sms - programs`` SMs the window leaves until the window ends, then on all of them."""
    work = latent_us * sms
    early = (sms - programs) * window_us
    return work / (sms - programs) if work <= early else window_us + (work - early) / sms


def run_interference(args) -> int:
    """``--suite interference`` (the module docstring)."""
    require_cuda()
    from mla_var3.kernel.absorbed import flash_mla
    from mla_var3.kernel.hopper.hybrid_hopper import default_programs
    from mla_var3.kernel.hopper.window_gluon import choose_block, expanded_window_gluon

    dtype, scale, batch = torch.bfloat16, (D + P) ** -0.5, args.b
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    rand = randn("cuda", dtype)
    info = environment()
    checks, rows = [], []
    if not check_partition(PARTITION_CHECKS[:1], checks, dtype):
        write_json(args.out, dict(info=info, checks=checks, rows=rows))
        print("the partition's check failed: nothing timed")
        return 1
    s_win, s_lat = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (int(v) for v in args.s.split(",")):
        n = int(args.n.split(",")[0]) if args.n else INTERFERENCE_N.get(s, 2048)
        o_len = T - n
        m = int(args.programs.split(",")[0]) if args.programs else default_programs(s, o_len, n, sms)
        q, qpe, qc = rand(batch, H, s, D), rand(batch, H, s, P), rand(batch, H, s, K, std=0.05)
        z_old, kpe = rand(batch, o_len, K), rand(batch, T, P)
        k_new, v_new = rand(batch, n, H, D), rand(batch, n, H, D)
        kpe_old, kpe_new = kpe[:, :o_len], kpe[:, o_len:]

        bn, stages = choose_block(q, qpe, k_new, v_new, kpe_new, True)     # the hybrid's ring for this s

        def window():
            return expanded_window_gluon(q, qpe, k_new, v_new, kpe_new, scale=scale, causal=True, programs=m,
                                         block_n=bn, stages=stages)

        def latent():
            return flash_mla(qc, qpe, z_old, kpe_old, scale=scale, causal=False)

        window_bytes = batch * n * (2 * H * D + P) * 2
        latent_bytes = batch * o_len * (K + P) * 2
        (w_alone,), _, tel_w = corun([(s_win, window)])
        (l_alone,), _, tel_l = corun([(s_lat, latent)])
        (w_co, l_co), total, tel_co = corun([(s_win, window), (s_lat, latent)])
        ideal = latent_without_interference(l_alone, w_co, m, sms)
        row = dict(b=batch, s=s, t=T, n=n, programs=m, sms=sms, window_bytes=window_bytes, latent_bytes=latent_bytes,
                   window_alone_us=w_alone, latent_alone_us=l_alone, window_corun_us=w_co, latent_corun_us=l_co,
                   corun_us=total, latent_ideal_us=ideal,
                   window_gbps_per_sm_alone=window_bytes / w_alone / 1e3 / m,
                   window_gbps_per_sm_corun=window_bytes / w_co / 1e3 / m,
                   corun_gbps=(window_bytes + latent_bytes) / total / 1e3,
                   window_slowdown=w_co / w_alone, latent_slowdown=l_co / ideal,
                   telemetry=dict(window=tel_w, latent=tel_l, corun=tel_co))
        rows.append(row)
        print(f"s={s} n={n} m={m}: window {w_alone:.1f} -> {w_co:.1f} us, latent {l_alone:.1f} -> {l_co:.1f} us "
              f"(no interference: {ideal:.1f}), together {total:.1f} us", flush=True)
        del q, qpe, qc, z_old, kpe, k_new, v_new, kpe_old, kpe_new
        torch.cuda.empty_cache()
    write_json(args.out, dict(info=info, checks=checks, rows=rows))
    clock = lambda tel: f"{tel['sm_mhz'][1]:.0f}" if tel else "-"  # noqa: E731
    power = lambda tel: f"{tel['power_w'][1]:.0f}" if tel else "-"  # noqa: E731
    print("\n| s | n | m | window µs alone → together | GB/s per SM | latent µs alone → together (no interf.) | "
          "together µs | GB/s | SM MHz W / L / both | W W / L / both |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tel = r["telemetry"]
        print(f"| {r['s']} | {r['n']} | {r['programs']} | {r['window_alone_us']:.1f} → {r['window_corun_us']:.1f} | "
              f"{r['window_gbps_per_sm_alone']:.1f} → {r['window_gbps_per_sm_corun']:.1f} | {r['latent_alone_us']:.1f} → "
              f"{r['latent_corun_us']:.1f} ({r['latent_ideal_us']:.1f}) | {r['corun_us']:.1f} | {r['corun_gbps']:.0f} | "
              f"{' / '.join(clock(tel[k]) for k in ('window', 'latent', 'corun'))} | "
              f"{' / '.join(power(tel[k]) for k in ('window', 'latent', 'corun'))} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="hybrid_check.json")
    ap.add_argument("--suite", choices=("check", "partition", "interference"), default="check",
                    help="the checks, n sweep and s grid (default), the hybrid on an SM partition, or what its "
                         "parts lose to each other together")
    ap.add_argument("--dry-run", action="store_true", help="check: tiny shapes on the CPU (interpreter): plumbing only")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds from the start after which no new timing starts (the run ends a few s later; "
                         "default 105 for check, 200 for partition)")
    ap.add_argument("--child-checks", metavar="PATH", help=argparse.SUPPRESS)
    part = ap.add_argument_group("--suite partition and --suite interference")
    part.add_argument("--flash-mla", default=None, help="folder holding the official flash_mla package")
    part.add_argument("--s", default=None, help="query tokens per sequence, comma-separated (default 32,16,64 "
                      "for partition, 16,32,64 for interference)")
    part.add_argument("--b", type=int, default=32, help="sequences (default 32)")
    part.add_argument("--n", default=None, help="window sizes, comma-separated (default: the grid per s; "
                      "interference: the first, default INTERFERENCE_N)")
    part.add_argument("--programs", default=None, help="window programs, comma-separated (default: 44,66,88; "
                      "interference: the first, default default_programs)")
    part.add_argument("--no-parts", action="store_true", help="time the hybrid only, not its parts alone")
    args = ap.parse_args()
    if args.suite in ("partition", "interference"):
        if args.dry_run:
            ap.error(f"--dry-run: the {args.suite} suite runs the Gluon kernels (no interpreter)")
        if args.suite == "interference":
            args.s = args.s or "16,32,64"
            return run_interference(args)
        args.s = args.s or "32,16,64"
        return run_partition(args)
    args.budget = 105.0 if args.budget is None else args.budget
    if args.dry_run:
        from mla_var3.kernel import use_interpreter_without_gpu

        use_interpreter_without_gpu()
    if args.child_checks:
        run_checks(args.child_checks, args.dry_run)
        return 0
    t0 = time.time()
    from mla_var3.kernel import backends
    from mla_var3.kernel.hopper import GLUON_AVAILABLE, GLUON_IMPORT_ERROR

    on_gpu = torch.cuda.is_available() and not args.dry_run
    gluon_ok = bool(on_gpu and GLUON_AVAILABLE and backends.is_hopper("cuda"))
    env = environment(gluon=GLUON_AVAILABLE, gluon_error=GLUON_IMPORT_ERROR, hopper_path=gluon_ok, dry_run=args.dry_run)
    print(f"hybrid_check: {env}", flush=True)
    checks = checks_in_child(args.dry_run, timeout=80.0 if on_gpu else 300.0)
    checks_ok = bool(checks) and all(r.get("ok") for r in checks)
    print(f"correctness: {sum(bool(r.get('ok')) for r in checks)}/{len(checks)} ok ({time.time() - t0:.0f} s)",
          flush=True)
    if not checks_ok:
        print("  some checks failed: the hybrid is not timed (the pure kernels still are)", flush=True)
    res = dict(env=env, checks=checks, checks_ok=checks_ok)
    try:
        res.update(run_timing(args.dry_run, args.budget - (time.time() - t0), gluon_ok, checks_ok))
    except Exception as exc:
        res["timing_error"] = error_text(exc, 600)
        traceback.print_exc()
    res["wall_s"] = time.time() - t0
    write_json(args.out, res)
    if "sweep" in res:
        print(table(res))
    print(f"wrote {args.out} ({res['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

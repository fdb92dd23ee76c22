"""What the suites of this folder share: the one input builder (seeded inputs of every shape a
suite times), the one timing primitive (:func:`mla_var3.runtime.timing.time_fn` and
``time_interleaved``, through :func:`timed`), the run's environment record, a time budget, error
text, the JSON record and official FlashMLA's import.

The suites import it as a sibling module (``python benchmarks/<suite>.py`` puts this folder first
on ``sys.path``); no suite imports another. They use the package's public API only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

#: DeepSeek-V3's per-head widths: heads, no-RoPE head dim, RoPE dim, latent rank
H, D, P, K = 128, 128, 64, 512
#: FlashMLA's page size (tokens per page of a paged latent cache)
PAGE = 64
#: the seeded threshold batches (:func:`threshold_batches`)
THRESHOLD_BATCHES = Path(__file__).with_name("threshold_batches.json")


# --------------------------------------------------------------------------------------------
# the run


def environment(**extra) -> dict:
    """The package's environment record (device, clocks, versions, commit, timestamp) plus ``extra``."""
    from mla_var3.runtime.environment import environment as package_environment

    return {**package_environment(), **extra}


def stop_on_sigterm() -> None:
    """Raise KeyboardInterrupt in the main thread on SIGTERM (a time limit's ``timeout``), so a
    suite can write the points it has measured before it exits."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def error_text(exc: BaseException, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {exc}"[:limit]


def require_cuda() -> None:
    """Exit with status 2 and a one-line message when there is no CUDA GPU (the GPU suites' guard)."""
    if not torch.cuda.is_available():
        print("needs a CUDA (sm_90) GPU", file=sys.stderr)
        raise SystemExit(2)


def write_json(path, data) -> None:
    """``data`` as indented JSON at ``path`` (its folder created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


def baseline_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a suite that runs beside official FlashMLA: ``--out`` (the JSON
    record) and ``--flash-mla`` (the folder holding the ``flash_mla`` package); the suite adds
    its own options. ``doc``: the suite's docstring (its first line describes the command)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--flash-mla", default=None, help="folder holding the official flash_mla package")
    return ap


def import_flash_mla(folder: str | None):
    """Official FlashMLA from ``folder`` (the folder holding the ``flash_mla`` package), or None:
    no folder given, or it does not import (said on stdout)."""
    if not folder or not os.path.isdir(folder):
        return None
    sys.path.insert(0, folder)
    try:
        import flash_mla
    except Exception as exc:
        print("official FlashMLA not importable:", exc)
        return None
    return flash_mla


# --------------------------------------------------------------------------------------------
# timing: the package's one primitive


class Budget:
    """A run's time budget in seconds, counted from its creation."""

    def __init__(self, seconds: float):
        self.start, self.seconds = time.perf_counter(), seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()


def timed(rows: list, label: str, fn: Callable[[], object], *, budget: Budget | None = None,
          timing: dict | None = None, **info) -> float | None:
    """Time ``fn`` with ``time_fn(**timing)`` (CUDA-graph replays, L2 flushed before each) and
    append a row (``label``, ``info``, ``us``, ``p10``, ``p90``, ``method``; or ``skipped`` once
    the budget is spent, or ``error``) to ``rows``; the median in µs, or None."""
    from mla_var3.runtime.timing import time_fn

    row = dict(label=label, **info)
    rows.append(row)
    if budget is not None and budget.left() < 0:
        row["skipped"] = "time budget"
        return None
    try:
        t = time_fn(fn, **(timing or {}))
    except Exception as exc:  # a failing variant must not end the run
        row["error"] = error_text(exc, 400)
        print(f"  {label} {info}: {row['error']}", flush=True)
        return None
    row.update(us=t.median_us, p10=t.p10_us, p90=t.p90_us, method=t.method)
    print(f"  {label:58s} {t.median_us:10.1f} us", flush=True)
    return t.median_us


# --------------------------------------------------------------------------------------------
# inputs: the one builder


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` over ``b``'s finite elements, or inf when ``a`` and ``b`` are not
    finite at the same places (an output NaN where the reference is finite, or the reverse)."""
    a, b = a.float(), b.float()
    fin = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), fin):
        return float("inf")
    return float((a[fin] - b[fin]).norm() / b[fin].norm().clamp_min(1e-30))


def randn(device, dtype: torch.dtype, seed: int = 0) -> Callable[..., torch.Tensor]:
    """``f(*shape, std=1.0)``: seeded N(0, std²) values drawn on ``device``, stored in ``dtype``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return lambda *shape, std=1.0: (torch.randn(*shape, generator=gen, device=device) * std).to(dtype)


def expanded_inputs(b: int, s: int, t: int, h: int, d: int, p: int, dtype, device, seed: int = 0):
    """q [b,h,s,d], qpe [b,h,s,p], k, v [b,t,h,d], kpe [b,t,p] of the expanded design."""
    r = randn(device, dtype, seed)
    return r(b, h, s, d), r(b, h, s, p), r(b, t, h, d), r(b, t, h, d), r(b, t, p)


def expanded_flops(b: int, s: int, t: int, h: int = H, d: int = D, p: int = P) -> float:
    """FLOPs of expanded attention, ``2bhst(2d + p)`` (causal not discounted): the cost model's."""
    from mla_var3.analysis.cost import flash_attention
    from mla_var3.shapes import MLADims, Problem

    return float(flash_attention(MLADims(h=h, d=d, p=p, dv=d), Problem(b, s, t)).flops)


def sdpa_call(q, qpe, k, v, kpe, causal: bool):
    """cuDNN attention through PyTorch SDPA on per-head materialised ``d + p`` wide keys: (call, mask kind)."""
    import torch.nn.functional as F

    b, h, s, d = q.shape
    t, p = k.shape[1], kpe.shape[-1]
    qf = torch.cat([q, qpe], dim=-1)
    kf = torch.cat([k, kpe[:, :, None, :].expand(b, t, h, p)], dim=-1).transpose(1, 2).contiguous()
    vf = v.transpose(1, 2).contiguous()
    scale = (d + p) ** -0.5
    if causal and s == t:
        return lambda: F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale), "is_causal"
    if causal and s > 1:
        mask = torch.arange(t, device=q.device)[None, :] <= t - s + torch.arange(s, device=q.device)[:, None]
        return lambda: F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale), "bottom-right attn_mask"
    return lambda: F.scaled_dot_product_attention(qf, kf, vf, scale=scale), "no mask"


def make_paged(lengths: list[int], s: int, *, capacity: int, seed: int, dev="cuda", poison: bool = True,
               table_garbage: str = "minus1"):
    """A decode step in FlashMLA's paged layout: q [b, s, H, K+P], cache [pages, 64, 1, K+P] with
    the sequences' pages in random order, table [b, max_blocks] int32, seqlens [b] int32. Unused
    rows and pages hold NaN when ``poison``; table entries past each sequence hold -1
    (``minus1``) or random page numbers (``garbage``)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    b = len(lengths)
    max_blocks = math.ceil(capacity / PAGE)
    used = [math.ceil(n / PAGE) for n in lengths]
    n_pages = sum(used) + 3
    cache = torch.randn(n_pages, PAGE, 1, K + P, generator=g).to(torch.bfloat16)
    if poison:
        cache.fill_(float("nan"))
    perm = torch.randperm(n_pages, generator=g)
    table = torch.full((b, max_blocks), -1, dtype=torch.int32)
    if table_garbage == "garbage":
        table = torch.randint(0, n_pages, (b, max_blocks), generator=g, dtype=torch.int32)
    nxt = 0
    for i, (n, u) in enumerate(zip(lengths, used)):
        pages = perm[nxt: nxt + u]
        nxt += u
        table[i, :u] = pages.to(torch.int32)
        keys = torch.randn(u * PAGE, K + P, generator=g).to(torch.bfloat16)
        flat = keys.view(u, PAGE, 1, K + P)
        for j in range(u):
            rows = min(PAGE, n - j * PAGE)
            cache[pages[j], :rows] = flat[j, :rows]
    q = (torch.randn(b, s, H, K + P, generator=g) * 0.5).to(torch.bfloat16)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return q.to(dev), cache.to(dev), table.to(dev), seqlens.to(dev)


def paged_reference(q, cache, table, seqlens, *, causal: bool, scale: float):
    """The package's fp32 reference on FlashMLA's layout: output [b, s, H, K], LSE [b, H, s]
    (a sequence of length 0 gets 0 and -inf)."""
    from mla_var3.reference import flash_mla_paged as ref_paged

    qt = q.transpose(1, 2)
    o, lse = ref_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, scale, causal)
    return o.transpose(1, 2), lse


def threshold_batches(seed: int) -> list[dict]:
    """The seeded short-item ragged batches of ``seed`` (7, 8 or 9) whose plan kind the GPU chooses:
    ``[{"label", "b", "s", "t", "lengths"}]``, read from ``threshold_batches.json`` (how they were
    drawn is written there)."""
    data = json.loads(THRESHOLD_BATCHES.read_text())
    key = f"seed{seed}"
    if key not in data:
        raise ValueError(f"no threshold batches of seed {seed}; known: "
                         f"{', '.join(k[4:] for k in data if k.startswith('seed'))}")
    return data[key]

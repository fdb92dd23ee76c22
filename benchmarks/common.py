"""What the check scripts of this folder share: the run's environment record, seeded inputs, a
time budget, timed rows through the package's one timing primitive
(:func:`mla_var3.runtime.timing.time_fn`), error text and the JSON record.

The scripts import it as a sibling module (``python benchmarks/<script>.py`` puts this folder
first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable

import torch

#: DeepSeek-V3's per-head widths (the expanded and window checks' default shapes)
H, D, P, K = 128, 128, 64, 512


def environment(**extra) -> dict:
    """The package's environment record (device, clocks, versions, commit, timestamp) plus ``extra``."""
    from mla_var3.runtime.environment import environment as package_environment

    return {**package_environment(), **extra}


def stop_on_sigterm() -> None:
    """Raise KeyboardInterrupt in the main thread on SIGTERM (a time limit's ``timeout``), so a
    script can write the points it has measured before it exits."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def error_text(exc: BaseException, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {exc}"[:limit]


def require_cuda() -> None:
    """Exit with status 2 and a one-line message when there is no CUDA GPU (the GPU scripts' guard)."""
    if not torch.cuda.is_available():
        print("needs a CUDA (sm_90) GPU", file=sys.stderr)
        raise SystemExit(2)


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
    """Time ``fn`` with ``time_fn(**timing)`` and append a row (``label``, ``info``, ``us``, ``p10``,
    ``p90``, ``method``; or ``skipped`` once the budget is spent, or ``error``) to ``rows``; the
    median in µs, or None."""
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


def write_json(path, data) -> None:
    """``data`` as indented JSON at ``path`` (its folder created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


def interleaved_rounds(fns: dict, rounds: int, *, eager: bool = True,
                       seconds_per_call: float = 0.25) -> tuple[dict[str, list[float]], dict[str, list[float]] | None]:
    """``rounds`` rounds of ``time_interleaved`` over ``fns`` (every callable in every repetition,
    the order rotated; L2 flushed): per name the CUDA-graph median of each round, and with
    ``eager`` the eager one (plain calls between events), else None."""
    from mla_var3.runtime.timing import time_interleaved

    graph: dict[str, list[float]] = {n: [] for n in fns}
    plain: dict[str, list[float]] | None = {n: [] for n in fns} if eager else None
    for _ in range(rounds):
        g = time_interleaved(fns, use_graph=True, max_seconds=seconds_per_call * len(fns))
        e = time_interleaved(fns, use_graph=False, max_seconds=seconds_per_call * len(fns)) if eager else None
        for name in fns:
            graph[name].append(g[name].median_us)
            if e is not None:
                plain[name].append(e[name].median_us)
    return graph, plain


def print_ratio_table(title: str, rows: list[dict], key: str, names: list[str], digits: int = 2) -> None:
    """A markdown table of ``row["point"]`` and ``row[key][name]`` (µs) for each name, with
    FlashMLA's time (``row[key]["flashmla"]``, when there) and FlashMLA ÷ each; ``-`` for a name
    the row lacks."""
    print(f"\n{title}")
    print("| point | FlashMLA | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for row in rows:
        us = row[key]
        f = us.get("flashmla")
        cells = [f"{us[n]:.1f}" + (f" ({f / us[n]:.{digits}f})" if f else "") if n in us else "-" for n in names]
        print(f"| {row['point']} | " + (f"{f:.1f}" if f else "-") + " | " + " | ".join(cells) + " |")


def baseline_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a script that runs beside official FlashMLA: ``--out`` (the JSON
    record) and ``--flash-mla`` (the folder holding the ``flash_mla`` package); the script adds
    its own options. ``doc``: the script's docstring (its first line describes the command)."""
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


def check_hybrid_partition(cases, checks: list, dtype=torch.bfloat16) -> bool:
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

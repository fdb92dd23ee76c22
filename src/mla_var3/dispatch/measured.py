"""Measured attention-kernel times, read (never written) from the autotune cache and from
benchmark ``results.json`` files.

Each lookup of another module's format sits in one small adapter function below, so a change
of format is a one-function change here:

* :func:`_autotune_entries` — :class:`mla_var3.runtime.autotune.AutotuneCache`: keys
  ``device|design|dims|bucket|dtype|triton-version``, entries ``{"config", "time_us", ...}``
  (``time_us``: median of the winning config).
* :func:`result_records` — :func:`mla_var3.runtime.records.load_results`: ``(meta, records)``,
  records with ``name``, ``kind``, ``b, s, t, n``, ``dtype``, ``status``, ``time_us``; the meta
  names the device (``device_key``) and the dims.

Times are of the attention kernel alone (``flash_mla``, ``mla_var6_plus``, ``flash_attention``
over an already expanded cache), as the benchmark measures them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from mla_var3.designs import ATTENTION_KERNELS
from mla_var3.shapes import MLADims, Problem

@dataclass(frozen=True)
class Measurement:
    """One measured kernel time.

    ``n`` is the hybrid split (None for the other kernels); ``exact`` is False when the point
    only shares the autotune cache's shape bucket (b and t rounded up to a power of two).
    """

    kernel: str
    n: int | None
    time_s: float
    source: str
    exact: bool = True


# ------------------------------------------------------------------------------ adapters


def _autotune_entries(path: str | Path | None) -> tuple[Path, dict[str, dict]]:
    """The autotune cache's path (default: the user cache file) and its valid entries ({} if
    none; a corrupt file or entry is a warning there, never an error)."""
    from mla_var3.runtime.autotune import AutotuneCache

    cache = AutotuneCache(path)
    if not cache.path.exists():
        return cache.path, {}
    return cache.path, cache.entries()


def _bucket(problem: Problem) -> str:
    from mla_var3.runtime.autotune import shape_bucket

    return shape_bucket(problem)


#: the most digits of a bucket's hybrid split (``n`` rounded up to a power of two: 2**53 has 16).
_N_DIGITS = 17


def _split_bucket(bucket: str) -> tuple[int, str] | None:
    """(n, the bucket without its ``n<...>`` field) of a hybrid entry's bucket
    (:func:`mla_var3.runtime.autotune.shape_bucket`), or None when it holds no well-formed split
    (no ``n`` field, two of them, or ``nX``, ``n``, ``n-1``, a 5,000-digit number: a corrupt or
    edited key)."""
    fields = bucket.split("-")
    tokens = [f for f in fields if f.startswith("n")]
    if len(tokens) != 1:
        return None
    digits = tokens[0][1:]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > _N_DIGITS:
        return None
    return int(digits), "-".join(f for f in fields if not f.startswith("n"))


def _dims_token(dims: MLADims) -> str:
    return f"h{dims.h}-d{dims.d}-p{dims.p}-k{dims.k}-dv{dims.dv}"


def _triton_version() -> str | None:
    # from the package metadata: importing triton here would fix its settings (TRITON_INTERPRET)
    # before the kernel package chooses them
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def result_records(path: str | Path) -> tuple[dict, list]:
    from mla_var3.runtime.records import load_results

    return load_results(path)


def _device_key_of(name: str) -> str | None:
    """The devices-table key of a GPU name as the autotune cache stores it ('NVIDIA H200' -> 'h200')."""
    from mla_var3.analysis.devices import match_device_name

    dev = match_device_name(name)
    return dev.key if dev is not None else name.lower()


# ------------------------------------------------------------------------------ lookups


def from_autotune(device_key: str, dims: MLADims, problem: Problem, dtype: str,
                  path: str | Path | None = None) -> list[Measurement]:
    """Kernel times cached for this device, dims, dtype, shape bucket and Triton version.

    For the hybrid every cached split whose bucket matches the problem's (b, s, t) is returned
    with the split's bucket value as ``n`` (a power of two: the cache rounds n up).

    Entries whose tuned configs ran another backend than a default call selects there
    (``backend`` != ``default_backend``, both recorded at tuning time: e.g. a portable config
    of the absorbed design on sm_90, where the default call runs the Gluon kernel) are skipped:
    their time is not the time of the call the dispatcher makes. Entries without these fields
    (older caches) are kept.
    """
    want_triton = _triton_version()
    base = _bucket(Problem(problem.b, problem.s, problem.t, causal=problem.causal))
    out, bad = [], []
    cache_path, entries = _autotune_entries(path)
    for key, entry in entries.items():
        parts = key.split("|")
        if len(parts) != 6:
            continue
        dev_name, kernel, dims_tok, bucket, dt, triton_tok = parts
        if kernel not in ATTENTION_KERNELS or dims_tok != _dims_token(dims) or dt != dtype:
            continue
        if want_triton is not None and triton_tok != f"triton-{want_triton}":
            continue
        if _device_key_of(dev_name) != device_key or not isinstance(entry.get("time_us"), (int, float)):
            continue
        if entry.get("default_backend") not in (None, entry.get("backend", "triton")):
            continue
        n = None
        if kernel == "mla_var6_plus":
            split = _split_bucket(bucket)
            if split is None:
                bad.append(key)
                continue
            n, bucket = split
        if bucket != base:
            continue
        out.append(Measurement(kernel, n, float(entry["time_us"]) * 1e-6, f"autotune cache ({key})", exact=False))
    if bad:
        warnings.warn(f"autotune cache {str(cache_path)!r}: ignoring {len(bad)} hybrid "
                      f"entr{'y' if len(bad) == 1 else 'ies'} whose key holds no split n ({bad[0]!r}"
                      f"{'; ...' if len(bad) > 1 else ''})", stacklevel=2)
    return out


def from_results(paths, device_key: str, dims: MLADims, problem: Problem, dtype: str) -> list[Measurement]:
    """Kernel times of the benchmark records in ``paths`` at exactly this (b, s, t), dims,
    dtype and device (``meta['device_key']``); records that failed or were skipped are ignored."""
    out = []
    for path in paths:
        meta, records = result_records(path)
        if meta.get("device_key") not in (None, device_key):
            continue
        md = meta.get("dims") or {}
        if any(md.get(f) not in (None, getattr(dims, f)) for f in ("h", "d", "p", "k", "dv")):
            continue
        for r in records:
            if (r.name in ATTENTION_KERNELS and r.kind == "design" and r.status == "ok" and r.time_us
                    and (r.b, r.s, r.t) == (problem.b, problem.s, problem.t) and r.dtype == dtype
                    and r.stage == "attention"):
                n = r.n if r.name == "mla_var6_plus" else None
                if r.name == "mla_var6_plus" and n is None:
                    continue
                out.append(Measurement(r.name, n, r.time_us * 1e-6, f"results {Path(path).name}"))
    return out

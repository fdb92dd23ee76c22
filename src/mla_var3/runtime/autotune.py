"""Autotuning of launch configs, with the winners cached on disk.

:func:`autotune` times every candidate of a design's config enumerator with the package's one
timing primitive, skips candidates that fail (compile errors, out of shared memory or
registers), and stores the winner in an :class:`AutotuneCache`.

The cache is one JSON file, ``autotune.json``, in the user cache folder:
``$MLA_VAR3_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/mla_var3``, else ``~/.cache/mla_var3``.
Entries are keyed by (device name, design, dims, problem shape bucket, dtype, triton version)
— see :func:`cache_key`. Writes are atomic (a temporary file in the same folder, then
``os.replace``) and merge with what another process may have written meanwhile.

A corrupt cache is never fatal. A file that cannot be read or parsed (random bytes, truncated,
empty, not a JSON object, a directory) is reported with a warning and treated as empty; an
entry that is invalid (no config object, a config holding anything but JSON scalars and
objects, a number that is not finite anywhere in it: ``NaN``, ``Infinity``, an integer beyond a
float's range; a ``time_us`` that is not a finite positive number) is reported and treated as absent;
a cached config that is not one of the design's current candidates (a stale or edited tiling
such as ``block_m = 24`` or ``"64"``) is never used. The affected shapes are re-tuned and the
next store rewrites the file without the bad entries.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mla_var3._io import InputFileError, is_finite, load_json, quote as _quote
from mla_var3.runtime.timing import Timing, time_fn

CACHE_ENV = "MLA_VAR3_CACHE_DIR"
CACHE_FILE = "autotune.json"
_FORMAT = 1


def cache_dir() -> Path:
    """The user cache folder (not created here)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mla_var3"


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def shape_bucket(problem) -> str:
    """The problem-size bucket a tuned config is reused for.

    b and t are rounded up to a power of two; s is exact up to 16 (decode and speculative
    lengths change the best tiling) and a power of two above; the hybrid's n likewise to a
    power of two (0 stays 0); causal is part of the bucket.
    """
    s = problem.s if problem.s <= 16 else _pow2_ceil(problem.s)
    parts = [f"b{_pow2_ceil(problem.b)}", f"s{s}", f"t{_pow2_ceil(problem.t)}"]
    if getattr(problem, "n", None) is not None:
        parts.append(f"n{0 if problem.n == 0 else _pow2_ceil(problem.n)}")
    parts.append("causal" if problem.causal else "full")
    return "-".join(parts)


def _dims_key(dims) -> str:
    return f"h{dims.h}-d{dims.d}-p{dims.p}-k{dims.k}-dv{dims.dv}"


def cache_key(device: str, design: str, dims, problem, dtype: str, triton_version: str | None = None) -> str:
    """The cache key of one tuning: ``device|design|dims|bucket|dtype|triton``."""
    if triton_version is None:
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = "none"
    return "|".join([device, design, _dims_key(dims), shape_bucket(problem), dtype, f"triton-{triton_version}"])


def config_to_dict(config) -> dict:
    """A launch config as a JSON-able dict (frozen dataclasses, or objects with ``to_dict``)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if isinstance(config, dict):
        return dict(config)
    raise TypeError(f"cannot serialise launch config of type {type(config).__name__}")


def _json_value_problem(value, where: str) -> str | None:
    if isinstance(value, dict):
        for k, v in value.items():
            problem = _json_value_problem(v, f"{where}.{k}")
            if problem:
                return problem
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not is_finite(value):
        return f"{where} is {_quote(value)}, not a finite number"
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    return f"{where} is a {type(value).__name__}, not a JSON scalar or object"


def entry_problem(entry) -> str | None:
    """Why a cache entry is unusable, or None when it is valid: it must be an object with a
    non-empty ``config`` object of JSON scalars and objects (no NaN or infinity), a
    ``time_us`` that is absent, null or a finite positive number, and strings (or null) for
    ``backend`` and ``default_backend``."""
    if not isinstance(entry, dict):
        return f"not a JSON object but {type(entry).__name__}"
    config = entry.get("config")
    if not isinstance(config, dict) or not config:
        return "no config object"
    problem = _json_value_problem(config, "config")
    if problem:
        return problem
    t = entry.get("time_us")
    if t is not None and (not is_finite(t) or t <= 0):
        return f"time_us is {_quote(t)}, not a positive time"
    for name in ("backend", "default_backend"):
        if entry.get(name) is not None and not isinstance(entry[name], str):
            return f"{name} is {_quote(entry[name])}, not a string"
    for name, value in entry.items():
        if name != "config" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not is_finite(value):
            return f"{name} is {_quote(value)}, not a finite number"
    return None


class AutotuneCache:
    """The on-disk cache of tuned configs (see the module docstring).

    >>> cache = AutotuneCache(tmp_path / "autotune.json")             # doctest: +SKIP
    >>> cache.put("key", {"BLOCK_N": 64}, time_us=12.5)                # doctest: +SKIP
    >>> cache.get("key")["config"]                                     # doctest: +SKIP
    {'BLOCK_N': 64}
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else cache_dir() / CACHE_FILE

    def _read(self) -> dict[str, dict]:
        """The valid entries; {} for a missing file; {} plus a warning for an unreadable or
        corrupt one; invalid entries left out with a warning."""
        if not os.path.lexists(self.path):
            return {}
        try:
            # numbers read as Python does: a NaN or a 400-digit integer costs its entry (below), not the file
            data = load_json(self.path, "autotune cache", finite=False)
            if not isinstance(data.get("entries"), dict):
                raise InputFileError(f"autotune cache {str(self.path)!r} has no 'entries' object")
        except InputFileError as exc:
            warnings.warn(f"corrupt autotune cache ignored: {exc}; configs will be re-tuned and the file rewritten",
                          stacklevel=3)
            return {}
        entries, bad = {}, []
        for key, entry in data["entries"].items():
            problem = entry_problem(entry)
            if problem is None:
                entries[key] = entry
            else:
                bad.append(f"{key}: {problem}")
        if bad:
            warnings.warn(f"autotune cache {str(self.path)!r}: ignoring {len(bad)} invalid "
                          f"entr{'y' if len(bad) == 1 else 'ies'} ({bad[0]}{'; ...' if len(bad) > 1 else ''}); "
                          "they will be re-tuned and the file rewritten", stacklevel=3)
        return entries

    def entries(self) -> dict[str, dict]:
        """A copy of every cached entry (key -> {"config", "time_us", ...})."""
        return self._read()

    def get(self, key: str) -> dict | None:
        """The entry for ``key`` or None."""
        return self._read().get(key)

    def put(self, key: str, config: dict, **info) -> None:
        """Store ``config`` (a dict) under ``key`` with extra ``info`` (time_us, tried, ...); atomic.

        A corrupt file on disk is replaced (its valid entries kept). ValueError when the entry
        itself is invalid (see :func:`entry_problem`); OSError when the file cannot be written.
        """
        if not isinstance(key, str) or not key:
            raise ValueError(f"autotune cache key must be a non-empty string, got {key!r}")
        entry = {"config": dict(config), **info,
                 "stored": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        problem = entry_problem(entry)
        if problem is not None:
            raise ValueError(f"autotune cache entry {key!r}: {problem}")
        entries = self._read()        # merge with what is on disk now
        entries[key] = entry
        self._write(entries)

    def clear(self) -> bool:
        """Delete the cache file; True when there was one."""
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False

    def _write(self, entries: dict[str, dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"format": _FORMAT, "entries": entries}, indent=1, sort_keys=True, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=".autotune-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


@dataclass
class TuneResult:
    """Outcome of :func:`autotune`: the chosen ``config`` and its ``time_us`` (None when it came
    from the cache without re-timing); ``trials`` lists (config dict, Timing or error text)."""

    config: object
    time_us: float | None
    from_cache: bool
    key: str
    trials: list[tuple[dict, object]] = field(default_factory=list)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _describe(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def restore_config(stored, candidates: Sequence):
    """The candidate whose dict equals the stored config, else None (re-tune).

    Only the design's own enumerated candidates are ever returned: a stored config that is not
    one of them (the enumerator changed, the shape within the bucket allows other tilings, or
    the file was edited: ``block_m = 24``, ``"64"`` for 64, ``true`` for 1) is never launched.
    """
    if not isinstance(stored, dict):
        return None
    for cand in candidates:
        cand_dict = config_to_dict(cand)
        if cand_dict == stored and _same_types(cand_dict, stored):
            return cand
    return None


def _same_types(a, b) -> bool:
    """Equal dicts whose values also have the same types (``1 == True == 1.0`` in Python)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_types(a[k], b[k]) for k in a)
    return type(a) is type(b)


def autotune(design: str, candidates: Sequence, make_call: Callable[[object], Callable[[], object]], *,
             key: str, cache: AutotuneCache | None = None, retune: bool = False,
             timer: Callable[[Callable[[], object]], Timing] | None = None,
             log: Callable[[str], None] | None = _stderr, budget_s: float | None = None,
             info: dict | None = None) -> TuneResult:
    """Pick the fastest of ``candidates`` for one problem, using and filling the cache.

    Parameters
    ----------
    design : str
        Design name, for messages.
    candidates : sequence of launch configs
        The design's config enumerator output (frozen dataclasses).
    make_call : callable
        ``make_call(config)`` returns a no-argument callable that runs the design with that config.
    key : str
        The cache key (:func:`cache_key`).
    cache : AutotuneCache or None
        Where winners are stored; None tunes without caching.
    retune : bool
        Ignore a cached entry and tune again.
    timer : callable
        ``timer(fn) -> Timing``; default :func:`time_fn` with a short per-candidate budget.
    log : callable or None
        Progress lines (what is tried, how many are left); None for silence.
    budget_s : float or None
        Stop trying further candidates once this many seconds have passed (compilation
        included); the best so far wins (the enumerators list their default first).
    info : dict or None
        Extra fields stored with the winner (e.g. ``backend``, the backend the tuned configs
        run, and ``default_backend``, the one a default call selects on this device).

    Raises
    ------
    RuntimeError
        When every candidate failed (the message lists each failure).
    """
    candidates = list(candidates)
    if not candidates:
        raise ValueError(f"autotune {design}: no candidate configs")
    say = log or (lambda _msg: None)
    if cache is not None and not retune:
        entry = cache.get(key)
        if entry is not None:
            cfg = restore_config(entry["config"], candidates)
            if cfg is not None:
                return TuneResult(cfg, entry.get("time_us"), True, key)
            say(f"autotune {design}: cached config {entry['config']} is not one of the {len(candidates)} "
                "candidates; re-tuning")
    timer = timer or (lambda fn: time_fn(fn, warmup=2, reps=30, min_reps=3, max_seconds=0.3))
    best, best_us, trials = None, float("inf"), []
    total = len(candidates)
    start = time.perf_counter()
    for i, cfg in enumerate(candidates, 1):
        if budget_s is not None and best is not None and time.perf_counter() - start > budget_s:
            say(f"autotune {design}: time budget of {budget_s:g} s reached after {i - 1}/{total} candidates")
            break
        desc = _describe(config_to_dict(cfg))
        try:
            timing = timer(make_call(cfg))
        except Exception as exc:           # compile error, OutOfResources, invalid tiling
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            trials.append((config_to_dict(cfg), reason))
            say(f"autotune {design} [{i}/{total}, {total - i} left] {desc}: skipped ({reason})")
            continue
        trials.append((config_to_dict(cfg), timing))
        if timing.median_us < best_us:
            best, best_us = cfg, timing.median_us
        say(f"autotune {design} [{i}/{total}, {total - i} left] {desc}: {timing.median_us:,.1f} µs "
            f"(best {best_us:,.1f} µs)")
    if best is None:
        lines = "\n".join(f"  {_describe(c)}: {r}" for c, r in trials)
        raise RuntimeError(f"autotune {design}: every candidate failed:\n{lines}")
    if cache is not None:
        try:
            cache.put(key, config_to_dict(best), design=design, time_us=best_us, tried=len(trials), candidates=total,
                      failed=sum(1 for _, r in trials if isinstance(r, str)), **(info or {}))
        except OSError as exc:            # a read-only or full disk costs the caching, not the result
            warnings.warn(f"autotune cache {str(cache.path)!r} could not be written ({exc}); "
                          "the tuned config is used but not kept", stacklevel=2)
    say(f"autotune {design}: chose {_describe(config_to_dict(best))} ({best_us:,.1f} µs)")
    return TuneResult(best, best_us, False, key, trials)

"""Argument types of the ``mla-var3`` commands: every number, list and path a command takes
goes through one of these, so a bad value is an argparse error naming the flag.

Integers stop at :data:`MAX_INT` and other numbers at :data:`MAX_NUMBER`, far above any real
shape or size, so the cost models' arithmetic (which turns products of them into floats) stays
finite; NaN and infinity are refused; a long bad value is quoted short. The model options
(``--model``, ``--dtype``, ``--h --d --p --k``) and their resolution to ``MLADims`` are here too:
``mla-var3`` and ``python -m mla_var3.kernel`` share them.

>>> positive_int("32"), nonneg_int_list("0, 256"), window_budget_arg("4.5MiB")
(32, [0, 256], 4718592.0)
"""

from __future__ import annotations

import argparse
import math

from mla_var3 import _io
from mla_var3._io import quote
from mla_var3.shapes import DEFAULT_MODEL, DTYPE_BYTES, get_preset

#: the largest integer argument (2**53: every integer up to it is exact as a float).
MAX_INT = _io.MAX_INT
#: the largest non-integer argument (GB, parameters, seconds).
MAX_NUMBER = 1e15
#: the largest byte count (--window-budget).
MAX_BYTES = float(2**63)


def _bad(kind: str, text: str, limit: str = "") -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {kind}{limit}, got {quote(text)}")


def _parse_int(text: str, kind: str, low: int) -> int:
    try:
        value = int(text.strip())
    except (ValueError, AttributeError):
        raise _bad(kind, text) from None
    if value < low:
        raise _bad(kind, text)
    if value > MAX_INT:
        raise _bad(kind, text, " of at most 2**53")
    return value


def _parse_number(text: str, kind: str, low: float, allow_low: bool, high: float = MAX_NUMBER) -> float:
    try:
        value = float(text.strip())
    except (ValueError, AttributeError):
        raise _bad(kind, text) from None
    if not math.isfinite(value) or value < low or (value == low and not allow_low):
        raise _bad(kind, text)
    if value > high:
        raise _bad(kind, text, f" of at most {high:g}")
    return value


def positive_int(text: str) -> int:
    """An integer in [1, MAX_INT]."""
    return _parse_int(text, "a positive integer", 1)


def nonneg_int(text: str) -> int:
    """An integer in [0, MAX_INT]."""
    return _parse_int(text, "a non-negative integer", 0)


def positive_float(text: str) -> float:
    """A finite number in (0, MAX_NUMBER]."""
    return _parse_number(text, "a positive number", 0.0, allow_low=False)


def nonneg_float(text: str) -> float:
    """A finite number in [0, MAX_NUMBER]."""
    return _parse_number(text, "a non-negative number", 0.0, allow_low=True)


def path_arg(text: str) -> str:
    """A file or folder path: any non-empty text (the command says what is wrong with the file)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def n_arg(text: str) -> int | str:
    """``auto`` or a non-negative integer (the hybrid's n)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return nonneg_int(text)
    except argparse.ArgumentTypeError:
        raise _bad("'auto' or a non-negative integer", text) from None


_BYTE_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def window_budget_arg(text: str) -> float | str:
    """``latent`` (the latent cache's own size per sequence per layer) or bytes, e.g.
    ``4718592``, ``4.5MB``, ``4.5MiB``."""
    low = text.strip().lower().replace(" ", "")
    if low == "latent":
        return "latent"
    num = low.rstrip("bikmg")
    unit = low[len(num):] or "b"
    try:
        value = float(num) * _BYTE_UNITS[unit]
    except (ValueError, KeyError):
        raise _bad("'latent' or bytes such as 4718592, 4.5MB, 4.5MiB", text) from None
    if not math.isfinite(value) or value < 0:
        raise _bad("a non-negative byte count", text)
    if value > MAX_BYTES:
        raise _bad("a byte count", text, " of at most 2**63")
    return value


def int_list(text: str, *, allow_zero: bool = False) -> list[int]:
    """A comma-separated list of positive integers (non-negative with ``allow_zero``)."""
    parse = nonneg_int if allow_zero else positive_int
    return [parse(part.strip()) for part in text.split(",") if part.strip()] or _raise_empty(text, allow_zero)


def nonneg_int_list(text: str) -> list[int]:
    """A comma-separated list of non-negative integers."""
    return int_list(text, allow_zero=True)


def _raise_empty(text: str, allow_zero: bool = False):
    kind = "non-negative" if allow_zero else "positive"
    raise _bad(f"a comma-separated list of {kind} integers", text)


# --- shared options: the model and its dims ---------------------------------------------------


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, --dtype and the dim overrides (--h --d --p --k)."""
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model preset (default {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES), help="element type (default bf16)")
    for dim, what in (("h", "heads"), ("d", "no-RoPE head dim"), ("p", "RoPE dim"), ("k", "latent rank")):
        p.add_argument(f"--{dim}", type=positive_int, help=f"override {what}")


def dims_from_args(args):
    """The MLADims for --model/--dtype and any overrides."""
    dims = get_preset(args.model, args.dtype)
    overrides = {k: getattr(args, k) for k in ("h", "d", "p", "k") if getattr(args, k, None) is not None}
    if overrides:
        if "d" in overrides:
            overrides.setdefault("dv", overrides["d"])
        label = ",".join(f"{k}={v}" for k, v in overrides.items() if k != "dv")
        dims = dims.replace(**overrides, name=f"{dims.name}({label})")
    return dims

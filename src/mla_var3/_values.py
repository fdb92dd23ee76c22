"""Checks of the plain values callers pass to the package's functions: one validator per kind
of value, used by every entry point that takes it, so a mistake is refused the same way
everywhere. No torch here.

* :func:`check_scale`: a softmax scale, a finite number > 0 (not a bool: ``True`` in the scale's
  position is a shifted argument, e.g. ``causal``; not a string: ``"0.1"`` is a caller's bug).
* :func:`check_count`: a count of tokens, blocks, ...: an integer >= 0 (not a bool, float or
  string) up to a limit.
* :func:`check_length_dtype`: a tensor of per-sequence lengths is int32 or int64 (a bool tensor
  would read as lengths 0 and 1; torch is imported only when it is called).

>>> check_scale(0.125), check_count(3, "tokens")
(0.125, 3)
>>> check_scale(True)
Traceback (most recent call last):
...
ValueError: scale must be a positive finite number, got True (a bool: an argument in the wrong position?)
"""

from __future__ import annotations

import math
import numbers

from mla_var3._io import MAX_INT, quote


def check_scale(scale, name: str = "scale") -> float:
    """``scale`` as a float: a real number (Python or numpy, or a one-element tensor or array,
    read with ``item()``), finite and > 0; ValueError naming ``name`` otherwise (bool and str
    included)."""
    if isinstance(scale, bool) or "bool" in str(getattr(scale, "dtype", "")):
        raise ValueError(f"{name} must be a positive finite number, got {scale!r} (a bool: an argument in the wrong "
                         "position?)")
    if not isinstance(scale, numbers.Real) and getattr(scale, "shape", None) in ((), [], (1,), [1]) \
            and hasattr(scale, "item"):
        scale = scale.item()          # a 0-d tensor or array (a host synchronisation for a CUDA tensor)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"{name} must be a positive finite number, got {quote(scale)} ({type(scale).__name__})")
    try:
        value = float(scale)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a positive finite number, got {quote(scale)}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {quote(scale)}")
    return value


def check_count(value, name: str, limit: int = MAX_INT) -> int:
    """``value`` as an int in [0, ``limit``]: an integer (Python or numpy; not a bool, float or
    string); ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative integer, got {quote(value)} ({type(value).__name__})")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value}")
    if value > limit:
        raise ValueError(f"{name} must be at most {limit:,}, got {quote(value)}")
    return value


#: the dtypes a tensor of lengths may have (names of torch dtypes). A bool tensor is refused
#: (``True`` would read as a length of 1), as are floating, complex and narrow integer ones
#: (uint8 wraps at 256).
LENGTH_DTYPES = ("int32", "int64")


def check_length_dtype(name: str, lengths):
    """``lengths`` unless it is not a tensor of :data:`LENGTH_DTYPES`: the one rule for every
    tensor of per-sequence lengths the package takes (the kernels' and references' ``seqlens``,
    the caches' ``seqlens``); ValueError naming ``name`` and the dtype."""
    import torch

    if not isinstance(lengths, torch.Tensor):
        raise ValueError(f"{name} must be an int32 or int64 tensor, got {type(lengths).__name__}")
    dtype = str(lengths.dtype).replace("torch.", "")
    if dtype not in LENGTH_DTYPES:
        raise ValueError(f"{name} must have dtype in ({', '.join(LENGTH_DTYPES)}), got {dtype}")
    return lengths

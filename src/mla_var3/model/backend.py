"""Which implementation of a design's attention function the layer calls.

``"auto"``: the Triton kernels (:mod:`mla_var3.kernel`) when the tensors are on a CUDA device
and the kernel package provides the function, else the fp32 references
(:mod:`mla_var3.reference`). ``"reference"`` and ``"kernel"`` force one side (``"kernel"`` on a
CPU runs the kernels under Triton's interpreter, slowly: set ``TRITON_INTERPRET=1`` first).
"""

from __future__ import annotations

from typing import Callable

import torch

from mla_var3 import reference
from mla_var3.designs import KERNELS

BACKENDS = ("auto", "reference", "kernel")
FUNCTIONS = tuple(KERNELS)


def _kernel(name: str) -> Callable | None:
    try:
        return KERNELS[name].load()
    except (ImportError, AttributeError):
        return None


def attention_fn(name: str, device: torch.device | str, backend: str = "auto") -> Callable:
    """The callable implementing ``name`` (one of ``FUNCTIONS``) for tensors on ``device``."""
    if name not in FUNCTIONS:
        raise ValueError(f"unknown attention function {name!r}; expected one of {FUNCTIONS}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "kernel" or (backend == "auto" and torch.device(device).type == "cuda"):
        fn = _kernel(name)
        if fn is not None:
            return fn
        if backend == "kernel":
            raise ValueError(f"mla_var3.kernel has no {name!r}")
    return getattr(reference, name)

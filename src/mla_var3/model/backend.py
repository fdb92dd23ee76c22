"""Which implementation of a design's attention function the layer calls.

``"auto"``: the Triton kernels (:mod:`mla_var3.kernel`) when the tensors are on a CUDA device
and the kernel package provides the function, else the fp32 references
(:mod:`mla_var3.reference`). ``"reference"`` and ``"kernel"`` force one side (``"kernel"`` on a
CPU runs the kernels under Triton's interpreter, slowly).
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

BACKENDS = ("auto", "reference", "kernel")
FUNCTIONS = ("flash_attention", "flash_mla", "flash_mla_paged", "mla_var6_plus", "decompress", "absorb_query")


def _kernel(name: str) -> Callable | None:
    # Import the entry point's own module: once a submodule named like its function (e.g.
    # ``mla_var3.kernel.absorbed``) is imported, the package attribute of that name is the module.
    try:
        package = importlib.import_module("mla_var3.kernel")
        module = getattr(package, "_ENTRY_POINTS", {}).get(name)
        fn = getattr(importlib.import_module(module), name) if module else getattr(package, name)
    except (ImportError, AttributeError):
        return None
    return fn if callable(fn) and not isinstance(fn, type(importlib)) else None


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
    return getattr(importlib.import_module("mla_var3.reference"), name)

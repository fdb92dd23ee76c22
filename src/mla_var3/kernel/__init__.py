"""Triton kernels of the MLA designs and the stages around them.

One module per design (its ``@triton.jit`` kernels, launch config dataclass and launcher):

==================  ==========================================================
``flash_mla``       absorbed attention over the latent cache (dense and paged)
``flash_attention`` expanded attention with the shared RoPE key
``mla_var6_plus``   the hybrid: latent old tokens + expanded new ones, one softmax
``gemm``            ``absorb_query`` and ``decompress`` (per-head batched GEMMs)
``combine``         split-KV combine (LSE merge of partial outputs)
==================  ==========================================================

The entry points (:data:`mla_var3.designs.KERNELS`) are imported lazily so that importing one
design does not compile or import the others; ``mla_var3.flash_mla`` etc. re-export them.

Without a CUDA device the kernels run on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``), slowly; that is how the test suite checks them without a GPU. The
variable must be set before any ``@triton.jit`` function is defined: programs call
:func:`use_interpreter_without_gpu` first (importing this package changes nothing).
"""

import os

from mla_var3.designs import KERNELS as _KERNELS

__all__ = [*_KERNELS, "use_interpreter_without_gpu"]


def use_interpreter_without_gpu() -> bool:
    """Select Triton's CPU interpreter (``TRITON_INTERPRET=1``) when no CUDA device is visible
    and the variable is unset; returns whether the interpreter is on. For programs (``python -m
    mla_var3.kernel``, the self-check): call it before the first kernel module is imported."""
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def __getattr__(name: str):
    if name not in _KERNELS:
        raise AttributeError(f"module 'mla_var3.kernel' has no attribute {name!r}")
    return _KERNELS[name].load()

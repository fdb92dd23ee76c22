"""Triton kernels of the MLA designs and the stages around them.

One module per design (its ``@triton.jit`` kernels, launch config dataclass and launcher):

==================  ==========================================================
``flash_mla``       absorbed attention over the latent cache (dense and paged)
``flash_attention`` expanded attention with the shared RoPE key
``mla_var6_plus``   the hybrid: latent old tokens + expanded new ones, one softmax
``gemm``            ``absorb_query`` and ``decompress`` (per-head batched GEMMs)
``combine``         split-KV combine (LSE merge of partial outputs)
==================  ==========================================================

The entry points are imported lazily so that importing one design does not compile or import
the others; ``mla_var3.flash_mla`` etc. re-export them.

On a machine without a CUDA device, importing this package selects Triton's CPU interpreter
(``TRITON_INTERPRET=1``) unless the variable is already set: the kernels then run on CPU
tensors, slowly, which is how the test suite checks them without a GPU. The variable must be
set before any ``@triton.jit`` function is defined, hence here.
"""

import importlib
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

_ENTRY_POINTS = {
    "flash_mla": "mla_var3.kernel.absorbed",
    "flash_mla_paged": "mla_var3.kernel.absorbed",
    "flash_attention": "mla_var3.kernel.expanded",
    "mla_var6_plus": "mla_var3.kernel.hybrid",
    "decompress": "mla_var3.kernel.gemm",
    "absorb_query": "mla_var3.kernel.gemm",
}

__all__ = list(_ENTRY_POINTS)


def __getattr__(name: str):
    module = _ENTRY_POINTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mla_var3.kernel' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""Triton kernels of the MLA designs and the stages around them.

Each design's public entry point (:data:`mla_var3.designs.KERNELS`) lives in one portable module
(its ``@triton.jit`` kernels, launch config dataclass and launcher); a design may span more
modules: its Hopper (sm_90) backend in :mod:`mla_var3.kernel.hopper`, which registers itself
(:mod:`~mla_var3.kernel.backends`), and, for the absorbed design, its decode plan and the
split-KV combine.

===============  ====================================================================================
design / stage   modules
===============  ====================================================================================
absorbed         ``absorbed`` (``flash_mla``, ``flash_mla_paged``; portable), ``decode``
                 (``AbsorbedDecode``: the caller's plan/run object, the entry points' checks),
                 ``decode_plan`` (which program runs which key blocks, planned on the GPU; its
                 types in ``plan_types``, kernels in ``plan_kernels``, host reference in
                 ``plan_reference``), ``combine`` (the split-KV LSE merge), ``hopper.absorbed_gluon``,
                 ``hopper.absorbed_seesaw`` (the kernel) and ``hopper.seesaw_host`` (its launches) (sm_90)
expanded         ``expanded`` (``flash_attention``), ``hopper.expanded_gluon`` (sm_90)
hybrid           ``hybrid`` (``mla_var6_plus``, ``HybridDecode``: the caller's state), ``hopper.hybrid_hopper``
                 and ``hopper.window_gluon`` (sm_90)
stages           ``gemm`` (``absorb_query``, ``decompress``)
shared           ``_jit`` (in-kernel helpers), ``_common`` (host checks), ``_launch`` (launching with
                 little host work), ``backends`` (which implementation runs where)
programs         ``launchers`` (every launcher by name), ``selfcheck``, ``profile``, ``sass``, and
                 ``python -m mla_var3.kernel``
===============  ====================================================================================

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

"""mla_var3 — Multi-head Latent Attention: analysis, Triton kernels and measurement.

The analysis (``mla_var3.analysis``, ``mla_var3.shapes``) needs no torch. The kernel entry points
below are imported lazily, so ``import mla_var3`` stays cheap:

>>> import mla_var3 as mv                                   # doctest: +SKIP
>>> o_latent, lse = mv.flash_mla(qc, qpe, z, kpe, scale=mv.get_preset("deepseek-v3").default_scale)
"""

from mla_var3.designs import KERNELS as _KERNEL_API
from mla_var3.shapes import MLADims, Problem, get_preset, preset_names

__version__ = "0.1.0"

__all__ = ["MLADims", "Problem", "get_preset", "preset_names", *_KERNEL_API]


def __getattr__(name: str):
    if name in _KERNEL_API:
        return _KERNEL_API[name].load()
    raise AttributeError(f"module 'mla_var3' has no attribute {name!r}")

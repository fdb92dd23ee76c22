"""Hopper (sm_90) kernels written in Gluon (``triton.experimental.gluon``), and their backends.

Gluon kernels cannot run under the Triton interpreter; they are compiled for sm_90 on any
machine (see ``tests/test_gluon_compile.py`` and ``tests/test_gluon_expanded.py``) and checked
numerically on a Hopper GPU (``benchmarks/serving_check.py``, ``benchmarks/expanded_check.py
--suite gluon``, ``benchmarks/hybrid_check.py`` and the GPU tests). Importing this package never fails:
when Gluon is missing, :data:`GLUON_AVAILABLE` is False and :data:`GLUON_IMPORT_ERROR` says why.

Each module registers its design's ``"gluon"`` backend with :mod:`mla_var3.kernel.backends`
(which imports this package on its first lookup); the modules build on the portable ones,
never the other way round.
"""

from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE, GLUON_IMPORT_ERROR
from mla_var3.kernel.hopper.absorbed_gluon import flash_mla_gluon
from mla_var3.kernel.hopper.expanded_gluon import flash_attention_gluon
from mla_var3.kernel.hopper.hybrid_hopper import mla_var6_plus_hopper

__all__ = ["GLUON_AVAILABLE", "GLUON_IMPORT_ERROR", "flash_attention_gluon", "flash_mla_gluon", "mla_var6_plus_hopper"]

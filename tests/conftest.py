"""Test setup: run Triton kernels under the interpreter when no CUDA device is present.

TRITON_INTERPRET must be set before any module with ``@triton.jit`` is imported, so it is
decided here, at collection time.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Value checks (lengths and block-table entries in range) cost a host synchronisation on CUDA
# inputs and are off there by default; the suite checks them on every device. Tests of CUDA-graph
# capture and of the repeat path turn them off again (a synchronisation cannot be captured).
os.environ.setdefault("MLA_VAR3_CHECK", "1")


@pytest.fixture
def benchmark_module():
    """``benchmark_module("hybrid_check")``: a script of ``benchmarks/`` loaded as a module (its
    folder on ``sys.path`` while it loads, for its ``from common import ...``)."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name: str):
        sys.path.insert(0, str(bench))
        try:
            spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        finally:
            sys.path.remove(str(bench))
        return mod
    return load

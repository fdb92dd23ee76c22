"""Test setup: run Triton kernels under the interpreter when no CUDA device is present.

TRITON_INTERPRET must be set before any module with ``@triton.jit`` is imported, so it is
decided here, at collection time.
"""

import os


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

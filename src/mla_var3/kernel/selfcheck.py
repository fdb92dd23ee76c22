"""A quick correctness check of every kernel against the fp32 references.

Used by ``mla-var3 report`` (the README's main job): on a GPU it runs each design at a
DeepSeek-V3-sized shape; without one it runs small shapes under Triton's interpreter, so a
fresh CPU machine still proves the kernels compute the right function. Importing this module
selects the interpreter when there is no GPU (:func:`mla_var3.kernel.use_interpreter_without_gpu`):
it is the check program's module, and ``mla-var3 report`` reads the choice once it is imported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mla_var3.designs import ATTENTION_KERNELS
from mla_var3.kernel import use_interpreter_without_gpu
from mla_var3.kernel import launchers as D
from mla_var3.reference.inputs import TORCH_DTYPES
from mla_var3.shapes import MLADims, Problem, get_preset
from mla_var3.testing import TOLERANCE

use_interpreter_without_gpu()


@dataclass(frozen=True)
class CheckResult:
    """One kernel check: the design, its shape, the relative error against the fp32 reference
    and the tolerance it had to meet."""

    design: str
    shape: str
    dtype: str
    error: float
    tolerance: float
    seconds: float

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance


def _shapes(on_gpu: bool) -> tuple[MLADims, list[Problem]]:
    if on_gpu:
        return get_preset("deepseek-v3"), [Problem(b=8, s=1, t=4096, n=512), Problem(b=8, s=16, t=4096, n=512)]
    # small enough for the interpreter (a few seconds), with a ragged last key block and s > 1
    return MLADims(h=16, d=32, p=16, k=64, dv=32, name="small"), [Problem(b=1, s=1, t=70, n=16), Problem(b=1, s=3, t=70, n=16)]


def run_selfcheck(device: str | None = None, dtype: torch.dtype = torch.bfloat16) -> list[CheckResult]:
    """Run every design (and the decompression) once per shape against its fp32 reference
    (:func:`mla_var3.kernel.launchers.check`; the largest relative error of its outputs); one
    result per run."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dims, problems = _shapes(device == "cuda")
    name = str(dtype).replace("torch.", "")
    dt = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    results = []
    for problem in problems:
        shape = f"{dims.name} b={problem.b} s={problem.s} t={problem.t}"
        for kernel in (*ATTENTION_KERNELS, "decompress"):
            start = time.perf_counter()
            errors = D.check(kernel, dims, problem, dtype=dt, device=device, seed=problem.s)
            if device == "cuda":
                torch.cuda.synchronize()
            label = kernel + (f" n={problem.n}" if kernel == "mla_var6_plus" else "")
            results.append(CheckResult(label, shape, name, max(e for _, e in errors.values()), TOLERANCE[dtype],
                                       time.perf_counter() - start))
    return results

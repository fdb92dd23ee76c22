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

from mla_var3 import kernel as K
from mla_var3 import reference as R
from mla_var3.designs import DESIGNS
from mla_var3.shapes import MLADims, Problem, get_preset
from mla_var3.testing import TOLERANCE, rel_err

K.use_interpreter_without_gpu()


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
    return MLADims(h=16, d=32, p=16, k=64, name="small"), [Problem(b=1, s=1, t=70, n=16), Problem(b=1, s=3, t=70, n=16)]


def run_selfcheck(device: str | None = None, dtype: torch.dtype = torch.bfloat16) -> list[CheckResult]:
    """Run every design once per shape against the reference; returns one result per run."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dims, problems = _shapes(device == "cuda")
    tol = TOLERANCE[dtype]
    results = []
    for problem in problems:
        x = R.make_inputs(dims, problem, dtype=dtype, device=device, seed=problem.s)
        shape = f"{dims.name} b={problem.b} s={problem.s} t={problem.t}"
        runs = {d.kernel + (f" n={problem.n}" if d.split else ""): (lambda name=d.kernel: _outputs(name, x))
                for d in DESIGNS}
        runs["decompress"] = lambda: (K.decompress(x.qc, x.w_uv), R.decompress(x.qc, x.w_uv))
        for design, run in runs.items():
            start = time.perf_counter()
            out, ref = run()
            if device == "cuda":
                torch.cuda.synchronize()
            results.append(CheckResult(design, shape, str(dtype).replace("torch.", ""), rel_err(out, ref), tol,
                                       time.perf_counter() - start))
    return results


def _args(kernel: str, x: R.MLAInputs) -> tuple[torch.Tensor, ...]:
    """The tensors attention kernel ``kernel`` takes (the entry point and its reference alike)."""
    if kernel == "flash_attention":
        return x.q, x.qpe, x.k, x.v, x.kpe
    if kernel == "flash_mla":
        return x.qc, x.qpe, x.z, x.kpe
    return x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new


def _outputs(kernel: str, x: R.MLAInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's outputs (all but the LSE) and the reference's, each flattened into one."""
    out = getattr(K, kernel)(*_args(kernel, x), scale=x.scale)
    ref = getattr(R, kernel)(*_args(kernel, x), x.scale)
    return tuple(torch.cat([o.flatten() for o in outs[:-1]]) for outs in (out, ref))

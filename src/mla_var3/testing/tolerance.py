"""The tolerance policy, in one place.

Errors are relative in the Frobenius norm against a float32 (or float64) reference:
``||out - ref|| / ||ref||``. bf16 operands land between 1e-3 and 1e-2 (the Triton interpreter
truncates fp32->bf16 casts instead of rounding, hence 1e-2); fp16 has 3 more mantissa bits.
A NaN anywhere fails, so a poisoned output element that was never written cannot pass.
"""

from __future__ import annotations

import torch

#: maximum relative error per activation dtype.
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
}


#: maximum relative error of the natural-log LSE [B, H, S] per *input* dtype. The LSE is
#: float32 in every design, but with bf16/fp16 inputs the GPU kernels sum probabilities that
#: were rounded to the storage dtype for the P.V product (as FlashMLA does), which moves the
#: LSE by ~1e-5 relative (measured on an H200: up to 2.7e-5 for the pipelined Gluon kernel).
LSE_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 1e-4,
    torch.bfloat16: 1e-4,
}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; inf when ``out`` has a NaN or inf the reference
    has not; 0 when both are zero everywhere."""
    out64, ref64 = out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    if out64.shape != ref64.shape:
        raise ValueError(f"shape mismatch: out {list(out64.shape)} vs ref {list(ref64.shape)}")
    bad = ~torch.isfinite(out64) & torch.isfinite(ref64)
    if bool(bad.any()) or bool(torch.isnan(out64).any()):
        return float("inf")
    finite = torch.isfinite(ref64)
    # Entries that are +-inf in both (e.g. an lse of -inf for an empty row) must agree exactly.
    if bool((out64[~finite] != ref64[~finite]).any()):
        return float("inf")
    diff = torch.linalg.vector_norm((out64 - ref64)[finite])
    scale = torch.linalg.vector_norm(ref64[finite])
    if float(scale) == 0.0:
        return float(diff)
    return float(diff / scale)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, *,
                 tol: float | None = None, name: str = "output") -> float:
    """Assert ``rel_err(out, ref) <= tol`` (default: ``TOLERANCE[dtype or out.dtype]``);
    returns the error."""
    limit = tol if tol is not None else TOLERANCE[dtype or out.dtype]
    err = rel_err(out, ref)
    assert err <= limit, f"{name}: relative error {err:.3e} exceeds {limit:.1e} (dtype {dtype or out.dtype})"
    return err

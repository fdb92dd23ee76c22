"""NaN poisoning: outputs that were never written and reads past a valid length show up as NaN."""

from __future__ import annotations

import torch


def poisoned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor of ``shape`` filled with NaN (use as a kernel's output buffer)."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def nan_padded(x: torch.Tensor, pad: dict[int, int] | int = 1) -> torch.Tensor:
    """A view of a copy of ``x`` inside a larger NaN-filled buffer.

    ``pad`` maps a dim to the extra NaN elements after it (an int pads every dim). The returned
    view has ``x``'s shape and values, but non-contiguous strides when a non-last dim is padded
    in an inner position; anything a kernel reads past the view's bounds is NaN.
    """
    if isinstance(pad, int):
        pad = {dim: pad for dim in range(x.dim())}
    big_shape = [size + pad.get(dim, 0) for dim, size in enumerate(x.shape)]
    buf = torch.full(big_shape, float("nan"), dtype=x.dtype, device=x.device)
    view = buf[tuple(slice(0, size) for size in x.shape)]
    view.copy_(x)
    return view

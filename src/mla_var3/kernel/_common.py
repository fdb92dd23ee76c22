"""Host-side helpers shared by every kernel launcher: input validation, interpreter detection,
device facts. No kernels here (those live in ``_jit.py`` and the per-design modules).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence

import torch

from mla_var3 import _values

#: shared memory one program (CTA) may use on sm_90, in bytes, as Triton reports the limit.
SMEM_LIMIT = 232_448

#: dtypes the kernels accept on a GPU.
GPU_DTYPES = (torch.bfloat16, torch.float16)
#: dtypes accepted under the Triton interpreter (CPU): the GPU ones plus float32 for debugging.
CPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``).

    Kernels then take an ``UPCAST`` constexpr: the interpreter holds bf16 as raw bits and
    computes garbage on it, so operands are converted to float32 before arithmetic.
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.cache
def cuda_index(device: torch.device) -> int:
    """The index of CUDA ``device``; ``cuda`` without one names the current device."""
    return device.index if device.index is not None else torch.cuda.current_device()


def num_sms(device_index: int | None = None) -> int:
    """Streaming multiprocessors of the CUDA device (132 on an H200); 132 when there is none,
    so split heuristics behave like on the benchmark GPU under the interpreter."""
    if torch.cuda.is_available():
        return _sms_of(torch.cuda.current_device() if device_index is None else device_index)
    return 132


@functools.lru_cache(maxsize=None)
def _sms_of(device_index: int) -> int:
    """A device's SM count (a fixed property: read once per device, off every call's host path)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _fmt_shape(shape: Iterable) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def bind_shape(name: str, x, spec: str, sizes: dict[str, int], *, dtypes: Sequence[torch.dtype] | None = None,
               device: torch.device | None = None) -> torch.Tensor:
    """Check that tensor ``x`` has the symbolic shape ``spec`` and bind its symbols in ``sizes``.

    ``spec`` is space-separated symbols, e.g. ``"B H S K"``; a symbol already in ``sizes`` must
    match, a new one is bound; an integer literal must match exactly. Raises ValueError with a
    message naming the tensor, the expected and the actual shape / dtype / device.

    >>> sizes = {"K": 512}
    >>> bind_shape("z", torch.empty(2, 7, 512), "B T K", sizes) is not None
    True
    >>> sizes
    {'K': 512, 'B': 2, 'T': 7}
    """
    symbols = spec.split()
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [{', '.join(symbols)}], got {type(x).__name__}")
    known = dict(sizes)  # the sizes bound before this tensor, for the message (built only on error)

    def want() -> str:
        expected = [str(known.get(s, s)) for s in symbols]
        return f"{name} must be [{', '.join(symbols)}] = [{', '.join(expected)}]"

    shape = x.shape
    if len(shape) != len(symbols):
        raise ValueError(f"{want()}, got {x.dim()}-d tensor of shape {_fmt_shape(shape)}")
    for sym, actual in zip(symbols, shape):
        if sym.isdigit():
            if int(sym) != actual:
                raise ValueError(f"{want()}, got {_fmt_shape(shape)}")
        elif sym in sizes:
            if sizes[sym] != actual:
                raise ValueError(f"{want()}, got {_fmt_shape(shape)} ({sym} mismatch: {actual} != {sizes[sym]})")
        else:
            sizes[sym] = int(actual)
    if dtypes is not None and x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} is on {x.device} but the other inputs are on {device}; move all inputs to one device")
    return x


def bind_output(name: str, x, spec: str, sizes: dict[str, int], *, dtypes: Sequence[torch.dtype] | None = None,
                device: torch.device | None = None) -> torch.Tensor:
    """:func:`bind_shape` for a buffer a kernel writes: also refuses one whose elements overlap
    (see :func:`check_no_overlap`)."""
    bind_shape(name, x, spec, sizes, dtypes=dtypes, device=device)
    check_no_overlap(name, x)
    return x


def check_inference(*tensors) -> None:
    """Raise ValueError when autograd would need these kernels' gradients: the Triton kernels are
    inference only (their outputs carry no gradient), and silently dropping one is worse than
    refusing. Cheap: nothing is asked of the tensors unless grad mode is on."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise ValueError("the kernels are inference only: an input requires grad and grad mode is on, but the "
                         "outputs would carry no gradient; call them under torch.no_grad() or "
                         "torch.inference_mode(), or train through the fp32 references (mla_var3.reference, "
                         "MLALayer(backend='reference'))")


def allowed_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The activation dtypes a kernel accepts on ``device`` (float32 only on the interpreter)."""
    return GPU_DTYPES if device.type == "cuda" else CPU_DTYPES


def check_device(name: str, x: torch.Tensor) -> None:
    """Raise ValueError unless ``x`` can run a Triton kernel here: on CUDA, or on CPU under the
    interpreter."""
    if x.device.type == "cuda":
        return
    if x.device.type == "cpu" and interpreting():
        return
    raise ValueError(
        f"{name} is on {x.device}: Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"
    )


def check_scale(scale, *, name: str = "scale") -> float:
    """Validate a softmax scale (:func:`mla_var3._values.check_scale`: a finite number > 0, not
    a bool or a string); the float. ``name``: the caller's name of the argument."""
    return _values.check_scale(scale, name)


#: environment variable that turns on the checks of tensor *values* on CUDA inputs (lengths in
#: range, block-table entries in range): each costs a host synchronisation, which an eager decode
#: call cannot afford and a CUDA graph capture forbids. CPU tensors are always checked.
CHECK_ENV = "MLA_VAR3_CHECK"


def values_checked(device: torch.device) -> bool:
    """Whether value checks run for inputs on ``device``: always on the CPU (free there); on CUDA
    only with ``MLA_VAR3_CHECK=1`` (each check synchronises with the GPU)."""
    return device.type != "cuda" or os.environ.get(CHECK_ENV, "0") not in ("", "0")


def check_no_overlap(name: str, x: torch.Tensor) -> None:
    """Raise ValueError when two elements of ``x`` share memory (a stride-0 ``expand`` view, say):
    a kernel writing such an output would race with itself. Layouts whose strides interleave
    without overlapping are refused too (no kernel output here needs one)."""
    extent = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz > 1):
        if stride < extent:
            raise ValueError(f"{name} has overlapping elements (shape {_fmt_shape(x.shape)}, strides "
                             f"{_fmt_shape(x.stride())}): pass a buffer whose elements are distinct, e.g. "
                             f"torch.empty(...) or .contiguous()")
        extent += stride * (size - 1)


def check_seqlens(seqlens, b: int, t: int, s: int, device: torch.device, *,
                  name: str = "seqlens") -> torch.Tensor | None:
    """Validate per-sequence valid lengths: [B] int32/int64 on ``device``, each 0 (an empty
    sequence) or in [s, T] (each length counts the sequence's s new tokens).

    Shape, dtype and device are always checked; the values only where :func:`values_checked`
    (they need a host synchronisation on CUDA). Returns an int32 contiguous tensor or None.
    """
    if seqlens is None:
        return None
    _values.check_length_dtype(name, seqlens)
    bind_shape(name, seqlens, "B", {"B": b})
    if seqlens.device != device:
        raise ValueError(f"{name} is on {seqlens.device} but the other inputs are on {device}")
    if b and values_checked(device):
        bad = (seqlens > t) | (seqlens < 0) | ((seqlens > 0) & (seqlens < s))
        if bool(bad.any()):
            lo, hi = int(seqlens.min()), int(seqlens.max())
            raise ValueError(f"{name} must lie in [s={s}, T={t}] (each length counts the s new tokens) or be 0 "
                             f"(an empty sequence), got min {lo}, max {hi}")
    if seqlens.dtype == torch.int32 and seqlens.is_contiguous():
        return seqlens
    return seqlens.to(torch.int32).contiguous()

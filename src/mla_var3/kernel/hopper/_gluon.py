"""What every Gluon (sm_90) module of this package shares: the import guard, the torch -> Gluon
dtype map, the host-side TMA descriptor helpers, and compiling for sm_90 without a GPU.

Importing this module never fails: when ``triton.experimental.gluon`` is missing,
:data:`GLUON_AVAILABLE` is False and :data:`GLUON_IMPORT_ERROR` says why, and the kernel modules
define no kernels.
"""

from __future__ import annotations

import functools

import torch

try:  # Gluon ships with triton >= 3.5; absent elsewhere
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    GLUON_AVAILABLE = True
    GLUON_IMPORT_ERROR = ""
except Exception as exc:  # pragma: no cover - depends on the installed triton
    GLUON_AVAILABLE = False
    GLUON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = ["GLUON_AVAILABLE", "GLUON_IMPORT_ERROR", "LOG2E", "TORCH_TO_GL", "compile_sm90", "desc_type", "descriptor",
           "layout", "require_gluon", "tma_operand"]

LOG2E = 1.4426950408889634

#: torch dtype -> Gluon dtype of the kernels' operands
TORCH_TO_GL = ({torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}
               if GLUON_AVAILABLE else {})


def require_gluon() -> None:
    """Raise RuntimeError (saying why) when Gluon is unavailable."""
    if not GLUON_AVAILABLE:
        raise RuntimeError(f"triton.experimental.gluon is unavailable: {GLUON_IMPORT_ERROR}")


@functools.lru_cache(maxsize=128)
def layout(block: tuple[int, ...], dtype: torch.dtype):
    """The NVMMA shared layout of a TMA box (cached: it is the same for every call of a shape)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), TORCH_TO_GL[dtype])


def tma_operand(x: torch.Tensor) -> torch.Tensor:
    """``x`` as TMA needs it: contiguous, with a 16-byte aligned base and 16-byte multiples for
    every stride but the last (copied to a fresh row-major tensor otherwise). torch calls a
    tensor contiguous whatever the strides of its size-1 dims, so a view such as ``[1, 1, 16]``
    with strides ``(34, 17, 1)`` needs the copy too."""
    e = x.element_size()
    if x.is_contiguous() and x.data_ptr() % 16 == 0 and all((st * e) % 16 == 0 for st in x.stride()[:-1]):
        return x
    return x.clone(memory_format=torch.contiguous_format)


def descriptor(x: torch.Tensor, block: list[int]):
    """A host TMA descriptor of ``x`` (its own shape and strides) in boxes of ``block``."""
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout(tuple(block), x.dtype))


def desc_type(block: list[int], dtype: str) -> str:
    """The signature type of a TMA descriptor argument in boxes of ``block`` of ``dtype``
    (``"bf16"``, ``"fp16"`` or ``"fp32"``), with the layout :func:`layout` gives a launch: what
    :func:`compile_sm90` needs for each descriptor argument."""
    require_gluon()
    ty = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}[dtype]
    shared = gl.NVMMASharedLayout.get_default_for(list(block), ty)
    return f"tensordesc<{dtype}[{','.join(map(str, block))}],{shared!r}>"


def compile_sm90(fn, signature: dict[str, str], constexprs: dict[str, object], *, num_warps: int,
                 attrs: dict | None = None, capability: int = 90):
    """Compile the Gluon kernel ``fn`` for an sm_90 target without a GPU; returns Triton's
    CompiledKernel (``.asm["ttgir"]``, ``["ptx"]``, ``["cubin"]``, ``.metadata.shared``).

    ``signature`` maps every argument to a Triton type (``"*bf16"``, ``"i32"``, ``"constexpr"``,
    :func:`desc_type` for a descriptor); ``constexprs`` the constexpr values; ``attrs`` optional
    argument attributes (``{(index,): [["tt.divisibility", 16]]}``). Must run in a process
    without ``TRITON_INTERPRET`` set.
    """
    require_gluon()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options={"num_warps": num_warps})

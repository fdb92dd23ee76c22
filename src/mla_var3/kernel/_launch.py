"""Launching a compiled Triton/Gluon kernel with little host work.

``kernel[grid](...)`` binds every argument, computes a specialisation key and looks the
compiled kernel up on every call, and a host TMA descriptor argument is encoded into a
``CUtensorMap`` on every launch: tens of microseconds of Python for a kernel with many
arguments, which an eager decode call (a few tens of microseconds of GPU time at small batch)
cannot afford. :class:`CachedLaunch` goes through that path once per caller-chosen key (the
kernel's compile cache, like Triton's own) and then calls the compiled kernel's C launcher
directly.

The caller's key must determine everything Triton specialises on: the constexprs, the dtypes,
and (unless the parameter is marked ``do_not_specialize``) each integer argument's value class
(1, divisible by 16) and each pointer's 16-byte alignment. The launchers of this package pass
the integer arguments themselves and the pointers' alignment in the key. A call whose constexprs
differ from those its key was compiled with raises RuntimeError instead of running the kernel
compiled for the others (a key that misses a constexpr is the launcher's bug).

:meth:`CachedLaunch.flat` goes one step further for a caller that builds the launcher's
arguments itself (the seesaw kernel's host side): a :class:`FlatLaunch` takes the flattened
arguments, pointers as addresses and each TMA descriptor as the ``CUtensorMap`` and sizes that
:func:`tma_arg` encodes from an address and the descriptor's :class:`TmaSpec`. What such a
caller keeps between calls (encodings of the addresses it has seen) belongs to an object the
caller owns, never to this module.

Under Triton's interpreter, or with a launch hook installed (profilers such as proton), every
call takes the ordinary path. Where the installed Triton's launcher does not have the expected
shape, :meth:`CachedLaunch.flat` returns None and callers take the ordinary path.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass, field

from triton import knobs
from triton.runtime import driver

from mla_var3.kernel._common import interpreting

__all__ = ["CachedLaunch", "FlatLaunch", "TmaSpec", "current_stream", "int_classes", "tma_arg", "tma_arg_of", "tma_box"]


class CachedLaunch:
    """Launch ``fn`` (a ``@triton.jit`` or ``@gluon.jit`` function whose constexpr parameters
    come last) with positional runtime arguments and keyword constexprs.

    ``launch_pdl``: compile and launch it as a programmatic dependent launch (on a GPU; the
    kernel must wait with ``griddepcontrol.wait`` before it reads what the kernel before it wrote).

    The compiled kernels are kept per (device, key): the compile cache of this kernel, keyed by
    what the kernel is specialised on, never by an address.

    >>> launch = CachedLaunch(my_kernel)                                    # doctest: +SKIP
    >>> launch(key, grid, (x, y, n), dict(BLOCK=128), num_warps=4)          # doctest: +SKIP
    """

    def __init__(self, fn, *, launch_pdl: bool = False) -> None:
        self.fn = fn
        self.options = {"launch_pdl": True} if launch_pdl else {}
        self._const_names: list[str] | None = None
        self._compiled: dict[Hashable, tuple] = {}

    def _constexpr_names(self) -> list[str]:
        if self._const_names is None:
            params = self.fn.params
            n_const = sum(1 for p in params if p.is_constexpr)
            if any(p.is_constexpr for p in params[: len(params) - n_const]):
                raise ValueError(f"{self.fn.__name__}: constexpr parameters must come last for CachedLaunch")
            self._const_names = [p.name for p in params[len(params) - n_const:]]
        return self._const_names

    def _keep(self, device, key: Hashable, compiled, constexprs: dict) -> None:
        const_vals = tuple(constexprs[n] for n in self._constexpr_names())
        self._compiled[(device, key)] = (compiled, const_vals, _direct_launcher(compiled), dict(constexprs))

    def __call__(self, key: Hashable, grid: tuple[int, int, int], args: tuple, constexprs: dict,
                 *, num_warps: int) -> None:
        if interpreting():
            self.fn[grid](*args, **constexprs, num_warps=num_warps)
            return
        if _hooked():
            self.fn[grid](*args, **constexprs, num_warps=num_warps, **self.options)
            return
        device = driver.active.get_current_device()
        hit = self._compiled.get((device, key))
        if hit is None:
            compiled = self.fn[grid](*args, **constexprs, num_warps=num_warps, **self.options)
            self._keep(device, key, compiled, constexprs)
            return
        compiled, const_vals, direct, kept = hit
        if constexprs != kept:      # the key missed a constexpr: the kept kernel is another one
            raise RuntimeError(f"{self.fn.__name__}: launch key {key!r} was compiled with constexprs {kept} and is "
                               f"now called with {constexprs}; the launcher's key must include every constexpr")
        stream = driver.active.get_current_stream(device)
        if direct is None or direct[2]:
            # not the expected launcher, or descriptor arguments: Triton's launcher encodes them
            compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None,
                         None, *args, *const_vals)
            return
        raw, base = direct[:2]
        raw(grid[0], grid[1], grid[2], stream, compiled.function, *base, *args, *const_vals)

    def prepare(self, key: Hashable, grid: tuple[int, int, int], args: tuple, constexprs: dict,
                *, num_warps: int) -> None:
        """Compile the kernel for ``key`` as :meth:`__call__` would, without launching it (with
        real tensors in ``args``). Nothing under the interpreter or a launch hook, or when
        already compiled."""
        if interpreting() or _hooked():
            return
        device = driver.active.get_current_device()
        if (device, key) in self._compiled:
            return
        compiled = self.fn.warmup(*args, grid=grid, **constexprs, num_warps=num_warps, **self.options)
        self._keep(device, key, compiled, constexprs)

    def ready(self, key: Hashable) -> bool:
        """Whether the kernel for ``key`` is compiled on the current device and a call takes the
        direct path (no launch hook, the launcher of the expected shape)."""
        if interpreting() or _hooked():
            return False
        hit = self._compiled.get((driver.active.get_current_device(), key))
        return hit is not None and hit[2] is not None

    def flat(self, key: Hashable) -> "FlatLaunch | None":
        """The compiled kernel for ``key`` as a :class:`FlatLaunch`, or None where it is not on
        the direct path (not compiled on this device, a launch hook, another launcher shape)."""
        if not self.ready(key):
            return None
        device = driver.active.get_current_device()
        compiled, const_vals, (raw, base, desc_meta, boxes), _ = self._compiled[(device, key)]
        return FlatLaunch(raw, (compiled.function, *base), const_vals, desc_meta, boxes)

    def cached(self) -> int:
        """How many compiled kernels are held (one per device and key)."""
        return len(self._compiled)


class FlatLaunch:
    """A compiled kernel's C launcher with its fixed parts: ``launch(grid, stream, flat)`` issues
    it with ``flat``, the runtime arguments in order with pointers as addresses (ints) and each
    TMA descriptor argument expanded to what :func:`tma_arg` returns.

    ``desc_meta``: ``{argument position: descriptor metadata}`` (what :class:`TmaSpec` needs);
    ``desc_boxes``: ``{argument position: its tma_box}``, derived once per compiled kernel (None
    where some descriptor's metadata is missing or fp4-padded)."""

    __slots__ = ("raw", "head", "consts", "desc_meta", "desc_boxes")

    def __init__(self, raw, head: tuple, consts: tuple, desc_meta: dict, desc_boxes: dict | None = None) -> None:
        self.raw, self.head, self.consts, self.desc_meta = raw, head, consts, desc_meta
        self.desc_boxes = desc_boxes

    def launch(self, grid: tuple[int, int, int], stream: int, flat: tuple) -> None:
        self.raw(grid[0], grid[1], grid[2], stream, *self.head, *flat, *self.consts)


@dataclass(frozen=True, eq=False)
class TmaSpec:
    """Everything a TMA descriptor argument's encoding depends on but its address: the compiled
    kernel's descriptor metadata (swizzle, element type, box) and the global shape and strides
    (elements). Hashed by identity (a launch spec keeps its own, and an owner keeps encodings
    per (spec, address): hashing the fields on every call would cost more than the lookup).

    ``host_type`` (the driver's element-type code) and ``sizes`` (the launcher's shape and
    strides arguments) are derived once here, so :func:`tma_arg` does no conversion per call."""

    swizzle: int
    elem_size: int
    elem_type: int
    block: tuple[int, ...]
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    host_type: int = field(init=False)
    sizes: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_type", _host_type(self.elem_type))
        object.__setattr__(self, "sizes", (*self.shape, *self.strides))

    @classmethod
    def of(cls, meta: dict, shape, strides) -> "TmaSpec":
        swizzle, elem_size, _, block = tma_box(meta)
        return cls(swizzle, elem_size, int(meta["elem_type"]), block, tuple(int(x) for x in shape),
                   tuple(int(x) for x in strides))


@functools.lru_cache(maxsize=None)
def _host_type(elem_type: int) -> int:
    """The driver's element-type code of a compiled kernel's descriptor element type (a fixed
    table of Triton's; looked up once per type)."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    return TMA_DTYPE_DEVICE_TO_HOST[elem_type]


def tma_box(meta: dict) -> tuple:
    """What a TMA descriptor argument's encoding takes from the compiled kernel's descriptor
    metadata, converted once: ``(swizzle, element size, the driver's element-type code, box)``.
    ValueError where the metadata is missing or fp4-padded."""
    if meta is None or meta.get("fp4_padded"):
        raise ValueError("a TMA encoding needs the compiled kernel's descriptor metadata (no fp4 padding)")
    return int(meta["swizzle"]), int(meta["elem_size"]), _host_type(int(meta["elem_type"])), tuple(meta["block_size"])


def tma_arg(spec: TmaSpec, address: int) -> tuple:
    """The launcher's arguments for a TMA descriptor of ``spec`` at ``address``: the encoded
    ``CUtensorMap``, then the shape and strides (as Triton's launcher passes them)."""
    tensor_map = driver.active.utils.fill_tma_descriptor(address, spec.swizzle, spec.elem_size, spec.host_type,
                                                         spec.block, spec.shape, spec.strides, 0)
    return (tensor_map, *spec.sizes)


def tma_arg_of(box: tuple, address: int, shape: tuple, strides: tuple) -> tuple:
    """:func:`tma_arg` for a descriptor whose global shape and strides (elements) change from call
    to call: ``box`` from :func:`tma_box` (kept per compiled kernel), no :class:`TmaSpec` built."""
    swizzle, elem_size, host_type, block = box
    tensor_map = driver.active.utils.fill_tma_descriptor(address, swizzle, elem_size, host_type, block, shape,
                                                         strides, 0)
    return (tensor_map, *shape, *strides)


def int_classes(ints: tuple) -> tuple:
    """What Triton specialises integer arguments on — each one's being 1, a multiple of 16, and
    within 32 bits — for a :class:`CachedLaunch` key that must not grow with the values (a
    decode window's length changes at every step)."""
    return tuple((x == 1, x % 16 == 0, -0x80000000 <= x <= 0x7FFFFFFF) for x in ints)


def current_stream(device_index: int) -> int:
    """The raw handle of the current CUDA stream of a device (what the launchers take)."""
    return driver.active.get_current_stream(device_index)


def _hooked() -> bool:
    """Whether a launch hook is installed (Triton >= 3.5 holds an empty ``HookChain`` when none is)."""
    hook = knobs.runtime.launch_enter_hook
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


def _is_builtin(fn) -> bool:
    return type(fn).__name__ == "builtin_function_or_method"


def _direct_launcher(compiled):
    """``(raw_launch, base_args, {arg index: descriptor metadata}, {arg index: tma_box} or None)``
    for calling the compiled kernel's C launcher without its per-launch Python wrapper, or None
    when the launcher is not of the expected shape (other Triton versions) or needs scratch memory."""
    try:
        launcher = compiled.run
        inner = launcher.launch
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
        if _is_builtin(inner):      # no tensor-descriptor argument: Triton calls its C launcher unwrapped
            raw = [inner]
        else:                       # Triton's descriptor-encoding wrapper around it
            cells = [c.cell_contents for c in (getattr(inner, "__closure__", None) or ())]
            raw = [c for c in cells if _is_builtin(c)]
        if len(raw) != 1:
            return None
        sig = [v for v in compiled.src.signature.values()]
        consts = compiled.src.constants if hasattr(compiled.src, "constants") else {}
        n_runtime = sum(1 for v in sig if v != "constexpr")
        if len(consts) and n_runtime != len(sig) - len(consts):
            return None
        metas = getattr(compiled.metadata, "tensordesc_meta", None) or []
        positions = [i for i, v in enumerate(sig) if isinstance(v, str) and v.startswith("tensordesc")]
        desc_meta = {pos: (metas[j] if j < len(metas) else None) for j, pos in enumerate(positions)}
        base = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, compiled.packed_metadata, None,
                None, None)
        try:
            boxes = {pos: tma_box(m) for pos, m in desc_meta.items()}
        except ValueError:          # some descriptor without usable metadata: callers encode none themselves
            boxes = None
        return raw[0], base, desc_meta, boxes
    except Exception:  # pragma: no cover - depends on the installed Triton
        return None

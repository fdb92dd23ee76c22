"""Launching a compiled Triton/Gluon kernel with little host work.

``kernel[grid](...)`` binds every argument, computes a specialisation key and looks the
compiled kernel up on every call, and a host TMA descriptor argument is encoded into a
``CUtensorMap`` on every launch: tens of microseconds of Python for a kernel with many
arguments, which an eager decode call (a few tens of microseconds of GPU time at small batch)
cannot afford. :class:`CachedLaunch` goes through that path once per caller-chosen key and then
calls the compiled kernel's launcher directly, re-using each descriptor's encoding while the
descriptor object lives (the launchers of this package cache their descriptors by pointer,
shape and strides).

The caller's key must determine everything Triton specialises on: the constexprs, the dtypes,
and (unless the parameter is marked ``do_not_specialize``) each integer argument's value class
(1, divisible by 16) and each pointer's 16-byte alignment. The launchers of this package pass
the integer arguments themselves and the pointers' alignment in the key.

:meth:`CachedLaunch.bind` goes one step further for a call that repeats with only a few
arguments changed (a decode step's fresh output, say): a :class:`BoundLaunch` holds every other
argument already flattened and encoded, and a launch costs one list and one C call.

Under Triton's interpreter, or with a launch hook installed (profilers such as proton), every
call takes the ordinary path. Where the installed Triton's launcher does not have the expected shape, the
descriptors are encoded per launch by Triton's own launcher (``direct`` is then False).
"""

from __future__ import annotations

from collections.abc import Hashable

from triton import knobs
from triton.runtime import driver

from mla_var3.kernel._common import interpreting

__all__ = ["Address", "BoundLaunch", "CachedLaunch"]

#: turn the direct launcher path off (for A/B timing of the host cost)
DIRECT = True


class CachedLaunch:
    """Launch ``fn`` (a ``@triton.jit`` or ``@gluon.jit`` function whose constexpr parameters
    come last) with positional runtime arguments and keyword constexprs.

    ``launch_pdl``: compile and launch it as a programmatic dependent launch (on a GPU; the
    kernel must wait with ``griddepcontrol.wait`` before it reads what the kernel before it wrote).

    >>> launch = CachedLaunch(my_kernel)                                    # doctest: +SKIP
    >>> launch(key, grid, (x, y, n), dict(BLOCK=128), num_warps=4)          # doctest: +SKIP
    """

    def __init__(self, fn, *, launch_pdl: bool = False) -> None:
        self.fn = fn
        self.options = {"launch_pdl": True} if launch_pdl else {}
        self._const_names: list[str] | None = None
        self._compiled: dict[Hashable, tuple] = {}
        self._encoded: dict[int, tuple] = {}

    def _constexpr_names(self) -> list[str]:
        if self._const_names is None:
            params = self.fn.params
            n_const = sum(1 for p in params if p.is_constexpr)
            if any(p.is_constexpr for p in params[: len(params) - n_const]):
                raise ValueError(f"{self.fn.__name__}: constexpr parameters must come last for CachedLaunch")
            self._const_names = [p.name for p in params[len(params) - n_const:]]
        return self._const_names

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
            const_vals = tuple(constexprs[n] for n in self._constexpr_names())
            self._compiled[(device, key)] = (compiled, const_vals, _direct_launcher(compiled))
            return
        compiled, const_vals, direct = hit
        stream = driver.active.get_current_stream(device)
        if direct is None or not DIRECT:
            compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None,
                         None, *args, *const_vals)
            return
        raw, base, desc_meta = direct
        flat = []
        for i, a in enumerate(args):
            meta = desc_meta.get(i, False)
            if meta is False:
                flat.append(a)
            else:
                flat.extend(self._encode(a, meta))
        raw(grid[0], grid[1], grid[2], stream, compiled.function, *base, *flat, *const_vals)

    def prepare(self, key: Hashable, grid: tuple[int, int, int], args: tuple, constexprs: dict,
                *, num_warps: int) -> None:
        """Compile the kernel for ``key`` as :meth:`__call__` would, without launching it (the
        first launch compiles with real tensors; this lets a later launch of a kernel the call
        does not run yet, on addresses alone, take the direct path). Nothing under the
        interpreter or a launch hook, or when already compiled."""
        if interpreting() or _hooked():
            return
        device = driver.active.get_current_device()
        if (device, key) in self._compiled:
            return
        compiled = self.fn.warmup(*args, grid=grid, **constexprs, num_warps=num_warps, **self.options)
        const_vals = tuple(constexprs[n] for n in self._constexpr_names())
        self._compiled[(device, key)] = (compiled, const_vals, _direct_launcher(compiled))

    def _encode(self, desc, meta) -> tuple:
        """A host descriptor's launch arguments (the CUtensorMap, shape, strides), encoded once
        per descriptor object."""
        hit = self._encoded.get(id(desc))
        if hit is not None and hit[0] is desc:
            return hit[1]
        from triton.backends.nvidia.driver import make_tensordesc_arg

        if len(self._encoded) > 1024:
            self._encoded.clear()
        enc = tuple(make_tensordesc_arg(desc, meta))
        self._encoded[id(desc)] = (desc, enc)
        return enc

    def bind(self, key: Hashable, grid: tuple[int, int, int], args: tuple, varying: tuple[int, ...]) -> "BoundLaunch":
        """A launch of the kernel compiled for ``key`` with ``args`` fixed except the positions in
        ``varying`` (increasing), which each call gives as addresses (ints): a pointer argument's,
        or the base address of a tensor-descriptor argument (the descriptor in ``args`` then gives
        the shape, strides, box and layout; each address is encoded once). The fixed arguments are
        flattened and encoded now: tensors are kept as addresses, so the caller must keep them
        alive (or, as a decode step's repeat does, key the bound launch by their addresses).
        Requires :meth:`ready`."""
        if not self.ready(key):
            raise ValueError(f"{self.fn.__name__}: bind() needs a kernel compiled for this key on the direct path")
        compiled, const_vals, (raw, base, desc_meta) = self._compiled[(driver.active.get_current_device(), key)]
        pieces: list[list] = [[]]
        encoders = []
        for i, a in enumerate(args):
            meta = desc_meta.get(i, False)
            if i in varying:
                encoders.append(None if meta is False else _AddressEncoder(a, meta))
                pieces.append([])
            elif meta is False:
                pieces[-1].append(a.data_ptr() if hasattr(a, "data_ptr") else a)
            else:
                pieces[-1].extend(self._encode(a, meta))
        if len(encoders) != len(varying):
            raise ValueError(f"{self.fn.__name__}: varying positions {varying} outside the {len(args)} arguments")
        head = (grid[0], grid[1], grid[2])
        return BoundLaunch(raw, head, (compiled.function, *base, *pieces[0]), tuple(encoders),
                           tuple(tuple(p) for p in pieces[1:]), tuple(const_vals))

    def ready(self, key: Hashable) -> bool:
        """Whether a call with ``key`` takes the direct path (its kernel is compiled on the
        current device, no launch hook is installed, and the launcher has the expected shape):
        then tensor-descriptor arguments may hold addresses only."""
        if interpreting() or _hooked():
            return False
        hit = self._compiled.get((driver.active.get_current_device(), key))
        return hit is not None and hit[2] is not None and DIRECT

    def cached(self) -> int:
        """How many compiled kernels are held (one per device and key)."""
        return len(self._compiled)


class Address:
    """What a host TMA descriptor needs of its tensor, the address and dtype, without keeping the
    tensor alive (a cached descriptor must not hold a call's output: the allocator could never
    reuse its memory)."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


class _AddressEncoder:
    """A tensor descriptor's launch arguments at a given base address: the descriptor ``desc``
    (shape, strides, box, layout) moved to ``addr``, each address encoded once (a decode step's
    outputs come back at a handful of addresses)."""

    __slots__ = ("desc", "meta", "dtype", "cache")

    def __init__(self, desc, meta) -> None:
        self.desc, self.meta, self.dtype, self.cache = desc, meta, desc.base.dtype, {}

    def __call__(self, addr: int) -> tuple:
        enc = self.cache.get(addr)
        if enc is None:
            import dataclasses

            from triton.backends.nvidia.driver import make_tensordesc_arg

            if len(self.cache) > 64:
                self.cache.clear()
            moved = dataclasses.replace(self.desc, base=Address(addr, self.dtype))
            enc = self.cache[addr] = tuple(make_tensordesc_arg(moved, self.meta))
        return enc


class BoundLaunch:
    """One compiled kernel's launch with all arguments fixed but a few addresses (see
    :meth:`CachedLaunch.bind`): ``bound(stream, *addresses)`` issues it on ``stream`` (a raw CUDA
    stream handle, the one the caller's tensors are ordered on).

    The launcher's argument tuple is built once per (stream, addresses) and kept (at most
    ``MAX_ARG_TUPLES``): a decode step's fresh outputs come back at a handful of addresses from
    the caching allocator, and building the tuple was most of a bound launch's Python time
    (3.1 of 3.6 us on a slow host with 100 arguments)."""

    __slots__ = ("raw", "head", "mid", "encoders", "tails", "consts", "flat")
    MAX_ARG_TUPLES = 32

    def __init__(self, raw, head, mid, encoders, tails, consts) -> None:
        self.raw, self.head, self.mid, self.encoders, self.tails, self.consts = raw, head, mid, encoders, tails, consts
        self.flat: dict = {}

    def __call__(self, stream: int, *addresses: int) -> None:
        key = (stream, *addresses)
        flat = self.flat.get(key)
        if flat is None:
            parts = [*self.head, stream, *self.mid]
            for enc, tail, addr in zip(self.encoders, self.tails, addresses):
                if enc is None:
                    parts.append(addr)
                else:
                    parts.extend(enc(addr))
                parts.extend(tail)
            if len(self.flat) >= self.MAX_ARG_TUPLES:
                self.flat.clear()
            flat = self.flat[key] = (*parts, *self.consts)
        self.raw(*flat)


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
    """``(raw_launch, base_args, {arg index: descriptor metadata})`` for calling the compiled
    kernel's C launcher without its per-launch Python wrapper, or None when the launcher is not
    of the expected shape (other Triton versions) or needs scratch memory."""
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
        return raw[0], base, desc_meta
    except Exception:  # pragma: no cover - depends on the installed Triton
        return None

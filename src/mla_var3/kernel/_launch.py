"""Launching a compiled Triton/Gluon kernel with little host work.

``kernel[grid](...)`` binds every argument, computes a specialisation key and looks the
compiled kernel up on every call: tens of microseconds of Python for a kernel with many
arguments, which an eager decode call (a few tens of microseconds of GPU time at small batch)
cannot afford. :class:`CachedLaunch` goes through that path once per caller-chosen key and then
calls the compiled kernel's launcher directly.

The caller's key must determine everything Triton specialises on: the constexprs, the dtypes,
and (unless the parameter is marked ``do_not_specialize``) each integer argument's value class
(1, divisible by 16) and each pointer's 16-byte alignment. The launchers of this package pass
the integer arguments themselves and the pointers' alignment in the key.

Under Triton's interpreter, or with a launch hook installed (profilers), every call takes the
ordinary path.
"""

from __future__ import annotations

from collections.abc import Hashable

from triton import knobs
from triton.runtime import driver

from mla_var3.kernel._common import interpreting

__all__ = ["CachedLaunch"]


class CachedLaunch:
    """Launch ``fn`` (a ``@triton.jit`` or ``@gluon.jit`` function whose constexpr parameters
    come last) with positional runtime arguments and keyword constexprs.

    >>> launch = CachedLaunch(my_kernel)                                    # doctest: +SKIP
    >>> launch(key, grid, (x, y, n), dict(BLOCK=128), num_warps=4)          # doctest: +SKIP
    """

    def __init__(self, fn) -> None:
        self.fn = fn
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

    def __call__(self, key: Hashable, grid: tuple[int, int, int], args: tuple, constexprs: dict,
                 *, num_warps: int) -> None:
        if interpreting() or knobs.runtime.launch_enter_hook is not None:
            self.fn[grid](*args, **constexprs, num_warps=num_warps)
            return
        device = driver.active.get_current_device()
        hit = self._compiled.get((device, key))
        if hit is None:
            compiled = self.fn[grid](*args, **constexprs, num_warps=num_warps)
            self._compiled[(device, key)] = (compiled, tuple(constexprs[n] for n in self._constexpr_names()))
            return
        compiled, const_vals = hit
        stream = driver.active.get_current_stream(device)
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *const_vals)

    def cached(self) -> int:
        """How many compiled kernels are held (one per device and key)."""
        return len(self._compiled)


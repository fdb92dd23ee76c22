"""Backend registry: which implementation of a design runs on which device.

Each design (``"flash_mla"``, ``"flash_mla_paged"``, ``"flash_attention"``, ...) maps backend
names to launchers. The portable ``"triton"`` backend (plain ``triton.language``, tested on the
CPU interpreter) runs everywhere and is registered by the design's module; a device-specific
backend (e.g. ``"gluon"`` for sm_90) is registered by its own module, in a package of
:data:`PLUGINS` that the first lookup imports, with a ``supports(device)`` predicate and a
higher priority, and ``select`` picks it automatically where it applies. Every backend of a
design takes the same arguments as the design's public entry point (minus ``backend``).

Example
-------
>>> register("my_design", "triton", my_launcher)                         # doctest: +SKIP
>>> register("my_design", "gluon", my_hopper_launcher,
...          supports=lambda dev: cuda_capability(dev) == (9, 0), priority=10)  # doctest: +SKIP
>>> select("my_design", q.device)(q, ...)                                # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: modules whose import registers backends (loaded by the first lookup, named here rather than
#: imported: they build on this registry): the absorbed design's portable module (its entry
#: point, :mod:`mla_var3.kernel.decode`, sits below it) and the device-specific package.
PLUGINS = ("mla_var3.kernel.absorbed", "mla_var3.kernel.hopper")


def _always(device: torch.device) -> bool:
    return True


@dataclass(frozen=True)
class Backend:
    """One implementation of a design.

    name : backend name (``"triton"``, ``"gluon"``).
    launcher : the callable that runs it (same signature as the design's entry point).
    supports : ``supports(device) -> bool``; False means the backend cannot run there.
    priority : ``select(..., "auto")`` takes the highest-priority supported backend.
    """

    name: str
    launcher: Callable
    supports: Callable[[torch.device], bool] = _always
    priority: int = 0


_REGISTRY: dict[str, dict[str, Backend]] = {}


def _table(design: str) -> dict[str, Backend]:
    """The backends of ``design`` after the plugin packages have registered theirs (imported on
    the first lookup)."""
    for package in PLUGINS:
        if package not in sys.modules:
            importlib.import_module(package)
    return _REGISTRY.get(design, {})


def register(design: str, name: str, launcher: Callable, *, supports: Callable[[torch.device], bool] = _always,
             priority: int = 0) -> Callable:
    """Register (or replace) backend ``name`` of ``design``; returns ``launcher`` so it can be
    used as a decorator-like call."""
    _REGISTRY.setdefault(design, {})[name] = Backend(name, launcher, supports, priority)
    return launcher


def backends(design: str) -> dict[str, Backend]:
    """The registered backends of ``design`` (name -> Backend); empty if none."""
    return dict(_table(design))


def available(design: str, device: torch.device | str) -> list[str]:
    """Names of the backends of ``design`` that can run on ``device``, best first."""
    device = torch.device(device)
    found = [b for b in _table(design).values() if b.supports(device)]
    return [b.name for b in sorted(found, key=lambda b: -b.priority)]


def select(design: str, device: torch.device | str, backend: str = "auto") -> Callable:
    """The launcher to run ``design`` on ``device``.

    ``backend="auto"`` picks the highest-priority backend whose ``supports(device)`` holds; a
    name picks that backend and raises ValueError if it is unknown or cannot run on ``device``.
    """
    device = torch.device(device)
    table = _table(design)
    if not table:
        raise ValueError(f"no backend registered for design {design!r}; known designs: {sorted(_REGISTRY)}")
    if backend == "auto":
        names = available(design, device)
        if not names:
            raise ValueError(f"no backend of {design!r} runs on {device}; registered: {sorted(table)}")
        return table[names[0]].launcher
    if backend not in table:
        raise ValueError(f"unknown backend {backend!r} for {design!r}; registered: {sorted(table)}")
    if not table[backend].supports(device):
        raise ValueError(f"backend {backend!r} of {design!r} does not run on {device}; "
                         f"available there: {available(design, device)}")
    return table[backend].launcher


def cuda_capability(device: torch.device | str) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA ``device``; None for any other device."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def is_hopper(device: torch.device | str) -> bool:
    """True on sm_90 (H100/H200): the predicate for Hopper-specific backends."""
    return cuda_capability(device) == (9, 0)


def gluon_hopper(device: torch.device | str) -> bool:
    """True on sm_90 when ``triton.experimental.gluon`` imports: the ``supports`` predicate of
    the Gluon backends (:mod:`mla_var3.kernel.hopper`, imported only on a Hopper device)."""
    if not is_hopper(device):
        return False
    from mla_var3.kernel.hopper._gluon import GLUON_AVAILABLE

    return GLUON_AVAILABLE

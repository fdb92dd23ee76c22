"""The MLA attention designs and the kernels that run them, named once.

Every list of designs in the package (the public kernel API, the dispatcher's designs and
aliases, the layer's modes, the benchmark's and ``python -m mla_var3.kernel``'s designs, the
cost models) is read from this table. It imports nothing: kernels and their config types are
named by import path, cost models by their name in :mod:`mla_var3.analysis.cost`.

Names. Each design has one public name, its kernel's: ``flash_attention`` (the expanded design),
``flash_mla`` (the absorbed design) and ``mla_var6_plus`` (the hybrid), the names of the entry
points, the benchmark records, the cost models and the calibration. The other names a design
answers to are listed here once (:func:`design` accepts each):

==================  ===================  ==============  ===========  ==================
public name         design (dispatcher)  layer mode      aliases      title (reports)
==================  ===================  ==============  ===========  ==================
``flash_attention`` ``expanded``         ``naive``       ``naive``    FlashAttention
``flash_mla``       ``absorbed``         ``absorbed``    ``latent``   FlashMLA
``mla_var6_plus``   ``hybrid``           ``hybrid``      ``var6``     MLAvar6+
==================  ===================  ==============  ===========  ==================

The design name is what :class:`~mla_var3.dispatch.Decision` reports, the mode what
:class:`~mla_var3.model.MLALayer` takes, the title the seed's name shown in tables and plots;
prose calls the hybrid "the hybrid" and names it ``mla_var6_plus``.

The dispatcher runs the expanded design over a latent cache by expanding it for the call; the
layer's ``naive`` mode keeps an expanded cache instead. The absorbed and hybrid designs attend
in the latent space: the query is absorbed before them, the output decompressed after them.

>>> from mla_var3.designs import design
>>> design("var6").name, design("flash_attention").mode
('hybrid', 'naive')
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

#: cache kinds the dispatcher runs over (``MLALayer``'s caches carry one as ``kind``; an
#: ``ExpandedCache`` is kind ``"expanded"``, which only the layer's naive mode reads).
CACHE_KINDS = ("latent", "paged", "hybrid")


@dataclass(frozen=True)
class Kernel:
    """A public kernel entry point (``mla_var3.kernel.<name>``).

    name : the entry point, also the key of its autotune-cache entries and benchmark records.
    module : the module defining it, its config type and ``default_config`` / ``candidate_configs``.
    config : the name of its launch-config type in ``module``.
    cost_model : the :mod:`mla_var3.analysis.cost` model of what the kernel moves.
    """

    name: str
    module: str
    config: str
    cost_model: str

    def load(self):
        """The entry point itself (imports torch and Triton)."""
        return getattr(importlib.import_module(self.module), self.name)


@dataclass(frozen=True)
class Design:
    """One of the three MLA attention designs.

    name : the canonical name (dispatcher, ``Decision.design``).
    kernel : its attention kernel (a :data:`KERNELS` key); also its name in benchmark records
        and the name of the seed's cost model of it.
    title : the seed's name (``FlashMLA``), for reports and plots.
    mode : the :class:`~mla_var3.model.MLALayer` mode that runs it over ``mode_caches``.
    caches : the cache kinds the dispatcher can run it over.
    mode_caches : the cache kinds the layer's ``mode`` keeps.
    aliases : other names accepted for it (besides ``name`` and ``kernel``).
    latent : attends in the latent space: the query is absorbed before the kernel and the
        latent output decompressed after it.
    split : takes the hybrid split n (o tokens latent, n expanded).
    color : its colour in every plot.
    """

    name: str
    kernel: str
    title: str
    mode: str
    caches: tuple[str, ...]
    mode_caches: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    latent: bool = False
    split: bool = False
    color: str = "black"

    @property
    def pipeline(self) -> tuple[str, ...]:
        """The kernels one call runs, in order."""
        return ("absorb_query", self.kernel, "decompress") if self.latent else (self.kernel,)


KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("flash_attention", "mla_var3.kernel.expanded", "FlashAttentionConfig", "flash_attention_shared_kpe"),
    Kernel("flash_mla", "mla_var3.kernel.absorbed", "FlashMLAConfig", "flash_mla"),
    Kernel("flash_mla_paged", "mla_var3.kernel.absorbed", "FlashMLAConfig", "flash_mla"),
    Kernel("mla_var6_plus", "mla_var3.kernel.hybrid", "MLAVar6PlusConfig", "mla_var6_plus"),
    Kernel("absorb_query", "mla_var3.kernel.gemm", "GemmConfig", "absorb_query"),
    Kernel("decompress", "mla_var3.kernel.gemm", "GemmConfig", "decompress"),
)}

#: the designs in the seed's order (design 1, 2, 3).
DESIGNS: tuple[Design, ...] = (
    Design("expanded", "flash_attention", "FlashAttention", "naive", CACHE_KINDS, ("expanded",), ("naive",),
           color="tab:blue"),
    Design("absorbed", "flash_mla", "FlashMLA", "absorbed", CACHE_KINDS, ("latent", "paged"), ("latent",),
           latent=True, color="tab:red"),
    Design("hybrid", "mla_var6_plus", "MLAvar6+", "hybrid", ("hybrid",), ("hybrid",), ("var6",),
           latent=True, split=True, color="tab:green"),
)

#: the three attention kernels, by name, in the table's order (what the benchmark, the
#: calibration and ``python -m mla_var3.kernel`` run).
ATTENTION_KERNELS: tuple[str, ...] = tuple(d.kernel for d in DESIGNS)

#: every accepted name of a design (canonical, kernel, alias, layer mode) -> the design.
_BY_NAME = {n: d for d in DESIGNS for n in (d.name, d.kernel, d.mode, *d.aliases)}


def design(name: str) -> Design:
    """The design called ``name`` (canonical, kernel name, alias or layer mode); ValueError
    naming the accepted names otherwise."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown design {name!r}; expected one of {', '.join(_BY_NAME)}") from None


__all__ = ["ATTENTION_KERNELS", "CACHE_KINDS", "DESIGNS", "KERNELS", "Design", "Kernel", "design"]

"""The regime guide as a running system: per call, the MLA attention design (and its hybrid
split n) an engine should run, from the calibrated model of the default calls where the package
has a calibration for the device (the roofline at the device's ceilings where it has none),
overridden by measured kernel times when the benchmark or the autotune cache has them.

==============  ==============================================================================
``decide``      :class:`Dispatcher`, :class:`Decision`, :class:`CacheInfo`, the per-design costs
``measured``    read-only lookups of measured kernel times (autotune cache, ``results.json``)
==============  ==============================================================================

>>> from mla_var3.dispatch import Dispatcher, CacheInfo
>>> from mla_var3.shapes import get_preset, Problem
>>> dec = Dispatcher("h200", use_measured=False).decide(get_preset("deepseek-v3"),
...                                                     Problem(b=32, s=4096, t=4096), CacheInfo("latent"))
>>> dec.design, dec.source
('expanded', 'model')

The decision needs no torch and no model: the tensors' side, :func:`mla_var3.model.mla_attention`
(the engine entry point) and ``MLALayer(mode="auto")``, asks it (imports go model -> dispatch).
"""

from mla_var3.dispatch.decide import (ALIASES, KERNEL, CacheInfo, Decision, Dispatcher, Estimate, canonical_design,
                                      decide, design_cost, expansion_cost, regime_of)

# the designs' names are the design table's (``mla_var3.designs.DESIGNS``), not re-exported here
__all__ = ["KERNEL", "ALIASES", "CacheInfo", "Decision", "Dispatcher", "Estimate", "decide",
           "design_cost", "expansion_cost", "regime_of", "canonical_design"]

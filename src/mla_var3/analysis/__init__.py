"""Analysis without torch: cost models, roofline, regime guide, KV-cache memory, devices.

>>> from mla_var3.analysis import predict, get_preset, Problem
>>> round(predict("flash_mla", get_preset("deepseek-v3"), Problem(b=32, s=1, t=4096), "h200").time_s * 1e6, 2)
51.42

Plots and the report (matplotlib) live in :mod:`mla_var3.analysis.plots` and
:mod:`mla_var3.analysis.report` and are not imported here.
"""

from mla_var3.analysis.cost import COST_MODELS, DESIGN_MODELS, Cost, cost, design_pipeline, get_cost_model
from mla_var3.analysis.devices import Ceilings, Device, DeviceFileError, detect_device, device_names, get_device, load_devices
from mla_var3.analysis.memory import (
    expanded_cache_bytes,
    hybrid_cache_bytes,
    mla_cache_bytes,
    paged_cache_bytes,
    plan_capacity,
)
from mla_var3.analysis.regime import best_hybrid_n, choose_n, crossover_s, regime_guide
from mla_var3.analysis.roofline import Prediction, predict, roofline_time
from mla_var3.shapes import MLADims, Problem, get_preset

__all__ = [
    "COST_MODELS", "DESIGN_MODELS", "Cost", "cost", "design_pipeline", "get_cost_model",
    "Ceilings", "Device", "DeviceFileError", "detect_device", "device_names", "get_device", "load_devices",
    "expanded_cache_bytes", "hybrid_cache_bytes", "mla_cache_bytes", "paged_cache_bytes", "plan_capacity",
    "best_hybrid_n", "choose_n", "crossover_s", "regime_guide",
    "Prediction", "predict", "roofline_time",
    "MLADims", "Problem", "get_preset",
]

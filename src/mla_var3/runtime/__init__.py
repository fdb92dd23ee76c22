"""Measurement: the timing primitive, device environment and ceilings, autotuning with an
on-disk cache, result records and the baselines.

It sits below the kernels and knows none of them: the launchers by name are
:mod:`mla_var3.kernel.launchers`, the sweep behind ``mla-var3 bench`` is
:mod:`mla_var3.cli.sweep` and the calibration run :mod:`mla_var3.cli.calibrate`.

==================  ==========================================================
``timing``          :func:`time_fn` — the one timing primitive (CUDA graph + events, L2 flushed)
``environment``     device name, clocks as found, versions, project commit
``telemetry``       the SM clock, memory clock and power sampled while something runs (NVML)
``ceilings``        measured copy bandwidth and bf16 matmul rate
``autotune``        config search and the on-disk cache of winners
``records``         the result record, results.json, Markdown table, plots
``baselines``       torch eager / SDPA, FlashMLA and FlashInfer when importable
==================  ==========================================================
"""

from mla_var3.runtime.autotune import AutotuneCache, cache_dir, cache_key
from mla_var3.runtime.records import Record, load_results, markdown_table, write_results
from mla_var3.runtime.timing import Timing, time_fn

__all__ = ["AutotuneCache", "cache_dir", "cache_key", "Record", "load_results", "markdown_table",
           "write_results", "Timing", "time_fn"]

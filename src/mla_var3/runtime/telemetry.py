"""The GPU's clocks and power sampled while something runs, through NVML (``nvidia-ml-py``).

A measurement that compares two runs (a kernel alone and beside another) must say whether the
GPU ran both at the same clock: a co-run that draws more power can run at a lower SM clock, and
that is interference too. :class:`TelemetrySampler` reads the SM clock, the memory clock, the
power draw and the clock-event ("throttle") reasons from a background thread while its ``with``
block runs; :meth:`TelemetrySampler.summary` gives min / mean / max of each. Nothing is set:
this package never changes clocks.

>>> with TelemetrySampler(0) as tel:       # doctest: +SKIP
...     run_many_times()
>>> tel.summary().as_dict()                # doctest: +SKIP
{'samples': 212, 'sm_mhz': [1755.0, 1971.4, 1980.0], ..., 'reasons': ['SwPowerCap']}

Where NVML is missing (no ``pynvml``, no NVIDIA driver) the sampler records nothing and its
summary is None; the caller's measurement goes on.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable

__all__ = ["Telemetry", "TelemetrySampler", "nvml_reader"]

#: one reading: (SM MHz, memory MHz, watts, clock-event reason bits)
Reading = tuple[float, float, float, int]


@dataclasses.dataclass(frozen=True)
class Telemetry:
    """A sampled run: per quantity (min, mean, max); ``reasons``: the clock-event reasons seen in
    any sample (NVML's names without their prefix, e.g. ``SwPowerCap``, ``HwSlowdown``)."""

    samples: int
    seconds: float
    sm_mhz: tuple[float, float, float]
    mem_mhz: tuple[float, float, float]
    power_w: tuple[float, float, float]
    reasons: tuple[str, ...]

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def _reason_names(pynvml) -> dict[int, str]:
    """NVML's clock-event reason bits -> names (``nvmlClocksThrottleReasonSwPowerCap`` -> ``SwPowerCap``)."""
    prefix = "nvmlClocksThrottleReason"
    names = {}
    for attr in dir(pynvml):
        if attr.startswith(prefix) and attr[len(prefix):] not in ("All", "None", "Unknown"):
            bit = getattr(pynvml, attr)
            if isinstance(bit, int) and bit and not bit & (bit - 1):     # one bit each
                names.setdefault(bit, attr[len(prefix):])
    return names


def nvml_reader(cuda_index: int = 0) -> tuple[Callable[[], Reading], dict[int, str]] | None:
    """A function reading (SM MHz, memory MHz, W, reason bits) of the GPU torch calls
    ``cuda_index``, and the reason bits' names; None where NVML is not available."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            import torch

            nvml_index = torch.cuda._get_nvml_device_index(cuda_index)
        except Exception:
            nvml_index = cuda_index
        handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

        def read() -> Reading:
            return (float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                    float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                    pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, int(reasons(handle)))

        read()
        return read, _reason_names(pynvml)
    except Exception:
        return None


class TelemetrySampler:
    """Samples the GPU every ``period_s`` seconds while the ``with`` block runs.

    ``cuda_index``: the GPU as torch numbers it; ``reader``: a ``(read, reason_names)`` pair in
    place of NVML's (tests), or None for :func:`nvml_reader`."""

    def __init__(self, cuda_index: int = 0, *, period_s: float = 0.002,
                 reader: tuple[Callable[[], Reading], dict[int, str]] | None = None):
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self._reader = reader if reader is not None else nvml_reader(cuda_index)
        self._readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = self._t1 = 0.0

    @property
    def available(self) -> bool:
        return self._reader is not None

    def _loop(self) -> None:
        read = self._reader[0]
        while not self._stop.is_set():
            try:
                self._readings.append(read())
            except Exception:
                return
            self._stop.wait(self.period_s)

    def __enter__(self) -> TelemetrySampler:
        self._readings, self._t0 = [], time.perf_counter()
        if self._reader is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._t1 = time.perf_counter()

    def summary(self) -> Telemetry | None:
        """Min / mean / max of the readings of the last ``with`` block; None when nothing was read."""
        if not self._readings:
            return None
        names = self._reader[1]
        cols = list(zip(*self._readings))
        stat = lambda xs: (min(xs), round(statistics.fmean(xs), 1), max(xs))  # noqa: E731
        bits = 0
        for r in cols[3]:
            bits |= r
        return Telemetry(samples=len(self._readings), seconds=round(self._t1 - self._t0, 4), sm_mhz=stat(cols[0]),
                         mem_mhz=stat(cols[1]), power_w=stat(cols[2]),
                         reasons=tuple(names.get(1 << i, f"bit{i}") for i in range(bits.bit_length()) if bits >> i & 1))

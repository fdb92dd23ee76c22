"""Device ceilings for the roofline: peak FLOP/s, memory bandwidth and the ridge point.

The built-in table is ``conf/devices.json`` (every number with its source). A user adds or
overrides devices with a JSON file of the same shape, passed as ``path=`` (CLI:
``--devices-file``) or named by the ``MLA_VAR3_DEVICES`` environment variable; entries in the
user file replace built-in entries of the same key. No torch is needed here; only
:func:`detect_device` imports it, lazily.

Example
-------
>>> from mla_var3.analysis.devices import get_device
>>> h200 = get_device("h200")
>>> c = h200.ceilings("measured")
>>> c.kind, round(c.ridge, 1)                # FLOP per byte where compute and memory balance
('measured', 166.8)
>>> round(h200.ceilings("datasheet").ridge, 1)
206.1
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from importlib import resources

from mla_var3._io import InputFileError, is_finite, json_type, load_json, parse_json, quote, show_path

#: environment variable naming a user devices file (merged over the built-in table).
DEVICES_ENV = "MLA_VAR3_DEVICES"
#: device used when no GPU is detected (the one the project benchmarks on).
DEFAULT_DEVICE = "h200"
#: ceiling kinds: measured ceilings (when the device has them) or datasheet peaks.
CEILING_KINDS = ("measured", "datasheet")

_REQUIRED = ("name", "bf16_tflops", "bandwidth_gbs", "memory_gb")
_OPTIONAL_NUMBERS = ("fp8_tflops", "sms", "l2_mb", "smem_per_sm_kb")
#: the largest value a device number may have (TFLOP/s, GB/s, GB, SMs, MB, KB): far above any
#: device, and small enough that the roofline arithmetic (x 1e12, ratios) stays finite.
MAX_DEVICE_NUMBER = 1e9
#: the smallest positive value (a ceiling near zero would make predicted times overflow).
MIN_DEVICE_NUMBER = 1e-6


class DeviceFileError(InputFileError):
    """A devices JSON file that cannot be read or does not have the expected shape."""


@dataclass(frozen=True)
class Ceilings:
    """The two roofline ceilings that apply to one prediction.

    Attributes
    ----------
    flops_per_s : float
        Peak compute in FLOP/s (dense tensor-core rate for the dtype).
    bytes_per_s : float
        Peak memory bandwidth in B/s.
    kind : str
        ``"measured"`` or ``"datasheet"`` — which ceiling was actually used.
    source : str
        Where the numbers come from.
    """

    flops_per_s: float
    bytes_per_s: float
    kind: str
    source: str

    @property
    def ridge(self) -> float:
        """Ridge point in FLOP/byte: intensities above it are compute-bound."""
        return self.flops_per_s / self.bytes_per_s


@dataclass(frozen=True)
class Device:
    """One accelerator's datasheet figures plus an optional measured block.

    Compute rates are dense (no sparsity) tensor-core TFLOP/s; ``bandwidth_gbs`` in 10^9 B/s;
    ``memory_gb`` in 10^9 B. ``measured`` holds ``bf16_tflops``/``bandwidth_gbs`` measured on
    the device, with a ``source``.
    """

    key: str
    name: str
    bf16_tflops: float
    bandwidth_gbs: float
    memory_gb: float
    fp8_tflops: float | None = None
    sms: int | None = None
    l2_mb: float | None = None
    smem_per_sm_kb: float | None = None
    match: tuple[str, ...] = ()
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    measured: dict | None = field(default=None, compare=False, hash=False)
    #: HBM read bandwidth reachable from m SMs: ((m, GB/s in all), ...), m increasing, measured
    #: (``runtime.ceilings.measure_read_by_sms``); None where never measured
    read_by_sms: tuple[tuple[int, float], ...] | None = field(default=None, compare=False, hash=False)
    read_by_sms_source: str = field(default="", compare=False, hash=False)
    #: what the hybrid's window design (TMA into shared memory, the keys as the products' M side)
    #: streams from m SMs with its loads and both products but no softmax, per padded query
    #: columns: {columns: ((m, GB/s in all), ...)}, measured (``benchmarks/window_ceiling.py``
    #: part 5); None where never measured
    window_by_sms: dict[int, tuple[tuple[int, float], ...]] | None = field(default=None, compare=False, hash=False)
    window_by_sms_source: str = field(default="", compare=False, hash=False)

    def read_bandwidth(self, sms: int) -> float | None:
        """HBM read bandwidth (B/s, all of them together) that ``sms`` SMs reach, from the measured
        curve :attr:`read_by_sms` (see :func:`_along`); None without a curve."""
        return _along(self.read_by_sms, sms)

    def read_by_sms_block(self) -> dict | None:
        """:attr:`read_by_sms` as the devices file writes it (None where never measured)."""
        if not self.read_by_sms:
            return None
        return {"sms": [m for m, _ in self.read_by_sms], "gbs": [g for _, g in self.read_by_sms],
                "source": self.read_by_sms_source}

    def window_by_sms_block(self) -> dict | None:
        """:attr:`window_by_sms` as the devices file writes it (None where never measured)."""
        if not self.window_by_sms:
            return None
        return {"query_columns": {str(n): {"sms": [m for m, _ in c], "gbs": [g for _, g in c]}
                                  for n, c in sorted(self.window_by_sms.items())},
                "source": self.window_by_sms_source}

    def window_bandwidth(self, sms: int, s: int) -> float | None:
        """What the window design's loads and products stream from ``sms`` SMs (B/s in all) for
        ``s`` query tokens: the curve of :attr:`window_by_sms` for the fewest measured query
        columns that hold ``s`` (see :func:`_along`); None without one."""
        curves = self.window_by_sms or {}
        fits = [n for n in curves if n >= s]
        return _along(curves[min(fits)], sms) if fits else None

    @property
    def memory_bytes(self) -> float:
        """Datasheet memory capacity in bytes (GB taken as 10^9 B)."""
        return self.memory_gb * 1e9

    def ceilings(self, kind: str = "measured", dtype_bytes: int = 2) -> Ceilings:
        """The ceilings for ``kind`` ('measured' or 'datasheet') at a given element width.

        ``dtype_bytes`` 2 uses the bf16/fp16 peak, 1 the fp8 peak. A 'measured' request falls
        back to the datasheet when the device has no measured value for that rate; the
        returned :attr:`Ceilings.kind` says which was used (it is 'measured' only when both
        ceilings are measured).
        """
        if kind not in CEILING_KINDS:
            raise ValueError(f"unknown ceilings {kind!r}; expected one of {', '.join(CEILING_KINDS)}")
        if dtype_bytes == 1:
            if self.fp8_tflops is None:
                raise ValueError(f"device {self.key!r} has no fp8 tensor-core peak")
            rate_key, peak = "fp8_tflops", self.fp8_tflops
        elif dtype_bytes == 2:
            rate_key, peak = "bf16_tflops", self.bf16_tflops
        else:
            raise ValueError(
                f"the roofline has ceilings for 2-byte (bf16/fp16) and 1-byte (fp8) elements only, got w={dtype_bytes}"
            )
        bandwidth = self.bandwidth_gbs
        m = self.measured or {}
        if kind == "measured" and rate_key in m and "bandwidth_gbs" in m:
            return Ceilings(m[rate_key] * 1e12, m["bandwidth_gbs"] * 1e9, "measured", m.get("source", ""))
        source = "; ".join(self.sources.get(key, "") for key in (rate_key, "bandwidth_gbs")).strip("; ")
        return Ceilings(peak * 1e12, bandwidth * 1e9, "datasheet", source)

    def ridge(self, kind: str = "datasheet", dtype_bytes: int = 2) -> float:
        """Ridge point (FLOP/byte) for the given ceilings."""
        return self.ceilings(kind, dtype_bytes).ridge


def _number(where: str, key: str, value, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if not is_finite(value) or value <= 0:
        raise DeviceFileError(f"{where}: {key!r} must be a positive number, got {quote(value)}")
    if not MIN_DEVICE_NUMBER <= value <= MAX_DEVICE_NUMBER:
        raise DeviceFileError(f"{where}: {key!r} must be between {MIN_DEVICE_NUMBER:g} and {MAX_DEVICE_NUMBER:g}, "
                              f"got {value!r}")
    return value


def _parse_device(where: str, key: str, entry) -> Device:
    here = f"{where}: device {quote(key)}"
    if not isinstance(entry, dict):
        raise DeviceFileError(f"{here} must be a JSON object, got {json_type(entry)}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise DeviceFileError(f"{here} is missing {', '.join(missing)}")
    if not isinstance(entry["name"], str) or not entry["name"].strip():
        raise DeviceFileError(f"{here}: 'name' must be a non-empty string, got {quote(entry['name'])}")
    numbers = {k: _number(here, k, entry[k], optional=False) for k in _REQUIRED[1:]}
    numbers.update({k: _number(here, k, entry.get(k), optional=True) for k in _OPTIONAL_NUMBERS})
    measured = entry.get("measured")
    if measured is not None:
        if not isinstance(measured, dict):
            raise DeviceFileError(f"{here}: 'measured' must be a JSON object")
        for k, v in measured.items():
            if k != "source":
                _number(f"{here} measured", k, v, optional=False)
        if "source" in measured and not isinstance(measured["source"], str):
            raise DeviceFileError(f"{here}: measured 'source' must be a string, got {quote(measured['source'])}")
    match = entry.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        raise DeviceFileError(f"{here}: 'match' must be a list of strings")
    sources = entry.get("sources", {})
    if not isinstance(sources, dict):
        raise DeviceFileError(f"{here}: 'sources' must be a JSON object")
    curve, curve_source = _read_by_sms(here, entry.get("read_by_sms"))
    window, window_source = _window_by_sms(here, entry.get("window_by_sms"))
    if entry.get("sms") is not None and not isinstance(entry["sms"], int):
        raise DeviceFileError(f"{here}: 'sms' must be an integer, got {quote(entry['sms'])}")
    return Device(
        key=key, name=entry["name"], match=tuple(m.lower() for m in match), sources=dict(sources),
        measured=dict(measured) if measured else None, read_by_sms=curve, read_by_sms_source=curve_source,
        window_by_sms=window, window_by_sms_source=window_source, **numbers,
    )


def _along(curve: tuple[tuple[int, float], ...] | None, sms: int) -> float | None:
    """B/s (all SMs together) at ``sms`` SMs on a measured curve ``((m, GB/s), ...)``: linear
    between measured SM counts, the first point's per-SM rate below it, the largest count's total
    above it; None without a curve."""
    if not curve or sms <= 0:
        return None
    if sms <= curve[0][0]:
        return curve[0][1] / curve[0][0] * sms * 1e9
    for (m0, g0), (m1, g1) in zip(curve, curve[1:]):
        if sms <= m1:
            return (g0 + (g1 - g0) * (sms - m0) / (m1 - m0)) * 1e9
    return curve[-1][1] * 1e9


def _window_by_sms(here: str, raw) -> tuple[dict[int, tuple[tuple[int, float], ...]] | None, str]:
    """The ``window_by_sms`` block: ``{"query_columns": {"16": {"sms": [...], "gbs": [...]}, ...},
    "source": "..."}``, each curve as :func:`_read_by_sms` takes it, the columns positive integers."""
    if raw is None:
        return None, ""
    where = f"{here}: 'window_by_sms'"
    if not isinstance(raw, dict) or not isinstance(raw.get("query_columns"), dict) or not raw["query_columns"]:
        raise DeviceFileError(f"{where} must be an object with a non-empty object 'query_columns' (and a 'source')")
    curves = {}
    for cols, curve in raw["query_columns"].items():
        if not cols.isdigit() or int(cols) <= 0:
            raise DeviceFileError(f"{where}: query columns must be positive integers, got {quote(cols)}")
        curves[int(cols)] = _read_by_sms(f"{where} [{cols}]", {**curve, "source": ""} if isinstance(curve, dict)
                                         else curve)[0]
    if not isinstance(raw.get("source", ""), str):
        raise DeviceFileError(f"{where}: 'source' must be a string")
    return curves, raw.get("source", "")


def _read_by_sms(here: str, raw) -> tuple[tuple[tuple[int, float], ...] | None, str]:
    """The ``read_by_sms`` block: ``{"sms": [m, ...], "gbs": [GB/s, ...], "source": "..."}``, SM
    counts strictly increasing positive integers, rates positive numbers, as many of each."""
    if raw is None:
        return None, ""
    where = f"{here}: 'read_by_sms'"
    if not isinstance(raw, dict) or not isinstance(raw.get("sms"), list) or not isinstance(raw.get("gbs"), list):
        raise DeviceFileError(f"{where} must be an object with lists 'sms' and 'gbs' (and a 'source')")
    sms, gbs = raw["sms"], raw["gbs"]
    if not sms or len(sms) != len(gbs):
        raise DeviceFileError(f"{where}: 'sms' and 'gbs' must be non-empty lists of one length, got {len(sms)} and "
                              f"{len(gbs)}")
    if any(isinstance(m, bool) or not isinstance(m, int) or m <= 0 for m in sms) or sorted(set(sms)) != sms:
        raise DeviceFileError(f"{where}: 'sms' must be increasing positive integers, got {quote(sms)}")
    rates = [_number(where, "gbs", g, optional=False) for g in gbs]
    if not isinstance(raw.get("source", ""), str):
        raise DeviceFileError(f"{where}: 'source' must be a string")
    return tuple(zip(sms, rates)), raw.get("source", "")


def parse_devices(text: str | bytes, where: str = "devices file") -> dict[str, Device]:
    """Parse the JSON text of a devices file into ``{key: Device}`` (keys lower-cased).

    Raises :class:`DeviceFileError` with the file and device named on any problem.
    """
    return _devices_from_json(parse_json(text, where, expect=None, error=DeviceFileError), where)


def _devices_from_json(raw, where: str) -> dict[str, Device]:
    if not isinstance(raw, dict):
        raise DeviceFileError(f"{where} must hold a JSON object of devices, got {json_type(raw)}")
    devices: dict[str, Device] = {}
    for key, entry in raw.items():
        if key.startswith("_"):                   # comments such as "_sources"
            continue
        if not key.strip():
            raise DeviceFileError(f"{where}: a device key must not be empty")
        if key.lower() in devices:
            raise DeviceFileError(f"{where}: device {quote(key.lower())} is given twice (keys ignore case)")
        devices[key.lower()] = _parse_device(where, key.lower(), entry)
    return devices


@functools.cache
def _builtin() -> dict[str, Device]:
    text = resources.files("mla_var3.conf").joinpath("devices.json").read_text()
    return parse_devices(text, "conf/devices.json")


def load_devices(path: str | os.PathLike | None = None) -> dict[str, Device]:
    """The built-in devices merged with a user file (``path``, else ``$MLA_VAR3_DEVICES``)."""
    devices = dict(_builtin())
    if path is None:
        path = os.environ.get(DEVICES_ENV) or None
        what = f"devices file (${DEVICES_ENV})"
    else:
        what = "devices file"
    if path is not None:
        raw = load_json(path, what, expect=None, error=DeviceFileError)
        devices.update(_devices_from_json(raw, f"{what} {show_path(path)}"))
    return devices


def device_names(path: str | os.PathLike | None = None) -> list[str]:
    """Keys of all known devices (built-in plus the user file)."""
    return list(load_devices(path))


def get_device(name: str | Device, path: str | os.PathLike | None = None) -> Device:
    """The :class:`Device` with key ``name`` (case-insensitive); ValueError naming the known keys."""
    if isinstance(name, Device):
        return name
    devices = load_devices(path)
    key = name.lower()
    if key in devices:
        return devices[key]
    raise ValueError(f"unknown device {name!r}; known devices: {', '.join(devices)}")


def match_device_name(gpu_name: str, path: str | os.PathLike | None = None) -> Device | None:
    """The device whose ``match`` substring occurs in ``gpu_name`` (longest match wins), or None.

    >>> match_device_name("NVIDIA H200").key, match_device_name("NVIDIA H20").key
    ('h200', 'h20')
    """
    name = gpu_name.lower()
    best, best_len = None, 0
    for dev in load_devices(path).values():
        for m in dev.match:
            if m and m in name and len(m) > best_len:
                best, best_len = dev, len(m)
    return best


def detect_device(path: str | os.PathLike | None = None) -> tuple[Device, str]:
    """The current GPU's :class:`Device` and a one-line note on how it was chosen.

    Uses torch only if it is importable and CUDA is available; otherwise (or for a GPU the
    table does not know) returns the default device, ``h200``.
    """
    try:
        import torch  # lazy: the analysis must not need torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
            dev = match_device_name(gpu, path)
            if dev is not None:
                return dev, f"detected {gpu!r} -> {dev.key}"
            return get_device(DEFAULT_DEVICE, path), f"detected {gpu!r}, not in the devices table; using {DEFAULT_DEVICE}"
    except Exception:  # no torch, or a broken CUDA setup: fall back like a machine without a GPU
        pass
    return get_device(DEFAULT_DEVICE, path), f"no GPU detected; using {DEFAULT_DEVICE}"

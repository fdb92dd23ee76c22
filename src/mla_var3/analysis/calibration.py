"""The calibrated model: the roofline terms times measured efficiencies plus fixed costs.

The ideal roofline (:mod:`mla_var3.analysis.roofline`) stays the ceiling. A :class:`Calibration`
holds, for one device, the parameters of each kernel's time law (:mod:`mla_var3.analysis.kernel_laws`)
with their units and the results files they were fitted from, which backend a default call runs,
and the measured points themselves. :func:`predict` gives the time of a design's *default call
alone* (no query absorption, no output decompression), eager by default; without a calibration
for the device (or for that design and backend) it falls back to the roofline and says so
(``source="roofline"``), so every device in ``conf/devices.json`` gets an answer.

Eager time = max(GPU time, host time): on the H200 the eager ÷ CUDA-graph time of the absorbed
call is 0.94–1.07 wherever the GPU time exceeds the host time (no additive launch latency shows
above that noise), and equals the host time where it does not (docs/cost-analysis.md, "Side by
side (b = 32, t = 4096, causal; µs)").

The package ships ``conf/calibration-h200.json`` (fitted by ``benchmarks/calibration_h200.py``
from the committed H200 measurements); :func:`mla_var3.analysis.calibration_fit.fit` fits a new
one from timed records.

Example
-------
>>> from mla_var3.shapes import get_preset, Problem
>>> from mla_var3.analysis.calibration import load_calibration, predict
>>> cal = load_calibration(device="h200")
>>> pr = predict(cal, "flash_mla", get_preset("deepseek-v3"), Problem(b=32, s=16, t=4096))
>>> pr.source, pr.backend
('calibrated', 'gluon')
>>> predict(None, "flash_mla", get_preset("deepseek-v3"), Problem(b=32, s=16, t=4096), device="b200").source
'roofline'
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from mla_var3.analysis.cost import COST_MODELS, DESIGN_MODELS
from mla_var3.analysis.devices import Device, get_device
from mla_var3.analysis.kernel_laws import DEPENDS, LAWS, SPECS, Breakdown, Machine, splits_of
from mla_var3.analysis.roofline import predict as roofline_predict
from mla_var3.shapes import MLADims, Problem

#: format tag written into every calibration file.
FORMAT = "mla_var3.calibration/1"
#: environment variable naming a calibration file used instead of the shipped one.
CALIBRATION_ENV = "MLA_VAR3_CALIBRATION"


class CalibrationFileError(ValueError):
    """A calibration file that cannot be read or does not have the expected shape."""


@dataclass(frozen=True)
class Parameter:
    """One calibrated parameter.

    Attributes
    ----------
    name : str
        ``design.backend.name`` (e.g. ``flash_mla.gluon.compute_efficiency``).
    unit : str
        ``"1"`` for fractions, ``"us"`` for microseconds.
    value : float
    source : str
        The results files (and commits) it was fitted from, or why it is held at its prior.
    meaning : str
        What it measures, in a kernel engineer's words.
    fitted : bool
        False when held at its prior (the data cannot identify it).
    group : str
        ``"gpu"`` (from GPU times) or ``"host"`` (from eager and host times; re-fittable alone).
    """

    name: str
    unit: str
    value: float
    source: str
    meaning: str = ""
    fitted: bool = True
    group: str = "gpu"

    def to_dict(self) -> dict:
        return {"name": self.name, "unit": self.unit, "value": self.value, "source": self.source,
                "meaning": self.meaning, "fitted": self.fitted, "group": self.group}


@dataclass(frozen=True)
class Calibration:
    """The calibrated parameters of one device (see the module docstring; file format in
    ``docs/cost-analysis.md``, "The calibration file and re-fitting").

    ``ceilings`` (``flops_per_s``, ``bytes_per_s``, ``kind``, ``source``) are the ceilings the
    efficiencies are fractions of; ``default_backends`` maps a design to rules
    ``[{"backend": ..., "s_gt": ...}, ...]`` (first match wins) naming the kernel a default call
    runs; ``points`` are the measurements it was fitted from (``calibration_fit.Point`` dicts).
    ``gpu`` is False for a calibration timed on a CPU under the Triton interpreter (``mla-var3
    calibrate`` without a GPU: a test of the plumbing, keyed by device ``"cpu"``, never a GPU's).
    """

    device: str
    device_name: str
    sms: int
    ceilings: dict
    parameters: dict[str, Parameter]
    default_backends: dict[str, list[dict]]
    dtype: str = "bf16"
    versions: dict = field(default_factory=dict)
    commits: dict = field(default_factory=dict)
    fit: dict = field(default_factory=dict)
    points: tuple = ()
    notes: str = ""
    gpu: bool = True
    path: str | None = field(default=None, compare=False)
    #: params_of answers, per (design, backend): the dispatcher asks them for every split it scans
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def label(self) -> str:
        """One line naming the calibration: device, measured commits, file."""
        if "label" not in self._memo:
            commits = ",".join(self.commits.get("measurements", [])) or "?"
            where = f" ({Path(self.path).name})" if self.path else ""
            cpu = "" if self.gpu else " · CPU interpreter timings, not a GPU's"
            self._memo["label"] = f"{self.device} · measurements at {commits}{where}{cpu}"
        return self._memo["label"]

    def machine(self) -> Machine:
        return Machine(self.sms, float(self.ceilings["flops_per_s"]), float(self.ceilings["bytes_per_s"]))

    def backends(self, design: str) -> list[str]:
        """Backends of ``design`` this calibration has parameters for."""
        return [b for (d, b) in SPECS if d == design and self.has(d, b)]

    def has(self, design: str, backend: str) -> bool:
        """Whether every parameter of (design, backend) and of the kernels it reads is present."""
        need = [(design, backend), *DEPENDS.get((design, backend), ())]
        return all(f"{d}.{b}.{s.name}" in self.parameters for d, b in need for s in SPECS.get((d, b), ()))

    def params_of(self, design: str, backend: str) -> dict[str, float]:
        """The law's parameters of (design, backend) by their short names (a fresh dict)."""
        if (design, backend) not in self._memo:
            prefix = f"{design}.{backend}."
            self._memo[(design, backend)] = {name[len(prefix):]: p.value for name, p in self.parameters.items()
                                             if name.startswith(prefix)}
        return dict(self._memo[(design, backend)])

    def default_backend(self, design: str, problem: Problem) -> str | None:
        """The backend a default call of ``design`` runs for ``problem`` on this device."""
        for rule in self.default_backends.get(design, []):
            if problem.s > rule.get("s_gt", -1):
                return rule["backend"]
        return None

    def with_parameters(self, parameters: dict[str, Parameter], **changes) -> "Calibration":
        """A copy with ``parameters`` (full names) replaced and other fields changed."""
        return dataclasses.replace(self, parameters={**self.parameters, **parameters}, **changes)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "device": self.device,
            "device_name": self.device_name,
            "gpu": self.gpu,
            "dtype": self.dtype,
            "sms": self.sms,
            "ceilings": self.ceilings,
            "versions": self.versions,
            "commits": self.commits,
            "default_backends": self.default_backends,
            "notes": self.notes,
            "parameters": [p.to_dict() for p in self.parameters.values()],
            "fit": self.fit,
            "points": list(self.points),
        }


# ----------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------

def _shipped_name(device: str) -> str:
    return f"calibration-{device}.json"


def parse_calibration(text: str, where: str = "calibration file") -> Calibration:
    """A :class:`Calibration` from the JSON text of a calibration file (CalibrationFileError on
    any problem, naming the file)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationFileError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CalibrationFileError(f"{where}: not a calibration file (expected format {FORMAT!r})")
    try:
        params = {}
        for p in raw["parameters"]:
            value = float(p["value"])
            if not math.isfinite(value):
                raise ValueError(f"parameter {p['name']!r} is not finite")
            # a GPU calibration's parameters lie within their laws' bounds; one timed under the CPU
            # interpreter (``"gpu": false``, never used for a GPU) only needs them non-negative
            lo, hi = _bounds(str(p["name"])) if raw.get("gpu", True) else (0.0, math.inf)
            if not lo <= value <= hi:
                raise ValueError(f"parameter {p['name']!r} = {value:g} lies outside its range [{lo:g}, {hi:g}]")
            params[p["name"]] = Parameter(p["name"], p["unit"], value, p["source"], p.get("meaning", ""),
                                          bool(p.get("fitted", True)), p.get("group", "gpu"))
        ceil = raw["ceilings"]
        if not (float(ceil["flops_per_s"]) > 0 and float(ceil["bytes_per_s"]) > 0 and int(raw["sms"]) > 0):
            raise ValueError("ceilings and sms must be positive")
        return Calibration(
            device=str(raw["device"]).lower(), device_name=raw.get("device_name", ""), sms=int(raw["sms"]),
            ceilings=dict(ceil), parameters=params, default_backends=dict(raw.get("default_backends", {})),
            dtype=raw.get("dtype", "bf16"), versions=dict(raw.get("versions", {})), commits=dict(raw.get("commits", {})),
            fit=dict(raw.get("fit", {})), points=tuple(raw.get("points", ())), notes=raw.get("notes", ""),
            gpu=bool(raw.get("gpu", True)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CalibrationFileError(f"{where}: malformed ({type(e).__name__}: {e})") from None


def _bounds(name: str) -> tuple[float, float]:
    """The range a parameter ``<design>.<backend>.<name>`` may take: its law's bounds, or
    [0, inf) for one no law declares (every parameter is a time or a fraction)."""
    design, _, rest = name.partition(".")
    backend, _, short = rest.partition(".")
    for spec in SPECS.get((design, backend), ()):
        if spec.name == short:
            return spec.lo, spec.hi
    return 0.0, math.inf


def load_calibration(path: str | os.PathLike | None = None, device: str | Device | None = "h200") -> Calibration | None:
    """The calibration in ``path``; without a path, ``$MLA_VAR3_CALIBRATION`` if set, else the one
    the package ships for ``device`` (``conf/calibration-<device>.json``), or None when there is
    none (then :func:`predict` falls back to the roofline)."""
    path = path or os.environ.get(CALIBRATION_ENV) or None
    if path:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise CalibrationFileError(f"cannot read calibration file {str(p)!r}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise CalibrationFileError(f"calibration file {str(p)!r} is not UTF-8 text") from None
        return dataclasses.replace(parse_calibration(text, f"calibration file {str(p)!r}"), path=str(p))
    if device is None:
        return None
    key = device.key if isinstance(device, Device) else str(device).lower()
    res = resources.files("mla_var3.conf").joinpath(_shipped_name(key))
    if not res.is_file():
        return None
    return dataclasses.replace(parse_calibration(res.read_text(), f"conf/{_shipped_name(key)}"),
                               path=f"conf/{_shipped_name(key)}")


def save_calibration(cal: Calibration, path: str | os.PathLike) -> Path:
    """Write ``cal`` as JSON (one parameter or point per line, readable in a diff)."""
    d = cal.to_dict()
    head = {k: v for k, v in d.items() if k not in ("parameters", "points")}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v)},")
    for key in ("parameters", "points"):
        items = d[key]
        lines.append(f"  {json.dumps(key)}: [")
        lines += [f"    {json.dumps(x)}{',' if i < len(items) - 1 else ''}" for i, x in enumerate(items)]
        lines.append("  ]," if key == "parameters" else "  ]")
    lines.append("}")
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------------------------
# prediction
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CalibratedPrediction:
    """The predicted time of one default call.

    Attributes
    ----------
    design, backend : str
        ``backend`` is the kernel the default call runs (None for a roofline answer).
    device : str
    source : str
        ``"calibrated"`` or ``"roofline"`` (no calibration applies; ``note`` says why).
    time_s : float
        Eager time (max of GPU and host time) or, with ``eager=False``, GPU time; the roofline
        time when ``source == "roofline"``.
    gpu_s, host_s : float or None
        GPU time (what a CUDA-graph replay measures) and host time of one eager call.
    roofline_time_s : float
        The ideal roofline time of the same design and shape (the ceiling).
    terms, info : dict
        The law's named terms (seconds) and launch facts (waves, splits, tile fill; for the
        hybrid the SM-time per latent and per window key).
    """

    design: str
    backend: str | None
    device: str
    source: str
    time_s: float
    gpu_s: float | None
    host_s: float | None
    roofline_time_s: float
    terms: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    note: str = ""
    calibration: str | None = None

    def to_dict(self) -> dict:
        return {"design": self.design, "backend": self.backend, "device": self.device, "source": self.source,
                "time_s": self.time_s, "gpu_s": self.gpu_s, "host_s": self.host_s,
                "roofline_time_s": self.roofline_time_s, "terms": self.terms, "info": self.info, "note": self.note,
                "calibration": self.calibration}


def _roofline(design: str, dims: MLADims, problem: Problem, device, ceilings: str, note: str,
              backend: str | None = None) -> CalibratedPrediction:
    pr = roofline_predict(design, dims, problem, device, ceilings)
    return CalibratedPrediction(design, backend, pr.device, "roofline", pr.time_s, None, None, pr.time_s,
                                {"compute_s": pr.compute_s, "memory_s": pr.memory_s}, {"bound": pr.bound},
                                note + "; the numbers are the ideal roofline")


def law_breakdown(cal: Calibration, design: str, backend: str, dims: MLADims, problem: Problem) -> Breakdown:
    """The law of (design, backend) evaluated with ``cal``'s parameters (GPU time and terms)."""
    return LAWS[(design, backend)](dims, problem, cal.machine(), cal.params_of)


def host_time_s(cal: Calibration, design: str, backend: str, dims: MLADims, problem: Problem) -> float:
    """Host time of one eager call: ``host_us`` plus ``host_split_us`` for a split-KV call."""
    p = cal.params_of(design, backend)
    host = p.get("host_us", 0.0)
    if "host_split_us" in p and splits_of(design, backend, dims, problem, cal.sms) > 1:
        host += p["host_split_us"]
    return host * 1e-6


def predict(calibration: Calibration | None, design: str, dims: MLADims, problem: Problem, *, n: int | None = None,
            backend: str | None = None, device: str | Device | None = None, ceilings: str = "measured",
            eager: bool = True) -> CalibratedPrediction:
    """Predicted time of the default call of ``design`` alone (no absorption or decompression).

    Parameters
    ----------
    calibration : Calibration or None
        From :func:`load_calibration`; None gives the roofline (``source="roofline"``).
    design : str
        ``flash_attention``, ``flash_mla`` or ``mla_var6_plus`` (other cost models: roofline).
    dims, problem : the shapes; ``n`` overrides ``problem.n`` (the hybrid's window; None = 0).
    backend : str, optional
        A backend other than the default call's (e.g. ``"triton"``, the portable kernels).
    device : str or Device, optional
        The device asked about; default the calibration's (``"h200"`` without one). A calibration
        of another device does not apply (roofline).
    ceilings : ``"measured"`` or ``"datasheet"`` — for the roofline numbers only.
    eager : bool
        True: eager time = max(GPU, host); False: GPU time (a CUDA-graph replay).
    """
    if n is not None:
        problem = problem.with_n(n)
    dev = get_device(device if device is not None else (calibration.device if calibration else "h200"))
    if calibration is None:
        return _roofline(design, dims, problem, dev, ceilings, f"no calibration for {dev.key}")
    if calibration.device != dev.key:
        return _roofline(design, dims, problem, dev, ceilings, f"the calibration is for {calibration.device}, not {dev.key}")
    if design not in DESIGN_MODELS:
        if design not in COST_MODELS:
            raise ValueError(f"unknown design {design!r}; known: {', '.join(COST_MODELS)}")
        return _roofline(design, dims, problem, dev, ceilings, f"{design} is not a calibrated kernel")
    if dims.w != 2:
        return _roofline(design, dims, problem, dev, ceilings, f"calibrated for {calibration.dtype} (w = 2), not w = {dims.w}")
    backend = backend or calibration.default_backend(design, problem)
    if backend is None or (design, backend) not in LAWS or not calibration.has(design, backend):
        return _roofline(design, dims, problem, dev, ceilings,
                         f"no calibrated parameters for {design} with backend {backend!r} on {dev.key}", backend)
    out = law_breakdown(calibration, design, backend, dims, problem)
    host = host_time_s(calibration, design, backend, dims, problem)
    roof = roofline_predict(design, dims, problem, dev, ceilings).time_s
    time_s = max(out.gpu_s, host) if eager else out.gpu_s
    note = "eager: max(GPU time, host time)" if eager else "GPU time (CUDA-graph replay)"
    return CalibratedPrediction(design, backend, dev.key, "calibrated", time_s, out.gpu_s, host, roof, out.terms,
                                out.info, note, calibration.label)

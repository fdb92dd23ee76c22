"""The calibrated model: the roofline terms times measured efficiencies plus fixed costs.

The ideal roofline (:mod:`mla_var3.analysis.roofline`) stays the ceiling. A :class:`Calibration`
holds, for one device, the parameters of each kernel's time law (:mod:`mla_var3.analysis.kernel_laws`)
with their units and the results files they were fitted from, which backend a default call runs,
and the measured points themselves. :func:`predict` gives the time of a design's *default call
alone* (no query absorption, no output decompression), eager by default; without a calibration
for the device (or for that design and backend) it falls back to the roofline and says so
(``source="roofline"``), so every device in ``conf/devices.json`` gets an answer.

Eager time = max(GPU time + eager_lead × host time, host time + eager_tail × GPU time)
(:func:`eager_time_s`): the host's work before the first kernel starts shows in front of a
GPU-bound call, and the GPU work left after the last launch behind a host-bound one. At 0 and 0
(a calibration without them) it is max(GPU time, host time), which held within 0.94–1.07 on the
H200's absorbed calls at b = 32, t = 4096 (docs/cost-analysis.md, "Side by side (b = 32,
t = 4096, causal; µs)"); near the balance of the two, and for host-bound calls, an H100's
held-out calls read up to 13 % and 19 % above it.

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
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from mla_var3._io import InputFileError, check_field, json_type, parse_json, quote, read_bytes, show_path
from mla_var3.analysis.cost import COST_MODELS, DESIGN_MODELS
from mla_var3.analysis.devices import MAX_DEVICE_NUMBER, MIN_DEVICE_NUMBER, Device, get_device
from mla_var3.analysis.kernel_laws import DEPENDS, LAWS, SPECS, Breakdown, Machine, call_kernel, spec_of, splits_of
from mla_var3.analysis.roofline import predict as roofline_predict
from mla_var3.designs import DESIGNS as DESIGN_TABLE
from mla_var3.shapes import MLADims, Problem

#: format tag written into every calibration file.
FORMAT = "mla_var3.calibration/1"
#: environment variable naming a calibration file used instead of the shipped one.
CALIBRATION_ENV = "MLA_VAR3_CALIBRATION"
#: the range of each ceiling a calibration file may give (the devices table's bounds on a
#: device's rates): a ceiling outside it makes every prediction meaningless.
CEILING_RANGE = {"flops_per_s": (MIN_DEVICE_NUMBER * 1e12, MAX_DEVICE_NUMBER * 1e12, "FLOP/s"),
                 "bytes_per_s": (MIN_DEVICE_NUMBER * 1e9, MAX_DEVICE_NUMBER * 1e9, "B/s")}
#: the most SMs a calibration file may give.
MAX_SMS = 1_000_000


class CalibrationFileError(InputFileError):
    """A calibration file that cannot be read or does not have the expected shape."""


#: the source files (relative to the ``mla_var3`` package) whose code a design's default call
#: runs: its kernels, their launchers, the decode plan and the backend choice. A calibration
#: stores the sha256 of each (``kernels``); a change to one of them means its numbers may no
#: longer hold (``stale_kernels``).
_SHARED_FILES = ("kernel/_common.py", "kernel/_jit.py", "kernel/_launch.py", "kernel/backends.py", "kernel/combine.py",
                 "kernel/hopper/__init__.py", "kernel/hopper/_gluon.py")
_ABSORBED_FILES = ("kernel/absorbed.py", "kernel/decode.py", "kernel/decode_plan.py", "kernel/plan_types.py",
                   "kernel/plan_kernels.py", "kernel/plan_reference.py", "analysis/item_cut.py",
                   "kernel/hopper/absorbed_gluon.py", "kernel/hopper/absorbed_seesaw.py",
                   "kernel/hopper/seesaw_host.py")
_EXPANDED_FILES = ("kernel/expanded.py", "kernel/hopper/expanded_gluon.py")
_HYBRID_FILES = ("kernel/hybrid.py", "kernel/hopper/hybrid_hopper.py", "kernel/hopper/window_gluon.py")
#: per design's kernel: a latent design runs the absorbed files, an expanded one the expanded
#: files, the split (hybrid) design both and its own
KERNEL_FILES: dict[str, tuple[str, ...]] = {
    d.kernel: _SHARED_FILES + (_ABSORBED_FILES if d.latent else ())
    + (_EXPANDED_FILES if d.split or not d.latent else ()) + (_HYBRID_FILES if d.split else ()) for d in DESIGN_TABLE}


def kernel_hashes(designs=tuple(KERNEL_FILES), root=None) -> dict[str, str]:
    """``{path: sha256 of the file's bytes}`` of the :data:`KERNEL_FILES` of ``designs``, read from
    the installed package (``root``: another folder laid out as the package, for tests); a file
    that is not there is left out."""
    base = resources.files("mla_var3") if root is None else Path(root)
    out = {}
    for path in sorted({f for d in designs for f in KERNEL_FILES[d]}):
        f = base.joinpath(path)
        if f.is_file():
            out[path] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def stale_kernels(cal: "Calibration", root=None) -> list[str]:
    """The kernel files whose bytes today are neither those ``cal`` was measured with (its
    ``kernels["files"]``) nor those of a change it records as not re-measured (its
    ``kernels["unmeasured"]``, see :func:`unmeasured_changes`); every file of
    :data:`KERNEL_FILES` when it names none. Empty: the calibration describes today's kernels,
    or says plainly which of today's files it has not timed."""
    files = (cal.kernels or {}).get("files") or {}
    wanted = sorted({f for fs in KERNEL_FILES.values() for f in fs})
    if not files:
        return wanted
    now = kernel_hashes(root=root)
    known = {path: {digest} for path, digest in files.items()}
    for change in unmeasured_changes(cal):
        for path, digest in change["files"].items():
            known.setdefault(path, set()).add(digest)
    return sorted(path for path in wanted if now.get(path, "unknown") not in known.get(path, ()))


def unmeasured_changes(cal: "Calibration") -> list[dict]:
    """The kernel-file changes ``cal`` records as landed without a re-calibration:
    ``[{"commit", "files": {path: sha256}, "why", "affects"}]`` (``affects``: what of the model
    may be off, e.g. ``"host"`` for the launchers' host time). Each is printed with the
    calibration's :attr:`Calibration.label`, so a prediction says what it has not measured."""
    return list((cal.kernels or {}).get("unmeasured") or [])


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
    ``kernels``: the code it describes, ``{"commit": ..., "files": {path: sha256}, "note": ...}``
    (:func:`kernel_hashes`; :func:`stale_kernels` lists the files changed since).
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
    kernels: dict = field(default_factory=dict)
    path: str | None = field(default=None, compare=False)
    #: params_of answers, per (design, backend): the dispatcher asks them for every split it scans
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def label(self) -> str:
        """One line naming the calibration: device, measured commits, file, and the commits of the
        changes it records as not re-measured, grouped by what they affect (their reasons stay in
        the file's ``kernels["unmeasured"]``, too long for a line that every prediction prints)."""
        if "label" not in self._memo:
            commits = ",".join(self.commits.get("measurements", [])) or "?"
            where = f" ({Path(self.path).name})" if self.path else ""
            cpu = "" if self.gpu else " · CPU interpreter timings, not a GPU's"
            by_affects: dict[str, list[str]] = {}
            for c in unmeasured_changes(self):
                by_affects.setdefault(c["affects"], []).append(c["commit"])
            why = f"; why: kernels.unmeasured in {Path(self.path).name}" if self.path else ""
            stale = "".join(f" · not re-measured since {', '.join(commits)} ({affects}{why})"
                            for affects, commits in by_affects.items())
            self._memo["label"] = f"{self.device} · measurements at {commits}{where}{cpu}{stale}"
        return self._memo["label"]

    def machine(self) -> Machine:
        return Machine(self.sms, float(self.ceilings["flops_per_s"]), float(self.ceilings["bytes_per_s"]))

    def backends(self, design: str) -> list[str]:
        """Backends of ``design`` this calibration has parameters for."""
        return [b for (d, b) in SPECS if d == design and self.has(d, b)]

    def has(self, design: str, backend: str) -> bool:
        """Whether every parameter of (design, backend) and of the kernels it reads is present."""
        need = [(design, backend), *DEPENDS.get((design, backend), ())]
        return all(f"{d}.{b}.{s.name}" in self.parameters for d, b in need for s in SPECS.get((d, b), ())
                   if not s.optional)

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
            "kernels": self.kernels,
            "default_backends": self.default_backends,
            "notes": self.notes,
            "parameters": [p.to_dict() for p in self.parameters.values()],
            "fit": self.fit,
            "points": list(self.points),
        }


# ----------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------

def device_key(device: "str | Device") -> str:
    """A device's key in the devices table (a name is lower-cased)."""
    return device.key if isinstance(device, Device) else str(device).lower()


def calibration_file_name(device: "str | Device") -> str:
    """``calibration-<device key>.json``: the shipped file's name in ``conf/``, and the file
    ``mla-var3 calibrate`` writes by default."""
    return f"calibration-{device_key(device)}.json"


def parse_calibration(text: str | bytes, where: str = "calibration file") -> Calibration:
    """A :class:`Calibration` from the JSON text of a calibration file (CalibrationFileError on
    any problem, naming the file and the field).

    Every field is checked here, once, so a file that loads predicts: numbers are finite (the
    reader refuses ``NaN``, ``Infinity`` and integers beyond a float's range), the ceilings lie
    within :data:`CEILING_RANGE`, ``sms`` within [1, :data:`MAX_SMS`], each parameter within its
    law's bounds, and ``default_backends`` holds rules :meth:`Calibration.default_backend` can
    read (:func:`check_default_backends`).
    """
    raw = parse_json(text, where, expect=None, error=CalibrationFileError)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CalibrationFileError(f"{where}: not a calibration file (expected format {FORMAT!r})")
    bad = f"{where}: malformed"

    def get(obj, key: str, kind: str, at: str = bad, optional: bool = False):
        return check_field(obj, key, kind, at, optional=optional, error=CalibrationFileError)

    gpu = get(raw, "gpu", "bool", optional=True)
    gpu = True if gpu is None else gpu
    device = get(raw, "device", "str")
    if not device.strip():
        raise CalibrationFileError(f"{bad}: 'device' must not be empty")
    sms = get(raw, "sms", "int>0")
    if sms > MAX_SMS:
        raise CalibrationFileError(f"{bad}: 'sms' must be at most {MAX_SMS:,}, got {quote(sms)}")
    ceil = get(raw, "ceilings", "dict")
    for key, (lo, hi, unit) in CEILING_RANGE.items():
        value = get(ceil, key, "number>0", f"{bad} ceilings")
        if not lo <= value <= hi:
            raise CalibrationFileError(f"{bad} ceilings: {key!r} must lie in [{lo:g}, {hi:g}] ({unit}), got {value!r}")
    for key in ("kind", "source"):
        get(ceil, key, "str", f"{bad} ceilings", optional=True)
    params = {}
    for i, p in enumerate(get(raw, "parameters", "list")):
        if not isinstance(p, dict):
            raise CalibrationFileError(f"{bad}: parameter {i} must be a JSON object, got {json_type(p)}")
        name = get(p, "name", "str", f"{bad} parameter {i}")
        at = f"{bad} parameter {name!r}"
        if name in params:
            raise CalibrationFileError(f"{at} is given twice")
        value = float(get(p, "value", "number", at))
        # a GPU calibration's parameters lie within their laws' bounds; one timed under the CPU
        # interpreter (``"gpu": false``, never used for a GPU) only needs them non-negative
        lo, hi = _bounds(name) if gpu else (0.0, math.inf)
        if not lo <= value <= hi:
            raise CalibrationFileError(f"{at} = {value:g} lies outside its range [{lo:g}, {hi:g}]")
        group = get(p, "group", "str", at, optional=True) or "gpu"
        if group not in ("gpu", "host"):
            raise CalibrationFileError(f"{at}: 'group' must be 'gpu' or 'host', got {quote(group)}")
        fitted = get(p, "fitted", "bool", at, optional=True)
        params[name] = Parameter(name, get(p, "unit", "str", at), value, get(p, "source", "str", at),
                                 get(p, "meaning", "str", at, optional=True) or "",
                                 True if fitted is None else fitted, group)
    commits = get(raw, "commits", "dict", optional=True) or {}
    measured = commits.get("measurements", [])
    if not isinstance(measured, list) or not all(isinstance(c, str) for c in measured):
        raise CalibrationFileError(f"{bad}: commits 'measurements' must be a list of strings, got {quote(measured)}")
    points = get(raw, "points", "list", optional=True) or []
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            raise CalibrationFileError(f"{bad}: point {i} must be a JSON object, got {json_type(point)}")
    return Calibration(
        device=device.lower(), device_name=get(raw, "device_name", "str", optional=True) or "", sms=sms,
        ceilings=dict(ceil), parameters=params,
        default_backends=check_default_backends({} if raw.get("default_backends") is None else raw["default_backends"], f"{bad}: 'default_backends'",
                                                CalibrationFileError),
        dtype=get(raw, "dtype", "str", optional=True) or "bf16",
        versions=dict(get(raw, "versions", "dict", optional=True) or {}), commits=dict(commits),
        fit=dict(get(raw, "fit", "dict", optional=True) or {}), points=tuple(points),
        notes=get(raw, "notes", "str", optional=True) or "", gpu=gpu, kernels=_checked_kernels(raw, bad),
    )


#: the keys a default-backend rule may hold (``s_gt``: the rule applies when s > s_gt).
RULE_KEYS = ("backend", "s_gt")


def check_default_backends(rules, where: str, error: type[ValueError] = ValueError) -> dict[str, list[dict]]:
    """``rules`` (``{design: [{"backend": ..., "s_gt": ...}, ...]}``) checked so that
    :meth:`Calibration.default_backend` can read them: a known design, a list of objects, each
    with a backend that has a time law for the design and an optional integer ``s_gt``, and no
    other key (a misspelt ``s_gte`` would silently make the rule match every s). A copy."""
    if not isinstance(rules, dict):
        raise error(f"{where} must be a JSON object of design -> rules, got {json_type(rules)}")
    out = {}
    for design, design_rules in rules.items():
        if design not in DESIGN_MODELS:
            raise error(f"{where}: unknown design {quote(design)}; known: {', '.join(DESIGN_MODELS)}")
        if not isinstance(design_rules, list):
            raise error(f"{where}: {design!r} must be a list of rules such as {{\"backend\": \"triton\"}}, "
                        f"got {json_type(design_rules)}")
        known = [b for (d, b) in LAWS if d == design]
        for i, rule in enumerate(design_rules):
            at = f"{where}: {design!r} rule {i}"
            if not isinstance(rule, dict):
                raise error(f"{at} must be a JSON object such as {{\"backend\": \"triton\"}}, got {quote(rule)}")
            extra = [k for k in rule if k not in RULE_KEYS]
            if extra:
                raise error(f"{at}: unknown key {quote(extra[0])}; a rule holds {' and '.join(RULE_KEYS)}")
            backend = check_field(rule, "backend", "str", at, error=error)
            if backend not in known:
                raise error(f"{at}: backend {quote(backend)} has no time law for {design}; known: {', '.join(known)}")
            check_field(rule, "s_gt", "int", at, optional=True, error=error)
        out[design] = [{k: v for k, v in rule.items() if v is not None} for rule in design_rules]
    return out


def _checked_kernels(raw: dict, where: str) -> dict:
    """The ``kernels`` field, checked (CalibrationFileError naming the file otherwise)."""
    try:
        return _kernels_block(raw.get("kernels", {}))
    except ValueError as e:
        raise CalibrationFileError(f"{where}: {e}") from None


def _kernels_block(raw) -> dict:
    """The ``kernels`` field: ``{"commit": str, "files": {path: sha256 hex}, ...}`` (ValueError otherwise)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("files", {}), dict):
        raise ValueError("'kernels' must be an object with 'files': {path: sha256}")
    def check_hashes(files: dict, where: str) -> None:
        for path, digest in files.items():
            if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{where}: the hash of {path!r} is not a sha256 hex digest: {digest!r}")

    check_hashes(raw.get("files", {}), "kernels")
    changes = raw.get("unmeasured", [])
    if not isinstance(changes, list):
        raise ValueError("kernels: 'unmeasured' must be a list of {commit, files, why, affects}")
    for i, change in enumerate(changes):
        if not isinstance(change, dict) or not isinstance(change.get("files"), dict) or not all(
                isinstance(change.get(k), str) and change.get(k) for k in ("commit", "why", "affects")):
            raise ValueError(f"kernels: unmeasured change {i} must hold a commit, files {{path: sha256}}, why and "
                             f"affects (non-empty strings)")
        check_hashes(change["files"], f"kernels: unmeasured change {i}")
    return dict(raw)


def _bounds(name: str) -> tuple[float, float]:
    """The range a parameter ``<design>.<backend>.<name>`` may take: its law's bounds, or
    [0, inf) for one no law declares (every parameter is a time or a fraction)."""
    spec = spec_of(name)
    return (spec.lo, spec.hi) if spec else (0.0, math.inf)


def load_calibration(path: str | os.PathLike | None = None, device: str | Device | None = "h200") -> Calibration | None:
    """The calibration in ``path``; without a path, ``$MLA_VAR3_CALIBRATION`` if set, else the one
    the package ships for ``device`` (``conf/calibration-<device>.json``), or None when there is
    none (then :func:`predict` falls back to the roofline)."""
    what = "calibration file"
    if not path and os.environ.get(CALIBRATION_ENV):
        path, what = os.environ[CALIBRATION_ENV], f"calibration file (${CALIBRATION_ENV})"
    if path:
        data = read_bytes(path, what, CalibrationFileError)
        return dataclasses.replace(parse_calibration(data, f"{what} {show_path(path)}"), path=os.fspath(path))
    if device is None:
        return None
    name = calibration_file_name(device)
    res = resources.files("mla_var3.conf").joinpath(name)
    if not res.is_file():
        return None
    return dataclasses.replace(parse_calibration(res.read_text(), f"conf/{name}"), path=f"conf/{name}")


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
        Eager time (:func:`eager_time_s` of the GPU and host time) or, with ``eager=False``, GPU time; the roofline
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
    """Host time of one eager call: ``host_us`` plus ``host_split_us`` for a split-KV call (of the
    kernel the call runs, ``call_kernel``); a hybrid call with n = 0 runs the absorbed kernel and
    pays that kernel's host time plus its own ``n0_host_us`` (its check and zero output)."""
    kernel = call_kernel(design, backend, problem)
    p = cal.params_of(*kernel)
    host = p.get("host_us", 0.0)
    if "host_split_us" in p and splits_of(*kernel, dims, problem, cal.sms) > 1:
        host += p["host_split_us"]
    if kernel != (design, backend):
        host += cal.params_of(design, backend).get("n0_host_us", spec_of(f"{design}.{backend}.n0_host_us").prior)
    return host * 1e-6


def eager_time_s(cal: Calibration, design: str, backend: str, problem: Problem, gpu_s: float, host_s: float) -> float:
    """Eager time of one call from its GPU and host time: ``max(GPU + eager_lead x host, host +
    eager_tail x GPU)`` with the parameters of the kernel the call runs (``call_kernel``; 0 where
    the calibration has none: ``max(GPU, host)``). ``eager_lead``: the share of the host work done
    before the first kernel starts; ``eager_tail``: the share of the GPU time left after the host
    has issued the last launch."""
    p = cal.params_of(*call_kernel(design, backend, problem))
    return max(gpu_s + p.get("eager_lead", 0.0) * host_s, host_s + p.get("eager_tail", 0.0) * gpu_s)


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
        True: eager time (:func:`eager_time_s`); False: GPU time (a CUDA-graph replay).
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
    time_s = eager_time_s(calibration, design, backend, problem, out.gpu_s, host) if eager else out.gpu_s
    note = ("eager: max(GPU time + lead x host time, host time + tail x GPU time)" if eager
            else "GPU time (CUDA-graph replay)")
    return CalibratedPrediction(design, backend, dev.key, "calibrated", time_s, out.gpu_s, host, roof, out.terms,
                                out.info, note, calibration.label)

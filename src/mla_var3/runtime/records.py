"""The result record of a measurement, and its renderings: results.json, a Markdown table, plots.

One :class:`Record` per (design or baseline, shape): the timing, the cost model's FLOPs and
bytes, the achieved rates, the roofline bound at the stated ceilings (measured or datasheet),
and the model's prediction. :func:`write_results` stores records plus the environment metadata;
:func:`markdown_table` and the ``plot_*`` functions render them.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from mla_var3._io import InputFileError, check_field, finite_json, load_json, quote, show_path
from mla_var3.designs import DESIGNS

#: record kinds.
DESIGN, BASELINE = "design", "baseline"
#: record statuses.
STATUSES = ("ok", "skipped", "failed")


@dataclass
class Record:
    """One measured point.

    Times are in microseconds; ``tflops`` / ``gbs`` are achieved rates from the cost model's
    FLOPs and bytes; ``bound_us`` is the roofline time max(flops/peak, bytes/bandwidth) at the
    ceilings named by ``ceilings`` (``"measured"`` or ``"datasheet"``); ``pct_of_bound`` =
    100·bound/measured; ``predicted_us`` is the analysis' prediction for the design
    (``mla_var3.analysis.roofline.predict``) and ``pred_over_meas`` its ratio to the measured time.
    ``status`` is ``"ok"``, ``"skipped"`` or ``"failed"`` (then ``note`` says why).
    """

    name: str
    kind: str
    model: str
    b: int
    s: int
    t: int
    n: int | None = None
    dtype: str = "bf16"
    stage: str = "attention"
    status: str = "ok"
    note: str = ""
    time_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    reps: int | None = None
    method: str | None = None
    gpu: bool | None = None
    cost_model: str | None = None
    flops: int | None = None
    bytes: int | None = None
    intensity: float | None = None
    tflops: float | None = None
    gbs: float | None = None
    bound: str | None = None
    bound_us: float | None = None
    pct_of_bound: float | None = None
    ceilings: str | None = None
    predicted_us: float | None = None
    pred_over_meas: float | None = None
    config: dict | None = None
    backend: str | None = None
    error: float | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "record") -> "Record":
        """A record from its JSON object; unknown keys are ignored. Every known field is checked
        against its type (numbers finite and non-negative, b, s, t positive): a
        :class:`~mla_var3._io.InputFileError` names ``where`` and the key otherwise."""
        if not isinstance(d, dict):
            raise InputFileError(f"{where} must be a JSON object, got {quote(d)}")
        values = {}
        for f in fields(cls):
            kind, nullable = _FIELD_KINDS[f.name]
            if f.name not in d and (f.default is not MISSING or f.default_factory is not MISSING):
                continue
            values[f.name] = check_field(d, f.name, kind, where, optional=nullable)
        if values.get("status", "ok") not in STATUSES:
            raise InputFileError(f"{where}: 'status' must be one of {', '.join(STATUSES)}, got {quote(values['status'])}")
        return cls(**values)


def _field_kind(name: str, annotation: str) -> tuple[str, bool]:
    """(kind for :func:`mla_var3._io.check_field`, whether null is allowed) of a Record field."""
    optional = annotation.endswith("| None")
    base = annotation.removesuffix("| None").strip()
    if base == "int":
        return ("int>0" if name in ("b", "s", "t") else "int>=0"), optional
    if base == "float":
        return "number>=0", optional
    return {"str": "str", "bool": "bool", "dict": "dict"}[base], optional


_FIELD_KINDS = {f.name: _field_kind(f.name, str(f.type)) for f in fields(Record)}


def fill_roofline(rec: Record, cost, ceilings, predicted_s: float | None = None) -> Record:
    """Fill ``rec``'s cost and roofline fields from a ``Cost`` and the analysis ``Ceilings``."""
    rec.flops, rec.bytes = int(cost.flops), int(cost.bytes)
    rec.intensity = cost.flops / cost.bytes if cost.bytes else None
    compute_s, memory_s = cost.flops / ceilings.flops_per_s, cost.bytes / ceilings.bytes_per_s
    rec.bound_us = max(compute_s, memory_s) * 1e6
    rec.bound = "compute" if compute_s >= memory_s else "memory"
    rec.ceilings = ceilings.kind
    if predicted_s is not None:
        rec.predicted_us = predicted_s * 1e6
    if rec.time_us:
        secs = rec.time_us * 1e-6
        rec.tflops = cost.flops / secs / 1e12
        rec.gbs = cost.bytes / secs / 1e9
        rec.pct_of_bound = 100.0 * rec.bound_us / rec.time_us
        if rec.predicted_us is not None:
            rec.pred_over_meas = rec.predicted_us / rec.time_us
    return rec


def fill_timing(rec: Record, timing) -> Record:
    """Copy a :class:`~mla_var3.runtime.timing.Timing` into ``rec``."""
    rec.time_us, rec.p10_us, rec.p90_us = timing.median_us, timing.p10_us, timing.p90_us
    rec.reps, rec.method, rec.gpu = timing.reps, timing.method, timing.gpu
    return rec


# --------------------------------------------------------------------------------------------
# results.json


def write_results(path, records: list[Record], meta: dict) -> Path:
    """Write ``{"meta": ..., "records": [...]}`` to ``path`` (atomic replace); returns the path."""
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(finite_json({"meta": meta, "records": [r.to_dict() for r in records]}), indent=1,
                         default=str, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(payload + "\n")
    os.replace(tmp, path)
    return path


def load_results(path) -> tuple[dict, list[Record]]:
    """(meta, records) from a results.json.

    Raises :class:`~mla_var3._io.InputFileError` (a ValueError) naming the file, and the record
    and key where it applies, when the file cannot be read, is not JSON, is not an object with
    a ``records`` list, or a record lacks a field or holds a wrong type, NaN or a negative time.
    """
    where = f"results file {show_path(path)}"
    data = load_json(path, "results file")
    meta = check_field(data, "meta", "dict", where, optional=True) or {}
    if "dims" in meta and meta["dims"] is not None and not isinstance(meta["dims"], dict):
        raise InputFileError(f"{where}: meta 'dims' must be a JSON object, got {quote(meta['dims'])}")
    rows = check_field(data, "records", "list", where)
    return meta, [Record.from_dict(r, f"{where}: record {i}") for i, r in enumerate(rows)]


# --------------------------------------------------------------------------------------------
# Markdown


def _fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _ok(records):
    return [r for r in records if r.status == "ok" and r.time_us]


def markdown_table(records: list[Record], meta: dict | None = None) -> str:
    """The summary (time per design and baseline for each b, s, with the roofline bound of each
    design) and a detail table of every record; skipped points are listed with their reason."""
    meta = meta or {}
    lines = []
    env = meta.get("environment", {})
    if env:
        lines.append(f"Device: {env.get('device')} · torch {env.get('torch')} · triton {env.get('triton')} · "
                     f"CUDA {env.get('cuda')} · commit {str(env.get('commit'))[:12]}"
                     f"{' (dirty)' if env.get('dirty') else ''} · {env.get('timestamp', '')}")
    if meta.get("ceilings"):
        c = meta["ceilings"]
        lines.append(f"Roofline ceilings: **{c.get('kind')}** — {c.get('tflops', 0):,.0f} TFLOP/s, "
                     f"{c.get('gbs', 0):,.0f} GB/s ({c.get('source', '')})")
    if env and not env.get("gpu", True):
        lines.append("**CPU run: times are perf_counter timings under the Triton interpreter, not GPU timings.**")
    lines.append("")
    main = [r for r in _ok(records) if r.stage == "attention" and (r.kind == BASELINE or r.extra.get("sweep") != "n")]
    names = list(dict.fromkeys(r.name for r in main))
    if main:
        designs = [n for n in names if any(r.name == n and r.kind == DESIGN for r in main)]
        header = ["b", "s", *[f"{n} (µs)" for n in names], *[f"{n} bound (µs)" for n in designs], "fastest"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for b, s in sorted({(r.b, r.s) for r in main}):
            row = {r.name: r for r in main if (r.b, r.s) == (b, s)}
            fastest = min(row.values(), key=lambda r: r.time_us).name if row else ""
            cells = [str(b), str(s)]
            for n in names:
                r = row.get(n)
                cells.append(f"**{_fmt(r.time_us)}**" if r is not None and n == fastest else _fmt(r.time_us if r else None))
            cells += [_fmt(row[n].bound_us) if n in row else "–" for n in designs]
            cells.append(fastest)
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("Every record (time = median; spread p10–p90; % bound = roofline bound / measured; pred/meas = "
                 "roofline prediction / measured; cal/meas = calibrated prediction of the default call / measured, "
                 "where a calibration applies; FlashMLA ÷ = official FlashMLA's time / this one's, the median of "
                 "their ratios in the same repetitions, where FlashMLA ran at the shape):")
    lines.append("")
    cols = ["name", "stage", "b", "s", "t", "n", "time (µs)", "p10–p90 (µs)", "TFLOP/s", "GB/s", "% bound", "bound",
            "pred/meas", "cal/meas", "FlashMLA ÷", "config / backend", "note"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        cfg = r.backend or (" ".join(f"{k}={v}" for k, v in r.config.items()) if r.config else "")
        spread = f"{_fmt(r.p10_us)}–{_fmt(r.p90_us)}" if r.p10_us is not None else "–"
        status = r.note if r.status == "ok" else f"{r.status}: {r.note}"
        cal = r.extra.get("calibrated_us") if r.extra.get("calibrated_source") == "calibrated" else None
        cal_ratio = cal / r.time_us if cal and r.time_us else None
        lines.append("| " + " | ".join([
            r.name, r.stage, str(r.b), str(r.s), str(r.t), _fmt(r.n), _fmt(r.time_us), spread, _fmt(r.tflops),
            _fmt(r.gbs, 0), _fmt(r.pct_of_bound), r.bound or "–", _fmt(r.pred_over_meas, 2), _fmt(cal_ratio, 2),
            _fmt(r.extra.get("flashmla_ratio"), 2), cfg, status,
        ]) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# crossovers


def crossovers(records: list[Record], a: str, b: str) -> dict[int, float | None]:
    """Per batch size: the s at which ``b`` first becomes faster than ``a`` (geometric
    interpolation between the grid points that bracket the sign change), None if never."""
    out: dict[int, float | None] = {}
    ok = [r for r in _ok(records) if r.stage == "attention" and r.extra.get("sweep") != "n"]
    for bsz in sorted({r.b for r in ok}):
        ta = {r.s: r.time_us for r in ok if r.b == bsz and r.name == a}
        tb = {r.s: r.time_us for r in ok if r.b == bsz and r.name == b}
        ss = sorted(set(ta) & set(tb))
        out[bsz] = None
        for s0, s1 in zip(ss, ss[1:]):
            r0, r1 = math.log(tb[s0] / ta[s0]), math.log(tb[s1] / ta[s1])
            if r0 > 0 >= r1:
                frac = r0 / (r0 - r1)
                out[bsz] = math.exp(math.log(s0) + frac * (math.log(s1) - math.log(s0)))
                break
        if out[bsz] is None and ss and tb[ss[0]] <= ta[ss[0]]:
            out[bsz] = float(ss[0])
    return out


# --------------------------------------------------------------------------------------------
# plots (matplotlib, Agg)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_roofline(records: list[Record], ceilings_list: list, path) -> Path:
    """Measured points (intensity, achieved TFLOP/s) on the device roofline(s).

    ``ceilings_list``: analysis ``Ceilings`` to draw (e.g. measured and datasheet)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    pts = [r for r in _ok(records) if r.intensity and r.tflops]
    xs = [r.intensity for r in pts] or [1.0, 1000.0]
    lo, hi = min(xs) / 3, max(xs) * 3
    for c, style in zip(ceilings_list, ("-", "--", ":")):
        ridge = c.ridge
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(grid, [min(c.flops_per_s, x * c.bytes_per_s) / 1e12 for x in grid], "k" + style, lw=1,
                label=f"roofline ({c.kind}): {c.flops_per_s / 1e12:,.0f} TFLOP/s, {c.bytes_per_s / 1e9:,.0f} GB/s, "
                      f"ridge {ridge:.0f}")
    markers = "osD^v<>pP*X"
    for i, name in enumerate(dict.fromkeys(r.name for r in pts)):
        sel = [r for r in pts if r.name == name]
        ax.scatter([r.intensity for r in sel], [r.tflops for r in sel], marker=markers[i % len(markers)], label=name,
                   alpha=0.8)
        for r in sel:
            if r.extra.get("sweep") != "n":
                ax.annotate(f"s{r.s}", (r.intensity, r.tflops), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte, cost model)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Measured points on the roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_time_vs_s(records: list[Record], path) -> Path:
    """Time vs s per design and baseline (one panel per b), measured FA/FlashMLA crossover marked."""
    plt = _plt()
    main = [r for r in _ok(records) if r.stage == "attention" and r.extra.get("sweep") != "n"]
    bs = sorted({r.b for r in main}) or [0]
    fig, axes = plt.subplots(1, len(bs), figsize=(6.5 * len(bs), 5), squeeze=False)
    cross = crossovers(records, "flash_mla", "flash_attention")
    for ax, bsz in zip(axes[0], bs):
        for name in dict.fromkeys(r.name for r in main):
            sel = sorted((r for r in main if r.b == bsz and r.name == name), key=lambda r: r.s)
            if sel:
                ax.plot([r.s for r in sel], [r.time_us for r in sel], marker="o", ms=3,
                        ls="-" if sel[0].kind == DESIGN else "--", label=name)
        if cross.get(bsz):
            ax.axvline(cross[bsz], color="grey", ls=":", label=f"FA overtakes FlashMLA: s ≈ {cross[bsz]:.0f}")
        ax.set_xscale("log", base=2)
        from matplotlib.ticker import ScalarFormatter

        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_yscale("log")
        ax.set_xlabel("query tokens per sequence s")
        ax.set_ylabel("time (µs, median)")
        ax.set_title(f"b = {bsz}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_hybrid_n(records: list[Record], path, optimum: dict[int, float] | None = None) -> Path:
    """The hybrid's time vs n (the n sweep), the model's optimum n (per b) and the measured best marked."""
    plt = _plt()
    sweep = [r for r in _ok(records) if r.name == "mla_var6_plus" and r.extra.get("sweep") == "n"]
    fig, ax = plt.subplots(figsize=(7, 5))
    for bsz in sorted({r.b for r in sweep}):
        sel = sorted((r for r in sweep if r.b == bsz), key=lambda r: r.n)
        line = ax.plot([r.n for r in sel], [r.time_us for r in sel], marker="o", label=f"b = {bsz}, s = {sel[0].s}")[0]
        best = min(sel, key=lambda r: r.time_us)
        ax.scatter([best.n], [best.time_us], s=80, facecolors="none", edgecolors=line.get_color())
        if optimum and optimum.get(bsz) is not None:
            ax.axvline(optimum[bsz], color=line.get_color(), ls=":", label=f"model optimum n = {optimum[bsz]:.0f} (b = {bsz})")
    ax.set_xlabel("n (newest tokens kept expanded; o = t - n latent)")
    ax.set_ylabel("time (µs, median)")
    ax.set_title(f"{next(d.title for d in DESIGNS if d.split)}: time vs n (circle: measured best)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path

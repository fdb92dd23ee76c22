"""PNG plots of the models and the measurements (matplotlib, Agg backend; no display needed).

- :func:`plot_roofline`: attainable TFLOP/s vs arithmetic intensity, with the device's
  ceilings and the three designs placed at a few query lengths s (hollow: the rate of the
  calibrated time; crosses: measured).
- :func:`plot_time_vs_s`: time of the three designs over s: the roofline (dashed), the
  calibrated model (solid, where a calibration applies), measured points; crossovers marked.
- :func:`plot_time_vs_n`: the hybrid's time vs n (roofline, calibrated, measured sweep), the
  optima marked.

``measured`` arguments are ``{s: {kernel: (seconds, n)}}`` (what ``mla-var3 regime --results``
reads from a benchmark results file).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from mla_var3.analysis.calibration import Calibration, predict as calibrated_predict  # noqa: E402
from mla_var3.analysis.cost import DESIGN_MODELS  # noqa: E402
from mla_var3.analysis.devices import Device  # noqa: E402
from mla_var3.analysis.regime import HYBRID, RegimeGuide, best_hybrid_n, calibrated_split, regime_guide  # noqa: E402
from mla_var3.designs import DESIGNS as _TABLE  # noqa: E402
from mla_var3.shapes import MLADims, Problem  # noqa: E402

LABELS = {d.kernel: f"{d.title} ({d.name}{', best n' if d.split else ''})" for d in _TABLE}
COLORS = {d.kernel: d.color for d in _TABLE}
_HYBRID_TITLE = next(d.title for d in _TABLE if d.split)
MARKERS = {1: "o", 16: "s", 128: "^", 1024: "D"}


def plot_roofline(dims: MLADims, device: Device, b: int, t: int, path: Path, ceilings: str = "measured",
                  s_values=(1, 16, 128, 1024), calibration: Calibration | None = None,
                  measured: dict | None = None) -> Path:
    """Roofline of ``device`` with the three designs at each s in ``s_values`` (those <= t): on the
    roof (filled), at the rate of their calibrated time (hollow, where a calibration applies) and
    of their measured time (crosses, ``measured``)."""
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    x = np.logspace(-0.5, 4, 400)
    kinds = [("datasheet", "--", 0.5)]
    if device.ceilings("measured", dims.w).kind == "measured":
        kinds.insert(0, ("measured", "-", 0.9))
    used = device.ceilings(ceilings, dims.w)
    for kind, style, alpha in kinds:
        c = device.ceilings(kind, dims.w)
        ax.plot(x, np.minimum(c.flops_per_s, x * c.bytes_per_s) / 1e12, style, color="black", alpha=alpha,
                label=f"{kind}: {c.flops_per_s / 1e12:,.0f} TFLOP/s, {c.bytes_per_s / 1e9:,.0f} GB/s, ridge {c.ridge:.0f}")
        ax.axvline(c.ridge, color="gray", linestyle=":", linewidth=0.8)
    shown = [s for s in s_values if s <= t]
    best_n = []
    for s in shown:
        pr = Problem(b=b, s=s, t=t)
        n = best_hybrid_n(dims, pr, device, ceilings).n
        best_n.append(n)
        for design, model in DESIGN_MODELS.items():
            c = model(dims, pr.with_n(n) if design == "mla_var6_plus" else pr)
            perf = min(used.flops_per_s, c.intensity * used.bytes_per_s) / 1e12
            ax.scatter(c.intensity, perf, color=COLORS[design], marker=MARKERS.get(s, "o"), s=70, zorder=3,
                       edgecolors="black", linewidths=0.6, alpha=0.85)
            cal = calibrated_predict(calibration, design, dims, pr.with_n(n) if design == HYBRID else pr,
                                     device=device, ceilings=ceilings)
            if cal.source == "calibrated":
                ax.scatter(c.intensity, c.flops / cal.time_s / 1e12, facecolors="none", edgecolors=COLORS[design],
                           marker=MARKERS.get(s, "o"), s=70, zorder=3, linewidths=1.2)
            m = (measured or {}).get(s, {}).get(design)
            if m is not None:
                mc = model(dims, pr.with_n(m[1]) if design == HYBRID and m[1] is not None else pr)
                ax.scatter(mc.intensity, mc.flops / m[0] / 1e12, color=COLORS[design], marker="x", s=60, zorder=4)
    at_ridge = [s for s, n in zip(shown, best_n)
                if abs(DESIGN_MODELS["mla_var6_plus"](dims, Problem(b=b, s=s, t=t, n=n)).intensity / used.ridge - 1) < 0.05]
    if at_ridge:
        ax.annotate(f"{_HYBRID_TITLE} at s = {', '.join(map(str, at_ridge))}:\nn puts its intensity on the ridge",
                    (used.ridge, used.flops_per_s / 1e12), xytext=(used.ridge * 0.08, used.flops_per_s / 1e12 * 1.6),
                    fontsize=8, color=COLORS["mla_var6_plus"], arrowprops={"arrowstyle": "->", "color": COLORS["mla_var6_plus"]})
    roof = ax.get_legend_handles_labels()[0]
    design_handles = [Line2D([], [], color=COLORS[d], marker="o", linestyle="", markeredgecolor="black",
                             label=LABELS[d] if d != "mla_var6_plus" else
                             f"{_HYBRID_TITLE} (hybrid; best n = {', '.join(map(str, best_n))})") for d in DESIGN_MODELS]
    s_handles = [Line2D([], [], color="gray", marker=MARKERS.get(s, "o"), linestyle="", markeredgecolor="black",
                        label=f"s = {s}") for s in shown]
    s_handles += [Line2D([], [], color="gray", marker="o", markerfacecolor="none", linestyle="",
                         label="hollow: calibrated time (same n)")] if calibration is not None else []
    s_handles += [Line2D([], [], color="gray", marker="x", linestyle="", label="x: measured")] if measured else []
    first = ax.legend(handles=roof + design_handles, fontsize=8, loc="lower right")
    ax.add_artist(first)
    ax.legend(handles=s_handles, fontsize=8, loc="upper left", title="query tokens", title_fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable performance (TFLOP/s)")
    ax.set_title(f"Roofline: {dims.name} attention on {device.name}\n"
                 f"b={b}, t={t}, w={dims.w} B; points at s = {', '.join(str(s) for s in s_values if s <= t)} "
                 f"(placed on the {used.kind} roof)", fontsize=10)
    ax.set_ylim(top=used.flops_per_s / 1e12 * 3)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_time_vs_s(dims: MLADims, device: Device, b: int, t: int, path: Path, ceilings: str = "measured",
                   guide: RegimeGuide | None = None, calibration: Calibration | None = None,
                   measured: dict | None = None) -> Path:
    """Time of the three designs for s = 1..t (powers of two and between): the roofline (dashed),
    the calibrated model (solid, where a calibration applies), ``measured`` points; the
    crossovers marked."""
    s_values = sorted(set(np.unique(np.round(np.logspace(0, np.log2(t), 40, base=2))).astype(int).tolist()) | {1, t})
    dense = regime_guide(dims, device, b, t, s_values, ceilings, calibration=calibration)
    guide = guide or dense
    calibrated = dense.prediction == "calibrated"
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    xs = [r.s for r in dense.rows]
    for design in DESIGN_MODELS:
        ax.plot(xs, [r.times[design] * 1e6 for r in dense.rows], color=COLORS[design], linewidth=1.2,
                linestyle="--", label=LABELS[design] + ": roofline")
        if calibrated:
            ax.plot(xs, [r.calibrated_times[design] * 1e6 for r in dense.rows], color=COLORS[design], linewidth=2,
                    label=LABELS[design].replace("best n", "its best n") + ": calibrated")
        pts = sorted((s, m[design][0]) for s, m in (measured or {}).items() if design in m)
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] * 1e6 for p in pts], color=COLORS[design], marker="o", s=30,
                       edgecolors="black", linewidths=0.5, zorder=4, label=LABELS[design] + ": measured")
    crosses = [(guide.crossover_s, "roofline")] + ([(dense.calibrated_crossover_s, "calibrated")] if calibrated else [])
    for i, (sx, what) in enumerate(crosses):
        if sx is None:
            continue
        ax.axvline(sx, color="black", linestyle=":" if what == "roofline" else "-.", linewidth=1)
        ax.annotate(f"FlashAttention overtakes\nFlashMLA at s = {sx} ({what})", (sx, ax.get_ylim()[1]),
                    textcoords="offset points", xytext=(5, -30 - 25 * i), fontsize=8)
    hybrid_best = [r.s for r in dense.rows if (r.calibrated_best if calibrated else r.best) == HYBRID]
    if hybrid_best:
        ax.axvspan(min(hybrid_best), max(hybrid_best), color=COLORS["mla_var6_plus"], alpha=0.08,
                   label=f"{_HYBRID_TITLE} best by > 2% (s {min(hybrid_best)}-{max(hybrid_best)}, {dense.prediction})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_yscale("log")
    ax.set_xlabel("query tokens per sequence s")
    ax.set_ylabel("time (µs)")
    c = dense.ceilings
    what = "roofline (dashed) and calibrated (solid)" if calibrated else "roofline (no calibration)"
    ax.set_title(f"Attention time, {what}: {dims.name} on {device.name}\n"
                 f"b={b}, t={t}, {c.kind} ceilings ({c.flops_per_s / 1e12:,.0f} TFLOP/s, {c.bytes_per_s / 1e9:,.0f} GB/s)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def load_n_sweep(path, b: int | None = None, s: int | None = None) -> dict[str, list[tuple[int, float]]]:
    """Measured time vs n from a ``benchmarks/hybrid_check.py`` JSON (its ``sweep``: rows with
    ``label``, ``b``, ``s``, ``n``, ``us``): ``{label: [(n, µs), ...]}`` sorted by n, for one
    (b, s) (default: the first row's). Rows with ``us`` null (not measured) are skipped; labels
    measured at a single n (the pure kernels) are dropped.

    Raises :class:`~mla_var3._io.InputFileError` (a ValueError) naming the file, and the row
    and key where it applies, when the file is unreadable, not JSON, has no ``sweep`` list, or
    a row lacks a field or holds a wrong type (``us`` must be a finite positive time).
    """
    from mla_var3._io import InputFileError, check_field, load_json, quote, show_path

    where = f"sweep file {show_path(path)}"
    rows = check_field(load_json(path, "sweep file"), "sweep", "list", where)
    checked = []
    for i, row in enumerate(rows):
        here = f"{where}: sweep row {i}"
        if not isinstance(row, dict):
            raise InputFileError(f"{here} must be a JSON object, got {quote(row)}")
        us = check_field(row, "us", "number>0", here, optional=True)
        label = check_field(row, "label", "str", here)
        rb, rs = check_field(row, "b", "int>0", here), check_field(row, "s", "int>0", here)
        n = check_field(row, "n", "int>=0", here)
        if us is not None:
            checked.append((label, rb, rs, n, float(us)))
    if not checked:
        return {}
    b = checked[0][1] if b is None else b
    s = checked[0][2] if s is None else s
    out: dict[str, list[tuple[int, float]]] = {}
    for label, rb, rs, n, us in checked:
        if rb == b and rs == s:
            out.setdefault(label, []).append((n, us))
    return {label: sorted(pts) for label, pts in out.items() if len({n for n, _ in pts}) > 1}


def plot_time_vs_n(dims: MLADims, device: Device, b: int, s: int, t: int, path: Path, ceilings: str = "measured",
                   measured: dict[str, list[tuple[int, float]]] | None = None,
                   window_budget_bytes: float | None = None, tp: int = 1,
                   calibration: Calibration | None = None) -> Path:
    """The hybrid's (``mla_var6_plus``) time vs n: the roofline model (perfect overlap of its two parts) with its
    optimum marked, the calibrated default call (where a calibration applies) with its optimum,
    the measured sweep when given (its best marked), and the n a window budget allows
    (:func:`mla_var3.analysis.regime.choose_n`). ``measured`` here is the sweep
    (:func:`load_n_sweep`)."""
    from mla_var3.analysis.regime import choose_n

    rank = dims.replace(h=dims.h // tp, name=dims.name)
    c = device.ceilings(ceilings, dims.w)
    ns = np.unique(np.linspace(0, t, 257).astype(int))
    model = []
    for n in ns:
        cost = DESIGN_MODELS["mla_var6_plus"](rank, Problem(b=b, s=s, t=t, n=int(n)))
        model.append(max(cost.flops / c.flops_per_s, cost.bytes / c.bytes_per_s) * 1e6)
    best = choose_n(dims, Problem(b=b, s=s, t=t), device, tp=tp, ceilings=ceilings)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    ax.plot(ns, model, color="black", linestyle="--", label=f"model ({c.kind} ceilings, perfect overlap)")
    ax.axvline(best.n, color="black", linestyle=":", linewidth=1)
    ax.scatter([best.n], [best.time_s * 1e6], marker="*", s=200, color="gold", edgecolors="black",
               zorder=4, label=f"predicted optimum: n = {best.n}, {best.time_s * 1e6:,.0f} µs")
    pb = Problem(b=b, s=s, t=t)
    if calibrated_predict(calibration, HYBRID, rank, pb, n=0, device=device, ceilings=ceilings).source == "calibrated":
        cal = [calibrated_predict(calibration, HYBRID, rank, pb, n=int(n), device=device,
                                  ceilings=ceilings).time_s * 1e6 for n in ns]
        ax.plot(ns, cal, color="tab:green", linewidth=2, label="calibrated default call (eager)")
        n_c, p_c = calibrated_split(calibration, rank, pb, device, ceilings)
        ax.scatter([n_c], [p_c.time_s * 1e6], marker="*", s=200, color="tab:green", edgecolors="black", zorder=4,
                   label=f"calibrated optimum: n = {n_c}, {p_c.time_s * 1e6:,.0f} µs")
    if window_budget_bytes is not None:
        cap = choose_n(dims, Problem(b=b, s=s, t=t), device, tp=tp, ceilings=ceilings,
                       window_budget_bytes=window_budget_bytes)
        ax.scatter([cap.n], [cap.time_s * 1e6], marker="v", s=90, color="tab:orange", edgecolors="black", zorder=4,
                   label=f"window budget {window_budget_bytes / 1e6:,.2f} MB: n = {cap.n}, {cap.time_s * 1e6:,.0f} µs")
    palette = ["tab:blue", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:cyan", "tab:olive", "tab:gray"]
    for i_label, (label, pts) in enumerate((measured or {}).items()):
        xs, ys = [n for n, _ in pts], [us for _, us in pts]
        line = ax.plot(xs, ys, marker="o", markersize=4, color=palette[i_label % len(palette)],
                       label=f"measured: {label}")[0]
        i = int(np.argmin(ys))
        if label.startswith("hybrid"):
            ax.scatter([xs[i]], [ys[i]], s=110, facecolors="none", edgecolors=line.get_color(), linewidths=1.5, zorder=4)
    ax.set_xlabel("n (newest tokens kept expanded; o = t - n latent)")
    ax.set_ylabel("time (µs)")
    heads = f", {dims.h // tp} heads per rank (tp = {tp})" if tp != 1 else ""
    ax.set_title(f"{_HYBRID_TITLE} time vs n: {dims.name} on {device.name}\nb={b}, s={s}, t={t}{heads}"
                 + ("; circles: measured best" if measured else ""), fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

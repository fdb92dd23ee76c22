"""The report: regime guide + memory table (Markdown and JSON) and the PNG plots, in one folder.

>>> from mla_var3.analysis.report import write_report
>>> paths = write_report("mla_var3_report", get_preset("deepseek-v3"), get_device("h200"), b=32, t=4096)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

from mla_var3.analysis.calibration import Calibration
from mla_var3.analysis.devices import Device
from mla_var3.analysis.memory import CapacityPlan, cache_layouts, mla_bytes_per_token, plan_capacity
from mla_var3.analysis.regime import RegimeGuide, regime_guide
from mla_var3.designs import DESIGNS
from mla_var3.shapes import MLADims

#: the hybrid's title in the report (the design table's)
_HYBRID_TITLE = next(d.title for d in DESIGNS if d.split)

REPORT_FORMATS = ("md", "json")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.2f}"


def memory_section(dims: MLADims, device: Device, context: int, n: int, tp_values=(1, 8)) -> dict:
    """Cache layouts and capacity plans (MLA and expanded) for the report."""
    layouts = cache_layouts(dims, context=context, n=min(n, context))
    plans: list[CapacityPlan] = []
    for tp in tp_values:
        if dims.h % tp:
            continue
        for layout in ("mla", "expanded"):
            try:
                plans.append(plan_capacity(dims, device.memory_bytes, tp=tp, context=context, layout=layout))
            except ValueError:
                return {"layouts": layouts, "plans": [], "note": f"no published parameter count for {dims.name}"}
    return {"layouts": layouts, "plans": plans, "note": ""}


def _time_table(guide: RegimeGuide, measured: dict) -> list[str]:
    """Per s: each design's roofline time (bound), calibrated time (where a calibration applies)
    and measured time (where ``measured`` has one), the best by each."""
    calibrated = guide.prediction == "calibrated"
    head, sep = ["s"], ["---"]
    for d in DESIGNS:
        head += [f"{d.title} roofline"] + ([f"{d.title} calibrated"] if calibrated else []) + \
            ([f"{d.title} measured"] if measured else [])
    head += ["best (roofline)"] + (["best (calibrated)"] if calibrated else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in guide.rows:
        cells = [str(r.s)]
        for d in DESIGNS:
            roof = r.hybrid if d.split else r.predictions[d.kernel]
            cells.append(f"{_us(roof.time_s)} ({roof.bound[:3]})" + (f" n={r.hybrid.n}" if d.split else ""))
            if calibrated:
                cells.append(_us(r.calibrated[d.kernel].time_s) + (f" n={r.calibrated_n}" if d.split else ""))
            if measured:
                m = measured.get(r.s, {}).get(d.kernel)
                cells.append("–" if m is None else _us(m[0]) + (f" n={m[1]}" if m[1] is not None else ""))
        cells += [r.best] + ([r.calibrated_best] if calibrated else [])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_markdown(guide: RegimeGuide, dims: MLADims, device: Device, mem: dict, context: int, device_note: str,
                    measured: dict | None = None) -> str:
    c = guide.ceilings
    calibrated = guide.prediction == "calibrated"
    lines = [
        f"# MLA regime guide: {dims.name} on {device.name}",
        "",
        f"Roofline model (time = max(FLOPs / peak, bytes / bandwidth)), {c.kind} ceilings: "
        f"{c.flops_per_s / 1e12:,.1f} TFLOP/s, {c.bytes_per_s / 1e9:,.0f} GB/s, ridge {c.ridge:.1f} FLOP/byte. "
        f"b = {guide.b}, t = {guide.t}, h = {dims.h}, d = {dims.d}, p = {dims.p}, k = {dims.k}, w = {dims.w} B. "
        f"Device: {device_note}.",
        "",
        ("Calibrated: the default call of each design's kernel alone, eager (roofline terms × measured efficiencies "
         f"+ fixed and host costs; `docs/cost-analysis.md`, \"The laws\"), from {guide.calibration}. The hybrid is "
         "taken at its own best n under each model." if calibrated else
         f"No calibrated prediction ({guide.calibration}): these are predictions of the ideal roofline."),
        "Measured: the fastest recorded time of each design's kernel in the results files given." if measured else
        "No results file was given: no measured column.",
        "",
        "## Time per query length s (µs)",
        "",
        *_time_table(guide, measured or {}),
    ]
    cross = guide.crossover_s
    lines += [
        "",
        "(com = compute-bound, mem = memory-bound, by the roofline.) "
        + (f"By the roofline FlashAttention overtakes FlashMLA at **s = {cross}**" if cross
           else "By the roofline FlashAttention never overtakes FlashMLA for s <= t")
        + ((f"; by the calibrated model at **s = {guide.calibrated_crossover_s}**." if guide.calibrated_crossover_s
            else "; by the calibrated model never.") if calibrated else ".")
        + f" {_HYBRID_TITLE} is named best only when it beats the best single design by more than 2 %.",
        "",
        f"## Regime table ({guide.prediction})",
        "",
        f"| regime | s | best design | why ({guide.prediction}) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {e.regime} | {e.s_range} | {e.best} | {e.why} |"
              for e in (guide.calibrated_regimes if calibrated else guide.regimes)]
    lines += [
        "",
        f"## KV cache per token (all {dims.layers} layers) and per sequence of {context:,} tokens",
        "",
        "| layout | bytes / token / layer | formula | MB / token (all layers) | GB / sequence | × MLA |",
        "|---|---|---|---|---|---|",
    ]
    mla = mla_bytes_per_token(dims)
    for lay in mem["layouts"]:
        per_tok = lay.bytes_per_token_layer * dims.layers
        lines.append(
            f"| {lay.layout} | {lay.bytes_per_token_layer:,.0f} | {lay.formula} | {per_tok / 1e6:,.3f} "
            f"| {per_tok * context / 1e9:,.2f} | {lay.bytes_per_token_layer / mla:,.1f} |"
        )
    lines += [
        "",
        "## Cache is not total memory: capacity per GPU",
        "",
        f"{device.name}, {device.memory_gb:g} GB per GPU; weights = parameters × bytes / tp; reserve = 10 % of "
        "memory for activations, workspaces, allocator slack and communication buffers; the rest holds cache. "
        "The MLA latent is replicated on every tensor-parallel rank; the expanded cache is split by heads.",
        "",
    ]
    if mem["plans"]:
        lines += [
            "| tp | layout | weights / GPU (GB) | reserve (GB) | cache budget (GB) | KB / token | tokens | sequences of "
            f"{context:,} |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for pl in mem["plans"]:
            budget = _gb(pl.cache_budget_bytes) if pl.fits else "none: weights do not fit"
            lines.append(
                f"| {pl.tp} | {pl.layout} | {_gb(pl.weights_bytes)} | {_gb(pl.reserve_bytes)} | {budget} "
                f"| {pl.cache_bytes_per_token / 1e3:,.1f} | {pl.tokens:,} | {pl.sequences:,} |"
            )
        fitting = [pl for pl in mem["plans"] if pl.fits and pl.layout == "mla"]
        if fitting:
            pl = fitting[-1]
            share = pl.cache_budget_bytes / pl.device_memory_bytes
            lines += [
                "",
                f"At tp = {pl.tp} the cache gets {share * 100:.0f} % of each GPU's memory; the other "
                f"{(1 - share) * 100:.0f} % (weights, reserve) does not shrink when the cache per token does. "
                f"The MLA latent holds {pl.tokens:,} tokens there; the same attention run expanded would hold "
                f"{[x for x in mem['plans'] if x.tp == pl.tp and x.layout == 'expanded'][0].tokens:,}.",
            ]
    else:
        lines.append(mem["note"])
    return "\n".join(lines) + "\n"


def write_report(
    out_dir: str | Path,
    dims: MLADims,
    device: Device,
    b: int = 32,
    t: int = 4096,
    ceilings: str = "measured",
    formats=REPORT_FORMATS,
    context: int = 32768,
    device_note: str = "",
    calibration: Calibration | None = None,
    measured: dict | None = None,
    tp: int = 1,
) -> list[Path]:
    """Write ``report.md`` / ``report.json`` and the two PNG plots into ``out_dir``; return the paths.

    ``calibration`` adds the calibrated prediction (without one the report says the numbers are
    the roofline's); ``measured`` (``{s: {kernel: (seconds, n)}}``) adds measured times. ``tp``:
    the guide and plots are one GPU's call of that tensor-parallel degree (``dims.per_gpu(tp)``:
    h/tp heads, the whole latent cache); the memory table stays the whole model's."""
    from mla_var3.analysis.plots import plot_roofline, plot_time_vs_s  # matplotlib only when plotting

    bad = [f for f in formats if f not in REPORT_FORMATS]
    if bad:
        raise ValueError(f"unknown report format(s) {', '.join(bad)}; expected {', '.join(REPORT_FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, dims = dims, dims.per_gpu(tp)
    guide = regime_guide(dims, device, b, t, ceilings=ceilings, calibration=calibration)
    mem = memory_section(model, device, context=context, n=1024)
    paths = []
    if "md" in formats:
        p = out / "report.md"
        p.write_text(render_markdown(guide, dims, device, mem, context, device_note or device.key, measured))
        paths.append(p)
    if "json" in formats:
        p = out / "report.json"
        data = {
            "regime": guide.to_dict(),
            "memory": {
                "context": context,
                "layers": model.layers,
                "layouts": [
                    {"layout": lay.layout, "bytes_per_token_layer": lay.bytes_per_token_layer, "formula": lay.formula}
                    for lay in mem["layouts"]
                ],
                "plans": [pl.to_dict() for pl in mem["plans"]],
            },
            "device_note": device_note,
            "tp": tp,
            "measured": [{"s": s, "times_s": {k: v[0] for k, v in m.items()},
                          "n": {k: v[1] for k, v in m.items() if v[1] is not None}} for s, m in (measured or {}).items()],
        }
        p.write_text(json.dumps(data, indent=2) + "\n")
        paths.append(p)
    paths.append(plot_roofline(dims, device, b, t, out / "roofline.png", ceilings, calibration=calibration,
                               measured=measured))
    paths.append(plot_time_vs_s(dims, device, b, t, out / "time_vs_s.png", ceilings, guide, calibration, measured))
    return paths

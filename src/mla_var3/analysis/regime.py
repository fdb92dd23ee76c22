"""The regime guide: which design wins for each query length s, by the roofline and by the
calibrated model.

For dims, a device and (b, t): per s the predicted time of FlashAttention, FlashMLA and
the hybrid (``mla_var6_plus``) at its best split n; the crossover s where FlashAttention overtakes FlashMLA; the
seed's decode / speculative / prefill table recomputed for the device. Each row has the ideal
roofline (the seed's analysis, the ceiling) and the calibrated prediction of the default calls
(:mod:`mla_var3.analysis.calibration`: the roofline where no calibration applies, and says so),
with the hybrid at its own best n under each.

Best hybrid split (derivation in ``docs/cost-analysis.md``, "The best hybrid split n"): with
o = t - n, the hybrid's FLOPs and bytes are affine in n, F(n) = F0 + F1·n (F1 < 0 when k > d:
an expanded token is cheaper to compute) and B(n) = B0 + B1·n (B1 > 0 when 2hd > k: it is dearer
to read). The time max(F/P, B/W) is convex in n and smallest where the two balance,

    n* = (F0/P - B0/W) / (B1/W - F1/P),

clamped to [0, t]; the integer optimum is floor(n*) or ceil(n*) or an end point.

Example
-------
>>> from mla_var3.shapes import get_preset
>>> from mla_var3.analysis.regime import crossover_s
>>> crossover_s(get_preset("deepseek-v3"), b=32, t=4096, device="h200")
50
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mla_var3.analysis.calibration import CalibratedPrediction, Calibration, predict as calibrated_predict
from mla_var3.analysis.cost import DESIGN_MODELS, get_cost_model
from mla_var3.analysis.devices import Ceilings, Device
from mla_var3.analysis.memory import hybrid_cache_bytes, max_window_n, mla_cache_bytes, window_bytes
from mla_var3.analysis.roofline import Prediction, predict_cost, resolve_ceilings, roofline_time
from mla_var3.designs import DESIGNS as _TABLE
from mla_var3.shapes import MLADims, Problem

#: default query lengths of the guide (those <= t are used).
DEFAULT_S = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: the hybrid is named best only when it beats the best single design by more than this
#: fraction (near n = 0 or n = t it *is* that design, run with extra passes).
HYBRID_MARGIN = 0.02
#: the seed's regimes: name, s range (inclusive; None = up to t).
REGIMES = (("decode", 1, 1), ("speculative", 2, 32), ("prefill", 129, None))
#: the designs' kernels: the one that takes the split n, and the two single designs.
HYBRID = next(d.kernel for d in _TABLE if d.split)
_HYBRID_TITLE = next(d.title for d in _TABLE if d.split)
_SINGLES = tuple(d.kernel for d in _TABLE if not d.split)


def regime_of(s: int) -> str:
    """The seed's regime of s (:data:`REGIMES`): 'decode', 'speculative' or 'prefill', else 'middle' (33-128)."""
    return next((name for name, lo, hi in REGIMES if lo <= s <= (hi or s)), "middle")


@dataclass(frozen=True)
class HybridSplit:
    """The hybrid's chosen split for one problem.

    Attributes
    ----------
    n : int
        Newest tokens kept expanded (o = t - n latent).
    time_s : float
        Predicted time at that n.
    bound : str
        'compute' or 'memory' at that n.
    n_balance : float or None
        Unclamped n where compute and memory time balance (None when they never do).
    limited_by : str
        'time' (the time optimum) or 'memory' (capped by a cache budget).
    """

    n: int
    time_s: float
    bound: str
    n_balance: float | None
    limited_by: str = "time"


def _hybrid_time(dims: MLADims, problem: Problem, n: int, ceil: Ceilings) -> tuple[float, str]:
    return roofline_time(DESIGN_MODELS["mla_var6_plus"](dims, problem.with_n(n)), ceil)


def _best_n_in(dims: MLADims, problem: Problem, ceil: Ceilings, n_max: int) -> HybridSplit:
    t = problem.t
    c0 = DESIGN_MODELS["mla_var6_plus"](dims, problem.with_n(0))
    ct = DESIGN_MODELS["mla_var6_plus"](dims, problem.with_n(t))
    f1, b1 = (ct.flops - c0.flops) / t, (ct.bytes - c0.bytes) / t
    p, w = ceil.flops_per_s, ceil.bytes_per_s
    denom = b1 / w - f1 / p
    n_bal = (c0.flops / p - c0.bytes / w) / denom if denom != 0 else None
    candidates = {0, n_max}
    if n_bal is not None and math.isfinite(n_bal):
        for n in (math.floor(n_bal), math.ceil(n_bal)):
            candidates.add(min(max(n, 0), n_max))
    best = min(sorted(candidates), key=lambda n: _hybrid_time(dims, problem, n, ceil)[0])
    time_s, bound = _hybrid_time(dims, problem, best, ceil)
    return HybridSplit(best, time_s, bound, n_bal)


def best_hybrid_n(dims: MLADims, problem: Problem, device: str | Device = "h200", ceilings: str = "measured") -> HybridSplit:
    """The split n in [0, t] that minimises the hybrid's roofline time (closed form, see module doc).

    Ties go to the smaller n (less expanded cache). ``problem.n`` is ignored.
    """
    _, ceil = resolve_ceilings(device, dims, ceilings)
    return _best_n_in(dims, problem, ceil, problem.t)


#: the splits the benchmark and ``python -m mla_var3.kernel`` run: multiples of this many tokens.
N_ALIGN = 64


def align_n(n: float, t: int) -> int:
    """A hybrid split ``n`` rounded to a multiple of :data:`N_ALIGN` within [0, t]."""
    return int(min(t, max(0, round(n / N_ALIGN) * N_ALIGN)))


def aligned_best_n(dims: MLADims, problem: Problem, device: str | Device = "h200", ceilings: str = "measured") -> int:
    """:func:`best_hybrid_n` rounded by :func:`align_n`: the split a benchmark point and
    ``python -m mla_var3.kernel`` take when none is given."""
    return align_n(best_hybrid_n(dims, problem, device, ceilings).n, problem.t)


def scan_hybrid_n(dims: MLADims, problem: Problem, device: str | Device = "h200", ceilings: str = "measured") -> HybridSplit:
    """Brute force: evaluate every n in [0, t] with the cost model; the smallest n of least time."""
    _, ceil = resolve_ceilings(device, dims, ceilings)
    best_n, best_t, best_b = 0, math.inf, ""
    for n in range(problem.t + 1):
        time_s, bound = _hybrid_time(dims, problem, n, ceil)
        if time_s < best_t:
            best_n, best_t, best_b = n, time_s, bound
    return HybridSplit(best_n, best_t, best_b, None)


def max_hybrid_n(dims: MLADims, b: int, t: int, memory_budget_bytes: float, tp: int = 1) -> int:
    """Largest n whose hybrid cache (all layers, one tensor-parallel rank) fits the budget.

    Per rank the latent part is replicated (every rank needs it for its heads); the expanded
    part holds only the rank's h/tp heads. Raises ValueError when even n = 0 does not fit.
    """
    Problem(b=b, s=1, t=t)                        # validates b and t
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or dims.h % tp:
        raise ValueError(f"max_hybrid_n: tp must be a positive divisor of h={dims.h}, got {tp!r}")
    if isinstance(memory_budget_bytes, bool) or not isinstance(memory_budget_bytes, (int, float)) \
            or not math.isfinite(memory_budget_bytes) or memory_budget_bytes < 0:
        raise ValueError(f"max_hybrid_n: the memory budget must be a finite number >= 0 bytes, "
                         f"got {memory_budget_bytes!r}")
    rank_dims = dims.replace(h=dims.h // tp, name=dims.name)

    def total(n: int) -> int:
        return dims.layers * hybrid_cache_bytes(rank_dims, b, t - n, n)

    if total(0) > memory_budget_bytes:
        raise ValueError(
            f"the latent cache alone needs {total(0) / 1e9:.2f} GB for b={b}, t={t}, "
            f"more than the budget of {memory_budget_bytes / 1e9:.2f} GB"
        )
    if total(t) <= memory_budget_bytes:
        return t
    per_token = (total(t) - total(0)) / t
    n = int((memory_budget_bytes - total(0)) // per_token)
    while n > 0 and total(n) > memory_budget_bytes:  # guard against rounding
        n -= 1
    return n


def _n_cap(dims: MLADims, problem: Problem, memory_budget_bytes, window_budget_bytes, tp: int) -> int:
    """The largest n the budgets allow (t without budgets)."""
    n_cap = problem.t
    if memory_budget_bytes is not None:
        n_cap = min(n_cap, max_hybrid_n(dims, problem.b, problem.t, memory_budget_bytes, tp))
    if window_budget_bytes is not None:
        n_cap = min(n_cap, max_window_n(dims, window_budget_bytes, tp))
    return n_cap


def choose_n(
    dims: MLADims,
    problem: Problem,
    device: str | Device = "h200",
    memory_budget_bytes: float | None = None,
    tp: int = 1,
    ceilings: str = "measured",
    window_budget_bytes: float | None = None,
) -> HybridSplit:
    """The hybrid split to run: the time optimum, capped by a cache budget when one is given.

    With ``tp`` > 1 each rank runs h/tp heads (h must divide). ``memory_budget_bytes`` is the
    cache budget of one rank for all ``dims.layers`` layers of ``problem.b`` sequences of
    context ``problem.t``; ``window_budget_bytes`` caps the expanded window of one sequence in
    one layer on one rank (:func:`~mla_var3.analysis.memory.window_bytes`:
    ``n·(h/tp)·2d·w``). The time is convex in n, so the capped optimum is the clamped one.
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or dims.h % tp:
        raise ValueError(f"choose_n: tp must be a positive divisor of h={dims.h}, got {tp!r}")
    rank_dims = dims.replace(h=dims.h // tp, name=dims.name)
    _, ceil = resolve_ceilings(device, rank_dims, ceilings)
    best = _best_n_in(rank_dims, problem, ceil, problem.t)
    n_cap = _n_cap(dims, problem, memory_budget_bytes, window_budget_bytes, tp)
    if best.n <= n_cap:
        return best
    time_s, bound = _hybrid_time(rank_dims, problem, n_cap, ceil)
    return HybridSplit(n_cap, time_s, bound, best.n_balance, "memory")


def hybrid_split(
    dims: MLADims,
    problem: Problem,
    device: str | Device = "h200",
    n: int | str = "auto",
    *,
    window_budget_bytes: float | None = None,
    memory_budget_bytes: float | None = None,
    tp: int = 1,
    ceilings: str = "measured",
) -> HybridSplit:
    """The split to run for ``n``: ``"auto"`` (the default) is :func:`choose_n` — the model's
    best n clamped by the budgets; an integer is taken as given (``limited_by="given"``) and
    checked against ``[0, t]`` and the budgets (ValueError when it does not fit)."""
    if n == "auto":
        return choose_n(dims, problem, device, memory_budget_bytes, tp, ceilings, window_budget_bytes)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= problem.t:
        raise ValueError(f"hybrid n must be 'auto' or an integer in [0, t={problem.t}], got {n!r}")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or dims.h % tp:
        raise ValueError(f"hybrid_split: tp must be a positive divisor of h={dims.h}, got {tp!r}")
    n_cap = _n_cap(dims, problem, memory_budget_bytes, window_budget_bytes, tp)
    if n > n_cap:
        raise ValueError(f"hybrid n={n} does not fit the budget (at most n={n_cap})")
    rank_dims = dims.replace(h=dims.h // tp, name=dims.name)
    _, ceil = resolve_ceilings(device, rank_dims, ceilings)
    time_s, bound = _hybrid_time(rank_dims, problem, n, ceil)
    return HybridSplit(n, time_s, bound, None, "given")


def latent_window_budget(dims: MLADims, t: int) -> int:
    """The latent cache's own size for one sequence in one layer, ``t·(k + p)·w``: the budget
    "the window may cost at most what the latent cache costs"."""
    return mla_cache_bytes(dims, 1, t)


@dataclass(frozen=True)
class BudgetedSplit:
    """One line of :func:`budget_table`: the split at tensor-parallel degree ``tp`` with or
    without a window budget, and the window's bytes per sequence per layer per rank."""

    tp: int
    window_budget_bytes: float | None
    split: HybridSplit
    window_bytes: int
    latent_time_s: float

    @property
    def speedup(self) -> float:
        """Predicted time at n = 0 (all latent: the absorbed computation) over the split's."""
        return self.latent_time_s / self.split.time_s

    def to_dict(self) -> dict:
        return {"tp": self.tp, "window_budget_bytes": self.window_budget_bytes, "n": self.split.n,
                "time_s": self.split.time_s, "bound": self.split.bound, "limited_by": self.split.limited_by,
                "window_bytes": self.window_bytes, "latent_time_s": self.latent_time_s, "speedup": self.speedup}


def budget_table(
    dims: MLADims,
    problem: Problem,
    device: str | Device = "h200",
    window_budget_bytes: float | None = None,
    tps=(1,),
    ceilings: str = "measured",
) -> list[BudgetedSplit]:
    """For each tp: the unconstrained split, then the split under ``window_budget_bytes`` per
    sequence per layer per rank (default: the latent cache's own size,
    :func:`latent_window_budget`). Times are per rank (h/tp heads), beside the time at n = 0."""
    budget = latent_window_budget(dims, problem.t) if window_budget_bytes is None else window_budget_bytes
    rows = []
    for tp in tps:
        latent_s = hybrid_split(dims, problem, device, 0, tp=tp, ceilings=ceilings).time_s
        for cap in (None, budget):
            split = choose_n(dims, problem, device, tp=tp, ceilings=ceilings, window_budget_bytes=cap)
            rows.append(BudgetedSplit(tp, cap, split, window_bytes(dims, split.n, tp), latent_s))
    return rows


def crossover_s(
    dims: MLADims,
    b: int,
    t: int,
    device: str | Device = "h200",
    ceilings: str = "measured",
    slow: str = "flash_mla",
    fast: str = "flash_attention",
) -> int | None:
    """Smallest integer s in [1, t] where ``fast`` (default FlashAttention) is predicted faster
    than ``slow`` (default FlashMLA); None when it never is."""
    Problem(b=b, s=1, t=t)                        # validates b and t
    _, ceil = resolve_ceilings(device, dims, ceilings)
    slow_m, fast_m = get_cost_model(slow), get_cost_model(fast)
    for s in range(1, t + 1):
        pr = Problem(b=b, s=s, t=t)
        if roofline_time(fast_m(dims, pr), ceil)[0] < roofline_time(slow_m(dims, pr), ceil)[0]:
            return s
    return None


def _device_of(calibration: Calibration | None, device: str | Device | None) -> str | Device:
    """``device``, or by default the calibration's own (the H200 without one): a calibration asked
    about another device does not apply, and the prediction would fall back to the roofline."""
    if device is not None:
        return device
    return calibration.device if calibration is not None else "h200"


def calibrated_split(calibration: Calibration | None, dims: MLADims, problem: Problem,
                     device: str | Device | None = None, ceilings: str = "measured", lo: int = 0,
                     hi: int | None = None) -> tuple[int, CalibratedPrediction]:
    """The hybrid's split n in [lo, hi] (default [0, t]) with the least calibrated time, and its
    prediction: n on a grid of t/16 steps plus the ends, then t/64 steps around the best of them
    (the calibrated time is not convex in n: waves and tile families step; a dispatcher asks this
    at every new context length). Where no calibration applies, the roofline's best n clamped to
    [lo, hi] (its prediction says ``source="roofline"``). ``device``: the calibration's by default."""
    device = _device_of(calibration, device)
    t = problem.t
    hi = t if hi is None else min(hi, t)

    def at(n: int) -> CalibratedPrediction:
        return calibrated_predict(calibration, HYBRID, dims, problem, n=n, device=device, ceilings=ceilings)

    first = at(lo)
    if first.source != "calibrated":
        _, ceil = resolve_ceilings(device, dims, ceilings)
        n = min(max(_best_n_in(dims, problem, ceil, t).n, lo), hi)
        return n, at(n)
    best = (first.time_s, lo, first)
    seen = {lo}
    coarse, fine = max(1, t // 16), max(1, t // 64)
    for grid in (lambda: {hi, *range(0, hi, coarse)},
                 lambda: set(range(best[1] - coarse + fine, best[1] + coarse, fine))):
        for n in sorted(n for n in grid() if lo <= n <= hi and n not in seen):
            seen.add(n)
            pr = at(n)
            if pr.time_s < best[0]:
                best = (pr.time_s, n, pr)
    return best[1], best[2]


def calibrated_crossover_s(calibration: Calibration | None, dims: MLADims, b: int, t: int,
                           device: str | Device | None = None, ceilings: str = "measured") -> int | None:
    """Smallest s in [1, t] where the expanded design's calibrated time is below the absorbed
    design's (the roofline's :func:`crossover_s` where no calibration applies); None if never.
    ``device``: the calibration's by default."""
    device = _device_of(calibration, device)
    slow, fast = (d.kernel for d in sorted((d for d in _TABLE if not d.split), key=lambda d: not d.latent))
    for s in range(1, t + 1):
        pr = Problem(b=b, s=s, t=t)
        f = calibrated_predict(calibration, fast, dims, pr, device=device, ceilings=ceilings)
        if f.source != "calibrated":
            return crossover_s(dims, b, t, device, ceilings, slow, fast)
        if f.time_s < calibrated_predict(calibration, slow, dims, pr, device=device, ceilings=ceilings).time_s:
            return s
    return None


def _winner(times: dict[str, float], hybrid_s: float) -> tuple[str, str]:
    """(best, best single): the hybrid only when it beats the best single design by the margin."""
    single = min(_SINGLES, key=lambda k: times[k])
    return (HYBRID if hybrid_s * (1 + HYBRID_MARGIN) < times[single] else single), single


@dataclass(frozen=True)
class RegimeRow:
    """One s of the guide: each design's roofline prediction (hybrid at its best n) and the
    winner; the calibrated prediction of each design's default call (hybrid at its own best n,
    ``calibrated_n``) and its winner."""

    s: int
    predictions: dict[str, Prediction]
    hybrid: HybridSplit
    best: str
    best_single: str
    calibrated: dict[str, CalibratedPrediction] = field(default_factory=dict)
    calibrated_n: int | None = None
    calibrated_best: str | None = None

    @property
    def times(self) -> dict[str, float]:
        return {name: pr.time_s for name, pr in self.predictions.items()}

    @property
    def calibrated_times(self) -> dict[str, float]:
        return {name: pr.time_s for name, pr in self.calibrated.items()}

    def to_dict(self) -> dict:
        return {
            "s": self.s,
            "times_s": self.times,
            "bounds": {name: pr.bound for name, pr in self.predictions.items()},
            "intensity": {name: pr.cost.intensity for name, pr in self.predictions.items()},
            "best": self.best,
            "best_single": self.best_single,
            "best_n": self.hybrid.n,
            "hybrid_gain": self.times[self.best_single] / self.hybrid.time_s - 1.0,
            "calibrated": {
                "times_s": self.calibrated_times,
                "gpu_s": {name: pr.gpu_s for name, pr in self.calibrated.items()},
                "host_s": {name: pr.host_s for name, pr in self.calibrated.items()},
                "backend": {name: pr.backend for name, pr in self.calibrated.items()},
                "source": {name: pr.source for name, pr in self.calibrated.items()},
                "best": self.calibrated_best,
                "best_n": self.calibrated_n,
            },
        }


@dataclass(frozen=True)
class RegimeEntry:
    """One line of the seed's regime table, recomputed."""

    regime: str
    s_range: str
    best: str
    why: str

    def to_dict(self) -> dict:
        return {"regime": self.regime, "s": self.s_range, "best": self.best, "why": self.why}


@dataclass(frozen=True)
class RegimeGuide:
    """The guide for one (dims, device, ceilings, b, t)."""

    model: str
    device: str
    ceilings: Ceilings
    b: int
    t: int
    fa_model: str
    rows: tuple[RegimeRow, ...]
    crossover_s: int | None
    prediction: str = "roofline"
    calibration: str = ""
    calibrated_crossover_s: int | None = None

    @property
    def regimes(self) -> list[RegimeEntry]:
        """The seed's table by the roofline."""
        return regime_table(self)

    @property
    def calibrated_regimes(self) -> list[RegimeEntry]:
        """The seed's table by the calibrated prediction (the roofline where none applies)."""
        return regime_table(self, calibrated=True)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "ceilings": self.ceilings.kind,
            "peak_flops_per_s": self.ceilings.flops_per_s,
            "bandwidth_bytes_per_s": self.ceilings.bytes_per_s,
            "ridge": self.ceilings.ridge,
            "b": self.b,
            "t": self.t,
            "flash_attention_model": self.fa_model,
            "hybrid_margin": HYBRID_MARGIN,
            "crossover_s": self.crossover_s,
            "rows": [r.to_dict() for r in self.rows],
            "regimes": [e.to_dict() for e in self.regimes],
            "prediction": self.prediction,
            "calibration": self.calibration,
            "calibrated_crossover_s": self.calibrated_crossover_s,
            "calibrated_regimes": [e.to_dict() for e in self.calibrated_regimes],
        }


def regime_guide(
    dims: MLADims,
    device: str | Device = "h200",
    b: int = 32,
    t: int = 4096,
    s_values=None,
    ceilings: str = "measured",
    fa_model: str = "flash_attention",
    calibration: Calibration | None = None,
) -> RegimeGuide:
    """Predict every design for each s (default :data:`DEFAULT_S` up to t).

    ``fa_model`` picks the FlashAttention byte count: the seed's ``flash_attention`` (RoPE key
    per head) or ``flash_attention_shared_kpe``. Rows are labelled ``flash_attention`` either way.
    ``calibration`` (:func:`~mla_var3.analysis.calibration.load_calibration`) gives the rows'
    calibrated predictions; without one (or for another device) they are the roofline's and the
    guide's ``prediction`` says ``"roofline"``.
    """
    dev, ceil = resolve_ceilings(device, dims, ceilings)
    s_values = sorted(set(s_values)) if s_values else [s for s in DEFAULT_S if s <= t]
    models = {**DESIGN_MODELS, "flash_attention": get_cost_model(fa_model)}
    rows = []
    for s in s_values:
        pr = Problem(b=b, s=s, t=t)
        split = _best_n_in(dims, pr, ceil, t)
        preds = {d.kernel: predict_cost(d.kernel, models[d.kernel](dims, pr.with_n(split.n) if d.split else pr), dev,
                                        ceil) for d in _TABLE}
        best, single = _winner({k: p.time_s for k, p in preds.items()}, split.time_s)
        cal = {k: calibrated_predict(calibration, k, dims, pr, device=dev, ceilings=ceilings) for k in _SINGLES}
        cal_n, cal[HYBRID] = calibrated_split(calibration, dims, pr, dev, ceilings)
        cal_best, _ = _winner({k: p.time_s for k, p in cal.items()}, cal[HYBRID].time_s)
        rows.append(RegimeRow(s, preds, split, best, single, cal, cal_n, cal_best))
    cross = crossover_s(dims, b, t, dev, ceilings, fast=fa_model)
    first = rows[0].calibrated[_SINGLES[0]] if rows else None
    calibrated = first is not None and first.source == "calibrated"
    note = (first.calibration or "") if calibrated else (first.note if first else "")
    cal_cross = calibrated_crossover_s(calibration, dims, b, t, dev, ceilings) if calibrated else cross
    return RegimeGuide(dims.name, dev.key, ceil, b, t, fa_model, tuple(rows), cross,
                       "calibrated" if calibrated else "roofline", note, cal_cross)


def _fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def _summarise(rows: list[RegimeRow], calibrated: bool = False) -> str:
    """'flash_mla' or 'flash_mla (s 2-8), mla_var6_plus (s 16-32)' from consecutive rows."""
    parts: list[tuple[str, int, int]] = []
    for r in rows:
        best = r.calibrated_best if calibrated else r.best
        if parts and parts[-1][0] == best:
            parts[-1] = (best, parts[-1][1], r.s)
        else:
            parts.append((best, r.s, r.s))
    if len(parts) == 1:
        return parts[0][0]
    return ", ".join(f"{name} (s {lo}-{hi})" if lo != hi else f"{name} (s {lo})" for name, lo, hi in parts)


def _at(r: RegimeRow, calibrated: bool = False) -> str:
    if calibrated:
        c = r.calibrated_times
        return (f"s={r.s}: " + ", ".join(f"{d.title} {_fmt_us(c[d.kernel])}" for d in _TABLE if not d.split)
                + f", {_HYBRID_TITLE} {_fmt_us(c[HYBRID])} (n={r.calibrated_n})")
    p = r.predictions
    return (
        f"s={r.s}: FlashAttention {_fmt_us(p['flash_attention'].time_s)} ({p['flash_attention'].bound}), "
        f"FlashMLA {_fmt_us(p['flash_mla'].time_s)} ({p['flash_mla'].bound}), "
        f"{_HYBRID_TITLE} {_fmt_us(r.hybrid.time_s)} (n={r.hybrid.n})"
    )


def regime_table(guide: RegimeGuide, calibrated: bool = False) -> list[RegimeEntry]:
    """The seed's decode / speculative / prefill table for the guide's rows (by the calibrated
    prediction with ``calibrated``).

    ``why`` quotes the predictions at the first and last s of the regime that the guide has.
    """
    entries = []
    for name, lo, hi in REGIMES:
        hi_v = guide.t if hi is None else hi
        rows = [r for r in guide.rows if lo <= r.s <= hi_v]
        if not rows:
            continue
        s_range = f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi is not None else f">{lo - 1}")
        ends = rows[:1] if len(rows) == 1 else [rows[0], rows[-1]]
        why = "; ".join(_at(r, calibrated) for r in ends)
        entries.append(RegimeEntry(name, s_range, _summarise(rows, calibrated), why))
    return entries

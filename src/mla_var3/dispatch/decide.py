"""Which MLA attention design to run for one call, and why: the calibrated model of the default
calls (the roofline at the device's ceilings where no calibration applies), overridden by
measured kernel times when there are some.

Designs (over a latent, paged latent or hybrid cache that already holds the s new tokens):

============  ==================  ================================================================
design        kernel              cost counted (per call, ``analysis.cost`` names)
============  ==================  ================================================================
``absorbed``  ``flash_mla``       absorb_query + flash_mla + decompress
``hybrid``    ``mla_var6_plus``   absorb_query + mla_var6_plus(n) + decompress (accumulating)
``expanded``  ``flash_attention`` expansion of the cached latent to K, V + flash attention
============  ==================  ================================================================

The expanded design needs K and V per head, which a latent cache does not hold: they are
rebuilt from the t cached latents for the call (:func:`expansion_cost`: ``2·b·t·k·h·(d + dv)``
FLOPs, reading Z and writing K, V: ``w·(b·t·k + h·k·(d + dv) + b·t·h·(d + dv))`` bytes; a paged
cache is gathered first, ``2·w·b·t·(k + p)`` more bytes), then FlashAttention reads them back.
That is a full expanded-cache write per call: it only pays off when s is large (prefill),
where the s-times-cheaper FLOPs per key dominate.

The hybrid needs a window of expanded tokens, so it is possible only over a
:class:`~mla_var3.model.HybridCache`. With latent copies of the window (the default) any split
``n <= window`` can run (the older window tokens are read as latent) and the dispatcher picks n;
without them n is the window and the absorbed design is impossible (the window has no latent).

Predicted time: with a calibration for the device (:mod:`mla_var3.analysis.calibration`; the
package ships the H200's), the calibrated eager time of the design's kernel (its default call)
plus the roofline time of the stages around it; the hybrid at the split n with the least
calibrated time. Without one (another device, fp8, ``calibration=None``), the roofline time of
the whole call, the hybrid at the roofline's best n; the decision says which (``prediction``).

Rule: among the possible designs the least predicted time wins; the hybrid must beat the best
single design by more than ``HYBRID_MARGIN`` (at small n it *is* FlashMLA, with extra passes).
Measured kernel times (:mod:`mla_var3.dispatch.measured`) override the model when they cover
the model's choice and at least one alternative: then the fastest measured design wins (its
measured kernel time plus the model's time for the stages around it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from mla_var3.analysis.calibration import Calibration, load_calibration, predict as calibrated_predict
from mla_var3.analysis.cost import Cost, design_pipeline, get_cost_model
from mla_var3.analysis.devices import Ceilings, Device, detect_device, get_device
from mla_var3.analysis.memory import max_window_n
from mla_var3.analysis.regime import HYBRID_MARGIN, calibrated_split, choose_n, crossover_s, regime_of
from mla_var3.analysis.roofline import roofline_time
from mla_var3.designs import CACHE_KINDS, DESIGNS as _TABLE, KERNELS, design as _design
from mla_var3.dispatch import measured as M
from mla_var3.shapes import MLADims, Problem, check_window

DESIGN_NAMES = tuple(d.name for d in _TABLE)
#: the kernel (and cost-model name) of each design.
KERNEL = MappingProxyType({d.name: d.kernel for d in _TABLE})
#: other accepted names when forcing a design.
ALIASES = MappingProxyType({alias: d.name for d in _TABLE for alias in (d.kernel, *d.aliases)})
_EXPANDED = next(d for d in _TABLE if not d.latent)
#: the FlashAttention byte count of our kernel (one RoPE key per token, not per head).
FA_COST_MODEL = KERNELS[_EXPANDED.kernel].cost_model


def canonical_design(name: str) -> str:
    """``"auto"``, a design of :data:`DESIGN_NAMES`, or an alias; ValueError naming the accepted ones."""
    if name == "auto" or name in DESIGN_NAMES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    raise ValueError(f"unknown design {name!r}; expected 'auto', one of {', '.join(DESIGN_NAMES)} "
                     f"or an alias ({', '.join(ALIASES)})")


@dataclass(frozen=True)
class CacheInfo:
    """What the cache allows: its ``kind`` ('latent', 'paged' or 'hybrid'), the hybrid's
    ``window`` n and whether the window tokens also have their latent (``latent_window``)."""

    kind: str = "latent"
    window: int = 0
    latent_window: bool = True

    def __post_init__(self) -> None:
        if self.kind not in CACHE_KINDS:
            raise ValueError(f"cache kind must be one of {', '.join(CACHE_KINDS)}, got {self.kind!r}")
        check_window(self.window, "cache window")

    @classmethod
    def of(cls, cache) -> "CacheInfo":
        """From a cache container of :mod:`mla_var3.model` (its ``kind``; a hybrid's window ``n``
        and ``keep_latent_window``)."""
        kind = getattr(cache, "kind", None)
        if kind == "expanded":
            raise ValueError("the dispatcher runs over a LatentCache, PagedLatentCache or HybridCache; an "
                             "ExpandedCache holds no latent (run it with MLALayer mode='naive')")
        if kind not in CACHE_KINDS:
            raise ValueError(f"cache must be a LatentCache, PagedLatentCache or HybridCache, got {type(cache).__name__}")
        return cls(kind, cache.n, cache.keep_latent_window) if kind == "hybrid" else cls(kind)


@dataclass(frozen=True)
class Estimate:
    """One design's numbers for one call: the model's prediction (``predicted_s``: calibrated or
    roofline, as ``prediction`` says; its ``bound``, FLOPs and bytes), the roofline time of the
    whole call (``roofline_s``), the calibrated kernel alone (``kernel_s``: its eager time, and
    ``kernel_gpu_s``, ``kernel_host_s``), the measured time when there is one, and why the design
    is impossible (``why_not``, empty when it can run)."""

    design: str
    n: int | None
    predicted_s: float
    bound: str
    flops: int
    bytes: int
    measured_s: float | None = None
    measured_n: int | None = None
    measured_from: str = ""
    why_not: str = ""
    prediction: str = "roofline"
    roofline_s: float | None = None
    kernel_s: float | None = None
    kernel_gpu_s: float | None = None
    kernel_host_s: float | None = None

    @property
    def possible(self) -> bool:
        return not self.why_not

    def to_dict(self) -> dict:
        return {"design": self.design, "kernel": KERNEL[self.design], "n": self.n, "possible": self.possible,
                "why_not": self.why_not or None, "predicted_s": self.predicted_s, "bound": self.bound,
                "flops": self.flops, "bytes": self.bytes, "intensity": self.flops / self.bytes,
                "measured_s": self.measured_s, "measured_n": self.measured_n,
                "measured_from": self.measured_from or None, "prediction": self.prediction,
                "roofline_s": self.roofline_s, "kernel_s": self.kernel_s, "kernel_gpu_s": self.kernel_gpu_s,
                "kernel_host_s": self.kernel_host_s}


@dataclass(frozen=True)
class Decision:
    """The design to run and its parameters.

    Attributes
    ----------
    design : str
        'absorbed', 'hybrid' or 'expanded'.
    n : int or None
        Hybrid split (newest tokens read expanded); None for the other designs.
    predicted_s, measured_s : Mapping[str, float]
        Model time of every possible design; measured time of those that have one.
    reason : str
        One or two sentences: the winner, its bound, the runner-up and the crossover.
    source : str
        'model' or 'measured': what decided (a forced design keeps the source of its numbers).
    forced : bool
        The caller named the design.
    estimates : tuple of Estimate
        Every design, possible or not, for ``explain``.
    prediction : str
        'calibrated' or 'roofline': what ``predicted_s`` is.
    calibration : str
        The calibration used (device, measurements, file), or why there is none.
    """

    design: str
    n: int | None
    predicted_s: Mapping[str, float]
    measured_s: Mapping[str, float]
    reason: str
    source: str
    forced: bool = False
    estimates: tuple[Estimate, ...] = field(default=(), repr=False)
    prediction: str = "roofline"
    calibration: str = ""

    @property
    def kernel(self) -> str:
        return KERNEL[self.design]

    def to_dict(self) -> dict:
        return {"design": self.design, "kernel": self.kernel, "n": self.n, "source": self.source,
                "forced": self.forced, "reason": self.reason, "prediction": self.prediction,
                "calibration": self.calibration, "predicted_s": dict(self.predicted_s),
                "measured_s": dict(self.measured_s), "estimates": [e.to_dict() for e in self.estimates]}


# ---------------------------------------------------------------------------------- costs


def expansion_cost(dims: MLADims, b: int, t: int, paged: bool = False) -> Cost:
    """Rebuild K, V [b, t, h, d] of t cached latents: ``k = W_UK z``, ``v = z W_UV`` per head.

    FLOPs ``2·b·t·k·h·(d + dv)``; bytes ``w·(b·t·k + h·k·(d + dv) + b·t·h·(d + dv))`` (read Z
    and the weights, write K and V); a paged cache is first gathered into a dense one
    (``2·w·b·t·(k + p)``: read the pages, write the copy).
    """
    h, d, dv, k, p, w = dims.h, dims.d, dims.dv, dims.k, dims.p, dims.w
    flops = 2 * b * t * k * h * (d + dv)
    nbytes = w * (b * t * k + h * k * (d + dv) + b * t * h * (d + dv))
    if paged:
        nbytes += 2 * w * b * t * (k + p)
    return Cost(flops, nbytes)


def design_cost(design: str, dims: MLADims, problem: Problem, cache: CacheInfo | str = "latent") -> Cost:
    """Everything one call of ``design`` costs, stages included (see the module table).

    For the expanded design over a hybrid cache only the t - window latent tokens are expanded
    (the window's K, V are read as they are).
    """
    cache = CacheInfo(cache) if isinstance(cache, str) else cache
    if design not in DESIGN_NAMES:
        raise ValueError(f"unknown design {design!r}; expected one of {', '.join(DESIGN_NAMES)}")
    d = _design(design)
    if d.latent:
        return design_pipeline(d.kernel, dims, problem)
    to_expand = problem.t - (min(cache.window, problem.t) if cache.kind == "hybrid" else 0)
    return expansion_cost(dims, problem.b, to_expand, cache.kind == "paged") + \
        get_cost_model(FA_COST_MODEL)(dims, problem)


def _stage_cost(design: str, dims: MLADims, problem: Problem, cache: CacheInfo) -> Cost:
    """The part of :func:`design_cost` that is not the attention kernel a benchmark times."""
    kernel_cost = get_cost_model(KERNELS[KERNEL[design]].cost_model)(dims, problem)
    full = design_cost(design, dims, problem, cache)
    return Cost(full.flops - kernel_cost.flops, full.bytes - kernel_cost.bytes)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


# ------------------------------------------------------------------------------ dispatcher


#: what :meth:`Dispatcher._recall` returns for a key never remembered (None is a value: no crossover)
_MISSING = object()


@dataclass(frozen=True)
class Dispatcher:
    """Picks the design per call from the cost model and measured times.

    Parameters
    ----------
    device : str, Device or None
        Devices-table key of the GPU the calls run on; None detects it (h200 without a GPU).
    ceilings : str
        'measured' (the device's measured ceilings when the table has them) or 'datasheet'.
    use_measured : bool
        Consult the autotune cache (and ``results``) for measured kernel times.
    results : tuple of paths
        Benchmark ``results.json`` files to read measured times from.
    autotune_path : path or None
        The autotune cache file (default: the user cache, see :mod:`mla_var3.runtime.autotune`).
    use_autotune : bool
        Read the autotune cache (False: ``results`` files only).
    dtype : str
        Element type the calls run in ('bf16', 'fp16' or 'fp8'); float32/float64 runs (CPU
        checks) are decided as bf16 ones.
    hybrid_margin : float
        The hybrid must beat the best single design by more than this fraction.
    window_budget_bytes : float or None
        Cap on the hybrid's expanded window of one sequence in one layer, ``n·h·2d·w`` bytes
        for the ``dims`` the calls pass (per tensor-parallel rank when they pass h/tp heads);
        the model's n is clamped to it (:func:`mla_var3.analysis.regime.choose_n`). None: no cap
        beyond the cache's own window.
    calibration : 'auto', path, Calibration or None
        The calibrated model: 'auto' (default) loads ``$MLA_VAR3_CALIBRATION`` or the file the
        package ships for the device (none: the roofline); a path or a
        :class:`~mla_var3.analysis.calibration.Calibration`; None: the roofline alone.

    Example
    -------
    >>> from mla_var3.shapes import get_preset, Problem
    >>> from mla_var3.dispatch import Dispatcher, CacheInfo
    >>> d = Dispatcher("h200", use_measured=False)
    >>> dims = get_preset("deepseek-v3")
    >>> dec = d.decide(dims, Problem(b=32, s=16, t=4096), CacheInfo("hybrid", 4096))
    >>> dec.design, dec.prediction
    ('absorbed', 'calibrated')
    >>> dec = Dispatcher("h200", use_measured=False, calibration=None).decide(
    ...     dims, Problem(b=32, s=16, t=4096), CacheInfo("hybrid", 4096))
    >>> dec.design, dec.n, dec.prediction               # the ideal roofline alone
    ('hybrid', 1190, 'roofline')
    """

    device: str | Device | None = "h200"
    ceilings: str = "measured"
    use_measured: bool = True
    results: tuple[str | Path, ...] = ()
    autotune_path: str | Path | None = None
    use_autotune: bool = True
    dtype: str = "bf16"
    hybrid_margin: float = HYBRID_MARGIN
    window_budget_bytes: float | None = None
    calibration: str | Path | Calibration | None = "auto"
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    # -- device ---------------------------------------------------------------------------
    def resolve_device(self) -> Device:
        if "device" not in self._memo:
            self._memo["device"] = detect_device()[0] if self.device is None else get_device(self.device)
        return self._memo["device"]

    def ceilings_for(self, dims: MLADims) -> Ceilings:
        return self.resolve_device().ceilings(self.ceilings, dims.w)

    def resolve_calibration(self) -> Calibration | None:
        """The calibration in use (see the ``calibration`` parameter), loaded once."""
        if "calibration" not in self._memo:
            c = self.calibration
            if isinstance(c, Calibration) or c is None:
                self._memo["calibration"] = c
            else:
                self._memo["calibration"] = load_calibration(None if c == "auto" else c, device=self.resolve_device())
        return self._memo["calibration"]

    # -- measured -------------------------------------------------------------------------
    def measurements(self, dims: MLADims, problem: Problem) -> list[M.Measurement]:
        """Measured kernel times for this call's shape (results files first, then the cache)."""
        if not self.use_measured:
            return []
        key = ("measured", dims, problem.b, problem.s, problem.t)
        found = self._recall(key)
        if found is _MISSING:
            dev = self.resolve_device().key
            found = M.from_results(self.results, dev, dims, problem, self.dtype) if self.results else []
            have = {(m.kernel, m.n) for m in found}
            if self.use_autotune:
                found += [m for m in M.from_autotune(dev, dims, problem, self.dtype, self.autotune_path)
                          if (m.kernel, m.n) not in have]
            self._remember(key, found)
        return found

    #: decisions (and measurements, crossovers) kept per shape, the oldest dropped beyond this
    #: many: a long-running server asks for one per shape bucket, never a growing number
    MAX_REMEMBERED = 512

    def _recall(self, key):
        """What was remembered under ``key``, or :data:`_MISSING`."""
        return self._memo.get(key, _MISSING)

    def _remember(self, key, value) -> None:
        """Keep ``value`` under ``key``, dropping the oldest remembered shape beyond
        :attr:`MAX_REMEMBERED` (the device and calibration entries stay)."""
        memo = self._memo
        shapes = memo.setdefault("shapes", [])
        if key not in memo:
            shapes.append(key)
            if len(shapes) > self.MAX_REMEMBERED:
                memo.pop(shapes.pop(0), None)
        memo[key] = value

    # -- the decision ---------------------------------------------------------------------
    def decide(self, dims: MLADims, problem: Problem, cache: CacheInfo | None = None, design: str = "auto",
               n: int | None = None) -> Decision:
        """The design (and hybrid n) for one call.

        ``problem`` is (b, s, t) of the call, t counting the s new tokens (its ``n`` is
        ignored). ``design`` forces a design ('auto' decides); ``n`` forces the hybrid split
        (only with the hybrid, at most the cache's window). Raises ValueError for an
        impossible request: the hybrid over a cache without a window, the absorbed design over
        a hybrid cache without latent copies of its window, an n the cache cannot run.
        """
        cache = cache or CacheInfo()
        design = canonical_design(design)
        if n is not None and design != "hybrid":
            raise ValueError(f"n={n} applies to the hybrid design only (design={design!r})")
        key = ("decision", dims, problem.b, problem.s, problem.t, cache, design, n)
        decision = self._recall(key)
        if decision is _MISSING:
            decision = self._decide(dims, Problem(problem.b, problem.s, problem.t, causal=problem.causal), cache,
                                    design, n)
            self._remember(key, decision)
        return decision

    def _hybrid_range(self, cache: CacheInfo, t: int) -> tuple[int, int] | str:
        """(n_min, n_max) the cache can run, or why the hybrid is impossible."""
        if cache.kind not in _design("hybrid").caches:
            return f"no window: a {cache.kind} cache holds no expanded tokens"
        if cache.window == 0:
            return "no window: the HybridCache has n = 0"
        top = min(cache.window, t)
        return (0, top) if cache.latent_window else (top, top)

    def _decide(self, dims, problem, cache, design, n_forced) -> Decision:
        ceil = self.ceilings_for(dims)
        s, t = problem.s, problem.t
        dev, cal = self.resolve_device(), self.resolve_calibration()
        kernels = {d: calibrated_predict(cal, KERNEL[d], dims, problem, n=0 if _design(d).split else None, device=dev,
                                         ceilings=self.ceilings) for d in DESIGN_NAMES}
        calibrated = all(k.source == "calibrated" for k in kernels.values())
        rng, n_h = self._split(dims, problem, cache, n_forced, calibrated)
        hybrid_why = rng if isinstance(rng, str) else ""
        no_latent_window = cache.kind == "hybrid" and not cache.latent_window
        why_not = {d: hybrid_why if d == "hybrid" else
                   "no latent copy of the window (keep_latent_window=False)" if d == "absorbed" and no_latent_window
                   else "" for d in DESIGN_NAMES}
        # ---- model estimates: the calibrated kernel plus the stages' roofline, else the roofline
        estimates: dict[str, Estimate] = {}
        for d in DESIGN_NAMES:
            pr = problem.with_n(n_h) if d == "hybrid" else problem
            c = design_cost(d, dims, pr, cache)
            time_s, bound = roofline_time(c, ceil)
            est = Estimate(d, n_h if d == "hybrid" else None, time_s, bound, c.flops, c.bytes, why_not=why_not[d],
                           roofline_s=time_s)
            if calibrated:
                k = kernels[d] if d != "hybrid" else calibrated_predict(cal, KERNEL[d], dims, pr, device=dev,
                                                                         ceilings=self.ceilings)
                stage_s = roofline_time(_stage_cost(d, dims, pr, cache), ceil)[0]
                est = replace(est, predicted_s=k.time_s + stage_s, prediction="calibrated", kernel_s=k.time_s,
                              kernel_gpu_s=k.gpu_s, kernel_host_s=k.host_s,
                              bound="host" if k.host_s is not None and k.host_s >= k.gpu_s else bound)
            estimates[d] = est
        if n_h == 0 and not hybrid_why and not calibrated:
            # no window: the hybrid call runs the absorbed design (kernel.hybrid); calibrated, it
            # also pays its own host work (kernel_laws: n0_host_us)
            estimates["hybrid"] = replace(estimates["absorbed"], design="hybrid", n=0, why_not="")
        # ---- measured kernel times (plus the model's stage times)
        for m_design, m in self._measured_by_design(dims, problem, cache, rng, n_forced).items():
            e = estimates[m_design]
            pr = problem.with_n(min(m.n, t)) if m_design == "hybrid" else problem
            stage_s = roofline_time(_stage_cost(m_design, dims, pr, cache), ceil)[0]
            estimates[m_design] = replace(e, measured_s=m.time_s + stage_s, measured_n=m.n, measured_from=m.source)
        possible = [e for e in estimates.values() if e.possible]
        predicted = MappingProxyType({e.design: e.predicted_s for e in possible})
        measured = MappingProxyType({e.design: e.measured_s for e in possible if e.measured_s is not None})
        ests = tuple(estimates[d] for d in DESIGN_NAMES)
        context = self._context(dims, problem, ceil)
        prediction = "calibrated" if calibrated else "roofline"
        cal_note = (kernels["absorbed"].calibration or "") if calibrated else kernels["absorbed"].note
        context = (f"Predicted: the calibrated default calls ({cal_note}) plus the stages' roofline. " if calibrated
                   else f"Predicted: the ideal roofline ({cal_note}). ") + context

        if design != "auto":
            return self._forced(design, estimates[design], predicted, measured, ests, prediction, cal_note, context)

        # ---- the model's choice
        singles = [e for e in possible if e.design != "hybrid"]
        best_single = min(singles, key=lambda e: e.predicted_s)
        hyb = estimates["hybrid"]
        if hyb.possible and hyb.predicted_s * (1 + self.hybrid_margin) < best_single.predicted_s:
            choice = hyb
        else:
            choice = best_single
        others = sorted((e for e in possible if e is not choice), key=lambda e: e.predicted_s)
        reason = self._model_reason(choice, others, hyb, best_single, s) + " " + context
        source = "model"
        # ---- measured override
        if choice.measured_s is not None and len(measured) >= 2:
            fastest = min((e for e in possible if e.measured_s is not None), key=lambda e: e.measured_s)
            rest = sorted((e for e in possible if e.measured_s is not None and e is not fastest),
                          key=lambda e: e.measured_s)
            verb = "confirms" if fastest.design == choice.design else "overrides"
            reason = (f"measured {verb} the model: {fastest.design}"
                      + (f" n={fastest.measured_n}" if fastest.design == "hybrid" else "")
                      + f" {_us(fastest.measured_s)} vs "
                      + ", ".join(f"{e.design} {_us(e.measured_s)}" for e in rest)
                      + f" (kernel measured, stages modelled; {fastest.measured_from}). Model: " + reason)
            choice, source = fastest, "measured"
        n_out = None
        if choice.design == "hybrid":
            n_out = choice.measured_n if source == "measured" and choice.measured_n is not None else choice.n
            n_out = min(n_out, t)
        return Decision(choice.design, n_out, predicted, measured, reason, source, False, ests, prediction, cal_note)

    def _split(self, dims, problem, cache, n_forced, calibrated: bool) -> tuple:
        """``(the n the cache allows: (lo, hi), or why the hybrid is impossible; the hybrid's n)``:
        ``n_forced`` (ValueError where the cache cannot run it), else the model's best split."""
        t = problem.t
        rng = self._hybrid_range(cache, t)
        if isinstance(rng, str):
            return rng, 0
        lo, hi = rng
        if n_forced is not None:
            if not isinstance(n_forced, int) or not lo <= n_forced <= hi:
                raise ValueError(f"hybrid n={n_forced!r} is not possible here: the cache runs n in [{lo}, {hi}] "
                                 f"(window {cache.window}, t={t}"
                                 + (", no latent copies of the window)" if not cache.latent_window else ")"))
            return rng, n_forced
        dev = self.resolve_device()
        if calibrated:
            if self.window_budget_bytes is not None:
                hi = max(lo, min(hi, max_window_n(dims, self.window_budget_bytes)))
            return rng, calibrated_split(self.resolve_calibration(), dims, problem, dev, self.ceilings, lo, hi)[0]
        return rng, min(max(choose_n(dims, problem, dev, ceilings=self.ceilings,
                                     window_budget_bytes=self.window_budget_bytes).n, lo), hi)

    @staticmethod
    def _forced(design: str, e: Estimate, predicted, measured, ests, prediction, cal_note, context) -> Decision:
        """The decision of a forced design (ValueError where it cannot run over the cache)."""
        if not e.possible:
            hint = (" (use a HybridCache with a window n > 0, or design 'absorbed' or 'expanded')"
                    if design == "hybrid" else " (use a HybridCache with keep_latent_window=True)")
            raise ValueError(f"design {design!r} is not possible over this cache: {e.why_not}{hint}")
        src = "measured" if e.measured_s is not None else "model"
        n_out = e.n if design == "hybrid" else None
        reason = f"forced: {design}" + (f" n={n_out}" if n_out is not None else "") + \
            f", predicted {_us(e.predicted_s)} ({e.bound}-bound). " + context
        return Decision(design, n_out, predicted, measured, reason, src, True, ests, prediction, cal_note)

    def _measured_by_design(self, dims, problem, cache, rng, n_forced) -> dict[str, M.Measurement]:
        """The measurement that stands for each design (the hybrid: its fastest allowed split)."""
        out: dict[str, M.Measurement] = {}
        by_kernel = {v: k for k, v in KERNEL.items()}
        for m in self.measurements(dims, problem):
            d = by_kernel[m.kernel]
            if d == "hybrid":
                if isinstance(rng, str):
                    continue
                lo, hi = rng
                n_m = min(m.n, problem.t)
                if not lo <= n_m <= hi or (n_forced is not None and n_m != n_forced):
                    continue
                m = M.Measurement(m.kernel, n_m, m.time_s, m.source, m.exact)
            if d not in out or m.time_s < out[d].time_s:
                out[d] = m
        return out

    # -- the words ------------------------------------------------------------------------
    def _model_reason(self, choice: Estimate, others: list[Estimate], hyb: Estimate, best_single: Estimate,
                      s: int) -> str:
        name = choice.design + (f" n={choice.n}" if choice.design == "hybrid" else "")
        text = f"{regime_of(s)} (s={s}): {name} predicted {_us(choice.predicted_s)} ({choice.bound}-bound)"
        if others:
            runner = others[0]
            ratio = runner.predicted_s / choice.predicted_s
            if ratio >= 1:
                faster = (f"{ratio - 1.0:.1%}" if ratio < 2 else f"{ratio:,.1f}x") + " faster than"
            else:  # kept over a slightly faster hybrid (within the margin)
                faster = f"{1.0 - ratio:.1%} slower than"
            text += (f", {faster} {runner.design} {_us(runner.predicted_s)} ({runner.bound}-bound)"
                     + "".join(f", {e.design} {_us(e.predicted_s)} ({e.bound}-bound)" for e in others[1:]))
        if choice is best_single and hyb.possible:
            text += (f"; the hybrid's best split n={hyb.n} ({_us(hyb.predicted_s)}) does not beat it by more than "
                     f"{self.hybrid_margin:.0%}")
        return text + "."

    def _context(self, dims: MLADims, problem: Problem, ceil: Ceilings) -> str:
        key = ("cross", dims, problem.b, problem.t)
        cross = self._recall(key)
        if cross is _MISSING:
            cross = crossover_s(dims, problem.b, problem.t, self.resolve_device(), self.ceilings, fast=FA_COST_MODEL)
            self._remember(key, cross)
        dev = self.resolve_device()
        where = (f"FlashAttention overtakes FlashMLA (kernels alone) at s >= {cross}" if cross is not None
                 else "FlashAttention never overtakes FlashMLA (kernels alone) for s <= t")
        return (f"Ridge {ceil.ridge:,.0f} FLOP/byte on {dev.name} ({ceil.kind} ceilings); the roofline says {where} "
                f"for b={problem.b}, t={problem.t}.")


def dims_for_dtype(dims: MLADims, dtype) -> tuple[MLADims, str]:
    """(dims with w set, dtype name) for a torch dtype or a dtype name; float32/float64 -> bf16."""
    name = str(dtype).replace("torch.", "")
    table = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "float8_e4m3fn": "fp8",
             "float8_e5m2": "fp8", "fp8": "fp8"}
    label = table.get(name, "bf16")
    return dims.with_dtype(label), label


def decide(dims: MLADims, problem: Problem, cache: CacheInfo | None = None, design: str = "auto",
           n: int | None = None, device: str | Device | None = "h200", **options) -> Decision:
    """``Dispatcher(device, **options).decide(dims, problem, cache, design, n)``."""
    return Dispatcher(device, **options).decide(dims, problem, cache, design, n)


__all__ = ["DESIGN_NAMES", "KERNEL", "ALIASES", "CacheInfo", "Estimate", "Decision", "Dispatcher", "decide",
           "design_cost", "expansion_cost", "regime_of", "canonical_design", "dims_for_dtype", "grid_check"]



def grid_check(results, dims: MLADims, device: str | Device = "h200", cache: CacheInfo | None = None,
               dtype: str = "bf16", calibration="auto") -> list[dict]:
    """Compare the model's choice with the measured-fastest design at every (b, s, t) of
    benchmark ``results`` files (``results.json`` of ``mla-var3 bench``).

    Per point: the model's design (measured times ignored), the measured-fastest design (kernel
    time measured, stages modelled, as the dispatcher counts them), and ``miss_pct``: how much
    slower the model's choice measured than the fastest (0 when they agree; None when the model's
    choice has no measurement). ``cache`` defaults to a hybrid cache whose window is t;
    ``calibration`` is the model's (:class:`Dispatcher`'s parameter).
    """
    from mla_var3.dispatch.measured import result_records

    paths = tuple(results)
    points = sorted({(r.b, r.s, r.t) for p in paths for r in result_records(p)[1]
                     if r.kind == "design" and r.status == "ok"})
    model = Dispatcher(device, use_measured=False, dtype=dtype, calibration=calibration)
    meas = Dispatcher(device, results=paths, use_autotune=False, dtype=dtype)
    rows = []
    for b, s, t in points:
        info = cache or CacheInfo("hybrid", t)
        pr = Problem(b=b, s=s, t=t)
        chosen = model.decide(dims, pr, info)
        ests = {e.design: e for e in meas.decide(dims, pr, info).estimates if e.possible and e.measured_s is not None}
        row = {"b": b, "s": s, "t": t, "model": chosen.design, "model_n": chosen.n, "measured_best": None,
               "measured_best_n": None, "miss_pct": None, "measured_s": {d: e.measured_s for d, e in ests.items()}}
        if ests:
            best = min(ests.values(), key=lambda e: e.measured_s)
            row["measured_best"], row["measured_best_n"] = best.design, best.measured_n
            if chosen.design in ests:
                row["miss_pct"] = 100.0 * (ests[chosen.design].measured_s / best.measured_s - 1.0)
        rows.append(row)
    return rows

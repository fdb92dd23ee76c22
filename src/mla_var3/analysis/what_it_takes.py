"""What a losing design would need to win: the efficiency each part would have to reach, from
the calibrated laws (:mod:`mla_var3.analysis.kernel_laws`) and a calibration's parameters.

For a single design (absorbed, expanded) the rate of its dominant term is raised until its
calibrated GPU time meets the target: the tile steps' fraction of the compute ceiling when the
tiles bound it, the key/value stream's rate when the stream does; and its host time per call
when the eager call is host-bound. For the hybrid, the resource law: its latent part at the
absorbed kernel's calibrated rate over the o old keys, its window part streaming the n new
keys' bytes at r per SM on all SMs, the parts overlapped as calibrated, plus its merge and fixed
costs; the least r over the n the cache allows, beside the rate its default call reaches and what
the chip reads from HBM at each SM count (the device's measured ``read_by_sms``): the window on an
SM partition, the latent part on the other SMs, needs r' per SM on m SMs against what m SMs read
and, where measured (``window_by_sms``), what the window design's own loads and products stream
from m SMs (its shared memory's ceiling, below the HBM's at small counts).

>>> from mla_var3.analysis.calibration import load_calibration
>>> from mla_var3.shapes import Problem, get_preset
>>> r = requirement(load_calibration(device="h200"), "mla_var6_plus", get_preset("deepseek-v3"),
...                 Problem(b=32, s=16, t=4096), 1000e-6)
>>> r.startswith("the hybrid would need its window at >= ")
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mla_var3.analysis.calibration import Calibration, law_breakdown, predict
from mla_var3.analysis.cost import flash_attention_shared_kpe
from mla_var3.analysis.devices import get_device
from mla_var3.designs import DESIGNS
from mla_var3.shapes import MLADims, Problem

_LATENT = next(d.kernel for d in DESIGNS if d.latent and not d.split)
_HYBRID = next(d.kernel for d in DESIGNS if d.split)
_NAMES = {d.kernel: f"the {d.name} design" for d in DESIGNS} | {_HYBRID: "the hybrid"}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def _scaled_gpu_s(cal: Calibration, kernel: str, backend: str, dims: MLADims, problem: Problem, names: list[str],
                  factor: float) -> float:
    params = {n: dataclasses.replace(cal.parameters[n], value=cal.parameters[n].value * factor) for n in names}
    return law_breakdown(cal.with_parameters(params), kernel, backend, dims, problem).gpu_s


def _factor_for(fn, target_s: float, top: float = 1e3) -> float | None:
    """The least factor f in [1, top] with fn(f) <= target_s (fn decreasing), None if none."""
    if fn(top) > target_s:
        return None
    lo, hi = 1.0, top
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if fn(mid) <= target_s else (mid, hi)
    return hi


_TERM_WORDS = {"compute_s": "its tile compute", "memory_s": "its key/value stream", "fixed_s": "its fixed cost",
               "combine_s": "its split-KV combine"}


def _gpu_need(cal: Calibration, kernel: str, dims: MLADims, problem: Problem, target_s: float, pr) -> str:
    """The rate the dominant term would need (both rates together when that alone cannot)."""
    backend, terms, machine = pr.backend, pr.terms, cal.machine()
    prefix, family = f"{kernel}.{backend}.", pr.info.get("family")

    def names(key: str) -> list[str]:
        """The parameters of ``key`` (the tile family's own when it has one: m16 reads m64's compute)."""
        every = [n for n in cal.parameters if n.startswith(prefix + key)]
        return [n for n in every if family and n.endswith(family)] or every

    stream = terms.get("memory_s", 0.0) > terms.get("compute_s", 0.0) and names("bandwidth_efficiency")
    key = "bandwidth_efficiency" if stream else "compute_efficiency"
    chosen = names(key)

    def gpu(names_: list[str]):
        return lambda x: _scaled_gpu_s(cal, kernel, backend, dims, problem, names_, x)

    f = _factor_for(gpu(chosen), target_s)
    if f is not None:
        base = cal.parameters[chosen[0]].value
        if stream:
            rate = machine.bytes_per_s * base
            return (f"its key/value stream at >= {rate * f / 1e9:,.0f} GB/s (calibrated {rate / 1e9:,.0f}; copy rate "
                    f"{machine.bytes_per_s / 1e9:,.0f})")
        per = "one SM's share of " if kernel == _LATENT else ""
        reach = " — beyond the ceiling" if base * f > 1 else ""
        return f"its tile steps at >= {base * f:.0%} of {per}the compute ceiling (calibrated {base:.0%}){reach}"
    both = names("bandwidth_efficiency") + names("compute_efficiency")
    f = _factor_for(gpu(both), target_s)
    if f is not None:
        return (f"its key/value stream and its tile steps both {f:,.1f}x their calibrated rates (the "
                f"{'stream' if stream else 'tiles'} alone cannot: {_TERM_WORDS['compute_s' if stream else 'memory_s']} "
                f"takes {_us(terms.get('compute_s' if stream else 'memory_s', 0.0))})")
    top = max((t for t in _TERM_WORDS if t != "memory_s" or stream), key=lambda t: terms.get(t, 0.0))
    return (f"its GPU time at <= {_us(target_s)}, which faster steps cannot reach: {_TERM_WORDS[top]} takes "
            f"{_us(terms.get(top, 0.0))}")


def _single(cal: Calibration, kernel: str, dims: MLADims, problem: Problem, target_s: float, pr) -> str:
    needs = []
    if pr.host_s is not None and pr.host_s > target_s:
        needs.append(f"its host time per call at <= {_us(target_s)} (calibrated {_us(pr.host_s)})")
    if pr.gpu_s > target_s:
        needs.append(_gpu_need(cal, kernel, dims, problem, target_s, pr))
    if not needs:
        return ""
    return f"{_NAMES[kernel]} would need " + " and ".join(needs)


@dataclass(frozen=True)
class HybridNeed:
    """The window rate the hybrid would need: ``rate`` (B/s per SM) at split ``n``, beside the rate
    its default call's window reaches there (``own_rate``, None without a window part)."""

    rate: float
    n: int
    own_rate: float | None


def _parts(cal: Calibration, dims: MLADims, problem: Problem, n: int, device, ceilings: str):
    """(latent part's time at the absorbed kernel's rate, window bytes, part overlap, merge +
    zero-fill + fixed time) of the resource law at split n."""
    t, s = problem.t, problem.s
    o = t - n
    lat = law_breakdown(cal, _LATENT, cal.default_backend(_LATENT, problem), dims,
                        Problem(b=problem.b, s=s, t=max(o, s), causal=problem.causal and n < s)).gpu_s if o > 0 else 0.0
    win_bytes = flash_attention_shared_kpe(dims, Problem(b=problem.b, s=min(s, n), t=n)).bytes if n else 0
    own = predict(cal, _HYBRID, dims, problem, n=n, device=device, ceilings=ceilings)
    rest = sum(own.terms.get(k, 0.0) for k in ("merge_s", "zero_fill_s", "fixed_s"))
    return lat, win_bytes, own.info.get("part_overlap", 0.0), rest, own


def resource_law_s(cal: Calibration, dims: MLADims, problem: Problem, n: int, rate: float, device=None,
                   ceilings: str = "measured") -> float:
    """The hybrid's time by the resource law: its latent part at the absorbed kernel's calibrated
    rate over the o = t - n old keys, its window part streaming the n new keys' bytes at ``rate``
    (B/s per SM) on all SMs, overlapped as the calibration's ``part_overlap`` says, plus the
    calibrated merge, zero-fill and fixed costs of its default call."""
    lat, win_bytes, ov, rest, _ = _parts(cal, dims, problem, n, device, ceilings)
    win = win_bytes / (rate * cal.machine().sms)
    return max(lat, win) + (1 - ov) * min(lat, win) + rest


def hybrid_need(cal: Calibration, dims: MLADims, problem: Problem, target_s: float, lo: int = 0, hi: int | None = None,
                device=None, ceilings: str = "measured") -> HybridNeed | None:
    """The least window rate per SM at which :func:`resource_law_s` meets ``target_s`` for some n
    in [lo, hi] (n < t unless the cache fixes n = t: a split keeps some latent keys); None when
    no rate can (the latent part and the merge alone exceed the target)."""
    m, t = cal.machine(), problem.t
    hi = t if hi is None else min(hi, t)
    step = max(1, t // 64)
    ns = {hi, *(n for n in range(step, hi, step) if n >= lo)} - {0}
    if lo < t:
        ns = (ns - {t}) | ({t - step} if hi == t and lo < t - step else set())
    best = None
    for n in sorted(ns):
        lat, win_bytes, ov, rest, own = _parts(cal, dims, problem, n, device, ceilings)
        slack = target_s - rest
        if slack <= lat:
            continue
        # the longest window time w with max(lat, w) + (1 - ov) * min(lat, w) <= slack
        w = slack - (1 - ov) * lat
        if w < lat:
            w = (slack - lat) / (1 - ov)
        rate = win_bytes / (w * m.sms)
        if best is None or rate < best.rate:
            own_win = own.terms.get("window_s") or 0.0
            best = HybridNeed(rate, n, win_bytes / (own_win * m.sms) if own_win else None)
    return best


@dataclass(frozen=True)
class PartitionNeed:
    """The window on an SM partition against the chip: at split ``n`` with the window on ``sms``
    SMs (the latent part on the others, at the absorbed kernel's calibrated rate), the window
    needs ``rate`` B/s per SM; the chip's HBM reads give ``chip`` B/s per SM at that count, and
    the window design's loads and products ``design`` (None where not measured)."""

    n: int
    sms: int
    rate: float
    chip: float
    design: float | None = None

    @property
    def gives(self) -> float:
        """What that many SMs can stream for the window: the lesser of the two ceilings."""
        return self.chip if self.design is None else min(self.chip, self.design)


def partition_need(cal: Calibration, dims: MLADims, problem: Problem, target_s: float, lo: int = 0,
                   hi: int | None = None, device=None, ceilings: str = "measured") -> PartitionNeed | None:
    """The (n, SMs) at which a window on part of the GPU comes closest to what it can stream
    there (:attr:`PartitionNeed.gives`): the least need ÷ give over the n the cache allows and the window's SM counts m, where the
    latent part, on the other SMs, still ends by ``target_s`` less the merge (its whole-GPU time x
    SMs / (SMs - m)). None without the device's measured HBM reads by SM count
    (``Device.read_by_sms``), or when the latent part alone is too long."""
    dev = get_device(device if device is not None else cal.device)
    m_all, t = cal.machine().sms, problem.t
    if not dev.read_by_sms:
        return None
    hi = t if hi is None else min(hi, t)
    step = max(1, t // 64)
    best = None
    for n in sorted({hi, *(n for n in range(step, hi, step) if n >= lo)} - {0}):
        lat, win_bytes, _ov, rest, _own = _parts(cal, dims, problem, n, device, ceilings)
        slack = target_s - rest
        for m in range(1, m_all):
            if lat * m_all / (m_all - m) > slack:
                break
            design = dev.window_bandwidth(m, problem.s)
            need = PartitionNeed(n, m, win_bytes / (slack * m), dev.read_bandwidth(m) / m,
                                 None if design is None else design / m)
            if best is None or need.rate / need.gives < best.rate / best.gives:
                best = need
    return best


def _partition_text(need: PartitionNeed | None, device) -> str:
    if need is None:
        return ""
    text = (f"; on an SM partition (the window on some SMs, the latent part on the others at the absorbed rate) "
            f"at best {need.rate / 1e9:,.0f} GB/s per SM on {need.sms} SMs at n = {need.n}, where the chip reads "
            f"{need.chip / 1e9:,.0f} per SM from HBM")
    if need.design is None:
        return text + (": within what the chip reads" if need.rate <= need.chip else ": more than the chip reads")
    text += f" and the window kernel's loads and products alone stream {need.design / 1e9:,.0f}"
    if need.rate <= need.gives:
        return text + ": within both"
    return text + (": more than its shared memory passes" if need.rate <= need.chip else ": more than either")


def _hybrid(cal: Calibration, dims: MLADims, problem: Problem, target_s: float, lo: int, hi: int, device,
            ceilings: str) -> str:
    need = hybrid_need(cal, dims, problem, target_s, lo, hi, device, ceilings)
    host = predict(cal, _HYBRID, dims, problem, n=0, device=device, ceilings=ceilings).host_s
    host_text = (f" and its host time per call at <= {_us(target_s)} (calibrated {_us(host)})"
                 if host is not None and host > target_s else "")
    if need is None:
        return (f"the hybrid cannot win here: with its latent part at {_NAMES[_LATENT]}'s rate and a free window, "
                f"its latent part plus the merge already take more than {_us(target_s)}")
    m, t = cal.machine(), problem.t
    text = f"the hybrid would need its window at >= {need.rate / 1e9:,.0f} GB/s per SM at n = {need.n} ("
    text += f"its default call's window: {need.own_rate / 1e9:,.0f}; " if need.own_rate else ""
    text += f"the copy rate shared by all SMs is {m.bytes_per_s / m.sms / 1e9:,.0f} per SM)"
    if need.n < t:       # per latent key over the whole context (the steady rate, not one short part's)
        full = law_breakdown(cal, _LATENT, cal.default_backend(_LATENT, problem), dims, problem).gpu_s * m.sms / t * 1e6
        own_lat = predict(cal, _HYBRID, dims, problem, n=0, device=device, ceilings=ceilings).info.get(
            "sm_us_per_latent_key")
        text += (f" and its latent part at {_NAMES[_LATENT]}'s rate ({full:,.0f} SM·µs per latent key"
                 + (f"; its own {own_lat:,.0f}" if own_lat else "") + ")")
    return text + _partition_text(partition_need(cal, dims, problem, target_s, lo, hi, device, ceilings), device) \
        + host_text


def requirement(calibration: Calibration | None, kernel: str, dims: MLADims, problem: Problem, target_s: float, *,
                n_range: tuple[int, int] | None = None, device=None, ceilings: str = "measured") -> str:
    """One sentence: what ``kernel``'s default call would need for its kernel time to reach
    ``target_s`` on ``problem`` ("" when it already does, or when no calibration applies: the
    roofline assumes every kernel at its ceilings). ``n_range`` bounds the hybrid's split."""
    pr = predict(calibration, kernel, dims, problem, n=0 if kernel == _HYBRID else None, device=device,
                 ceilings=ceilings)
    if pr.source != "calibrated" or target_s <= 0:
        return ""
    if kernel == _HYBRID:
        lo, hi = n_range or (0, problem.t)
        return _hybrid(calibration, dims, problem, target_s, lo, min(hi, problem.t), device, ceilings)
    if pr.time_s <= target_s:
        return ""
    return _single(calibration, kernel, dims, problem, target_s, pr)


__all__ = ["HybridNeed", "PartitionNeed", "hybrid_need", "partition_need", "requirement", "resource_law_s"]

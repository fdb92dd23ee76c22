"""The one adapter between the measurement code and the kernel / analysis modules.

Every lookup of a kernel launcher, its launch-config functions and the inputs it takes goes
through here; which kernels exist, where they live and what they cost comes from the design
table (:mod:`mla_var3.designs`).

Designs measured: ``flash_attention`` (expanded), ``flash_mla`` (absorbed), ``mla_var6_plus``
(hybrid); stages ``absorb_query`` and ``decompress`` around the absorbed designs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mla_var3.designs import DESIGNS as _TABLE, KERNELS, design as _design
from mla_var3.shapes import MLADims, Problem

#: the three attention designs, by kernel name.
DESIGNS = tuple(d.kernel for d in _TABLE)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_designs(text: str) -> list[str]:
    """``"all"`` or a comma list of design names -> list; ValueError naming the known ones."""
    if text.strip() == "all":
        return list(DESIGNS)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in DESIGNS]
    if bad or not names:
        raise ValueError(f"unknown design(s) {', '.join(bad) or repr(text)}; known: {', '.join(DESIGNS)} or 'all'")
    return names


def torch_dtype(name: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(TORCH_DTYPES)}") from None


def candidate_configs(name: str, dims: MLADims, problem: Problem, dtype: str = "bf16", device="cuda") -> list:
    """Launcher ``name``'s autotuning space (its default among them; ``dtype`` does not change
    it). The design modules take ``(dims, problem)`` themselves; the absorbed module keeps its
    launcher's sizes and the GEMM module serves two launchers, so their sizes are spelled out."""
    fn, pr, device = importlib.import_module(KERNELS[name].module).candidate_configs, problem, torch.device(device)
    if name == "flash_mla":              # rows of one sequence: heads x queries
        return list(fn(pr.b, dims.h * pr.s, pr.t, dims.k, dims.p, device=device))
    if name == "absorb_query":           # rows = b * s; per head d -> k
        return list(fn(pr.b * pr.s, dims.d, dims.k))
    if name == "decompress":             # rows = b * s; per head k -> dv
        return list(fn(pr.b * pr.s, dims.k, dims.dv))
    return list(fn(dims, pr, device=device))


# --------------------------------------------------------------------------------------------
# inputs


def design_inputs(name: str, dims: MLADims, problem: Problem, *, dtype: str = "bf16", device="cuda",
                  seed: int = 0) -> dict:
    """Random keyword arguments for launcher ``name`` in the public layouts (scale included).

    Values are N(0, 1) drawn on ``device`` (fast at benchmark sizes); each design gets only its
    own tensors, so this is for timing and single-design checks. The cross-design invariant
    (same tokens and weights for all designs) is what ``mla_var3.reference.make_inputs`` is for.
    """
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    d, p, k, dv = dims.d, dims.p, dims.k, dims.dv
    dt = torch_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std=1.0):
        x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
        return (x * std).to(dt)

    scale = dims.default_scale
    if name == "flash_attention":
        return dict(q=randn(b, h, s, d), qpe=randn(b, h, s, p), k=randn(b, t, h, d), v=randn(b, t, h, dv),
                    kpe=randn(b, t, p), scale=scale, causal=problem.causal)
    if name == "flash_mla":
        return dict(qc=randn(b, h, s, k, std=k**-0.25), qpe=randn(b, h, s, p), z=randn(b, t, k), kpe=randn(b, t, p),
                    scale=scale, causal=problem.causal)
    if name == "mla_var6_plus":
        n = problem.n or 0
        return dict(q=randn(b, h, s, d), qpe=randn(b, h, s, p), qc=randn(b, h, s, k, std=k**-0.25),
                    z_old=randn(b, t - n, k), kpe=randn(b, t, p), k_new=randn(b, n, h, d), v_new=randn(b, n, h, dv),
                    scale=scale, causal=problem.causal)
    if name == "absorb_query":
        return dict(q_nope=randn(b, h, s, d), w_uk=randn(h, d, k, std=d**-0.5))
    if name == "decompress":
        return dict(o_latent=randn(b, h, s, k), w_uv=randn(h, k, dv, std=k**-0.5))
    raise ValueError(f"no inputs known for {name!r}")


# --------------------------------------------------------------------------------------------
# runs, and the check against the fp32 reference (mla_var3.reference)


def check(name: str, dims: MLADims, problem: Problem, *, dtype: str = "bf16", device="cuda",
          seed: int = 0) -> dict[str, tuple[list[int], float]]:
    """Run launcher ``name`` on :func:`design_inputs` and its fp32 reference on the same inputs
    (upcast): each output's shape and relative error (``mla_var3.testing.rel_err``)."""
    from mla_var3 import reference
    from mla_var3.testing import rel_err

    inputs = design_inputs(name, dims, problem, dtype=dtype, device=device, seed=seed)
    out = run(name, inputs)
    ref = _named(name, getattr(reference, name)(**{k: v.float() if isinstance(v, torch.Tensor) else v
                                                    for k, v in inputs.items()}))
    return {k: (list(out[k].shape), rel_err(out[k].float(), r)) for k, r in ref.items()}


def output_names(name: str) -> tuple[str, ...]:
    if name not in DESIGNS:
        return ("out",)
    d = _design(name)
    return ("o", "o_latent", "lse") if d.split else ("o_latent", "lse") if d.latent else ("o", "lse")


def backend_name(name: str, device, *, tuned: bool = False) -> str | None:
    """The backend a default call of launcher ``name`` selects on ``device`` ("gluon" on sm_90
    for the absorbed and expanded designs — which itself runs the portable kernel on calls its
    Gluon kernel does not take, e.g. the expanded design at s <= 64 — else "triton"); "triton"
    when a tuned portable config is passed."""
    from mla_var3.kernel import backends

    names = backends.available(name, device) if backends.backends(name) else []
    if not names:
        return None
    return "triton" if tuned else names[0]


def run(name: str, inputs: dict, config=None) -> dict[str, torch.Tensor]:
    """Run launcher ``name`` (with ``config`` when given) and name its outputs."""
    fn = KERNELS[name].load()
    return _named(name, fn(**inputs) if config is None else fn(**inputs, config=config))


def _named(name: str, out) -> dict[str, torch.Tensor]:
    return dict(zip(output_names(name), out if isinstance(out, tuple) else (out,)))


# --------------------------------------------------------------------------------------------
# stages


@dataclass(frozen=True)
class Stage:
    """One kernel of a design's pipeline: its launcher name, the call, and its cost-model name."""

    name: str
    launcher: str
    call: Callable[[], object]
    cost_model: str
    config: object = None


def pipeline(design: str, dims: MLADims, problem: Problem, *, dtype: str = "bf16", device="cuda",
             configs: dict | None = None, seed: int = 0) -> list[Stage]:
    """The stages of ``design`` in order, each ready to time.

    The design's ``pipeline`` (:mod:`mla_var3.designs`): flash_attention: attention. flash_mla:
    absorb → attention (+ split-KV combine, inside the launcher) → decompress. mla_var6_plus:
    absorb → attention (hybrid) → decompress (added to o).
    ``configs`` maps launcher names to launch configs (default: each launcher's own default).
    """
    configs = configs or {}
    d = _design(design)
    inputs = design_inputs(design, dims, problem, dtype=dtype, device=device, seed=seed)
    attn_cfg = configs.get(design)
    attn = Stage("attention", design, lambda: run(design, inputs, attn_cfg), KERNELS[design].cost_model, attn_cfg)
    if not d.latent:
        return [attn]
    absorb_in = design_inputs("absorb_query", dims, problem, dtype=dtype, device=device, seed=seed + 1)
    dec_in = design_inputs("decompress", dims, problem, dtype=dtype, device=device, seed=seed + 2)
    if d.split:                                    # the expanded part's o, added to
        dec_in["o"] = design_inputs("absorb_query", dims, problem, dtype=dtype, device=device, seed=seed + 3)["q_nope"]
    ab_cfg, de_cfg = configs.get("absorb_query"), configs.get("decompress")
    return [
        Stage("absorb", "absorb_query", lambda: run("absorb_query", absorb_in, ab_cfg), "absorb_query", ab_cfg),
        attn,
        Stage("decompress", "decompress", lambda: run("decompress", dec_in, de_cfg),
              "decompress+o" if d.split else "decompress", de_cfg),
    ]


def stage_cost(stage: Stage, dims: MLADims, problem: Problem):
    """The analysis' :class:`~mla_var3.analysis.cost.Cost` of one stage."""
    from mla_var3.analysis.cost import cost, decompress

    if stage.cost_model == "decompress+o":          # the hybrid adds the expanded part's o
        return decompress(dims, problem, accumulate=True)
    return cost(stage.cost_model, dims, problem)

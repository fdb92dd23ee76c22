"""The kernel launchers by name: the one adapter between the measurement code and the kernels.

Every lookup of a kernel launcher, its launch-config functions, the backend a default call
selects and the config a benchmark point runs goes through here; which kernels exist, where
they live and what they cost comes from the design table (:mod:`mla_var3.designs`), their
random inputs from :mod:`mla_var3.reference.inputs`.

Designs measured: ``flash_attention`` (expanded), ``flash_mla`` (absorbed), ``mla_var6_plus``
(hybrid); stages ``absorb_query`` and ``decompress`` around the absorbed designs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mla_var3.designs import ATTENTION_KERNELS, KERNELS, design as _design
from mla_var3.kernel import backends
from mla_var3.reference.inputs import design_inputs
from mla_var3.shapes import MLADims, Problem


def parse_designs(text: str) -> list[str]:
    """``"all"`` or a comma list of design names -> list; ValueError naming the known ones."""
    if text.strip() == "all":
        return list(ATTENTION_KERNELS)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in ATTENTION_KERNELS]
    if bad or not names:
        raise ValueError(f"unknown design(s) {', '.join(bad) or repr(text)}; "
                         f"known: {', '.join(ATTENTION_KERNELS)} or 'all'")
    return names


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
    if name not in ATTENTION_KERNELS:
        return ("out",)
    d = _design(name)
    return ("o", "o_latent", "lse") if d.split else ("o_latent", "lse") if d.latent else ("o", "lse")


def backend_name(name: str, device, *, tuned: bool = False, s: int | None = None) -> str | None:
    """The backend a default call of launcher ``name`` selects on ``device`` ("gluon" on sm_90
    for the absorbed and expanded designs, else "triton"); "triton" when a tuned portable config
    is passed. With ``s`` (the call's query length), the kernel that runs: the expanded design's
    sm_90 backend hands calls of ``s <= GLUON_MIN_S`` to the portable kernel ("triton"), so a
    record of such a call is the portable kernel's time."""
    names = backends.available(name, device) if backends.backends(name) else []
    if not names:
        return None
    if tuned:
        return "triton"
    return names[0] if s is None else backend_that_ran(name, names[0], s)


def backend_that_ran(name: str, backend: str, s: int) -> str:
    """The backend whose kernel a default call of ``name`` on ``backend`` runs at query length
    ``s``: the expanded design's sm_90 backend ("gluon") hands ``s <= GLUON_MIN_S`` to the
    portable kernel ("triton"); every other backend runs its own."""
    if name == "flash_attention" and backend == "gluon":
        from mla_var3.kernel.hopper.expanded_gluon import GLUON_MIN_S

        return "gluon" if s > GLUON_MIN_S else "triton"
    return backend


def run(name: str, inputs: dict, config=None) -> dict[str, torch.Tensor]:
    """Run launcher ``name`` (with ``config`` when given) and name its outputs."""
    fn = KERNELS[name].load()
    return _named(name, fn(**inputs) if config is None else fn(**inputs, config=config))


def _named(name: str, out) -> dict[str, torch.Tensor]:
    return dict(zip(output_names(name), out if isinstance(out, tuple) else (out,)))


# --------------------------------------------------------------------------------------------
# the config a benchmark point runs


def pick_config(name: str, dims: MLADims, problem: Problem, dtype: str, device, *, cache=None, tune: bool = False,
                retune: bool = False, log: Callable[[str], None] | None = None, budget_s: float | None = 30.0):
    """(config, how) for one launcher and problem: the cached autotuned config when there is
    one, else a fresh tuning (at most ``budget_s`` seconds) when ``tune``/``retune``, else None:
    the launcher's own default call, so the benchmark times exactly what a user's call runs,
    backend selection included (a portable config passed explicitly would keep a design on its
    portable kernel where a device-specific backend exists)."""
    from mla_var3.runtime import autotune as at
    from mla_var3.runtime.environment import device_name

    cands = candidate_configs(name, dims, problem, dtype, device)
    if not cands:
        return None, "launcher default (no config enumerator)"
    key = at.cache_key(device_name(), name, dims, problem, dtype)
    if cache is not None and not retune:
        entry = cache.get(key)
        if entry is not None:
            cfg = at.restore_config(entry["config"], cands)
            if cfg is not None:
                return cfg, "autotuned (cached)"
    if tune or retune:
        inputs = design_inputs(name, dims, problem, dtype=dtype, device=device)
        # a tuned config runs the portable backend; the dispatcher must know when a default call
        # would run another one (the Gluon kernels on sm_90), whose time this is not
        info = dict(backend=backend_name(name, device, tuned=True), default_backend=backend_name(name, device))
        res = at.autotune(name, cands, lambda cfg: (lambda: run(name, inputs, cfg)), key=key, cache=cache,
                          retune=retune, log=log, budget_s=budget_s, info=info)
        return res.config, "autotuned"
    return None, "default"


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

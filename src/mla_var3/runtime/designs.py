"""The one adapter between the measurement code and the kernel / analysis modules.

Every lookup of a kernel launcher, its launch-config functions and the inputs it takes goes
through here, so a renamed function is a one-line change in this file.

Designs measured: ``flash_attention`` (expanded), ``flash_mla`` (absorbed), ``mla_var6_plus``
(hybrid); stages ``absorb_query`` and ``decompress`` around the absorbed designs.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mla_var3.shapes import MLADims, Problem

#: the three attention designs.
DESIGNS = ("flash_attention", "flash_mla", "mla_var6_plus")

#: launcher name -> module that defines it (and its default_config / candidate_configs).
KERNEL_MODULES = {
    "flash_attention": "mla_var3.kernel.expanded",
    "flash_mla": "mla_var3.kernel.absorbed",
    "mla_var6_plus": "mla_var3.kernel.hybrid",
    "absorb_query": "mla_var3.kernel.gemm",
    "decompress": "mla_var3.kernel.gemm",
}

#: the cost model that counts what each launcher must move (analysis.cost.COST_MODELS names).
#: Our expanded kernel reads the RoPE key once per token, hence the shared-KPE model.
COST_MODEL = {
    "flash_attention": "flash_attention_shared_kpe",
    "flash_mla": "flash_mla",
    "mla_var6_plus": "mla_var6_plus",
    "absorb_query": "absorb_query",
    "decompress": "decompress",
}

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


def kernel_module(name: str):
    """The module of launcher ``name`` (ImportError when it does not exist yet)."""
    return importlib.import_module(KERNEL_MODULES[name])


def available(name: str) -> bool:
    """True when launcher ``name`` can be imported."""
    try:
        return hasattr(kernel_module(name), name)
    except ImportError:
        return False


def launcher(name: str) -> Callable:
    return getattr(kernel_module(name), name)


def _call_matching(fn: Callable, pool: dict):
    """Call ``fn`` with the arguments of ``pool`` its signature names (others left default)."""
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in pool.items() if k in params}
    missing = [k for k, p in params.items()
               if p.default is inspect.Parameter.empty and k not in kwargs
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise TypeError(f"{fn.__module__}.{fn.__name__} needs {missing}, not known to the measurement adapter")
    return fn(**kwargs)


def _config_pool(name: str, dims: MLADims, problem: Problem, dtype: str, device) -> dict:
    """Arguments a config function may ask for, by parameter name (per launcher where names clash)."""
    pool = dict(dims=dims, problem=problem, b=problem.b, h=dims.h, s=problem.s, t=problem.t, n=problem.n or 0,
                o=problem.o, d=dims.d, p=dims.p, k=dims.k, dv=dims.dv, causal=problem.causal,
                dtype=torch_dtype(dtype), device=torch.device(device))
    if name == "flash_mla":
        pool["rows"] = dims.h * problem.s                        # rows of one sequence: heads x queries
    elif name == "absorb_query":
        pool.update(rows=problem.b * problem.s, kin=dims.d, nout=dims.k)
    elif name == "decompress":
        pool.update(rows=problem.b * problem.s, kin=dims.k, nout=dims.dv)
    return pool


def _config_fn(name: str, kind: str) -> Callable | None:
    """The module's ``default_config`` / ``candidate_configs`` for launcher ``name`` (a module
    holding two launchers may name them ``<kind>_<launcher>`` or ``<launcher>_<kind>``)."""
    mod = kernel_module(name)
    for attr in (f"{name}_{kind}", f"{kind}_{name}", kind):
        if hasattr(mod, attr):
            return getattr(mod, attr)
    return None


def default_config(name: str, dims: MLADims, problem: Problem, dtype: str = "bf16", device="cuda"):
    """The launcher's analytic default config, or None when the module has none."""
    fn = _config_fn(name, "default_config")
    return None if fn is None else _call_matching(fn, _config_pool(name, dims, problem, dtype, device))


def candidate_configs(name: str, dims: MLADims, problem: Problem, dtype: str = "bf16", device="cuda") -> list:
    """The launcher's autotuning space (at least the default), or [] when it has none."""
    fn = _config_fn(name, "candidate_configs")
    if fn is None:
        cfg = default_config(name, dims, problem, dtype, device)
        return [] if cfg is None else [cfg]
    return list(_call_matching(fn, _config_pool(name, dims, problem, dtype, device)))


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
# references (fp32, mla_var3.reference)


def reference_outputs(name: str, inputs: dict) -> dict[str, torch.Tensor]:
    """fp32 reference outputs of launcher ``name`` on ``inputs`` (names -> tensors)."""
    from mla_var3 import reference

    fn = getattr(reference, name)
    out = fn(**inputs)
    if name == "flash_attention":
        return {"o": out[0], "lse": out[1]}
    if name == "flash_mla":
        return {"o_latent": out[0], "lse": out[1]}
    if name == "mla_var6_plus":
        return {"o": out[0], "o_latent": out[1], "lse": out[2]}
    return {"out": out}


def output_names(name: str) -> tuple[str, ...]:
    return {"flash_attention": ("o", "lse"), "flash_mla": ("o_latent", "lse"),
            "mla_var6_plus": ("o", "o_latent", "lse")}.get(name, ("out",))


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
    fn = launcher(name)
    out = fn(**inputs) if config is None else fn(**inputs, config=config)
    if not isinstance(out, tuple):
        out = (out,)
    return dict(zip(output_names(name), out))


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

    flash_attention: attention. flash_mla: absorb → attention (+ split-KV combine, inside the
    launcher) → decompress. mla_var6_plus: absorb → attention (hybrid) → decompress (added to o).
    ``configs`` maps launcher names to launch configs (default: each launcher's own default).
    """
    configs = configs or {}
    inputs = design_inputs(design, dims, problem, dtype=dtype, device=device, seed=seed)
    attn_cfg = configs.get(design)
    attn = Stage("attention", design, lambda: run(design, inputs, attn_cfg), COST_MODEL[design], attn_cfg)
    if design == "flash_attention":
        return [attn]
    absorb_in = design_inputs("absorb_query", dims, problem, dtype=dtype, device=device, seed=seed + 1)
    dec_in = design_inputs("decompress", dims, problem, dtype=dtype, device=device, seed=seed + 2)
    if design == "mla_var6_plus":
        dec_in["o"] = design_inputs("flash_attention", dims, problem, dtype=dtype, device=device, seed=seed + 3)["q"]
    ab_cfg, de_cfg = configs.get("absorb_query"), configs.get("decompress")
    return [
        Stage("absorb", "absorb_query", lambda: run("absorb_query", absorb_in, ab_cfg), "absorb_query", ab_cfg),
        attn,
        Stage("decompress", "decompress", lambda: run("decompress", dec_in, de_cfg),
              "decompress+o" if design == "mla_var6_plus" else "decompress", de_cfg),
    ]


def stage_cost(stage: Stage, dims: MLADims, problem: Problem):
    """The analysis' :class:`~mla_var3.analysis.cost.Cost` of one stage."""
    from mla_var3.analysis.cost import cost, decompress

    if stage.cost_model == "decompress+o":          # the hybrid adds the expanded part's o
        return decompress(dims, problem, accumulate=True)
    return cost(stage.cost_model, dims, problem)

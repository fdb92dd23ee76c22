"""Dimensions and problem sizes: the one source of truth for every MLA shape.

Everything in the package (cost models, references, kernels, tests, benchmarks) takes an
:class:`MLADims` for the model's attention dims and a :class:`Problem` for the call's sizes.

Notation (DeepSeek-V3 defaults, see ``docs/cost-analysis.md``, "Notation"):

====  =======================================================  =========
 sym  meaning                                                   default
====  =======================================================  =========
 h    attention (query) heads                                   128
 d    per-head no-RoPE q/k dim (``qk_nope_head_dim``)           128
 p    decoupled RoPE dim (``qk_rope_head_dim``)                 64
 k    latent rank (``kv_lora_rank``)                            512
 dv   value head dim (``v_head_dim``; equals d in every preset) 128
 w    bytes per element (2 bf16/fp16, 1 fp8, 4 fp32)           2
 b    batch (sequences)
 s    query tokens per sequence this step
 t    context length in the cache, including the s new tokens
 n    hybrid: newest tokens kept expanded; o = t - n kept latent
====  =======================================================  =========

Example
-------
>>> from mla_var3.shapes import get_preset, Problem
>>> dims = get_preset("deepseek-v3")
>>> dims.h, dims.k + dims.p, round(dims.default_scale, 5)
(128, 576, 0.07217)
>>> Problem(b=32, s=16, t=4096, n=1024).o
3072
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from importlib import resources

#: bytes per element for the dtypes the package knows.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

DEFAULT_MODEL = "deepseek-v3"


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (one of ``DTYPE_BYTES``); ValueError otherwise."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None


def check_window(n, what: str = "hybrid window n") -> int:
    """``n`` when it is an integer >= 0 (a hybrid window); ValueError naming ``what`` otherwise."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {n!r}")
    return n


def _check_positive(owner: str, **values: int | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class MLADims:
    """Attention dims of one MLA model (per layer), plus the model facts the analysis needs.

    Attributes
    ----------
    h, d, p, k, dv : int
        Heads, no-RoPE q/k head dim, RoPE dim, latent rank, value head dim.
    w : int
        Bytes per element of activations and cache (2 for bf16/fp16).
    layers, hidden : int
        Decoder layers and hidden size (memory accounting, the layer).
    q_lora_rank : int or None
        Rank of the low-rank query path; None means a plain ``q_proj`` (DeepSeek-V2-Lite).
    name : str
        Preset name, or ``"custom"``.
    """

    h: int = 128
    d: int = 128
    p: int = 64
    k: int = 512
    dv: int = 128
    w: int = 2
    layers: int = 61
    hidden: int = 7168
    q_lora_rank: int | None = 1536
    name: str = "custom"

    def __post_init__(self) -> None:
        _check_positive(
            f"MLADims({self.name})", h=self.h, d=self.d, p=self.p, k=self.k, dv=self.dv, w=self.w,
            layers=self.layers, hidden=self.hidden, q_lora_rank=self.q_lora_rank,
        )

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width of the expanded design, d + p (192 for DeepSeek-V3)."""
        return self.d + self.p

    @property
    def default_scale(self) -> float:
        """Default softmax scale 1/sqrt(d + p) (YaRN models multiply it by mscale²)."""
        return float(self.d + self.p) ** -0.5

    def replace(self, **changes) -> "MLADims":
        """A copy with some fields changed (named ``custom`` unless ``name`` is given)."""
        changes.setdefault("name", "custom" if changes else self.name)
        return dataclasses.replace(self, **changes)

    def per_gpu(self, tp: int) -> "MLADims":
        """The dims one GPU of a tensor-parallel group of ``tp`` runs: h/tp heads; every other dim,
        the latent rank and RoPE dim among them, unchanged (the latent cache is whole on every
        rank). ValueError when tp is not a positive divisor of h."""
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or self.h % tp:
            raise ValueError(f"tp={tp!r} must be a positive divisor of the heads h={self.h} (heads per GPU = h / tp)")
        return self if tp == 1 else dataclasses.replace(self, h=self.h // tp, name=f"{self.name} tp={tp}")

    def with_dtype(self, dtype: str) -> "MLADims":
        """A copy with ``w`` set from a dtype name ('bf16', 'fp16', 'fp8', 'fp32'); keeps the name."""
        return dataclasses.replace(self, w=dtype_bytes(dtype))


@dataclass(frozen=True)
class Problem:
    """Sizes of one attention call.

    Attributes
    ----------
    b : int
        Sequences in the batch.
    s : int
        Query tokens per sequence (1 = decode).
    t : int
        Keys per sequence in the cache, including the s new tokens (so s <= t).
    n : int or None
        Hybrid only: newest tokens kept expanded (0 <= n <= t); ``o = t - n`` stay latent.
    causal : bool
        Query i of s sees keys j <= t - s + i.
    """

    b: int
    s: int
    t: int
    n: int | None = None
    causal: bool = True

    def __post_init__(self) -> None:
        _check_positive("Problem", b=self.b, s=self.s, t=self.t)
        if self.s > self.t:
            raise ValueError(f"Problem: s={self.s} query tokens exceed the context t={self.t} (t includes them)")
        if self.n is not None:
            if not isinstance(self.n, int) or isinstance(self.n, bool) or not 0 <= self.n <= self.t:
                raise ValueError(f"Problem: hybrid window n must be an integer in [0, t={self.t}], got {self.n!r}")

    @property
    def o(self) -> int:
        """Hybrid: oldest tokens kept latent, t - n (t when no window is set)."""
        return self.t - (self.n or 0)

    def with_n(self, n: int | None) -> "Problem":
        """A copy with the hybrid window set to ``n``."""
        return dataclasses.replace(self, n=n)


@functools.cache
def _load_models() -> dict[str, dict]:
    text = resources.files("mla_var3.conf").joinpath("models.json").read_text()
    raw = json.loads(text)
    return {name: entry for name, entry in raw.items() if not name.startswith("_")}


def preset_names() -> list[str]:
    """Names of the model presets in ``conf/models.json`` (aliases not included)."""
    return list(_load_models())


def get_preset(name: str, dtype: str = "bf16") -> MLADims:
    """The :class:`MLADims` of a model preset (or one of its aliases), at ``dtype``.

    Raises ValueError naming the known presets when ``name`` is unknown.
    """
    models = _load_models()
    key = name.lower()
    for preset, entry in models.items():
        if key == preset or key in entry.get("aliases", ()):
            fields = {f.name for f in dataclasses.fields(MLADims)}
            values = {k: v for k, v in entry.items() if k in fields}
            return MLADims(**values, w=dtype_bytes(dtype), name=preset)
    raise ValueError(f"unknown model {name!r}; known presets: {', '.join(models)}")

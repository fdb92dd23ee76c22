"""The MLA attention layer (DeepSeek-V2/V3 parameterisation, HF checkpoint names) with three
forward paths over the same weights.

Projections (per token ``x [hidden]``)::

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))   or q_proj(x)      -> [H, d + p]
    q_nope, q_pe = q[:, :d], RoPE(q[:, d:])
    z, kpe = kv_a_layernorm(kv_a_proj_with_mqa(x)[:k]), RoPE(kv_a_proj_with_mqa(x)[k:])   (cached)
    k_nope, v = kv_b_proj(z) split per head into d + dv                                   (naive)
    out    = o_proj(attention)

Paths (``mode``, one per design of :mod:`mla_var3.designs`, each run by
:func:`mla_var3.model.attention.run_design`):

* ``"naive"``: expand K, V per head and run :func:`flash_attention` over an
  :class:`ExpandedCache`.
* ``"absorbed"``: cache only ``[z, kpe]`` (:class:`LatentCache` or :class:`PagedLatentCache`),
  absorb ``W_UK`` into the query (:func:`absorb_query`), run :func:`flash_mla`, then
  :func:`decompress` with ``W_UV``.
* ``"hybrid"``: the hybrid (``mla_var6_plus``) over a :class:`HybridCache` (o oldest latent, n newest expanded),
  output ``o + decompress(o_latent)``.
* ``"auto"``: the dispatcher picks the design per call over a latent, paged or hybrid cache
  (:func:`mla_var3.model.attention.mla_attention`).

Each call appends the s new tokens to the cache (created empty when ``cache`` is None) and
returns the new cache; the new tokens are the last s keys of each sequence (causal rule
``j <= t - s + i``). Ragged batches (different ``seqlens``) work in every path; the hybrid runs
them one sequence at a time.

Precision: activations, caches and intermediate tensors (``qc``, ``o_latent``) are held in the
layer's dtype, as the GPU path holds them in bf16; RMSNorm and RoPE compute in float32 for
16-bit dtypes (float64 stays float64); attention accumulates in float32 (the references use
float64 for float64 inputs).
"""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import Iterable, Mapping

import torch
from torch import nn

from mla_var3.designs import CACHE_KINDS, DESIGNS
from mla_var3.dispatch.decide import CacheInfo
from mla_var3.model import weights as W
from mla_var3.model.attention import AttentionState, mla_attention, run_design
from mla_var3.model.cache import ExpandedCache, LatentCache, PagedLatentCache
from mla_var3.model.config import MLAConfig
from mla_var3.model.expand import expand_kv
from mla_var3.model.hybrid_cache import HybridCache
from mla_var3.model.rope import apply_rope, compute_dtype, rope_cos_sin, rope_inv_freq
from mla_var3.shapes import check_window

MODES = tuple(d.mode for d in DESIGNS)
_CACHE_TYPES = MappingProxyType({c.kind: c for c in (ExpandedCache, LatentCache, PagedLatentCache, HybridCache)})
#: the cache kinds each mode runs over ("auto": the dispatcher's).
_CACHE_FOR_MODE = MappingProxyType({**{d.mode: d.mode_caches for d in DESIGNS}, "auto": CACHE_KINDS})


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x**2) + eps)``, normalised in float32 for 16-bit inputs (as HF)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        work = x.to(compute_dtype(x.dtype))
        work = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * work.to(x.dtype)


class MLALayer(nn.Module):
    """One MLA attention layer.

    Parameters
    ----------
    cfg : MLAConfig
    dtype, device :
        Of the parameters; inputs must match the dtype.

    Example
    -------
    >>> import torch
    >>> from mla_var3.model import MLAConfig, MLALayer
    >>> cfg = MLAConfig.from_preset("deepseek-v3").scaled(div=16, h=4)
    >>> layer = MLALayer.random(cfg, dtype=torch.float64, seed=0)
    >>> x = torch.randn(2, 5, cfg.hidden, dtype=torch.float64)
    >>> pos = torch.arange(5).expand(2, 5)
    >>> out, cache = layer(x, pos, mode="absorbed")
    >>> out.shape, cache.z.shape
    (torch.Size([2, 5, 448]), torch.Size([2, 5, 32]))
    >>> out, cache = layer(x[:, :1], pos[:, :1] + 5, cache=cache, mode="absorbed")   # decode
    """

    def __init__(self, cfg: MLAConfig, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.cfg = cfg
        c = cfg
        kw = dict(dtype=dtype, device=device)
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.hidden, c.h * c.qk_head_dim, bias=False, **kw)
        else:
            self.q_a_proj = nn.Linear(c.hidden, c.q_lora_rank, bias=c.attention_bias, **kw)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps, **kw)
            self.q_b_proj = nn.Linear(c.q_lora_rank, c.h * c.qk_head_dim, bias=False, **kw)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden, c.k + c.p, bias=c.attention_bias, **kw)
        self.kv_a_layernorm = RMSNorm(c.k, c.rms_norm_eps, **kw)
        self.kv_b_proj = nn.Linear(c.k, c.h * (c.d + c.dv), bias=False, **kw)
        self.o_proj = nn.Linear(c.h * c.dv, c.hidden, bias=c.attention_bias, **kw)
        #: "auto" (kernels on CUDA, references elsewhere), "reference" or "kernel".
        self.backend = "auto"
        #: what attention keeps between this layer's calls: the dispatcher of mode "auto" (share one
        #: across layers: ``AttentionState(dispatcher)``) and the absorbed kernels' decode state
        self.attention_state = AttentionState()
        #: the design mode "auto" forces ("auto": the dispatcher decides)
        self.auto_design = "auto"
        #: mode "auto": the Decision of the last call (None before the first)
        self.last_decision = None
        self._inv_freq = rope_inv_freq(cfg)[0]  # float64, a plain attribute: immune to .to(dtype)
        self._absorbed_key: tuple | None = None
        self._absorbed: W.AbsorbedWeights | None = None

    # ----------------------------------------------------------------- builders
    @classmethod
    def random(cls, cfg: MLAConfig, dtype: torch.dtype = torch.float32, device=None, seed: int = 0) -> "MLALayer":
        """Random weights (std ``fan_in**-0.5``, norm weights ``1 + 0.1 N(0,1)``, biases
        ``0.1 N(0,1)``) so activations and scores are O(1)."""
        layer = cls(cfg, dtype=dtype, device=device)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in layer.named_parameters():
                if "layernorm" in name:
                    values = 1.0 + 0.1 * torch.randn(param.shape, generator=gen, dtype=torch.float64)
                elif name.endswith("bias"):
                    values = 0.1 * torch.randn(param.shape, generator=gen, dtype=torch.float64)
                else:
                    values = torch.randn(param.shape, generator=gen, dtype=torch.float64) * param.shape[1] ** -0.5
                param.copy_(values.to(param.dtype))
        return layer

    @classmethod
    def from_state_dict(cls, cfg: MLAConfig, state_dict: Mapping[str, torch.Tensor], prefix: str = "",
                        dtype: torch.dtype | None = None, device=None) -> "MLALayer":
        """A layer holding the tensors of ``state_dict`` under ``prefix`` (HF key names).

        ``dtype`` defaults to the dtype of the checkpoint's ``kv_b_proj.weight`` (float32 for an
        FP8 checkpoint, which is dequantised). A missing, unexpected or wrongly shaped tensor is
        a ValueError naming the key and both shapes.
        """
        layer = cls(cfg, dtype=torch.float32 if dtype is None else dtype, device=device)
        tensors = W.match_state_dict(layer.state_dict(), state_dict, prefix)
        if dtype is None:
            dtype = tensors["kv_b_proj.weight"].dtype
            if dtype not in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
                dtype = torch.float32
            layer = layer.to(dtype)
        layer.load_state_dict({key: value.to(dtype) for key, value in tensors.items()}, strict=True)
        return layer

    @classmethod
    def from_safetensors(cls, cfg: MLAConfig, paths: str | os.PathLike | Iterable[str | os.PathLike],
                         prefix: str = "", dtype: torch.dtype | None = None, device=None) -> "MLALayer":
        """A layer from one or several ``.safetensors`` files holding its attention weights under
        ``prefix`` (e.g. ``"model.layers.3.self_attn."``); other keys in the files are ignored."""
        return cls.from_state_dict(cfg, W.read_safetensors(paths, prefix), prefix, dtype=dtype, device=device)

    @property
    def dispatcher(self):
        """The :class:`~mla_var3.dispatch.Dispatcher` of mode "auto" (``attention_state``'s; None
        until the first call makes the device's default one); setting one gives the layer a new
        :class:`AttentionState` around it (several layers may share one dispatcher)."""
        return self.attention_state.given_dispatcher

    @dispatcher.setter
    def dispatcher(self, dispatcher) -> None:
        self.attention_state = AttentionState(dispatcher)

    # ----------------------------------------------------------------- weights
    @property
    def absorbed(self) -> W.AbsorbedWeights:
        """``w_uk [H, D, K]`` and ``w_uv [H, K, D]``: views of ``kv_b_proj.weight`` (no copy; the
        kernels and references read them through their strides), so they always hold the
        weight's current values. An in-place update through ``.data`` (PEFT's LoRA merge does
        ``weight.data += delta``) changes neither the weight's version counter nor its address,
        so copies of the weight could not tell that it changed and would be stale. The views are
        made once per weight tensor (address, dtype, device, shape: a new ``.data``, ``.to()`` or
        a new Parameter makes new ones). With grad mode on and a weight that requires grad,
        formed per call inside the autograd graph, so ``kv_b_proj`` gets its gradient through
        every mode of the reference backend."""
        weight = self.kv_b_proj.weight
        if torch.is_grad_enabled() and weight.requires_grad:
            return W.absorbed_weights(weight, self.cfg.h, self.cfg.d, self.cfg.dv, detach=False)
        key = (weight.data_ptr(), weight.dtype, weight.device, tuple(weight.shape))
        if self._absorbed is None or self._absorbed_key != key:
            self._absorbed = W.absorbed_weights(weight, self.cfg.h, self.cfg.d, self.cfg.dv, contiguous=False)
            self._absorbed_key = key
        return self._absorbed

    # ----------------------------------------------------------------- forward
    def project(self, hidden_states: torch.Tensor, positions: torch.Tensor):
        """``q_nope [B,H,S,D]``, ``q_pe [B,H,S,P]`` (rotated), ``z [B,S,K]`` (normed latent),
        ``kpe [B,S,P]`` (rotated) for the new tokens."""
        c = self.cfg
        b, s, _ = hidden_states.shape
        if c.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q = q.view(b, s, c.h, c.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = q[..., : c.d], q[..., c.d:]
        ckv = self.kv_a_proj_with_mqa(hidden_states)
        z = self.kv_a_layernorm(ckv[..., : c.k])
        if self._inv_freq.device != positions.device:  # once per device: a copy cannot be captured in a graph
            self._inv_freq = self._inv_freq.to(positions.device)
        cos, sin = rope_cos_sin(c, positions, hidden_states.dtype, self._inv_freq)
        q_pe = apply_rope(q_pe, cos[:, None], sin[:, None], c.rope_interleave)
        kpe = apply_rope(ckv[..., c.k:], cos, sin, c.rope_interleave)
        return q_nope.contiguous(), q_pe.contiguous(), z.contiguous(), kpe.contiguous()

    def expand(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``k_nope [B, S, H, D]`` and ``v [B, S, H, DV]`` of latent tokens ``z [B, S, K]`` (the
        per-head blocks of ``kv_b_proj``)."""
        w = self.absorbed
        return expand_kv(z, w.w_uk, w.w_uv)

    def _check_inputs(self, hidden_states, positions, cache, mode, n):
        c = self.cfg
        dtype = self.kv_b_proj.weight.dtype
        if mode not in _CACHE_FOR_MODE:
            raise ValueError(f"mode must be one of {(*MODES, 'auto')}, got {mode!r}")
        if hidden_states.dim() != 3 or hidden_states.shape[2] != c.hidden or hidden_states.shape[1] < 1:
            raise ValueError(f"hidden_states must be [B, S>=1, hidden={c.hidden}], got {list(hidden_states.shape)}")
        if hidden_states.dtype != dtype or hidden_states.device != self.kv_b_proj.weight.device:
            raise ValueError(f"hidden_states must be {dtype} on {self.kv_b_proj.weight.device} like the weights, "
                             f"got {hidden_states.dtype} on {hidden_states.device}")
        if positions.shape != hidden_states.shape[:2] or positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise ValueError(f"positions must be an integer [B, S]={list(hidden_states.shape[:2])} tensor, "
                             f"got {list(positions.shape)} {positions.dtype}")
        if cache is not None:
            if mode == "auto":
                CacheInfo.of(cache)  # ValueError for an ExpandedCache or another object
            kinds = _CACHE_FOR_MODE[mode]
            if getattr(cache, "kind", None) not in kinds:
                want = " or ".join(_CACHE_TYPES[k].__name__ for k in kinds)
                raise ValueError(f"mode {mode!r} needs a {want}, got a {type(cache).__name__}")
            if cache.batch != hidden_states.shape[0]:
                raise ValueError(f"cache holds {cache.batch} sequences, hidden_states {hidden_states.shape[0]}")
        if n is None or mode not in ("hybrid", "auto"):   # the other modes keep no window
            return
        if cache is None:
            check_window(n)
        elif cache.kind != "hybrid":
            raise ValueError(f"n={n} needs a HybridCache; the cache is a {type(cache).__name__}")
        elif n != cache.n:
            raise ValueError(f"hybrid window n={n} differs from the cache's n={cache.n} (a cache keeps its n)")

    def _empty_cache(self, mode: str, n: int | None, b: int, dtype, device):
        """The cache a call without one starts: the mode's own, for "auto" a LatentCache (a
        HybridCache of window ``n`` when ``n`` is given); the hybrid's window defaults to
        ``cfg.hybrid_n``."""
        c = self.cfg
        kw = dict(dtype=dtype, device=device)
        if mode == "hybrid" or (mode == "auto" and n is not None):
            return HybridCache.empty(b, c.h, c.d, c.k, c.p, c.hybrid_n if n is None else n, dv=c.dv, **kw)
        if mode == "naive":
            return ExpandedCache.empty(b, c.h, c.d, c.p, dv=c.dv, **kw)
        return LatentCache.empty(b, c.k, c.p, **kw)

    def _append(self, cache, z: torch.Tensor, kpe: torch.Tensor):
        """The cache with the new tokens: latents, their expansion, or both, as its kind keeps them."""
        if cache.kind in ("latent", "paged"):
            return cache.append(z, kpe)
        k_new, v_new = self.expand(z)
        return cache.append(k_new, v_new, kpe) if cache.kind == "expanded" else cache.append(z, kpe, k_new, v_new)

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, cache=None, mode: str = "absorbed",
                n: int | None = None):
        """Attend the s new tokens of each sequence to its cache plus themselves.

        Parameters
        ----------
        hidden_states : Tensor [B, S, hidden]
        positions : Tensor [B, S] int
            RoPE positions of the new tokens (usually ``seqlens[b] + arange(S)``).
        cache : ExpandedCache (naive), LatentCache or PagedLatentCache (absorbed), HybridCache
            (hybrid), any but an ExpandedCache ("auto"), or None for an empty one.
        mode : "naive" | "absorbed" | "hybrid" | "auto" (the dispatcher, :mod:`mla_var3.dispatch`,
            of ``self.attention_state``; ``self.auto_design`` forces a design, default 'auto'; the
            decision is left in ``self.last_decision``)
        n : int, optional
            Hybrid window (newest tokens kept expanded) of a new HybridCache: defaults to
            ``cfg.hybrid_n`` in mode "hybrid"; in mode "auto" it makes the new cache a
            HybridCache. A cache keeps the n it was made with.

        Returns
        -------
        out : Tensor [B, S, hidden]
        cache : the cache with the new tokens appended.
        """
        self._check_inputs(hidden_states, positions, cache, mode, n)
        q_nope, q_pe, z, kpe = self.project(hidden_states, positions)
        b, s = hidden_states.shape[:2]
        cache = self._append(cache if cache is not None else self._empty_cache(mode, n, b, z.dtype, z.device), z, kpe)
        w, c = self.absorbed, self.cfg
        state = self.attention_state
        if mode == "auto":
            o, self.last_decision = mla_attention(q_nope, q_pe, cache, w.w_uk, w.w_uv, scale=c.softmax_scale,
                                                  design=self.auto_design, backend=self.backend, state=state)
        else:
            decode = state.decode(z.device) if z.is_cuda else None
            hybrid = state.hybrid(z.device) if z.is_cuda else None
            o = run_design(mode, q_nope, q_pe, cache, w.w_uk, w.w_uv, scale=c.softmax_scale, backend=self.backend,
                           decode=decode, hybrid=hybrid)
        o = o.to(hidden_states.dtype).transpose(1, 2).reshape(b, s, c.h * c.dv)
        return self.o_proj(o), cache

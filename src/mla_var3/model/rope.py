"""Rotary position embedding on the p decoupled RoPE dims, as DeepSeek-V3 applies it in HF
transformers, with YaRN scaling.

The convention (``rope_interleave=True``, what DeepSeek's checkpoints select): the p RoPE dims of
``q_pe`` and ``k_pe`` hold interleaved pairs ``(x[2i], x[2i+1])`` rotated by angle
``pos * inv_freq[i]``. HF implements it by de-interleaving first,
``[x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]``, then applying the half-split rotation
``x * cos + rotate_half(x) * sin`` with ``cos = cat(cos(f), cos(f))``. The rotated vector is
therefore left in the de-interleaved order; q and k share it, so ``q_pe · k_pe`` is the same
as with the pairs in place. The cached ``kpe`` is in this de-interleaved order. With
``rope_interleave=False`` the de-interleave step is skipped (the NeoX/Llama half-split pairs
``(x[i], x[i + p/2])``).

RoPE stays on its own p dims: it depends on the position and so cannot be moved through
``W_UK`` into the latent space (why MLA decouples it).

YaRN (``rope_scaling`` with type ``"yarn"``): per-frequency interpolation between the original
``base**(-2i/p)`` (high frequencies, extrapolated) and ``base**(-2i/p) / factor`` (low
frequencies, interpolated) with a linear ramp between the correction dims of ``beta_fast`` and
``beta_slow``; cos and sin are multiplied by ``mscale(factor, mscale) / mscale(factor,
mscale_all_dim)``. The softmax-scale correction lives in :attr:`MLAConfig.softmax_scale`.

Precision: frequencies and angles are formed in float64 (HF uses float32; the difference is
below float32 rounding for positions < 2**24), cos/sin are then cast to the compute dtype,
which is float32 for bf16/fp16 inputs (the rotation runs in float32 and is rounded once).
"""

from __future__ import annotations

import math

import torch

from mla_var3.model.config import MLAConfig


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    """The RoPE dim whose wavelength makes ``num_rotations`` turns over ``max_pos`` positions."""
    return dim * math.log(max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_inv_freq(cfg: MLAConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[p/2]`` (float64, CPU) and the cos/sin factor for ``cfg``."""
    dim, base = cfg.p, cfg.rope_theta
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    pos_freqs = base ** exponents
    inv_extra = 1.0 / pos_freqs
    yarn = cfg.rope_scaling
    if yarn is None:
        return inv_extra, rope_factor(cfg)
    inv_inter = 1.0 / (yarn.factor * pos_freqs)
    low = _correction_dim(yarn.beta_fast, dim, base, yarn.original_max_position_embeddings)
    high = _correction_dim(yarn.beta_slow, dim, base, yarn.original_max_position_embeddings)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
    extrapolation = 1.0 - ramp  # 1: keep the original frequency, 0: interpolate fully
    inv_freq = inv_inter * (1.0 - extrapolation) + inv_extra * extrapolation
    return inv_freq, rope_factor(cfg)


def rope_factor(cfg: MLAConfig) -> float:
    """The factor cos and sin are scaled by: YaRN's attention factor, else 1."""
    return cfg.rope_scaling.cos_sin_factor if cfg.rope_scaling is not None else 1.0


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE and the norms compute in: float32 for 16-bit inputs, else ``dtype``."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def rope_cos_sin(cfg: MLAConfig, positions: torch.Tensor, dtype: torch.dtype = torch.float32,
                 inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[B, S, p]`` for integer ``positions [B, S]``, in ``compute_dtype(dtype)``.

    ``cos[..., i] = cos[..., i + p/2] = factor * cos(pos * inv_freq[i])`` (HF's layout).
    """
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"positions must be an integer tensor, got {positions.dtype}")
    if inv_freq is None:
        inv_freq = rope_inv_freq(cfg)[0]
    factor = rope_factor(cfg)
    inv_freq = inv_freq.to(device=positions.device, dtype=torch.float64)
    freqs = positions.to(torch.float64)[..., None] * inv_freq  # [B, S, p/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    out_dtype = compute_dtype(dtype)
    return (emb.cos() * factor).to(out_dtype), (emb.sin() * factor).to(out_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """``[x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]`` over the last dim."""
    return x.unflatten(-1, (x.shape[-1] // 2, 2)).transpose(-1, -2).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = True) -> torch.Tensor:
    """Rotate ``x [..., S, p]`` by ``cos, sin`` (broadcastable to x); returns x's dtype.

    With ``interleave`` the pairs ``(x[2i], x[2i+1])`` are rotated and the result is in the
    de-interleaved order (see the module docstring); otherwise the half-split pairs.
    """
    if x.shape[-1] != cos.shape[-1] or x.shape[-1] % 2:
        raise ValueError(f"apply_rope: last dim of x ({x.shape[-1]}) must be even and match cos ({cos.shape[-1]})")
    work = x.to(cos.dtype)
    if interleave:
        work = deinterleave(work)
    return (work * cos + rotate_half(work) * sin).to(x.dtype)

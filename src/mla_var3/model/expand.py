"""The one K/V expansion of cached latents, in the cache's dtype: the layer's naive mode and
hybrid window, the expanded design over a latent cache, and the cache conversions use it
(:func:`mla_var3.reference.expand_kv` is its fp32 reference)."""

from __future__ import annotations

import torch


def expand_kv(z: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k, v [B, T, H, D]`` of latents ``z [B, T, K]``: ``k[b,t,h] = w_uk[h] @ z[b,t]``,
    ``v[b,t,h] = z[b,t] @ w_uv[h]`` (``w_uk [H, D, K]``, ``w_uv [H, K, DV]``, the per-head blocks
    of ``kv_b_proj``). Two GEMMs in z's dtype (float32 accumulation on GPUs); reads ``B·T·K``
    latent elements, writes ``B·T·H·(D + DV)``."""
    k = torch.einsum("btk,hdk->bthd", z, w_uk.to(z.dtype))
    v = torch.einsum("btk,hkd->bthd", z, w_uv.to(z.dtype))
    return k.contiguous(), v.contiguous()

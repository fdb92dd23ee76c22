"""Weights of the MLA layer: the absorption views of ``kv_b_proj`` and strict loading of a
state dict or ``.safetensors`` files with the HF key names.

Absorption
----------
``kv_b_proj.weight`` is ``[h * (d + dv), k]``; per head its first d rows are ``W_UK`` and the
next dv rows ``W_UV`` (``k_nope = z @ W_UK.T``, ``v = z @ W_UV.T`` per head). The designs want

* ``w_uk [H, D, K]``: ``k[b, t, h] = w_uk[h] @ z[b, t]``; absorbed query ``qc = q_nope @ w_uk[h]``
* ``w_uv [H, K, D]``: ``v[b, t, h] = z[b, t] @ w_uv[h]``; decompression ``o = o_latent @ w_uv[h]``

They are formed by slicing and transposing the checkpoint tensor (no arithmetic), in the
weight's own dtype (bf16 for a bf16 layer): the values are exactly the checkpoint's, so
absorption adds no rounding of its own; the products that use them accumulate in float32 in
the references and kernels. ``contiguous=True`` copies them once into dense tensors.

Loading
-------
Keys (after an optional prefix such as ``model.layers.3.self_attn.``): ``q_a_proj.weight``
(+ ``.bias`` with ``attention_bias``), ``q_a_layernorm.weight``, ``q_b_proj.weight`` (or
``q_proj.weight`` when ``q_lora_rank`` is null), ``kv_a_proj_with_mqa.weight`` (+ bias),
``kv_a_layernorm.weight``, ``kv_b_proj.weight``, ``o_proj.weight`` (+ bias). A missing key, an
unexpected key under the prefix, or a wrong shape is a ValueError naming the key and both shapes.
FP8 block-quantised checkpoints (a float8 ``X.weight`` with ``X.weight_scale_inv``, 128x128
blocks, as DeepSeek-V3 ships) are dequantised on load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

import torch

#: keys a checkpoint may carry that the attention layer has no use for (ignored quietly).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
FP8_BLOCK = 128


@dataclass(frozen=True)
class AbsorbedWeights:
    """Per-head up-projections cut out of ``kv_b_proj``.

    Attributes
    ----------
    w_uk : Tensor [H, D, K]
        Key up-projection (absorbed into the query).
    w_uv : Tensor [H, K, D]
        Value up-projection (applied to the latent output).
    """

    w_uk: torch.Tensor
    w_uv: torch.Tensor


def absorbed_weights(kv_b_weight: torch.Tensor, h: int, d: int, dv: int, contiguous: bool = True) -> AbsorbedWeights:
    """``w_uk [H, D, K]`` and ``w_uv [H, K, Dv]`` from ``kv_b_proj.weight [h*(d+dv), k]``.

    Views of the weight when ``contiguous=False``, dense copies otherwise; same dtype and
    device as the weight (no rounding). See the module docstring for the layouts.
    """
    if kv_b_weight.dim() != 2 or kv_b_weight.shape[0] != h * (d + dv):
        raise ValueError(f"kv_b_proj.weight must be [h*(d+dv)={h * (d + dv)}, k], got {list(kv_b_weight.shape)}")
    per_head = kv_b_weight.detach().view(h, d + dv, kv_b_weight.shape[1])
    w_uk = per_head[:, :d, :]
    w_uv = per_head[:, d:, :].transpose(1, 2)
    if contiguous:
        w_uk, w_uv = w_uk.contiguous(), w_uv.contiguous()
    return AbsorbedWeights(w_uk=w_uk, w_uv=w_uv)


def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight * scale_inv`` with one scale per ``block x block`` tile (DeepSeek-V3's FP8 format)."""
    rows, cols = weight.shape
    expected = ((rows + block - 1) // block, (cols + block - 1) // block)
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"weight_scale_inv must be {list(expected)} for a {list(weight.shape)} weight "
                         f"with {block}x{block} blocks, got {list(scale_inv.shape)}")
    scales = scale_inv.to(dtype).repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return weight.to(dtype) * scales


def _strip_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix`` with the prefix removed; others are left out."""
    return {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}


def _dequantize_all(tensors: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = dict(tensors)
    for key in [key for key in tensors if key.endswith(".weight_scale_inv")]:
        weight_key = key[: -len("_scale_inv")]
        if weight_key not in tensors:
            raise ValueError(f"{prefix}{key} has no matching {prefix}{weight_key}")
        out[weight_key] = dequantize_fp8_blocks(tensors[weight_key], out.pop(key), dtype=dtype)
    return out


def match_state_dict(expected: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor],
                     prefix: str = "", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Check ``state_dict`` (keys under ``prefix``) against the ``expected`` tensors' keys and shapes.

    Returns the tensors keyed like ``expected``. Raises ValueError listing every missing key,
    unexpected key and shape mismatch (key, expected shape, actual shape).
    """
    found = _dequantize_all(_strip_prefix(state_dict, prefix), prefix, dtype)
    found = {key: value for key, value in found.items() if not key.endswith(IGNORED_SUFFIXES)}
    problems: list[str] = []
    for key, ref in expected.items():
        if key not in found:
            problems.append(f"missing {prefix}{key} (expected shape {list(ref.shape)})")
        elif tuple(found[key].shape) != tuple(ref.shape):
            problems.append(f"{prefix}{key}: expected shape {list(ref.shape)}, got {list(found[key].shape)}")
    for key in found:
        if key not in expected:
            problems.append(f"unexpected {prefix}{key} (shape {list(found[key].shape)})")
    if not found and expected:
        problems.append(f"no tensor under prefix {prefix!r}")
    if problems:
        raise ValueError("MLA layer weights do not match the config:\n  " + "\n  ".join(problems))
    return {key: found[key] for key in expected}


def read_safetensors(paths: str | os.PathLike | Iterable[str | os.PathLike], prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` in one or several ``.safetensors`` files (full keys kept).

    Only the keys under the prefix are read. A key present in two files is a ValueError.
    """
    from safetensors import safe_open

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, str] = {}
    for path in paths:
        with safe_open(os.fspath(path), framework="pt") as handle:
            for key in handle.keys():
                if not key.startswith(prefix):
                    continue
                if key in tensors:
                    raise ValueError(f"{key} is in both {where[key]} and {os.fspath(path)}")
                tensors[key] = handle.get_tensor(key)
                where[key] = os.fspath(path)
    return tensors

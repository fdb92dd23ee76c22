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
Values may be torch tensors or numpy arrays (converted); anything else, a non-floating dtype, or
a tensor without data (the meta device) is a ValueError naming the key.
FP8 block-quantised checkpoints (a float8 ``X.weight`` with ``X.weight_scale_inv``, 128x128
blocks, as DeepSeek-V3 ships) are dequantised on load; a float8 weight without its
``weight_scale_inv`` is refused (it would load unscaled, off by the block scales), as is a scale
given for a weight that is not float8. A ``.safetensors`` file that cannot be read (missing, a
directory, empty, truncated, not safetensors) is a ValueError naming the file and the problem.

Gradients: :func:`absorbed_weights` returns detached tensors by default (the layer's absorbed
and hybrid paths are for inference); pass ``detach=False`` for views that carry gradients back
to ``kv_b_proj``.
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


def absorbed_weights(kv_b_weight: torch.Tensor, h: int, d: int, dv: int, contiguous: bool = True,
                     detach: bool = True) -> AbsorbedWeights:
    """``w_uk [H, D, K]`` and ``w_uv [H, K, Dv]`` from ``kv_b_proj.weight [h*(d+dv), k]``.

    Views of the weight when ``contiguous=False``, dense copies otherwise; same dtype and
    device as the weight (no rounding). See the module docstring for the layouts.

    Inference only by default: with ``detach=True`` the results do not require grad, so a loss
    computed through them gives ``kv_b_proj.weight`` no gradient. ``detach=False`` keeps them
    in the autograd graph (a dense copy is then an autograd copy of the weight).
    """
    if kv_b_weight.dim() != 2 or kv_b_weight.shape[0] != h * (d + dv):
        raise ValueError(f"kv_b_proj.weight must be [h*(d+dv)={h * (d + dv)}, k], got {list(kv_b_weight.shape)}")
    source = kv_b_weight.detach() if detach else kv_b_weight
    per_head = source.view(h, d + dv, kv_b_weight.shape[1])
    w_uk = per_head[:, :d, :]
    w_uv = per_head[:, d:, :].transpose(1, 2)
    if contiguous:
        w_uk, w_uv = w_uk.contiguous(), w_uv.contiguous()
    return AbsorbedWeights(w_uk=w_uk, w_uv=w_uv)


def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``weight * scale_inv`` with one scale per ``block x block`` tile (DeepSeek-V3's FP8 format)."""
    if weight.dim() != 2:
        raise ValueError(f"an FP8 block-quantised weight must be 2-D, got shape {list(weight.shape)}")
    if not scale_inv.is_floating_point() or _is_float8(scale_inv.dtype):
        raise ValueError(f"weight_scale_inv must hold float32/bf16 scales, got {scale_inv.dtype}")
    rows, cols = weight.shape
    expected = ((rows + block - 1) // block, (cols + block - 1) // block)
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"weight_scale_inv must be {list(expected)} for a {list(weight.shape)} weight "
                         f"with {block}x{block} blocks, got {list(scale_inv.shape)}")
    if not bool(torch.isfinite(scale_inv).all()):
        raise ValueError("weight_scale_inv holds NaN or infinite scales")
    scales = scale_inv.to(dtype).repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return weight.to(dtype) * scales


_FLOAT8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                                 "float8_e8m0fnu") if hasattr(torch, name))


def _is_float8(dtype: torch.dtype) -> bool:
    return dtype in _FLOAT8


def _as_tensor(key: str, value) -> torch.Tensor:
    """A state-dict value as a tensor: tensors as they are, numpy arrays converted; anything
    else (lists, numbers, None), or a tensor without data, is a ValueError naming the key."""
    if isinstance(value, torch.Tensor):
        tensor = value
    elif type(value).__module__ == "numpy" and hasattr(value, "dtype") and hasattr(value, "shape"):
        import numpy as np

        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            raise ValueError(f"{key}: a numpy value must be a numeric array, got {type(value).__name__} "
                             f"of dtype {value.dtype}")
        tensor = torch.from_numpy(np.array(value, copy=True, order="C"))
    else:
        raise ValueError(f"{key} must be a torch.Tensor or a numpy array, got {type(value).__name__}")
    if tensor.is_meta:
        raise ValueError(f"{key} is on the meta device: it has no values to load")
    if tensor.layout != torch.strided:
        raise ValueError(f"{key} must be a dense tensor, got layout {tensor.layout}")
    return tensor


def _strip_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under ``prefix`` with the prefix removed (numpy arrays converted); others are
    left out."""
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"state_dict must be a mapping of key -> tensor, got {type(state_dict).__name__}")
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, got {type(prefix).__name__}")
    bad_keys = [key for key in state_dict if not isinstance(key, str)]
    if bad_keys:
        raise ValueError(f"state_dict keys must be strings, got {bad_keys[0]!r}")
    return {key[len(prefix):]: _as_tensor(key, value) for key, value in state_dict.items() if key.startswith(prefix)}


def _dequantize_all(tensors: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every float8 ``X.weight`` times its ``X.weight_scale_inv``; a float8 tensor without its
    scales, a scale without a float8 weight, or a non-floating tensor is a ValueError."""
    out = dict(tensors)
    for key in [key for key in tensors if key.endswith(".weight_scale_inv")]:
        weight_key = key[: -len("_scale_inv")]
        if weight_key not in tensors:
            raise ValueError(f"{prefix}{key} has no matching {prefix}{weight_key}")
        if not _is_float8(tensors[weight_key].dtype):
            raise ValueError(f"{prefix}{key} is given for {prefix}{weight_key} of dtype {tensors[weight_key].dtype}: "
                             "block scales belong to float8 weights only (was the weight dequantised already?)")
        try:
            out[weight_key] = dequantize_fp8_blocks(tensors[weight_key], out.pop(key), dtype=dtype)
        except ValueError as exc:
            raise ValueError(f"{prefix}{weight_key}: {exc}") from None
    for key, value in out.items():
        if _is_float8(value.dtype):
            raise ValueError(f"{prefix}{key} is {value.dtype} but {prefix}{key}_scale_inv is missing: "
                             "an FP8 weight without its block scales would load unscaled")
        if not value.is_floating_point():
            raise ValueError(f"{prefix}{key} has dtype {value.dtype}; expected a floating-point tensor")
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

    Only the keys under the prefix are read. A key present in two files is a ValueError; so is
    a file that is missing, a directory, empty, truncated or not in the safetensors format (the
    message names the file and says which).
    """
    from safetensors import safe_open

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        paths = list(paths)
    except TypeError:
        raise ValueError(f"paths must be a path or a list of paths, got {type(paths).__name__}") from None
    if not paths:
        raise ValueError("read_safetensors: no files given")
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, got {type(prefix).__name__}")
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, str] = {}
    for path in paths:
        _check_safetensors_file(path)
        name = os.fspath(path)
        try:
            with safe_open(name, framework="pt") as handle:
                keys = [key for key in handle.keys() if key.startswith(prefix)]
                twice = [key for key in keys if key in tensors]
                found = {} if twice else {key: handle.get_tensor(key) for key in keys}
        except Exception as exc:          # safetensors' own error type, or an OSError while mapping the file
            reason = str(exc).removeprefix("Error while deserializing header: ")
            if "not fully covered" in reason:
                reason += " (the data ends before the tensors its header lists: truncated?)"
            raise ValueError(f"safetensors file {name!r} cannot be read: {reason}") from None
        if twice:
            raise ValueError(f"{twice[0]} is in both {where[twice[0]]} and {name}")
        tensors.update(found)
        where.update(dict.fromkeys(found, name))
    return tensors


def _check_safetensors_file(path) -> None:
    """Refuse what safetensors would report vaguely: a missing file, a directory, a file too
    short for the 8-byte header length, or a header length beyond the end of the file."""
    from mla_var3._io import check_file

    size = check_file(path, "safetensors file")
    name = os.fspath(path)
    if size == 0:
        raise ValueError(f"safetensors file {name!r} is empty")
    if size < 8:
        raise ValueError(f"safetensors file {name!r} has {size} bytes: too short for a safetensors header")
    with open(name, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    if header_len > size - 8:
        raise ValueError(f"safetensors file {name!r} announces a {header_len:,}-byte header but has {size - 8:,} bytes "
                         "after it: truncated, or not a safetensors file")

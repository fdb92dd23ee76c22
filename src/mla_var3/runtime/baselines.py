"""Baselines: what a user would run instead of our kernels, timed in the same process.

* ``torch_eager_absorbed`` — the absorbed computation in eager PyTorch: bf16 matmuls
  ``Qc·Zᵀ + QPE·KPEᵀ``, softmax in fp32, ``P·Z`` in bf16 (cost model: flash_mla).
* ``torch_sdpa_expanded`` — ``torch.nn.functional.scaled_dot_product_attention`` on expanded
  K/V: q/k head dim d + p (the RoPE key materialised per head), v head dim dv, layout
  [B, H, T, D] (cost model: flash_attention, the seed's formula, which counts exactly that).
  For s > 1 the correct bottom-right causal mask is passed as ``attn_mask``: SDPA's own
  ``is_causal`` aligns the mask top-left, wrong for queries at the end of a cache. The backend
  that ran is recorded (the flash backend refuses q/k 192 with v 128).
* ``flashmla_official`` — DeepSeek's ``flash_mla`` package (dense decode over a paged cache),
  only if importable.
* ``flashinfer_mla`` — FlashInfer's MLA wrapper, only if importable.

Each ``make_*`` returns a :class:`Baseline` (a no-argument call plus what ran) or raises
:class:`BaselineUnavailable` with the reason (not importable, too much memory).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mla_var3.reference.inputs import design_inputs, torch_dtype
from mla_var3.shapes import MLADims, Problem

#: the cost model (analysis.cost name) each baseline is measured against.
COST_MODEL = {"torch_eager_absorbed": "flash_mla", "torch_sdpa_expanded": "flash_attention",
              "flashmla_official": "flash_mla", "flashinfer_mla": "flash_mla"}


class BaselineUnavailable(RuntimeError):
    """The baseline cannot run here (the reason is the message)."""


@dataclass(frozen=True)
class Baseline:
    name: str
    call: Callable[[], object]
    backend: str


def bottom_right_mask(s: int, t: int, device) -> torch.Tensor:
    """Bool [S, T]: query i sees keys j <= t - s + i (the causal rule for queries at the end)."""
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    return j <= t - s + i


def _free_bytes(device) -> int:
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return 8 * 2**30


def _check_memory(name: str, need: int, device, fraction: float = 0.4) -> None:
    """Refuse when temporaries need more than ``fraction`` of free memory (a captured CUDA graph
    holds its own copy of them next to the eager warm-up's)."""
    free = _free_bytes(device)
    if need > fraction * free:
        raise BaselineUnavailable(f"{name} needs ~{need / 1e9:.1f} GB of temporaries, {free / 1e9:.1f} GB free")


def eager_absorbed(qc, qpe, z, kpe, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    """Absorbed attention in eager PyTorch: bf16 matmuls, fp32 softmax -> o_latent [B,H,S,K].

    Heads and queries are folded into one M dimension ([B, H*S, K] @ [B, K, T]), so each
    batched matmul reads Z once per sequence instead of broadcasting it per head.
    """
    b, h, s, k = qc.shape
    t = z.shape[1]
    scores = torch.bmm(qc.reshape(b, h * s, k), z.transpose(1, 2))              # [B, H*S, T]
    scores = scores + torch.bmm(qpe.reshape(b, h * s, -1), kpe.transpose(1, 2))
    scores = scores.float().mul_(scale).view(b, h, s, t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(qc.dtype).view(b, h * s, t)
    return torch.bmm(p, z).view(b, h, s, k)                                      # [B, H, S, K]


def make_torch_eager_absorbed(dims: MLADims, problem: Problem, dtype: str, device) -> Baseline:
    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    w = torch_dtype(dtype).itemsize
    _check_memory("torch_eager_absorbed", b * h * s * t * (3 * w + 8), device)
    x = design_inputs("flash_mla", dims, problem, dtype=dtype, device=device)
    mask = bottom_right_mask(s, t, device) if problem.causal and s > 1 else None
    return Baseline("torch_eager_absorbed",
                    lambda: eager_absorbed(x["qc"], x["qpe"], x["z"], x["kpe"], x["scale"], mask), "eager")


def _sdpa_backend_name(q, k, v, mask, scale) -> str:
    """The backend SDPA's dispatcher picks for these inputs (best effort)."""
    try:
        from torch.nn.attention import SDPBackend

        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=scale)
        names = {int(m.value): n for n, m in SDPBackend.__members__.items()}
        return names.get(int(choice), f"backend {int(choice)}").lower()
    except Exception:
        return "unknown"


def make_torch_sdpa_expanded(dims: MLADims, problem: Problem, dtype: str, device) -> Baseline:
    import torch.nn.functional as F

    b, s, t, h = problem.b, problem.s, problem.t, dims.h
    d, p, dv = dims.d, dims.p, dims.dv
    w = torch_dtype(dtype).itemsize
    _check_memory("torch_sdpa_expanded", b * h * t * (d + p + dv) * w * 2, device)
    x = design_inputs("flash_attention", dims, problem, dtype=dtype, device=device)
    q = torch.cat([x["q"], x["qpe"]], dim=-1)                                           # [B,H,S,D+P]
    kpe = x["kpe"][:, :, None, :].expand(b, t, h, p)
    k = torch.cat([x["k"], kpe], dim=-1).transpose(1, 2).contiguous()                    # [B,H,T,D+P]
    v = x["v"].transpose(1, 2).contiguous()                                              # [B,H,T,DV]
    del x
    mask = bottom_right_mask(s, t, device) if problem.causal and s > 1 else None
    scale = dims.default_scale
    backend = _sdpa_backend_name(q, k, v, mask, scale)
    call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # noqa: E731
    return Baseline("torch_sdpa_expanded", call, f"sdpa:{backend}" + (" (bottom-right attn_mask)" if mask is not None else ""))


def _import_for_cuda(package: str, device):
    """``package`` imported, or BaselineUnavailable when it is missing or ``device`` is not CUDA."""
    if importlib.util.find_spec(package) is None:
        raise BaselineUnavailable(f"{package} package not importable")
    if torch.device(device).type != "cuda":
        raise BaselineUnavailable(f"{package} needs a CUDA device")
    return importlib.import_module(package)


def paged_inputs(dims: MLADims, problem: Problem, lengths: list[int], dtype: str, device, seed: int = 0) -> dict:
    """A ragged batch in FlashMLA's layout, the same for every caller with the same arguments:
    ``q [b, s, h, K + P]``, ``cache [pages, 64, 1, K + P]`` (pages in random order, NaN past each
    length), ``table [b, max_blocks]`` int32 (-1 past each sequence), ``seqlens [b]`` int32 and
    ``scale``; ``problem.t`` is the capacity (every length <= t)."""
    from mla_var3.reference import make_inputs, make_paged

    x = make_inputs(dims, problem, dtype=torch_dtype(dtype), device=device, seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    cache, table = make_paged(x.z, x.kpe, seqlens, page_block_size=64, seed=seed)
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    return {"q": q, "cache": cache, "table": table, "seqlens": seqlens, "scale": x.scale}


def make_flashmla_official(dims: MLADims, problem: Problem, dtype: str, device, lengths=None) -> Baseline:
    """Official FlashMLA's dense decode: over a contiguous paged copy of the uniform inputs, or,
    with ``lengths``, over :func:`paged_inputs` (the ragged points' inputs)."""
    flash_mla = _import_for_cuda("flash_mla", device)
    if lengths is not None:
        x = paged_inputs(dims, problem, lengths, dtype, device)
        meta, splits = flash_mla.get_mla_metadata(x["seqlens"], problem.s * dims.h, 1)
        causal = problem.causal and problem.s > 1
        call = lambda: flash_mla.flash_mla_with_kvcache(x["q"], x["cache"], x["table"], x["seqlens"],  # noqa: E731
                                                        dims.k, meta, splits, softmax_scale=x["scale"], causal=causal)
        return Baseline("flashmla_official", call, f"flash_mla {getattr(flash_mla, '__version__', '')}".strip())

    b, s, t, h, k, p = problem.b, problem.s, problem.t, dims.h, dims.k, dims.p
    block = 64
    nblk = -(-t // block)
    x = design_inputs("flash_mla", dims, problem, dtype=dtype, device=device)
    q = torch.cat([x["qc"], x["qpe"]], dim=-1).transpose(1, 2).contiguous()             # [B,S,H,K+P]
    dense = torch.cat([x["z"], x["kpe"]], dim=-1)                                        # [B,T,K+P]
    cache = torch.zeros(b * nblk * block, k + p, dtype=dense.dtype, device=device)
    cache.view(b, nblk * block, k + p)[:, :t] = dense
    cache = cache.view(b * nblk, block, 1, k + p)
    table = torch.arange(b * nblk, dtype=torch.int32, device=device).view(b, nblk)
    seqlens = torch.full((b,), t, dtype=torch.int32, device=device)
    meta, splits = flash_mla.get_mla_metadata(seqlens, s * h, 1)
    call = lambda: flash_mla.flash_mla_with_kvcache(q, cache, table, seqlens, k, meta, splits,  # noqa: E731
                                                    softmax_scale=x["scale"], causal=problem.causal and s > 1)
    return Baseline("flashmla_official", call, f"flash_mla {getattr(flash_mla, '__version__', '')}".strip())


def make_flashinfer_mla(dims: MLADims, problem: Problem, dtype: str, device) -> Baseline:
    flashinfer = _import_for_cuda("flashinfer", device)

    b, s, t, h, k, p = problem.b, problem.s, problem.t, dims.h, dims.k, dims.p
    x = design_inputs("flash_mla", dims, problem, dtype=dtype, device=device)
    page = 1
    q_nope = x["qc"].transpose(1, 2).reshape(b * s, h, k).contiguous()
    q_pe = x["qpe"].transpose(1, 2).reshape(b * s, h, p).contiguous()
    ckv = x["z"].reshape(b * t, page, k)
    kpe = x["kpe"].reshape(b * t, page, p)
    i32 = dict(dtype=torch.int32, device=device)
    qo_indptr = torch.arange(b + 1, **i32) * s
    kv_indptr = torch.arange(b + 1, **i32) * t
    kv_indices = torch.arange(b * t, **i32)
    kv_lens = torch.full((b,), t, **i32)
    workspace = torch.empty(128 * 2**20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace)
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, h, k, p, page, problem.causal and s > 1, x["scale"],
                 q_nope.dtype, ckv.dtype)
    return Baseline("flashinfer_mla", lambda: wrapper.run(q_nope, q_pe, ckv, kpe),
                    f"flashinfer {getattr(flashinfer, '__version__', '')}".strip())


MAKERS = {
    "torch_eager_absorbed": make_torch_eager_absorbed,
    "torch_sdpa_expanded": make_torch_sdpa_expanded,
    "flashmla_official": make_flashmla_official,
    "flashinfer_mla": make_flashinfer_mla,
}
BASELINES = tuple(MAKERS)


#: baselines that take a ragged paged batch (``lengths``)
RAGGED = ("flashmla_official",)


def make_baseline(name: str, dims: MLADims, problem: Problem, dtype: str = "bf16", device="cuda",
                  lengths: list[int] | None = None) -> Baseline:
    """Build baseline ``name`` for one shape (raises :class:`BaselineUnavailable`); ``lengths``: a
    ragged paged batch (only the baselines in :data:`RAGGED`)."""
    try:
        maker = MAKERS[name]
    except KeyError:
        raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}") from None
    if lengths is not None:
        if name not in RAGGED:
            raise ValueError(f"baseline {name!r} takes no ragged batch; those that do: {', '.join(RAGGED)}")
        return maker(dims, problem, dtype, device, lengths=lengths)
    return maker(dims, problem, dtype, device)

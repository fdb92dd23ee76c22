"""A FlashMLA-compatible entry point: an engine that calls FlashMLA's dense decode can call this
with the same code.

Mirrors the dense bf16/fp16 mode of FlashMLA's public interface
(``flash_mla.flash_mla_interface``: ``get_mla_metadata`` and ``flash_mla_with_kvcache``):

* ``q`` [b, s_q, h_q, K + P] (576 for DeepSeek: 512 latent + 64 RoPE), the absorbed query with
  its RoPE part last;
* ``k_cache`` [num_blocks, page_block_size, 1, K + P], paged through ``block_table``
  [b, max_blocks] int32, with ``cache_seqlens`` [b] int32 valid tokens per sequence;
* returns ``out`` [b, s_q, h_q, head_dim_v] in q's dtype and ``softmax_lse`` [b, h_q, s_q] float32;
* ``softmax_scale`` defaults to ``1/sqrt(K + P)`` (q's last dim); with ``causal`` query i of the
  s_q sees keys ``j <= cache_seqlens[b] - s_q + i`` (the mask is aligned bottom-right).

The scheduling metadata holds this package's decode state for one step
(:class:`mla_var3.kernel.decode.AbsorbedDecode`): the split of the batch's key blocks over the
SMs, computed on the GPU without a host synchronisation, and the workspace of split items.
``get_mla_metadata()`` returns an empty object that the first call fills (FlashMLA's current
interface; the arguments of its older interface are accepted and not needed). It is built once
per decode step and reused by every layer; reusing it with other shapes raises ValueError, as
FlashMLA refuses it. Unlike FlashMLA, a metadata reused with other lengths (another
``cache_seqlens`` tensor, or the same one written in place since) plans again instead of
dropping keys; inside a CUDA-graph capture the new plan is built into the graph. (Lengths
created under ``torch.inference_mode()`` count no versions: write those in place only with a new
metadata per step, as FlashMLA requires.)

Capture in a CUDA graph works however the metadata was first used: inside the capture, or by
eager calls before it (an engine's warm-up). Every kernel a plan may launch is compiled by its
first call, never inside a later capture. The graph replays the plan it captured: a metadata
first used inside the capture plans the lengths each replay finds; one used before the capture
keeps the plan of those lengths (FlashMLA's rule).

Not supported (raise NotImplementedError): fp8 KV cache, sparse attention (``indices``,
``topk_length``), attention sinks, extra KV caches. The fast path (the sm_90 Gluon kernel) takes
``head_dim_v = 512``, a 576-wide cache and 64-token pages, like FlashMLA; other power-of-two
widths (``head_dim_v`` and ``K + P - head_dim_v`` >= 16) and page sizes run the portable kernel.
Lengths may be 0 (an empty sequence) or lie in ``[s_q, capacity]``; their values, and the block
table's, are checked only with ``MLA_VAR3_CHECK=1`` on CUDA (each check synchronises).

Example
-------
>>> sched, _ = get_mla_metadata()                                                   # doctest: +SKIP
>>> out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, sched,
...                                   causal=True)                                 # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from mla_var3.kernel._common import bind_shape, check_inference, check_scale
from mla_var3.kernel.decode import AbsorbedDecode, entry_signature, entry_spec, fast_scale

__all__ = ["MLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache"]


@dataclass
class MLASchedMeta:
    """Scheduling metadata: the decode plan of one step, built by :func:`get_mla_metadata` or by
    the first :func:`flash_mla_with_kvcache` call that uses it.

    ``config`` records (b, s_q, h_q, page_block_size, h_k, causal); later calls with the same
    object must match it (FlashMLA's rule: reuse only for the same shapes). ``decode`` holds the
    step's plan and workspace (made with the object; its plan is built by the first call).
    """

    have_initialized: bool = False
    config: tuple | None = None
    decode: AbsorbedDecode = field(default_factory=AbsorbedDecode)

    @property
    def plan(self):
        """The step's :class:`~mla_var3.kernel.decode_plan.DecodePlan` (None before the first call)."""
        return self.decode.decode_plan


def get_mla_metadata(cache_seqlens: torch.Tensor | None = None, num_q_tokens_per_head_k: int | None = None,
                     num_heads_k: int | None = None, *args, **kwargs) -> tuple[MLASchedMeta, None]:
    """The scheduling metadata of a decode step, and ``None`` (FlashMLA's second value).

    The plan is built by the first :func:`flash_mla_with_kvcache` call that uses the metadata
    (it needs the block table's width, which sizes its buffers), on the GPU, with no host
    synchronisation (capturable in a CUDA graph), and reused by the later calls (the other
    layers of the step). The arguments of FlashMLA's older interface (``cache_seqlens``,
    ``num_q_tokens_per_head_k``, ``num_heads_k``) and further ones are accepted and not needed:
    the calls pass the lengths. Allocates nothing (no tensor, so no default device matters).
    """
    return MLASchedMeta(), None


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: MLASchedMeta | None,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's dense paged decode, run by this package's absorbed kernel.

    Parameters
    ----------
    q : [b, s_q, h_q, K + P] bf16/fp16
    k_cache : [num_blocks, page_block_size, 1, K + P], same dtype
    block_table : [b, max_blocks] int32
    cache_seqlens : [b] int32, s_q <= cache_seqlens[i] <= max_blocks * page_block_size
    head_dim_v : int  K, the value (latent) width: 512 for DeepSeek
    tile_scheduler_metadata : MLASchedMeta from :func:`get_mla_metadata` (None is accepted)
    num_splits : must be None
    softmax_scale : float, default ``(K + P) ** -0.5``
    causal : bool, bottom-right aligned causal mask among the s_q queries

    Returns
    -------
    out : [b, s_q, h_q, head_dim_v] in q's dtype
    softmax_lse : [b, h_q, s_q] float32 (natural log)
    """
    meta = tile_scheduler_metadata
    # one test per argument (a generator over them costs an eager call about a microsecond)
    plain = (num_splits is None and not is_fp8_kvcache and indices is None and attn_sink is None
             and extra_k_cache is None and extra_indices_in_kvcache is None and topk_length is None
             and extra_topk_length is None)
    entry, done = _fast_call(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, softmax_scale, causal, plain)
    if done is not None:
        return done
    check_inference(q, k_cache)
    unsupported = {
        "is_fp8_kvcache=True": bool(is_fp8_kvcache), "indices (sparse attention)": indices is not None,
        "attn_sink": attn_sink is not None, "extra_k_cache": extra_k_cache is not None,
        "extra_indices_in_kvcache": extra_indices_in_kvcache is not None, "topk_length": topk_length is not None,
        "extra_topk_length": extra_topk_length is not None,
    }
    asked = [name for name, used in unsupported.items() if used]
    if asked:
        raise NotImplementedError(f"flash_mla_with_kvcache: {', '.join(asked)} not supported; only the dense "
                                  f"bf16/fp16 mode is implemented")
    if num_splits is not None:
        raise ValueError("num_splits must be None (FlashMLA's current interface; splits are planned internally)")
    if block_table is None or cache_seqlens is None:
        raise ValueError("block_table and cache_seqlens are required for dense attention")
    if meta is not None and not isinstance(meta, MLASchedMeta):
        raise ValueError(f"tile_scheduler_metadata must come from mla_var3.compat.get_mla_metadata(), got "
                         f"{type(meta).__name__}")
    if not (isinstance(causal, bool) or (isinstance(causal, int) and causal in (0, 1))):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    causal = bool(causal)
    config, dv = _checked_config(q, k_cache, head_dim_v, causal)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else check_scale(softmax_scale, name="softmax_scale")
    if meta is None:
        decode = AbsorbedDecode.for_one_call(q.device)
    else:
        if meta.have_initialized and meta.config != config:
            raise ValueError(f"tile_scheduler_metadata was built for (b, s_q, h_q, page_block_size, h_k, causal) = "
                             f"{meta.config}, called with {config}; use a new get_mla_metadata() per configuration")
        meta.have_initialized, meta.config, decode = True, config, meta.decode
    # [b, s_q, h_q, .] -> the kernel's [b, h_q, s_q, .] as views (no copies): rows token * h_q + head; the
    # sm_90 kernel writes its output in the same order, so the transposed result is [b, s_q, h_q, dv]
    qt = q.transpose(1, 2)
    o, lse = decode.run_paged(qt[..., :dv], qt[..., dv:], k_cache, block_table, cache_seqlens, scale=scale,
                              causal=causal, names=_NAMES, entry=entry)
    return o.transpose(1, 2).contiguous(), lse


def _fast_call(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, softmax_scale, causal, plain: bool):
    """``(entry, result)``: the call's signature for the checked path to keep (see
    :func:`mla_var3.kernel.decode.entry_signature`; None where it cannot take the fast path),
    and the call's ``(out, lse)`` when an earlier call with that signature checked and compiled
    everything (else None: take the checked path)."""
    scale = softmax_scale
    if scale is None and isinstance(q, torch.Tensor):
        scale = q.shape[-1] ** -0.5
    if not (plain and (type(meta) is MLASchedMeta or meta is None) and type(head_dim_v) is int and fast_scale(scale)):
        return None, None
    entry = entry_signature("compat", "auto", causal, (q, k_cache, block_table), cache_seqlens, head_dim_v)
    spec = entry_spec(entry)
    if spec is None:
        return entry, None
    config = (*q.shape[:3], k_cache.shape[1], 1, causal)
    if meta is not None and meta.have_initialized and meta.config != config:
        return entry, None                            # the checked path raises
    decode = AbsorbedDecode.for_one_call(q.device) if meta is None else meta.decode
    base, cache = q.data_ptr(), k_cache.data_ptr()
    done = spec.launch(decode, (base, base + spec.kr_offset, cache, cache + spec.kr_offset), block_table,
                       cache_seqlens, cache_seqlens, scale, token_major=True)
    if done is not None and meta is not None:
        meta.have_initialized, meta.config = True, config
    return entry, done


def _checked_config(q, k_cache, head_dim_v, causal: bool) -> tuple[tuple, int]:
    """``((b, s_q, h_q, page_block_size, h_k, causal), head_dim_v)`` of a call, its shapes and
    widths checked (ValueError naming FlashMLA's arguments)."""
    sizes: dict[str, int] = {}
    bind_shape("q", q, "b s_q h_q D", sizes)
    bind_shape("k_cache", k_cache, "num_blocks page_block_size h_k D", sizes)
    if sizes["h_k"] != 1:
        raise ValueError(f"k_cache must have num_heads_k = 1 (MLA shares one latent per token; GQA-style caches "
                         f"with several KV heads are not supported), got {sizes['h_k']}")
    dv = head_dim_v
    if isinstance(dv, bool) or not isinstance(dv, int) or not 0 < dv < sizes["D"]:
        raise ValueError(f"head_dim_v must lie in (0, {sizes['D']}) as an int (q's last dim holds the latent and RoPE "
                         f"parts), got {head_dim_v!r}")
    for width, what in ((dv, "head_dim_v (the latent width)"), (sizes["D"] - dv, "q.shape[-1] - head_dim_v (the "
                                                                                  "RoPE width)")):
        if width < 16 or width & (width - 1):
            raise ValueError(f"{what} must be a power of two >= 16 (DeepSeek: head_dim_v = 512 of 576), got {width} "
                             f"with head_dim_v={dv} and q.shape[-1]={sizes['D']}")
    return (sizes["b"], sizes["s_q"], sizes["h_q"], sizes["page_block_size"], sizes["h_k"], causal), dv


#: FlashMLA's names of the arguments, for the errors of the checks they reach
_NAMES = MappingProxyType({"qc": "q[..., :head_dim_v]", "qpe": "q[..., head_dim_v:]", "kv_cache": "k_cache",
                           "block_table": "block_table", "seqlens": "cache_seqlens"})

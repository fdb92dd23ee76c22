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

The scheduling metadata holds this package's decode plan (:mod:`mla_var3.kernel.decode_plan`):
the split of the batch's key blocks over the SMs, computed on the GPU without a host
synchronisation. ``get_mla_metadata(cache_seqlens, s_q * h_q // h_k, h_k)`` builds it at once
(FlashMLA's older interface); ``get_mla_metadata()`` returns an empty object that the first
call fills (FlashMLA's current interface). Either way it is built once per decode step and
reused by every layer; reusing it with other shapes raises ValueError, as FlashMLA refuses it.
Where the GPU chooses the plan's kind (packed or one item per program), the choice is also copied
to the host behind the planner, never waited for: eager calls made after it has landed (a step's
later layers) launch the chosen kernel alone, calls before it and calls captured in a CUDA graph
launch both, each exiting unless the plan is its kind (``mla_var3.kernel.decode_plan.KindReadback``).

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

from dataclasses import dataclass

import torch

from mla_var3.kernel._common import bind_shape, check_inference
from mla_var3.kernel.absorbed import _REPLAYS, _replay_key, flash_mla_paged
from mla_var3.kernel.decode_plan import DecodePlan, plan_decode

__all__ = ["MLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache"]


@dataclass
class MLASchedMeta:
    """Scheduling metadata: the decode plan of one step, built by :func:`get_mla_metadata` or by
    the first :func:`flash_mla_with_kvcache` call that uses it.

    ``config`` records (b, s_q, h_q, page_block_size, h_k, causal); later calls with the same
    object must match it (FlashMLA's rule: reuse only for the same shapes and lengths).
    """

    have_initialized: bool = False
    config: tuple | None = None
    plan: DecodePlan | None = None


def get_mla_metadata(cache_seqlens: torch.Tensor | None = None, num_q_tokens_per_head_k: int | None = None,
                     num_heads_k: int | None = None, *args, **kwargs) -> tuple[MLASchedMeta, None]:
    """The scheduling metadata of a decode step, and ``None`` (FlashMLA's second value).

    The plan is built by the first :func:`flash_mla_with_kvcache` call that uses the metadata
    (it needs the block table's width, which sizes its buffers), on the GPU, with no host
    synchronisation (capturable in a CUDA graph), and reused by the later calls (the other
    layers of the step). The arguments of FlashMLA's older interface (``cache_seqlens``,
    ``num_q_tokens_per_head_k``, ``num_heads_k``) and further ones are accepted and not needed:
    the calls pass the lengths.
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
    check_inference(q, k_cache)
    meta = tile_scheduler_metadata
    if isinstance(meta, MLASchedMeta) and meta.plan is not None and _REPLAYS and not (
            num_splits or is_fp8_kvcache or indices is not None or attn_sink is not None or extra_k_cache is not None
            or extra_indices_in_kvcache is not None or topk_length is not None or extra_topk_length is not None):
        # a later layer of the step: the same buffers repeat an earlier call (no checks, no set-up)
        replay = _REPLAYS.get(_replay_key("compat", (q, k_cache, block_table, cache_seqlens),
                                          softmax_scale or 0.0, causal, (meta.plan, head_dim_v)))
        if replay is not None:
            return replay()
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
    if tile_scheduler_metadata is not None and not isinstance(tile_scheduler_metadata, MLASchedMeta):
        raise ValueError(f"tile_scheduler_metadata must come from mla_var3.compat.get_mla_metadata(), got "
                         f"{type(tile_scheduler_metadata).__name__}")
    sizes: dict[str, int] = {}
    bind_shape("q", q, "b s_q h_q D", sizes)
    bind_shape("k_cache", k_cache, "num_blocks page_block_size h_k D", sizes)
    if sizes["h_k"] != 1:
        raise ValueError(f"k_cache must have num_heads_k = 1 (MLA shares one latent per token), got {sizes['h_k']}")
    dv = head_dim_v
    if isinstance(dv, bool) or not isinstance(dv, int) or not 0 < dv < sizes["D"]:
        raise ValueError(f"head_dim_v must lie in (0, {sizes['D']}) as an int (q's last dim holds the latent and RoPE "
                         f"parts), got {head_dim_v!r}")
    for width, what in ((dv, "head_dim_v (the latent width)"), (sizes["D"] - dv, "q.shape[-1] - head_dim_v (the "
                                                                                  "RoPE width)")):
        if width < 16 or width & (width - 1):
            raise ValueError(f"{what} must be a power of two >= 16 (DeepSeek: head_dim_v = 512 of 576), got {width} "
                             f"with head_dim_v={dv} and q.shape[-1]={sizes['D']}")
    config = (sizes["b"], sizes["s_q"], sizes["h_q"], sizes["page_block_size"], sizes["h_k"], bool(causal))
    plan = None
    if meta is not None:
        if meta.have_initialized and meta.config != config:
            raise ValueError(f"tile_scheduler_metadata was built for (b, s_q, h_q, page_block_size, h_k, causal) = "
                             f"{meta.config}, called with {config}; use a new get_mla_metadata() per configuration")
        if meta.plan is None:
            meta.plan = plan_decode(cache_seqlens, sizes["s_q"] * sizes["h_q"], k=dv,
                                    capacity=block_table.shape[-1] * sizes["page_block_size"])
        meta.have_initialized, meta.config, plan = True, config, meta.plan
    scale = sizes["D"] ** -0.5 if softmax_scale is None else softmax_scale
    # [b, s_q, h_q, .] -> the kernel's [b, h_q, s_q, .] as views (no copies): rows token * h_q + head; the
    # sm_90 kernel writes its output in the same order, so the transposed result is [b, s_q, h_q, dv]
    qt = q.transpose(1, 2)
    o, lse = flash_mla_paged(qt[..., :dv], qt[..., dv:], k_cache, block_table, cache_seqlens, scale=scale,
                             causal=causal, plan=plan)
    if plan is not None:  # the same replay under this call's own key (no slicing to build the key)
        replay = _REPLAYS.get(_replay_key("paged", (qt[..., :dv], qt[..., dv:], k_cache, block_table, cache_seqlens),
                                          scale, causal, plan))
        if replay is not None:  # a call with a plan repeats as a _Repeat: stored as FlashMLA's [b, s_q, h_q, dv] order
            _REPLAYS[_replay_key("compat", (q, k_cache, block_table, cache_seqlens), softmax_scale or 0.0, causal,
                                 (plan, dv))] = replay.token_major
    return o.transpose(1, 2).contiguous(), lse

"""Running the chosen design: the engine's one entry point for MLA attention over a cache.

:func:`mla_attention` takes the per-head queries of the s new tokens and a cache that already
holds them (as FlashMLA's ``flash_mla_with_kvcache`` does), asks the :class:`Dispatcher` for a
:class:`Decision`, runs that design and returns the attention output ``O [B, H, S, DV]``
(before ``o_proj``) with the decision. :func:`auto_forward` is ``MLALayer(mode="auto")``.

Functions come from :func:`mla_var3.model.backend.attention_fn`: the Triton kernels for CUDA
tensors, the fp32 references elsewhere (``backend="kernel"`` runs the kernels under Triton's
interpreter on a CPU).
"""

from __future__ import annotations

import torch

from mla_var3.dispatch.decide import CacheInfo, Decision, Dispatcher, dims_for_dtype
from mla_var3.model.backend import attention_fn
from mla_var3.model.cache import HybridCache, LatentCache, PagedLatentCache
from mla_var3.shapes import MLADims, Problem

_DEFAULT: dict[str, Dispatcher] = {}


def default_dispatcher(device: torch.device | str) -> Dispatcher:
    """One shared :class:`Dispatcher` per torch device type: the detected GPU on CUDA, h200 elsewhere."""
    kind = torch.device(device).type
    if kind not in _DEFAULT:
        _DEFAULT[kind] = Dispatcher(device=None if kind == "cuda" else "h200")
    return _DEFAULT[kind]


def _check(q_nope, q_pe, cache, w_uk, w_uv) -> tuple[int, int, int, int, int, int]:
    if q_nope.dim() != 4 or q_pe.dim() != 4 or q_pe.shape[:3] != q_nope.shape[:3]:
        raise ValueError(f"q_nope must be [B, H, S, D] and q_pe [B, H, S, P] with the same B, H, S, got "
                         f"{list(q_nope.shape)} and {list(q_pe.shape)}")
    b, h, s, d = q_nope.shape
    p = q_pe.shape[3]
    if w_uk.dim() != 3 or tuple(w_uk.shape[:2]) != (h, d):
        raise ValueError(f"w_uk must be [H={h}, D={d}, K], got {list(w_uk.shape)}")
    k = w_uk.shape[2]
    if w_uv.dim() != 3 or tuple(w_uv.shape[:2]) != (h, k):
        raise ValueError(f"w_uv must be [H={h}, K={k}, DV], got {list(w_uv.shape)}")
    info = CacheInfo.of(cache)
    if cache.batch != b:
        raise ValueError(f"the cache holds {cache.batch} sequences, the queries {b}")
    if b and int(cache.seqlens.min()) < s:
        raise ValueError(f"every sequence must hold the s={s} new tokens (cache seqlens >= s), got "
                         f"{cache.seqlens.tolist()}: append them to the cache before attention")
    width = {"latent": lambda: (cache.z.shape[2], cache.kpe.shape[2]),
             "paged": lambda: (cache.k, cache.kv.shape[3] - cache.k),
             "hybrid": lambda: (cache.z.shape[2], cache.kpe.shape[2])}[info.kind]()
    if width != (k, p):
        raise ValueError(f"the cache holds latents of width K={width[0]} and RoPE keys P={width[1]}, the "
                         f"weights and queries need K={k}, P={p}")
    if info.kind == "hybrid" and tuple(cache.k_win.shape[2:]) != (h, d):
        raise ValueError(f"the hybrid window holds [H, D]={list(cache.k_win.shape[2:])} per token, the queries "
                         f"need [{h}, {d}]")
    return b, h, s, d, p, k


def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, cache, w_uk: torch.Tensor, w_uv: torch.Tensor, *,
                  scale: float, design: str = "auto", n: int | None = None, dispatcher: Dispatcher | None = None,
                  backend: str = "auto") -> tuple[torch.Tensor, Decision]:
    """MLA attention of the s new tokens over a cache that already holds them.

    Parameters
    ----------
    q_nope : [B, H, S, D]   no-RoPE query
    q_pe : [B, H, S, P]     RoPE query (rotated)
    cache : LatentCache, PagedLatentCache or HybridCache, holding the S new tokens last
    w_uk : [H, D, K], w_uv : [H, K, DV]   absorbed weights (``MLALayer.absorbed``)
    scale : softmax scale (``MLAConfig.softmax_scale``)
    design : 'auto' (decide) or a design to force ('absorbed', 'hybrid', 'expanded' or a kernel name)
    n : hybrid split to force (<= the cache's window)
    dispatcher : the :class:`Dispatcher` (default: :func:`default_dispatcher`)
    backend : 'auto', 'reference' or 'kernel' (see :mod:`mla_var3.model.backend`)

    Returns
    -------
    o : [B, H, S, DV] in q_nope's dtype
    decision : Decision

    Ragged batches (different ``cache.seqlens``) are decided at t = the longest sequence.
    """
    b, h, s, d, p, k = _check(q_nope, q_pe, cache, w_uk, w_uv)
    dims, dtype = dims_for_dtype(MLADims(h=h, d=d, p=p, k=k, dv=w_uv.shape[2], name="call"), q_nope.dtype)
    dispatcher = dispatcher or default_dispatcher(q_nope.device)
    decision = dispatcher.decide(dims, Problem(b=b, s=s, t=cache.max_len), CacheInfo.of(cache), design, n)
    run = {"absorbed": _absorbed, "hybrid": _hybrid, "expanded": _expanded}[decision.design]
    o = run(q_nope, q_pe, cache, w_uk, w_uv, scale, decision, backend)
    return o.to(q_nope.dtype), decision


def _fn(name: str, x: torch.Tensor, backend: str):
    return attention_fn(name, x.device, backend)


def _seqlens(cache):
    return None if cache.uniform else cache.seqlens


def _absorbed(q_nope, q_pe, cache, w_uk, w_uv, scale, decision, backend):
    dt = q_nope.dtype
    qc = _fn("absorb_query", q_nope, backend)(q_nope, w_uk).to(dt)
    if isinstance(cache, PagedLatentCache):
        o_latent, _ = _fn("flash_mla_paged", qc, backend)(qc, q_pe, cache.kv, cache.block_table, cache.seqlens,
                                                            scale=scale, causal=True)
    else:  # LatentCache, or a HybridCache with latent copies of its window (z holds every token)
        o_latent, _ = _fn("flash_mla", qc, backend)(qc, q_pe, cache.z, cache.kpe, scale=scale, causal=True,
                                                     seqlens=_seqlens(cache))
    return _fn("decompress", qc, backend)(o_latent.to(dt), w_uv)


def _hybrid_parts(cache: HybridCache, n: int, b: int | None):
    """(z_old, kpe, k_new, v_new) for a split of n <= window newest expanded tokens."""
    z_old, kpe, k_win, v_win = cache.parts(b)
    t = kpe.shape[1]
    n_b = min(n, t)
    n_win = k_win.shape[1]
    if n_b == n_win:
        return z_old, kpe, k_win, v_win
    # a smaller split: the older window tokens are read as latent (their z is kept)
    rows = slice(None) if b is None else slice(b, b + 1)
    return cache.z[rows, : t - n_b], kpe, k_win[:, n_win - n_b:], v_win[:, n_win - n_b:]


def _hybrid(q_nope, q_pe, cache, w_uk, w_uv, scale, decision, backend):
    dt = q_nope.dtype
    qc = _fn("absorb_query", q_nope, backend)(q_nope, w_uk).to(dt)
    fn, decompress = _fn("mla_var6_plus", qc, backend), _fn("decompress", qc, backend)

    def attend(rows: slice, parts):
        z_old, kpe, k_new, v_new = parts
        o, o_latent, _ = fn(q_nope[rows], q_pe[rows], qc[rows], z_old, kpe, k_new, v_new, scale=scale, causal=True)
        return decompress(o_latent.to(dt), w_uv, o.to(dt))

    if cache.uniform:
        return attend(slice(None), _hybrid_parts(cache, decision.n, None))
    return torch.cat([attend(slice(i, i + 1), _hybrid_parts(cache, decision.n, i)) for i in range(cache.batch)])


def expand_latent(z: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k, v [B, T, H, D]`` of latents ``z [B, T, K]``: ``k[b,t,h] = w_uk[h] @ z[b,t]``,
    ``v[b,t,h] = z[b,t] @ w_uv[h]`` (two GEMMs, in z's dtype with float32 accumulation on GPUs)."""
    k = torch.einsum("btk,hdk->bthd", z, w_uk.to(z.dtype))
    v = torch.einsum("btk,hkd->bthd", z, w_uv.to(z.dtype))
    return k.contiguous(), v.contiguous()


def _expanded_from_hybrid(cache: HybridCache, w_uk, w_uv):
    """K, V, KPE [B, T, ...] of a hybrid cache: latent part expanded, window copied (padded)."""
    seqs = []
    for i in range(cache.batch):
        z_old, kpe, k_win, v_win = cache.parts(i)
        k_old, v_old = expand_latent(z_old, w_uk, w_uv)
        seqs.append((torch.cat((k_old, k_win), 1)[0], torch.cat((v_old, v_win), 1)[0], kpe[0]))
    t = cache.max_len
    out = []
    for j in range(3):
        ref = seqs[0][j]
        buf = ref.new_zeros((cache.batch, t, *ref.shape[1:]))
        for i, parts in enumerate(seqs):
            buf[i, : parts[j].shape[0]] = parts[j]
        out.append(buf)
    return out


def _expanded(q_nope, q_pe, cache, w_uk, w_uv, scale, decision, backend):
    if isinstance(cache, HybridCache):
        k, v, kpe = _expanded_from_hybrid(cache, w_uk, w_uv)
        seqlens = _seqlens(cache)
    else:
        latent = cache.to_latent() if isinstance(cache, PagedLatentCache) else cache
        k, v = expand_latent(latent.z, w_uk, w_uv)
        kpe, seqlens = latent.kpe, _seqlens(latent)
    o, _ = _fn("flash_attention", q_nope, backend)(q_nope, q_pe, k, v, kpe, scale=scale, causal=True, seqlens=seqlens)
    return o


# ------------------------------------------------------------------------------- the layer


def auto_forward(layer, hidden_states: torch.Tensor, positions: torch.Tensor, cache=None, n: int | None = None):
    """``MLALayer.forward(..., mode="auto")``: project, append to the cache, dispatch, ``o_proj``.

    The cache may be a LatentCache, PagedLatentCache or HybridCache; None starts a LatentCache,
    or a HybridCache of window ``n`` when ``n`` is given. The layer's attributes steer it:
    ``layer.dispatcher`` (a :class:`Dispatcher`, default :func:`default_dispatcher`),
    ``layer.auto_design`` (force a design, default 'auto') and ``layer.backend``. The decision
    of the call is left in ``layer.last_decision``.
    """
    c = layer.cfg
    if cache is not None:
        info = CacheInfo.of(cache)  # ValueError for an ExpandedCache or another object
        layer._check_inputs(hidden_states, positions, cache, "hybrid" if info.kind == "hybrid" else "absorbed")
        if n is not None and info.kind == "hybrid" and n != cache.n:
            raise ValueError(f"hybrid window n={n} differs from the cache's n={cache.n} (a cache keeps its n)")
        if n is not None and info.kind != "hybrid":
            raise ValueError(f"n={n} needs a HybridCache; the cache is a {type(cache).__name__}")
    else:
        layer._check_inputs(hidden_states, positions, None, "absorbed")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"hybrid window n must be an integer >= 0, got {n!r}")
    q_nope, q_pe, z, kpe = layer.project(hidden_states, positions)
    b = z.shape[0]
    if cache is None:
        cache = (LatentCache.empty(b, c.k, c.p, dtype=z.dtype, device=z.device) if n is None else
                 HybridCache.empty(b, c.h, c.d, c.k, c.p, n, dtype=z.dtype, device=z.device))
    if isinstance(cache, HybridCache):
        k_new, v_new = layer.expand(z)
        cache = cache.append(z, kpe, k_new, v_new)
    else:
        cache = cache.append(z, kpe)
    w = layer.absorbed
    o, decision = mla_attention(q_nope, q_pe, cache, w.w_uk, w.w_uv, scale=c.softmax_scale,
                                design=getattr(layer, "auto_design", "auto"),
                                dispatcher=getattr(layer, "dispatcher", None), backend=layer.backend)
    layer.last_decision = decision
    s = hidden_states.shape[1]
    o = o.to(hidden_states.dtype).transpose(1, 2).reshape(b, s, c.h * c.dv)
    return layer.o_proj(o), cache

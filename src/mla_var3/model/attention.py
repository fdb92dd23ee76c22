"""Running an MLA attention design over a cache: the one path every caller takes.

:func:`run_design` runs one design (:mod:`mla_var3.designs`) for the per-head queries of the s
new tokens over a cache that already holds them and returns the attention output
``O [B, H, S, DV]`` (before ``o_proj``). :class:`~mla_var3.model.MLALayer` calls it in every
mode; :func:`mla_attention`, the engine's entry point (as FlashMLA's
``flash_mla_with_kvcache``), asks the :class:`~mla_var3.dispatch.Dispatcher` for a
:class:`~mla_var3.dispatch.Decision` first (``MLALayer(mode="auto")`` goes through it).

=========  =======================================================================================
design     over a cache of kind (``cache.kind``)
=========  =======================================================================================
expanded   expanded: its K, V. latent, paged, hybrid: K, V rebuilt from the latents for the call
absorbed   latent, hybrid (with latent copies of its window): ``flash_mla``; paged: ``flash_mla_paged``
hybrid     hybrid: o latent + n expanded tokens per sequence, ``n <= window`` (default the window)
=========  =======================================================================================

Functions come from :func:`mla_var3.model.backend.attention_fn`: the Triton kernels for CUDA
tensors, the fp32 references elsewhere (``backend="kernel"`` runs the kernels under Triton's
interpreter on a CPU).

A value head dim ``DV`` other than the q/k no-RoPE dim ``D`` (``v_head_dim != qk_nope_head_dim``):
the absorbed design never reads V per head (``W_UV`` maps the latent output to ``DV`` in
``decompress``), so it runs as it is. The expanded and hybrid kernels read V tiles at the q/k
width, so their calls get q, K and V padded with zero columns to ``max(D, DV)`` and the output
is cut to ``DV`` (:func:`_one_head_dim`): exact (a zero column adds nothing to a score and
gives a zero output column), at the cost of ``|D - DV|`` extra columns read and computed. The
references take the same path, so the CPU tests run what a GPU runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mla_var3.designs import design as _design
from mla_var3.dispatch.decide import CacheInfo, Decision, Dispatcher, dims_for_dtype
from mla_var3.kernel._common import values_checked
from mla_var3.model.backend import attention_fn
from mla_var3.model.buffers import pad_stack
from mla_var3.model.expand import expand_kv
from mla_var3.shapes import MLADims, Problem

def default_dispatcher(device: torch.device | str) -> Dispatcher:
    """A new :class:`Dispatcher` for tensors on ``device``: the detected GPU on CUDA, the h200
    elsewhere. Its decisions are kept by the object: keep it (an :class:`AttentionState`, a
    layer) rather than make one per call (a first decision per shape costs milliseconds)."""
    return Dispatcher(device=None if torch.device(device).type == "cuda" else "h200")


class AttentionState:
    """What running attention keeps between calls, owned by its caller (a layer, a model's
    adapters, an engine's step): the :class:`Dispatcher` (its decisions), the absorbed
    design's decode state (:class:`~mla_var3.kernel.decode.AbsorbedDecode`: the plan of the
    lengths last seen, the workspace) and the hybrid's (:class:`~mla_var3.kernel.hybrid.
    HybridDecode`: its latent part's decode state, its side stream). Several layers may share one
    dispatcher; each layer keeps its own decode state (its cache's lengths are its own tensor).

    >>> state = AttentionState()                                              # doctest: +SKIP
    >>> o, decision = mla_attention(q_nope, q_pe, cache, w_uk, w_uv, scale=sm, state=state)
    """

    def __init__(self, dispatcher: Dispatcher | None = None) -> None:
        if dispatcher is not None and not isinstance(dispatcher, Dispatcher):
            raise ValueError(f"dispatcher must be a mla_var3.dispatch.Dispatcher, got {type(dispatcher).__name__}")
        self._dispatcher = dispatcher
        self._decode = None
        self._hybrid = None

    @property
    def given_dispatcher(self) -> Dispatcher | None:
        """The dispatcher if one was given or made already, else None."""
        return self._dispatcher

    def dispatcher(self, device: torch.device | str) -> Dispatcher:
        """The dispatcher (made for ``device`` on first use unless one was given)."""
        if self._dispatcher is None:
            self._dispatcher = default_dispatcher(device)
        return self._dispatcher

    def decode(self, device: torch.device | str):
        """The absorbed design's decode state (made on first use), or None off CUDA without the
        interpreter's kernels (the references keep no state)."""
        if self._decode is None:
            from mla_var3.kernel.decode import AbsorbedDecode

            self._decode = AbsorbedDecode(device)
        return self._decode

    def hybrid(self, device: torch.device | str):
        """The hybrid's decode state (made on first use)."""
        if self._hybrid is None:
            from mla_var3.kernel.hybrid import HybridDecode

            self._hybrid = HybridDecode(device)
        return self._hybrid


#: decisions per octave of context length: the dispatcher decides at t rounded up to one of these
#: steps (1/16 octave, at most 6.25 % above t), so a decode whose cache grows by a token per step
#: asks for a new decision about once per t/16 steps, not at every step
DECISION_STEPS_PER_OCTAVE = 16


def decision_t(t: int) -> int:
    """``t`` rounded up to the dispatcher's step (:data:`DECISION_STEPS_PER_OCTAVE`)."""
    t = int(t)
    if t <= 2 * DECISION_STEPS_PER_OCTAVE:
        return max(t, 1)
    step = 1 << max(0, t.bit_length() - 1 - DECISION_STEPS_PER_OCTAVE.bit_length() + 1)
    return -(-t // step) * step


def _seqlens(cache):
    """The lengths to pass a kernel: always on CUDA (asking whether a batch is uniform would
    synchronise, and the kernels plan ragged batches on the device), None for a uniform batch
    elsewhere."""
    if cache.seqlens.is_cuda:
        return cache.seqlens
    return None if cache.uniform else cache.seqlens


def run_design(design: str, q_nope: torch.Tensor, q_pe: torch.Tensor, cache, w_uk: torch.Tensor, w_uv: torch.Tensor,
               *, scale: float, n: int | None = None, backend: str = "auto", decode=None,
               hybrid=None) -> torch.Tensor:
    """Attention of the s new tokens over ``cache`` (which holds them last) with ``design``.

    Parameters
    ----------
    design : a design name or alias (:func:`mla_var3.designs.design`)
    q_nope : [B, H, S, D], q_pe : [B, H, S, P]   queries (RoPE applied)
    cache : ExpandedCache, LatentCache, PagedLatentCache or HybridCache
    w_uk : [H, D, K], w_uv : [H, K, DV]   absorbed weights (``MLALayer.absorbed``)
    scale : softmax scale
    n : the hybrid's split (newest tokens read expanded, at most the cache's window; default the window)
    backend : 'auto', 'reference' or 'kernel' (:mod:`mla_var3.model.backend`)
    decode : the caller's :class:`~mla_var3.kernel.decode.AbsorbedDecode` for the absorbed
        kernels (default: one made for the call); ignored by the references
    hybrid : the caller's :class:`~mla_var3.kernel.hybrid.HybridDecode` for the hybrid kernel
        (default: its state made for the call); ignored by the references

    Returns ``O [B, H, S, DV]`` (in the kernels' or references' dtype). Inputs are not
    validated here: :func:`mla_attention` and the layer do that.
    """
    d = _design(design)

    def fn(name: str):
        return attention_fn(name, q_nope.device, backend)

    dv = w_uv.shape[2]
    if not d.latent:                          # expanded
        if cache.kind == "expanded":
            k, v, kpe = cache.k, cache.v, cache.kpe
        elif cache.kind == "hybrid":
            k, v, kpe = _expanded_from_hybrid(cache, w_uk, w_uv)
        else:
            latent = cache.to_latent() if cache.kind == "paged" else cache
            k, v = expand_kv(latent.z, w_uk, w_uv)
            kpe = latent.kpe
        q, k, v = _one_head_dim(q_nope, k, v)
        o, _ = fn(d.kernel)(q, q_pe, k, v, kpe, scale=scale, causal=True, seqlens=_seqlens(cache))
        return o[..., :dv]
    dt = q_nope.dtype
    qc = fn("absorb_query")(q_nope, w_uk).to(dt)
    if not d.split:                           # absorbed
        kernel = fn("flash_mla_paged" if cache.kind == "paged" else d.kernel)
        owner = {} if decode is None or _is_reference(kernel) else {"decode": decode}
        if cache.kind == "paged":
            o_latent, _ = kernel(qc, q_pe, cache.kv, cache.block_table, cache.seqlens, scale=scale, causal=True,
                                 **owner)
        else:  # a LatentCache, or a HybridCache with latent copies of its window (z holds every token)
            o_latent, _ = kernel(qc, q_pe, cache.z, cache.kpe, scale=scale, causal=True, seqlens=_seqlens(cache),
                                 **owner)
        return fn("decompress")(o_latent.to(dt), w_uv)
    split, decompress = fn(d.kernel), fn("decompress")
    n = cache.n if n is None else n
    state = {} if hybrid is None or _is_reference(split) else {"decode": hybrid}

    def attend(rows: slice, parts):
        z_old, kpe, k_new, v_new = parts
        q, k_new, v_new = _one_head_dim(q_nope[rows], k_new, v_new)
        o, o_latent, _ = split(q, q_pe[rows], qc[rows], z_old, kpe, k_new, v_new, scale=scale, causal=True, **state)
        return decompress(o_latent.to(dt), w_uv, o[..., :dv].to(dt))

    if cache.uniform:
        return attend(slice(None), _hybrid_parts(cache, n, None))
    return torch.cat([attend(slice(i, i + 1), _hybrid_parts(cache, n, i)) for i in range(cache.batch)])


def _is_reference(fn) -> bool:
    return getattr(fn, "__module__", "").startswith("mla_var3.reference")


def _one_head_dim(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """``q [..., D]``, ``k [..., D]``, ``v [..., DV]`` with zero columns appended to one width
    ``max(D, DV)`` (the expanded and hybrid kernels read V at the q/k width); as they are when
    ``D == DV``. Scores are unchanged; the output's columns past DV are zero (cut by the caller)."""
    d, dv = k.shape[-1], v.shape[-1]
    if d == dv:
        return q, k, v
    width = max(d, dv)

    def pad(x):
        return F.pad(x, (0, width - x.shape[-1]))

    return pad(q), pad(k), pad(v)


def _hybrid_parts(cache, n: int, b: int | None):
    """(z_old, kpe, k_new, v_new) of a hybrid cache for a split of n <= window newest expanded tokens."""
    z_old, kpe, k_win, v_win = cache.parts(b)
    t = kpe.shape[1]
    n_b = min(n, t)
    n_win = k_win.shape[1]
    if n_b == n_win:
        return z_old, kpe, k_win, v_win
    # a smaller split: the older window tokens are read as latent (their z is kept)
    rows = slice(None) if b is None else slice(b, b + 1)
    return cache.z[rows, : t - n_b], kpe, k_win[:, n_win - n_b:], v_win[:, n_win - n_b:]


def _expanded_from_hybrid(cache, w_uk, w_uv):
    """K, V, KPE [B, T, ...] of a hybrid cache: latent part expanded, window copied (padded)."""
    seqs = []
    for i in range(cache.batch):
        z_old, kpe, k_win, v_win = cache.parts(i)
        k_old, v_old = expand_kv(z_old, w_uk, w_uv)
        seqs.append((torch.cat((k_old, k_win), 1)[0], torch.cat((v_old, v_win), 1)[0], kpe[0]))
    return [pad_stack([seq[j] for seq in seqs], cache.max_len) for j in range(3)]


def _decision_t(cache) -> int:
    """The context length the dispatcher decides at: the longest sequence (kept on the host by
    latent and hybrid caches), or, for a paged cache on CUDA, its capacity (a host-known bound:
    reading the lengths would synchronise, which a CUDA graph cannot capture)."""
    if cache.kind == "paged" and cache.seqlens.is_cuda:
        return cache.capacity
    return cache.max_len


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
    if b and values_checked(cache.seqlens.device) and int(cache.seqlens.min()) < s:
        raise ValueError(f"every sequence must hold the s={s} new tokens (cache seqlens >= s), got "
                         f"{cache.seqlens.tolist()}: append them to the cache before attention")
    width = (cache.k, cache.kv.shape[3] - cache.k) if info.kind == "paged" else (cache.z.shape[2], cache.kpe.shape[2])
    if width != (k, p):
        raise ValueError(f"the cache holds latents of width K={width[0]} and RoPE keys P={width[1]}, the "
                         f"weights and queries need K={k}, P={p}")
    if info.kind == "hybrid" and tuple(cache.k_win.shape[2:]) != (h, d):
        raise ValueError(f"the hybrid window holds [H, D]={list(cache.k_win.shape[2:])} per token, the queries "
                         f"need [{h}, {d}]")
    return b, h, s, d, p, k


def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, cache, w_uk: torch.Tensor, w_uv: torch.Tensor, *,
                  scale: float, design: str = "auto", n: int | None = None, dispatcher: Dispatcher | None = None,
                  backend: str = "auto", state: AttentionState | None = None) -> tuple[torch.Tensor, Decision]:
    """MLA attention of the s new tokens over a cache that already holds them.

    Parameters
    ----------
    q_nope : [B, H, S, D]   no-RoPE query
    q_pe : [B, H, S, P]     RoPE query (rotated)
    cache : LatentCache, PagedLatentCache or HybridCache, holding the S new tokens last
    w_uk : [H, D, K], w_uv : [H, K, DV]   absorbed weights (``MLALayer.absorbed``)
    scale : softmax scale (``MLAConfig.softmax_scale``)
    design : 'auto' (decide) or a design to force ('absorbed', 'hybrid', 'expanded' or an alias)
    n : hybrid split to force (<= the cache's window)
    dispatcher : the :class:`Dispatcher` (default: ``state``'s, else a new one for this call, which
        decides anew: milliseconds)
    backend : 'auto', 'reference' or 'kernel' (see :mod:`mla_var3.model.backend`)
    state : the caller's :class:`AttentionState` (its dispatcher and decode state), optional

    Returns
    -------
    o : [B, H, S, DV] in q_nope's dtype
    decision : Decision

    Ragged batches (different ``cache.seqlens``) are decided at t = the longest sequence, or on
    CUDA for a paged cache at its capacity, rounded up to the dispatcher's step
    (:func:`decision_t`): with no host synchronisation the call can be captured
    in a CUDA graph over a latent or paged cache (see :meth:`PagedLatentCache.reserve` for the
    cache's side of a captured decode step).
    """
    b, h, s, d, p, k = _check(q_nope, q_pe, cache, w_uk, w_uv)
    dims, dtype = dims_for_dtype(MLADims(h=h, d=d, p=p, k=k, dv=w_uv.shape[2], name="call"), q_nope.dtype)
    if state is not None and not isinstance(state, AttentionState):
        raise ValueError(f"state must be an AttentionState, got {type(state).__name__}")
    if dispatcher is None:
        dispatcher = state.dispatcher(q_nope.device) if state is not None else default_dispatcher(q_nope.device)
    t = max(decision_t(_decision_t(cache)), s)
    decision = dispatcher.decide(dims, Problem(b=b, s=s, t=t), CacheInfo.of(cache), design, n)
    cuda = state is not None and q_nope.device.type == "cuda"
    decode = state.decode(q_nope.device) if cuda else None
    hybrid = state.hybrid(q_nope.device) if cuda else None
    o = run_design(decision.design, q_nope, q_pe, cache, w_uk, w_uv, scale=scale, n=decision.n, backend=backend,
                   decode=decode, hybrid=hybrid)
    return o.to(q_nope.dtype), decision

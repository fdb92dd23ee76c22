"""The transformers ``Cache`` of a model enabled by :mod:`mla_var3.integrations.transformers`:
one mla_var3 cache container per layer, and the container operations the integration needs.

:class:`MLACache` is what ``model.generate`` returns as ``past_key_values`` (``.cache``) and
what a forward with ``use_cache`` returns. Layer ``i`` of it holds the container of the layer's
mode (:class:`~mla_var3.model.LatentCache` for ``"auto"`` and ``"absorbed"``,
:class:`~mla_var3.model.PagedLatentCache` with ``paged=True``, an ``ExpandedCache`` for
``"naive"``, a ``HybridCache`` for ``"hybrid"``), holding the **real** tokens of each sequence
only: padding never enters it, so the sequences are ragged (``seqlens``) and a left-padded
prompt costs nothing in the cache or in the attention.

transformers counts differently: its masks span every token it has fed, padding included.
So each layer keeps that count too (:meth:`MLACacheLayer.get_seq_length`, the ``kv_length``
of :meth:`MLACacheLayer.get_mask_sizes`): the masks transformers builds are then the ones the
stock model gets, and the attention reads from their last row which of the new tokens are
real (see :mod:`mla_var3.integrations.transformers`).

Example (no download: a tiny random model)::

    >>> from transformers import DeepseekV3Config, DeepseekV3ForCausalLM      # doctest: +SKIP
    >>> from mla_var3.integrations.transformers import enable
    >>> model = enable(DeepseekV3ForCausalLM(DeepseekV3Config(...)))
    >>> out = model.generate(ids, attention_mask=mask, max_new_tokens=16, return_dict_in_generate=True)
    >>> out.cache.nbytes, out.cache.seqlens().tolist()       # latent bytes; real tokens per sequence
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from mla_var3.model import ExpandedCache, HybridCache, LatentCache, PagedLatentCache
from mla_var3.model.buffers import masked

#: new tokens a paged cache makes room for at once (and at least a quarter of its capacity), so
#: that its pool is copied once per ``capacity / 4`` decode steps, not at every step.
PAGED_GROWTH = 64


class MLACacheLayer(CacheLayerMixin):
    """One layer of an :class:`MLACache`: ``state`` (the layer's mla_var3 cache container, None
    before the first token) and ``seen`` (tokens transformers has fed, padding included)."""

    is_compileable = False
    is_croppable = True
    is_sliding = False
    supports_early_init = False

    def __init__(self, **kwargs):
        super().__init__()
        self.state = None
        self.seen = 0
        self.owner = None        # the MLALayer that wrote ``state`` (its weights re-expand a hybrid window)

    def __repr__(self) -> str:
        kind = "empty" if self.state is None else type(self.state).__name__
        return f"{type(self).__name__}({kind}, seen={self.seen})"

    # --- what transformers asks of every cache layer
    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        raise ValueError("an MLACache holds mla_var3 cache containers; only attention modules put in place by "
                         "mla_var3.integrations.transformers.enable can read or write it (pass a fresh cache, "
                         "or none, to a model that is not enabled)")

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state, self.seen = None, 0

    def offload(self) -> None:       # nothing is offloaded: the latent cache is the small one
        pass

    def prefetch(self) -> None:
        pass

    # --- generation strategies that reorder or cut the batch
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.state is not None:
            self.state = select_sequences(self.state, beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None:
            rows = torch.arange(self.state.batch, device=self.state.seqlens.device).repeat_interleave(repeats)
            self.state = select_sequences(self.state, rows)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` tokens of every sequence (a negative count, as
        transformers' assisted decoding passes it)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or self.state is None:
            return
        self.seen += tokens_to_remove
        lengths = (self.state.seqlens.long() + tokens_to_remove).clamp(min=0)
        self.state = keep_first(self.state, lengths, self.owner)


class MLACache(Cache):
    """A transformers ``Cache`` holding one mla_var3 cache container per MLA layer.

    Parameters
    ----------
    paged : bool
        Page the latent cache (FlashMLA's ``[num_blocks, 64, 1, K+P]`` layout) instead of one
        padded ``[B, T, K]`` tensor per layer; ``"auto"`` and ``"absorbed"`` modes only.

    Layers are created as the model's layers first write to it. ``get_seq_length()`` is the
    token count transformers sees (padding included); :meth:`seqlens` are the real tokens of
    each sequence, :attr:`nbytes` the bytes of the containers (the memory model's count).
    """

    def __init__(self, *, paged: bool = False):
        super().__init__(layer_class_to_replicate=MLACacheLayer)
        self.paged = bool(paged)
        self._mask_memo: tuple | None = None     # (mask, valid) of the current step: one read for every layer

    def __repr__(self) -> str:
        return f"{type(self).__name__}(paged={self.paged}, layers={self.layers})"

    def layer(self, layer_idx: int) -> MLACacheLayer:
        """Layer ``layer_idx`` (created empty when the model has not reached it yet)."""
        while len(self.layers) <= layer_idx:
            self.layers.append(MLACacheLayer())
        return self.layers[layer_idx]

    def seqlens(self, layer_idx: int = 0) -> torch.Tensor | None:
        """Real (unpadded) tokens per sequence in layer ``layer_idx``, None before the first forward."""
        if layer_idx >= len(self.layers) or self.layers[layer_idx].state is None:
            return None
        return self.layers[layer_idx].state.seqlens

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's cache tensors (``B * T * (K + P) * w`` per layer for a latent cache)."""
        return sum(layer.state.nbytes for layer in self.layers if layer.state is not None)


# --------------------------------------------------------------------------- container operations


def keep_first(state, lengths: torch.Tensor, owner=None):
    """``state`` holding only the first ``lengths[b]`` tokens of each sequence (``lengths <= seqlens``).

    Latent and expanded containers: views up to the longest kept sequence, zero past each length
    (the padding every container has). Paged: the same blocks with the shorter lengths (the rows
    past them are overwritten by the next appends; no host synchronisation). Hybrid: re-split from its latents (kept for
    every token, the layer's default), the window re-expanded with ``owner``'s weights.
    """
    lengths = lengths.to(device=state.seqlens.device, dtype=torch.int32)
    if state.kind == "paged":       # the lengths alone: no host read (a captured decode step takes this path)
        return PagedLatentCache(state.kv, state.block_table, lengths, state.k, state.free, state.reserved)
    t = int(lengths.max()) if lengths.numel() else 0
    if state.kind == "expanded":
        return ExpandedCache(*(masked(x[:, :t], lengths) for x in (state.k, state.v, state.kpe)), lengths)
    latent = LatentCache(masked(state.z[:, :t], lengths), masked(state.kpe[:, :t], lengths), lengths)
    if state.kind == "latent":
        return latent
    if owner is None or not state.keep_latent_window:
        raise ValueError("cutting a HybridCache needs the latents of its window (keep_latent_window=True) "
                         "and the layer's weights")
    w = owner.absorbed
    return HybridCache.from_latent(latent, state.n, w.w_uk, w.w_uv)


def select_sequences(state, rows: torch.Tensor):
    """``state`` with its sequences ``rows`` (a reorder, a subset or repeats), in new tensors."""
    rows = rows.to(state.seqlens.device).long()
    if state.kind == "paged":   # repeated rows must not share blocks that appends write in place
        return PagedLatentCache.from_latent(select_sequences(state.to_latent(), rows), block_size=state.block_size)
    if state.kind == "latent":
        return LatentCache(state.z[rows], state.kpe[rows], state.seqlens[rows])
    if state.kind == "expanded":
        return ExpandedCache(state.k[rows], state.v[rows], state.kpe[rows], state.seqlens[rows])
    return HybridCache(state.z[rows], state.kpe[rows], state.k_win[rows], state.v_win[rows], state.seqlens[rows],
                       state.n, state.keep_latent_window)


def with_room(state: PagedLatentCache, s: int) -> PagedLatentCache:
    """A paged cache whose next append of ``s`` tokens writes in place: blocks for
    ``max(s, PAGED_GROWTH, capacity / 4)`` more tokens per sequence when it has fewer reserved."""
    if state.reserved >= s:
        return state
    return state.reserve(max(s, PAGED_GROWTH, state.capacity // 4))


__all__ = ["MLACache", "MLACacheLayer", "keep_first", "select_sequences", "with_room"]

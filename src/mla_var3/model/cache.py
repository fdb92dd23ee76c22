"""KV-cache containers of the three designs, with per-sequence lengths.

=========================  ===============================================  ========================
container                  tensors                                          bytes (memory model)
=========================  ===============================================  ========================
:class:`LatentCache`       z [B,T,K], kpe [B,T,P]                           ``mla_cache_bytes``
:class:`ExpandedCache`     k [B,T,H,D], v [B,T,H,DV], kpe [B,T,P]           ``expanded_cache_bytes``
:class:`HybridCache`       z [B,O,K] (or [B,T,K]), kpe [B,T,P],             ``hybrid_cache_bytes``
                           k_win [B,N,H,D], v_win [B,N,H,DV]
:class:`PagedLatentCache`  kv [num_blocks, 64, 1, K+P],                     ``paged_cache_bytes``
                           block_table [B, max_blocks] int32
=========================  ===============================================  ========================

Every container carries ``seqlens [B]`` int32: the valid tokens of each sequence (ragged
batches pad the shorter sequences with zeros past their length; the attention masks them).
``nbytes`` counts the cache tensors only (not ``seqlens`` or the block table) and equals the
memory model of :mod:`mla_var3.analysis.memory` for a batch of equal lengths.

``append`` returns a new container holding the old tokens plus ``s`` new ones per sequence,
written at each sequence's own offset ``seqlens[b]``; the tokens of the old container are left
unchanged.

In place (:class:`LatentCache`, :class:`HybridCache`). These keep their tensors as views
``buf[:, :T]`` into buffers with spare rows (:mod:`mla_var3.model.buffers`), and host-side
lengths beside ``seqlens`` (``lengths``, ``uniform``, ``append`` never sync with the device).
An append from the newest container of a buffer set (the *head*) writes its ``s`` rows per
sequence in place, past that container's tokens: ``B * s * (K + P) * w`` bytes, no read of
the cache (a slice for a uniform batch, one index op for a ragged one). New buffers are made,
copying the cache, on the first append, on an append from an older container (a branch), and
when the buffers are full: a latent buffer holds ``T + max(64, T / 4)`` rows rounded up to 64,
so a decode copies the cache once per ``T / 4`` steps (amortised ~4 rows per step instead of
``T``). The slack costs up to ~25 % (+ 64 rows) more memory than ``nbytes``; ``reserved_bytes``
reports the buffers, and ``reserve(max_len)`` sizes them for a known context. For a ragged batch the
zero padding past a shorter sequence's length in the *old* container may then hold the new
tokens (never read: the lengths mask it); the new container's padding is zero. The hybrid
cache (:mod:`mla_var3.model.hybrid_cache`) also maintains its window per step with
whole-batch tensor ops (see that module).

Hybrid window and latent copies: the hybrid keeps the ``n`` newest tokens of each sequence
expanded (``K``, ``V`` per head) and the older ``o = t - n`` latent. With
``keep_latent_window=True`` (the default) the latent ``z`` of the window tokens is kept too, so
when new tokens push the oldest window tokens out, moving them to the latent part is a copy
(here: nothing to copy, ``z`` already holds them) rather than a recompute; it costs
``b * n * k * w`` more bytes. Without the copies a window token's ``z`` is gone once expanded
(``W_UK``, ``W_UV`` map k -> d < k and have no inverse), so such a cache can only grow until its
window is full: an append that would evict a window token raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mla_var3._values import check_count
from mla_var3.model.buffers import (MAX_LENGTH, HostLengths, Store, allocation_error, check_allocatable, check_new,
                                    check_seqlens, pad_stack, regrow, reserve, rows_at, tensor_bytes as _nbytes,
                                    write_rows)
from mla_var3.model.expand import expand_kv


def _append_rows(buf: torch.Tensor, seqlens: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Copy of ``buf [B, T, ...]`` grown to hold ``new [B, s, ...]`` at rows ``seqlens[b] + i``."""
    b, s = new.shape[:2]
    t_new = max(buf.shape[1], int(seqlens.max()) + s) if b else buf.shape[1] + s
    out = buf.new_zeros((b, t_new, *buf.shape[2:]))
    out[:, : buf.shape[1]] = buf
    rows = seqlens.long()[:, None] + torch.arange(s, device=buf.device)
    out[torch.arange(b, device=buf.device)[:, None], rows] = new
    return out


@dataclass(frozen=True)
class LatentCache(HostLengths):
    """Latent cache of the absorbed design: ``z [B, T, K]``, ``kpe [B, T, P]``, ``seqlens [B]``.

    After an append ``z`` and ``kpe`` are views ``buf[:, :T]`` into buffers with spare rows
    (a batch stride larger than ``T * K``); :attr:`nbytes` counts the views, :attr:`reserved_bytes`
    the buffers. See the module docstring.
    """

    z: torch.Tensor
    kpe: torch.Tensor
    seqlens: torch.Tensor = None  # type: ignore[assignment]
    kind = "latent"  # what the dispatcher reads (mla_var3.designs.CACHE_KINDS)

    def __post_init__(self) -> None:
        if self.z.dim() != 3 or self.kpe.dim() != 3 or self.z.shape[:2] != self.kpe.shape[:2]:
            raise ValueError(f"LatentCache: z must be [B, T, K] and kpe [B, T, P], got {list(self.z.shape)} "
                             f"and {list(self.kpe.shape)}")
        object.__setattr__(self, "seqlens", check_seqlens(self.seqlens, *self.z.shape[:2], self.z.device))
        self._attach(tuple(int(x) for x in self.seqlens.tolist()), None, 0)

    def _attach(self, lengths: tuple[int, ...], store: Store | None, gen: int) -> None:
        object.__setattr__(self, "_lengths", lengths)
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_gen", gen)

    @classmethod
    def _view(cls, store: Store, t: int, seqlens: torch.Tensor, lengths: tuple[int, ...]) -> "LatentCache":
        """A container over ``store``'s first ``t`` rows (no validation, no device sync); it becomes the head."""
        self = object.__new__(cls)
        object.__setattr__(self, "z", store.z[:, :t])
        object.__setattr__(self, "kpe", store.kpe[:, :t])
        object.__setattr__(self, "seqlens", seqlens)
        self._attach(lengths, store, store.claim())
        return self

    @classmethod
    def empty(cls, b: int, k: int, p: int, dtype: torch.dtype = torch.float32, device=None) -> "LatentCache":
        return cls(torch.zeros(b, 0, k, dtype=dtype, device=device), torch.zeros(b, 0, p, dtype=dtype, device=device))

    @property
    def nbytes(self) -> int:
        """``B * T * (K + P) * w`` (= ``mla_cache_bytes``)."""
        return _nbytes(self.z, self.kpe)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the buffers behind the views (the tensors themselves before the first append)."""
        return self.nbytes if self._store is None else self._store.nbytes

    def append(self, z_new: torch.Tensor, kpe_new: torch.Tensor) -> "LatentCache":
        """Add ``z_new [B, s, K]``, ``kpe_new [B, s, P]`` after each sequence's tokens.

        In place (``s`` rows per sequence) from the newest container of a buffer set when the
        buffers have room; otherwise (first append, a branch, buffers full) new buffers with
        spare rows. The tokens of ``self`` are never changed.
        """
        s = check_new("z_new", z_new, self.batch, (self.z.shape[2],), self.z)
        if check_new("kpe_new", kpe_new, self.batch, (self.kpe.shape[2],), self.kpe) != s:
            raise ValueError(f"kpe_new has {kpe_new.shape[1]} tokens, z_new {s}")
        lengths = tuple(L + s for L in self._lengths)
        t = self.max_len
        t2 = max(t, *lengths) if lengths else t + s
        st = self._store
        if st is None or not st.is_head(self._gen) or st.z.shape[1] < t2:
            st = self._rebuild(t2)
        at = t if self.uniform else rows_at(self.seqlens, s)
        write_rows(st.z, z_new, at)
        write_rows(st.kpe, kpe_new, at)
        return LatentCache._view(st, t2, self.seqlens + s, lengths)

    def _rebuild(self, rows: int) -> Store:
        """New buffers holding this container's tokens (zero padding) with room for ``rows`` rows and slack."""
        sl = None if self.uniform else self.seqlens
        cap = reserve(rows)
        return Store(z=regrow(self.z, cap, sl), kpe=regrow(self.kpe, cap, sl))

    def reserve(self, max_len: int) -> "LatentCache":
        """The same tokens in new buffers that hold ``max_len`` tokens per sequence (and slack),
        so that appends up to ``max_len`` do not reallocate. ``max_len``: an integer in [0,
        :data:`~mla_var3.model.buffers.MAX_LENGTH`] (ValueError otherwise, or when the buffers
        cannot be allocated)."""
        max_len = check_count(max_len, "max_len", MAX_LENGTH)
        want = max(max_len, self.max_len)
        check_allocatable("max_len", max_len, self.batch * reserve(want) * (
            self.z.shape[2] * self.z.element_size() + self.kpe.shape[2] * self.kpe.element_size()), self.z.device)
        try:
            store = self._rebuild(want)
        except RuntimeError as exc:
            raise allocation_error("max_len", max_len, exc) from None
        return LatentCache._view(store, self.max_len, self.seqlens.clone(), self._lengths)

    def sequence(self, b: int) -> "LatentCache":
        """Sequence ``b`` alone, unpadded."""
        n = self._lengths[b]
        return LatentCache(self.z[b:b + 1, :n], self.kpe[b:b + 1, :n])

    def to_expanded(self, w_uk: torch.Tensor, w_uv: torch.Tensor) -> "ExpandedCache":
        """Expand every token per head: ``k = w_uk[h] @ z``, ``v = z @ w_uv[h]``."""
        return ExpandedCache(*expand_kv(self.z, w_uk, w_uv), self.kpe, self.seqlens)

    @staticmethod
    def stack(caches: list["LatentCache"]) -> "LatentCache":
        """Join sequences of several caches into one batch (ragged lengths are padded)."""
        spans = [(c, i, c.lengths[i]) for c in caches for i in range(c.batch)]
        lengths = torch.tensor([L for _, _, L in spans], dtype=torch.int32, device=caches[0].z.device)
        t = max(L for _, _, L in spans)
        return LatentCache(pad_stack([c.z[i, :L] for c, i, L in spans], t),
                           pad_stack([c.kpe[i, :L] for c, i, L in spans], t), lengths)


@dataclass(frozen=True)
class ExpandedCache:
    """Expanded cache of the FlashAttention design: ``k [B, T, H, D]``, ``v [B, T, H, DV]``
    (no-RoPE key and value per head; ``DV`` is ``v_head_dim``, usually ``D``), ``kpe [B, T, P]``
    (shared RoPE key), ``seqlens [B]``."""

    k: torch.Tensor
    v: torch.Tensor
    kpe: torch.Tensor
    seqlens: torch.Tensor = None  # type: ignore[assignment]
    kind = "expanded"

    def __post_init__(self) -> None:
        if self.k.dim() != 4 or self.v.dim() != 4 or self.v.shape[:3] != self.k.shape[:3] or self.kpe.dim() != 3 \
                or self.kpe.shape[:2] != self.k.shape[:2]:
            raise ValueError(f"ExpandedCache: k must be [B, T, H, D], v [B, T, H, DV] and kpe [B, T, P], got {list(self.k.shape)}, "
                             f"{list(self.v.shape)}, {list(self.kpe.shape)}")
        object.__setattr__(self, "seqlens", check_seqlens(self.seqlens, *self.k.shape[:2], self.k.device))

    @classmethod
    def empty(cls, b: int, h: int, d: int, p: int, dtype: torch.dtype = torch.float32, device=None,
              dv: int | None = None) -> "ExpandedCache":
        """No tokens; ``dv`` defaults to ``d``."""
        zeros = lambda *shape: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        return cls(zeros(b, 0, h, d), zeros(b, 0, h, d if dv is None else dv), zeros(b, 0, p))

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    @property
    def uniform(self) -> bool:
        return bool((self.seqlens == self.max_len).all())

    @property
    def nbytes(self) -> int:
        """``B * T * (H * (D + DV) + P) * w`` (= ``expanded_cache_bytes`` when ``DV = D``)."""
        return _nbytes(self.k, self.v, self.kpe)

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor, kpe_new: torch.Tensor) -> "ExpandedCache":
        """Add ``k_new [B, s, H, D]``, ``v_new [B, s, H, DV]``, ``kpe_new [B, s, P]`` after each
        sequence's tokens."""
        s = check_new("k_new", k_new, self.batch, tuple(self.k.shape[2:]), self.k)
        check_new("v_new", v_new, self.batch, tuple(self.v.shape[2:]), self.v)
        check_new("kpe_new", kpe_new, self.batch, (self.kpe.shape[2],), self.kpe)
        if v_new.shape[1] != s or kpe_new.shape[1] != s:
            raise ValueError(f"k_new, v_new, kpe_new must add the same tokens, got {k_new.shape[1]}, "
                             f"{v_new.shape[1]}, {kpe_new.shape[1]}")
        sl = self.seqlens
        return ExpandedCache(_append_rows(self.k, sl, k_new), _append_rows(self.v, sl, v_new),
                             _append_rows(self.kpe, sl, kpe_new), sl + s)

    def sequence(self, b: int) -> "ExpandedCache":
        n = int(self.seqlens[b])
        return ExpandedCache(self.k[b:b + 1, :n], self.v[b:b + 1, :n], self.kpe[b:b + 1, :n])

    @staticmethod
    def stack(caches: list["ExpandedCache"]) -> "ExpandedCache":
        """Join sequences of several caches into one batch (ragged lengths are padded)."""
        seqs = [(c.k[i, :L], c.v[i, :L], c.kpe[i, :L]) for c in caches for i in range(c.batch)
                for L in [int(c.seqlens[i])]]
        lengths = torch.tensor([k.shape[0] for k, _, _ in seqs], dtype=torch.int32, device=caches[0].k.device)
        t = int(lengths.max())
        return ExpandedCache(*(pad_stack([s[j] for s in seqs], t) for j in range(3)), lengths)


@dataclass(frozen=True)
class PagedLatentCache:
    """Paged latent cache in FlashMLA's layout.

    Attributes
    ----------
    kv : Tensor [num_blocks, block_size, 1, K + P]
        Token rows: the first K entries are the latent z, the last P the RoPE key.
    block_table : Tensor [B, max_blocks] int32
        Block ids of each sequence in order; unused entries are 0 (never read: masked by seqlens).
    seqlens : Tensor [B] int32
    k : int
        Latent rank K (to split a row into z and kpe).
    free : tuple of int
        Block ids of ``kv`` not used by any sequence (a pool allocates from it first).
    reserved : int
        New tokens every sequence has room for in its blocks (:meth:`reserve`): while it is at
        least ``s``, :meth:`append` writes in place with device operations only (no host
        synchronisation, no new buffers), so a decode step can be captured in a CUDA graph.
    """

    kv: torch.Tensor
    block_table: torch.Tensor
    seqlens: torch.Tensor
    k: int
    free: tuple[int, ...] = field(default=())
    reserved: int = 0
    kind = "paged"

    def __post_init__(self) -> None:
        if self.kv.dim() != 4 or self.kv.shape[2] != 1 or self.kv.shape[3] <= self.k:
            raise ValueError(f"PagedLatentCache: kv must be [num_blocks, block_size, 1, K+P] with K={self.k}, "
                             f"got {list(self.kv.shape)}")
        if self.block_table.dim() != 2 or self.block_table.dtype != torch.int32:
            raise ValueError(f"PagedLatentCache: block_table must be [B, max_blocks] int32, got "
                             f"{list(self.block_table.shape)} {self.block_table.dtype}")
        b, max_blocks = self.block_table.shape
        object.__setattr__(self, "seqlens", check_seqlens(self.seqlens, b, max_blocks * self.block_size, self.kv.device))

    @property
    def block_size(self) -> int:
        return self.kv.shape[1]

    @property
    def num_blocks(self) -> int:
        return self.kv.shape[0]

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def max_len(self) -> int:
        return int(self.seqlens.max()) if self.batch else 0

    @property
    def uniform(self) -> bool:
        return bool((self.seqlens == self.max_len).all())

    @property
    def nbytes(self) -> int:
        """``num_blocks * block_size * (K + P) * w`` (= ``paged_cache_bytes``); the pool's free
        blocks count, the block table and seqlens do not."""
        return _nbytes(self.kv)

    @classmethod
    def empty(cls, b: int, k: int, p: int, num_blocks: int = 0, block_size: int = 64,
              dtype: torch.dtype = torch.float32, device=None) -> "PagedLatentCache":
        """An empty cache with a pool of ``num_blocks`` free blocks (more are added on demand)."""
        kv = torch.zeros(num_blocks, block_size, 1, k + p, dtype=dtype, device=device)
        table = torch.zeros(b, 0, dtype=torch.int32, device=device)
        return cls(kv, table, torch.zeros(b, dtype=torch.int32, device=device), k, tuple(range(num_blocks)))

    @classmethod
    def from_latent(cls, latent: LatentCache, block_size: int = 64, generator: torch.Generator | None = None) -> "PagedLatentCache":
        """Page a latent cache; with a ``generator`` the block ids are shuffled (tests the indirection)."""
        k = latent.z.shape[2]
        counts = [-(-int(t) // block_size) for t in latent.seqlens.tolist()]
        total = sum(counts)
        order = torch.randperm(total, generator=generator).tolist() if generator is not None else list(range(total))
        rows = torch.cat((latent.z, latent.kpe), dim=-1)
        kv = rows.new_zeros(total, block_size, 1, rows.shape[-1])
        table = torch.zeros(latent.batch, max(counts, default=0), dtype=torch.int32)
        nxt = 0
        for b, count in enumerate(counts):
            t_b = int(latent.seqlens[b])
            for j in range(count):
                block = order[nxt]
                nxt += 1
                table[b, j] = block
                chunk = rows[b, j * block_size: min((j + 1) * block_size, t_b)]
                kv[block, : chunk.shape[0], 0] = chunk
        return cls(kv, table.to(kv.device), latent.seqlens.clone(), k)

    def to_latent(self) -> LatentCache:
        """Gather the blocks back into a padded :class:`LatentCache`."""
        t = self.max_len
        nblk = -(-t // self.block_size)
        rows = self.kv[self.block_table[:, :nblk].long(), :, 0]  # [B, nblk, bs, K+P]
        rows = rows.reshape(self.batch, nblk * self.block_size, self.kv.shape[3])[:, :t]   # not -1: t may be 0
        pos = torch.arange(t, device=rows.device)
        rows = rows * (pos[None, :] < self.seqlens[:, None]).to(rows.dtype)[..., None]
        return LatentCache(rows[..., : self.k].contiguous(), rows[..., self.k:].contiguous(), self.seqlens)

    @property
    def capacity(self) -> int:
        """Keys a sequence's block-table row can address (``max_blocks * block_size``)."""
        return self.block_table.shape[1] * self.block_size

    def reserve(self, tokens: int) -> "PagedLatentCache":
        """The cache with blocks for ``tokens`` more tokens in every sequence (taken from the pool,
        which grows when empty), so the next appends of up to ``tokens`` in total write in place.
        Host work (it reads the lengths): call it outside a captured region, once per step or
        once for many steps. ``tokens``: an integer >= 0 that keeps every length within
        :data:`~mla_var3.model.buffers.MAX_LENGTH` (ValueError otherwise, or when the pool
        cannot be allocated)."""
        tokens = check_count(tokens, "tokens", MAX_LENGTH)
        if tokens <= self.reserved:
            return self
        kv, block_table, free = self._blocks_for(self.seqlens.tolist(), tokens, "tokens")
        return PagedLatentCache(kv, block_table, self.seqlens, self.k, free, tokens)

    def _blocks_for(self, lengths: list[int], s: int, name: str):
        """(kv, block_table, free) with room for ``s`` more tokens after ``lengths``: each sequence
        keeps its first ⌈L/bs⌉ blocks and takes the ⌈(L+s)/bs⌉ - ⌈L/bs⌉ it lacks, sequence by
        sequence, from the front of the free list and then from new blocks at the pool's end.
        One slice per sequence (no Python step per block: a reservation of a billion tokens
        costs what its pool and table cost). ``name`` names ``s`` in errors."""
        bs, b = self.block_size, self.batch
        longest = max(lengths, default=0)
        if longest + s > MAX_LENGTH:
            raise ValueError(f"{name}={s:,} would take a sequence of {longest:,} tokens past {MAX_LENGTH:,}, the most "
                             "an int32 length holds")
        keep = [-(-t // bs) for t in lengths]
        need = [-(-(t + s) // bs) for t in lengths]
        total = sum(need) - sum(keep)
        taken = min(total, len(self.free))
        grown = self.num_blocks + total - taken
        if grown > MAX_LENGTH:
            raise ValueError(f"{name}={s:,} would grow the pool to {grown:,} blocks, past the int32 block ids")
        nbytes = self.kv.element_size() * grown * bs * self.kv.shape[3]
        check_allocatable(name, s, nbytes, self.kv.device)
        try:
            kv = self.kv.new_zeros(grown, bs, 1, self.kv.shape[3])   # a new pool: this cache stays as it is
            kv[: self.num_blocks] = self.kv
            ids = torch.cat((torch.tensor(self.free[:taken], dtype=torch.int32),
                             torch.arange(self.num_blocks, grown, dtype=torch.int32)))
            old = self.block_table.cpu()
            table = torch.zeros(b, max(need, default=0), dtype=torch.int32)
            first = 0
            for row, (kept, needed) in enumerate(zip(keep, need)):      # slices per sequence, not per block
                table[row, :kept] = old[row, :kept]
                table[row, kept:needed] = ids[first:first + needed - kept]
                first += needed - kept
        except RuntimeError as exc:
            raise allocation_error(name, s, exc, nbytes) from None
        return kv, table.to(kv.device), tuple(self.free[taken:])

    def append(self, z_new: torch.Tensor, kpe_new: torch.Tensor) -> "PagedLatentCache":
        """Write s tokens per sequence into their blocks. Within :attr:`reserved` tokens, in place
        and with device operations only (capturable; the new cache shares ``kv`` and the block
        table with this one, so two appends to the same reserved cache write the same rows);
        otherwise into a new pool, taking blocks from the free list first."""
        s = check_new("z_new", z_new, self.batch, (self.k,), self.kv)
        if check_new("kpe_new", kpe_new, self.batch, (self.kv.shape[3] - self.k,), self.kv) != s:
            raise ValueError(f"kpe_new has {kpe_new.shape[1]} tokens, z_new {s}")
        if s <= self.reserved:
            kv, block_table, free, left = self.kv, self.block_table, self.free, self.reserved - s
        else:
            (kv, block_table, free), left = self._blocks_for(self.seqlens.tolist(), s, "z_new's token count"), 0
        bs = self.block_size
        pos = self.seqlens.long()[:, None] + torch.arange(s, device=kv.device)  # [B, s]
        blocks = block_table.long().gather(1, pos // bs)
        kv[blocks, pos % bs, 0] = torch.cat((z_new, kpe_new), dim=-1)
        return PagedLatentCache(kv, block_table, self.seqlens + s, self.k, free, left)


__all__ = ["LatentCache", "ExpandedCache", "PagedLatentCache"]

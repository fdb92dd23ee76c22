"""The hybrid's (``mla_var6_plus``) cache: the ``n`` newest tokens of each sequence expanded, the rest latent,
maintained per decode step with whole-batch tensor ops.

Layout (the public tensors are views into buffers with spare capacity)::

    z_buf   [B, Cz, K]     latent rows 0..      z     = z_buf[:, :Tz]
    kpe_buf [B, Ct, P]     RoPE key rows 0..    kpe   = kpe_buf[:, :T]
    k_buf   [B, Cw, H, D]  window at an offset  k_win = k_buf[:, off:off + N]   (v_buf alike, [B, Cw, H, DV])

A step of s new tokens (:meth:`HybridCache.append`) writes them past the last token of each
sequence: ``z``/``kpe`` rows ``t_b .. t_b + s`` and window slots ``off + n_b .. off + n_b + s``;
the oldest ``e = n_b + s - min(n, t_b + s)`` window tokens leave the window by moving the offset
(``off += e``: their latent ``z`` stays in ``z``, nothing is copied). Per step that is
``s·(K + P + 2·H·D)`` elements written per sequence and no read of the cache. When the window
reaches the end of its buffer it is copied to the front of a new buffer (every
``slack / s`` steps, ``slack = max(64, n / 4)`` tokens): amortised ``n·s / slack`` ≈ 4·s more
window tokens per step.

Uniform batches (every sequence of the same length) use slices only; ragged batches use one
index tensor per buffer (still no per-sequence Python loop) when every sequence evicts the same
number of window tokens, and a batched gather into new buffers otherwise. Host-side lengths are
kept so that no step waits for the device.

Sharing. ``append`` never changes the tokens of the container it extends: it writes in place
only from the newest container of a buffer set (the *head*) and only past that container's
tokens; an append from an older container (a branch) copies into new buffers. For a ragged batch
the zero padding past a shorter sequence's length in the *old* container may then hold the new
tokens (it is never read: the lengths mask it); the new container's padding is zero.

Without ``keep_latent_window`` ``z`` holds only the tokens older than the window, and a window
token's latent is gone once expanded: an append that would evict a window token raises
ValueError (see :mod:`mla_var3.model.cache`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mla_var3._values import check_count
from mla_var3.model.buffers import (MAX_LENGTH, HostLengths, Store, allocation_error, check_allocatable, check_new,
                                    check_seqlens, masked, pad_stack, regrow, reserve, rows_at, tensor_bytes,
                                    write_rows)
from mla_var3.model.cache import LatentCache
from mla_var3.model.expand import expand_kv
from mla_var3.shapes import check_window


@dataclass(frozen=True)
class HybridCache(HostLengths):
    """The hybrid's cache: the ``n`` newest tokens of each sequence expanded, the rest latent.

    Attributes
    ----------
    z : Tensor [B, Tz, K]
        Latent of tokens ``[0, o_b)`` of sequence b, or of all ``[0, t_b)`` tokens with
        ``keep_latent_window`` (then ``Tz = T``).
    kpe : Tensor [B, T, P]
        RoPE key of every token.
    k_win, v_win : Tensor [B, N, H, D] and [B, N, H, DV]
        Expanded window: tokens ``[o_b, t_b)`` of sequence b, left-aligned, ``N = min(n, T)``
        (``DV`` is ``v_head_dim``, usually ``D``).
    seqlens : Tensor [B] int32
        ``t_b``; ``o_b = t_b - min(n, t_b)``.
    n : int
        Window size the cache keeps.
    keep_latent_window : bool
        Whether ``z`` also holds the window tokens (see the module docstring).

    The tensors may be views with a batch stride larger than their size (spare capacity for
    the next steps); :attr:`nbytes` counts the views, :attr:`reserved_bytes` the buffers.
    """

    z: torch.Tensor
    kpe: torch.Tensor
    k_win: torch.Tensor
    v_win: torch.Tensor
    seqlens: torch.Tensor
    n: int
    keep_latent_window: bool = True
    kind = "hybrid"  # what the dispatcher reads (mla_var3.designs.CACHE_KINDS)

    def __post_init__(self) -> None:
        b, t = self.kpe.shape[:2]
        if self.z.dim() != 3 or self.z.shape[0] != b or self.k_win.dim() != 4 or self.v_win.dim() != 4 \
                or self.v_win.shape[:3] != self.k_win.shape[:3] or self.k_win.shape[0] != b:
            raise ValueError(f"HybridCache: z must be [B, Tz, K], kpe [B, T, P], k_win [B, N, H, D], v_win [B, N, H, DV]; got "
                             f"{list(self.z.shape)}, {list(self.kpe.shape)}, {list(self.k_win.shape)}, {list(self.v_win.shape)}")
        check_window(self.n, "HybridCache: n")
        object.__setattr__(self, "seqlens", check_seqlens(self.seqlens, b, t, self.kpe.device))
        if self.k_win.shape[1] != min(self.n, t):
            raise ValueError(f"HybridCache: k_win holds {self.k_win.shape[1]} tokens, expected min(n={self.n}, T={t})")
        self._attach(tuple(int(x) for x in self.seqlens.tolist()), None, 0, 0)

    def _attach(self, lengths: tuple[int, ...], store: Store | None, gen: int, off: int) -> None:
        object.__setattr__(self, "_lengths", lengths)
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_gen", gen)
        object.__setattr__(self, "_off", off)

    @classmethod
    def _view(cls, store: Store, seqlens, lengths, n, keep, tz, t, off) -> "HybridCache":
        """A container over ``store`` (no validation, no device sync); it becomes the head."""
        nw = min(n, t)
        self = object.__new__(cls)
        for name, value in (("z", store.z[:, :tz]), ("kpe", store.kpe[:, :t]), ("k_win", store.k[:, off:off + nw]),
                            ("v_win", store.v[:, off:off + nw]), ("seqlens", seqlens), ("n", n),
                            ("keep_latent_window", keep)):
            object.__setattr__(self, name, value)
        self._attach(tuple(lengths), store, store.claim(), off)
        return self

    # ----------------------------------------------------------------- builders
    @classmethod
    def empty(cls, b: int, h: int, d: int, k: int, p: int, n: int, keep_latent_window: bool = True,
              dtype: torch.dtype = torch.float32, device=None, dv: int | None = None) -> "HybridCache":
        """No tokens; ``dv`` (the value head dim) defaults to ``d``."""
        zeros = lambda *shape: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        return cls(zeros(b, 0, k), zeros(b, 0, p), zeros(b, 0, h, d), zeros(b, 0, h, d if dv is None else dv),
                   torch.zeros(b, dtype=torch.int32, device=device), n, keep_latent_window)

    @classmethod
    def from_latent(cls, latent: LatentCache, n: int, w_uk: torch.Tensor, w_uv: torch.Tensor,
                    keep_latent_window: bool = True) -> "HybridCache":
        """Split a latent cache: the ``n`` newest tokens of each sequence are expanded (one
        batched expansion of the window tokens)."""
        check_window(n, "HybridCache: n")
        lengths = latent.seqlens.tolist()
        t = max(lengths, default=0)
        nw = min(n, t)
        dev = latent.z.device
        sl = latent.seqlens.long()
        o = (sl - n).clamp(min=0)                                           # [B] oldest window token
        if latent.uniform:
            z_win = latent.z[:, t - nw:t]
        else:
            rows = (o[:, None] + torch.arange(nw, device=dev)).clamp(max=max(t - 1, 0))
            z_win = masked(latent.z[torch.arange(latent.batch, device=dev)[:, None], rows], sl - o)
        k_win, v_win = expand_kv(z_win, w_uk, w_uv)
        z = masked(latent.z, sl)
        if not keep_latent_window:
            z = masked(z[:, : max((L - min(n, L) for L in lengths), default=0)], o)
        return cls(z, masked(latent.kpe, sl), k_win, v_win,
                   latent.seqlens.to(torch.int32), n, keep_latent_window)

    @classmethod
    def _from_parts(cls, parts, seqlens, n, keep) -> "HybridCache":
        """Pad-stack per-sequence ``(z, kpe, k_win, v_win)`` tuples."""
        t = int(seqlens.max()) if len(parts) else 0
        tz = max((z.shape[0] for z, _, _, _ in parts), default=0)
        return cls(pad_stack([x[0] for x in parts], tz), pad_stack([x[1] for x in parts], t),
                   pad_stack([x[2] for x in parts], min(n, t)), pad_stack([x[3] for x in parts], min(n, t)),
                   seqlens.to(torch.int32), n, keep)

    # ----------------------------------------------------------------- properties
    @property
    def nbytes(self) -> int:
        """``B * (O * (K + P) + N * (H * (D + DV) + P)) * w`` (+ ``B * N * K * w`` with
        ``keep_latent_window``) (= ``hybrid_cache_bytes`` when ``DV = D``)."""
        return tensor_bytes(self.z, self.kpe, self.k_win, self.v_win)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the buffers behind the views (the tensors themselves before the first append)."""
        return self.nbytes if self._store is None else self._store.nbytes

    def parts(self, b: int | None = None):
        """``(z_old [B,O,K], kpe [B,O+N,P], k_new [B,N,H,D], v_new [B,N,H,DV])`` for the attention.

        The whole batch when every sequence has the same length (``b=None``), else sequence b
        alone (unpadded, batch 1).
        """
        if b is None:
            if not self.uniform:
                raise ValueError("HybridCache.parts(): ragged lengths, ask for one sequence at a time")
            t = self.max_len
            o = t - min(self.n, t)
            return self.z[:, :o], self.kpe, self.k_win, self.v_win
        t_b = self._lengths[b]
        n_b = min(self.n, t_b)
        return (self.z[b:b + 1, : t_b - n_b], self.kpe[b:b + 1, :t_b],
                self.k_win[b:b + 1, :n_b], self.v_win[b:b + 1, :n_b])

    # ----------------------------------------------------------------- maintenance
    def append(self, z_new: torch.Tensor, kpe_new: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> "HybridCache":
        """Add s tokens per sequence (their latent ``z_new [B,s,K]``, RoPE key ``kpe_new [B,s,P]``
        and expanded ``k_new [B,s,H,D]``, ``v_new [B,s,H,DV]``); the window keeps the n newest, its oldest
        tokens move to the latent part (their ``z`` is already there). See the module docstring."""
        s = check_new("z_new", z_new, self.batch, (self.z.shape[2],), self.z)
        for name, x, tail in (("kpe_new", kpe_new, (self.kpe.shape[2],)), ("k_new", k_new, tuple(self.k_win.shape[2:])),
                              ("v_new", v_new, tuple(self.v_win.shape[2:]))):
            if check_new(name, x, self.batch, tail, self.kpe) != s:
                raise ValueError(f"{name} has {x.shape[1]} tokens, z_new {s}")
        step = _Step(self, s)
        st = self._store
        if st is None or not st.is_head(self._gen):               # first append, or a branch: new buffers
            st, new_off = step.rebuild(z_new, kpe_new, k_new, v_new)
        else:                                                # the head: write in place where it fits
            if st.kpe.shape[1] >= step.t2 and st.z.shape[1] >= step.tz2:
                step.write_latent(st, z_new, kpe_new)
            else:
                step.fresh_latent(st, z_new, kpe_new)
            off = self._off
            if step.common_evict and (self.n == 0 or off + max(step.nb, default=0) + s <= st.k.shape[1]):
                step.write_window(st, k_new, v_new, off)
                new_off = off + step.e[0] if (self.n and step.e) else off
            else:
                step.fresh_window(st, k_new, v_new)
                new_off = 0
        return HybridCache._view(st, self.seqlens + s, step.t2s, self.n, self.keep_latent_window, step.tz2, step.t2,
                                 new_off)

    def reserve(self, max_len: int) -> "HybridCache":
        """The same tokens in new buffers that hold ``max_len`` tokens per sequence (and the
        window with its slack), so that appends up to ``max_len`` do not reallocate. ``max_len``:
        an integer in [0, :data:`~mla_var3.model.buffers.MAX_LENGTH`] (ValueError otherwise, or
        when the buffers cannot be allocated)."""
        max_len = check_count(max_len, "max_len", MAX_LENGTH)
        b, k = self.batch, self.z.shape[2]
        empty = lambda *tail: self.kpe.new_zeros((b, 0, *tail))  # noqa: E731
        step = _Step(self, 0)
        latent = b * (reserve(max(step.tz2, max_len)) * k * self.z.element_size()       # the window comes on top
                      + reserve(max(step.t2, max_len)) * self.kpe.shape[2] * self.kpe.element_size())
        check_allocatable("max_len", max_len, latent, self.z.device)
        try:
            st, off = step.rebuild(empty(k), empty(self.kpe.shape[2]), empty(*self.k_win.shape[2:]),
                                   empty(*self.v_win.shape[2:]), min_t=max_len)
        except RuntimeError as exc:
            raise allocation_error("max_len", max_len, exc) from None
        return HybridCache._view(st, self.seqlens.clone(), self._lengths, self.n, self.keep_latent_window,
                                 step.tz2, step.t2, off)

    @staticmethod
    def stack(caches: list["HybridCache"]) -> "HybridCache":
        """Join sequences of several caches (same n and keep_latent_window) into one batch."""
        first = caches[0]
        if any(c.n != first.n or c.keep_latent_window != first.keep_latent_window for c in caches):
            raise ValueError("HybridCache.stack: caches must share n and keep_latent_window")
        parts, lengths = [], []
        for c in caches:
            for b in range(c.batch):
                z_old, kpe, k_win, v_win = c.parts(b)
                t_b = c.lengths[b]
                z_b = c.z[b, :t_b] if c.keep_latent_window else z_old[0]
                parts.append((z_b, kpe[0], k_win[0], v_win[0]))
                lengths.append(t_b)
        seqlens = torch.tensor(lengths, dtype=torch.int32, device=first.kpe.device)
        return HybridCache._from_parts(parts, seqlens, first.n, first.keep_latent_window)


class _Step:
    """The host-side bookkeeping of one append of s tokens to ``cache`` (per sequence b:
    ``t_b -> t_b + s``, window ``n_b -> n2_b``, ``e_b`` tokens leave the window)."""

    def __init__(self, cache: HybridCache, s: int):
        self.c, self.s = cache, s
        n, lengths = cache.n, cache.lengths
        self.t2s = [t + s for t in lengths]
        self.nb = [min(n, t) for t in lengths]
        self.n2 = [min(n, t) for t in self.t2s]
        self.e = [a + s - b for a, b in zip(self.nb, self.n2)]
        self.common_evict = len(set(self.e)) <= 1
        self.uniform = cache.uniform
        self.t2 = max(self.t2s, default=0)
        o2 = [t - m for t, m in zip(self.t2s, self.n2)]
        self.tz2 = self.t2 if cache.keep_latent_window else max(o2, default=0)
        if not cache.keep_latent_window:
            for b, t in enumerate(lengths):
                evicted = min(o2[b], t) - (t - self.nb[b])
                if evicted > 0:
                    raise ValueError(f"HybridCache without latent copies of the window cannot move {evicted} "
                                     f"expanded token(s) of sequence {b} to the latent part (their latent is not "
                                     "kept); use keep_latent_window=True")

    def write_latent(self, st: Store, z_new, kpe_new) -> None:
        """z / kpe rows of the new tokens (past each sequence's tokens)."""
        c, s = self.c, self.s
        if s == 0 or c.batch == 0:
            return
        skip = max(0, s - c.n)             # without latent copies only tokens older than the window enter z
        t = c.max_len
        at = t if self.uniform else rows_at(c.seqlens, s)
        write_rows(st.kpe, kpe_new, at)
        if c.keep_latent_window:
            write_rows(st.z, z_new, at)
        elif skip:
            old = t - min(c.n, t) if self.uniform else rows_at((c.seqlens.long() - c.n).clamp(min=0), skip)
            write_rows(st.z, z_new[:, :skip], old)

    def write_window(self, st: Store, k_new, v_new, off: int) -> None:
        """Window slots ``off + n_b + i`` of the new tokens that stay in the window (every
        sequence evicts the same number of tokens)."""
        c, s = self.c, self.s
        if c.n == 0 or s == 0 or c.batch == 0:
            return
        i0 = max(0, s - c.n)               # new tokens older than the new window are not written
        if self.uniform:
            lo = off + self.nb[0]
            st.k[:, lo + i0:lo + s] = k_new[:, i0:]
            st.v[:, lo + i0:lo + s] = v_new[:, i0:]
            return
        dev = st.k.device
        bi = torch.arange(c.batch, device=dev)[:, None]
        slots = off + c.seqlens.long().clamp(max=c.n)[:, None] + torch.arange(i0, s, device=dev)
        st.k[bi, slots] = k_new[:, i0:]
        st.v[bi, slots] = v_new[:, i0:]

    def _alloc(self):
        """``new_empty`` for a uniform batch (no padding: rows past the views are written before
        a view reaches them), ``new_zeros`` for a ragged one (its padding must read as zero)."""
        ref = self.c.kpe
        return ref.new_empty if self.uniform else ref.new_zeros

    def rebuild(self, z_new, kpe_new, k_new, v_new, min_t: int = 0) -> tuple[Store, int]:
        """New buffers holding the container after the step; the window starts at offset 0."""
        st = Store(z=None, kpe=None, k=None, v=None)
        self.fresh_latent(st, z_new, kpe_new, min_t)
        self.fresh_window(st, k_new, v_new, min_t)
        return st, 0

    def fresh_latent(self, st: Store, z_new, kpe_new, min_t: int = 0) -> None:
        """New ``z`` / ``kpe`` buffers in ``st``: the old tokens (zero padding) and the new ones."""
        c, s = self.c, self.s
        sl = None if self.uniform else c.seqlens
        st.z = regrow(c.z, reserve(max(self.tz2, min_t), s),
                      sl if sl is None or c.keep_latent_window else (sl.long() - c.n).clamp(min=0))
        st.kpe = regrow(c.kpe, reserve(max(self.t2, min_t), s), sl)
        self.write_latent(st, z_new, kpe_new)

    def fresh_window(self, st: Store, k_new, v_new, min_t: int = 0) -> None:
        """New window buffers in ``st`` holding the window after the step at offset 0."""
        c, s = self.c, self.s
        rows = reserve(min(c.n, max(self.t2, min_t)), s) if c.n else 0
        alloc = self._alloc()
        st.k = alloc((c.batch, rows, *c.k_win.shape[2:]))
        st.v = alloc((c.batch, rows, *c.v_win.shape[2:]))
        if c.n and c.batch:
            self._rebuild_window(st.k, c.k_win, k_new)
            self._rebuild_window(st.v, c.v_win, v_new)

    def _rebuild_window(self, buf: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> None:
        """``buf[:, :N2]`` = the new window: row j of sequence b is old window row ``e_b + j``
        for ``j < r_b = n2_b - min(s, n2_b)``, then new token ``s - n2_b + j``, zero past n2_b."""
        s, nw = self.s, old.shape[1]
        r = [m - min(s, m) for m in self.n2]
        n2max = max(self.n2, default=0)
        if self.uniform:
            e, r0, m = self.e[0], r[0], self.n2[0]
            buf[:, :r0] = old[:, e:e + r0]
            if m > r0:
                buf[:, r0:m] = new[:, s - (m - r0):]
            return
        dev = buf.device
        bi = torch.arange(old.shape[0], device=dev)[:, None]
        j = torch.arange(n2max, device=dev)[None, :]
        as_col = lambda v: torch.tensor(v, dtype=torch.long, device=dev)[:, None]  # noqa: E731
        rr, mm, ee = as_col(r), as_col(self.n2), as_col(self.e)
        zero = torch.zeros((), dtype=buf.dtype, device=dev)
        out = zero.expand(old.shape[0], n2max, *old.shape[2:])
        if s:
            out = torch.where((j < mm)[..., None, None], new[bi, (s - mm + j).clamp(0, s - 1)], out)
        if nw:
            out = torch.where((j < rr)[..., None, None], old[bi, (ee + j).clamp(0, nw - 1)], out)
        buf[:, :n2max] = out

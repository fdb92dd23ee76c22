"""Per-sequence row buffers with spare capacity, shared by a lineage of cache containers.

A cache container (:class:`~mla_var3.model.cache.LatentCache`,
:class:`~mla_var3.model.hybrid_cache.HybridCache`) keeps its tensors as views ``buf[:, :T]`` into
buffers ``buf [B, C, ...]`` with ``C >= T`` rows, so that an append of s tokens writes
``s`` rows per sequence in place instead of copying the cache:

- :func:`reserve` picks the capacity of a new buffer (``max(MIN_SLACK, SLACK_FRACTION * rows)``
  spare rows, rounded up to a multiple of 64), so a buffer is copied once per ``rows / 4``
  decode steps: amortised ~4 rows per step instead of ``T``.
- :class:`Store` holds the buffers of one lineage of containers and its *head*: the newest
  container, the only one that may write in place (and only past its own tokens), so an
  append never changes the tokens of another container.
- :func:`regrow` copies a view into a new, larger buffer; :func:`write_rows` writes s new rows
  at one offset (a uniform batch: a slice) or at each sequence's own offset (one index op).
- :func:`check_seqlens`, :func:`check_new` and :func:`pad_stack` validate and join what every
  container takes.
"""

from __future__ import annotations

import math
import os

import torch

from mla_var3._values import check_length_dtype
from mla_var3.kernel._common import values_checked

#: spare rows of a new buffer: ``max(MIN_SLACK, SLACK_FRACTION * rows)`` (and at least one step).
MIN_SLACK = 64
SLACK_FRACTION = 0.25
#: the most tokens a sequence may hold: lengths are int32 on the device.
MAX_LENGTH = 2**31 - 1


def allocation_error(name: str, value: int, exc: BaseException, nbytes: int | None = None) -> ValueError:
    """The error of a reservation whose buffers could not be allocated: it names the argument and
    its value (the allocator's message alone names neither)."""
    size = f" ({nbytes / 1e9:,.1f} GB)" if nbytes is not None else ""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValueError(f"{name}={value:,}: the buffers{size} could not be allocated: {reason[:200]}")


def device_memory_bytes(device) -> int | None:
    """The memory of ``device``: a CUDA device's total, the host's physical memory for the CPU
    (None where it cannot be read)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def check_allocatable(name: str, value: int, nbytes: int, device) -> None:
    """Refuse (with :func:`allocation_error`'s words) buffers of ``nbytes`` that exceed the whole
    memory of ``device`` before asking the allocator: a host that overcommits memory hands such
    an allocation out and kills the process when it is zeroed, where another host's allocator
    refuses it, so the answer would depend on the machine."""
    total = device_memory_bytes(device)
    if total is not None and nbytes > total:
        raise allocation_error(name, value, MemoryError(f"more than the {total / 1e9:,.1f} GB of {device}"), nbytes)


def check_seqlens(seqlens: torch.Tensor | None, b: int, t: int, device) -> torch.Tensor:
    """``seqlens [B]`` (int32 or int64: :func:`mla_var3._values.check_length_dtype`) as
    int32 on ``device`` (default: every sequence holds ``t`` tokens). The values are checked
    where :func:`mla_var3.kernel._common.values_checked` says (always on the CPU; on CUDA only
    with ``MLA_VAR3_CHECK=1``: a check synchronises with the GPU)."""
    if seqlens is None:
        return torch.full((b,), t, dtype=torch.int32, device=device)
    check_length_dtype("seqlens", seqlens)
    if seqlens.shape != (b,):
        raise ValueError(f"seqlens must be a [B={b}] tensor, got shape {list(seqlens.shape)}")
    if b and values_checked(seqlens.device) and (int(seqlens.min()) < 0 or int(seqlens.max()) > t):
        raise ValueError(f"seqlens must lie in [0, T={t}], got {seqlens.tolist()}")
    return seqlens.to(device=device, dtype=torch.int32)


def check_new(name: str, x: torch.Tensor, b: int, tail: tuple[int, ...], ref: torch.Tensor) -> int:
    """Check ``x`` is ``[b, s, *tail]`` with ref's dtype/device; return s."""
    if x.dim() != 2 + len(tail) or x.shape[0] != b or tuple(x.shape[2:]) != tail:
        want = ", ".join(["B=" + str(b), "s", *map(str, tail)])
        raise ValueError(f"{name} must be [{want}], got {list(x.shape)}")
    if x.dtype != ref.dtype or x.device != ref.device:
        raise ValueError(f"{name} must be {ref.dtype} on {ref.device} like the cache, got {x.dtype} on {x.device}")
    return x.shape[1]


def pad_stack(parts: list[torch.Tensor], length: int) -> torch.Tensor:
    """Stack ``[L_i, ...]`` tensors into ``[len(parts), length, ...]`` with zero padding."""
    ref = parts[0]
    out = ref.new_zeros((len(parts), length, *ref.shape[1:]))
    for i, part in enumerate(parts):
        out[i, : part.shape[0]] = part
    return out


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of the elements of ``tensors`` (of the views, not of the storage behind them)."""
    return sum(x.numel() * x.element_size() for x in tensors)


def reserve(rows: int, s: int = 0) -> int:
    """Capacity for ``rows`` rows with room for growth (and for one more step of ``s`` rows),
    rounded up to a multiple of 64."""
    want = rows + max(MIN_SLACK, s, math.ceil(SLACK_FRACTION * rows))
    return -(-want // 64) * 64


class Store:
    """The buffers of one lineage of containers (named tensors, e.g. ``z``, ``kpe``) and its head.

    A container takes a generation number with :meth:`claim` when it is made over the store;
    it may write in place while :meth:`is_head` says it is still the newest one.
    """

    def __init__(self, **buffers: torch.Tensor | None):
        self.__dict__.update(buffers)
        self.head = 0

    def claim(self) -> int:
        """Make a new container the head; returns its generation."""
        self.head += 1
        return self.head

    def is_head(self, gen: int) -> bool:
        return self.head == gen

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers (capacity, not the views)."""
        return tensor_bytes(*(x for x in vars(self).values() if isinstance(x, torch.Tensor)))


def masked(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``x [B, L, ...]`` with rows ``>= lengths[b]`` zeroed."""
    rows = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
    return torch.where(rows.view(*rows.shape, *([1] * (x.dim() - 2))), x, torch.zeros((), dtype=x.dtype, device=x.device))


def regrow(old: torch.Tensor, rows: int, lengths: torch.Tensor | None) -> torch.Tensor:
    """A new buffer ``[B, rows, ...]`` whose first ``L`` rows are ``old [B, L, ...]``.

    ``lengths=None`` (a uniform batch): the rows past ``L`` are left unset (``new_empty``; the
    caller writes them before a view reaches them). With ``lengths [B]`` (a ragged batch) the
    buffer is zero past each sequence's length, so its padding reads as zero.
    """
    if rows < old.shape[1]:
        raise ValueError(f"regrow: {rows} rows cannot hold {old.shape[1]}")
    shape = (old.shape[0], rows, *old.shape[2:])
    if lengths is None:
        buf = old.new_empty(shape)
        buf[:, : old.shape[1]] = old
    else:
        buf = old.new_zeros(shape)
        buf[:, : old.shape[1]] = masked(old, lengths)
    return buf


def rows_at(start: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index ``(b [B, 1], row [B, s])`` of rows ``start[b] + i``, ``i < s`` (for :func:`write_rows`)."""
    dev = start.device
    return torch.arange(start.shape[0], device=dev)[:, None], start.long()[:, None] + torch.arange(s, device=dev)


def write_rows(buf: torch.Tensor, new: torch.Tensor, at: int | tuple[torch.Tensor, torch.Tensor]) -> None:
    """``buf[b, at + i] = new[b, i]``: ``at`` one row for every sequence (a slice), or an index
    from :func:`rows_at` (one index op for the batch)."""
    s = new.shape[1]
    if s == 0 or buf.shape[0] == 0:
        return
    if isinstance(at, int):
        buf[:, at:at + s] = new
    else:
        buf[at] = new


class HostLengths:
    """Shape properties of a cache whose ``kpe`` is ``[B, T, P]`` and whose per-sequence lengths
    are kept on the host in ``_lengths`` beside the ``seqlens`` tensor (no device sync to read)."""

    @property
    def batch(self) -> int:
        return self.kpe.shape[0]

    @property
    def max_len(self) -> int:
        return self.kpe.shape[1]

    @property
    def lengths(self) -> tuple[int, ...]:
        """``seqlens`` as host integers (kept beside the tensor: reading them does not sync)."""
        return self._lengths

    @property
    def uniform(self) -> bool:
        """True when every sequence holds ``max_len`` tokens (no padding)."""
        return all(L == self.max_len for L in self._lengths)

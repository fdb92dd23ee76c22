"""The decode plan's item cut: which item length C the planner chooses, estimated by list scheduling.

The sm_90 item kernel runs one program per (item, 64-row tile); the GPU starts each on the SM
that frees first. The planner (``mla_var3.kernel.decode_plan``, on the GPU) cuts every sequence
of ``n`` blocks at one item length ``C``: into ``ceil(n / C)`` near-equal items where the cut's
items fit one wave (``slots = SMs // row tiles`` of them run at once), else into ``n // C``
chunks of ``C`` blocks and a shorter remainder. It tries **every** ``C`` from
:data:`MIN_ITEM_BLOCKS` to the longest sequence and keeps the cheapest by :func:`cut_estimates`:

* one wave: the longest item plus :data:`ITEM_OVERHEAD`;
* more: the items are put in order — the chunks, then the remainders (and the sequences not
  split) longest first within each :data:`SORT_BLOCK` sequences — each on the slot that frees
  first (lowest index on a tie; an item of ``p`` blocks takes ``p * UNIT + ITEM_OVERHEAD``), and
  the time is the busiest slot's. Where ``SMs`` is not a multiple of the row tiles, the SMs left
  over form one more, slower slot (``extra`` SMs running an item's ``tiles`` programs take
  ``tiles / extra`` times as long), which an item takes when it would finish there first;
* more than one wave: :data:`LATE_WAVE` more;
* plus the combine when anything is split (:data:`COMBINE_FIXED` and ``comb`` per split item).

This is the list-scheduling simulation the cut was judged by (``benchmarks/cut_ranking_sim.py``
at 1ac28a2, which wrote ``benchmarks/results/h200/seesaw/cut-ranking-sim.json``: 132 SMs,
programs in plan order, row tile fastest, a model fitted to measured item plans) at slot
granularity: over the serving rows and 120 random ragged batches (b = 8..128, s = 1..4, t up
to 32k) its choice is 0.6-0.8 % above the simulation's best C on average (1.8-2.5 % at the 90th
percentile; the charge for a later wave, which that simulation lacks, is part of it), where the
closed-form "tail" ranking the planner used before, over its 32 candidates, was 2.6-3.3 % (5.2-7.4 %).

Pure Python and numpy: :mod:`mla_var3.kernel.decode_plan` (its host reference, and the device
planner's mirror) and :mod:`mla_var3.analysis.kernel_laws` (the dense call's items) use it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COMBINE_BYTES_PER_BLOCK_TIME", "COMBINE_FIXED", "ITEM_OVERHEAD", "LATE_WAVE", "MAX_ITEM_BLOCKS",
           "MIN_ITEM_BLOCKS", "SORT_BLOCK", "UNIT", "best_cut", "combine_units", "cut_estimates",
           "plan_buffers"]

MIN_ITEM_BLOCKS = 2
#: the longest item, in blocks (65,536 keys): the sm_90 kernel keeps an item's pages in shared memory
MAX_ITEM_BLOCKS = 1024
#: cost units: 1/256 of one block-time (one 64-row tile x one 64-key block)
UNIT = 256
#: per item: the exposed prologue (query + first key block in flight) and epilogue, in units (two
#: blocks: the list-scheduling simulation's best fit to 210 item plans measured on an H200, 3.3 %
#: mean error, against 4.1 % at half a block)
ITEM_OVERHEAD = 512
#: a cut whose items take more than one wave costs two blocks more, in units (a program started
#: after the first wave exposes its start: measured on an H200, ragged b8 s1 t32768 cut in 67 items
#: on 66 slots ran 3.3 blocks slower than the simulation said against its one-wave cut, and ragged
#: b32 s1 t4096 in 72 items 0.6 block slower against 65; ``seesaw/seesaw-chunk-serving-698e143.json``,
#: ``seesaw-tail-serving-7029e85.json``)
LATE_WAVE = 512
#: the combine's fixed cost (a second launch), in units
COMBINE_FIXED = 384
#: bytes the combine moves per block-time (~3 TB/s x ~2 us per block on an H200)
COMBINE_BYTES_PER_BLOCK_TIME = 6.0e6
#: sequences whose remainders are ordered together (the device planner sorts them a tile at a time)
SORT_BLOCK = 128
#: an estimate that excludes its cut
BIG = 9223372036854775807


def _cdiv(a, b):
    return -(-a // b)


def combine_units(rows: int, k: int) -> int:
    """Combine cost per split item in units: its fp32 partial (``rows x k``) written and read back."""
    return int(round(rows * k * 8 * UNIT / COMBINE_BYTES_PER_BLOCK_TIME))


def plan_buffers(batch: int, slots: int, max_blocks: int) -> tuple[int, int]:
    """``(max_items, max_slots)`` of the item planner's buffers for ``batch`` sequences of up to
    ``max_blocks`` blocks: two waves of items and partial outputs beyond one item per sequence,
    plus what cutting every sequence at ``MAX_ITEM_BLOCKS`` needs (``decode_plan.plan_capacity``)."""
    pieces = max(1, _cdiv(max_blocks, MAX_ITEM_BLOCKS))
    return batch * pieces + 2 * slots, 2 * slots + (batch * pieces if pieces > 1 else 0)


def cut_estimates(blocks, slots: int, tiles: int, sms: int, comb: int, max_items: int, max_slots: int,
                  c_lo: int = MIN_ITEM_BLOCKS, c_hi: int | None = None) -> np.ndarray:
    """Estimated time (units) of the cut at each item length ``C`` in ``[c_lo, c_hi]`` (default:
    up to the longest sequence, within the limits), :data:`BIG` where its items or split items
    exceed ``max_items`` / ``max_slots``.

    blocks : [B] key blocks per sequence
    slots  : items that run at once (``sms // tiles``); ``tiles``: row tiles per item
    comb   : the combine's units per split item
    Returns int64 ``[c_hi - c_lo + 1]``, bit for bit what the device planner computes."""
    n = np.asarray(blocks, dtype=np.int64).reshape(-1)
    top = int(n.max()) if n.size else 0
    if c_hi is None:
        c_hi = min(max(top, MIN_ITEM_BLOCKS), MAX_ITEM_BLOCKS)
    cs = np.arange(c_lo, c_hi + 1, dtype=np.int64)[:, None]                     # [NC, 1]
    counts = np.maximum(1, _cdiv(n[None, :], cs))                               # [NC, B]
    n_items = counts.sum(1)
    n_split = np.where(counts > 1, counts, 0).sum(1)
    est = (_cdiv(n[None, :], counts).max(1, initial=0) * UNIT + ITEM_OVERHEAD).astype(np.int64)
    fits = (n_items <= max_items) & (n_split <= max_slots)
    rows = np.nonzero((n_items > slots) & fits)[0]
    if rows.size:
        est[rows] = _simulate(n, cs[rows, 0], counts[rows], n_items[rows], slots, tiles, sms) + LATE_WAVE
    est += np.where(n_split > 0, COMBINE_FIXED + n_split * comb, 0)
    return np.where(fits, est, BIG)


def _simulate(n, cs, counts, n_items, slots: int, tiles: int, sms: int) -> np.ndarray:
    """The busiest slot (units) of each cut at ``cs [R]`` whose items take more than one wave."""
    r = cs.shape[0]
    full = np.where(counts > 1, n[None, :] // cs[:, None], 0)                   # [R, B] chunks
    rest = n[None, :] - full * cs[:, None]
    has = (counts == 1) | (rest > 0)
    width = int(n_items.max())
    sizes = np.zeros((r, width), dtype=np.int64)
    ar = np.arange(width)[None, :]
    nfull = full.sum(1)
    sizes[ar < nfull[:, None]] = np.broadcast_to(cs[:, None], (r, width))[ar < nfull[:, None]]
    at = nfull.copy()
    for b0 in range(0, n.shape[0], SORT_BLOCK):
        part = np.where(has[:, b0:b0 + SORT_BLOCK], rest[:, b0:b0 + SORT_BLOCK], -1)
        part = -np.sort(-part, axis=1)                                          # longest first, -1 last
        cnt = has[:, b0:b0 + SORT_BLOCK].sum(1)
        j = np.arange(part.shape[1])[None, :]
        live = j < cnt[:, None]
        ri, ji = np.nonzero(live)
        sizes[ri, at[ri] + ji] = part[ri, ji]
        at += cnt
    extra = max(0, sms - slots * tiles)
    e = extra if extra else 1
    free = np.zeros((r, slots), dtype=np.int64)
    slow = np.zeros(r, dtype=np.int64)
    idx = np.arange(r)
    for k in range(width):
        d = sizes[:, k] * UNIT + ITEM_OVERHEAD
        live = k < n_items
        i = free.argmin(1)
        f = free[idx, i]
        on_slow = live & (extra > 0) & (slow + d * tiles < f + d * e)
        slow = np.where(on_slow, slow + d * tiles, slow)
        free[idx, i] = np.where(live & ~on_slow, f + d * e, f)
    return np.maximum(free.max(1), slow) // e


def best_cut(blocks, slots: int, tiles: int, sms: int, comb: int, max_items: int, max_slots: int) -> tuple[int, int]:
    """``(estimate, C)``: the cheapest cut of :func:`cut_estimates` (ties: the longer items);
    ``(BIG, longest sequence within the limits)`` when no cut fits the buffers."""
    top = max((int(x) for x in blocks), default=0)
    c_hi = min(max(top, MIN_ITEM_BLOCKS), MAX_ITEM_BLOCKS)
    est = cut_estimates(blocks, slots, tiles, sms, comb, max_items, max_slots, MIN_ITEM_BLOCKS, c_hi)
    best = int(est.min())
    if best == BIG:
        return BIG, c_hi
    return best, MIN_ITEM_BLOCKS + int(np.nonzero(est == best)[0][-1])

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

**The plan's kind.** Where a batch's (sequence, row tile) pairs are few (:func:`may_pack`), a
*packed* plan may run instead: its sequences laid end to end and cut into one equal share per
program (:func:`packed_layout`). Each kind is priced by a time model fitted to measured plans
(:class:`KindPrice`); the device planner takes the cheaper kind on the GPU, and a uniform batch's
host plan takes it here (:func:`uniform_packs`).

Pure Python and numpy: :mod:`mla_var3.kernel.decode_plan` (its host reference, and the device
planner's mirror) and :mod:`mla_var3.analysis.kernel_laws` (the dense call's items and kind) use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["COMBINE_BYTES_PER_BLOCK_TIME", "COMBINE_FIXED", "ITEM_OVERHEAD", "ITEM_PRICE", "KindPrice", "LATE_WAVE",
           "MAX_ITEM_BLOCKS", "MIN_ITEM_BLOCKS", "PACKED_PRICE", "PACKING_PAIRS_PER_SM", "PACK_OVERHEAD", "SORT_BLOCK",
           "UNIT", "best_cut", "combine_units", "cut_estimates", "item_cost", "item_makespan", "kind_estimate",
           "may_pack", "packed_layout", "packed_makespan", "packed_starts", "plan_buffers", "uniform_packs",
           "uniform_sizes"]

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


#: a packed plan's cost of a sequence's prologue (its query tile and first key blocks), in blocks, in
#: its layout: measured on an H200, 4 ran 2.5-5.1 % faster than 2 on ragged batches of short pieces and
#: 0.5-3.1 % on the serving rows that pack; 6 slower than 4 (``seesaw/seesaw-pack-overhead-*-944f3cd.json``)
PACK_OVERHEAD = 4


@dataclass(frozen=True)
class KindPrice:
    """A plan kind's time on the GPU, in units (1/256 of a block-time), as the planner prices it
    to choose between the kinds: ``fixed + block_pct / 100 * makespan``, where the makespan is
    the busiest SM's work when each item (a piece, in a packed program) costs its blocks plus
    ``per_item``, plus ``per_split`` when it writes a partial for the combine. The item plan's
    makespan is its items run in plan order on the next free SM (:func:`item_makespan`); a packed
    plan's is its widest program (:func:`packed_makespan`)."""

    fixed: int
    per_item: int
    per_split: int
    block_pct: int = 100


#: the prices of the two kinds (the choice of a gated plan): fitted on 28 gated batches measured on an
#: H200 with both kinds forced (``seesaw/seesaw-threshold-4447964.json``, ``seesaw-plans-faa1761.json``,
#: ``seesaw-cap-4447964.json``; packed plans laid out with 2 overhead blocks): 1.80 us per block-time,
#: mean error 4.0 % for the item plan and 3.5 % for the packed one. A packed block costs 1 % more (the
#: loader warp's registers), a piece 2.5 blocks, a split item 5.5 blocks in the item kernel; the fixed
#: parts hold each kind's gate (the other kernel's exiting programs: 2.1 us before the packed kernel,
#: 0.3 after the item kernel). Each batch left out of the fit in turn, the choice loses 0.3 % over the
#: 28 against the faster kind (three batches, up to 4.6 %), where the estimate ratio with a threshold
#: at 0.86 lost up to 8.5 % on five; on 19 fresh batches, 0.14 % (18 within 2 %, the worst 2.7 %;
#: ``seesaw-threshold-seed8-36c56ba.json``; ``docs/kernels/flash-mla/plan-kind.md``, "The plan kind priced by
#: measured time models"). ``benchmarks/fit_kind_prices.py`` (retired at 1ac28a2;
#: docs/kernels/flash-mla/scripts.md) computed them from those records. Calibrated only where the GPU chooses (:func:`packing_may_pay`; item
#: plans of at most two waves): a three-wave item plan (ragged b32 s4 t16384) is priced 34 % over its time.
ITEM_PRICE = KindPrice(fixed=1688, per_item=128, per_split=1408)
PACKED_PRICE = KindPrice(fixed=2424, per_item=640, per_split=768, block_pct=101)
#: :func:`packing_may_pay`'s limit, (sequence, row tile) pairs per SM. Measured on an H200 beyond
#: it: ragged b = 32, s = 4, t <= 16,384 (256 pairs) ran 2.5 % faster packed, where the estimate
#: (0.860 of the item plan's) would pick packing; uniform s >= 8 tied
#: (``docs/kernels/flash-mla/serving.md``, "The serving check at e78fab6"); a wider limit, measured at 50a8897,
#: was not taken (``docs/kernels/flash-mla/packed-plan.md``, "The packed kernel's register split, wide packing")
PACKING_PAIRS_PER_SM = 1.5


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


def may_pack(batch: int, tiles: int, sms: int) -> bool:
    """Whether the planner considers a packed plan: the batch's (sequence, row tile) pairs number
    at most :data:`PACKING_PAIRS_PER_SM` x ``sms`` (``tiles``: 64-row tiles per sequence)."""
    return batch * max(1, tiles) <= PACKING_PAIRS_PER_SM * sms


def item_cost(item: tuple, price: KindPrice) -> int:
    """One item's (or packed piece's) price in units: its blocks, ``per_item``, ``per_split`` if split.
    ``item``: ``(b, blk_lo, blk_hi, slot)``, ``slot >= 0`` when it writes a partial."""
    return (item[2] - item[1]) * UNIT + price.per_item + (price.per_split if item[3] >= 0 else 0)


def item_makespan(items: list, slots: int, price: KindPrice = ITEM_PRICE) -> int:
    """The busiest SM's work (units) when the live ``items`` (plan order) run one per program on
    ``slots`` SMs, each started on the SM that frees first: in closed form, as the device planner
    computes it. One wave: the longest item. Two: each of the second wave's items (longest first)
    joins a first-wave item (shortest first), the sum bounded by the mean load plus the second
    wave's longest item (short items stack on one SM); more: that bound."""
    c = [item_cost(it, price) for it in items if it[0] >= 0]
    if not c:
        return 0
    top = max(c)
    if len(c) <= slots:
        return top
    first, second = sorted(c[:slots]), sorted(c[slots:], reverse=True)
    bound = sum(c) // slots + second[0]
    if len(c) > 2 * slots:
        return max(top, bound)
    pairs = max(f + (second[i] if i < len(second) else 0) for i, f in enumerate(first))
    return max(top, min(pairs, bound))


def packed_makespan(items: list, starts: list, slots: int, price: KindPrice = PACKED_PRICE) -> int:
    """A packed plan's widest program (units), times its waves when it has more programs with
    work than ``slots``."""
    widths = [sum(item_cost(items[i], price) for i in range(starts[p], starts[p + 1])) for p in range(len(starts) - 1)]
    used = sum(1 for p in range(len(starts) - 1) if starts[p + 1] > starts[p])
    return max(widths, default=0) * max(1, _cdiv(used, slots))


def kind_estimate(makespan: int, price: KindPrice) -> int:
    """A plan kind's time in units: ``price.fixed + price.block_pct / 100 * makespan``."""
    return price.fixed + price.block_pct * makespan // 100


def packed_layout(blocks, slots: int, ov: int = PACK_OVERHEAD) -> tuple[list, list, list, int, int, int]:
    """The packed plan's layout of sequences of ``blocks[b]`` key blocks on ``slots`` programs
    at once: the sequences laid end to end, each ``ov`` units of prologue then its blocks, and
    program ``p`` taking units ``[p W, (p + 1) W)`` of that line (``W`` the width: the line over
    the slots, at least ``ov + 1``, at most :data:`MAX_ITEM_BLOCKS`); a program boundary inside a
    prologue moves to the sequence's start.

    Returns ``(items, seqs, first_program, W, line, split_items)``: the pieces ``(b, lo, hi,
    slot)`` in program order (``slot`` the partial a split sequence's piece writes, else -1),
    ``(first_slot, pieces)`` per sequence, each sequence's first program, the width, the line's
    length in units and the partials used."""
    n_seq = len(blocks)
    width = min(max(_cdiv(sum(blocks) + ov * n_seq, slots), ov + 1), MAX_ITEM_BLOCKS)
    items: list[tuple[int, int, int, int]] = []
    seqs: list[tuple[int, int]] = []
    first_program: list[int] = []
    pos, next_slot = 0, 0
    for b, n in enumerate(blocks):
        end = pos + n + ov
        q = pos // width
        # a boundary inside the sequence's overhead units (at most one: width > ov) moves to its start
        p0 = q + ((q + 1) * width <= pos + (ov if n else ov - 1))
        p1 = (end - 1) // width
        count = p1 - p0 + 1
        first = next_slot if count > 1 else -1
        next_slot += count if count > 1 else 0
        seqs.append((first, count))
        first_program.append(p0)
        for j in range(count):
            p = p0 + j
            lo = 0 if j == 0 else p * width - pos - ov
            hi = n if p == p1 else (p + 1) * width - pos - ov
            items.append((b, lo, hi, first + j if count > 1 else -1))
        pos = end
    return items, seqs, first_program, width, pos, next_slot


def packed_starts(seqs: list, first_program: list, programs: int) -> list[int]:
    """``starts`` of a :func:`packed_layout`: program ``p`` runs pieces ``starts[p] .. starts[p + 1]``."""
    return [sum(min(max(p - p0, 0), c) for p0, (_, c) in zip(first_program, seqs)) for p in range(programs + 1)]


def uniform_sizes(b: int, n: int, c: int, slots: int) -> list[int]:
    """The item plan's item sizes (blocks) of ``b`` sequences of ``n`` blocks cut at ``c``, in
    the planner's order: near-equal where the items fit one wave, else each sequence's chunks of
    ``c`` blocks, then the remainders."""
    cnt = max(1, _cdiv(n, c))
    if b * cnt <= slots:
        return sorted((n // cnt + (j < n % cnt) for j in range(cnt)), reverse=True) * b
    if cnt == 1:
        return [n] * b
    return [c] * (b * (n // c)) + ([n % c] * b if n % c else [])


def uniform_packs(b: int, n: int, tiles: int, sms: int, comb: int) -> bool:
    """Whether ``b`` sequences of ``n`` key blocks (``tiles`` 64-row tiles each; ``comb`` the
    combine's units per split item) run as a packed plan: where :func:`may_pack`, the packed
    layout priced (:data:`PACKED_PRICE`) below the item plan of the planner's cut
    (:func:`best_cut`; :data:`ITEM_PRICE`). The host's uniform plans and the cost model of the
    dense call both take this choice (measured on an H200: b = 20, s = 4, t = 10,240 ran its item
    plan at 0.65x FlashMLA, which packs that batch)."""
    slots = max(1, sms // max(1, tiles))
    if b < 1 or n < 1 or not may_pack(b, tiles, sms) or _cdiv(b * (n + PACK_OVERHEAD), MAX_ITEM_BLOCKS) > 16 * slots:
        return False        # (past 16 waves of programs at the item limit both kinds are whole waves)
    max_items, max_slots = plan_buffers(b, slots, n)
    c = best_cut([n] * b, slots, tiles, sms, comb, max_items, max_slots)[1]
    split = 0 if _cdiv(n, c) > 1 else -1
    item = item_makespan([(0, 0, x, split) for x in uniform_sizes(b, n, c, slots)], slots)
    pieces, seqs, first, _, _, _ = packed_layout([n] * b, slots)
    programs = max(slots, _cdiv(b * (n + PACK_OVERHEAD), MAX_ITEM_BLOCKS))
    packed = packed_makespan(pieces, packed_starts(seqs, first, programs), slots)
    return kind_estimate(packed, PACKED_PRICE) < kind_estimate(item, ITEM_PRICE)

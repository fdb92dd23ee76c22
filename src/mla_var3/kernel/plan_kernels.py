"""The device planner's Triton kernels (the cuts' simulation, the item plan, the packed plan) and
their launch options. What they compute: :mod:`mla_var3.kernel.decode_plan`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mla_var3.analysis import item_cut
from mla_var3.analysis.item_cut import COMBINE_FIXED, ITEM_OVERHEAD, MAX_ITEM_BLOCKS, MIN_ITEM_BLOCKS
from mla_var3.analysis.item_cut import UNIT as _UNIT
from mla_var3.kernel._launch import CachedLaunch
from mla_var3.kernel.plan_types import SIZE_CLASSES, ITEM_PRICE, PACK_OVERHEAD, PACKED_PRICE, PLAN_BLOCK


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr):
    """Sequences ``b0 + offs``: (in the batch, their blocks), lengths clamped to [0, T]."""
    ok = b0 + offs < B
    if HAS_SEQLENS:
        L = tl.minimum(tl.load(seqlens_ptr + b0 + offs, mask=ok, other=0), T)
    else:
        L = tl.where(ok, T, 0)
    return ok, (tl.maximum(L, 0) + BLOCK - 1) // BLOCK


@triton.jit
def _chunk_parts(n, ok, c_len):
    """Sequences of ``n`` blocks (``ok``: in the batch) cut in chunks at ``c_len``: (items, full
    chunks of ``c_len`` blocks, the remainder's blocks). A sequence not split is its remainder;
    a split one has a remainder item only where it is not 0 blocks."""
    c = tl.where(ok, tl.maximum((n + c_len - 1) // c_len, 1), 0)
    full = tl.where(c > 1, n // c_len, 0)
    return c, full, n - full * c_len


@triton.jit
def _cut_stats(seqlens_ptr, offs, B, T, c_len, HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_B: tl.constexpr):
    """The cut at ``c_len`` blocks over the batch, ``BLOCK_B`` sequences a pass: (the longest
    sequence, items, split items, full chunks, the longest near-equal item, the longest item cut
    in chunks)."""
    top = tl.zeros([BLOCK_B], tl.int32)
    items = tl.zeros([BLOCK_B], tl.int32)
    split = tl.zeros([BLOCK_B], tl.int32)
    chunks = tl.zeros([BLOCK_B], tl.int32)
    long_eq = tl.zeros([BLOCK_B], tl.int32)
    long_ch = tl.zeros([BLOCK_B], tl.int32)
    for b0 in range(0, B, BLOCK_B):
        ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
        c, full, rest = _chunk_parts(n, ok, c_len)
        top = tl.maximum(top, n)
        items += c
        split += tl.where(c > 1, c, 0)
        chunks += full
        long_eq = tl.maximum(long_eq, (n + tl.maximum(c, 1) - 1) // tl.maximum(c, 1))
        long_ch = tl.maximum(long_ch, tl.where(c > 1, c_len, n))
    return (tl.max(top, 0), tl.sum(items, 0), tl.sum(split, 0), tl.sum(chunks, 0), tl.max(long_eq, 0),
            tl.max(long_ch, 0))


@triton.jit
def _parts(n, ok, c_len, l_top, eq, NCLS: tl.constexpr):
    """The cut at ``c_len`` as two parts per sequence: (items, part 0's items, its size class,
    whether part 1 exists, its size class). Chunks: part 0 the full chunks, part 1 the remainder;
    near-equal items (``eq``, a one-wave cut): part 0 all of them, classed by their size."""
    c, full, rest = _chunk_parts(n, ok, c_len)
    size_a = tl.where(eq, (n + tl.maximum(c, 1) - 1) // tl.maximum(c, 1), c_len)
    cnt_a = tl.where(eq, c, full)
    cls_a = tl.minimum((size_a * NCLS) // (l_top + 1), NCLS - 1)
    has_b = ok & (eq == 0) & ((c == 1) | (rest > 0))
    cls_b = tl.minimum((rest * NCLS) // (l_top + 1), NCLS - 1)
    return c, cnt_a, cls_a, has_b, cls_b


@triton.jit
def _order_one_pass(seqlens_ptr, items_ptr, seqs_ptr, offs, B, T, c_len, l_top, eq, HAS_SEQLENS: tl.constexpr,
                    BLOCK: tl.constexpr, NCLS: tl.constexpr):
    """:func:`_order_by_class` for a batch of at most ``BLOCK_B`` sequences, all classes in one
    ``[NCLS, BLOCK_B]`` pass: a part's first item follows the items of the classes above its own,
    then those of the earlier sequences of its class (a sequence's chunks before its remainder).
    Returns (items, split items)."""
    ok, n = _blocks(seqlens_ptr, 0, offs, B, T, HAS_SEQLENS, BLOCK)
    c, cnt_a, cls_a, has_b, cls_b = _parts(n, ok, c_len, l_top, eq, NCLS)
    has_a = ok & (cnt_a > 0)
    row = tl.arange(0, NCLS)[:, None]
    hit_a = has_a[None, :] & (row == cls_a[None, :])
    hit_b = has_b[None, :] & (row == cls_b[None, :])
    cnt = tl.where(hit_a, cnt_a[None, :], 0) + hit_b.to(tl.int32)
    per_cls = tl.sum(cnt, 1)
    n_items = tl.sum(per_cls, 0)
    at = (n_items - tl.cumsum(per_cls, 0))[:, None] + tl.cumsum(cnt, 1) - cnt
    pos_a = tl.sum(tl.where(hit_a, at, 0), 0)
    pos_b = tl.sum(tl.where(hit_b, at + tl.where(hit_a, cnt_a[None, :], 0), 0), 0)
    scnt = tl.where(c > 1, c, 0)
    first_slot = tl.cumsum(scnt, 0) - scnt
    tl.store(seqs_ptr + offs * 2, tl.where(c > 1, first_slot, -1), mask=ok)
    tl.store(seqs_ptr + offs * 2 + 1, c, mask=ok)
    tl.store(items_ptr + pos_a * 4, offs * 2, mask=has_a)
    tl.store(items_ptr + pos_b * 4, offs * 2 + 1, mask=has_b)
    return n_items, tl.sum(scnt, 0)


@triton.jit
def _order_by_class(seqlens_ptr, items_ptr, seqs_ptr, offs, B, T, c_len, l_top, eq, HAS_SEQLENS: tl.constexpr,
                    BLOCK: tl.constexpr, NCLS: tl.constexpr, BLOCK_B: tl.constexpr):
    """The cut at ``c_len`` blocks (in chunks, or near-equal where ``eq``; :func:`_parts`), in
    order: each sequence's part 0 and part 1 are placed by their size class, the longest class
    first and batch order within a class (a counting sort, a pass per class), and a part's first
    entry in ``items`` is marked ``2 b + part``; split slots in batch order (``seqs``). Returns
    (items, split items)."""
    next_slot = tl.full([], 0, tl.int32)
    for b0 in range(0, B, BLOCK_B):
        ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
        c, full, rest = _chunk_parts(n, ok, c_len)
        scnt = tl.where(c > 1, c, 0)
        tl.store(seqs_ptr + (b0 + offs) * 2, tl.where(c > 1, next_slot + tl.cumsum(scnt, 0) - scnt, -1), mask=ok)
        tl.store(seqs_ptr + (b0 + offs) * 2 + 1, c, mask=ok)
        next_slot += tl.sum(scnt, 0)
    next_item = tl.full([], 0, tl.int32)
    for cls_i in range(NCLS):
        cls = NCLS - 1 - cls_i
        for b0 in range(0, B, BLOCK_B):
            ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
            c, cnt_a, cls_a, has_b, cls_b = _parts(n, ok, c_len, l_top, eq, NCLS)
            hit_a = ok & (cnt_a > 0) & (cls_a == cls)
            hit_b = has_b & (cls_b == cls)
            cnt = tl.where(hit_a, cnt_a, 0) + hit_b.to(tl.int32)
            at = next_item + tl.cumsum(cnt, 0) - cnt
            tl.store(items_ptr + at * 4, (b0 + offs) * 2, mask=hit_a)
            tl.store(items_ptr + (at + tl.where(hit_a, cnt_a, 0)) * 4, (b0 + offs) * 2 + 1, mask=hit_b)
            next_item += tl.sum(cnt, 0)
    return next_item, next_slot


@triton.jit
def _schedule_item(free, slow, sj, d, e, TILES, EXTRA):
    """One item of ``d`` units onto the slot that frees first (``free [BLOCK_S]``, finish times x
    ``e``, the lowest index on a tie), or onto the ``EXTRA`` leftover SMs' slower slot (finish
    ``slow``; an item takes ``TILES / e`` times as long there) where it would end strictly sooner.
    Returns (free, slow)."""
    key = tl.min(free * 1024 + sj, 0)
    f = key // 1024
    on_slow = (EXTRA > 0) & (slow + d * TILES < f + d * e)
    return tl.where((sj == key % 1024) & (on_slow == 0), f + d * e, free), tl.where(on_slow, slow + d * TILES, slow)


@triton.jit
def _cut_sim_kernel(seqlens_ptr, cest_ptr, B, T, SLOTS, TILES, EXTRA, MAX_ITEMS, MAX_SLOTS, COMB,
                    HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr, MIN_C: tl.constexpr, MAX_C: tl.constexpr,
                    OVH: tl.constexpr, COMB_FIXED_C: tl.constexpr, UNIT: tl.constexpr, SORT_B: tl.constexpr,
                    BLOCK_S: tl.constexpr, LATE: tl.constexpr):
    """Program ``i``: the estimate of the cut at ``C = MIN_C + i`` blocks
    (:func:`mla_var3.analysis.item_cut.cut_estimates`, bit for bit) into ``cest_ptr[i]`` (int64;
    the largest int64 where C exceeds the longest sequence or the cut exceeds the buffers). Reads
    the B lengths twice, ``SORT_B`` at a time; one step per item where the items take more than
    one wave: the items (the chunks, then each ``SORT_B`` sequences' remainders longest first) go
    one at a time to the slot that frees first (``BLOCK_S >= SLOTS`` lanes), or to the slower
    slot of the ``EXTRA`` SMs left over when it would finish there first (without such SMs the
    chunks, all of one size, are dealt round the slots in closed form)."""
    big = 9223372036854775807
    c_len = MIN_C + tl.program_id(0)
    offs = tl.arange(0, SORT_B)
    top, n_items, n_split, n_chunks, long_eq, _ = _cut_stats(seqlens_ptr, offs, B, T, c_len, HAS_SEQLENS, BLOCK,
                                                             SORT_B)
    est = long_eq.to(tl.int64) * UNIT + OVH
    live = (n_items <= MAX_ITEMS) & (n_split <= MAX_SLOTS) & (c_len <= tl.maximum(top, MIN_C))
    if live & (n_items > SLOTS):
        e = tl.maximum(EXTRA, 1).to(tl.int64)
        sj = tl.arange(0, BLOCK_S)
        free = tl.where(sj < SLOTS, tl.zeros([BLOCK_S], tl.int64), tl.full([BLOCK_S], 1 << 50, tl.int64))
        slow = tl.full([], 0, tl.int64)         # finish times x e: the slots', the leftover SMs' (EXTRA > 0)
        d = c_len.to(tl.int64) * UNIT + OVH
        if EXTRA == 0:      # equal slots: the chunks go round the slots from the first, in closed form
            free += tl.where(sj < SLOTS, (n_chunks // SLOTS + (sj < n_chunks % SLOTS).to(tl.int32)) * d, 0)
        else:
            for _ in range(n_chunks):
                free, slow = _schedule_item(free, slow, sj, d, e, TILES, EXTRA)
        for b0 in range(0, B, SORT_B):
            ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
            c, full, rest = _chunk_parts(n, ok, c_len)
            has = ok & ((c == 1) | (rest > 0))
            srt = tl.sort(tl.where(has, rest, -1), descending=True)
            for k in range(tl.sum(has.to(tl.int32), 0)):
                d = tl.max(tl.where(offs == k, srt, -1), 0).to(tl.int64) * UNIT + OVH
                free, slow = _schedule_item(free, slow, sj, d, e, TILES, EXTRA)
        est = tl.maximum(tl.max(tl.where(sj < SLOTS, free, 0), 0), slow) // e + LATE
    est += tl.where(n_split > 0, COMB_FIXED_C + n_split.to(tl.int64) * COMB, 0)
    tl.store(cest_ptr + tl.program_id(0), tl.where(live, est, big))


CUT_SIM_LAUNCH = CachedLaunch(_cut_sim_kernel)


@triton.jit
def _plan_kernel(seqlens_ptr, cest_ptr, items_ptr, seqs_ptr, est_ptr, B, T, SLOTS, MAX_ITEMS, NCAND,
                 HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr, MIN_C: tl.constexpr, MAX_C: tl.constexpr,
                 NCLS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr, WRITE_EST: tl.constexpr):
    """One program, after :func:`_cut_sim_kernel` estimated the ``NCAND`` cuts: takes the cheapest
    (ties: the longer items), then orders and writes its items. Reads the B lengths twice, in
    pass 3 once (a batch of at most ``BLOCK_B <= 128`` sequences) or once per size class
    (``NCLS``), and in pass 4; writes MAX_ITEMS * 4 + B * 2 int32 (and, with ``WRITE_EST``, its
    item count as an int64 at ``est_ptr[0]``, which the packed planner reads to price the item
    plan). Lengths are clamped to [0, T] (T: the capacity)."""
    offs = tl.arange(0, BLOCK_B)
    ii = tl.arange(0, BLOCK_I)
    big = 9223372036854775807
    # ---- pass 1: the longest sequence, in blocks
    top = tl.zeros([BLOCK_B], tl.int32)
    for b0 in range(0, B, BLOCK_B):
        ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
        top = tl.maximum(top, n)
    c_len = tl.minimum(tl.maximum(tl.max(top, 0), MIN_C), MAX_C)
    # ---- the cheapest cut (a later, longer one wins a tie); the longest sequence when none fits
    best = tl.full([], big, tl.int64)
    for i0 in range(0, NCAND, BLOCK_I):
        e = tl.load(cest_ptr + i0 + ii, mask=i0 + ii < NCAND, other=big)
        m = tl.min(e, 0)
        if (m < big) & (m <= best):
            c_len = tl.max(tl.where(e == m, MIN_C + i0 + ii, 0), 0)
            best = m
    # ---- pass 2: the chosen cut's items and its longest item (the size classes are relative to
    # it); a cut of one wave is cut near-equal (its longest item is its time), a longer one in chunks
    _, n_items, _, _, long_eq, long_ch = _cut_stats(seqlens_ptr, offs, B, T, c_len, HAS_SEQLENS, BLOCK, BLOCK_B)
    eq = n_items <= SLOTS
    l_top = tl.where(eq, long_eq, long_ch)
    # ---- pass 3: per sequence, its first item and slot, longest size class first (a counting
    # sort); item b's first entry marks where sequence b starts in the item list
    for i0 in range(0, MAX_ITEMS, BLOCK_I):
        tl.store(items_ptr + (i0 + ii) * 4, tl.full([BLOCK_I], -1, tl.int32), mask=i0 + ii < MAX_ITEMS)
    tl.debug_barrier()
    if (BLOCK_B <= 128) and (B <= BLOCK_B):     # the batch in one pass, all classes at once
        next_item, next_slot = _order_one_pass(seqlens_ptr, items_ptr, seqs_ptr, offs, B, T, c_len, l_top, eq,
                                               HAS_SEQLENS, BLOCK, NCLS)
    else:
        next_item, next_slot = _order_by_class(seqlens_ptr, items_ptr, seqs_ptr, offs, B, T, c_len, l_top, eq,
                                               HAS_SEQLENS, BLOCK, NCLS, BLOCK_B)
    if WRITE_EST:
        tl.store(est_ptr, next_item.to(tl.int64))
    tl.debug_barrier()
    # ---- pass 4: every item finds its sequence (the last start at or before it) and its range.
    # A start in an earlier block was overwritten by that block's items: its mark is carried
    carry = 0
    carry_part = -2
    for i0 in range(0, MAX_ITEMS, BLOCK_I):
        idx = i0 + ii
        in_plan = idx < next_item
        mark = tl.load(items_ptr + idx * 4, mask=idx < MAX_ITEMS, other=-1)
        start = tl.maximum(tl.associative_scan(tl.where(mark >= 0, idx, -1), 0, _max_combine), carry)
        here = start >= i0
        part = tl.where(here, tl.load(items_ptr + start * 4, mask=in_plan & here, other=-2), carry_part)
        part = tl.where(in_plan, part, -2)
        carry = tl.max(start, 0)
        carry_part = tl.max(tl.where(start == carry, part, -2), 0)
        b = tl.where(part >= 0, part // 2, -1)
        bb = tl.maximum(b, 0)
        if HAS_SEQLENS:
            L = tl.minimum(tl.load(seqlens_ptr + bb, mask=in_plan, other=0), T)
        else:
            L = tl.where(in_plan, T, 0)
        n = (tl.maximum(L, 0) + BLOCK - 1) // BLOCK
        c = tl.load(seqs_ptr + bb * 2 + 1, mask=in_plan, other=1)
        s0 = tl.load(seqs_ptr + bb * 2, mask=in_plan, other=-1)
        j = idx - start
        full = tl.where(c > 1, n // c_len, 0)
        rest = part % 2 == 1            # the remainder (or a sequence not split)
        lo = tl.where(rest, full, j) * c_len
        hi = tl.where(rest, n, lo + c_len)
        base = n // tl.maximum(c, 1)
        rem = n % tl.maximum(c, 1)
        lo = tl.where(eq, j * base + tl.minimum(j, rem), lo)      # near-equal items
        hi = tl.where(eq, j * base + tl.minimum(j, rem) + base + (j < rem).to(tl.int32), hi)
        slot = tl.where(c > 1, s0 + tl.where(rest, full, j), -1)
        live = idx < MAX_ITEMS
        tl.debug_barrier()              # every thread has read its marks before any overwrites them
        tl.store(items_ptr + idx * 4, tl.where(in_plan, b, -1), mask=live)
        tl.store(items_ptr + idx * 4 + 1, tl.where(in_plan, lo, -1), mask=live)
        tl.store(items_ptr + idx * 4 + 2, tl.where(in_plan, hi, -1), mask=live)
        tl.store(items_ptr + idx * 4 + 3, tl.where(in_plan, slot, -1), mask=live)


PLAN_LAUNCH = CachedLaunch(_plan_kernel)


@triton.jit
def _packed_pieces(seqlens_ptr, b0, offs, B, T, pos0, W, HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr,
                   OV: tl.constexpr):
    """Sequences ``b0 + offs`` of a packed plan with units ``pos0`` before them: (in the batch,
    blocks, first unit, first program, pieces, the units before the next chunk), as
    :func:`packed_reference` computes them."""
    ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
    cost = tl.where(ok, n + OV, 0)
    pos = pos0 + tl.cumsum(cost, 0) - cost
    q = pos // W
    p0 = q + ((q + 1) * W <= pos + tl.where(n > 0, OV, OV - 1)).to(tl.int32)
    p1 = (pos + cost - 1) // W
    return ok, n, pos, p0, tl.where(ok, p1 - p0 + 1, 0), pos0 + tl.sum(cost, 0)


@triton.jit
def _kill_items(items_ptr, first, MAX_ITEMS, BLOCK: tl.constexpr):
    """Items ``first .. MAX_ITEMS`` become ``(-1, -1, -1, -1)`` (no work)."""
    ii = tl.arange(0, BLOCK)
    for i0 in range(0, MAX_ITEMS, BLOCK):
        dead = (i0 + ii >= first) & (i0 + ii < MAX_ITEMS)
        for c in tl.static_range(4):
            tl.store(items_ptr + (i0 + ii) * 4 + c, tl.full([BLOCK], -1, tl.int32), mask=dead)


@triton.jit
def _piece_cost(items_ptr, idx, ok, UNIT: tl.constexpr, PER: tl.constexpr, SPLIT: tl.constexpr):
    """Items ``idx`` (where ``ok``): their price in units (:func:`_item_cost`), 0 elsewhere; int64."""
    lo = tl.load(items_ptr + idx * 4 + 1, mask=ok, other=0)
    hi = tl.load(items_ptr + idx * 4 + 2, mask=ok, other=0)
    sl = tl.load(items_ptr + idx * 4 + 3, mask=ok, other=-1)
    return tl.where(ok, (hi - lo).to(tl.int64) * UNIT + PER + tl.where(sl >= 0, SPLIT, 0), 0)


@triton.jit
def _item_makespan(items_ptr, N, SLOTS, UNIT: tl.constexpr, PER: tl.constexpr, SPLIT: tl.constexpr,
                   BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """:func:`item_makespan` of the ``N`` items at ``items_ptr`` on ``SLOTS`` (<= ``BLOCK_S``) SMs."""
    ii = tl.arange(0, BLOCK)
    work = tl.zeros([BLOCK], tl.int64)
    top = tl.zeros([BLOCK], tl.int64)
    top2 = tl.zeros([BLOCK], tl.int64)
    for i0 in range(0, N, BLOCK):
        idx = i0 + ii
        c = _piece_cost(items_ptr, idx, idx < N, UNIT, PER, SPLIT)
        work += c
        top = tl.maximum(top, c)
        top2 = tl.maximum(top2, tl.where(idx >= SLOTS, c, 0))
    jj = tl.arange(0, BLOCK_S)
    n1 = tl.minimum(N, SLOTS)
    big = 9223372036854775807
    first = tl.sort(tl.where(jj < n1, _piece_cost(items_ptr, jj, jj < n1, UNIT, PER, SPLIT), big))
    ok2 = (jj < N - SLOTS) & (jj < SLOTS)
    second = tl.sort(_piece_cost(items_ptr, SLOTS + jj, ok2, UNIT, PER, SPLIT), descending=True)
    pairs = tl.max(tl.where(jj < n1, first + second, 0), 0)
    t = tl.max(top, 0)
    bound = tl.sum(work, 0) // SLOTS + tl.max(top2, 0)
    m = tl.maximum(t, tl.minimum(pairs, bound))
    m = tl.where(N > 2 * SLOTS, tl.maximum(t, bound), m)
    return tl.where(N <= SLOTS, t, m)


@triton.jit
def _packed_widest(seqlens_ptr, B, T, PROGRAMS, W, HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr, OV: tl.constexpr,
                   BLOCK_B: tl.constexpr, BLOCK_W: tl.constexpr, UNIT: tl.constexpr, PER: tl.constexpr,
                   SPLIT: tl.constexpr):
    """The packed plan at ``W`` units per program: (its widest program's price in units, the
    programs with work), as :func:`packed_makespan` prices them, from the lengths."""
    offs = tl.arange(0, BLOCK_B)
    pp = tl.arange(0, BLOCK_W)
    widest = tl.zeros([BLOCK_W], tl.int64)
    used = tl.zeros([BLOCK_W], tl.int32)
    for q0 in range(0, PROGRAMS, BLOCK_W):
        acc = tl.zeros([BLOCK_W], tl.int64)
        pos0 = 0
        for b0 in range(0, B, BLOCK_B):
            ok, n, pos, p0, cnt, pos0 = _packed_pieces(seqlens_ptr, b0, offs, B, T, pos0, W, HAS_SEQLENS, BLOCK, OV)
            p = (q0 + pp)[:, None]
            j = p - p0[None, :]
            live = (j >= 0) & (j < cnt[None, :])
            lo = tl.where(j == 0, 0, p * W - pos[None, :] - OV)
            hi = tl.where(j == cnt[None, :] - 1, n[None, :], (p + 1) * W - pos[None, :] - OV)
            c = (hi - lo).to(tl.int64) * UNIT + PER + tl.where(cnt[None, :] > 1, SPLIT, 0)
            acc += tl.sum(tl.where(live, c, 0), 1)
        widest = tl.maximum(widest, acc)
        used += (acc > 0).to(tl.int32)
    return tl.max(widest, 0), tl.sum(used, 0)


@triton.jit
def _packed_kernel(seqlens_ptr, items_ptr, seqs_ptr, starts_ptr, est_ptr, B, T, SLOTS, PROGRAMS, MAX_ITEMS,
                   HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr, OV: tl.constexpr, MAX_C: tl.constexpr,
                   BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, AUTO: tl.constexpr, UNIT: tl.constexpr,
                   BLOCK_S: tl.constexpr, BLOCK_W: tl.constexpr, I_FIXED: tl.constexpr, I_ITEM: tl.constexpr,
                   I_SPLIT: tl.constexpr, I_PCT: tl.constexpr, P_FIXED: tl.constexpr, P_ITEM: tl.constexpr,
                   P_SPLIT: tl.constexpr, P_PCT: tl.constexpr):
    """One program: the packed plan (module docstring). Reads B lengths three times plus once per
    ``BLOCK_P`` programs; writes MAX_ITEMS * 4 + B * 2 + PROGRAMS + 1 int32. With ``AUTO``, after
    :func:`_plan_kernel` wrote the item plan and its item count (``est_ptr[0]``): the packed plan
    only when :func:`kind_estimate` prices it below the item plan (``I_*``: :data:`ITEM_PRICE`,
    ``P_*``: :data:`PACKED_PRICE`; ``BLOCK_S`` >= ``SLOTS``), else the item plan's ``starts``
    (one item per program); the choice (1: packed) goes to ``est_ptr[1]``."""
    offs = tl.arange(0, BLOCK_B)
    # ---- pass 1: the units per program
    total = tl.zeros([BLOCK_B], tl.int32)
    for b0 in range(0, B, BLOCK_B):
        ok, n = _blocks(seqlens_ptr, b0, offs, B, T, HAS_SEQLENS, BLOCK)
        total += tl.where(ok, n + OV, 0)
    tot = tl.sum(total, 0)
    W = tl.minimum(tl.maximum((tot + SLOTS - 1) // SLOTS, OV + 1), MAX_C)
    if AUTO:
        n_items = tl.load(est_ptr).to(tl.int32)
        m_i = _item_makespan(items_ptr, n_items, SLOTS, UNIT, I_ITEM, I_SPLIT, BLOCK_P, BLOCK_S)
        widest, used = _packed_widest(seqlens_ptr, B, T, PROGRAMS, W, HAS_SEQLENS, BLOCK, OV, BLOCK_B, BLOCK_W, UNIT,
                                      P_ITEM, P_SPLIT)
        m_p = widest * tl.maximum((used + SLOTS - 1) // SLOTS, 1)
        use = P_FIXED + P_PCT * m_p // 100 < I_FIXED + I_PCT * m_i // 100
        tl.store(est_ptr + 1, use.to(tl.int64))
    else:
        use = True
    if use:
        _packed_write(seqlens_ptr, items_ptr, seqs_ptr, starts_ptr, B, T, PROGRAMS, MAX_ITEMS, W, HAS_SEQLENS, BLOCK,
                      OV, BLOCK_B, BLOCK_P, BLOCK_W)
    else:
        n_items = tl.load(est_ptr).to(tl.int32)
        _kill_items(items_ptr, n_items, MAX_ITEMS, BLOCK_P)
        pp = tl.arange(0, BLOCK_P)
        for q0 in range(0, PROGRAMS + 1, BLOCK_P):
            tl.store(starts_ptr + q0 + pp, tl.minimum(q0 + pp, n_items), mask=q0 + pp <= PROGRAMS)


@triton.jit
def _packed_write(seqlens_ptr, items_ptr, seqs_ptr, starts_ptr, B, T, PROGRAMS, MAX_ITEMS, W,
                  HAS_SEQLENS: tl.constexpr, BLOCK: tl.constexpr, OV: tl.constexpr, BLOCK_B: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr):
    """The packed plan's items, sequences and program starts for ``W`` units per program (the
    starts ``BLOCK_Q`` programs at a time: a ``[BLOCK_Q, BLOCK_B]`` tile per pass, which at
    ``BLOCK_P`` programs spilled registers from 64 sequences up)."""
    offs = tl.arange(0, BLOCK_B)
    _kill_items(items_ptr, 0, MAX_ITEMS, BLOCK_P)
    tl.debug_barrier()
    # ---- pass 2: each sequence's pieces, items in sequence order (= program order)
    pos0 = 0
    next_item = 0
    next_slot = 0
    for b0 in range(0, B, BLOCK_B):
        ok, n, pos, p0, cnt, pos_next = _packed_pieces(seqlens_ptr, b0, offs, B, T, pos0, W, HAS_SEQLENS, BLOCK, OV)
        p1 = p0 + cnt - 1
        first_item = next_item + tl.cumsum(cnt, 0) - cnt
        scnt = tl.where(cnt > 1, cnt, 0)
        first_slot = next_slot + tl.cumsum(scnt, 0) - scnt
        tl.store(seqs_ptr + (b0 + offs) * 2, tl.where(cnt > 1, first_slot, -1), mask=ok)
        tl.store(seqs_ptr + (b0 + offs) * 2 + 1, cnt, mask=ok)
        for j in range(0, tl.max(cnt, 0)):
            live = ok & (j < cnt)
            p = p0 + j
            lo = tl.where(j == 0, 0, p * W - pos - OV)
            hi = tl.where(p == p1, n, (p + 1) * W - pos - OV)
            idx = (first_item + j) * 4
            tl.store(items_ptr + idx, b0 + offs, mask=live)
            tl.store(items_ptr + idx + 1, lo, mask=live)
            tl.store(items_ptr + idx + 2, hi, mask=live)
            tl.store(items_ptr + idx + 3, tl.where(cnt > 1, first_slot + j, -1), mask=live)
        pos0 = pos_next
        next_item += tl.sum(cnt, 0)
        next_slot += tl.sum(scnt, 0)
    # ---- pass 3: program p starts at the items of the programs before it
    pp = tl.arange(0, BLOCK_Q)
    for q0 in range(0, PROGRAMS + 1, BLOCK_Q):
        acc = tl.zeros([BLOCK_Q], tl.int32)
        pos0 = 0
        for b0 in range(0, B, BLOCK_B):
            ok, n, pos, p0, cnt, pos0 = _packed_pieces(seqlens_ptr, b0, offs, B, T, pos0, W, HAS_SEQLENS, BLOCK, OV)
            before = tl.minimum(tl.maximum((q0 + pp)[:, None] - p0[None, :], 0), cnt[None, :])
            acc += tl.sum(before, 1)
        tl.store(starts_ptr + q0 + pp, acc, mask=q0 + pp <= PROGRAMS)


PACKED_LAUNCH = CachedLaunch(_packed_kernel)


def seq_block(batch: int, block: int) -> int:
    """Sequences per pass of the planners: the batch's own power of two up to ``block`` (a
    [candidates x sequences] pass over 256 lanes for 32 sequences is mostly masked work), so a
    batch of up to ``block`` sequences sits in one pass."""
    return min(block, max(16, triton.next_power_of_2(batch)))


def plan_constexprs(has_seqlens: bool, block: int, write_est: bool, block_b: int | None = None) -> dict:
    """The compile-time constants :func:`build_plan` launches ``_plan_kernel`` with: ``block``
    items per pass, ``block_b`` (default ``block``) sequences per pass."""
    return dict(HAS_SEQLENS=has_seqlens, BLOCK=PLAN_BLOCK, MIN_C=MIN_ITEM_BLOCKS, MAX_C=MAX_ITEM_BLOCKS,
                NCLS=SIZE_CLASSES, BLOCK_B=block_b or block, BLOCK_I=block, WRITE_EST=write_est)


def cut_sim_constexprs(has_seqlens: bool, slots: int) -> dict:
    """The compile-time constants :func:`build_plan` launches ``_cut_sim_kernel`` with."""
    return dict(HAS_SEQLENS=has_seqlens, BLOCK=PLAN_BLOCK, MIN_C=MIN_ITEM_BLOCKS, MAX_C=MAX_ITEM_BLOCKS,
                OVH=ITEM_OVERHEAD, COMB_FIXED_C=COMBINE_FIXED, UNIT=_UNIT, SORT_B=item_cut.SORT_BLOCK,
                BLOCK_S=triton.next_power_of_2(max(1, slots)), LATE=item_cut.LATE_WAVE)


def cut_count(max_blocks: int) -> int:
    """Item lengths the planner tries for sequences of up to ``max_blocks`` blocks: every one from
    ``MIN_ITEM_BLOCKS`` up (the estimates' buffer and ``_cut_sim_kernel``'s grid)."""
    return max(1, min(max_blocks, MAX_ITEM_BLOCKS) - MIN_ITEM_BLOCKS + 1)


def packed_constexprs(has_seqlens: bool, block: int, auto: bool, slots: int, block_b: int | None = None) -> dict:
    """The compile-time constants :func:`build_plan` launches ``_packed_kernel`` with: ``block``
    items or programs per pass, ``block_b`` (default ``block``) sequences per pass."""
    ip, pp = ITEM_PRICE, PACKED_PRICE
    return dict(HAS_SEQLENS=has_seqlens, BLOCK=PLAN_BLOCK, OV=PACK_OVERHEAD, MAX_C=MAX_ITEM_BLOCKS,
                BLOCK_B=block_b or block, BLOCK_P=block, AUTO=auto, UNIT=_UNIT,
                BLOCK_S=triton.next_power_of_2(max(1, slots)), BLOCK_W=32,
                I_FIXED=ip.fixed, I_ITEM=ip.per_item, I_SPLIT=ip.per_split, I_PCT=ip.block_pct,
                P_FIXED=pp.fixed, P_ITEM=pp.per_item, P_SPLIT=pp.per_split, P_PCT=pp.block_pct)


"""The reference planner (pure Python): the uniform plans the host builds once per shape, and the
oracle the device planner's tests compare with (the rankings before the simulation are kept to
rebuild the plans earlier records measured). What a plan is: :mod:`mla_var3.kernel.decode_plan`.
"""

from __future__ import annotations

import functools

import torch

from mla_var3.analysis import item_cut
from mla_var3.analysis.item_cut import COMBINE_FIXED, ITEM_OVERHEAD, MAX_ITEM_BLOCKS, MIN_ITEM_BLOCKS
from mla_var3.analysis.item_cut import UNIT as _UNIT
from mla_var3.analysis.item_cut import item_makespan, kind_estimate, packed_makespan  # noqa: F401  (re-exported)
from mla_var3.kernel._common import cdiv
from mla_var3.kernel.plan_types import (
    BIG, ITEM_OVERHEAD_BEFORE, NUM_CANDIDATES, SIZE_CLASSES, TAIL_LATE_WAVE, CUTS, ITEM_PRICE, PACK_OVERHEAD,
    PACKED_PRICE, PLAN_BLOCK, RANKINGS, ROW_TILE, DecodePlan, KindPrice, combine_units,
    device_sms, packed_capacity, plan_capacity, row_slots,
)


def _items_at(blocks: list[int], c_len: int) -> int:
    """Items of the cut at ``c_len`` blocks."""
    return sum(max(1, cdiv(n, c_len)) for n in blocks)


def one_wave_cut(blocks: list[int], slots: int) -> int:
    """The shortest item length (blocks) whose items of sequences of ``blocks`` blocks fit in one
    wave (``slots``), by bisection as the device planner finds it; the longest sequence (within
    the limits) when none does."""
    total, top = sum(blocks), max(blocks, default=0)
    hi = min(max(top, MIN_ITEM_BLOCKS), MAX_ITEM_BLOCKS)
    lo = min(max(cdiv(total, slots), MIN_ITEM_BLOCKS), hi)
    if _items_at(blocks, hi) > slots:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if _items_at(blocks, mid) <= slots:
            hi = mid
        else:
            lo = mid + 1
    return hi


def seq_blocks(lengths: list[int], capacity: int) -> list[int]:
    """Each sequence's key blocks, its length clamped to ``[0, capacity]`` (as the planners read it)."""
    return [cdiv(min(max(0, int(n)), capacity), PLAN_BLOCK) for n in lengths]


def cut_candidates(lengths: list[int], rows: int, *, capacity: int, sms: int = 132) -> list[int]:
    """The item lengths C (blocks) :func:`plan_reference` chooses among (with repeats), in order."""
    return _candidates(seq_blocks(lengths, capacity), row_slots(rows, sms))


def _candidates(blocks: list[int], slots: int) -> list[int]:
    total, top = sum(blocks), max(blocks, default=0)
    cands = [cdiv(total, k * slots) for k in range(1, 9)]
    cands += [cdiv(top, j) for j in range(1, NUM_CANDIDATES - 8)]   # j = 1: no split
    cands = [min(max(c, MIN_ITEM_BLOCKS), MAX_ITEM_BLOCKS) for c in cands]
    return cands + [one_wave_cut(blocks, slots)]


def _pieces(n: int, c: int, c_len: int, cut: str) -> tuple[int, int, int, int]:
    """A sequence of ``n`` blocks in ``c`` items cut at ``c_len`` (``cut``, see :data:`CUTS`), as
    ``(long, long_size, short, short_size)``: ``long`` items of ``long_size`` blocks, then
    ``short`` (0 or more) of ``short_size``."""
    if cut == "equal":
        base, rem = divmod(n, c)
        return rem, base + 1, c - rem, base
    full = n // c_len if c > 1 else 0
    return full, c_len, c - full, n - full * c_len


def _items_at_least(blocks: list[int], counts: list[int], x: int, c_len: int = 0, cut: str = "equal") -> int:
    """Items of at least ``x >= 1`` blocks when sequence ``b`` of ``blocks[b]`` blocks is cut into
    ``counts[b]`` items at ``c_len`` (``cut``)."""
    total = 0
    for n, c in zip(blocks, counts):
        long, long_size, short, short_size = _pieces(n, c, c_len, cut)
        total += long * (long_size >= x) + short * (short_size >= x)
    return total


def _kth_item(blocks: list[int], counts: list[int], r: int, longest: int, c_len: int = 0, cut: str = "equal") -> int:
    """The ``r``-th longest item (0: the longest), in blocks, by bisection on its size as the
    device planner finds it; 0 when there are at most ``r`` items."""
    lo, hi = 0, longest
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _items_at_least(blocks, counts, mid, c_len, cut) > r:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _estimate(blocks: list[int], c_len: int, slots: int, comb: int, max_items: int, max_slots: int,
              ranking: str = "tail", cut: str = "chunk"):
    counts = [max(1, cdiv(n, c_len)) for n in blocks]
    n_items = sum(counts)
    n_split = sum(c for c in counts if c > 1)
    if n_items > max_items or n_split > max_slots:
        return None
    if cut == "chunk" and n_items <= slots:
        cut = "equal"           # one wave: near-equal items (the longest item is the time)
    longest = max(c_len if cut == "chunk" and c > 1 else cdiv(n, c) for n, c in zip(blocks, counts))
    ov = ITEM_OVERHEAD if ranking == "tail" else ITEM_OVERHEAD_BEFORE
    work = sum(blocks) * _UNIT + n_items * ov
    if ranking == "spread":
        est = max(longest * _UNIT + ov, work // slots + (work // (2 * n_items) if n_items > slots else 0))
    else:
        est = longest * _UNIT + ov
        if n_items > slots:
            kth = lambda r: _kth_item(blocks, counts, r, longest, c_len, cut) * _UNIT + ov
            last, second = kth(slots - 1), kth(slots)
            # "tail": beyond two waves the item the last wave's SM takes is about the slots-th
            # shortest, not the (slots + 1)-th longest
            tail = kth(n_items - slots) if ranking == "tail" and n_items > 2 * slots else second
            bound = work // slots + tail
            waves = bound if n_items > 2 * slots else min(bound, max(last + second, work // slots))
            est = max(est, waves + (TAIL_LATE_WAVE if ranking == "tail" else 0))
    if n_split:
        est += COMBINE_FIXED + n_split * comb
    return est


def _size_class(size: int, longest: int) -> int:
    """The order class of an item of ``size`` blocks in a cut whose longest item is ``longest``
    (the highest class is emitted first)."""
    return min(SIZE_CLASSES - 1, (size * SIZE_CLASSES) // (longest + 1))


def plan_reference(lengths: list[int], rows: int, *, capacity: int, k: int = 512, sms: int = 132,
                   item_blocks: int | None = None, gated: bool = False, ranking: str = "sim",
                   cut: str | None = None) -> dict:
    """The plan of :func:`plan_decode`, computed in Python from host lengths. ``item_blocks``
    forces the item length C (in blocks, within [MIN_ITEM_BLOCKS, MAX_ITEM_BLOCKS]) instead of
    the estimate's choice: for measuring the estimate against other cuts. ``gated``: the item
    plan of a batch whose kind the GPU chooses (its items capped, see :func:`plan_capacity`).
    ``ranking``: how the cut is chosen (:data:`RANKINGS`; the device planner's is "sim"), ``cut``:
    how a sequence of ``n`` blocks is cut at C (:data:`CUTS`; default "chunk" with "sim" and
    "tail", else "equal"): the others are kept to rebuild the plans that earlier records measured
    ("tail" with "chunk" from 7029e85 until the simulation, "pairs" with "equal" up to 698e143,
    "spread" with "equal" before a9dcb9b).

    Returns ``{"items": [(b, lo, hi, slot), ...] (max_items rows), "seqs": [(first_slot, n), ...],
    "item_blocks": C, "max_slots": ..., "slots_used": ...}`` — bit-for-bit the tensors the device
    planner writes (a forced C may need more items or slots than the buffers hold: then the
    items are not padded and ``slots_used`` exceeds ``max_slots``).
    """
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}")
    cut = ("chunk" if ranking in ("sim", "tail") else "equal") if cut is None else cut
    if cut not in CUTS:
        raise ValueError(f"cut must be one of {', '.join(CUTS)}, got {cut!r}")
    batch = len(lengths)
    slots, max_items, max_slots = plan_capacity(batch, rows, sms, cdiv(capacity, PLAN_BLOCK), gated=gated)
    blocks = seq_blocks(lengths, capacity)
    top = max(blocks, default=0)
    comb = combine_units(rows, k)
    best = None
    if ranking == "sim" and batch:
        est, c_len = item_cut.best_cut(blocks, slots, cdiv(rows, ROW_TILE), sms, comb, max_items, max_slots)
        best = (est, c_len) if est != BIG else None
    elif ranking != "sim":
        for c_len in _candidates(blocks, slots):
            est = _estimate(blocks, c_len, slots, comb, max_items, max_slots, ranking, cut) if batch else 0
            if est is not None and (best is None or est < best[0] or (est == best[0] and c_len > best[1])):
                best = (est, c_len)
    c_len = best[1] if best else min(max(top, MIN_ITEM_BLOCKS), MAX_ITEM_BLOCKS)
    if item_blocks is not None:
        if not MIN_ITEM_BLOCKS <= item_blocks <= MAX_ITEM_BLOCKS:
            raise ValueError(f"item_blocks must lie in [{MIN_ITEM_BLOCKS}, {MAX_ITEM_BLOCKS}], got {item_blocks}")
        c_len = item_blocks
    counts = [max(1, cdiv(n, c_len)) for n in blocks]
    longest = max((cdiv(n, c) for n, c in zip(blocks, counts)), default=0)
    items: list[tuple[int, int, int, int]] = []
    seqs: list[tuple[int, int]] = [(-1, 0)] * batch
    next_slot = 0
    first: list[int] = [-1] * batch
    if cut == "chunk":          # split slots in batch order (the device planner's); "equal": in item order
        for b, c in enumerate(counts):
            first[b] = next_slot if c > 1 else -1
            next_slot += c if c > 1 else 0
            seqs[b] = (first[b], c)
    if cut == "equal" or sum(counts) <= slots:      # a chunk cut of one wave is cut near-equal
        for cls in reversed(range(SIZE_CLASSES)):
            for b, (n, c) in enumerate(zip(blocks, counts)):
                if _size_class(cdiv(n, c), longest) != cls:
                    continue
                if cut == "equal":
                    first[b] = next_slot if c > 1 else -1
                    next_slot += c if c > 1 else 0
                    seqs[b] = (first[b], c)
                base, rem = divmod(n, c)
                for j in range(c):
                    lo = j * base + min(j, rem)
                    items.append((b, lo, lo + base + (1 if j < rem else 0), first[b] + j if c > 1 else -1))
    else:
        longest = max((min(n, c_len) for n in blocks), default=0)
        for b, (n, c) in enumerate(zip(blocks, counts)):
            items += [(b, j * c_len, min(n, (j + 1) * c_len), first[b] + j if c > 1 else -1) for j in range(c)]
        items.sort(key=lambda it: -_size_class(it[2] - it[1], longest))
    items += [(-1, -1, -1, -1)] * (max_items - len(items))
    return {"items": items, "seqs": seqs, "item_blocks": c_len, "max_slots": max_slots, "slots_used": next_slot,
            "estimate": best[0] if best else BIG}


def packed_reference(lengths: list[int], rows: int, *, capacity: int, k: int = 512, sms: int = 132,
                     overhead: int | None = None) -> dict:
    """The packed plan of :func:`plan_decode` (``packed=True``), computed in Python from host
    lengths (the test oracle of the device planner; see the module docstring). ``overhead``
    lays it out with that many blocks per sequence instead of ``PACK_OVERHEAD`` (for A/Bs of it).

    Returns ``{"items": [(b, lo, hi, slot), ...] (max_items rows), "seqs": [(first_slot, n), ...],
    "starts": [programs + 1 item indices], "width": W (units per program), "max_slots": ...,
    "estimate": its time in 1/256 block-times (as the item plan's)}``.
    """
    batch = len(lengths)
    ov = PACK_OVERHEAD if overhead is None else overhead
    slots, programs, max_items, max_slots = packed_capacity(batch, rows, sms, cdiv(capacity, PLAN_BLOCK), ov)
    blocks = seq_blocks(lengths, capacity)
    items, seqs, first_program, width, pos, next_slot = item_cut.packed_layout(blocks, slots, ov)
    starts = item_cut.packed_starts(seqs, first_program, programs)
    items += [(-1, -1, -1, -1)] * (max_items - len(items))
    return {"items": items, "seqs": seqs, "starts": starts, "width": width, "max_slots": max_slots,
            "estimate": _packed_estimate(width, cdiv(cdiv(pos, width), slots), next_slot, combine_units(rows, k))}


def packs(ref_i: dict, ref_p: dict, slots: int) -> bool:
    """Whether the GPU packs a gated batch: the packed plan ``ref_p`` (:func:`packed_reference`)
    priced below the item plan ``ref_i`` (:func:`plan_reference`, ``gated=True``) on ``slots``
    SMs per row tile (:data:`PACKED_PRICE`, :data:`ITEM_PRICE`)."""
    return (kind_estimate(packed_makespan(ref_p["items"], ref_p["starts"], slots), PACKED_PRICE)
            < kind_estimate(item_makespan(ref_i["items"], slots), ITEM_PRICE))


def _packed_estimate(width: int, waves: int, n_split: int, comb: int) -> int:
    """A packed plan's time in units: its widest program (times the waves when the programs
    outnumber the slots: shares capped at ``MAX_ITEM_BLOCKS``) plus one piece's prologue, and
    the combine when anything is split. (The prologue is the item overhead of the rankings before
    "tail": this estimate only draws the threshold batches (``benchmarks/threshold_batches.json``, drawn by ``seesaw_ab.py`` at 1ac28a2), which
    keep their draws.)"""
    return waves * width * _UNIT + ITEM_OVERHEAD_BEFORE + (COMBINE_FIXED + n_split * comb if n_split else 0)


def packing_may_pay(batch: int, rows: int, sms: int) -> bool:
    """Whether :func:`plan_decode` considers a packed plan by default: when the batch's
    (sequence, row tile) pairs number at most ``PACKING_PAIRS_PER_SM`` x the SMs. Packing pays
    where one item per program leaves a tail (measured on an H200: 6-13 % at b = 32, 64, s = 1
    and b = 16, s = 2); with more pairs the item plan is cut finely enough, and the packed kernel,
    which costs 1.5-4.7 % when it runs an item plan (its loader warp), would only lose."""
    return item_cut.may_pack(batch, max(1, cdiv(rows, ROW_TILE)), sms)


def plan_buffers(batch: int, rows: int, sms: int, max_blocks: int, packed: bool | None):
    """``(packed, items, programs, max_slots)``: the plan kind :func:`plan_decode` builds for
    ``packed`` (None becomes False unless :func:`packing_may_pay`) and its buffers' sizes —
    for either plan when the GPU chooses (``packed`` None); ``programs`` None for one program
    per item."""
    if packed is None and not packing_may_pay(batch, rows, sms):
        packed = False
    _, max_items, max_slots = plan_capacity(batch, rows, sms, max_blocks, gated=packed is None)
    _, programs_p, max_items_p, max_slots_p = packed_capacity(batch, rows, sms, max_blocks)
    if packed is None:
        return None, max(max_items, max_items_p), max(max_items, programs_p), max(max_slots, max_slots_p)
    if packed:
        return True, max_items_p, programs_p, max_slots_p
    return False, max_items, None, max_slots


def auto_reference(lengths: list[int], rows: int, *, capacity: int, k: int = 512, sms: int = 132,
                   ranking: str = "sim", cut: str | None = None) -> dict:
    """The plan :func:`plan_decode` builds by default: the item plan (one program per item,
    ``starts`` None) unless :func:`packing_may_pay`; then the packed plan where :func:`packs`
    (priced below the item plan), else the item plan run one item per program (``starts[p] =
    min(p, items)``), in buffers sized for either. ``ranking``, ``cut``: the item cut's (see
    :func:`plan_reference`; others than the defaults rebuild the plans of earlier records).

    Returns ``{"items", "seqs", "starts", "packed": bool, "max_slots"}`` — bit-for-bit what the
    device planner writes."""
    batch = len(lengths)
    choice, size, programs, max_slots = plan_buffers(batch, rows, sms, cdiv(capacity, PLAN_BLOCK), None)
    ref_i = plan_reference(lengths, rows, capacity=capacity, k=k, sms=sms, gated=choice is None, ranking=ranking,
                           cut=cut)
    if choice is False:
        return {"items": ref_i["items"], "seqs": ref_i["seqs"], "starts": None, "packed": False,
                "max_slots": max_slots}
    ref_p = packed_reference(lengths, rows, capacity=capacity, k=k, sms=sms)
    packed = batch > 0 and packs(ref_i, ref_p, row_slots(rows, sms))
    if packed:
        items, seqs, starts = ref_p["items"], ref_p["seqs"], ref_p["starts"]
        starts = starts + [starts[-1]] * (programs + 1 - len(starts))
    else:
        items, seqs = ref_i["items"], ref_i["seqs"]
        live = sum(1 for it in items if it[0] >= 0)
        starts = [min(p, live) for p in range(programs + 1)]
    items = list(items) + [(-1, -1, -1, -1)] * (size - len(items))
    return {"items": items, "seqs": seqs, "starts": starts, "packed": packed, "max_slots": max_slots}


def _split_reference(batch: int, t: int, num_splits: int) -> dict:
    """Every sequence of ``t`` keys cut into ``num_splits`` near-equal items (fewer when there
    are fewer blocks; no empty item; more when an item would exceed ``MAX_ITEM_BLOCKS``)."""
    n = cdiv(max(0, t), PLAN_BLOCK)
    per = min(cdiv(n, max(1, num_splits)), MAX_ITEM_BLOCKS) if n else 1
    ns = max(1, cdiv(n, per))
    items = [(b, j * per, min(n, (j + 1) * per), b * ns + j if ns > 1 else -1)
             for b in range(batch) for j in range(ns)]
    seqs = [(b * ns if ns > 1 else -1, ns) for b in range(batch)]
    return {"items": items, "seqs": seqs, "item_blocks": per, "max_slots": batch * ns if ns > 1 else 1}


#: the host plans of uniform batches, per (batch, rows, blocks, k, sms, device): immutable device
#: tensors, kept for the process's life once made (a CUDA graph captured over a dense call reads
#: them; evicting one would free memory a graph still reads), at most :data:`MAX_UNIFORM_PLANS`
#: shapes; later shapes are planned at every call, never kept
_UNIFORM: dict[tuple, DecodePlan] = {}
MAX_UNIFORM_PLANS = 256


def uniform_reference(batch: int, rows: int, t: int, *, k: int = 512, sms: int = 132) -> dict:
    """The host plan of ``batch`` sequences of ``t`` keys, its kind fixed on the host (its call
    launches that kernel alone): the packed plan where
    :func:`mla_var3.analysis.item_cut.uniform_packs` (the kinds' prices, as the device planner
    chooses; the cost model reads the same choice), else the item plan (``starts`` None)."""
    lengths = [t] * batch
    if uniform_packed(batch, rows, t, k=k, sms=sms):
        return packed_reference(lengths, rows, capacity=t, k=k, sms=sms)
    return {**plan_reference(lengths, rows, capacity=t, k=k, sms=sms), "starts": None}


def uniform_packed(batch: int, rows: int, t: int, *, k: int = 512, sms: int = 132) -> bool:
    """The kind of :func:`uniform_reference`'s plan: packed where
    :func:`mla_var3.analysis.item_cut.uniform_packs` (a plan built on the device for the same
    uniform batch takes it too, so both run the same items in the same order)."""
    tiles = max(1, cdiv(rows, ROW_TILE))
    return item_cut.uniform_packs(batch, cdiv(max(0, t), PLAN_BLOCK), tiles, sms, combine_units(rows, k))


def _uniform_tensors(batch: int, rows: int, t: int, k: int, sms: int, device: torch.device) -> DecodePlan:
    return plan_tensors(uniform_reference(batch, rows, t, k=k, sms=sms), rows, t, device)


@functools.lru_cache(maxsize=64)
def _split_tensors(batch: int, rows: int, t: int, k: int, sms: int, device: torch.device,
                   num_splits: int) -> DecodePlan:
    """A forced split's plan (autotuning): evictable, as no capture reads it."""
    return plan_tensors(_split_reference(batch, t, num_splits), rows, t, device)


def plan_tensors(ref: dict, rows: int, capacity: int, device: torch.device | str) -> DecodePlan:
    """A host plan (the ``items`` / ``seqs`` of :func:`plan_reference`, or of a uniform split;
    with ``starts``, of :func:`packed_reference`) as a :class:`DecodePlan` on ``device`` whose kind
    the host fixed (one program per item, or the packed programs), its partial slots those the
    plan uses (a forced item length may use more than the buffers' ``max_slots``)."""
    batch = len(ref["seqs"])
    items = torch.tensor(ref["items"], dtype=torch.int32, device="cpu").reshape(-1, 4).to(device)
    seqs = torch.tensor(ref["seqs"], dtype=torch.int32, device="cpu").reshape(batch, 2).to(device)
    starts = ref.get("starts")
    if starts is not None:
        starts = torch.tensor(starts, dtype=torch.int32, device="cpu").to(device)
    return DecodePlan(items, seqs, batch, rows, cdiv(capacity, PLAN_BLOCK),
                      max(ref["max_slots"], ref.get("slots_used", 0)), any(n > 1 for _, n in ref["seqs"]),
                      starts=starts, packed_programs=0 if starts is None else len(ref["starts"]) - 1)


def _uniform_key(batch: int, rows: int, t: int, k: int, device, sms: int | None) -> tuple:
    device = torch.device(device)
    sms = sms if sms is not None else device_sms(device)
    # the plan depends on t only through its blocks: a decode step's growing cache (t, t + 1, ...)
    # reuses one plan per 64 keys instead of planning on the host at every step
    t_blocks = cdiv(max(int(t), 0), PLAN_BLOCK) * PLAN_BLOCK
    return (int(batch), int(rows), t_blocks, int(k), int(sms), device)


def uniform_plan(batch: int, rows: int, t: int, *, k: int = 512, device: torch.device | str = "cpu",
                 sms: int | None = None, num_splits: int | None = None) -> DecodePlan:
    """The plan for ``batch`` sequences of ``t`` keys each, built on the host once per shape and
    kept (a dense call without ``seqlens`` costs no planning launch). ``num_splits`` forces
    that many items per sequence instead of the planner's choice."""
    key = _uniform_key(batch, rows, t, k, device, sms)
    if num_splits is not None:
        return _split_tensors(*key, int(num_splits))
    plan = _UNIFORM.get(key)
    if plan is None:
        plan = _uniform_tensors(*key)
        if len(_UNIFORM) < MAX_UNIFORM_PLANS:
            _UNIFORM[key] = plan
    return plan


def kept_uniform_plan(batch: int, rows: int, t: int, *, k: int = 512, device: torch.device | str = "cpu",
                      sms: int | None = None) -> DecodePlan | None:
    """The plan :func:`uniform_plan` made and kept for this shape, or None; builds nothing (no
    host-to-device copy), so a CUDA-graph capture can take it: the graph then reads tensors that
    live as long as the process."""
    return _UNIFORM.get(_uniform_key(batch, rows, t, k, device, sms))


"""The decode plan: which program runs which key blocks of which sequence, computed on the GPU.

A decode call attends ``rows = h * s`` query rows of each of ``B`` sequences to that sequence's
``L_b`` keys. The absorbed kernels cut the rows into 64-row tiles and the keys into 64-key
blocks. A plan lists **work items** ``(b, blk_lo, blk_hi, slot)``: one program per (row tile,
item) attends the tile's rows of sequence ``b`` to key blocks ``[blk_lo, blk_hi)``. A sequence
whose keys are cut into several items (split-KV) sends each item's normalised output and LSE to
partial ``slot``; :func:`mla_var3.kernel.combine.combine_planned` merges them. An item with
``slot = -1`` covers its whole sequence and writes the final output directly. Items past the
plan's count hold ``b = -1``: their programs exit at once.

Why a plan: ragged batches (lengths from a few to many thousand keys) and small batches with
long contexts must fill all SMs; the host cannot read the lengths without a synchronisation,
which a CUDA graph forbids and which costs an eager call tens of microseconds. So the plan is
built on the device by Triton kernels (a program per candidate item length, then one program)
into tensors whose sizes depend only on what the host knows (``B``, ``rows``, the SM count): a
graph replays it with new lengths, and it is built once per decode step and reused by every layer
(``rows`` and the lengths are the layers' common data).

How items are cut (``C`` = item length in blocks, the one free choice):

* each sequence of ``n_b`` blocks is cut into ``c_b = max(1, ceil(n_b / C))`` items: where the
  cut's items fit one wave, near-equal ones (the longest item is the time); where they take more,
  ``n_b // C`` chunks of C blocks and a shorter remainder (:data:`CUTS`), so that remainders of
  every size fill the last wave from the SMs that free first (measured on an H200 against
  near-equal items of the planner's ranking before, same process: ragged b48 s1 t8192 10 %
  faster, b64 s1 t8192 10 %, b16 s2 t32768 3 %; ``seesaw/seesaw-tail-serving-7029e85.json``);
* every ``C`` from ``MIN_ITEM_BLOCKS`` to the longest sequence (within ``MAX_ITEM_BLOCKS``) is
  estimated, one program per ``C`` (``_cut_sim_kernel``), by a list-scheduling simulation of its
  items on the slots (``slots = SMs // row tiles`` items run at once; the SMs left over form one
  slower slot), in integer units of 1/256 block, each item costing its blocks +
  ``ITEM_OVERHEAD``, a cut of more than one wave ``LATE_WAVE`` more, plus the combine (a fixed
  cost and the fp32 partials written and read: ``rows * K * 8`` bytes per split item) when
  anything is split; cuts that need more items or slots than the buffers hold are excluded
  (:mod:`mla_var3.analysis.item_cut`, which the host reference calls). The closed forms before
  it ranked 32 candidates (``ceil(total / (k * slots))``, ``ceil(max_b n_b / j)`` and the
  one-wave cut; :data:`RANKINGS`), 2.6-3.3 % above the simulation's best cut on average where
  this is 0.6-0.8 %;
* the cheapest candidate wins (ties: the longer items); items are emitted longest first (a
  counting sort over sixteen size classes, sizes relative to the cut's longest item), because
  the GPU starts programs in grid order and a long item started last would end last. Classes
  relative to ``C`` instead (eight, before) left a cut whose items are all much shorter than
  ``C`` (sequences not split) in two or three classes, nearly in batch order: in the
  list-scheduling simulation, ragged b = 64, s = 2 (t <= 8,192) ran 4 % and b = 128, s = 1 3.6 %
  longer than with the present classes, and the H200 measured the same items 10 % slower in the
  coarser order (``serving/plan-sweep-ce7b97b.json``: b = 64, s = 2, C = 290 against 203).

**Packed plans** (``plan_decode(..., packed=True)``): one item per program leaves SMs idle on
ragged batches — a sequence cannot share a program with another, so the items never fill the
SMs evenly (measured on an H200: 144 programs of 11–21 blocks for 132 SMs at b = 32, s = 1).
A packed plan instead gives each of ``slots`` programs (per row tile) a contiguous range of the
batch's blocks laid end to end, as FlashMLA's scheduler does: sequence ``b`` costs ``n_b +
PACK_OVERHEAD`` units (its blocks and the prologue of a new sequence), program ``p`` takes units
``[p * W, (p + 1) * W)`` with ``W = ceil(total / slots)``, a boundary that falls inside a
sequence's overhead units moves to the sequence's start (so every piece holds a block), and each
(program, sequence) piece is an item. ``starts [programs + 1]`` says which items each program
runs (``starts[p] .. starts[p + 1]``, in order); a sequence in several pieces is split as above.

**Which kind** (``packed=None``, where :func:`packing_may_pay`): the GPU builds both plans and
prices each with its kind's measured time model (:class:`KindPrice`): the item plan's busiest SM
when its items start in plan order on the SM that frees first, the packed plan's widest program,
each item or piece costing its blocks plus a per-item and a per-split price. The cut's own
estimate above (the candidates' ranking) does not price the kinds against each other: as a
ratio with a threshold it picked the slower kind on 7 of 28 batches measured with both forced.

Example
-------
>>> plan = plan_decode(seqlens, rows=128 * 1, capacity=table.shape[1] * 64)   # doctest: +SKIP
>>> o, lse = flash_mla_paged(qc, qpe, cache, table, seqlens, scale=s, plan=plan)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mla_var3.analysis import item_cut
from mla_var3.analysis.item_cut import COMBINE_FIXED, ITEM_OVERHEAD, MAX_ITEM_BLOCKS, MIN_ITEM_BLOCKS
from mla_var3.analysis.item_cut import UNIT as _UNIT
from mla_var3.kernel._common import cdiv, interpreting, num_sms
from mla_var3.kernel._launch import CachedLaunch

__all__ = ["DecodePlan", "ITEM_PRICE", "KindPrice", "KindReadback", "MAX_ITEM_BLOCKS", "lengths_stamp", "PACKED_PRICE",
           "PACKING_PAIRS_PER_SM", "PACK_OVERHEAD", "PLAN_BLOCK", "RANKINGS", "auto_reference", "cut_candidates", "item_makespan",
           "kind_estimate", "one_wave_cut", "packed_capacity", "packed_makespan", "packed_reference",
           "packing_may_pay", "packs", "plan_capacity", "plan_decode", "plan_reference", "plan_tensors", "row_slots",
           "seq_blocks", "uniform_plan"]

#: keys per plan block: the absorbed kernels' key block, and FlashMLA's page size
PLAN_BLOCK = 64
#: rows per tile of the absorbed kernels (one wgmma M tile)
ROW_TILE = 64
#: the item overhead of the rankings before "tail" (to rebuild their plans)
_ITEM_OVERHEAD_BEFORE = 384
#: the "tail" ranking: a cut whose items take more than one wave costs three blocks more, in units (a
#: program started after the first wave exposes its prologue; measured on an H200, ragged b8 s1
#: t32768 cut in 67 chunk items on 66 slots ran 6.0 us (3.3 blocks) slower than its one-wave cut,
#: where the simulation put it 1 block faster, ``seesaw/seesaw-chunk-serving-698e143.json``)
_TAIL_LATE_WAVE = 768
#: the closed-form rankings' candidate item lengths
_NUM_CANDIDATES = 32
#: size classes of the items' order (a counting sort: one pass over the batch per class)
_SIZE_CLASSES = 16
_BIG = 9223372036854775807
#: how the item cut is chosen: "sim" (the device planner's), every item length ranked by a
#: list-scheduling simulation of its items on the slots (:mod:`mla_var3.analysis.item_cut`); the
#: others (kept to rebuild the plans earlier records measured) rank 32 candidates in closed form.
#: How those charge a second wave of items: "pairs" pairs
#: the ``slots``-th longest item with the next, as the SM that frees first takes the next item;
#: "spread" (before) added half a mean item to the load per slot, which ranked cuts whose second wave
#: is short items too dear (measured on an H200, ``seesaw/seesaw-pairs-seed{8,9}-1cff5c4.json``)
#: "tail" (the device planner's from the chunk cut to the simulation) is "pairs" with a cut of more
#: than two waves charged the load per slot plus its ``slots``-th *shortest* item, the size the SM that frees
#: last takes, not the (``slots`` + 1)-th longest (in the simulation, 2.97 % above the best cut
#: on average against 3.63 %, chunk cuts, 150 random batches)
RANKINGS = ("sim", "tail", "pairs", "spread")
#: how a sequence of n blocks is cut at the item length C: "chunk" (the device planner's), into
#: ``n // C`` items of exactly C blocks and a shorter remainder, each ordered by its own size, so
#: that the remainders of every size fill the last wave from the SMs that free first; "equal"
#: (before), into ``ceil(n / C)`` near-equal items. Measured on an H200 with C the simulation's
#: best for each, same batches and process: chunk 2-7 % faster on the serving rows that split and
#: 7 % slower on ragged b8 s1 t32768 (67 items on 66 slots against 66);
#: ``seesaw/seesaw-chunk-serving-698e143.json``
CUTS = ("chunk", "equal")
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
#: ``seesaw-threshold-seed8-36c56ba.json``; ``docs/kernels/flash-mla.md`` §8). ``benchmarks/fit_kind_prices.py``
#: computes them from those records. Calibrated only where the GPU chooses (:func:`packing_may_pay`; item
#: plans of at most two waves): a three-wave item plan (ragged b32 s4 t16384) is priced 34 % over its time.
ITEM_PRICE = KindPrice(fixed=1688, per_item=128, per_split=1408)
PACKED_PRICE = KindPrice(fixed=2424, per_item=640, per_split=768, block_pct=101)
#: :func:`packing_may_pay`'s limit, (sequence, row tile) pairs per SM. Measured on an H200 beyond
#: it: ragged b = 32, s = 4, t <= 16,384 (256 pairs) ran 2.5 % faster packed, where the estimate
#: (0.860 of the item plan's) would pick packing; uniform s >= 8 tied
#: (``docs/kernels/flash-mla.md`` §8) — a wider limit is the next A/B (``seesaw_ab.py --plans wide``)
PACKING_PAIRS_PER_SM = 1.5


@dataclass(frozen=True)
class DecodePlan:
    """A work list for one decode step (see the module docstring).

    items : [max_items, 4] int32 on the device: ``(b, blk_lo, blk_hi, slot)``; ``b = -1`` past
        the plan's items; blocks are ``PLAN_BLOCK`` keys.
    seqs : [B, 2] int32 on the device: ``(first_slot, n_items)`` per sequence; ``first_slot = -1``
        when the sequence is one item (written directly, not combined).
    batch, rows : the ``B`` and ``h * s`` the plan was built for.
    max_blocks : the longest sequence (in blocks) the plan's buffers were sized for.
    max_slots : partial outputs the plan may use (``[max_slots, rows, K]`` fp32 + LSE).
    may_split : False when the host knows no sequence is split (no combine needed).
    starts : [programs + 1] int32 on the device for a packed plan (program ``p`` runs items
        ``starts[p] .. starts[p + 1]`` in order), None for one program per item.
    packed : [1] int64 on the device when the GPU chose between the packed and the item plan
        (``plan_decode(..., packed=None)`` where :func:`packing_may_pay`): 1 when it packed, 0
        when it kept the item plan; None when the kind was fixed on the host. The sm_90 kernel
        runs such a plan with both of its kernels, each exiting at once unless the plan is its
        kind (the host cannot read the choice without a synchronisation), or, in an eager call
        once the choice's copy has landed on the host (``kind_readback``), with the chosen one.
    packed_programs : programs per row tile a packed plan uses (the packed kernel's grid when
        ``packed`` is set; ``starts`` is longer, for the item plan run one item per program).
    kind_readback : the GPU's choice on its way to the host (:class:`KindReadback`), for a plan
        whose kind the GPU chose eagerly on CUDA; None otherwise. Once it has arrived, an eager
        call launches the chosen kind's kernel alone (:meth:`known_kind`).
    lengths : the stamp of the lengths the plan was built from (:func:`lengths_stamp`; None for
        a uniform batch): a run over other lengths must not use it.
    """

    items: torch.Tensor
    seqs: torch.Tensor
    batch: int
    rows: int
    max_blocks: int
    max_slots: int
    may_split: bool = True
    starts: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    packed_programs: int = 0
    kind_readback: "KindReadback | None" = None
    lengths: tuple | None = None

    @property
    def max_items(self) -> int:
        return self.items.shape[0]

    @property
    def programs(self) -> int:
        """Programs per row tile the kernel launches: one per item, or a packed plan's count."""
        return self.items.shape[0] if self.starts is None else self.starts.shape[0] - 1

    def known_kind(self) -> bool | None:
        """The kind the GPU chose for this plan where the host already has it without waiting
        (True: packed), else None: a plan whose kind the host fixed, a choice still on its way,
        or a CUDA-graph capture (a graph replays the plan with other lengths, so a captured call
        must leave the choice to the GPU)."""
        rb = self.kind_readback
        if rb is None:
            return None
        kind = rb.get()
        if kind is None or (self.items.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return None
        return kind

    def check_for(self, batch: int, rows: int, max_blocks: int, device: torch.device) -> None:
        """Raise ValueError unless the plan was built for ``batch`` sequences of ``rows`` rows,
        sequences of up to ``max_blocks`` blocks, on ``device`` (a plan is reused by every layer
        of one decode step, never across shapes)."""
        if (self.batch, self.rows) != (batch, rows):
            raise ValueError(f"plan was built for (batch, rows = h*s) = ({self.batch}, {self.rows}), "
                             f"called with ({batch}, {rows}); build a plan per decode step and shape")
        if max_blocks > self.max_blocks:
            raise ValueError(f"plan was built for sequences of up to {self.max_blocks * PLAN_BLOCK} keys, the cache "
                             f"holds up to {max_blocks * PLAN_BLOCK}; pass capacity= to plan_decode")
        if self.items.device != device:
            raise ValueError(f"plan is on {self.items.device}, the inputs on {device}")


class KindReadback:
    """A plan's kind as the GPU chose it (``DecodePlan.packed``), copied to pinned host memory
    behind the planner without a synchronisation: :meth:`get` gives it once the copy has landed
    (its event has completed), None before, and never waits.

    Why: the GPU's choice costs a plan whose kind it chose both kernels, the item kernel first
    and the packed kernel as its programmatic dependent, each exiting unless the plan is its kind
    (about 2 us of a packed call's GPU time, and a launch of host time, measured on an H200). A
    decode step builds its plan once and calls it once per layer; by the time the host issues
    the layers the planner has usually run, and an eager call can then launch the chosen kernel
    alone. The choice itself is unchanged: the host copy is the device flag's value. CUDA-graph
    captures never use it (:meth:`DecodePlan.known_kind`).

    ``host``: a [1] int64 CPU tensor (pinned) the copy lands in; ``event``: completes when it has
    landed (anything with ``query() -> bool``)."""

    __slots__ = ("host", "event", "value")

    def __init__(self, host: torch.Tensor, event) -> None:
        self.host, self.event, self.value = host, event, None

    @classmethod
    def start(cls, flag: torch.Tensor) -> "KindReadback":
        """Queue the copy of ``flag`` ([1] int64 on a CUDA device) on the current stream."""
        host = torch.empty(1, dtype=torch.int64, device="cpu", pin_memory=True)
        host.copy_(flag, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(host, event)

    def get(self) -> bool | None:
        """True (packed) / False (item plan) once the copy has landed, None before."""
        if self.value is None:
            if not self.event.query():
                return None
            self.value, self.event = bool(self.host[0]), None
        return self.value


def lengths_stamp(seqlens: torch.Tensor | None) -> tuple | None:
    """What identifies the lengths a plan is built from, without a host synchronisation: on the
    CPU their values; on a device the tensor's address and version counter (bumped by every
    in-place write), or its address alone for an inference tensor (which counts no versions).
    None for a uniform batch (no lengths)."""
    if seqlens is None:
        return None
    if seqlens.device.type == "cpu":
        return ("values", tuple(seqlens.tolist()))
    try:
        version = seqlens._version
    except RuntimeError:                 # created under torch.inference_mode(): no version counter
        version = None
    return (seqlens.data_ptr(), tuple(seqlens.shape), version)


def row_slots(rows: int, sms: int) -> int:
    """Programs that run at once per row tile: one per SM and 64-row tile of ``rows`` query rows."""
    return max(1, sms // max(1, cdiv(rows, ROW_TILE)))


def plan_capacity(batch: int, rows: int, sms: int, max_blocks: int, *, gated: bool = False) -> tuple[int, int, int]:
    """``(slots, max_items, max_slots)`` for a batch of sequences of up to ``max_blocks``
    blocks: ``slots`` items run at once (one program per SM and row tile); the buffers hold
    ``2 * slots`` items and partial outputs beyond one item per sequence (the cheapest plan never
    needs more in the simulation; candidates that would are excluded), plus what cutting every
    sequence at ``MAX_ITEM_BLOCKS`` needs, so that cut always fits.

    ``gated``: the item plan of a batch whose plan kind the GPU chooses (``packed=None`` where
    :func:`packing_may_pay`). Its items are then capped at ``max(batch * pieces, 2 * slots)``
    instead of their sum: the sm_90 item kernel is launched with one program per item slot even
    when the GPU packs, and its empty programs run in waves of one per SM (their shared memory),
    so the cap takes a wave off a gated call at b = 32-64, s = 1. In a simulation of 464 random
    gated batches (b = 1-128, s = 1-4, t up to 32k, uniform, ragged and skewed lengths) the cap
    changed the item plan only where the planner packs anyway (23 batches, its estimate 0.5-5.4 %
    higher), so no item plan the GPU runs changes."""
    slots = row_slots(rows, sms)
    items, max_slots = item_cut.plan_buffers(batch, slots, max_blocks)
    if gated:
        pieces = max(1, cdiv(max_blocks, MAX_ITEM_BLOCKS))
        items = max(batch * pieces, 2 * slots)
    return slots, items, max_slots


def packed_capacity(batch: int, rows: int, sms: int, max_blocks: int,
                    overhead: int | None = None) -> tuple[int, int, int, int]:
    """``(slots, programs, max_items, max_slots)`` of a packed plan: ``slots`` programs run at
    once (one per SM and row tile) and share the batch's blocks; more programs only when a share
    would exceed ``MAX_ITEM_BLOCKS`` (the kernel keeps an item's pages in shared memory). Each
    program boundary cuts at most one sequence, so items number at most ``programs + batch`` and
    split items at most ``2 * programs``. ``overhead``: the layout's blocks per sequence
    (default ``PACK_OVERHEAD``)."""
    slots = row_slots(rows, sms)
    ov = PACK_OVERHEAD if overhead is None else overhead
    programs = max(slots, cdiv(batch * (max_blocks + ov), MAX_ITEM_BLOCKS))
    return slots, programs, programs + batch, 2 * programs


_combine_units = item_cut.combine_units


# ---------------------------------------------------------------------------------------------
# the reference planner (pure Python): uniform plans on the host, and the oracle of the tests


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
    cands += [cdiv(top, j) for j in range(1, _NUM_CANDIDATES - 8)]   # j = 1: no split
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
    ov = ITEM_OVERHEAD if ranking == "tail" else _ITEM_OVERHEAD_BEFORE
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
            est = max(est, waves + (_TAIL_LATE_WAVE if ranking == "tail" else 0))
    if n_split:
        est += COMBINE_FIXED + n_split * comb
    return est


def _size_class(size: int, longest: int) -> int:
    """The order class of an item of ``size`` blocks in a cut whose longest item is ``longest``
    (the highest class is emitted first)."""
    return min(_SIZE_CLASSES - 1, (size * _SIZE_CLASSES) // (longest + 1))


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
    comb = _combine_units(rows, k)
    best = None
    if ranking == "sim" and batch:
        est, c_len = item_cut.best_cut(blocks, slots, cdiv(rows, ROW_TILE), sms, comb, max_items, max_slots)
        best = (est, c_len) if est != _BIG else None
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
        for cls in reversed(range(_SIZE_CLASSES)):
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
            "estimate": best[0] if best else _BIG}


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
    width = min(max(cdiv(sum(blocks) + ov * batch, slots), ov + 1), MAX_ITEM_BLOCKS)
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
    starts = [sum(min(max(p - p0, 0), c) for p0, (_, c) in zip(first_program, seqs)) for p in range(programs + 1)]
    items += [(-1, -1, -1, -1)] * (max_items - len(items))
    return {"items": items, "seqs": seqs, "starts": starts, "width": width, "max_slots": max_slots,
            "estimate": _packed_estimate(width, cdiv(cdiv(pos, width), slots), next_slot, _combine_units(rows, k))}


def _item_cost(item: tuple, price: KindPrice) -> int:
    """One item's (or packed piece's) price in units: its blocks, ``per_item``, ``per_split`` if split."""
    return (item[2] - item[1]) * _UNIT + price.per_item + (price.per_split if item[3] >= 0 else 0)


def item_makespan(items: list, slots: int, price: KindPrice = ITEM_PRICE) -> int:
    """The busiest SM's work (units) when the live ``items`` (plan order) run one per program on
    ``slots`` SMs, each started on the SM that frees first: in closed form, as the device planner
    computes it. One wave: the longest item. Two: each of the second wave's items (longest first)
    joins a first-wave item (shortest first), the sum bounded by the mean load plus the second
    wave's longest item (short items stack on one SM); more: that bound."""
    c = [_item_cost(it, price) for it in items if it[0] >= 0]
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
    widths = [sum(_item_cost(items[i], price) for i in range(starts[p], starts[p + 1])) for p in range(len(starts) - 1)]
    used = sum(1 for p in range(len(starts) - 1) if starts[p + 1] > starts[p])
    return max(widths, default=0) * max(1, cdiv(used, slots))


def kind_estimate(makespan: int, price: KindPrice) -> int:
    """A plan kind's time in units: ``price.fixed + price.block_pct / 100 * makespan``."""
    return price.fixed + price.block_pct * makespan // 100


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
    "tail": this estimate only draws the threshold batches of ``benchmarks/seesaw_ab.py``, which
    keep their draws.)"""
    return waves * width * _UNIT + _ITEM_OVERHEAD_BEFORE + (COMBINE_FIXED + n_split * comb if n_split else 0)


def packing_may_pay(batch: int, rows: int, sms: int) -> bool:
    """Whether :func:`plan_decode` considers a packed plan by default: when the batch's
    (sequence, row tile) pairs number at most ``PACKING_PAIRS_PER_SM`` x the SMs. Packing pays
    where one item per program leaves a tail (measured on an H200: 6-13 % at b = 32, 64, s = 1
    and b = 16, s = 2); with more pairs the item plan is cut finely enough, and the packed kernel,
    which costs 1.5-4.7 % when it runs an item plan (its loader warp), would only lose."""
    return batch * max(1, cdiv(rows, ROW_TILE)) <= PACKING_PAIRS_PER_SM * sms


def _plan_buffers(batch: int, rows: int, sms: int, max_blocks: int, packed: bool | None):
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
    choice, size, programs, max_slots = _plan_buffers(batch, rows, sms, cdiv(capacity, PLAN_BLOCK), None)
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


@functools.lru_cache(maxsize=256)
def _uniform_tensors(batch: int, rows: int, t: int, k: int, sms: int, num_splits: int | None,
                     device: torch.device) -> DecodePlan:
    if num_splits is None:
        ref = plan_reference([t] * batch, rows, capacity=t, k=k, sms=sms)
    else:
        ref = _split_reference(batch, t, num_splits)
    return plan_tensors(ref, rows, t, device)


def plan_tensors(ref: dict, rows: int, capacity: int, device: torch.device | str) -> DecodePlan:
    """A host plan (the ``items`` / ``seqs`` of :func:`plan_reference`, or of a uniform split) as
    a one-program-per-item :class:`DecodePlan` on ``device``, its partial slots those the plan
    uses (a forced item length may use more than the buffers' ``max_slots``)."""
    batch = len(ref["seqs"])
    items = torch.tensor(ref["items"], dtype=torch.int32, device="cpu").reshape(-1, 4).to(device)
    seqs = torch.tensor(ref["seqs"], dtype=torch.int32, device="cpu").reshape(batch, 2).to(device)
    return DecodePlan(items, seqs, batch, rows, cdiv(capacity, PLAN_BLOCK),
                      max(ref["max_slots"], ref.get("slots_used", 0)), any(n > 1 for _, n in ref["seqs"]))


def uniform_plan(batch: int, rows: int, t: int, *, k: int = 512, device: torch.device | str = "cpu",
                 sms: int | None = None, num_splits: int | None = None) -> DecodePlan:
    """The plan for ``batch`` sequences of ``t`` keys each, built on the host once per shape and
    cached (a dense call without ``seqlens`` costs no planning launch). ``num_splits`` forces
    that many items per sequence instead of the planner's choice."""
    device = torch.device(device)
    sms = sms if sms is not None else _device_sms(device)
    ns = None if num_splits is None else int(num_splits)
    # the plan depends on t only through its blocks: a decode step's growing cache (t, t + 1, ...)
    # reuses one plan per 64 keys instead of planning on the host at every step
    t_blocks = cdiv(max(int(t), 0), PLAN_BLOCK) * PLAN_BLOCK
    return _uniform_tensors(int(batch), int(rows), t_blocks, int(k), int(sms), ns, device)


def _device_sms(device: torch.device) -> int:
    return num_sms(device.index) if device.type == "cuda" else 132


# ---------------------------------------------------------------------------------------------
# the device planner


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


_cut_sim_launch = CachedLaunch(_cut_sim_kernel)


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
    # ---- pass 4: every item finds its sequence (the last start at or before it) and its range
    carry = 0
    for i0 in range(0, MAX_ITEMS, BLOCK_I):
        idx = i0 + ii
        in_plan = idx < next_item
        mark = tl.load(items_ptr + idx * 4, mask=idx < MAX_ITEMS, other=-1)
        start = tl.maximum(tl.associative_scan(tl.where(mark >= 0, idx, -1), 0, _max_combine), carry)
        carry = tl.max(start, 0)
        part = tl.load(items_ptr + start * 4, mask=in_plan, other=-2)
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
        tl.store(items_ptr + idx * 4, tl.where(in_plan, b, -1), mask=live)
        tl.store(items_ptr + idx * 4 + 1, tl.where(in_plan, lo, -1), mask=live)
        tl.store(items_ptr + idx * 4 + 2, tl.where(in_plan, hi, -1), mask=live)
        tl.store(items_ptr + idx * 4 + 3, tl.where(in_plan, slot, -1), mask=live)


_plan_launch = CachedLaunch(_plan_kernel)


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


_packed_launch = CachedLaunch(_packed_kernel)


def _seq_block(batch: int, block: int) -> int:
    """Sequences per pass of the planners: the batch's own power of two up to ``block`` (a
    [candidates x sequences] pass over 256 lanes for 32 sequences is mostly masked work), so a
    batch of up to ``block`` sequences sits in one pass."""
    return min(block, max(16, triton.next_power_of_2(batch)))


def plan_constexprs(has_seqlens: bool, block: int, write_est: bool, block_b: int | None = None) -> dict:
    """The compile-time constants :func:`build_plan` launches ``_plan_kernel`` with: ``block``
    items per pass, ``block_b`` (default ``block``) sequences per pass."""
    return dict(HAS_SEQLENS=has_seqlens, BLOCK=PLAN_BLOCK, MIN_C=MIN_ITEM_BLOCKS, MAX_C=MAX_ITEM_BLOCKS,
                NCLS=_SIZE_CLASSES, BLOCK_B=block_b or block, BLOCK_I=block, WRITE_EST=write_est)


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


def plan_decode(seqlens: torch.Tensor | None, rows: int, *, capacity: int, k: int = 512, batch: int | None = None,
                sms: int | None = None, packed: bool | None = None, readback: bool = True) -> DecodePlan:
    """Build the decode plan on ``seqlens``' device, without a host synchronisation.

    Parameters
    ----------
    seqlens : [B] int32, keys per sequence (0 allowed), or None for ``batch`` sequences of
        ``capacity`` keys
    rows : int          query rows per sequence, ``h * s``
    capacity : int      the most keys a sequence may hold (``max_blocks * page_block_size`` of a
        paged cache, ``T`` of a dense one): sizes the plan's buffers; longer lengths are clamped
    k : int             the latent width (prices the combine's partial outputs)
    sms : int, optional SMs to fill (default: the device's)
    packed : bool, optional  True: a packed plan (each program runs a range of the batch's
        blocks; see the module docstring); False: one program per item; None (default): when
        :func:`packing_may_pay` (host-known sizes), the packed plan where :func:`packs` (priced
        below the item plan on the GPU), else the item plan run one item per program
        (two planning launches, no host synchronisation); otherwise one program per item
    readback : bool     where the GPU chooses the kind, on CUDA outside a graph capture, also
        copy the choice to the host behind the planner (:class:`KindReadback`; no
        synchronisation): for a plan reused by several calls (a decode step's layers), whose
        eager calls then launch one kernel instead of both once it has landed

    Returns a :class:`DecodePlan`: two launches (the cuts' estimates, then the plan; one more for
    a packed or gated plan); its tensors are fresh allocations (inside a CUDA graph, the graph's
    pool), so a captured plan is rebuilt on replay.
    """
    if seqlens is not None:
        if not isinstance(seqlens, torch.Tensor) or seqlens.dim() != 1:
            raise ValueError(f"seqlens must be a [B] tensor, got {type(seqlens).__name__}"
                             f"{list(seqlens.shape) if isinstance(seqlens, torch.Tensor) else ''}")
        if seqlens.dtype != torch.int32:
            raise ValueError(f"seqlens must be int32, got {str(seqlens.dtype).replace('torch.', '')}")
        batch, device = seqlens.shape[0], seqlens.device
    else:
        if batch is None:
            raise ValueError("plan_decode needs seqlens, or batch (sequences of capacity keys)")
        device = torch.device("cpu")
    rows, capacity = int(rows), int(capacity)
    if rows < 1:
        raise ValueError(f"rows (h * s) must be >= 1, got {rows}")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0 keys, got {capacity}")
    return build_plan(seqlens, batch, rows, capacity, k=k, sms=sms, device=device, packed=packed,
                      readback=readback, source=seqlens)


def build_plan(seqlens: torch.Tensor | None, batch: int, rows: int, capacity: int, *, k: int, device: torch.device,
               sms: int | None = None, packed: bool | None = None, readback: bool = False,
               source: torch.Tensor | None = None) -> DecodePlan:
    """:func:`plan_decode` without its checks: ``seqlens`` a [batch] int32 tensor or None;
    ``source``: the caller's lengths tensor ``seqlens`` was converted from (its stamp is the
    plan's :attr:`DecodePlan.lengths`; default ``seqlens``)."""
    sms = sms if sms is not None else _device_sms(device)
    max_blocks = cdiv(capacity, PLAN_BLOCK)
    packed, size, programs, slots_all = _plan_buffers(batch, rows, sms, max_blocks, packed)
    slots, max_items, max_slots = plan_capacity(batch, rows, sms, max_blocks, gated=packed is None)
    slots_p, programs_p = packed_capacity(batch, rows, sms, max_blocks)[:2]
    items = torch.empty((size, 4), dtype=torch.int32, device=device)
    seqs = torch.empty((batch, 2), dtype=torch.int32, device=device)
    starts = None if programs is None else torch.empty((programs + 1,), dtype=torch.int32, device=device)
    stamp = lengths_stamp(source if source is not None else seqlens)
    if not batch:
        items.fill_(-1)
        if starts is not None:
            starts.zero_()
        return DecodePlan(items, seqs, batch, rows, max_blocks, slots_all, starts=starts, lengths=stamp)
    dummy = seqlens if seqlens is not None else seqs
    align = dummy.data_ptr() % 16
    block = 128 if interpreting() else 256
    block_b = _seq_block(batch, block)
    comb = _combine_units(rows, k)
    est = torch.empty((2,), dtype=torch.int64, device=device) if packed is None else items
    if not packed:
        ncand = cut_count(max_blocks)
        cest = torch.empty((ncand,), dtype=torch.int64, device=device)
        tiles = cdiv(rows, ROW_TILE)
        ints = (batch, capacity, slots, tiles, max(0, sms - slots * tiles), max_items, max_slots, comb)
        _cut_sim_launch((seqlens is not None, ints, align), (ncand, 1, 1), (dummy, cest, *ints),
                        cut_sim_constexprs(seqlens is not None, slots), num_warps=1)
        ints = (batch, capacity, slots, max_items, ncand)
        _plan_launch((seqlens is not None, ints, align, packed is None, block_b), (1, 1, 1),
                     (dummy, cest, items, seqs, est, *ints),
                     plan_constexprs(seqlens is not None, block, packed is None, block_b), num_warps=4)
    if packed is None or packed:
        ints = (batch, capacity, slots_p, programs, size)
        _packed_launch((seqlens is not None, ints, align, packed is None, block_b), (1, 1, 1),
                       (dummy, items, seqs, starts, est, *ints),
                       packed_constexprs(seqlens is not None, block, packed is None, slots_p, block_b),
                       num_warps=4)
    kind_readback = None
    if packed is None and readback and device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        kind_readback = KindReadback.start(est[1:])
    return DecodePlan(items, seqs, batch, rows, max_blocks, slots_all, starts=starts,
                      packed=est[1:] if packed is None else None, packed_programs=programs_p,
                      kind_readback=kind_readback, lengths=stamp)


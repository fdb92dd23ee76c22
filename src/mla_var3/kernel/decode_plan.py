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

The module is the planner's entry (:func:`plan_decode`, :func:`build_plan`) and its public API;
the types live in :mod:`~mla_var3.kernel.plan_types`, the reference planner in
:mod:`~mla_var3.kernel.plan_reference`, the kernels in :mod:`~mla_var3.kernel.plan_kernels`.

Example
-------
>>> plan = plan_decode(seqlens, rows=128 * 1, capacity=table.shape[1] * 64)   # doctest: +SKIP
>>> o, lse = flash_mla_paged(qc, qpe, cache, table, seqlens, scale=s, plan=plan)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from mla_var3.kernel._common import cdiv, interpreting
from mla_var3.kernel.plan_kernels import (
    CUT_SIM_LAUNCH, PACKED_LAUNCH, PLAN_LAUNCH, seq_block, cut_count, cut_sim_constexprs, packed_constexprs,
    plan_constexprs,
)
from mla_var3.kernel.plan_reference import (  # noqa: F401  (the reference planner, re-exported)
    plan_buffers, auto_reference, cut_candidates, item_makespan, kind_estimate, one_wave_cut, packed_makespan,
    kept_uniform_plan, packed_reference, packing_may_pay, packs, plan_reference, plan_tensors, seq_blocks,
    uniform_packed, uniform_plan,
)
from mla_var3.kernel.plan_types import (  # noqa: F401  (the plan's types, re-exported)
    ITEM_PRICE, MAX_ITEM_BLOCKS, PACK_OVERHEAD, PACKED_PRICE, PACKING_PAIRS_PER_SM, PLAN_BLOCK, RANKINGS, ROW_TILE,
    DecodePlan, KindPrice, KindReadback, combine_units, device_sms, lengths_stamp, packed_capacity, plan_capacity,
    row_slots,
)

__all__ = ["DecodePlan", "ITEM_PRICE", "KindPrice", "KindReadback", "MAX_ITEM_BLOCKS", "PACKED_PRICE",
           "PACKING_PAIRS_PER_SM", "PACK_OVERHEAD", "PLAN_BLOCK", "RANKINGS", "auto_reference", "build_plan",
           "cut_candidates", "item_makespan", "kind_estimate", "lengths_stamp", "one_wave_cut", "packed_capacity",
           "packed_makespan", "packed_reference", "packing_may_pay", "packs", "plan_capacity", "plan_decode",
           "plan_reference", "plan_tensors", "row_slots", "seq_blocks", "uniform_packed", "uniform_plan",
           "kept_uniform_plan"]



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
    plan's :attr:`DecodePlan.lengths`; default ``seqlens``).

    The plan's buffers are views of one allocation, each at a 16-byte boundary as a tensor of its
    own would be (the kernels are specialised on their pointers' alignment), and what the shape
    fixes (sizes, integer arguments, constexprs) is :func:`plan_layout`'s: a call with lengths
    costs one allocation and its launches."""
    sms = sms if sms is not None else device_sms(device)
    has = seqlens is not None
    lay = plan_layout(batch, rows, capacity, k, sms, packed, has, seqlens.data_ptr() % 16 if has else 0,
                      interpreting())
    buf = torch.empty((lay.words,), dtype=torch.int32, device=device)
    items = buf.as_strided((lay.size, 4), (4, 1), lay.items)
    seqs = buf.as_strided((batch, 2), (2, 1), lay.seqs)
    starts = None if lay.programs is None else buf.as_strided((lay.programs + 1,), (1,), lay.starts)
    stamp = lengths_stamp(source if source is not None else seqlens)
    if not batch:
        items.fill_(-1)
        if starts is not None:
            starts.zero_()
        return DecodePlan(items, seqs, batch, rows, lay.max_blocks, lay.max_slots, starts=starts, lengths=stamp)
    wide = buf.view(torch.int64)                   # the int64 estimates (at even int32 offsets)
    est = items if lay.est is None else wide.as_strided((2,), (1,), lay.est // 2)
    cest = None if lay.cest is None else wide.as_strided((lay.ncand,), (1,), lay.cest // 2)
    tensors = {"seqlens": seqlens if has else seqs, "cest": cest, "items": items, "seqs": seqs, "starts": starts,
               "est": est}
    for launch, key, grid, ints, names, consts, warps in lay.launches:
        launch(key, grid, (*(tensors[n] for n in names), *ints), consts, num_warps=warps)
    kind_readback = None
    if lay.packed is None and readback and device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        kind_readback = KindReadback.start(est[1:])
    return DecodePlan(items, seqs, batch, rows, lay.max_blocks, lay.max_slots, starts=starts,
                      packed=est[1:] if lay.packed is None else None, packed_programs=lay.programs_p,
                      kind_readback=kind_readback, lengths=stamp)


@dataclass(frozen=True)
class PlanLayout:
    """What a plan's shape fixes (:func:`plan_layout`): its kind (``packed``: None where the GPU
    chooses), sizes, the int32 offsets of its buffers in one allocation of ``words`` (``est``,
    ``cest``: the int64 estimates', None where not written) and its launches, each ``(launcher,
    key, grid, integer arguments, names of the tensor arguments, constexprs, warps)``."""

    packed: bool | None
    size: int
    programs: int | None
    programs_p: int
    max_blocks: int
    max_slots: int
    ncand: int
    words: int
    items: int
    seqs: int
    starts: int | None
    est: int | None
    cest: int | None
    launches: tuple


@functools.lru_cache(maxsize=256)
def plan_layout(batch: int, rows: int, capacity: int, k: int, sms: int, packed: bool | None, has_seqlens: bool,
                align: int, interpret: bool) -> PlanLayout:
    """The :class:`PlanLayout` of a plan of ``batch`` sequences of ``rows`` query rows and up to
    ``capacity`` keys on ``sms`` SMs (``packed`` as :func:`plan_decode` takes it; ``align``: the
    lengths' address modulo 16; ``interpret``: under Triton's interpreter). A pure function of
    its arguments, kept per shape like a compile cache."""
    max_blocks = cdiv(capacity, PLAN_BLOCK)
    packed, size, programs, slots_all = plan_buffers(batch, rows, sms, max_blocks, packed)
    slots, max_items, max_slots = plan_capacity(batch, rows, sms, max_blocks, gated=packed is None)
    slots_p, programs_p = packed_capacity(batch, rows, sms, max_blocks)[:2]
    ncand = cut_count(max_blocks)
    words = 0

    def part(n: int | None) -> int | None:       # n int32 words at the next 16-byte boundary
        nonlocal words
        if n is None:
            return None
        at, words = words, words + cdiv(n, 4) * 4
        return at

    offsets = dict(items=part(4 * size), seqs=part(2 * batch), starts=part(None if programs is None else programs + 1),
                   est=part(4 if packed is None else None), cest=part(None if packed else 2 * ncand))
    block = 128 if interpret else 256
    block_b = seq_block(batch, block)
    launches = []
    if not packed:
        tiles = cdiv(rows, ROW_TILE)
        ints = (batch, capacity, slots, tiles, max(0, sms - slots * tiles), max_items, max_slots,
                combine_units(rows, k))
        launches.append((CUT_SIM_LAUNCH, (has_seqlens, ints, align), (ncand, 1, 1), ints, ("seqlens", "cest"),
                         cut_sim_constexprs(has_seqlens, slots), 1))
        ints = (batch, capacity, slots, max_items, ncand)
        launches.append((PLAN_LAUNCH, (has_seqlens, ints, align, packed is None, block_b), (1, 1, 1), ints,
                         ("seqlens", "cest", "items", "seqs", "est"),
                         plan_constexprs(has_seqlens, block, packed is None, block_b), 4))
    if packed is None or packed:
        ints = (batch, capacity, slots_p, programs, size)
        launches.append((PACKED_LAUNCH, (has_seqlens, ints, align, packed is None, block_b), (1, 1, 1), ints,
                         ("seqlens", "items", "seqs", "starts", "est"),
                         packed_constexprs(has_seqlens, block, packed is None, slots_p, block_b), 4))
    return PlanLayout(packed, size, programs, programs_p, max_blocks, slots_all, ncand, max(words, 4), **offsets,
                      launches=tuple(launches))

"""The decode plan's types and sizes: a plan's work list (:class:`DecodePlan`), the kinds' measured
prices (:class:`KindPrice`), the GPU's kind choice on its way to the host (:class:`KindReadback`),
the stamp of the lengths a plan was built from, and the buffers' capacities. What a plan is and
how it is cut: :mod:`mla_var3.kernel.decode_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mla_var3.analysis import item_cut
# the kinds' prices and the packed layout's overhead live with the item cut (the cost model reads
# them too); re-exported here with the plan's other types
from mla_var3.analysis.item_cut import (  # noqa: F401
    ITEM_PRICE, MAX_ITEM_BLOCKS, PACK_OVERHEAD, PACKED_PRICE, PACKING_PAIRS_PER_SM, KindPrice,
)
from mla_var3.kernel._common import cdiv, num_sms

#: keys per plan block: the absorbed kernels' key block, and FlashMLA's page size
PLAN_BLOCK = 64
#: rows per tile of the absorbed kernels (one wgmma M tile)
ROW_TILE = 64
#: the item overhead of the rankings before "tail" (to rebuild their plans)
ITEM_OVERHEAD_BEFORE = 384
#: the "tail" ranking: a cut whose items take more than one wave costs three blocks more, in units (a
#: program started after the first wave exposes its prologue; measured on an H200, ragged b8 s1
#: t32768 cut in 67 chunk items on 66 slots ran 6.0 us (3.3 blocks) slower than its one-wave cut,
#: where the simulation put it 1 block faster, ``seesaw/seesaw-chunk-serving-698e143.json``)
TAIL_LATE_WAVE = 768
#: the closed-form rankings' candidate item lengths
NUM_CANDIDATES = 32
#: size classes of the items' order (a counting sort: one pass over the batch per class)
SIZE_CLASSES = 16
BIG = 9223372036854775807
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


combine_units = item_cut.combine_units


def device_sms(device: torch.device) -> int:
    return num_sms(device.index) if device.type == "cuda" else 132


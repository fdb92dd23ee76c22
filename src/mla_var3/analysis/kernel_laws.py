"""Time laws of the default kernels: roofline terms times measured efficiencies plus fixed costs.

The ideal roofline (:mod:`mla_var3.analysis.roofline`) assumes every kernel runs at the device's
ceilings. The laws here describe how the project's kernels spend GPU time, in the few quantities
a kernel engineer names: how full the MMA tiles are, how many waves of programs run over the SMs,
what fraction of one SM's share of the compute ceiling a full tile step reaches, how much of the
DRAM time hides under compute, what split-KV and its combine cost, and the fixed cost of a
launch. Each law takes the shapes, a :class:`Machine` (SM count and the two ceilings) and a
mapping of its parameters (names and meanings in :data:`SPECS`; values and their sources live in
a calibration file, :mod:`mla_var3.analysis.calibration`) and returns a :class:`Breakdown` of
named terms in seconds.

The launch geometry (tiles, split-KV counts) mirrors the launchers' analytic defaults in
``mla_var3.kernel`` without importing them (this layer needs no torch); each mirror names its
original, and ``tests/test_calibration.py`` compares them where torch is installed.

Laws:

* :func:`latent_tiles` — absorbed attention over the latent cache, one program per
  (sequence, row tile, key range): ``waves x (steps x t_step + program_us)`` against the DRAM
  time, overlapped by ``memory_overlap``, plus the split-KV combine and ``fixed_us``. Used by the
  absorbed kernels (Gluon seesaw, portable) and by the hybrid's latent part.
* :func:`expanded_tiles` — expanded attention, one program per (sequence, head, query block):
  the padded, causally visible FLOPs at ``compute_efficiency`` against the key/value stream at
  ``bandwidth_efficiency`` of the copy rate.
* :func:`hybrid` — the hybrid (``mla_var6_plus``): latent part, expanded (window) part, merge; ``part_overlap`` of the
  shorter part hides under the longer. Its breakdown states the resource law: SM-time per latent
  key and per window key, the merge and the overlap.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field
from typing import Callable, Mapping

from mla_var3.analysis import item_cut
from mla_var3.analysis.item_cut import ITEM_PRICE, PACKED_PRICE
from mla_var3.analysis.cost import ACC_BYTES, flash_attention, flash_attention_shared_kpe, flash_mla
from mla_var3.shapes import MLADims, Problem

US = 1e-6


@dataclass(frozen=True)
class Machine:
    """What a law needs of a device: SMs and the two ceilings its efficiencies are fractions of."""

    sms: int
    flops_per_s: float
    bytes_per_s: float


@dataclass
class Breakdown:
    """Named time terms (seconds) of one kernel call, its GPU time, and launch facts (``info``)."""

    gpu_s: float
    terms: dict[str, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    """One parameter of a law: its name within the law, unit, meaning, prior value and bounds.

    ``group`` is ``"gpu"`` (fitted from GPU times: CUDA-graph replays) or ``"host"`` (fitted
    from eager and host times, re-fittable alone). ``fit=False`` holds the prior: the committed
    data cannot identify it (``why`` says so). ``optional``: a calibration file written before
    the parameter existed still holds the law, and predicts with its prior.
    """

    name: str
    unit: str
    meaning: str
    prior: float
    lo: float
    hi: float
    group: str = "gpu"
    fit: bool = True
    why: str = ""
    optional: bool = False


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def overlapped(a: float, b: float, overlap: float) -> float:
    """Two costs of which ``overlap`` (0..1) of the shorter one hides under the longer."""
    return max(a, b) + (1.0 - overlap) * min(a, b)


# ----------------------------------------------------------------------------------------------
# launch geometry: mirrors of the launchers' defaults
# ----------------------------------------------------------------------------------------------

#: row tile and key block of the sm_90 absorbed kernels (``kernel.hopper.absorbed_gluon``).
GLUON_LATENT_BLOCK_M = GLUON_LATENT_BLOCK_N = 64
#: the expanded design runs the Gluon kernel on sm_90 for s > this (``kernel.expanded.GLUON_MIN_S``).
GLUON_EXPANDED_MIN_S = 64
#: row tile of the Gluon expanded kernel (two 64-row consumer warpgroups).
GLUON_EXPANDED_BLOCK_M = 128
#: programs of the portable expanded kernel's default configs that fit on one sm_90 SM, by row
#: tile (registers and shared memory of the sm_90 build, ``tests/test_kernel_compile.py``: m16
#: 104 registers and 48 KiB -> 4; m32 168 and 56 KiB -> 3; m64 193 and 104 KiB -> 2; m128, eight
#: warps, 192 and 168 KiB -> 1).
PORTABLE_EXPANDED_PROGRAMS_PER_SM = {16: 4, 32: 3, 64: 2, 128: 1}
#: the sm_90 hybrid partitions its SMs between the window and the latent part up to this s, and
#: runs the two parts on two streams above it (``kernel.hopper.hybrid_hopper.PARTITION_MAX_S``).
HYBRID_PARTITION_MAX_S = 32


#: :func:`gluon_latent_splits`: batches whose items at the item limit take more waves are not cut further
UNSPLIT_WAVES = 16


def gluon_latent_splits(b: int, rows: int, t: int, sms: int, k: int = 512) -> int:
    """Items per sequence of the sm_90 absorbed kernel's dense call: ``kernel.decode_plan.uniform_plan
    (b, rows, t).seqs[:, 1]`` (``plan_reference`` for b sequences of t keys). The planner tries
    every item length C and keeps the one its list-scheduling estimate prices lowest
    (:func:`mla_var3.analysis.item_cut.best_cut`, the function the planner's reference calls).
    Beyond ``UNSPLIT_WAVES`` waves of items cut at the item limit it never cuts a sequence further
    (a tail under a sixteenth of the time against a combine and an overhead per item; checked
    for t up to 320k keys), which this returns without the simulation (its steps grow with the
    items)."""
    return uniform_schedule(b, cdiv(t, GLUON_LATENT_BLOCK_N), rows, sms, k).max_pieces


@dataclass(frozen=True)
class ItemSchedule:
    """The decode plan's items of one call on the SMs (:func:`item_schedule`).

    ``loads``: the distinct (key blocks, items) the SMs run: an SM's time is ``blocks x one
    block-step + items x the per-item cost``. ``items``: all items; ``split_seqs`` /
    ``split_items``: the sequences cut into more than one item and their items (partials for the
    combine); ``max_pieces``: the most items of one sequence. ``packed``: a packed plan (its
    ``loads`` the programs', its items the programs' pieces; :func:`packed_schedule`)."""

    loads: tuple[tuple[int, int], ...]
    items: int
    split_seqs: int
    split_items: int
    max_pieces: int
    packed: bool = False
    programs: int = 0


#: :func:`item_schedule` places programs one by one up to this many; beyond, whole waves of the
#: longest item (the error is under one wave of many)
SIMULATED_PROGRAMS = 1 << 15


@functools.lru_cache(maxsize=4096)
def item_schedule(blocks: tuple[int, ...], rows: int, sms: int, k: int = 512) -> ItemSchedule:
    """Where the sm_90 absorbed kernel's work goes: the planner's cut of each sequence of
    ``blocks[i]`` key blocks (:func:`mla_var3.analysis.item_cut.best_cut`, the function the
    planner calls; a cut that fits one wave is near-equal, else chunks of C blocks and a
    remainder, chunks first, then the rest longest first), then one program per (item, 64-row
    tile) in that order, row tile fastest, each started on the SM that frees first (the GPU's
    in-order dispatch; the planner's item overhead sets the placement). Beyond ``UNSPLIT_WAVES``
    waves of items at the item limit the cut is C = the item limit (the planner never cuts finer
    there; no ranking run)."""
    n = [max(0, int(x)) for x in blocks]
    tiles = max(1, cdiv(rows, GLUON_LATENT_BLOCK_M))
    slots = max(1, sms // tiles)
    top = max(n, default=0)
    if top == 0:
        return ItemSchedule(((0, 0),), 0, 0, 0, 1)
    if sum(max(1, cdiv(x, item_cut.MAX_ITEM_BLOCKS)) for x in n) > UNSPLIT_WAVES * slots:
        c = min(top, item_cut.MAX_ITEM_BLOCKS)
    else:
        max_items, max_slots = item_cut.plan_buffers(len(n), slots, top)
        c = item_cut.best_cut(n, slots, tiles, sms, item_cut.combine_units(rows, k), max_items, max_slots)[1]
    counts = [max(1, cdiv(x, c)) for x in n]
    split = [cnt for cnt in counts if cnt > 1]
    tail = (sum(counts), len(split), sum(split), max(counts))
    if sum(counts) * tiles > SIMULATED_PROGRAMS:
        return _waves(sum(counts) * tiles, min(top, c), sms, tail)
    if sum(counts) <= slots:                       # one wave: near-equal items
        sizes = sorted((x // cnt + (j < x % cnt) for x, cnt in zip(n, counts) for j in range(cnt)), reverse=True)
    else:                                          # the chunks, then the rest, longest first per sort block
        sizes = [c] * sum(x // c for x, cnt in zip(n, counts) if cnt > 1)
        for b0 in range(0, len(n), item_cut.SORT_BLOCK):
            part = zip(n[b0:b0 + item_cut.SORT_BLOCK], counts[b0:b0 + item_cut.SORT_BLOCK])
            sizes += sorted((x % c if cnt > 1 else x for x, cnt in part if cnt == 1 or x % c), reverse=True)
    free = [(0, i) for i in range(sms)]            # (finish, in the planner's units; SM)
    load = [[0, 0] for _ in range(sms)]
    for size in sizes:
        d = size * item_cut.UNIT + item_cut.ITEM_OVERHEAD
        for _ in range(tiles):
            f, i = free[0]
            heapq.heapreplace(free, (f + d, i))
            load[i][0] += size
            load[i][1] += 1
    return ItemSchedule(tuple(sorted({(a, b) for a, b in load})), *tail)


def packed_schedule(blocks: tuple[int, ...], slots: int) -> ItemSchedule:
    """A packed plan's programs (:func:`mla_var3.analysis.item_cut.packed_layout`), each run by one
    SM per row tile: ``loads`` the distinct (key blocks, pieces) per program, times the waves when
    the programs outnumber the slots."""
    pieces, seqs, first, _, _, split_items = item_cut.packed_layout(list(blocks), slots)
    programs = max(slots, cdiv(sum(blocks) + item_cut.PACK_OVERHEAD * len(blocks), item_cut.MAX_ITEM_BLOCKS))
    starts = item_cut.packed_starts(seqs, first, programs)
    loads = [(sum(pieces[i][2] - pieces[i][1] for i in range(a, z)), z - a) for a, z in zip(starts, starts[1:]) if z > a]
    waves = max(1, cdiv(len(loads), slots))
    split = [c for _, c in seqs if c > 1]
    return ItemSchedule(tuple(sorted({(x * waves, y * waves) for x, y in loads})), len(pieces), len(split),
                        split_items, max((c for _, c in seqs), default=1), packed=True, programs=len(loads))


def _waves(programs: int, longest: int, sms: int, tail: tuple) -> ItemSchedule:
    """Whole waves of the longest item: the schedule of very many programs."""
    per_sm = cdiv(programs, sms)
    return ItemSchedule(((per_sm * longest, per_sm),), *tail)


@functools.lru_cache(maxsize=4096)
def uniform_schedule(b: int, n: int, rows: int, sms: int, k: int = 512) -> ItemSchedule:
    """The schedule of ``b`` sequences of ``n`` key blocks each: the packed plan's
    (:func:`packed_schedule`) where the host plan packs them (:func:`mla_var3.analysis.item_cut.uniform_packs`),
    else :func:`item_schedule`'s, without listing them when the batch alone takes more than
    ``UNSPLIT_WAVES`` waves (any b: the cut is then the item limit,
    the programs whole waves when they are more than :data:`SIMULATED_PROGRAMS`)."""
    tiles = max(1, cdiv(rows, GLUON_LATENT_BLOCK_M))
    slots = max(1, sms // tiles)
    pieces = max(1, cdiv(n, item_cut.MAX_ITEM_BLOCKS))
    if n > 0 and b * pieces > UNSPLIT_WAVES * slots and b * pieces * tiles > SIMULATED_PROGRAMS:
        tail = (b * pieces, b if pieces > 1 else 0, b * pieces if pieces > 1 else 0, pieces)
        return _waves(b * pieces * tiles, min(n, item_cut.MAX_ITEM_BLOCKS), sms, tail)
    if item_cut.uniform_packs(b, n, tiles, sms, item_cut.combine_units(rows, k)):
        return packed_schedule((n,) * b, slots)
    return item_schedule((n,) * b, rows, sms, k)


def portable_latent_config(b: int, rows: int, t: int, k: int, sms: int) -> tuple[int, int, int]:
    """``kernel.absorbed.default_config``: (block_m, block_n, splits) of the portable absorbed kernel."""
    block_m = min(64, max(16, next_pow2(rows)))
    block_n = 32 if block_m * k >= 64 * 512 else 64
    programs = b * cdiv(rows, block_m)
    splits = 1 if programs >= sms else max(1, min(sms // programs, t // (block_n * 2), 64))
    return block_m, block_n, splits


def expanded_splits(programs: int, t: int, block_n: int, sms: int) -> int:
    """``kernel.expanded._splits_for``: about two waves, each split at least 4 key blocks long."""
    if programs >= sms:
        return 1
    return max(1, min(cdiv(2 * sms, programs), t // (4 * block_n), 64))


def hybrid_latent_config(b: int, h: int, s: int, o: int, k: int, sms: int) -> tuple[int, int, int, int]:
    """``kernel.hybrid.default_config``'s latent part: (block_h, block_s, block_n, splits) — 32
    rows of heads x queries per program (64 when k <= 256), 32-key blocks."""
    rows = 32 if k > 256 else 64
    block_s = min(next_pow2(s), rows)
    block_h = min(next_pow2(h), max(1, rows // block_s))
    block_s = max(block_s, 16 // block_h)
    programs = b * cdiv(h, block_h) * cdiv(s, block_s)
    return block_h, block_s, 32, expanded_splits(programs, o, 32, sms)


def portable_expanded_config(b: int, h: int, s: int, t: int, sms: int) -> tuple[int, int]:
    """``kernel.expanded.default_config`` for d + p <= 256 (64-key blocks): (block_m, splits) —
    16- to 64-row tiles up to s = 128, 128-row tiles above."""
    block_m = 128 if s > 128 else min(64, max(16, next_pow2(s)))
    return block_m, expanded_splits(b * h * cdiv(s, block_m), t, 64, sms)


# ----------------------------------------------------------------------------------------------
# laws
# ----------------------------------------------------------------------------------------------

def combine_time(rows: int, width: int, splits: int, w: int, m: Machine, us_per_split: float) -> float:
    """Split-KV combine: ``us_per_split`` per partial (the combine walks a row's partials one
    after the other) plus reading the fp32 partials and writing the output at the copy rate."""
    if splits <= 1:
        return 0.0
    nbytes = ACC_BYTES * splits * rows * (width + 1) + w * rows * width
    return splits * us_per_split * US + nbytes / m.bytes_per_s


def latent_tiles(dims: MLADims, pb: Problem, m: Machine, p: Mapping[str, float], *, tile_rows: int,
                 tiles_per_seq: int, block_n: int, splits: int, causal_skip: bool = False) -> Breakdown:
    """Absorbed attention over ``pb.t`` latent keys, one program per (sequence, row tile, key range).

    A full tile step (``tile_rows`` query rows x ``block_n`` keys: 2·rows·keys·(2k + p) FLOPs)
    takes ``t_step`` = its FLOPs at ``compute_efficiency`` of one SM's share of the compute
    ceiling; a padded row costs as much as a full one (the tile fill at small h·s). A program runs
    its steps plus ``program_us``; ``waves`` = ⌈programs / SMs⌉ run one after another. The DRAM
    time of the cost model's bytes (plus the fp32 split partials) overlaps the compute by
    ``memory_overlap``; a split call adds the combine (``combine_us_per_split``); ``fixed_us`` is
    the launch and drain. ``causal_skip``: blocks past the tile's last visible key are skipped.
    """
    b, t, k, pp, w = pb.b, pb.t, dims.k, dims.p, dims.w
    nblk = cdiv(t, block_n)
    steps = cdiv(nblk, splits)
    if causal_skip and pb.causal and pb.s > 1:
        steps = max(1, cdiv(cdiv(t - pb.s // 2, block_n), splits))
    programs = b * tiles_per_seq * splits
    waves = cdiv(programs, m.sms)
    t_step = 2 * tile_rows * block_n * (2 * k + pp) / (p["compute_efficiency"] * m.flops_per_s / m.sms)
    compute = waves * (steps * t_step + p["program_us"] * US)
    rows = dims.h * pb.s
    nbytes = flash_mla(dims, Problem(b=b, s=pb.s, t=t)).bytes
    if splits > 1:
        nbytes += ACC_BYTES * splits * b * rows * (k + 1)
    memory = nbytes / m.bytes_per_s
    kernel = overlapped(compute, memory, p["memory_overlap"])
    combine = combine_time(b * rows, k, splits, w, m, p["combine_us_per_split"])
    fixed = p["fixed_us"] * US
    terms = {"compute_s": compute, "memory_s": memory, "kernel_s": kernel, "combine_s": combine, "fixed_s": fixed}
    info = {"programs": programs, "waves": waves, "splits": splits, "steps_per_program": steps,
            "tile_fill": rows / (tiles_per_seq * tile_rows), "t_step_s": t_step}
    return Breakdown(fixed + kernel + combine, terms, info)


def latent_items(dims: MLADims, pb: Problem, m: Machine, p: Mapping[str, float],
                 lengths: tuple[int, ...] | None = None) -> Breakdown:
    """The sm_90 absorbed kernel over its decode plan: one program per (item, 64-row tile), the
    items on the SMs as the planner schedules them (:func:`item_schedule`).

    A full 64 x 64 tile step takes ``t_step`` (its FLOPs at ``compute_efficiency`` of one SM's
    share of the compute ceiling; a padded row costs as much as a full one); an item adds
    ``program_us``; the compute time is the busiest SM's, ``blocks x t_step + items x
    program_us`` — not whole waves: the planner cuts the sequences so that the last wave's items
    are short. The DRAM time of the bytes (queries and outputs, every key's latent and RoPE key
    once, the split items' fp32 partials) overlaps the compute by ``memory_overlap``; the combine
    walks a split row's partials (``combine_us_per_split`` each) and moves them; ``fixed_us`` is
    the launch and drain. No causal block skipping (the kernel visits every key block).
    ``lengths``: keys per sequence (ragged; default ``pb.t`` each)."""
    k, pp, w = dims.k, dims.p, dims.w
    rows = dims.h * pb.s
    tiles = max(1, cdiv(rows, GLUON_LATENT_BLOCK_M))
    if lengths is None:
        sched = uniform_schedule(pb.b, cdiv(pb.t, GLUON_LATENT_BLOCK_N), rows, m.sms, k)
        batch, keys = pb.b, pb.b * pb.t
    else:
        sched = item_schedule(tuple(cdiv(int(x), GLUON_LATENT_BLOCK_N) for x in lengths), rows, m.sms, k)
        batch, keys = len(lengths), sum(int(x) for x in lengths)
    t_step = 2 * GLUON_LATENT_BLOCK_M * GLUON_LATENT_BLOCK_N * (2 * k + pp) / (
        p["compute_efficiency"] * m.flops_per_s / m.sms)
    if sched.packed:        # a piece costs its blocks at the packed kernel's rate, plus what it costs more than an item
        per_piece = p["program_us"] * US + (PACKED_PRICE.per_item - ITEM_PRICE.per_item) / item_cut.UNIT * t_step
        compute = max(blocks * t_step * PACKED_PRICE.block_pct / 100 + items * per_piece for blocks, items in sched.loads)
    else:
        compute = max(blocks * t_step + items * p["program_us"] * US for blocks, items in sched.loads)
    partials = ACC_BYTES * sched.split_items * rows * (k + 1)
    nbytes = w * (batch * rows * (2 * k + pp) + keys * (k + pp)) + partials
    memory = nbytes / m.bytes_per_s
    kernel = overlapped(compute, memory, p["memory_overlap"])
    combine = 0.0
    if sched.split_seqs:
        combine = (sched.max_pieces * p["combine_us_per_split"] * US
                   + (partials + w * sched.split_seqs * rows * k) / m.bytes_per_s)
    fixed = p["fixed_us"] * US
    terms = {"compute_s": compute, "memory_s": memory, "kernel_s": kernel, "combine_s": combine, "fixed_s": fixed}
    busiest = max(sched.loads, key=lambda x: x[0] * t_step + x[1] * p["program_us"] * US)
    programs = (sched.programs if sched.packed else sched.items) * tiles
    info = {"packed": int(sched.packed), "programs": programs, "waves": cdiv(programs, m.sms), "splits": sched.max_pieces,
            "items": sched.items, "busiest_sm_blocks": busiest[0], "busiest_sm_items": busiest[1],
            "tile_fill": rows / (tiles * GLUON_LATENT_BLOCK_M), "t_step_s": t_step}
    return Breakdown(fixed + kernel + combine, terms, info)


def _visible_rows_keys(s: int, t: int, block_m: int, causal: bool) -> int:
    """Σ over the query blocks of one (sequence, head) of block_m x the keys the block visits
    (causal: up to the last visible key of its last row, t - s + min(s, (j + 1)·block_m))."""
    blocks = cdiv(s, block_m)
    if not causal:
        return blocks * block_m * t
    # blocks j < blocks - 1 end inside the queries ((j + 1)·block_m < s), the last at s: the sum
    # Σ_j (t - s + (j + 1)·block_m) over the first blocks - 1, plus t for the last, in closed form
    # (a per-block loop never returns at the sizes the CLI accepts, s up to 2**53)
    return block_m * (blocks * (t - s) + block_m * (blocks - 1) * blocks // 2 + s)


def expanded_tiles(dims: MLADims, pb: Problem, m: Machine, p: Mapping[str, float], *, block_m: int, splits: int,
                   family: str = "", seed_bytes: bool = False, programs_per_sm: int = 0) -> Breakdown:
    """Expanded attention, one program per (sequence, head, query block).

    FLOPs of the padded query blocks over the keys each visits (causal blocks stop at their last
    visible key) at ``compute_efficiency`` of the compute ceiling, quantised to whole waves over
    the SMs; the cost model's bytes (K, V per head and the RoPE key once per token; per head with
    ``seed_bytes``, the seed's count) at ``bandwidth_efficiency`` of the copy rate (a streaming
    read can beat a copy, which also writes); the two overlap by ``memory_overlap``. ``family``
    suffixes the efficiency names where one kernel's tile families differ.

    Where the parameters hold ``program_gbs<family>`` (one program's stream rate) and
    ``programs_per_sm`` is given, the stream runs in waves of SMs x ``programs_per_sm`` programs
    (:func:`stream_waves`): a last wave of few programs pulls less than the copy rate (the
    ``tail_s`` term).
    """
    b, h, s, t = pb.b, dims.h, pb.s, pb.t
    rows_keys = _visible_rows_keys(s, t, block_m, pb.causal)
    flops = 2 * b * h * rows_keys * (dims.d + dims.p + dims.dv)
    programs = b * h * cdiv(s, block_m) * splits
    slots = m.sms * programs_per_sm
    quant = cdiv(programs, m.sms) / (programs / m.sms)
    compute = quant * flops / (p[f"compute_efficiency{family}"] * m.flops_per_s)
    nbytes = (flash_attention if seed_bytes else flash_attention_shared_kpe)(dims, pb).bytes
    if splits > 1:
        nbytes += ACC_BYTES * splits * b * h * s * (dims.dv + 1)
    stream = p[f"bandwidth_efficiency{family}"] * m.bytes_per_s
    memory, tail_s = nbytes / stream, 0.0
    rate = p.get(f"program_gbs{family}")
    if rate and slots:
        memory = stream_waves(nbytes, programs, slots, stream, rate * 1e9)
        tail_s = memory - nbytes / stream
    kernel = overlapped(compute, memory, p["memory_overlap"])
    combine = combine_time(b * h * s, dims.dv, splits, dims.w, m, p.get("combine_us_per_split", 0.0))
    fixed = p["fixed_us"] * US
    terms = {"compute_s": compute, "memory_s": memory, "tail_s": tail_s, "kernel_s": kernel, "combine_s": combine,
             "fixed_s": fixed}
    info = {"programs": programs, "waves": cdiv(programs, m.sms), "splits": splits, "block_m": block_m,
            "tile_fill": s / (cdiv(s, block_m) * block_m), "slots": slots}
    return Breakdown(fixed + kernel + combine, terms, info)


def stream_waves(nbytes: float, programs: int, slots: int, stream_bps: float, program_bps: float) -> float:
    """DRAM time of ``programs`` equal programs streaming ``nbytes`` together, ``slots`` at a time.

    A wave of ``k`` programs pulls ``min(k * program_bps, stream_bps)``: the whole waves run at
    the stream rate wherever ``slots`` programs can pull it, and a last, partial wave of few
    programs runs at what those few pull (each program reads its keys one block after the other,
    with the few loads its pipeline keeps in flight). ``program_bps``: one program's rate.
    """
    per = nbytes / programs
    full, tail = divmod(programs, slots)

    def wave(k: int) -> float:
        return k * per / min(k * program_bps, stream_bps)

    return full * wave(slots) + (wave(tail) if tail else 0.0)


def hybrid(dims: MLADims, pb: Problem, m: Machine, p: Mapping[str, float],
           latent_law: Callable[[Problem], Breakdown], window_law: Callable[[Problem], Breakdown],
           absorbed_law: Callable[[Problem], Breakdown] | None = None) -> Breakdown:
    """The hybrid with o = t - n latent keys and n window keys: the latent part (``latent_law`` over
    the o old keys; causal into them only when n < s), the window part (``window_law`` over the
    n newest keys), ``part_overlap`` of the shorter part hidden under the longer (0 = one after
    the other), then the merge (``merge_us`` plus its bytes: fp32 partials in, both outputs out).
    With o = 0 or n = 0 one part runs and the other output is zero-filled. ``fixed_us`` is the
    call's own cost beyond its parts. The breakdown states the resource law: SM-time per latent
    key and per window key.

    ``absorbed_law``: the kernel a call with n = 0 runs instead of the latent part (the default
    call with no window *is* the absorbed design, ``kernel.hybrid``): its time plus the zero
    fill of the expanded output, no ``fixed_us``."""
    b, h, s, t = pb.b, dims.h, pb.s, pb.t
    n = pb.n or 0
    o = t - n
    if n == 0 and absorbed_law is not None:
        latent = absorbed_law(Problem(b=b, s=s, t=t, causal=pb.causal))
        zero = dims.w * b * h * s * dims.dv / m.bytes_per_s
        terms = {"latent_s": latent.gpu_s, "window_s": 0.0, "parts_s": latent.gpu_s, "merge_s": 0.0,
                 "zero_fill_s": zero, "fixed_s": 0.0}
        info = {"o": o, "n": 0, "part_overlap": p["part_overlap"], "absorbed": True,
                "sm_us_per_latent_key": m.sms * latent.gpu_s / t / US, "sm_us_per_window_key": None,
                "latent": latent.info, "window": None}
        return Breakdown(latent.gpu_s + zero, terms, info)
    # o < s (a window longer than t - s): counted as s latent keys, the least a Problem allows
    latent = latent_law(Problem(b=b, s=s, t=max(o, s), causal=pb.causal and n < s)) if o > 0 else None
    window = window_law(Problem(b=b, s=min(s, n), t=n, causal=pb.causal)) if n > 0 else None
    lat_s = latent.gpu_s if latent else 0.0
    win_s = window.gpu_s if window else 0.0
    parts = overlapped(lat_s, win_s, p["part_overlap"])
    terms = {"latent_s": lat_s, "window_s": win_s, "parts_s": parts, "merge_s": 0.0, "zero_fill_s": 0.0,
             "fixed_s": p["fixed_us"] * US}
    if latent and window:
        merge_bytes = b * h * s * (ACC_BYTES * (dims.dv + dims.k + 2) + dims.w * (dims.dv + dims.k))
        terms["merge_s"] = p["merge_us"] * US + merge_bytes / m.bytes_per_s
    else:
        terms["zero_fill_s"] = dims.w * b * h * s * (dims.dv if window is None else dims.k) / m.bytes_per_s
    gpu = parts + terms["merge_s"] + terms["zero_fill_s"] + terms["fixed_s"]
    info = {"o": o, "n": n, "part_overlap": p["part_overlap"],
            "sm_us_per_latent_key": m.sms * lat_s / o / US if o else None,
            "sm_us_per_window_key": m.sms * win_s / n / US if n else None,
            "latent": latent.info if latent else None, "window": window.info if window else None}
    return Breakdown(gpu, terms, info)


# ----------------------------------------------------------------------------------------------
# the kernels: (design, backend) -> law and parameters
# ----------------------------------------------------------------------------------------------

Params = Mapping[str, float]


def flash_mla_gluon(dims: MLADims, pb: Problem, m: Machine, p: Params,
                    lengths: tuple[int, ...] | None = None) -> Breakdown:
    """The sm_90 absorbed kernel (seesaw): 64-row tiles of the h·s rows of a sequence, 64-key
    steps, the keys cut into the decode plan's items and scheduled as the planner does
    (:func:`latent_items`); visits every key block (no causal skip). ``lengths``: a ragged batch's
    keys per sequence (its item plan; a batch the GPU packs runs another kernel, not modelled)."""
    return latent_items(dims, pb, m, p, lengths)


def flash_mla_portable(dims: MLADims, pb: Problem, m: Machine, p: Params) -> Breakdown:
    """The portable absorbed kernel: 64-row tiles (fewer rows: the next power of two), 32-key steps."""
    rows = dims.h * pb.s
    block_m, block_n, splits = portable_latent_config(pb.b, rows, pb.t, dims.k, m.sms)
    return latent_tiles(dims, pb, m, p, tile_rows=block_m, tiles_per_seq=cdiv(rows, block_m), block_n=block_n,
                        splits=splits, causal_skip=True)


def flash_attention_portable(dims: MLADims, pb: Problem, m: Machine, p: Params, *, seed_bytes: bool = False) -> Breakdown:
    """The portable expanded kernel with its default tiles: family ``m16`` (s <= 16; its compute
    efficiency is ``m64``'s: always hidden under the stream; a last wave of few programs streams at
    ``program_gbs_m16`` each), ``m64`` (16 < s <= 128) and ``m128`` (s > 128; its bandwidth
    efficiency is ``m64``'s: always compute-bound)."""
    block_m, splits = portable_expanded_config(pb.b, dims.h, pb.s, pb.t, m.sms)
    family = "_m16" if block_m <= 16 else "_m64" if block_m <= 64 else "_m128"
    q = {**p, "compute_efficiency_m16": p["compute_efficiency_m64"], "bandwidth_efficiency_m128": p["bandwidth_efficiency_m64"]}
    out = expanded_tiles(dims, pb, m, q, block_m=block_m, splits=splits, family=family, seed_bytes=seed_bytes,
                         programs_per_sm=PORTABLE_EXPANDED_PROGRAMS_PER_SM[block_m])
    out.info["family"] = family[1:]
    return out


def flash_attention_gluon(dims: MLADims, pb: Problem, m: Machine, p: Params) -> Breakdown:
    """The sm_90 expanded kernel (the default for s > 64): 128-row tiles, causal blocks skipped,
    never split."""
    return expanded_tiles(dims, pb, m, p, block_m=GLUON_EXPANDED_BLOCK_M, splits=1)


def hybrid_portable(dims: MLADims, pb: Problem, m: Machine, p: Params, expanded: Params,
                    absorbed: Params | None = None) -> Breakdown:
    """The hybrid's portable path (the default on every GPU but sm_90): the latent part as 32-row tiles
    of heads x queries over 32-key steps (mma.sync), the window part as the portable expanded
    kernel over the n newest keys (parameters ``expanded``), one launch after the other, then the
    merge. With n = 0 the call is the portable absorbed kernel (parameters ``absorbed``)."""
    lat = {"compute_efficiency": p["latent_compute_efficiency"], "program_us": p["latent_program_us"],
           "memory_overlap": 1.0, "fixed_us": p["latent_fixed_us"], "combine_us_per_split": expanded["combine_us_per_split"]}

    def latent_law(q: Problem) -> Breakdown:
        block_h, block_s, block_n, splits = hybrid_latent_config(q.b, dims.h, q.s, q.t, dims.k, m.sms)
        return latent_tiles(dims, q, m, lat, tile_rows=block_h * block_s,
                            tiles_per_seq=cdiv(dims.h, block_h) * cdiv(q.s, block_s), block_n=block_n, splits=splits,
                            causal_skip=True)

    return hybrid(dims, pb, m, p, latent_law, lambda q: flash_attention_portable(dims, q, m, expanded),
                  None if absorbed is None else lambda q: flash_mla_portable(dims, q, m, absorbed))


def window_partition(dims: MLADims, pb: Problem, m: Machine, p: Params) -> Breakdown:
    """The sm_90 hybrid's window part (the Gluon window kernel on its share of an SM partition),
    as whole-GPU time: its SM-time, ``window_us_per_head_key + window_us_per_head_key_token * s``
    per (sequence, head, key) plus ``window_us_per_item + window_us_per_item_token * s`` per
    (sequence, head) item, over all SMs, and never below the window's bytes (K and V per head,
    the RoPE key once per token) at the copy rate."""
    b, h, s, n = pb.b, dims.h, pb.s, pb.t
    per_item = (n * (p["window_us_per_head_key"] + p["window_us_per_head_key_token"] * s)
                + p["window_us_per_item"] + p["window_us_per_item_token"] * s)
    sm_s = b * h * per_item * US
    stream = b * n * (h * (dims.d + dims.dv) + dims.p) * dims.w / m.bytes_per_s
    return Breakdown(max(sm_s / m.sms, stream), {"sm_time_s": sm_s, "stream_s": stream}, {})


def hybrid_hopper(dims: MLADims, pb: Problem, m: Machine, p: Params, latent: Params, expanded_gluon: Params,
                  expanded_portable: Params) -> Breakdown:
    """The hybrid's sm_90 default: the seesaw over the o old keys (parameters ``latent``) and, for
    s <= :data:`HYBRID_PARTITION_MAX_S`, the window kernel on an SM partition sized to balance the
    parts (its part: :func:`window_partition`, with the window's held SM-time per key), the fitted
    ``part_overlap`` of the shorter part hidden under the longer, plus the merge. Above it the parts run on two streams: the
    expanded default (Gluon for s > 64, else portable) over the n newest keys after the latent
    part, one after the other (no overlap: the seesaw's programs are persistent, one per SM, each
    holding its SM's shared memory, so the other stream's kernel finds no SM until they finish;
    measured on an H200, the fitted partition overlap put ten held-out two-stream calls at
    0.86-0.95 of their time and the calibrate run's one at 0.92, no overlap at 0.96-1.08 and
    1.02). With o = 0 (or n = 0) one part runs: the expanded (or the absorbed design's) kernel alone."""

    def latent_law(q: Problem) -> Breakdown:
        return flash_mla_gluon(dims, q, m, latent)

    def window_law(q: Problem) -> Breakdown:
        if pb.n == pb.t or pb.s > HYBRID_PARTITION_MAX_S:
            if q.s > GLUON_EXPANDED_MIN_S:
                return flash_attention_gluon(dims, q, m, expanded_gluon)
            return flash_attention_portable(dims, q, m, expanded_portable)
        return window_partition(dims, q, m, p)

    two_streams = pb.s > HYBRID_PARTITION_MAX_S
    return hybrid(dims, pb, m, {**p, "part_overlap": 0.0} if two_streams else p, latent_law, window_law, latent_law)


def seed_flash_mla(dims: MLADims, pb: Problem, m: Machine, p: Params) -> Breakdown:
    """The seed's absorbed kernel (not in this repository): assumed tiled as our portable kernel."""
    return flash_mla_portable(dims, pb, m, p)


def seed_flash_attention(dims: MLADims, pb: Problem, m: Machine, p: Params) -> Breakdown:
    """The seed's expanded kernel: our portable tiles, the seed's bytes (RoPE key per head)."""
    return flash_attention_portable(dims, pb, m, p, seed_bytes=True)


def seed_hybrid(dims: MLADims, pb: Problem, m: Machine, p: Params, latent: Params, window: Params) -> Breakdown:
    """The seed's hybrid: its latent part at the seed's absorbed rate, its window part at the
    seed's expanded rate, overlapped by ``part_overlap``, plus ``fixed_us`` per call."""
    return hybrid(dims, pb, m, p, lambda q: seed_flash_mla(dims, q, m, latent),
                  lambda q: seed_flash_attention(dims, q, m, window))


_EFF = "fraction of one SM's share of the compute ceiling reached by a full tile step"
_OVL = "fraction of the DRAM time (cost-model bytes at the copy rate) hidden under compute"
_PROG = "time a program spends outside its key loop (query load, pipeline fill, epilogue)"
_FIX = "GPU time of the launch and drain, beyond the program waves"
_COMB = "split-KV combine time per split (the combine walks a row's partials one after the other)"
_HOST = ("host time of one eager call (input checks, descriptors, launches); eager time = max(GPU time + "
         "eager_lead x host time, host time + eager_tail x GPU time)")
_HOST_SPLIT = "extra host time of a split-KV call (split plan, partial buffers, the combine's launch)"
_LEAD = ("fraction of the host time spent before the call's first kernel starts: eager time >= GPU time + this x "
         "host time")
_TAIL = ("fraction of the GPU time that runs after the host's last launch: eager time >= host time + this x GPU "
         "time")
#: eager time = max(GPU + eager_lead x host, host + eager_tail x GPU); at 0 and 0 (the priors, and what a
#: calibration without them reads) it is max(GPU, host)
_EAGER = (Spec("eager_lead", "1", _LEAD, 0.0, 0.0, 1.0, group="host", optional=True),
          Spec("eager_tail", "1", _TAIL, 0.0, 0.0, 1.0, group="host", optional=True))
_HOST_N0 = ("extra host time of a call at n = 0 over the absorbed call it runs (the hybrid's own input check and its "
            "zero expanded output); a call with a window does not pay it")
#: the prior of n0_host_us: measured on an H100 at 27ac8f1 (results/h100/n0-host-27ac8f1/: 69-74 us of host time
#: per call against the absorbed call's 46-51 at steady points)
_N0_PRIOR_US = 20.0
_WINDOW_WHY = ("measured alone on an H200 at cb4f406 (b = 32 and 96, n = 64-2,048, s = 1-32 on 44 programs; "
               "window/items-cb4f406.json): SM-time per (sequence, head) item = 1.0 + 0.044 s us plus "
               "0.00718 + 0.0000415 s us per key; held: the hybrid's times cannot identify them, the window's "
               "stream at the copy rate being longer on the whole GPU")
_NOT_SEEN = "not identifiable: every committed call of this kernel lasts >= 1.9 ms, where it is under 1 %"


def _latent_specs(eff: float) -> tuple[Spec, ...]:
    return (
        Spec("compute_efficiency", "1", _EFF + " (64 x 64 here)", eff, 0.02, 1.5),
        Spec("program_us", "us", _PROG, 5.0, 0.0, 200.0),
        Spec("memory_overlap", "1", _OVL, 0.8, 0.0, 1.0),
        Spec("combine_us_per_split", "us", _COMB, 0.3, 0.0, 20.0),
        Spec("fixed_us", "us", _FIX, 2.0, 0.0, 200.0),
        Spec("host_us", "us", _HOST + "; without split-KV", 100.0, 0.0, 5000.0, group="host"),
        Spec("host_split_us", "us", _HOST_SPLIT, 100.0, 0.0, 5000.0, group="host"),
        *_EAGER,
    )


#: parameters of every calibrated (design, backend): name within the law, unit, meaning, prior.
SPECS: dict[tuple[str, str], tuple[Spec, ...]] = {
    ("flash_mla", "gluon"): _latent_specs(0.8),
    ("flash_mla", "triton"): _latent_specs(0.3),
    ("flash_attention", "triton"): (
        Spec("bandwidth_efficiency_m16", "1", "fraction of the copy rate the key/value stream reaches with 16-row tiles (s <= 16)", 1.0, 0.05, 1.3),
        Spec("bandwidth_efficiency_m64", "1", "same with 32- and 64-row tiles (16 < s <= 128) and above", 0.9, 0.05, 1.3),
        Spec("program_gbs_m16", "GB/s", "stream rate of one program with 16-row tiles: what a last wave of few "
             "programs pulls per program", 15.0, 1.0, 1000.0),
        Spec("compute_efficiency_m64", "1", "fraction of the compute ceiling reached by the padded, visible FLOPs with 16- to 64-row tiles", 0.5, 0.02, 1.5),
        Spec("compute_efficiency_m128", "1", "same with 128-row tiles (s > 128)", 0.6, 0.02, 1.5),
        Spec("memory_overlap", "1", "fraction of the shorter of compute and stream time hidden under the longer", 0.9, 0.0, 1.0),
        Spec("combine_us_per_split", "us", _COMB, 0.3, 0.0, 20.0, fit=False, why="no committed point splits (b·h >= 132 everywhere)"),
        Spec("fixed_us", "us", _FIX, 0.0, 0.0, 200.0),
        Spec("host_us", "us", _HOST, 100.0, 0.0, 5000.0, group="host"),
        *_EAGER,
    ),
    ("flash_attention", "gluon"): (
        Spec("compute_efficiency", "1", "fraction of the compute ceiling reached by the padded, visible FLOPs (128-row tiles)", 0.8, 0.02, 1.5),
        Spec("bandwidth_efficiency", "1", "fraction of the copy rate the key/value stream reaches", 1.0, 0.05, 1.1),
        Spec("memory_overlap", "1", "fraction of the shorter of compute and stream time hidden under the longer", 0.9, 0.0, 1.0),
        Spec("fixed_us", "us", _FIX, 0.0, 0.0, 200.0, fit=False, why=_NOT_SEEN),
        Spec("host_us", "us", _HOST, 100.0, 0.0, 5000.0, group="host"),
        *_EAGER,
    ),
    ("mla_var6_plus", "triton"): (
        Spec("latent_compute_efficiency", "1", _EFF + " in the latent part (32 rows x 32 keys, mma.sync)", 0.2, 0.02, 1.5),
        Spec("latent_program_us", "us", _PROG + ", latent part", 1.0, 0.0, 200.0),
        Spec("latent_fixed_us", "us", _FIX + ", latent part", 5.0, 0.0, 500.0),
        Spec("merge_us", "us", "merge time beyond its bytes at the copy rate (launch, small programs)", 20.0, 0.0, 1000.0),
        Spec("part_overlap", "1", "fraction of the shorter part (latent or window) hidden under the longer", 0.0, 0.0, 1.0),
        Spec("fixed_us", "us", "the call's own GPU time beyond its parts and merge", 0.0, 0.0, 1000.0, fit=False,
             why="confounded with latent_fixed_us and merge_us; held at 0"),
        Spec("host_us", "us", _HOST + "; with a window", 150.0, 0.0, 5000.0, group="host"),
        Spec("n0_host_us", "us", _HOST_N0, _N0_PRIOR_US, 0.0, 5000.0, group="host", optional=True),
    ),
    ("mla_var6_plus", "gluon"): (
        Spec("window_us_per_head_key", "us", "SM-time of the window kernel per (sequence, head, key), beyond its "
             "per-query-token part", 0.00718, 0.0, 100.0, fit=False, why=_WINDOW_WHY),
        Spec("window_us_per_head_key_token", "us", "SM-time of the window kernel per (sequence, head, key) and query "
             "token (its swap-AB MMAs)", 0.0000415, 0.0, 10.0, fit=False, why=_WINDOW_WHY),
        Spec("window_us_per_item", "us", "SM-time of the window kernel per (sequence, head) item beyond its keys "
             "(its queries, its first block's ring fill, the hand-over and the store), beyond its per-query-token part",
             1.0, 0.0, 1000.0, fit=False, why=_WINDOW_WHY),
        Spec("window_us_per_item_token", "us", "SM-time of the window kernel per (sequence, head) item and query "
             "token", 0.044, 0.0, 100.0, fit=False, why=_WINDOW_WHY),
        Spec("merge_us", "us", "merge time beyond its bytes at the copy rate (launch, small programs)", 20.0, 0.0, 1000.0),
        Spec("part_overlap", "1", "fraction of the shorter part (its whole-GPU time) hidden under the longer on an SM "
             "partition: the window's stream under the latent part's MMAs (two streams: none)", 0.3, 0.0, 1.0),
        Spec("fixed_us", "us", "the call's own GPU time beyond its parts and merge", 0.0, 0.0, 1000.0, fit=False,
             why="confounded with merge_us; held at 0"),
        Spec("host_us", "us", _HOST + "; with a window", 150.0, 0.0, 5000.0, group="host"),
        Spec("n0_host_us", "us", _HOST_N0, _N0_PRIOR_US, 0.0, 5000.0, group="host", optional=True),
    ),
    ("flash_mla", "seed"): (
        Spec("compute_efficiency", "1", _EFF + " (the seed's kernel, assumed tiled as our portable one)", 0.5, 0.02, 1.5),
        Spec("fixed_us", "us", "the call's fixed time (launch, latency) beyond its tile steps", 10.0, 0.0, 2000.0),
        Spec("program_us", "us", _PROG, 0.0, 0.0, 200.0, fit=False, why="two seed points: held at 0"),
        Spec("memory_overlap", "1", _OVL, 1.0, 0.0, 1.0, fit=False, why="two seed points: held at full overlap"),
        Spec("combine_us_per_split", "us", _COMB, 0.0, 0.0, 20.0, fit=False, why="two seed points: held at 0"),
        Spec("host_us", "us", _HOST, 0.0, 0.0, 5000.0, group="host", fit=False, why="the seed's times are GPU times"),
        Spec("host_split_us", "us", _HOST_SPLIT, 0.0, 0.0, 5000.0, group="host", fit=False, why="as host_us"),
    ),
    ("flash_attention", "seed"): (
        Spec("bandwidth_efficiency_m16", "1", "fraction of the copy rate the seed's key/value stream reaches (RoPE key per head)", 0.9, 0.05, 1.3),
        Spec("bandwidth_efficiency_m64", "1", "same, 32- to 128-row tiles", 0.9, 0.05, 1.3, fit=False, why="no seed point at s > 16: held"),
        Spec("compute_efficiency_m64", "1", "fraction of the compute ceiling (hidden under the stream at s <= 16)", 0.5, 0.02, 1.5, fit=False, why="memory-bound at both seed points: held"),
        Spec("compute_efficiency_m128", "1", "same, 128-row tiles", 0.5, 0.02, 1.5, fit=False, why="no seed point at s > 128: held"),
        Spec("memory_overlap", "1", "fraction of the shorter of compute and stream time hidden", 1.0, 0.0, 1.0, fit=False, why="held"),
        Spec("combine_us_per_split", "us", _COMB, 0.0, 0.0, 20.0, fit=False, why="held"),
        Spec("fixed_us", "us", _FIX, 0.0, 0.0, 2000.0, fit=False, why="held"),
        Spec("host_us", "us", _HOST, 0.0, 0.0, 5000.0, group="host", fit=False, why="the seed's times are GPU times"),
    ),
    ("mla_var6_plus", "seed"): (
        Spec("part_overlap", "1", "fraction of the shorter part (latent or window) hidden under the longer", 0.5, 0.0, 1.0),
        Spec("fixed_us", "us", "the call's own time beyond its two parts (extra launches, query tensors, merge)", 100.0, 0.0, 5000.0),
        Spec("merge_us", "us", "merge time beyond its bytes", 0.0, 0.0, 1000.0, fit=False, why="two seed points: folded into fixed_us"),
        Spec("host_us", "us", _HOST, 0.0, 0.0, 5000.0, group="host", fit=False, why="the seed's times are GPU times"),
    ),
}

#: laws by (design, backend): law(dims, problem, machine, params_of) where params_of(design,
#: backend) gives a kernel's parameters (the hybrid reads its parts' kernels too).
LAWS: dict[tuple[str, str], Callable] = {
    ("flash_mla", "gluon"): lambda d, pb, m, P: flash_mla_gluon(d, pb, m, P("flash_mla", "gluon")),
    ("flash_mla", "triton"): lambda d, pb, m, P: flash_mla_portable(d, pb, m, P("flash_mla", "triton")),
    ("flash_attention", "triton"): lambda d, pb, m, P: flash_attention_portable(d, pb, m, P("flash_attention", "triton")),
    ("flash_attention", "gluon"): lambda d, pb, m, P: flash_attention_gluon(d, pb, m, P("flash_attention", "gluon")),
    ("mla_var6_plus", "triton"): lambda d, pb, m, P: hybrid_portable(d, pb, m, P("mla_var6_plus", "triton"),
                                                                     P("flash_attention", "triton"),
                                                                     P("flash_mla", "triton")),
    ("mla_var6_plus", "gluon"): lambda d, pb, m, P: hybrid_hopper(d, pb, m, P("mla_var6_plus", "gluon"),
                                                                   P("flash_mla", "gluon"), P("flash_attention", "gluon"),
                                                                   P("flash_attention", "triton")),
    ("flash_mla", "seed"): lambda d, pb, m, P: seed_flash_mla(d, pb, m, P("flash_mla", "seed")),
    ("flash_attention", "seed"): lambda d, pb, m, P: seed_flash_attention(d, pb, m, P("flash_attention", "seed")),
    ("mla_var6_plus", "seed"): lambda d, pb, m, P: seed_hybrid(d, pb, m, P("mla_var6_plus", "seed"),
                                                               P("flash_mla", "seed"), P("flash_attention", "seed")),
}

#: kernels a law reads besides its own (fit order: these first).
DEPENDS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("mla_var6_plus", "triton"): (("flash_attention", "triton"), ("flash_mla", "triton")),
    ("mla_var6_plus", "seed"): (("flash_mla", "seed"), ("flash_attention", "seed")),
    ("mla_var6_plus", "gluon"): (("flash_mla", "gluon"), ("flash_attention", "gluon"), ("flash_attention", "triton")),
}


#: the absorbed kernel a hybrid call with n = 0 runs (``kernel.hybrid``: the default call with no
#: window is the absorbed design), by the hybrid's backend.
ABSORBED_AT_N0: dict[tuple[str, str], tuple[str, str]] = {
    ("mla_var6_plus", "gluon"): ("flash_mla", "gluon"),
    ("mla_var6_plus", "triton"): ("flash_mla", "triton"),
}


def spec_of(full: str) -> Spec | None:
    """The :class:`Spec` of parameter ``<design>.<backend>.<name>``, or None where no law declares it."""
    design, _, rest = full.partition(".")
    backend, _, name = rest.partition(".")
    return next((s for s in SPECS.get((design, backend), ()) if s.name == name), None)


def call_kernel(design: str, backend: str, pb: Problem) -> tuple[str, str]:
    """The (design, backend) whose launches a call runs: the absorbed kernel for a hybrid at n = 0
    (:data:`ABSORBED_AT_N0`), else the call's own. Its host costs and split count are the call's."""
    if not pb.n and (design, backend) in ABSORBED_AT_N0:
        return ABSORBED_AT_N0[(design, backend)]
    return design, backend


def splits_of(design: str, backend: str, dims: MLADims, pb: Problem, sms: int) -> int:
    """Split-KV count of a call (host-cost class: a split call does more host work)."""
    design, backend = call_kernel(design, backend, pb)
    rows = dims.h * pb.s
    if (design, backend) == ("flash_mla", "gluon"):
        return gluon_latent_splits(pb.b, rows, pb.t, sms, dims.k)
    if design == "flash_mla":
        return portable_latent_config(pb.b, rows, pb.t, dims.k, sms)[2]
    return 1

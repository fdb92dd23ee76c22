"""The decode plan (``kernel/decode_plan.py``): the device planner against its Python reference,
and every plan's contract — each sequence's key blocks covered exactly once by its items, items
no longer than ``MAX_ITEM_BLOCKS``, one slot per split item, nothing past the buffers.

The planner runs under Triton's interpreter on the CPU (a single program), so lengths are drawn
freely; hypothesis picks batches, lengths, rows and capacities.
"""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_var3.kernel._common import cdiv
from mla_var3.kernel import decode_plan
from mla_var3.kernel import plan_reference as plan_reference_module
from mla_var3.kernel.combine import combine, combine_planned
from mla_var3.kernel.decode_plan import (
    ITEM_PRICE, MAX_ITEM_BLOCKS, PACK_OVERHEAD, PACKED_PRICE, PLAN_BLOCK, KindReadback, auto_reference, item_makespan,
    kind_estimate, packed_makespan, packed_reference, packing_may_pay, plan_capacity, plan_decode, plan_reference,
    uniform_plan,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check_contract(items, seqs, lengths, capacity, max_slots):
    """Every sequence's blocks [0, n_b) covered once, in order of its items; slots unique."""
    covered = {b: [] for b in range(len(lengths))}
    slots = []
    live = True
    for b, lo, hi, slot in items:
        if b < 0:
            live = False
            continue
        assert live, "a live item after the first empty one"
        assert 0 <= lo <= hi and hi - lo <= MAX_ITEM_BLOCKS
        covered[b].append((lo, hi, slot))
        if slot >= 0:
            slots.append(slot)
    assert len(slots) == len(set(slots)) and all(0 <= s < max_slots for s in slots)
    for b, n in enumerate(lengths):
        blocks = cdiv(min(max(n, 0), capacity), PLAN_BLOCK)
        got = sorted(covered[b])
        assert got, f"sequence {b} has no item"
        assert got[0][0] == 0 and got[-1][1] == blocks and all(x[1] == y[0] for x, y in zip(got, got[1:]))
        first, count = seqs[b]
        assert count == len(got)
        if count == 1:
            assert first == -1 and got[0][2] == -1
        else:
            assert sorted(x[2] for x in got) == list(range(first, first + count))


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=40), rows=st.sampled_from([16, 64, 128, 512, 2048]),
       extra=st.integers(0, 3000))
def test_device_plan_matches_reference_and_contract(lengths, rows, extra):
    capacity = max(lengths) + extra
    plan = plan_decode(torch.tensor(lengths, dtype=torch.int32, device=DEVICE), rows, capacity=capacity, packed=False)
    ref = plan_reference(lengths, rows, capacity=capacity)
    assert plan.items.tolist() == [list(x) for x in ref["items"]]
    assert plan.seqs.tolist() == [list(x) for x in ref["seqs"]]
    _check_contract(ref["items"], ref["seqs"], lengths, capacity, plan.max_slots)
    _check_longest_first(ref["items"])


def test_a_sequence_whose_items_cross_a_block_of_the_planner_keeps_them():
    """The item planner writes its items a block of 128 (interpreter) or 256 (GPU) at a time and
    overwrote the start mark of a sequence whose items crossed into the next block: its items
    there were taken for another sequence's (here the empty sequence 2 three times, sequence 5's
    last two items lost). Found by hypothesis; items 113..129 are sequence 5's."""
    lengths = [4096, 4096, 0, 2156, 4096, 2156]
    plan = plan_decode(torch.tensor(lengths, dtype=torch.int32, device=DEVICE), 16, capacity=4096, packed=False)
    ref = plan_reference(lengths, 16, capacity=4096)
    assert [x[0] for x in ref["items"][113:130]] == [5] * 17
    assert plan.items.tolist() == [list(x) for x in ref["items"]]
    _check_contract(ref["items"], ref["seqs"], lengths, 4096, plan.max_slots)


@pytest.mark.parametrize("packed", [False, None])
def test_a_batch_over_several_passes_plans_as_in_one(monkeypatch, packed):
    """The planners read a batch longer than their pass (``seq_block``) in several passes, and
    the cuts' simulation sorts the remainders a tile of ``SORT_BLOCK`` sequences at a time; the
    device plan is the reference's: 40 ragged sequences, 16 per pass and per tile."""
    import mla_var3.kernel.decode_plan as dp
    from mla_var3.analysis import item_cut

    g = torch.Generator().manual_seed(4)
    lengths = torch.where(torch.rand(40, generator=g) < 0.2, 8192, torch.randint(1, 1024, (40,), generator=g)).tolist()
    monkeypatch.setattr(dp, "seq_block", lambda batch, block: 16)
    monkeypatch.setattr(item_cut, "SORT_BLOCK", 16)
    ref = plan_reference(lengths, 256, capacity=8192) if packed is False else auto_reference(lengths, 256,
                                                                                                capacity=8192)
    assert sum(1 for it in ref["items"] if it[0] >= 0) > dp.row_slots(256, 132)      # two waves: simulated
    plan = plan_decode(torch.tensor(lengths, dtype=torch.int32, device=DEVICE), 256, capacity=8192, sms=132,
                       packed=packed)
    assert plan.items.tolist() == [list(x) for x in ref["items"]]
    assert plan.seqs.tolist() == [list(x) for x in ref["seqs"]]


def _check_longest_first(items):
    """An item plan's items in order of their length, coarsest to a sixteenth of the longest item
    (the GPU starts programs in grid order: a long item started last ends last); a sequence's
    near-equal items (one block apart) share their longest's class."""
    sizes = [hi - lo for b, lo, hi, _ in items if b >= 0]
    longest = max(sizes, default=0)
    cls = lambda x: min(15, 16 * x // (longest + 1))
    later = 0
    for x in reversed(sizes):
        assert later <= cls(x + 1), "a longer item after a shorter one"
        later = max(later, cls(x))


def _check_packed(ref, lengths, capacity, max_slots):
    """A packed plan: the item contract, program starts in order over all items, each program's
    items contiguous in the batch's block order and no wider than its share."""
    _check_contract(ref["items"], ref["seqs"], lengths, capacity, max_slots)
    starts, items = ref["starts"], ref["items"]
    live = sum(1 for it in items if it[0] >= 0)
    assert starts[0] == 0 and starts[-1] == live and all(a <= b for a, b in zip(starts, starts[1:]))
    for p in range(len(starts) - 1):
        mine = items[starts[p]: starts[p + 1]]
        assert sum(hi - lo for _, lo, hi, _ in mine) <= ref.get("width", MAX_ITEM_BLOCKS)
        assert all(a[0] < b[0] and b[1] == 0 for a, b in zip(mine, mine[1:])), "a program's pieces run in batch order"


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 9000), min_size=1, max_size=60), rows=st.sampled_from([16, 128, 512, 2048]),
       extra=st.integers(0, 3000), sms=st.sampled_from([132, 7, 1]), packed=st.sampled_from([True, None]))
def test_packed_and_chosen_plans_match_reference_and_contract(lengths, rows, extra, sms, packed):
    capacity = max(lengths) + extra
    plan = plan_decode(torch.tensor(lengths, dtype=torch.int32, device=DEVICE), rows, capacity=capacity, sms=sms,
                       packed=packed)
    if packed:
        ref = packed_reference(lengths, rows, capacity=capacity, sms=sms)
    else:
        ref = auto_reference(lengths, rows, capacity=capacity, sms=sms)
    assert plan.items.tolist() == [list(x) for x in ref["items"]]
    assert plan.seqs.tolist() == [list(x) for x in ref["seqs"]]
    if ref["starts"] is None:       # the default does not consider packing this batch
        assert packed is None and plan.starts is None and plan.packed is None
        _check_contract(ref["items"], ref["seqs"], lengths, capacity, plan.max_slots)
        return
    assert plan.starts.tolist() == ref["starts"] and plan.programs == len(ref["starts"]) - 1
    if packed is None:   # the GPU's choice, which the sm_90 kernels read to gate themselves
        assert plan.packed.tolist() == [int(ref["packed"])]
        # a packed plan never needs more programs than the packed kernel's gated grid
        assert not ref["packed"] or all(a == b for a, b in zip(ref["starts"][plan.packed_programs:],
                                                                ref["starts"][plan.packed_programs + 1:]))
    else:
        assert plan.packed is None
    _check_packed(ref, lengths, capacity, plan.max_slots)


def test_packed_plan_cuts_at_program_shares():
    """Two sequences of 100 blocks over 4 programs: (100 + 4) * 2 / 4 -> 52 units each; program 1
    starts inside sequence 0 (48 blocks after its 4 overhead units), program 2 at sequence 1's
    start, so no piece is empty."""
    ref = packed_reference([6400, 6400], 64, capacity=6400, sms=4)
    assert ref["width"] == 52
    assert [it for it in ref["items"] if it[0] >= 0] == [(0, 0, 48, 0), (0, 48, 100, 1), (1, 0, 48, 2),
                                                         (1, 48, 100, 3)]
    assert ref["starts"][:5] == [0, 1, 2, 3, 4]
    assert PACK_OVERHEAD == 4


def test_the_planner_packs_ragged_batches_and_not_balanced_ones():
    """Measured on an H200: packing won on ragged b = 16, s = 2 (t <= 32768) and lost on uniform
    b = 32, s = 1 (the item plan fills the SMs in one wave there) and on ragged b = 32, s = 1
    (t <= 4096; ``serving/paths-de2176b.json``). On ragged b = 64, s = 1 (t <= 8192) it won
    against items cut near-equal, not against items cut in chunks (``decode_plan.CUTS``: 160.8 us
    against FlashMLA's 154.6, ``seesaw/seesaw-chunk-serving-698e143.json``; packed 172.0 against
    152.0 at 04bd669)."""
    g = torch.Generator().manual_seed(5)
    ragged = torch.randint(512, 4097, (32,), generator=g).tolist()
    assert not auto_reference(ragged, 128, capacity=4096)["packed"]
    assert not auto_reference(torch.randint(1024, 8193, (64,), generator=g).tolist(), 128, capacity=8192)["packed"]
    assert auto_reference(torch.randint(4096, 32769, (16,), generator=g).tolist(), 256, capacity=32768)["packed"]
    assert not auto_reference([4096] * 32, 128, capacity=4096)["packed"]
    # 256 (sequence, row tile) pairs on 132 SMs: the item plan, in the item kernel
    assert auto_reference(torch.randint(512, 4097, (128,), generator=g).tolist(), 128, capacity=4096)["starts"] is None
    assert packing_may_pay(64, 128, 132) and not packing_may_pay(128, 128, 132) and not packing_may_pay(64, 256, 132)


def test_a_gated_item_plan_holds_fewer_items_and_keeps_every_plan_the_gpu_runs():
    """A batch whose plan kind the GPU chooses caps its item plan at ``max(batch, 2 * slots)``
    items (the sm_90 item kernel launches one program per item slot even when the GPU packs):
    b = 64, s = 1 gets 132 item slots per row tile instead of 196, so the gated grid is two waves
    of programs, not three. On seeded gated batches the capped item plan differs from the uncapped
    one only where the planner packs, so no item plan the GPU runs changes."""
    assert plan_capacity(64, 128, 132, 128) == (66, 196, 132)
    assert plan_capacity(64, 128, 132, 128, gated=True) == (66, 132, 132)
    assert plan_capacity(200, 128, 132, 128, gated=True)[1] == 200          # every sequence keeps an item
    assert plan_capacity(8, 128, 132, 2048, gated=True)[1] == 132           # cutting at MAX_ITEM_BLOCKS fits
    g = torch.Generator().manual_seed(11)
    checked = packed_where_differs = item_where_differs = 0
    for b, rows, t in [(64, 128, 8192), (64, 128, 32768), (48, 128, 8192), (96, 128, 16384), (32, 256, 16384),
                       (24, 512, 16384), (16, 256, 32768), (32, 128, 4096), (8, 128, 32768), (1, 128, 4096)]:
        for i in range(30):
            if i % 2:       # uniform in [t / 8, t], or skewed: a fifth at t, the rest short
                lengths = torch.randint(t // 8, t + 1, (b,), generator=g).tolist()
            else:
                long = torch.rand(b, generator=g) < 0.2
                lengths = torch.where(long, t, torch.randint(1, t // 8 + 1, (b,), generator=g)).tolist()
            assert packing_may_pay(b, rows, 132)
            full = plan_reference(lengths, rows, capacity=t)
            capped = plan_reference(lengths, rows, capacity=t, gated=True)
            chosen = auto_reference(lengths, rows, capacity=t)
            _check_contract(capped["items"], capped["seqs"], lengths, t, capped["max_slots"])
            assert len(capped["items"]) == plan_capacity(b, rows, 132, cdiv(t, 64), gated=True)[1]
            checked += 1
            live = lambda ref: [it for it in ref["items"] if it[0] >= 0]
            if live(capped) != live(full) or capped["estimate"] != full["estimate"]:
                if chosen["packed"]:
                    packed_where_differs += 1
                else:   # an item plan the GPU runs, capped: its estimate within 1 % of the uncapped one
                    assert capped["estimate"] <= 1.01 * full["estimate"], (b, rows, t)
                    item_where_differs += 1
    assert checked == 300 and packed_where_differs > 0       # the cap binds on some of these batches
    assert item_where_differs <= 1       # b24 s4: 32 items of 52 blocks for 34 of 51, 0.5 % dearer


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.integers(0, 300), min_size=1, max_size=30), c_len=st.integers(2, 64), r=st.integers(0, 80),
       cut=st.sampled_from(plan_reference_module.CUTS))
def test_the_kth_item_is_the_sorted_cut_s(blocks, c_len, r, cut):
    """``_kth_item``: the ``r``-th longest item of the cut (0 where it has at most ``r`` items), as
    sorting every item's size says; near-equal items, or chunks of ``c_len`` and a remainder."""
    counts = [max(1, cdiv(n, c_len)) for n in blocks]
    if cut == "equal":
        sizes = [n // c + (j < n % c) for n, c in zip(blocks, counts) for j in range(c)]
    else:
        sizes = [min(c_len, n - j * c_len) if c > 1 else n for n, c in zip(blocks, counts) for j in range(c)]
    sizes = sorted((x for x in sizes if x > 0), reverse=True)
    longest = max(sizes, default=0)
    assert plan_reference_module._kth_item(blocks, counts, r, longest, c_len, cut) == (sizes[r] if r < len(sizes) else 0)


def test_a_second_wave_of_short_items_is_ranked_by_the_sms_that_take_it():
    """The cut's ranking ("pairs"): where a cut's items take two waves, the SMs that free first
    (the first wave's shortest items) take the second wave's longest, so a cut whose second wave
    is short items costs about its longest item plus the next, not a mean item more. Seed 9's
    ragged b16 s2 t8192 batch (three sequences of 128 blocks, 13 of 1-16): "pairs" cuts the long
    sequences into 16-block items (37 items for 33 slots) where "spread" cut 22-block ones (31 items,
    one wave); measured on an H200 (``seesaw/seesaw-itemfit-seed9-bd5d463.json``), the 16-block cut
    ran 50.5 us against 61.5. The "tail" ranking cuts it in chunks of 19 blocks (34 items), the
    simulation (the planner's "sim") in chunks of 17 (37 items: the three long sequences in 7 chunks
    and a remainder of 9 blocks each, and the 13 short sequences)."""
    lengths = [187, 8192, 908, 860, 762, 349, 620, 8192, 532, 135, 666, 544, 460, 341, 8192, 964]
    tail = plan_reference(lengths, 256, capacity=8192, sms=132, ranking="tail")
    assert tail["item_blocks"] == 19 and sum(1 for it in tail["items"] if it[0] >= 0) == 34
    sim = plan_reference(lengths, 256, capacity=8192, sms=132)
    assert sim["item_blocks"] == 17 and sum(1 for it in sim["items"] if it[0] >= 0) == 37
    pairs = plan_reference(lengths, 256, capacity=8192, sms=132, ranking="pairs")
    spread = plan_reference(lengths, 256, capacity=8192, sms=132, ranking="spread")
    assert (pairs["item_blocks"], spread["item_blocks"]) == (16, 22)
    live = lambda ref: sum(1 for it in ref["items"] if it[0] >= 0)
    assert (live(pairs), live(spread)) == (37, 31)
    with pytest.raises(ValueError, match="ranking must be one of"):
        plan_reference(lengths, 256, capacity=8192, ranking="best")


def test_the_one_wave_cut_is_a_candidate():
    """Eight long ragged sequences (measured on an H200, ``serving/paths-de2176b.json``: 93.7 us
    at the best grid candidate, 90.8 at the one-wave cut): the planner takes the shortest item
    length whose items fit the 66 slots, which no candidate of the grid hit, so no slot idles
    for rounding and no item waits for a second wave."""
    g = torch.Generator().manual_seed(5 + 8 * 100 + 1)
    lengths = torch.randint(4096, 32769, (8,), generator=g).tolist()
    ref = plan_reference(lengths, 128, capacity=32768)
    blocks = [cdiv(n, PLAN_BLOCK) for n in lengths]
    c = ref["item_blocks"]
    items = sum(max(1, cdiv(n, c)) for n in blocks)
    assert items <= 66 < sum(max(1, cdiv(n, c - 1)) for n in blocks)


def test_long_sequences_are_cut_at_the_item_limit():
    lengths = [MAX_ITEM_BLOCKS * PLAN_BLOCK * 3 + 5, 70]
    capacity = lengths[0]
    ref = plan_reference(lengths, 128, capacity=capacity)
    _check_contract(ref["items"], ref["seqs"], lengths, capacity, plan_capacity(2, 128, 132, cdiv(capacity, 64))[2])
    assert ref["seqs"][0][1] >= 4


def test_lengths_past_capacity_are_clamped():
    ref = plan_reference([10_000, 64], 128, capacity=640)
    _check_contract(ref["items"], ref["seqs"], [640, 64], 640, 100)


@pytest.mark.parametrize("b,rows,t,items_per_seq", [
    (32, 128, 4096, 2),     # 64 programs of 2 row tiles fill one wave of 132 SMs with 2 splits each
    (64, 128, 4096, 1),     # 128 programs: one wave unsplit (a split would add a wave and a combine)
    (32, 2048, 4096, 1),    # 32 row tiles per sequence: 8 waves already, no split
    (1, 128, 4096, 32),     # one sequence: cut into 2-block items over the SMs
])
def test_uniform_plans_choose_what_the_kernel_measured_best(b, rows, t, items_per_seq):
    plan = uniform_plan(b, rows, t)
    assert {n for _, n in plan.seqs.tolist()} == {items_per_seq}
    assert plan.may_split == (items_per_seq > 1)


def test_plan_checks_its_shape():
    plan = uniform_plan(2, 128, 1000)
    with pytest.raises(ValueError, match="built for"):
        plan.check_for(3, 128, cdiv(1000, 64), torch.device("cpu"))
    with pytest.raises(ValueError, match="up to 1024 keys"):
        plan.check_for(2, 128, cdiv(5000, 64), torch.device("cpu"))
    with pytest.raises(ValueError, match="int32"):
        plan_decode(torch.tensor([3, 4]), 128, capacity=64)
    with pytest.raises(ValueError, match="rows"):
        plan_decode(torch.tensor([3, 4], dtype=torch.int32), 0, capacity=64)


def test_combine_planned_merges_split_items():
    """Sequence 0 is split into 3 slots, sequence 1 is one item (left untouched); the merge is the
    float64 log-sum-exp mean."""
    g = torch.Generator().manual_seed(0)
    h, s, v = 4, 3, 32
    rows = h * s
    o_part = torch.randn(5, rows, v, generator=g).to(DEVICE)
    lse_part = (torch.randn(5, rows, generator=g) * 3).to(DEVICE)
    lse_part[2, :4] = float("-inf")                                # a split that saw no key for these rows
    seqs = torch.tensor([[1, 3], [-1, 1]], dtype=torch.int32, device=DEVICE)
    out = torch.full((2, h, s, v), 7.0, device=DEVICE)
    lse = torch.full((2, h, s), 7.0, device=DEVICE)
    combine_planned(o_part, lse_part, seqs, out, lse, head_major=True)
    w = torch.softmax(lse_part[1:4].double(), dim=0)
    ref_o = (w[..., None] * o_part[1:4].double()).sum(0).view(h, s, v)
    ref_l = torch.logsumexp(lse_part[1:4].double(), dim=0).view(h, s)
    assert torch.allclose(out[0].double(), ref_o, atol=1e-5) and torch.allclose(lse[0].double(), ref_l, atol=1e-5)
    assert (out[1] == 7).all() and (lse[1] == 7).all()
    # token-major rows: row = token * h + head
    out2 = torch.zeros(2, h, s, v, device=DEVICE)
    combine_planned(o_part, lse_part, seqs, out2, lse, head_major=False)
    assert torch.allclose(out2[0].double(), ref_o.view(s, h, v).transpose(0, 1), atol=1e-5)


def test_combine_planned_merges_many_split_sequences():
    """Ten of twelve sequences split (2-4 slots each, the slots in batch order, two unsplit
    sequences between them), 64 rows each: every split sequence gets its float64 log-sum-exp
    mean and the unsplit sequences are left as they were."""
    g = torch.Generator().manual_seed(1)
    h, s, v = 4, 16, 32
    rows = h * s
    counts = [2, 3, 1, 4, 2, 2, 1, 3, 2, 4, 2, 3]
    seqs, first = [], 0
    for n in counts:
        seqs.append([first if n > 1 else -1, n])
        first += n if n > 1 else 0
    o_part = torch.randn(first, rows, v, generator=g).to(DEVICE)
    lse_part = (torch.randn(first, rows, generator=g) * 3).to(DEVICE)
    out = torch.full((len(counts), h, s, v), 7.0, device=DEVICE)
    lse = torch.full((len(counts), h, s), 7.0, device=DEVICE)
    combine_planned(o_part, lse_part, torch.tensor(seqs, dtype=torch.int32, device=DEVICE), out, lse)
    for b, (f, n) in enumerate(seqs):
        if n == 1:
            assert (out[b] == 7).all() and (lse[b] == 7).all()
            continue
        w = torch.softmax(lse_part[f:f + n].double(), dim=0)
        ref_o = (w[..., None] * o_part[f:f + n].double()).sum(0).view(h, s, v)
        ref_l = torch.logsumexp(lse_part[f:f + n].double(), dim=0).view(h, s)
        assert torch.allclose(out[b].double(), ref_o, atol=1e-5), b
        assert torch.allclose(lse[b].double(), ref_l, atol=1e-5), b


def test_combine_planned_merges_many_items_and_ignores_those_without_keys():
    """A sequence of 37 split items beside one of 5 (b = 1 at t = 4,096 splits 26 ways): the
    float64 log-sum-exp mean; items that saw no key for some rows (LSE -inf) hold NaN there and
    are ignored; rows no item saw get 0 and -inf."""
    g = torch.Generator().manual_seed(2)
    h, s, v = 4, 2, 48
    rows = h * s
    counts = [37, 5]
    o_part = torch.randn(42, rows, v, generator=g).to(DEVICE)
    lse_part = (torch.randn(42, rows, generator=g) * 3).to(DEVICE)
    lse_part[3:30, 0] = float("-inf")
    o_part[3:30, 0] = float("nan")
    lse_part[:9, 1] = float("-inf")                                # leading items without keys
    o_part[:9, 1] = float("nan")
    lse_part[37:42, 5] = float("-inf")                             # row 5 of the second: no key at all
    o_part[37:42, 5] = float("nan")
    seqs = torch.tensor([[0, 37], [37, 5]], dtype=torch.int32, device=DEVICE)
    out = torch.full((2, h, s, v), 7.0, device=DEVICE)
    lse = torch.full((2, h, s), 7.0, device=DEVICE)
    combine_planned(o_part, lse_part, seqs, out, lse)
    for b, (f, n) in enumerate([(0, 37), (37, 5)]):
        ref_o, ref_l = _lse_mean(o_part[f:f + n], lse_part[f:f + n])
        got_o, got_l = out[b].reshape(rows, v).double(), lse[b].reshape(rows).double()
        assert torch.allclose(got_o, ref_o, atol=1e-5) and torch.equal(torch.isinf(got_l), torch.isinf(ref_l)), b
        assert torch.allclose(got_l[~torch.isinf(ref_l)], ref_l[~torch.isinf(ref_l)], atol=1e-5), b
    assert (out[1].reshape(rows, v)[5] == 0).all()


def _lse_mean(o_part, lse_part):
    """float64 log-sum-exp mean over dim 0, NaN partials of -inf splits ignored: (out, lse)."""
    lp, op = lse_part.double(), torch.nan_to_num(o_part.double())
    ref_l = torch.logsumexp(lp, dim=0)
    w = torch.exp(lp - torch.where(torch.isinf(ref_l), 0.0, ref_l))
    return (w[..., None] * op).sum(0), ref_l


@pytest.mark.parametrize("ns", [1, 3, 8, 11, 64])
def test_combine_merges_any_number_of_splits_in_steps(ns):
    """The plain combine reads its splits several per step under a running maximum: at any count
    (one split, fewer than a step, whole steps, a ragged last step) the float64 log-sum-exp mean;
    splits that saw no key lead (the running maximum starts at -inf), the largest LSE comes last
    (earlier sums rescaled by e^-40), rows no split saw get 0 and -inf; the output is a strided
    bf16 view and nothing outside it is written."""
    g = torch.Generator().manual_seed(ns)
    rows, v = 20, 40
    o_part = torch.randn(rows, ns, v, generator=g).to(DEVICE)
    lse_part = (torch.randn(rows, ns, generator=g) * 3).to(DEVICE)
    lead = min(ns - 1, 6)
    lse_part[:5, :lead] = float("-inf")
    o_part[:5, :lead] = float("nan")
    lse_part[5, -1] = 40.0
    lse_part[7] = float("-inf")
    o_part[7] = float("nan")
    store = torch.full((rows, 2 * v), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out, lse = combine(o_part, lse_part, out=store[:, ::2])
    ref_o, ref_l = _lse_mean(o_part.transpose(0, 1), lse_part.transpose(0, 1))
    assert torch.allclose(out.double(), ref_o, atol=2e-2, rtol=1e-2)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_l)) and (out[7] == 0).all()
    assert torch.allclose(lse[~torch.isinf(ref_l)].double(), ref_l[~torch.isinf(ref_l)], atol=1e-5)
    assert torch.isnan(store[:, 1::2].float()).all()


def test_reference_with_a_forced_item_length_covers_every_sequence():
    """``item_blocks`` forces C: every item holds at most C blocks, each sequence is covered once
    in order, and split items get distinct slots (for measuring the estimate against other cuts)."""
    lengths = [0, 1, 64, 65, 4000, 130, 20_000]
    for c in (2, 7, 64, 1024):
        ref = plan_reference(lengths, 256, capacity=20_480, item_blocks=c)
        assert ref["item_blocks"] == c
        live = [it for it in ref["items"] if it[0] >= 0]
        assert all(hi - lo <= c for _, lo, hi, _ in live)
        for b, n in enumerate(lengths):
            mine = sorted((lo, hi) for bb, lo, hi, _ in live if bb == b)
            blocks = -(-n // PLAN_BLOCK)
            assert mine[0][0] == 0 and mine[-1][1] == max(blocks, 0)
            assert all(a[1] == b_[0] for a, b_ in zip(mine, mine[1:]))
        slots = [sl for *_, sl in live if sl >= 0]
        assert len(slots) == len(set(slots)) == ref["slots_used"]
    with pytest.raises(ValueError, match="item_blocks"):
        plan_reference(lengths, 256, capacity=20_480, item_blocks=1)


def test_uniform_plan_is_shared_by_the_lengths_of_one_block():
    """A dense decode step's cache grows by a token per step: the host plan is reused for every t
    of one 64-key block (it depends on t only through its blocks) and differs past it."""
    a, b_, c = (uniform_plan(3, 256, t, sms=132) for t in (4033, 4090, 4096))
    assert a is b_ is c
    ref = plan_reference([4096] * 3, 256, capacity=4096)
    assert a.items.tolist() == [list(it) for it in ref["items"]]
    assert uniform_plan(3, 256, 4097, sms=132).max_blocks == 65 != a.max_blocks


def test_unsplit_sequences_run_longest_first_whatever_the_item_length():
    """A cut that splits nothing (item length far above every sequence) still orders the
    sequences by length: with classes relative to the item length they all fell in the lowest
    class and ran in batch order (measured on an H200: the same items 10 % slower in that order)."""
    lengths = [64 * n for n in (3, 40, 7, 90, 12, 64, 1, 75, 30, 55)]
    ref = plan_reference(lengths, 128, capacity=max(lengths), item_blocks=1000)
    order = [b for b, *_ in ref["items"] if b >= 0]
    assert order == sorted(range(len(lengths)), key=lambda b: -lengths[b])
    _check_longest_first(ref["items"])


def test_item_makespan_in_closed_form():
    """The item plan's busiest SM (units of 1/256 block; ``per_item`` 10, ``per_split`` 100 here):
    one wave is its longest item; a second wave's items (longest first) join the shortest
    first-wave items; short items that would stack on one SM are bounded by the mean load plus the
    second wave's longest; beyond two waves, that bound."""
    from mla_var3.kernel.decode_plan import KindPrice

    pr = KindPrice(fixed=0, per_item=10, per_split=100)
    it = lambda n, split=False: (0, 0, n, 0 if split else -1)
    u = 256
    assert item_makespan([it(2), it(3, True), (-1, -1, -1, -1)], 2, pr) == 3 * u + 110   # the split item
    # two waves on 2 SMs: 8 + 2 and 5 + 4 -> 10 blocks; the bound (19 // 2 + 4) does not bind
    assert item_makespan([it(8), it(5), it(4), it(2)], 2, pr) == max(8 * u + 10 + 2 * u + 10, 5 * u + 10 + 4 * u + 10)
    # one long item and many short ones on 3 SMs: the pairs would put a short item on the long
    # SM's; the bound (the mean load plus the longest second-wave item) wins, under the long item
    items = [it(30), it(2), it(2)] + [it(1)] * 3
    c = [30 * u + 10] + [2 * u + 10] * 2 + [u + 10] * 3
    assert item_makespan(items, 3, pr) == max(c[0], min(c[0] + c[3], sum(c) // 3 + c[3])) == 30 * u + 10
    # three waves on 1 SM: all of it
    assert item_makespan([it(1)] * 3, 1, pr) == max(u + 10, 3 * (u + 10) // 1 + (u + 10))
    assert item_makespan([], 4, pr) == 0


def test_packed_makespan_is_the_widest_program_per_wave():
    """Programs 0 and 1 hold two pieces, one of them split: each priced as its blocks plus
    ``per_item`` (+ ``per_split``); three programs with work on two SMs take two waves."""
    from mla_var3.kernel.decode_plan import KindPrice

    pr = KindPrice(fixed=0, per_item=10, per_split=100)
    items = [(0, 0, 5, 0), (1, 0, 3, -1), (0, 5, 9, 1), (2, 0, 1, -1)]
    assert packed_makespan(items, [0, 2, 3, 4], 3, pr) == 8 * 256 + 20 + 100
    assert packed_makespan(items, [0, 2, 3, 4], 2, pr) == 2 * (8 * 256 + 20 + 100)
    assert kind_estimate(1000, PACKED_PRICE) == PACKED_PRICE.fixed + PACKED_PRICE.block_pct * 1000 // 100
    assert kind_estimate(0, ITEM_PRICE) == ITEM_PRICE.fixed


def test_the_gpu_chooses_the_kind_as_the_reference_on_close_batches():
    """Seeded gated batches (uniform and skewed lengths, s = 1, 2, 4) whose item plans take one
    wave, two, and stacked short items: the device planner's choice (``plan.packed``) and plans
    are the reference's bit for bit, and both kinds are chosen among them."""
    g = torch.Generator().manual_seed(19)
    chosen = set()
    for b, rows, t in [(32, 128, 4096), (48, 128, 4096), (64, 128, 4096), (96, 128, 4096), (16, 256, 8192),
                       (32, 256, 8192), (16, 512, 8192), (64, 128, 8192), (8, 128, 32768)]:
        for skew in (False, True):
            if skew:
                long = torch.rand(b, generator=g) < 0.2
                lengths = torch.where(long, torch.full((b,), t), torch.randint(1, t // 8 + 1, (b,), generator=g))
            else:
                lengths = torch.randint(t // 8, t + 1, (b,), generator=g)
            lengths = lengths.tolist()
            assert packing_may_pay(b, rows, 132)
            plan = plan_decode(torch.tensor(lengths, dtype=torch.int32, device=DEVICE), rows, capacity=t, sms=132)
            ref = auto_reference(lengths, rows, capacity=t, sms=132)
            assert plan.packed.tolist() == [int(ref["packed"])], (b, rows, t, skew)
            assert plan.items.tolist() == [list(x) for x in ref["items"]]
            assert plan.starts.tolist() == ref["starts"]
            chosen.add(ref["packed"])
    assert chosen == {True, False}


def test_a_packed_reference_with_its_own_overhead_is_the_planner_at_that_overhead(monkeypatch):
    """``packed_reference(..., overhead=N)`` lays the plan out as the planner would with
    ``PACK_OVERHEAD = N``, and leaves ``PACK_OVERHEAD`` as it is."""
    import mla_var3.kernel.plan_reference as dp

    lengths = torch.randint(1, 4097, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    mine = packed_reference(lengths, 128, capacity=4096, overhead=6)
    assert dp.PACK_OVERHEAD == 4 and mine != packed_reference(lengths, 128, capacity=4096)
    monkeypatch.setattr(dp, "PACK_OVERHEAD", 6)
    assert mine == packed_reference(lengths, 128, capacity=4096)


class _Event:
    """A stand-in for ``torch.cuda.Event`` (``query`` only), completed by the test."""

    def __init__(self) -> None:
        self.done, self.queries = False, 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


def test_the_kind_reaches_the_host_only_once_its_copy_has_landed():
    """``KindReadback.get`` is None until the copy's event completes (it never waits), then the
    copied flag, kept without asking the event again; ``DecodePlan.known_kind`` passes it on,
    and is None for a plan without one."""
    lengths = torch.tensor([100, 3000], dtype=torch.int32, device=DEVICE)
    for flag, kind in ((1, True), (0, False)):
        event = _Event()
        rb = KindReadback(torch.tensor([flag], dtype=torch.int64), event)
        plan = plan_decode(lengths, 128, capacity=4096, sms=132, readback=False)
        assert plan.kind_readback is None and plan.known_kind() is None
        if DEVICE == "cpu":     # a CPU plan never reads back
            assert plan_decode(lengths, 128, capacity=4096, sms=132).kind_readback is None
        plan = dataclasses.replace(plan, kind_readback=rb)
        assert rb.get() is None and plan.known_kind() is None and event.queries == 2
        event.done = True
        assert plan.known_kind() is kind and rb.get() is kind
        assert event.queries == 3 and rb.event is None
    # a plan whose kind the host fixed has none, whatever it is asked
    fixed = plan_decode(lengths, 128, capacity=4096, packed=True)
    assert fixed.known_kind() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the readback is a CUDA copy")
def test_a_chosen_kind_is_read_back_without_waiting_and_not_during_a_capture():
    """On CUDA a gated plan copies its choice to the host: once the planner has run it is the
    device flag's value; ``readback=False`` makes none, and a capture never uses one."""
    lengths = torch.randint(1024, 8193, (64,), generator=torch.Generator().manual_seed(0), dtype=torch.int32).cuda()
    plan = plan_decode(lengths, 128, capacity=8192)
    assert plan.kind_readback is not None
    torch.cuda.synchronize()
    assert plan.known_kind() is bool(plan.packed.item())
    assert plan_decode(lengths, 128, capacity=8192, readback=False).kind_readback is None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = plan_decode(lengths, 128, capacity=8192)
        assert captured.kind_readback is None and plan.known_kind() is None
    assert plan.known_kind() is bool(plan.packed.item())


@pytest.mark.parametrize("b,rows,t", [(24, 512, 4096), (20, 512, 10240), (32, 128, 4096), (8, 256, 1024)])
def test_a_uniform_plan_built_on_the_device_runs_the_host_plans_items(b, rows, t):
    """Inside a CUDA-graph capture with no kept host plan, a dense call without lengths builds its
    plan on the device with the host's kind (``uniform_packed``): the same items, in the same
    order, as the host plan an eager call runs, so a replay equals the eager call to the bit (an
    item plan where the host packs differed by 1.2e-4 at b = 24, s = 4, t = 4,096 on an H200)."""
    from mla_var3.kernel.decode_plan import build_plan, uniform_packed

    host = uniform_plan(b, rows, t, sms=132)
    packed = uniform_packed(b, rows, t, sms=132)
    assert packed == (host.starts is not None)
    dev = build_plan(None, b, rows, cdiv(t, PLAN_BLOCK) * PLAN_BLOCK, k=512, device=torch.device(DEVICE), sms=132,
                     packed=packed)
    live = lambda items: [tuple(x) for x in items.tolist() if x[0] >= 0]   # noqa: E731
    assert live(dev.items) == live(host.items)
    assert dev.seqs.tolist() == host.seqs.tolist()
    if packed:
        n = host.starts.numel()
        assert dev.starts[:n].tolist() == host.starts.tolist()
        assert set(dev.starts[n:].tolist()) <= {host.starts[-1].item()}     # programs past the host's: empty


@pytest.mark.parametrize("packed", [None, True, False])
@pytest.mark.parametrize("batch,rows,capacity", [(1, 16, 64), (7, 128, 5000), (32, 128, 4096), (128, 2048, 32768)])
def test_a_plan_layout_gives_each_buffer_its_own_aligned_words(batch, rows, capacity, packed):
    """The plan's buffers are views of one int32 allocation: each starts at a 16-byte boundary (the
    kernels are specialised on their pointers' alignment, as a fresh tensor's), none overlaps
    another, all fit, and the int64 estimates sit at even words."""
    from mla_var3.kernel.decode_plan import plan_layout

    lay = plan_layout(batch, rows, capacity, 512, 132, packed, True, 0, True)
    parts = [(lay.items, 4 * lay.size), (lay.seqs, 2 * batch)]
    parts += [] if lay.starts is None else [(lay.starts, lay.programs + 1)]
    parts += [] if lay.est is None else [(lay.est, 4)]
    parts += [] if lay.cest is None else [(lay.cest, 2 * lay.ncand)]
    assert (lay.starts is None) == (lay.programs is None) and (lay.est is None) == (lay.packed is not None)
    spans = sorted((at, at + n) for at, n in parts)
    assert all(at % 4 == 0 for at, _ in spans) and spans[-1][1] <= lay.words
    assert all(a_end <= b_at for (_, a_end), (b_at, _) in zip(spans, spans[1:]))
    assert [launch[0] for launch in lay.launches] == (
        [decode_plan.PACKED_LAUNCH] if lay.packed else
        [decode_plan.CUT_SIM_LAUNCH, decode_plan.PLAN_LAUNCH] + ([decode_plan.PACKED_LAUNCH] if lay.packed is None else []))

"""The decode plan's cut estimate (``analysis/item_cut.py``): its vectorised simulation against a
plain one-cut-at-a-time list schedule written out here, and the choice's rules (ties, fallback)."""

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_var3.analysis import item_cut as ic


def _cdiv(a, b):
    return -(-a // b)


def _schedule(blocks, c_len, slots, tiles, sms, comb, max_items, max_slots):
    """One cut's estimate, item by item: the items in the module's order on a heap of slots (and
    the leftover SMs' slower slot), or the one wave's longest item."""
    counts = [max(1, _cdiv(n, c_len)) for n in blocks]
    n_items, n_split = sum(counts), sum(c for c in counts if c > 1)
    if n_items > max_items or n_split > max_slots:
        return ic.BIG
    if n_items <= slots:
        est = max(_cdiv(n, c) for n, c in zip(blocks, counts)) * ic.UNIT + ic.ITEM_OVERHEAD
    else:
        full = [n // c_len if c > 1 else 0 for n, c in zip(blocks, counts)]
        order = [c_len] * sum(full)
        for b0 in range(0, len(blocks), ic.SORT_BLOCK):
            tile = zip(blocks[b0:b0 + ic.SORT_BLOCK], full[b0:b0 + ic.SORT_BLOCK], counts[b0:b0 + ic.SORT_BLOCK])
            order += sorted((n - f * c_len for n, f, c in tile if c == 1 or n > f * c_len), reverse=True)
        extra = max(0, sms - slots * tiles)
        scale = extra or 1                          # times in units x scale: a slot's item p * scale,
        free = [(0, i) for i in range(slots)]       # the leftover SMs' p * tiles (they are slower)
        slow = 0
        for p in order:
            d = p * ic.UNIT + ic.ITEM_OVERHEAD
            f, i = free[0]
            if extra and slow + d * tiles < f + d * scale:
                slow += d * tiles
            else:
                heapq.heapreplace(free, (f + d * scale, i))
        est = max(max(f for f, _ in free), slow) // scale + ic.LATE_WAVE
    return est + (ic.COMBINE_FIXED + n_split * comb if n_split else 0)


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.integers(0, 300), min_size=1, max_size=150), tiles=st.sampled_from([1, 2, 3, 8, 32]),
       sms=st.sampled_from([132, 7, 40]), spare=st.integers(0, 200))
def test_every_cut_is_estimated_as_its_items_scheduled_one_by_one(blocks, tiles, sms, spare):
    slots = max(1, sms // tiles)
    comb = ic.combine_units(tiles * 64, 512)
    max_items, max_slots = len(blocks) + spare, spare
    est = ic.cut_estimates(blocks, slots, tiles, sms, comb, max_items, max_slots)
    top = min(max(max(blocks), ic.MIN_ITEM_BLOCKS), ic.MAX_ITEM_BLOCKS)
    assert len(est) == top - ic.MIN_ITEM_BLOCKS + 1
    for i, c in enumerate(range(ic.MIN_ITEM_BLOCKS, top + 1)):
        assert est[i] == _schedule(blocks, c, slots, tiles, sms, comb, max_items, max_slots), c


def test_the_cheapest_cut_wins_and_a_tie_goes_to_the_longer_items():
    # 4 sequences of 10 blocks on 8 slots: C = 5..9 all cut each in two near-equal items of 5 (one
    # wave, the same estimate), C = 10 leaves them whole; the tie among 5..9 goes to 9
    est = ic.cut_estimates([10] * 4, 8, 1, 8, 100, 100, 100)
    assert len(set(est[5 - 2:9 - 2 + 1].tolist())) == 1
    assert ic.best_cut([10] * 4, 8, 1, 8, 100, 100, 100) == (int(est[9 - 2]), 9)
    # no split allowed (no partial slots): only the cuts that keep every sequence whole
    assert ic.best_cut([10] * 4, 8, 1, 8, 100, 100, 0)[1] == 10


def test_a_batch_no_cut_fits_falls_back_to_the_longest_sequence():
    assert ic.best_cut([50, 3], 4, 1, 4, 10, 1, 0) == (ic.BIG, 50)
    assert ic.best_cut([5000], 4, 1, 4, 10, 1, 0) == (ic.BIG, ic.MAX_ITEM_BLOCKS)


def test_the_leftover_sms_take_work_only_where_it_ends_sooner():
    # 8 row tiles on 20 SMs: two slots of 8 SMs and one of the 4 left over, at half their speed.
    # Three items of 10 blocks (d each on a slot, 2 d on the slow one): the third would end at 2 d
    # on either, not sooner on the slow slot, so slot 0 takes it
    d = 10 * ic.UNIT + ic.ITEM_OVERHEAD
    assert ic.cut_estimates([10] * 3, 2, 8, 20, 0, 10, 10, 10, 10)[0] == 2 * d + ic.LATE_WAVE
    # five: slots 0, 1, 0, 1 (2 d each), then the slow slot ends the fifth sooner (2 d against 3 d)
    assert ic.cut_estimates([10] * 5, 2, 8, 20, 0, 10, 10, 10, 10)[0] == 2 * d + ic.LATE_WAVE
    # on 16 SMs (none left over) the fifth waits for slot 0
    assert ic.cut_estimates([10] * 5, 2, 8, 16, 0, 10, 10, 10, 10)[0] == 3 * d + ic.LATE_WAVE


@pytest.mark.parametrize("b", [1, 3, 8, 20, 32, 64])
@pytest.mark.parametrize("rows", [16, 128, 512, 2048])
def test_a_uniform_batch_takes_the_kind_the_device_planner_would(b, rows):
    """A dense call without lengths runs the host plan of ``uniform_packs``; the same batch given
    as lengths (the compat call) runs the kind the device planner prices lower (``auto_reference``,
    its oracle): the two entry points run the same kernel kind on the same batch (b = 20, s = 4,
    t = 10,240 ran the item plan at 0.65x FlashMLA from the dense call, packed at 0.91x from the
    compat call)."""
    from mla_var3.kernel.plan_reference import auto_reference, uniform_reference

    for t in (64, 1000, 4096, 10240, 32768):
        if b * max(1, -(-rows // 64)) > 198:
            continue
        assert (uniform_reference(b, rows, t)["starts"] is not None) == auto_reference([t] * b, rows, capacity=t)["packed"]
    assert ic.uniform_packs(20, 160, 8, 132, ic.combine_units(512, 512))

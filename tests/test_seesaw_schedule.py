"""The seesaw kernel's work plan on the host, without a GPU.

The Gluon kernel itself only runs on sm_90 (``tests/test_gluon_schedules.py``). What can be
checked here is the contract around it: :func:`plan_schedule` cuts the (row tile, key block)
units into contiguous program ranges and names the slots of every cut tile; the kernel's piece
enumeration (mirrored below from ``_bound`` / ``_piece`` in the kernel) writes whole tiles to
the output and cut pieces to those slots; :func:`combine_gathered` merges the slots. The
emulation runs the fp32 reference attention per piece, so a wrong slot, a missed unit or a
wrong merge fails against the reference over all keys.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_var3.kernel.combine import combine_gathered
from mla_var3.reference import flash_mla as ref_flash_mla
from mla_var3.testing import assert_close, poisoned

seesaw = pytest.importorskip("mla_var3.kernel.hopper.absorbed_seesaw")
plan_schedule, default_parts = seesaw.plan_schedule, seesaw.default_parts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pieces(plan, c):
    """Program ``c``'s pieces as the kernel walks them: (tile, first block, blocks, slot or None),
    tile = sequence * mt + row tile."""
    m, part = c % plan.mt, c // plan.mt
    lo, hi = plan.bound(part), plan.bound(part + 1)
    nb = plan.n_blocks
    out = []
    for jp, seq in enumerate(range(lo // nb, (hi - 1) // nb + 1)):
        u0, u1 = max(lo, seq * nb), min(hi, seq * nb + nb)
        whole = u1 - u0 == nb
        out.append((seq * plan.mt + m, u0 - seq * nb, u1 - u0, None if whole else 2 * c + (jp > 0)))
    return out


@settings(max_examples=200, deadline=None)
@given(mt=st.integers(1, 5), batches=st.integers(1, 9), n_blocks=st.integers(1, 70), data=st.data())
def test_plan_covers_every_unit_once_and_lists_each_cut(mt, batches, n_blocks, data):
    parts = data.draw(st.integers(1, batches * n_blocks))
    plan = plan_schedule(mt, batches, n_blocks, parts)
    assert plan.programs == mt * parts
    assert plan.bound(0) == 0 and plan.bound(parts) == batches * n_blocks
    sizes = [plan.bound(c + 1) - plan.bound(c) for c in range(parts)]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1          # near-equal ranges
    seen = [0] * (mt * batches * n_blocks)
    cut: dict[int, list[int]] = {}
    for c in range(plan.programs):
        pieces = _pieces(plan, c)
        for k, (tile, blk, n, slot) in enumerate(pieces):
            assert n >= 1
            for u in range(tile * n_blocks + blk, tile * n_blocks + blk + n):
                seen[u] += 1
            if slot is not None:
                assert k in (0, len(pieces) - 1)                      # only a range's ends are cut
                cut.setdefault(tile, []).append(slot)
    assert seen == [1] * (mt * batches * n_blocks)
    assert plan.cut_tiles == tuple(sorted(cut))
    assert plan.cut_slots == tuple(tuple(sorted(cut[t])) for t in plan.cut_tiles)
    assert all(len(s) >= 2 for s in plan.cut_slots)                   # a cut tile has two pieces at least
    assert len(set(s for sl in plan.cut_slots for s in sl)) == sum(map(len, plan.cut_slots))


def test_plan_special_cases():
    assert plan_schedule(32, 32, 64, 4).cut_tiles == ()               # b = 32, s = 16: 4 parts of 8 sequences
    assert plan_schedule(2, 32, 64, 32).cut_tiles == ()               # one part per sequence: nothing cut
    p = plan_schedule(2, 32, 64, 64)                                  # 2 ranges per sequence: every tile cut
    assert p.cut_tiles == tuple(range(64)) and p.cut_slots[0] == (0, 4)   # programs 0 and 2, first pieces
    p = plan_schedule(2, 64, 64, 66)                                  # b = 64, s = 1 over 132 programs
    assert 0 < len(p.cut_tiles) and max(map(len, p.cut_slots)) == 2
    with pytest.raises(ValueError, match="parts"):
        plan_schedule(1, 2, 3, 7)
    with pytest.raises(ValueError, match="row tile"):
        plan_schedule(0, 3, 1, 1)


def test_default_parts():
    assert default_parts(32, 32, 64, sms=132) == 4                    # b = 32, s = 16: 128 persistent programs
    assert default_parts(64, 64, 64, sms=132) == 2                    # b = 64, s = 32
    assert default_parts(2, 64, 64, sms=132) == 64                    # b = 64, s = 1: one wave, one part each
    assert default_parts(2, 1, 64, sms=132) > 1                       # b = 1: split-KV


@pytest.mark.parametrize("b,h,s,t,parts", [
    (2, 16, 3, 200, 5),        # 48 rows (a partial row tile), 4 blocks per sequence, cuts everywhere
    (3, 8, 4, 129, 2),         # 3 sequences of 3 blocks in 2 parts: a sequence cut in the middle
    (1, 64, 2, 300, 4),        # 2 row tiles, 5 blocks, 4 parts: pieces of one and two blocks
    (2, 128, 1, 64, 2),        # whole sequences only
])
def test_kernel_contract_emulated_matches_reference(b, h, s, t, parts):
    """Per piece: the reference attention over the piece's key blocks (with the causal limit of
    the full sequence) into the output or its slot; then combine_gathered over the cut tiles."""
    k, p, bm, bn = 32, 16, seesaw.BLOCK_M, seesaw.BLOCK_N
    g = torch.Generator().manual_seed(1)
    qc, qpe = torch.randn(b, h, s, k, generator=g), torch.randn(b, h, s, p, generator=g)
    z, kpe = torch.randn(b, t, k, generator=g), torch.randn(b, t, p, generator=g)
    scale, causal = 0.3, s > 1
    o_ref, lse_ref = ref_flash_mla(qc, qpe, z, kpe, scale, causal)

    hs, mt, nb = h * s, math.ceil(h * s / bm), math.ceil(t / bn)
    plan = plan_schedule(mt, b, nb, parts)
    out, lse = poisoned((b * hs, k), torch.float32, DEVICE), poisoned((b * hs,), torch.float32, DEVICE)
    slot_o = poisoned((2 * plan.programs, bm, k), torch.float32, DEVICE)
    slot_lse = poisoned((2 * plan.programs, bm), torch.float32, DEVICE)
    qf, qrf = qc.reshape(b, hs, k), qpe.reshape(b, hs, p)
    rows_all = torch.arange(hs)
    for c in range(plan.programs):
        for tile, blk, n, slot in _pieces(plan, c):
            bi, row0 = divmod(tile, mt)
            row0 *= bm
            rows = rows_all[row0:row0 + bm]
            k0, k1 = blk * bn, min(t, (blk + n) * bn)
            sc = (qf[bi, rows] @ z[bi, k0:k1].T + qrf[bi, rows] @ kpe[bi, k0:k1].T) * scale
            keys = torch.arange(k0, k1)
            limit = (t - s + rows % s) if causal else torch.full_like(rows, t - 1)
            sc = sc.masked_fill(keys[None, :] > limit[:, None], float("-inf"))
            piece_lse = torch.logsumexp(sc, dim=-1)
            w = torch.exp(sc - torch.where(piece_lse.isinf(), 0.0, piece_lse)[:, None])
            piece_o = w @ z[bi, k0:k1]
            if slot is None:
                out[bi * hs + rows] = piece_o.to(DEVICE)
                lse[bi * hs + rows] = piece_lse.to(DEVICE)
            else:
                slot_o[slot, :len(rows)] = piece_o.to(DEVICE)
                slot_lse[slot, :len(rows)] = piece_lse.to(DEVICE)
    if plan.cut_tiles:
        combine_gathered(slot_o, slot_lse, *seesaw._cut_tables(plan, hs, torch.device(DEVICE)), out, lse)
    assert_close(out.view(b, h, s, k).cpu(), o_ref, tol=1e-5, name="o_latent")
    assert_close(lse.view(b, h, s).cpu(), lse_ref, tol=1e-5, name="lse")


def test_combine_gathered_against_float64_merge():
    g = torch.Generator().manual_seed(0)
    o_slots = torch.randn(6, 8, 40, generator=g)
    lse_slots = torch.randn(6, 8, generator=g) * 3
    lse_slots[4, 2] = float("-inf")                      # a piece without keys for one row ...
    o_slots[4, 2] = float("nan")                          # ... whose output must be ignored
    table = torch.tensor([[0, 3, 4], [5, 1, -1]], dtype=torch.int32)
    row_base = torch.tensor([2, 20], dtype=torch.int64)
    n_rows = torch.tensor([8, 5], dtype=torch.int32)
    out = torch.full((30, 40), 7.0)
    lse = torch.full((30,), 7.0)
    args = [x.to(DEVICE) for x in (o_slots, lse_slots, table, row_base, n_rows, out, lse)]
    combine_gathered(*args)
    out, lse = args[5].cpu(), args[6].cpu()
    ref_o, ref_l = out.clone().double(), lse.clone().double()
    for grp, (base, n) in enumerate(zip(row_base.tolist(), n_rows.tolist())):
        slots = [x for x in table[grp].tolist() if x >= 0]
        ls = lse_slots[slots, :n].double()                              # [P, n]
        w = torch.softmax(ls, dim=0).nan_to_num(0.0)
        os_ = torch.where(w[..., None] > 0, o_slots[slots, :n].double(), 0.0)
        ref_o[base:base + n] = (w[..., None] * os_).sum(0)
        ref_l[base:base + n] = torch.logsumexp(ls, dim=0)
    assert torch.allclose(out.double(), ref_o, atol=1e-5) and torch.allclose(lse.double(), ref_l, atol=1e-5)
    assert (out[:2] == 7).all() and (out[10:20] == 7).all() and (out[25:] == 7).all()   # other rows untouched


def test_combine_gathered_rejects_bad_input():
    o, l_ = torch.zeros(2, 8, 4), torch.zeros(2, 8)
    t, rb, nr = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="power of two"):
        combine_gathered(torch.zeros(2, 6, 4), torch.zeros(2, 6), t, rb, nr, torch.zeros(6, 4), torch.zeros(6))
    with pytest.raises(ValueError, match="out must be"):
        combine_gathered(o, l_, t, rb, nr, torch.zeros(6, 5), torch.zeros(6))
    with pytest.raises(ValueError, match="float32"):
        combine_gathered(o.half(), l_, t, rb, nr, torch.zeros(6, 4), torch.zeros(6))

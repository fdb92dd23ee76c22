"""The absorbed kernel on a paged latent cache (FlashMLA's layout), against the fp32 reference.

The cache is scattered into a shuffled block table with NaN-filled spare blocks, NaN past each
sequence's last valid token and -1 in unused table entries (``reference.make_paged``), so a
kernel that ignores the table, reads past a length or follows an unused entry fails.
Small widths (K = 64, P = 16) except one DeepSeek-width case, for the interpreter's sake.
"""

import pytest
import torch

from mla_var3 import reference as ref
from mla_var3.kernel.absorbed import FlashMLAConfig, flash_mla_paged
from mla_var3.shapes import MLADims, Problem, get_preset
from mla_var3.testing import assert_close, nan_padded, poisoned

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = MLADims(h=16, d=16, p=16, k=64)


def _paged(dims, b, s, t, lengths, dtype, page, seed=0):
    x = ref.make_inputs(dims, Problem(b=b, s=s, t=t), dtype=dtype, device=DEVICE, seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    cache, table = ref.make_paged(x.z, x.kpe, seqlens, page_block_size=page, seed=seed)
    return x, seqlens, cache, table


def _check(dims, b, s, t, lengths, dtype, causal, page, config=None):
    x, seqlens, cache, table = _paged(dims, b, s, t, lengths, dtype, page)
    out = poisoned((b, dims.h, s, dims.k), dtype, DEVICE)
    qc, qpe = nan_padded(x.qc, {3: 16}), nan_padded(x.qpe, {1: 1})
    o, lse = flash_mla_paged(qc, qpe, nan_padded(cache, {0: 1}), table, seqlens, scale=x.scale, causal=causal,
                             config=config, out=out)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, causal)
    assert_close(o, ro, dtype, name="o_latent")
    assert_close(lse, rl, tol=1e-4, name="lse")


CASES = [  # (b, s, t, lengths, causal, page)
    (1, 1, 64, [64], True, 64),
    (3, 1, 200, [1, 200, 65], True, 64),
    (3, 2, 200, [63, 2, 130], True, 16),
    (3, 5, 130, [130, 64, 5], False, 64),
    (2, 16, 100, [16, 100], True, 32),
    (2, 3, 45, [45, 7], True, 5),        # a page size that is not a power of two
]


@pytest.mark.parametrize("b,s,t,lengths,causal,page", CASES,
                         ids=[f"b{c[0]}-s{c[1]}-t{c[2]}-{'c' if c[4] else 'nc'}-pg{c[5]}" for c in CASES])
def test_paged_matches_reference(b, s, t, lengths, causal, page):
    _check(SMALL, b, s, t, lengths, torch.bfloat16, causal, page)


def test_paged_fp16():
    _check(SMALL, 2, 2, 100, [100, 37], torch.float16, True, 16)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_paged_split_kv(num_splits):
    cfg = FlashMLAConfig(block_m=32, block_n=16, num_warps=4, num_stages=2, num_splits=num_splits)
    _check(SMALL, 3, 2, 150, [150, 2, 77], torch.bfloat16, True, 16, config=cfg)


def test_paged_deepseek_widths():
    _check(get_preset("deepseek-v3").replace(h=8), 2, 2, 100, [100, 70], torch.bfloat16, True, 64)


# ------------------------------------------------------------------------------------------
# bad inputs


def _good():
    x, seqlens, cache, table = _paged(SMALL, 2, 2, 100, [100, 40], torch.bfloat16, 16)
    return dict(qc=x.qc, qpe=x.qpe, kv_cache=cache, block_table=table, seqlens=seqlens, scale=x.scale)


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(kv_cache=a["kv_cache"][:, :, 0]), r"kv_cache must be \[NB, PAGE, 1, 80\].*3-d"),
    (lambda a: a.update(kv_cache=a["kv_cache"][..., :72]), r"kv_cache must be .*80"),
    (lambda a: a.update(kv_cache=a["kv_cache"].expand(-1, -1, 2, -1)), r"kv_cache must be"),
    (lambda a: a.update(kv_cache=a["kv_cache"].half()), r"kv_cache must have dtype"),
    (lambda a: a.update(block_table=a["block_table"].long()), r"block_table must have dtype in \(int32\)"),
    (lambda a: a.update(block_table=a["block_table"][:1]), r"block_table must be \[B, MAXB\]"),
    (lambda a: a["block_table"].__setitem__((0, 0), 10_000), r"block_table entries .* \[0, num_blocks"),
    (lambda a: a["block_table"].__setitem__((1, 1), -1), r"block_table entries"),
    (lambda a: a.update(seqlens=None), r"seqlens \[B\] int32 is required"),
    (lambda a: a.update(seqlens=torch.tensor([100, 113], dtype=torch.int32, device=DEVICE)), r"seqlens must lie in"),
    (lambda a: a.update(seqlens=torch.tensor([100, 1], dtype=torch.int32, device=DEVICE)), r"seqlens must lie in"),
    (lambda a: a.update(block_table=torch.empty((2, 1), dtype=torch.int32, device="meta")), r"block_table is on meta"),
    (lambda a: a.update(qc=a["qc"][:, :, :1]), r"qpe must be .*S mismatch"),
], ids=["rank", "width", "heads-k", "dtype", "table-dtype", "table-batch", "table-range", "table-neg",
        "no-seqlens", "seqlens-gt-t", "seqlens-lt-s", "device", "s-mismatch"])
def test_bad_inputs(change, match, monkeypatch):
    monkeypatch.setenv("MLA_VAR3_CHECK", "1")   # value checks on CUDA inputs (always on the CPU)
    args = _good()
    change(args)
    with pytest.raises(ValueError, match=match):
        flash_mla_paged(**args)


def test_s_greater_than_table():
    x, seqlens, cache, table = _paged(SMALL, 1, 1, 16, [16], torch.bfloat16, 16)
    qc = torch.zeros(1, SMALL.h, 17, SMALL.k, dtype=torch.bfloat16, device=DEVICE)
    qpe = torch.zeros(1, SMALL.h, 17, SMALL.p, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"S=17 query tokens.*T=16"):
        flash_mla_paged(qc, qpe, cache, table, seqlens, scale=x.scale)


# ------------------------------------------------------------------------------------------
# block tables of any strides, garbage past the lengths, empty sequences and batches


def _table_views(table: torch.Tensor) -> dict:
    """The same entries with other strides: column-major, every other column of a wider table,
    every other row of a taller one, a transposed store."""
    b, m = table.shape
    wide = torch.full((b, 2 * m), -7, dtype=table.dtype, device=table.device)
    wide[:, ::2] = table
    tall = torch.full((2 * b, m), -7, dtype=table.dtype, device=table.device)
    tall[::2] = table
    return {"col-major": table.t().contiguous().t(), "every-other-col": wide[:, ::2], "every-other-row": tall[::2],
            "transposed-store": table.t().clone().t()}


@pytest.mark.parametrize("view", ["col-major", "every-other-col", "every-other-row", "transposed-store"])
def test_block_table_strides_are_honoured(view):
    x, seqlens, cache, table = _paged(SMALL, 3, 2, 200, [200, 2, 77], torch.bfloat16, 16)
    tab = _table_views(table)[view]
    assert tab.stride() != table.stride() or view == "transposed-store"
    o, lse = flash_mla_paged(x.qc, x.qpe, cache, tab, seqlens, scale=x.scale, causal=True)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    assert_close(o, ro, torch.bfloat16, name="o_latent")
    assert_close(lse, rl, tol=1e-4, name="lse")


def test_garbage_past_each_sequence_is_never_read():
    x, seqlens, cache, table = _paged(SMALL, 3, 1, 200, [200, 1, 70], torch.bfloat16, 16)
    bad = table.clone()
    for b, n in enumerate([200, 1, 70]):
        bad[b, -(-n // 16):] = torch.tensor([2 ** 30, -5, 123456, -(2 ** 31)], dtype=torch.int32).repeat(20)[
            : bad.shape[1] - (-(-n // 16))]
    o, lse = flash_mla_paged(x.qc, x.qpe, cache, bad, seqlens, scale=x.scale, causal=True)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    assert_close(o, ro, torch.bfloat16, name="o_latent")


def test_empty_sequence_gives_zero_and_plus_inf_like_flashmla():
    x, seqlens, cache, table = _paged(SMALL, 2, 2, 100, [0, 50], torch.bfloat16, 16)
    o, lse = flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale=x.scale, causal=True)
    assert (o[0] == 0).all() and torch.isposinf(lse[0]).all()
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    assert torch.isposinf(rl[0]).all()
    assert_close(o[1], ro[1], torch.bfloat16, name="o_latent")


def test_empty_batch_with_seqlens():
    z = torch.zeros(0, SMALL.h, 1, SMALL.k, dtype=torch.bfloat16, device=DEVICE)
    zp = torch.zeros(0, SMALL.h, 1, SMALL.p, dtype=torch.bfloat16, device=DEVICE)
    cache = torch.zeros(4, 16, 1, SMALL.k + SMALL.p, dtype=torch.bfloat16, device=DEVICE)
    table = torch.zeros(0, 3, dtype=torch.int32, device=DEVICE)
    seqlens = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    o, lse = flash_mla_paged(z, zp, cache, table, seqlens, scale=0.1)
    assert o.shape == (0, SMALL.h, 1, SMALL.k) and lse.shape == (0, SMALL.h, 1)


def test_overlapping_out_is_refused():
    args = _good()
    out = torch.empty(1, 1, 1, SMALL.k, dtype=torch.bfloat16, device=DEVICE).expand(2, SMALL.h, 2, SMALL.k)
    with pytest.raises(ValueError, match="out has overlapping elements"):
        flash_mla_paged(**args, out=out)


@pytest.mark.parametrize("packed", [True, None])
def test_packed_plans_cover_every_key_once(packed):
    """A packed plan (each program's share of the batch's blocks, sequences split at program
    boundaries, here over 3 SMs) run by the portable kernel, item by item: the same attention."""
    from mla_var3.kernel.decode_plan import plan_decode

    lengths = [0, 70, 500, 2, 64, 65, 129, 300]
    x, seqlens, cache, table = _paged(SMALL, len(lengths), 2, 512, lengths, torch.bfloat16, 64)
    plan = plan_decode(seqlens, SMALL.h * 2, capacity=table.shape[1] * 64, k=SMALL.k, sms=3, packed=packed)
    if packed:                                            # something is split at a program boundary
        assert plan.starts is not None and int(plan.seqs[:, 1].max()) > 1
    o, lse = flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale=x.scale, causal=True, plan=plan)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    assert_close(o, ro, torch.bfloat16, name="o_latent")
    assert_close(lse, rl, tol=1e-4, name="lse")

"""The fp32 references: the three designs agree, and each matches a naive per-query loop."""

import math

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.shapes import MLADims, Problem

DIMS = MLADims(h=5, d=16, p=8, k=32, name="tiny")


def naive_attention(q, kk, vv, scale, visible):
    """Loop over queries: q [S, E], kk [T, E], vv [T, F], visible [S, T] -> out [S, F], lse [S]."""
    outs, lses = [], []
    for i in range(q.shape[0]):
        keys = visible[i].nonzero().flatten()
        sc = (kk[keys] @ q[i]) * scale
        lse = torch.logsumexp(sc, 0)
        outs.append(torch.softmax(sc, 0) @ vv[keys])
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s,t", [(1, 1), (1, 7), (3, 3), (4, 9)])
def test_flash_mla_matches_loop(s, t, causal):
    x = R.make_inputs(DIMS, Problem(b=2, s=s, t=t), dtype=torch.float64, seed=s * 31 + t)
    o, lse = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, causal)
    for b in range(2):
        for h in range(DIMS.h):
            j = torch.arange(t)
            vis = torch.ones(s, t, dtype=torch.bool)
            if causal:
                vis = j[None, :] <= (t - s + torch.arange(s)[:, None])
            q = torch.cat([x.qc[b, h], x.qpe[b, h]], -1)
            kk = torch.cat([x.z[b], x.kpe[b]], -1)
            ref_o, ref_l = naive_attention(q, kk, x.z[b], x.scale, vis)
            torch.testing.assert_close(o[b, h], ref_o, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(lse[b, h], ref_l, rtol=1e-12, atol=1e-12)


def test_causal_rule_last_query_sees_everything_first_sees_t_minus_s():
    mask = R.key_mask(1, 4, 10, True, None, "cpu")[0, 0]
    assert mask.sum(-1).tolist() == [7, 8, 9, 10]
    ragged = R.key_mask(2, 2, 10, True, torch.tensor([10, 5]), "cpu")[:, 0]
    assert ragged[1].sum(-1).tolist() == [4, 5]
    assert not ragged[1, :, 5:].any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s,t,n", [(1, 9, 0), (1, 9, 9), (3, 9, 3), (3, 9, 1), (4, 9, 5), (2, 2, 1)])
def test_three_designs_agree(s, t, n, causal):
    x = R.make_inputs(DIMS, Problem(b=2, s=s, t=t, n=n), dtype=torch.float64, seed=t + n)
    o_fa, lse_fa = R.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, x.scale, causal)
    o_lat, lse_mla = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, causal)
    o_mla = R.decompress(o_lat, x.w_uv)
    o_new, o_old, lse_h = R.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, x.scale, causal)
    o_h = R.decompress(o_old, x.w_uv, o_new)
    for out in (o_mla, o_h):
        torch.testing.assert_close(out, o_fa, rtol=1e-10, atol=1e-10)
    for lse in (lse_mla, lse_h):
        torch.testing.assert_close(lse, lse_fa, rtol=1e-10, atol=1e-10)


def test_seqlens_ignore_keys_past_length():
    x = R.make_inputs(DIMS, Problem(b=2, s=2, t=12), dtype=torch.float64)
    seqlens = torch.tensor([12, 6], dtype=torch.int32)
    o, lse = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, True, seqlens)
    o_short, lse_short = R.flash_mla(x.qc[1:], x.qpe[1:], x.z[1:, :6], x.kpe[1:, :6], x.scale, True)
    torch.testing.assert_close(o[1:], o_short)
    torch.testing.assert_close(lse[1:], lse_short)
    z_poison = x.z.clone()
    z_poison[1, 6:] = float("nan")
    o_p, _ = R.flash_mla(x.qc, x.qpe, z_poison, x.kpe, x.scale, True, seqlens)
    assert torch.isfinite(o_p).all()


@pytest.mark.parametrize("page", [4, 64])
def test_paged_equals_dense(page):
    x = R.make_inputs(DIMS, Problem(b=3, s=2, t=11), dtype=torch.float64)
    seqlens = torch.tensor([11, 2, 7], dtype=torch.int32)
    cache, table = R.make_paged(x.z, x.kpe, seqlens, page_block_size=page)
    assert table.shape == (3, math.ceil(11 / page))
    o, lse = R.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    o_d, lse_d = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, True, seqlens)
    torch.testing.assert_close(o, o_d)
    torch.testing.assert_close(lse, lse_d)


def test_absorption_identities():
    x = R.make_inputs(DIMS, Problem(b=1, s=2, t=5), dtype=torch.float64)
    # score identity: q . k_h == qc . z
    lhs = torch.einsum("bhsd,bthd->bhst", x.q, x.k)
    rhs = torch.einsum("bhsk,btk->bhst", x.qc, x.z)
    torch.testing.assert_close(lhs, rhs)
    # value identity: p V == (p Z) W_UV
    p = torch.softmax(torch.randn(1, DIMS.h, 2, 5, dtype=torch.float64), -1)
    torch.testing.assert_close(torch.einsum("bhst,bthd->bhsd", p, x.v),
                               R.decompress(torch.einsum("bhst,btk->bhsk", p, x.z), x.w_uv))


def test_float32_inputs_return_float32():
    x = R.make_inputs(DIMS, Problem(b=1, s=1, t=3), dtype=torch.bfloat16)
    o, lse = R.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32

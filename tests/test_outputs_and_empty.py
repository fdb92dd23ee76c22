"""Outputs and edge batches of every kernel entry point: an ``out=`` buffer whose elements overlap
(a stride-0 ``expand`` view) is refused by name, because a kernel writing it races with itself;
an empty batch with ``seqlens`` returns empty outputs."""

import pytest
import torch

from mla_var3 import decompress, flash_attention, flash_mla, flash_mla_paged, mla_var6_plus
from mla_var3 import reference as ref
from mla_var3.shapes import MLADims, Problem

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIMS = MLADims(h=4, d=16, p=16, k=32)
BF = torch.bfloat16


def _x(b=2, s=2, t=40, n=8):
    return ref.make_inputs(DIMS, Problem(b=b, s=s, t=t, n=n), dtype=BF, device=DEVICE, seed=1)


def _overlapping(*shape):
    return torch.empty(*([1] * (len(shape) - 1)), shape[-1], dtype=BF, device=DEVICE).expand(*shape)


CALLS = {
    "flash_mla": lambda x, o: flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=x.scale, out=o),
    "flash_attention": lambda x, o: flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, scale=x.scale, out=o),
    "mla_var6_plus.out": lambda x, o: mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new,
                                                     scale=x.scale, out=o),
    "mla_var6_plus.out_latent": lambda x, o: mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new,
                                                            scale=x.scale, out_latent=o),
    "decompress": lambda x, o: decompress(x.qc, x.w_uv, out=o),
}
SHAPES = {"flash_mla": (2, 4, 2, 32), "flash_attention": (2, 4, 2, 16), "mla_var6_plus.out": (2, 4, 2, 16),
          "mla_var6_plus.out_latent": (2, 4, 2, 32), "decompress": (2, 4, 2, 16)}


@pytest.mark.parametrize("name", list(CALLS))
def test_overlapping_out_is_refused(name):
    x = _x()
    with pytest.raises(ValueError, match="overlapping elements"):
        CALLS[name](x, _overlapping(*SHAPES[name]))


def test_strided_out_that_does_not_overlap_is_accepted():
    x = _x()
    buf = torch.full((2, 2, 4, 32), float("nan"), dtype=BF, device=DEVICE)
    o, _ = flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=x.scale, out=buf.transpose(1, 2))
    ro, _ = ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale)
    assert not buf.isnan().any() and torch.allclose(o.float(), ro.float(), atol=3e-2, rtol=3e-2)


def test_empty_batch_with_seqlens():
    x = _x(b=1)
    e = lambda t: t[:0]
    seqlens = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    o, lse = flash_mla(e(x.qc), e(x.qpe), e(x.z), e(x.kpe), scale=x.scale, seqlens=seqlens)
    assert o.shape[0] == 0 and lse.shape[0] == 0
    o, lse = flash_attention(e(x.q), e(x.qpe), e(x.k), e(x.v), e(x.kpe), scale=x.scale, seqlens=seqlens)
    assert o.shape[0] == 0 and lse.shape[0] == 0
    cache = torch.zeros(2, 16, 1, DIMS.k + DIMS.p, dtype=BF, device=DEVICE)
    table = torch.zeros(0, 3, dtype=torch.int32, device=DEVICE)
    o, lse = flash_mla_paged(e(x.qc), e(x.qpe), cache, table, seqlens, scale=x.scale)
    assert o.shape[0] == 0 and lse.shape[0] == 0

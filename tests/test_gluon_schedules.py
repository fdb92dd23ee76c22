"""Every schedule of the Hopper Gluon absorbed kernel against the fp32 reference, on an sm_90 GPU.

Gluon does not run under the Triton interpreter: these tests are skipped without a Hopper GPU
(the CPU suite compiles the kernels for sm_90 in ``test_gluon_compile.py``). The shapes are the
edge cases of the kernels' tiling: one key, odd and even key-block counts (the seesaw pairs
blocks), ragged last blocks, a partial row block (h * s = 60), causal s > 1, forced split-KV with
ragged ranges, b = 1, and both half-precision dtypes. The allocator is filled with NaN first, so
an output element a kernel never writes reads back as NaN and fails the comparison.
"""

import pytest
import torch

from mla_var3 import reference as R
from mla_var3.testing import LSE_TOLERANCE, assert_close

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs a Hopper (sm_90) GPU")

gluon = pytest.importorskip("mla_var3.kernel.hopper.absorbed_gluon")
if not gluon.GLUON_AVAILABLE:
    pytest.skip(f"gluon unavailable: {gluon.GLUON_IMPORT_ERROR}", allow_module_level=True)

K, P = 512, 64
# (b, h, s, t, causal, num_splits)
SHAPES = [
    (1, 128, 1, 1, False, None),        # one key, one block (the seesaw's Y buffer holds a copy)
    (3, 128, 1, 129, True, None),       # 3 blocks: an odd count, ragged last block
    (2, 128, 4, 200, True, None),       # 4 blocks, causal s > 1
    (2, 20, 3, 131, True, None),        # h * s = 60 rows: a partial row block
    (1, 128, 16, 4096, True, None),     # b = 1, speculative length
    (2, 128, 2, 777, True, 5),          # forced split: 13 blocks in ranges of 3 (odd)
    (4, 128, 1, 4096, False, 4),        # split, not causal
]


def _poison_allocator(nbytes: int = 1 << 28) -> None:
    x = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda sh: "b{}-h{}-s{}-t{}-c{}-ns{}".format(*sh))
@pytest.mark.parametrize("schedule", gluon.SCHEDULES)
def test_schedule_matches_reference(schedule, shape, dtype):
    b, h, s, t, causal, ns = shape
    g = torch.Generator(device="cuda").manual_seed(b * 1000 + t)
    qc = (torch.randn(b, h, s, K, generator=g, device="cuda") * 0.5).to(dtype)
    qpe = torch.randn(b, h, s, P, generator=g, device="cuda").to(dtype)
    z = torch.randn(b, t, K, generator=g, device="cuda").to(dtype)
    kpe = torch.randn(b, t, P, generator=g, device="cuda").to(dtype)
    scale = (128 + P) ** -0.5
    _poison_allocator()
    o, lse = gluon.flash_mla_gluon(qc, qpe, z, kpe, scale=scale, causal=causal, num_splits=ns, schedule=schedule)
    ref_o, ref_lse = R.flash_mla(qc, qpe, z, kpe, scale, causal)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert_close(o, ref_o, dtype, name="o_latent")
    assert_close(lse, ref_lse, tol=LSE_TOLERANCE[dtype], name="lse")


def test_unknown_schedule_is_rejected():
    x = torch.zeros(1, 128, 1, K, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="schedule"):
        gluon.flash_mla_gluon(x, x[..., :P], x[:, 0], x[:, 0, :, :P], scale=0.1, schedule="fastest")

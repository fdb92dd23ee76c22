"""The FlashMLA-compatible entry point: FlashMLA's dense decode call shapes, defaults and mask.

q [b, s_q, h_q, 576] and a paged k_cache [num_blocks, page_block_size, 1, 576] (DeepSeek widths,
fewer heads for the interpreter's sake) against the fp32 reference; out [b, s_q, h_q, 512],
softmax_lse [b, h_q, s_q]; scale default 1/sqrt(576); the causal mask aligned bottom-right.
"""

import pytest
import torch

from mla_var3 import reference as ref
from mla_var3.compat import MLASchedMeta, flash_mla_with_kvcache, get_mla_metadata
from mla_var3.shapes import Problem, get_preset
from mla_var3.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIMS = get_preset("deepseek-v3").replace(h=16)
K, P = DIMS.k, DIMS.p


def _case(b, s_q, t, lengths, dtype=torch.bfloat16, page=64, seed=0):
    x = ref.make_inputs(DIMS, Problem(b=b, s=s_q, t=t), dtype=dtype, device=DEVICE, seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    cache, table = ref.make_paged(x.z, x.kpe, seqlens, page_block_size=page, seed=seed)
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()      # [b, s_q, h_q, 576]
    return x, q, cache, table, seqlens


@pytest.mark.parametrize("b,s_q,t,lengths,causal", [
    (1, 1, 64, [64], False),
    (3, 1, 130, [1, 130, 65], False),
    (2, 2, 100, [100, 37], True),
    (2, 4, 70, [70, 4], True),
    (2, 3, 70, [70, 30], False),
])
def test_matches_reference(b, s_q, t, lengths, causal):
    x, q, cache, table, seqlens = _case(b, s_q, t, lengths)
    sched, none = get_mla_metadata(seqlens, s_q * DIMS.h, 1)      # the old interface's arguments are ignored
    assert none is None
    out, lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, sched, causal=causal)
    assert out.shape == (b, s_q, DIMS.h, K) and out.dtype == q.dtype
    assert lse.shape == (b, DIMS.h, s_q) and lse.dtype == torch.float32
    scale = (K + P) ** -0.5                                           # FlashMLA's default: 1/sqrt(576)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale, causal)
    assert_close(out, ro.transpose(1, 2), torch.bfloat16, name="out")
    assert_close(lse, rl, tol=1e-4, name="softmax_lse")


def test_explicit_scale_and_fp16():
    x, q, cache, table, seqlens = _case(2, 2, 80, [80, 33], dtype=torch.float16)
    out, lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, None, softmax_scale=0.05, causal=True)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, 0.05, True)
    assert_close(out, ro.transpose(1, 2), torch.float16)
    assert_close(lse, rl, tol=1e-4)


def test_metadata_reuse_must_match():
    x, q, cache, table, seqlens = _case(1, 1, 16, [16])
    sched, _ = get_mla_metadata()
    assert isinstance(sched, MLASchedMeta) and not sched.have_initialized
    flash_mla_with_kvcache(q, cache, table, seqlens, K, sched)
    assert sched.have_initialized
    flash_mla_with_kvcache(q, cache, table, seqlens, K, sched)            # same configuration: fine
    with pytest.raises(ValueError, match="tile_scheduler_metadata was built for"):
        flash_mla_with_kvcache(q, cache, table, seqlens, K, sched, causal=True)


@pytest.mark.parametrize("kwargs,name", [
    (dict(is_fp8_kvcache=True), "is_fp8_kvcache"),
    (dict(indices=torch.zeros(1, 1, 8, dtype=torch.int32)), "indices"),
    (dict(attn_sink=torch.zeros(16)), "attn_sink"),
    (dict(extra_k_cache=torch.zeros(1)), "extra_k_cache"),
    (dict(topk_length=torch.zeros(1, dtype=torch.int32)), "topk_length"),
])
def test_unsupported_options(kwargs, name):
    x, q, cache, table, seqlens = _case(1, 1, 16, [16])
    with pytest.raises(NotImplementedError, match=name):
        flash_mla_with_kvcache(q, cache, table, seqlens, K, None, **kwargs)


@pytest.mark.parametrize("change,match", [
    (lambda a: a.update(q=a["q"][0]), r"q must be \[b, s_q, h_q, D\]"),
    (lambda a: a.update(k_cache=a["k_cache"][..., :512]), r"k_cache must be .*D mismatch"),
    (lambda a: a.update(k_cache=a["k_cache"].expand(-1, -1, 2, -1)), r"num_heads_k = 1"),
    (lambda a: a.update(head_dim_v=576), r"head_dim_v must lie in"),
    (lambda a: a.update(head_dim_v=500), r"power of two"),
    (lambda a: a.update(num_splits=4), r"num_splits must be None"),
    (lambda a: a.update(block_table=None), r"block_table and cache_seqlens are required"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"] + 100), r"seqlens must lie in"),
    (lambda a: a.update(tile_scheduler_metadata=torch.zeros(4)), r"tile_scheduler_metadata must come from"),
    (lambda a: a.update(q=a["q"].float()), r"dtype"),
])
def test_bad_inputs(change, match):
    x, q, cache, table, seqlens = _case(1, 1, 16, [16])
    args = dict(q=q, k_cache=cache, block_table=table, cache_seqlens=seqlens, head_dim_v=K,
                tile_scheduler_metadata=None)
    change(args)
    with pytest.raises(ValueError, match=match):
        flash_mla_with_kvcache(**args)

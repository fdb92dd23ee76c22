"""Serving-shaped decode on sm_90 (skipped elsewhere): the seesaw kernel over paged and ragged
caches against the fp32 reference, CUDA-graph capture of the decode entry points with replays on
changed contents, and the repeat path of a call made again with the same buffers.

Caches come from ``reference.make_paged``: pages in random order, NaN in unused pages and past
each sequence's length, -1 in unused table entries; DeepSeek widths (K = 512, P = 64, h = 128).
"""

import pytest
import torch

from mla_var3 import flash_mla, flash_mla_paged
from mla_var3 import reference as ref
from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
from mla_var3.kernel import backends
from mla_var3.shapes import MLADims, Problem
from mla_var3.testing import assert_close

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and backends.gluon_hopper(torch.device("cuda"))),
                                reason="needs a Hopper (sm_90) GPU with Gluon")
DIMS = MLADims(h=128, d=128, p=64, k=512)


@pytest.fixture(autouse=True)
def _no_value_checks(monkeypatch):
    """The serving path as engines run it: no host synchronisation (capturable, repeatable)."""
    monkeypatch.delenv("MLA_VAR3_CHECK", raising=False)
BF = torch.bfloat16


def _paged(lengths, s, t, seed=0):
    x = ref.make_inputs(DIMS, Problem(b=len(lengths), s=s, t=t), dtype=BF, device="cuda", seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cache, table = ref.make_paged(x.z, x.kpe, seqlens, page_block_size=64, seed=seed)
    # FlashMLA's query layout [b, s, h, 576]
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    return x, q, cache, table, seqlens


CASES = [([1, 63, 4096], 1), ([64, 65, 2, 3000], 2), ([4, 4096], 4), ([16, 100, 700, 64, 129], 16),
         ([0, 5, 64, 0, 1000, 2, 65, 4096], 1), ([4096] * 32, 1), ([32 + 97 * i for i in range(16)], 32)]


@pytest.mark.parametrize("lengths,s", CASES, ids=[f"b{len(c[0])}-s{c[1]}" for c in CASES])
@pytest.mark.parametrize("causal", [True, False])
def test_compat_paged_matches_reference(lengths, s, causal):
    x, q, cache, table, seqlens = _paged(lengths, s, 4096)
    meta, _ = get_mla_metadata()
    o, lse = flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, softmax_scale=x.scale, causal=causal)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, causal)
    assert o.shape == (len(lengths), s, 128, 512)
    assert_close(o.transpose(1, 2), ro, BF, name="out")
    assert_close(lse, rl, tol=1e-4, name="lse")


#: (lengths, s, SMs the plan fills): a plan for a few SMs makes each packed program walk many
#: items — empty and one-block sequences, sequences split across programs
PACKED_CASES = [([0, 70, 5000, 1, 64, 65, 129, 3000], 2, 4), ([4096] * 3, 1, 5), ([1] * 40, 1, 132),
                ([777, 0, 0, 64], 4, 3), ([6000, 100, 2500, 40, 9000, 1], 1, 132), ([300] * 64, 8, 132)]


@pytest.mark.parametrize("lengths,s,sms", PACKED_CASES, ids=[f"b{len(c[0])}-s{c[1]}-sms{c[2]}" for c in PACKED_CASES])
@pytest.mark.parametrize("packed", [True, None])
def test_packed_plans_match_reference(lengths, s, sms, packed):
    """The persistent kernel on packed plans (and on the planner's own choice), every program
    running its items in turn."""
    from mla_var3.kernel.decode_plan import plan_decode

    x, q, cache, table, seqlens = _paged(lengths, s, max(max(lengths), 64), seed=3)
    plan = plan_decode(seqlens, 128 * s, capacity=table.shape[1] * 64, sms=sms, packed=packed)
    o, lse = flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, scale=x.scale, causal=True, plan=plan)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    assert_close(o, ro, BF, name="out")
    assert_close(lse, rl, tol=1e-4, name="lse")


@pytest.mark.parametrize("view", ["col-major", "every-other-col"])
def test_paged_table_strides(view):
    x, q, cache, table, seqlens = _paged([70, 300, 1, 2000], 2, 2048)
    wide = torch.full((4, 2 * table.shape[1]), -3, dtype=torch.int32, device="cuda")
    wide[:, ::2] = table
    tab = table.t().contiguous().t() if view == "col-major" else wide[:, ::2]
    o, lse = flash_mla_paged(x.qc, x.qpe, cache, tab, seqlens, scale=x.scale, causal=True)
    ro, rl = ref.flash_mla_paged(x.qc, x.qpe, cache, table, seqlens, x.scale, True)
    assert_close(o, ro, BF, name="out")


@pytest.mark.parametrize("lens", [[1000, 1, 64, 999], None])
def test_dense_ragged_and_strided_out(lens):
    b, t = 4, 1000
    x = ref.make_inputs(DIMS, Problem(b=b, s=2, t=t), dtype=BF, device="cuda", seed=3)
    seqlens = None
    z, kpe = x.z.clone(), x.kpe.clone()
    if lens is not None:
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        for i, n in enumerate(lens):
            z[i, n:] = float("nan")
            kpe[i, n:] = float("nan")
    out = torch.full((b, 2, 128, 512), float("nan"), dtype=BF, device="cuda").transpose(1, 2)
    o, lse = flash_mla(x.qc, x.qpe, z, kpe, scale=x.scale, causal=True, seqlens=seqlens, out=out)
    ro, rl = ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, x.scale, True, seqlens)
    assert_close(out, ro, BF, name="out")
    assert_close(lse, rl, tol=1e-4, name="lse")


@pytest.mark.parametrize("s", [1, 4])
def test_compat_captured_in_a_cuda_graph(s):
    """The plan is built inside the capture; a replay after the lengths, pages and queries change
    gives the eager result on the new contents."""
    lens_a, lens_b = [100, 4000, 1, 2048, 65, 3000, 64, 500], [4096, 3, 1000, 64, 2000, 1, 129, 4000]
    x, q, cache, table, seqlens = _paged(lens_a, s, 4096, seed=1)
    x2, q2, cache2, table2, seqlens2 = _paged(lens_b, s, 4096, seed=2)
    n = min(cache.shape[0], cache2.shape[0])
    cache, cache2 = cache[:n].clone(), torch.nan_to_num(cache2[:n])
    table2 = torch.where(table2 >= 0, table2.clamp_max(n - 1), table2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_mla_with_kvcache(q, cache, table, seqlens, 512, get_mla_metadata()[0], softmax_scale=x.scale, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g, lse_g = flash_mla_with_kvcache(q, cache, table, seqlens, 512, get_mla_metadata()[0],
                                              softmax_scale=x.scale, causal=True)
    for dst, src in ((q, q2), (cache, cache2), (table, table2), (seqlens, seqlens2)):
        dst.copy_(src)
    graph.replay()
    eager = flash_mla_with_kvcache(q, cache, table, seqlens, 512, get_mla_metadata()[0], softmax_scale=x.scale,
                                   causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out_g, eager[0]) and torch.equal(lse_g, eager[1])
    qt = q.transpose(1, 2)
    ro, rl = ref.flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, x.scale, True)
    assert_close(out_g.transpose(1, 2), ro, BF, name="out")


def _seesaw_launches(fn) -> int:
    """How many seesaw kernels one call of ``fn`` runs (the profiler's CUDA kernel records)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "seesaw" in e.name)


@pytest.mark.parametrize("b,t", [(64, 8192), (32, 4096)], ids=["packs", "items"])
def test_a_landed_plan_kind_launches_the_chosen_kernel_alone(b, t):
    """A plan whose kind the GPU chose, run eagerly by a decode step's layers: while its choice
    is on its way to the host a call launches both seesaw kernels; once it has landed, one (the
    chosen kind's). Either way the result is the reference's, on NaN-poisoned pages and new
    queries. A call captured in a CUDA graph with that plan leaves the choice to the GPU and
    replays right."""
    import dataclasses
    import random
    from types import SimpleNamespace

    from mla_var3.kernel.decode_plan import KindReadback, auto_reference, plan_decode

    rnd = random.Random(0)
    lengths = [rnd.randint(t // 8, t) for _ in range(b)]
    want = auto_reference(lengths, 128, capacity=t, sms=torch.cuda.get_device_properties(0).multi_processor_count)
    x, q, cache, table, seqlens = _paged(lengths, 1, t, seed=5)
    qt = q.transpose(1, 2)
    plan = plan_decode(seqlens, 128, capacity=table.shape[1] * 64)
    on_its_way = dataclasses.replace(plan, kind_readback=KindReadback(torch.zeros(1, dtype=torch.int64),
                                                                      SimpleNamespace(query=lambda: False)))

    def call(pl=plan):
        return flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, scale=x.scale, plan=pl)

    def check(o, lse):
        ro, rl = ref.flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, x.scale, True)
        assert_close(o, ro, BF, name="out")
        assert_close(lse, rl, tol=1e-4, name="lse")

    for _ in range(3):                           # the first call, the ordinary repeat, bound launches
        assert _seesaw_launches(lambda: call(on_its_way)) == 2
        check(*call(on_its_way))
    torch.cuda.synchronize()
    assert plan.known_kind() is want["packed"] is bool(plan.packed.item())
    for i in range(4):
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(i)).to(BF))
        assert _seesaw_launches(call) == 1
        check(*call())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g, lse_g = call()
    q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(BF))
    graph.replay()
    torch.cuda.synchronize()
    check(out_g, lse_g)
    assert _seesaw_launches(call) == 1           # eager again after the capture


def test_dense_and_paged_captured_in_a_cuda_graph():
    x = ref.make_inputs(DIMS, Problem(b=8, s=2, t=2048), dtype=BF, device="cuda", seed=4)
    args = [x.qc.clone(), x.qpe.clone(), x.z.clone(), x.kpe.clone()]
    flash_mla(*args, scale=x.scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, l_g = flash_mla(*args, scale=x.scale)
    y = ref.make_inputs(DIMS, Problem(b=8, s=2, t=2048), dtype=BF, device="cuda", seed=5)
    for dst, src in zip(args, (y.qc, y.qpe, y.z, y.kpe)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, flash_mla(*args, scale=x.scale)[0])
    # paged, lengths on the device: the plan is rebuilt by each replay
    _, q, cache, table, seqlens = _paged([300, 4096, 7], 1, 4096, seed=6)
    qt = q.transpose(1, 2)
    flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, scale=x.scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, l_g = flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, scale=x.scale)
    seqlens.copy_(torch.tensor([250, 1, 3], dtype=torch.int32))      # within each sequence's pages
    graph.replay()
    torch.cuda.synchronize()
    ro, rl = ref.flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, x.scale, True)
    assert_close(o_g, ro, BF, name="out")


def test_a_repeated_call_follows_the_new_contents():
    """The third call of the same buffers takes the repeat path; it must read the buffers' new
    contents, lengths included (the plan is rebuilt per call without a caller's plan)."""
    x, q, cache, table, seqlens = _paged([300, 4096, 7], 1, 4096, seed=7)
    qt = q.transpose(1, 2)
    for _ in range(3):
        flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, scale=x.scale)
    seqlens.copy_(torch.tensor([200, 64, 1], dtype=torch.int32))     # within each sequence's pages
    q.copy_(torch.randn_like(q, dtype=torch.float32).to(BF))
    o, lse = flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, scale=x.scale)
    ro, rl = ref.flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, x.scale, True)
    assert_close(o, ro, BF, name="out")
    assert_close(lse, rl, tol=1e-4, name="lse")


@pytest.mark.parametrize("s", [1, 4])
def test_bound_repeats_of_a_decode_step(s):
    """A step's later layers (the same buffers, the step's plan): from the fourth call on, the
    kernel and the combine run as bound launches. Each call gets fresh outputs holding its own
    result, follows the buffers' new contents, and a call on another stream re-binds."""
    x, q, cache, table, seqlens = _paged([300, 4096, 7, 1000], s, 4096, seed=11)
    meta, _ = get_mla_metadata()
    qt = q.transpose(1, 2)

    def call():
        return flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, softmax_scale=x.scale, causal=True)

    def check(o, lse):
        ro, rl = ref.flash_mla_paged(qt[..., :512], qt[..., 512:], cache, table, seqlens, x.scale, True)
        assert o.shape == (4, s, 128, 512) and o.is_contiguous()
        assert_close(o.transpose(1, 2), ro, BF, name="out")
        assert_close(lse, rl, tol=1e-4, name="lse")

    for _ in range(4):
        check(*call())
    kept = [], []
    for i in range(3):   # bound calls, each on new queries; every output keeps its own result
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(i)).to(BF))
        o, lse = call()
        kept[0].append((q.clone(), o, lse))
    for qi, o, lse in kept[0]:
        q.copy_(qi)
        check(o, lse)
    seqlens.copy_(torch.tensor([64, 1, 7, 999], dtype=torch.int32))    # same plan object: lengths the plan was
    meta2, _ = get_mla_metadata()                                       # not built for need a new one
    o, lse = flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta2, softmax_scale=x.scale, causal=True)
    check(o, lse)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        results = [flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta2, softmax_scale=x.scale, causal=True)
                   for _ in range(4)]
    torch.cuda.current_stream().wait_stream(side)
    for o, lse in results:
        check(o, lse)
    # the dense call's repeats (uniform: the plan is cached per shape)
    z, kpe = x.z, x.kpe
    first = None
    for i in range(5):
        o, lse = flash_mla(x.qc, x.qpe, z, kpe, scale=x.scale, causal=True)
        first = first if first is not None else (o.clone(), lse.clone())
    ro, rl = ref.flash_mla(x.qc, x.qpe, z, kpe, x.scale, True)
    assert_close(o, ro, BF, name="dense out")
    assert torch.equal(o, first[0]) and torch.equal(lse, first[1])


# ------------------------------------------------------------------------------------------
# the engine's entry point and the layer, captured


def _latent_and_paged(b, t, lengths, seed):
    from mla_var3.model.cache import LatentCache, PagedLatentCache

    x = ref.make_inputs(DIMS, Problem(b=b, s=1, t=t), dtype=BF, device="cuda", seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    latent = LatentCache(x.z, x.kpe, seqlens)
    return latent, PagedLatentCache.from_latent(latent, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["latent", "paged"])
def test_mla_attention_captured_in_a_cuda_graph(kind):
    from mla_var3.model import mla_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    latent, paged = _latent_and_paged(4, 1024, [1024, 70, 513, 1], 8)
    cache = latent if kind == "latent" else paged
    w_uk = (torch.randn(128, 128, 512, device="cuda", generator=g) * 0.05).to(BF)   # no grad: inference
    w_uv = (torch.randn(128, 512, 128, device="cuda", generator=g) * 0.05).to(BF)
    q_nope = torch.randn(4, 128, 1, 128, device="cuda", generator=g).to(BF)
    q_pe = torch.randn(4, 128, 1, 64, device="cuda", generator=g).to(BF)
    scale = 192 ** -0.5
    eager, _ = mla_attention(q_nope, q_pe, cache, w_uk, w_uv, scale=scale, design="absorbed")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, _ = mla_attention(q_nope, q_pe, cache, w_uk, w_uv, scale=scale, design="absorbed")
    q_nope.copy_(torch.randn(4, 128, 1, 128, device="cuda", generator=g).to(BF))
    graph.replay()
    torch.cuda.synchronize()
    again, _ = mla_attention(q_nope, q_pe, cache, w_uk, w_uv, scale=scale, design="absorbed")
    assert torch.equal(o_g, again) and not torch.equal(o_g, eager)


@pytest.mark.parametrize("s", [1, 4])
def test_layer_decode_step_on_a_paged_cache_captured(s):
    """The host reserves blocks (outside the graph); the captured step appends in place, attends
    and projects; a replay on new hidden states gives the eager step's output."""
    from mla_var3.model import MLAConfig, MLALayer
    from mla_var3.model.cache import PagedLatentCache

    cfg = MLAConfig.from_preset("deepseek-v3").replace(hidden=1024)
    layer = MLALayer.random(cfg, dtype=BF, device="cuda", seed=0).requires_grad_(False)   # inference
    layer.backend = "kernel"
    g = torch.Generator(device="cuda").manual_seed(1)
    b, t0 = 3, 300
    x0 = torch.randn(b, t0, cfg.hidden, device="cuda", generator=g).to(BF)
    pos0 = torch.arange(t0, device="cuda").expand(b, t0)
    empty = PagedLatentCache.empty(b, cfg.k, cfg.p, dtype=BF, device="cuda")
    _, cache = layer(x0, pos0, cache=empty, mode="absorbed")
    cache = cache.reserve(s)
    x = torch.randn(b, s, cfg.hidden, device="cuda", generator=g).to(BF)
    pos = (t0 + torch.arange(s, device="cuda")).expand(b, s).contiguous()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x, pos, cache=cache, mode="absorbed")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g, new_cache = layer(x, pos, cache=cache, mode="absorbed")
    x.copy_(torch.randn(b, s, cfg.hidden, device="cuda", generator=g).to(BF))
    graph.replay()
    torch.cuda.synchronize()
    eager, eager_cache = layer(x, pos, cache=cache, mode="absorbed")
    assert torch.equal(out_g, eager)
    assert new_cache.seqlens.tolist() == [t0 + s] * b == eager_cache.seqlens.tolist()

"""Every decode entry point captured in a CUDA graph the way engines capture it (sm_90; skipped
elsewhere), and FlashMLA's dense-decoding grid through the drop-in.

Capture matrix: entry points (``compat.flash_mla_with_kvcache``, ``flash_mla`` dense and ragged,
``flash_mla_paged``, ``mla_attention`` over latent and paged caches, the enabled transformers
model's decode step) x shapes (s in {1, 2, 4}, b in {1, 8, 32, 128}, heads in {16, 32, 64, 128},
each value present) x three ways of capturing:

* ``inside``: the metadata (or decode object) first used inside the capture; after it the
  queries, the caches *and the lengths* change, and the replay plans the new lengths;
* ``warm``: a metadata used by 20 eager calls before the capture (an engine's warm-up); after
  it the queries and caches change (the plan is the captured one, FlashMLA's rule);
* ``layers``: two layers (their own queries and caches, one block table and lengths) sharing one
  metadata inside one capture; contents and lengths change.

Each replay must equal the eager result of the same inputs and the fp32 reference. Caches come
from ``reference.make_paged``: pages in random order, NaN in unused pages and past each length.

Conformance: FlashMLA's published dense-decoding grid (b in {1, 2, 6, 64}, s_q in {1, 2, 4},
s_k in {20, 140, 4096}, h_q in {1, 3, 9, 63, 64, 126, 128}, varlen, causal; batches of 128 with
empty sequences), a seeded sample holding every h_q and corner, run with the default device and
dtype set as that suite sets them, under ``torch.inference_mode``, at its tolerances (out: abs
8e-4 or rel 2.01/128 per element and cos-diff 5e-6; lse: abs 1e-6 or rel 8.01/65536); a cache
with several KV heads is refused with a clear ValueError.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from mla_var3 import reference as ref
from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
from mla_var3.kernel import backends
from mla_var3.kernel.absorbed import flash_mla, flash_mla_paged
from mla_var3.kernel.decode import AbsorbedDecode
from mla_var3.shapes import MLADims, Problem
from mla_var3.testing import assert_close

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and backends.gluon_hopper(torch.device("cuda"))),
                                reason="needs a Hopper (sm_90) GPU with Gluon")
BF = torch.bfloat16
K, P = 512, 64


@pytest.fixture(autouse=True)
def _no_value_checks(monkeypatch):
    monkeypatch.delenv("MLA_VAR3_CHECK", raising=False)


#: (b, s, heads): every b, s and head count of the matrix at least once
SHAPES = [(1, 1, 128), (8, 2, 16), (32, 4, 64), (128, 1, 16), (8, 4, 128), (32, 1, 32), (128, 2, 64), (1, 4, 32),
          (32, 2, 128)]
MODES = ["inside", "warm", "layers"]


def _lengths(b: int, s: int, t: int, rnd: random.Random) -> list[int]:
    return [rnd.randint(max(s, t // 8), t) for _ in range(b)]


def _layer(b, s, h, t, lengths, seed):
    dims = MLADims(h=h, d=128, p=P, k=K)
    x = ref.make_inputs(dims, Problem(b=b, s=s, t=t), dtype=BF, device="cuda", seed=seed)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cache, table = ref.make_paged(x.z, x.kpe, seqlens, page_block_size=64, seed=seed)
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()      # FlashMLA's [b, s, h, 576]
    return x, q, cache, table, seqlens


def _refill(q, cache, seed):
    """New queries and cache contents in place (the NaN past each length stays NaN)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q.copy_((torch.randn(q.shape, generator=g, device="cuda") / 4).to(BF))
    fresh = (torch.randn(cache.shape, generator=g, device="cuda") / 4).to(BF)
    cache.copy_(torch.where(torch.isnan(cache), cache, fresh))


def _shorter(seqlens, s, seed):
    """New lengths within each sequence's pages (at least s; 0 stays 0)."""
    rnd = random.Random(seed)
    return torch.tensor([0 if n == 0 else rnd.randint(s, n) for n in seqlens.tolist()], dtype=torch.int32,
                        device="cuda")


def _capture(fn):
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def _check_compat(out, lse, q, cache, table, seqlens, scale):
    qt = q.transpose(1, 2)
    eager, eager_lse = flash_mla_with_kvcache(q, cache, table, seqlens, K, get_mla_metadata()[0],
                                              softmax_scale=scale, causal=True)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    torch.testing.assert_close(lse, eager_lse, rtol=0, atol=0)
    ro, rl = ref.flash_mla_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, scale, True)
    assert_close(out.transpose(1, 2), ro, BF, name="out")
    assert_close(lse, rl, tol=1e-4, name="lse")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b,s,h", SHAPES, ids=[f"b{b}-s{s}-h{h}" for b, s, h in SHAPES])
def test_compat_capture_matrix(b, s, h, mode):
    rnd = random.Random(b * 1000 + s * 10 + h)
    x, q, cache, table, seqlens = _layer(b, s, h, 1024, _lengths(b, s, 1024, rnd), seed=1)
    layers = [(q, cache), (q.clone(), cache.clone())]      # a second layer: its own queries and latents
    _refill(*layers[1], seed=2)
    meta, _ = get_mla_metadata()

    def call(q, cache):
        return flash_mla_with_kvcache(q, cache, table, seqlens, K, meta, softmax_scale=x.scale, causal=True)

    if mode == "warm":
        for _ in range(20):
            call(q, cache)
    graph, outs = _capture(lambda: [call(*lay) for lay in (layers if mode == "layers" else layers[:1])])
    for i, lay in enumerate(layers[: len(outs)]):
        _refill(*lay, seed=10 + i)
    if mode != "warm":
        seqlens.copy_(_shorter(seqlens, s, seed=3))
    graph.replay()
    torch.cuda.synchronize()
    for (out, lse), (q_l, cache_l) in zip(outs, layers):
        _check_compat(out, lse, q_l, cache_l, table, seqlens, x.scale)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "uniform"])
@pytest.mark.parametrize("b,s,h,t", [(8, 2, 128, 1024), (32, 1, 16, 1024), (1, 4, 64, 1024), (24, 4, 128, 4096)],
                         ids=["b8-s2-h128", "b32-s1-h16", "b1-s4-h64", "b24-s4-h128-t4096"])
def test_dense_and_paged_decode_objects_capture_matrix(b, s, h, t, ragged, mode):
    """``flash_mla`` (dense; ragged through ``seqlens``) and ``flash_mla_paged`` with a caller's
    :class:`AbsorbedDecode` (the plan/run object), captured three ways. b = 24, s = 4, t = 4,096
    uniform: the dense call's host plan is the packed kind (a6efe19)."""
    from mla_var3.kernel.plan_reference import uniform_reference

    assert (uniform_reference(b, h * s, t)["starts"] is not None) == (t == 4096)
    rnd = random.Random(b + s + h)
    lengths = _lengths(b, s, t, rnd) if ragged else [t] * b
    x, q, cache, table, seqlens = _layer(b, s, h, t, lengths, seed=4)
    qt = q.transpose(1, 2)
    z, kpe = x.z.clone(), x.kpe.clone()
    dense_lengths = seqlens if ragged else None
    dec_dense, dec_paged = AbsorbedDecode("cuda"), AbsorbedDecode("cuda")

    def calls():
        return [flash_mla(qt[..., :K], qt[..., K:], z, kpe, scale=x.scale, seqlens=dense_lengths, decode=dec_dense),
                flash_mla_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, scale=x.scale, decode=dec_paged)]

    if mode == "warm":
        for _ in range(20):
            calls()
    graph, outs = _capture(calls if mode != "layers" else lambda: calls() + calls())
    _refill(q, cache, seed=21)
    z.copy_(torch.randn_like(z, dtype=torch.float32).to(BF) / 4)
    if mode != "warm" and ragged:
        seqlens.copy_(_shorter(seqlens, s, seed=5))
    graph.replay()
    torch.cuda.synchronize()
    want_dense = flash_mla(qt[..., :K], qt[..., K:], z, kpe, scale=x.scale, seqlens=dense_lengths)
    want_paged = flash_mla_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, scale=x.scale)
    for i, (o, lse) in enumerate(outs):
        want = want_dense if i % 2 == 0 else want_paged
        torch.testing.assert_close(o, want[0], rtol=0, atol=0)
        torch.testing.assert_close(lse, want[1], rtol=0, atol=0)
    ro, _ = ref.flash_mla(qt[..., :K], qt[..., K:], z, kpe, x.scale, True, seqlens=dense_lengths)
    assert_close(outs[0][0], ro, BF, name="dense out")
    ro, _ = ref.flash_mla_paged(qt[..., :K], qt[..., K:], cache, table, seqlens, x.scale, True)
    assert_close(outs[1][0], ro, BF, name="paged out")


@pytest.mark.parametrize("kind", ["latent", "paged"])
@pytest.mark.parametrize("mode", ["inside", "warm"])
def test_mla_attention_with_a_callers_state_captured(kind, mode):
    """``mla_attention`` with an :class:`AttentionState` (its dispatcher and decode state), over
    a latent and a paged cache, captured after warm-up or on first use."""
    from mla_var3.model import AttentionState, mla_attention
    from mla_var3.model.cache import LatentCache, PagedLatentCache

    b, s, h, t = 8, 2, 32, 700
    dims = MLADims(h=h, d=128, p=P, k=K)
    x = ref.make_inputs(dims, Problem(b=b, s=s, t=t), dtype=BF, device="cuda", seed=8)
    lengths = torch.tensor(_lengths(b, s, t, random.Random(8)), dtype=torch.int32, device="cuda")
    latent = LatentCache(x.z, x.kpe, lengths)
    cache = latent if kind == "latent" else PagedLatentCache.from_latent(latent, generator=torch.Generator()
                                                                          .manual_seed(8))
    q_nope, q_pe = x.q.clone(), x.qpe.clone()
    state = AttentionState()

    def call():
        return mla_attention(q_nope, q_pe, cache, x.w_uk, x.w_uv, scale=x.scale, design="absorbed", state=state)[0]

    if mode == "warm":
        for _ in range(20):
            call()
    graph, out = _capture(call)
    q_nope.copy_(torch.randn_like(q_nope, dtype=torch.float32).to(BF))
    graph.replay()
    torch.cuda.synchronize()
    want = mla_attention(q_nope, q_pe, cache, x.w_uk, x.w_uv, scale=x.scale, design="absorbed")[0]
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def _tiny_deepseek(layers=2, heads=16):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=512, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=256, kv_lora_rank=K,
        qk_nope_head_dim=128, qk_rope_head_dim=P, v_head_dim=128, first_k_dense_replace=layers,
        n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(cfg).to("cuda", BF).eval()


def _decode_state(model, b=4, prompt=40, room=16):
    """An enabled paged model after a prompt, each layer's cache with room for ``room`` tokens."""
    from mla_var3.integrations.transformers import enable

    enable(model, paged=True)
    ids = torch.randint(0, 256, (b, prompt), device="cuda")
    with torch.inference_mode():
        out = model(ids, use_cache=True)
    cache = out.past_key_values
    for slot in cache.layers:
        slot.state = slot.state.reserve(room)
    return cache, out.logits[:, -1:].argmax(-1)


def test_enabled_model_decode_step_never_synchronises():
    """Issue: the enabled model could not be captured (a host read of the mask in every
    forward). With ``torch.cuda.set_sync_debug_mode("error")`` around each attention module's
    forward, an eager decode step over the paged cache raises nothing."""
    model = _tiny_deepseek()
    cache, token = _decode_state(model)
    from mla_var3.integrations.transformers import MLAAttention

    modules = [m for m in model.modules() if isinstance(m, MLAAttention)]
    hooks = [m.register_forward_pre_hook(lambda *a: torch.cuda.set_sync_debug_mode("error")) for m in modules]
    hooks += [m.register_forward_hook(lambda *a: torch.cuda.set_sync_debug_mode("default")) for m in modules]
    try:
        with torch.inference_mode():
            model(token, past_key_values=cache, use_cache=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        for hk in hooks:
            hk.remove()


def test_enabled_model_decode_step_captured():
    """The documented way (``docs/engine-integration.md``): reserve room in each layer's paged
    cache, capture one decode step whose lengths are written back into the captured containers,
    replay it; the replays' logits equal eager decode steps from the same state."""
    model = _tiny_deepseek()
    cache, first = _decode_state(model)
    base = [slot.state for slot in cache.layers]
    seen = [slot.seen for slot in cache.layers]
    start = [st.seqlens.clone() for st in base]
    token = first.clone()
    logits_buf = []

    def restore():
        for slot, st, n in zip(cache.layers, base, seen):
            slot.state, slot.seen = st, n

    def step():
        restore()
        logits = model(token, past_key_values=cache, use_cache=True).logits
        for slot, st in zip(cache.layers, base):
            st.seqlens.copy_(slot.state.seqlens)
        restore()
        token.copy_(logits[:, -1:].argmax(-1))
        return logits

    with torch.inference_mode():
        for _ in range(3):                                   # warm-up, then back to the start
            step()
        for st, s0 in zip(base, start):
            st.seqlens.copy_(s0)
        token.copy_(first)
        graph, logits_g = _capture(step)
        for st, s0 in zip(base, start):
            st.seqlens.copy_(s0)
        token.copy_(first)
        for _ in range(3):
            graph.replay()
            logits_buf.append(logits_g.clone())
        torch.cuda.synchronize()
        for st, s0 in zip(base, start):                     # the same steps eagerly
            st.seqlens.copy_(s0)
        token.copy_(first)
        for i in range(3):
            eager = step()
            torch.testing.assert_close(logits_buf[i], eager, rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------------------------------
# conformance with FlashMLA's dense-decoding grid


def _flashmla_case(b, s_q, s_k, h_q, varlen, zero_lengths, seed):
    """The grid's inputs as that suite draws them: lengths around s_k (normal, sd s_k / 2, at
    least s_q), some zero; q and a paged cache of N(0, 0.1) clamped to [-1, 1]; pages in random
    order; NaN past each length; out-of-range block ids past each sequence."""
    rnd = random.Random(seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    lengths = [max(int(rnd.normalvariate(s_k, s_k / 2)), s_q) if varlen else s_k for _ in range(b)]
    if zero_lengths:
        keep = torch.randn(b, generator=g) > 0
        lengths = [0 if keep[i] else n for i, n in enumerate(lengths)]
    pad = math.ceil(max(lengths) / 256) * 256
    nblk = pad // 64
    table = torch.randperm(b * nblk, generator=g).to(torch.int32).view(b, nblk)
    q = (torch.randn(b, s_q, h_q, K + P, generator=g) / 10).clamp(-1, 1).to(BF)      # the inputs as bf16, as the
    cache = (torch.randn(b * nblk, 64, 1, K + P, generator=g) / 10).clamp(-1, 1).to(BF)   # suite draws them
    for i, n in enumerate(lengths):
        used = math.ceil(n / 64)
        cache[table[i, used:].long()] = float("nan")
        if n % 64:
            cache[table[i, used - 1].long(), n % 64:] = float("nan")
        table[i, used:] = 2147480000
    return q, cache, table, torch.tensor(lengths, dtype=torch.int32)


def _flashmla_reference(q, cache, table, lengths, causal):
    """FlashMLA's reference semantics in fp32: scale 1/sqrt(576), a bottom-right causal mask,
    an empty sequence's output 0 and LSE +inf."""
    b, s_q, h_q, d = q.shape
    q, cache, table = q.cuda(), cache.cuda(), table.cuda()
    out = torch.empty(b, s_q, h_q, K, device="cuda")
    lse = torch.empty(b, h_q, s_q, device="cuda")
    for i, n in enumerate(lengths.tolist()):
        kv = cache[table[i, : math.ceil(n / 64)].long()].reshape(-1, d)[:n].float()
        qi = q[i].transpose(0, 1).float()                                  # [h, s_q, d]
        w = qi @ kv.T
        if causal and s_q > 1:
            mask = torch.ones(s_q, n, dtype=torch.bool, device="cuda").tril(diagonal=n - s_q)
            w = w.masked_fill(~mask, float("-inf"))
        w = w / math.sqrt(d)
        li = w.logsumexp(-1)
        oi = torch.softmax(w, -1) @ kv[:, :K] if n else torch.zeros(h_q, s_q, K, device="cuda")
        lonely = li == float("-inf")
        oi[lonely] = 0.0
        li[lonely] = float("inf")
        out[i] = oi.transpose(0, 1)
        lse[i] = li
    return out.cpu(), lse.cpu()


def _allclose(ans, want, abs_tol, rel_tol, cos_tol=None) -> str:
    """FlashMLA's acceptance rule: the same infinities and NaNs, then per element abs or rel
    error under its tolerance, and the cosine difference under ``cos_tol``. '' when it holds."""
    ans, want = ans.float().clone(), want.float().clone()
    for val in (float("inf"), float("-inf")):
        if not torch.equal(ans == val, want == val):
            return f"{val} mismatch"
        ans[ans == val], want[want == val] = 0.0, 0.0
    if not torch.equal(torch.isnan(ans), torch.isnan(want)):
        return "NaN mismatch"
    ans, want = torch.nan_to_num(ans), torch.nan_to_num(want)
    err = (ans - want).abs()
    rel = err / (want.abs() + 1e-6)
    ok = (err < abs_tol) | (rel < rel_tol)
    if not bool(ok.all()):
        return f"{int((~ok).sum())} elements off, max abs {float(err.max()):.3g}"
    if cos_tol is not None and float((want.double() ** 2).sum()) >= 1e-12:
        a, w = ans.double(), want.double()
        cos = 1 - 2 * float((a * w).sum()) / float((a * a + w * w).sum())
        if cos > cos_tol:
            return f"cos diff {cos:.3g}"
    return ""


def _conformance_cases():
    grid = [(b, s_q, s_k, h_q, varlen, causal, False) for b in (1, 2, 6, 64) for s_q in (1, 2, 4)
            for s_k in (20, 140, 4096) for h_q in (1, 3, 9, 63, 64, 126, 128) for varlen in (False, True)
            for causal in (False, True)]
    rnd = random.Random(2024)
    sample = rnd.sample(grid, 48)
    for h_q in (1, 3, 9, 63, 64, 126, 128):               # every head count, at the grid's largest batch
        sample.append((64, rnd.choice((1, 2, 4)), rnd.choice((20, 140, 4096)), h_q, True, True, False))
    corners = [(128, 2, 4096, h_q, True, causal, True) for h_q in (1, 64, 128) for causal in (False, True)]
    return sample + corners


@pytest.mark.parametrize("case", _conformance_cases(), ids=lambda c: "b{}-sq{}-sk{}-h{}-{}{}{}".format(
    c[0], c[1], c[2], c[3], "var" if c[4] else "fix", "-causal" if c[5] else "", "-zeros" if c[6] else ""))
def test_flashmla_dense_grid_through_the_drop_in(case):
    b, s_q, s_k, h_q, varlen, causal, zeros = case
    q, cache, table, lengths = _flashmla_case(b, s_q, s_k, h_q, varlen, zeros, seed=hash(case) % 10_000)
    want_out, want_lse = _flashmla_reference(q, cache, table, lengths, causal)
    before = torch.get_default_dtype()
    torch.set_default_dtype(BF)
    torch.set_default_device("cuda")
    try:
        with torch.inference_mode():
            meta, splits = get_mla_metadata()
            out, lse = flash_mla_with_kvcache(q.to("cuda", BF), cache.to("cuda", BF), table.cuda(), lengths.cuda(),
                                              K, meta, splits, causal=causal)
    finally:
        torch.set_default_device(None)
        torch.set_default_dtype(before)
    assert out.dtype == BF and lse.dtype == torch.float32
    why = _allclose(out.cpu(), want_out.to(BF), 8e-4, 2.01 / 128, 5e-6)
    assert not why, f"out: {why}"
    why = _allclose(lse.cpu(), want_lse, 1e-6, 8.01 / 65536)
    assert not why, f"lse: {why}"


@pytest.mark.parametrize("h_kv", [2, 8])
def test_several_kv_heads_are_refused(h_kv):
    q = torch.zeros(2, 1, 8, K + P, dtype=BF, device="cuda")
    cache = torch.zeros(4, 64, h_kv, K + P, dtype=BF, device="cuda")
    with pytest.raises(ValueError, match="num_heads_k = 1"):
        flash_mla_with_kvcache(q, cache, torch.zeros(2, 2, dtype=torch.int32, device="cuda"),
                               torch.full((2,), 64, dtype=torch.int32, device="cuda"), K, None)

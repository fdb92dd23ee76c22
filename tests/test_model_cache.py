"""Cache containers: bytes equal the memory model exactly; appends put tokens at each
sequence's own offset; the hybrid's window moves; the paged layout round-trips."""

from __future__ import annotations

import pytest
import torch

from mla_var3.model import HybridCache, LatentCache, MLAConfig, PagedLatentCache, absorbed_weights
from mla_var3.shapes import preset_names

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def dims_for(cfg: MLAConfig, dtype: torch.dtype):
    return cfg.dims.replace(w=torch.empty((), dtype=dtype).element_size())


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def weights(cfg, dtype=torch.float64):
    w = rand(cfg.h * 2 * cfg.d, cfg.k, dtype=dtype, seed=99)
    return absorbed_weights(w, cfg.h, cfg.d, cfg.dv)


def latent(cfg, b, t, dtype=torch.float64, seed=0):
    return LatentCache(rand(b, t, cfg.k, dtype=dtype, seed=seed), rand(b, t, cfg.p, dtype=dtype, seed=seed + 1))


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_match_memory_model(preset, dtype):
    from mla_var3.analysis.memory import (expanded_cache_bytes, hybrid_cache_bytes, mla_cache_bytes,
                                          paged_cache_bytes)

    cfg = MLAConfig.from_preset(preset).scaled(div=8, h=4)
    dims = dims_for(cfg, dtype)
    b, t = 3, 70
    lat = latent(cfg, b, t, dtype)
    assert lat.nbytes == mla_cache_bytes(dims, b, t)
    w = weights(cfg, dtype)
    assert lat.to_expanded(w.w_uk, w.w_uv).nbytes == expanded_cache_bytes(dims, b, t)
    for n in (0, 1, 16, t, t + 5):
        for keep in (True, False):
            hyb = HybridCache.from_latent(lat, n, w.w_uk, w.w_uv, keep_latent_window=keep)
            n_eff = min(n, t)
            assert hyb.nbytes == hybrid_cache_bytes(dims, b, t - n_eff, n_eff, keep_latent_window=keep), (n, keep)
    paged = PagedLatentCache.from_latent(lat)
    assert paged.num_blocks == b * 2                         # 70 tokens -> 2 blocks of 64 per sequence
    assert paged.nbytes == paged_cache_bytes(dims, paged.num_blocks)
    pool = PagedLatentCache.empty(b, cfg.k, cfg.p, num_blocks=10, dtype=dtype)
    assert pool.nbytes == paged_cache_bytes(dims, 10)


def test_bytes_at_full_size_deepseek_v3():
    """The layer-size numbers of the memory model, on a DeepSeek-V3 bf16 latent of 1 x 64 tokens."""
    from mla_var3.analysis.memory import mla_cache_bytes, paged_cache_bytes

    cfg = MLAConfig.from_preset("deepseek-v3")
    lat = LatentCache.empty(1, cfg.k, cfg.p, dtype=torch.bfloat16).append(
        torch.zeros(1, 64, cfg.k, dtype=torch.bfloat16), torch.zeros(1, 64, cfg.p, dtype=torch.bfloat16))
    assert lat.nbytes == mla_cache_bytes(cfg.dims, 1, 64) == 64 * 576 * 2
    assert PagedLatentCache.from_latent(lat).nbytes == paged_cache_bytes(cfg.dims, 1)


def test_latent_append_ragged():
    cfg = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)
    cache = LatentCache.stack([latent(cfg, 1, 3, seed=1), latent(cfg, 1, 5, seed=2), latent(cfg, 1, 1, seed=3)])
    assert cache.seqlens.tolist() == [3, 5, 1] and cache.z.shape == (3, 5, 8)
    assert torch.all(cache.z[0, 3:] == 0) and torch.all(cache.z[2, 1:] == 0)
    z_new, kpe_new = rand(3, 2, 8, seed=7), rand(3, 2, 4, seed=8)
    grown = cache.append(z_new, kpe_new)
    assert grown.seqlens.tolist() == [5, 7, 3] and grown.z.shape == (3, 7, 8)
    for b, L in enumerate([3, 5, 1]):
        assert torch.equal(grown.z[b, :L], cache.z[b, :L])
        assert torch.equal(grown.z[b, L:L + 2], z_new[b]) and torch.equal(grown.kpe[b, L:L + 2], kpe_new[b])
        assert torch.all(grown.z[b, L + 2:] == 0)
    assert cache.seqlens.tolist() == [3, 5, 1]               # the old container is unchanged
    assert torch.equal(grown.sequence(2).z[0], grown.z[2, :3])


def test_expanded_matches_latent_expansion():
    cfg = MLAConfig(hidden=16, h=3, d=4, p=4, k=8, dv=4)
    w = weights(cfg)
    lat = latent(cfg, 2, 4)
    exp = lat.to_expanded(w.w_uk, w.w_uv)
    torch.testing.assert_close(exp.k[1, 2, 0], w.w_uk[0] @ lat.z[1, 2])      # k[b,t,h] = w_uk[h] @ z[b,t]
    torch.testing.assert_close(exp.v[0, 3, 2], lat.z[0, 3] @ w.w_uv[2])      # v[b,t,h] = z[b,t] @ w_uv[h]
    z_new, kpe_new = rand(2, 1, 8, seed=5), rand(2, 1, 4, seed=6)
    new = LatentCache(z_new, kpe_new).to_expanded(w.w_uk, w.w_uv)
    step = exp.append(new.k, new.v, kpe_new)
    ref = lat.append(z_new, kpe_new).to_expanded(w.w_uk, w.w_uv)
    for name in ("k", "v", "kpe", "seqlens"):
        torch.testing.assert_close(getattr(step, name), getattr(ref, name), msg=name)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("n", [0, 2, 5, 50])
@pytest.mark.parametrize("steps", [(3, 1, 1), (1, 4, 2), (6,)])
def test_hybrid_append_equals_split_of_latent(n, steps, keep):
    """Growing a hybrid cache token by token gives the same tensors as splitting the grown
    latent cache at n; the oldest window tokens move to the latent part."""
    cfg = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)
    w = weights(cfg)
    total = sum(steps)
    full = LatentCache.stack([latent(cfg, 1, total, seed=1), latent(cfg, 1, total, seed=2)])
    hyb = HybridCache.empty(2, cfg.h, cfg.d, cfg.k, cfg.p, n, keep_latent_window=keep, dtype=torch.float64)
    t = 0
    for s in steps:
        z, kpe = full.z[:, t:t + s], full.kpe[:, t:t + s]
        part = LatentCache(z, kpe).to_expanded(w.w_uk, w.w_uv)
        evicts = not keep and n < t + s and min(n, t) > 0 and (t + s - min(n, t + s)) > (t - min(n, t))
        if evicts:
            with pytest.raises(ValueError, match="keep_latent_window=True"):
                hyb.append(z, kpe, part.k, part.v)
            return
        hyb = hyb.append(z, kpe, part.k, part.v)
        t += s
        want = HybridCache.from_latent(LatentCache(full.z[:, :t], full.kpe[:, :t]), n, w.w_uk, w.w_uv, keep)
        for name in ("z", "kpe", "k_win", "v_win", "seqlens"):
            torch.testing.assert_close(getattr(hyb, name), getattr(want, name), rtol=1e-12, atol=1e-12, msg=name)
    z_old, kpe, k_win, v_win = hyb.parts()
    assert z_old.shape[1] + k_win.shape[1] == kpe.shape[1] == total


def test_hybrid_ragged_parts():
    cfg = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)
    w = weights(cfg)
    lat = LatentCache.stack([latent(cfg, 1, 6, seed=1), latent(cfg, 1, 2, seed=2)])
    hyb = HybridCache.from_latent(lat, 3, w.w_uk, w.w_uv)
    with pytest.raises(ValueError, match="ragged"):
        hyb.parts()
    z_old, kpe, k_win, _ = hyb.parts(0)
    assert (z_old.shape[1], kpe.shape[1], k_win.shape[1]) == (3, 6, 3)
    z_old, kpe, k_win, _ = hyb.parts(1)
    assert (z_old.shape[1], kpe.shape[1], k_win.shape[1]) == (0, 2, 2)
    torch.testing.assert_close(k_win[0, 1], w.w_uk @ lat.z[1, 1])
    joined = HybridCache.stack([hyb, hyb])
    assert joined.seqlens.tolist() == [6, 2, 6, 2]


@pytest.mark.parametrize("t", [1, 63, 64, 65, 130])
def test_paged_round_trip_and_append(t):
    cfg = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)
    lat = LatentCache.stack([latent(cfg, 1, t, seed=1), latent(cfg, 1, max(1, t // 2), seed=2)])
    paged = PagedLatentCache.from_latent(lat, generator=torch.Generator().manual_seed(3))
    assert paged.kv.shape[1:] == (64, 1, cfg.k + cfg.p) and paged.block_table.dtype == torch.int32
    back = paged.to_latent()
    assert torch.equal(back.z, lat.z) and torch.equal(back.kpe, lat.kpe) and torch.equal(back.seqlens, lat.seqlens)
    z_new, kpe_new = rand(2, 3, cfg.k, seed=4), rand(2, 3, cfg.p, seed=5)
    grown = paged.append(z_new, kpe_new).to_latent()
    want = lat.append(z_new, kpe_new)
    assert torch.equal(grown.z, want.z) and torch.equal(grown.kpe, want.kpe)
    # FlashMLA row layout: first K = z, last P = kpe
    row = paged.kv[paged.block_table[0, 0], 0, 0]
    assert torch.equal(row[: cfg.k], lat.z[0, 0]) and torch.equal(row[cfg.k:], lat.kpe[0, 0])


def test_paged_pool_allocation():
    cfg = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)
    pool = PagedLatentCache.empty(2, cfg.k, cfg.p, num_blocks=3, block_size=4, dtype=torch.float64)
    grown = pool.append(rand(2, 5, cfg.k), rand(2, 5, cfg.p))     # 2 blocks each: 3 from the pool, 1 new
    assert grown.num_blocks == 4 and grown.free == ()
    assert sorted(grown.block_table.flatten().tolist()) == [0, 1, 2, 3]
    assert grown.seqlens.tolist() == [5, 5]


def test_append_errors():
    cfg = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)
    lat = latent(cfg, 2, 3)
    with pytest.raises(ValueError, match=r"z_new must be \[B=2, s, 8\], got \[2, 1, 7\]"):
        lat.append(rand(2, 1, 7), rand(2, 1, 4))
    with pytest.raises(ValueError, match="like the cache"):
        lat.append(rand(2, 1, 8, dtype=torch.float32), rand(2, 1, 4))
    with pytest.raises(ValueError, match="kpe_new has 2 tokens"):
        lat.append(rand(2, 1, 8), rand(2, 2, 4))
    with pytest.raises(ValueError, match=r"seqlens must lie in \[0, T=3\]"):
        LatentCache(lat.z, lat.kpe, torch.tensor([4, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table must be"):
        PagedLatentCache(torch.zeros(1, 64, 1, 12), torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, dtype=torch.int32), 8)


# --- batched window maintenance against a per-token oracle ---------------------------------


class Oracle:
    """The old semantics, one token at a time: per sequence a list of (z, kpe, k, v) tokens;
    the window is the n newest, z all of them (or the older ones without latent copies)."""

    def __init__(self, cfg, n, keep, lengths, seed=0):
        self.cfg, self.n, self.keep, self.seed = cfg, n, keep, seed
        self.seqs = [[self.token(b, i) for i in range(L)] for b, L in enumerate(lengths)]

    def token(self, b, i):
        c, g = self.cfg, torch.Generator().manual_seed(self.seed * 100_003 + b * 10_007 + i)
        r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
        return r(c.k), r(c.p), r(c.h, c.d), r(c.h, c.d)

    def step(self, s):
        new = [[self.token(b, len(seq) + i) for i in range(s)] for b, seq in enumerate(self.seqs)]
        for seq, toks in zip(self.seqs, new):
            seq.extend(toks)
        return tuple(torch.stack([torch.stack([tok[j] for tok in toks]) for toks in new]) for j in range(4))

    def expected(self):
        c = self.cfg
        lengths = [len(q) for q in self.seqs]
        t = max(lengths)
        nw = min(self.n, t)
        olds = [L - min(self.n, L) for L in lengths]
        tz = t if self.keep else max(olds)
        z = torch.zeros(len(lengths), tz, c.k, dtype=torch.float64)
        kpe = torch.zeros(len(lengths), t, c.p, dtype=torch.float64)
        k = torch.zeros(len(lengths), nw, c.h, c.d, dtype=torch.float64)
        v = torch.zeros_like(k)
        for b, seq in enumerate(self.seqs):
            for i, (zi, pi, ki, vi) in enumerate(seq):
                if self.keep or i < olds[b]:
                    z[b, i] = zi
                kpe[b, i] = pi
                if i >= olds[b]:
                    k[b, i - olds[b]], v[b, i - olds[b]] = ki, vi
        return {"z": z, "kpe": kpe, "k_win": k, "v_win": v, "seqlens": torch.tensor(lengths, dtype=torch.int32)}

    def check(self, cache, where=""):
        for name, want in self.expected().items():
            got = getattr(cache, name)
            assert got.shape == want.shape and torch.equal(got, want), f"{name} {where}"
        assert cache.lengths == tuple(len(q) for q in self.seqs)


def start(cfg, oracle, n, keep):
    """A hybrid cache holding the oracle's tokens (built the old way: per sequence, then stacked)."""
    want = oracle.expected()
    return HybridCache(want["z"], want["kpe"], want["k_win"], want["v_win"], want["seqlens"], n, keep)


CFG = MLAConfig(hidden=16, h=2, d=4, p=4, k=8, dv=4)


@pytest.fixture
def nan_empty():
    """torch.empty fills with NaN (deterministic mode): a read of a row never written shows up."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.isnan(torch.empty(4, dtype=torch.float64)).all()
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("n", [0, 1, 5, 9])
@pytest.mark.parametrize("steps", [(1,) * 12, (3, 1, 4, 1, 5), (7, 16, 2)])
@pytest.mark.parametrize("lengths", [(0, 0, 0), (4, 4, 4), (6, 2, 11), (0, 9, 3)])
def test_batched_maintenance_equals_token_oracle(n, steps, lengths, nan_empty):
    """After every step the window holds exactly the n newest tokens' k/v, z all tokens, kpe
    all RoPE keys (zero padding past each length), for uniform and ragged batches and s > 1."""
    oracle = Oracle(CFG, n, True, lengths)
    cache = start(CFG, oracle, n, True)
    for i, s in enumerate(steps):
        cache = cache.append(*oracle.step(s))
        oracle.check(cache, f"after step {i} (s={s})")


@pytest.mark.parametrize("lengths", [(0, 0), (2, 2), (1, 3)])
@pytest.mark.parametrize("steps", [(1, 1, 1, 1, 1, 1, 1, 1), (12,), (2, 9)])
def test_batched_maintenance_without_latent_copies(lengths, steps, nan_empty):
    """keep_latent_window=False: z holds only the tokens older than the window; an append that
    would evict a window token raises, anything before it matches the oracle."""
    n = 4
    oracle = Oracle(CFG, n, False, lengths)
    cache = start(CFG, oracle, n, False)
    for s in steps:
        nb = [min(n, L) for L in cache.lengths]
        evicts = any(min(L + s - min(n, L + s), L) - (L - m) > 0 for L, m in zip(cache.lengths, nb))
        new = oracle.step(s)
        if evicts:
            with pytest.raises(ValueError, match="keep_latent_window=True"):
                cache.append(*new)
            return
        cache = cache.append(*new)
        oracle.check(cache)


def test_uniform_steps_write_in_place_and_compact(nan_empty):
    """Uniform decode steps share the buffers (no copy of the cache) until the window reaches the
    end of its buffer; then it moves to a new one. Contents match the oracle throughout."""
    n = 8
    oracle = Oracle(CFG, n, True, (20, 20))
    cache = start(CFG, oracle, n, True).reserve(400)
    ptr = cache.k_win.untyped_storage().data_ptr()
    z_ptr = cache.z.untyped_storage().data_ptr()
    moves = 0
    for i in range(300):
        cache = cache.append(*oracle.step(1))
        now = cache.k_win.untyped_storage().data_ptr()
        moves += now != ptr
        ptr = now
        if i % 37 == 0:
            oracle.check(cache, f"step {i}")
    oracle.check(cache)
    assert 1 <= moves <= 300 // 64 + 1                       # one move per >= 64 steps (the slack)
    assert cache.z.untyped_storage().data_ptr() == z_ptr      # the latent part never moved (reserved)
    assert cache.reserved_bytes >= cache.nbytes


def test_old_container_unchanged_and_branches_independent(nan_empty):
    """append never changes the container it extends; two appends from one container (a branch)
    give two correct, independent caches."""
    n = 3
    oracle = Oracle(CFG, n, True, (5, 5))
    base = start(CFG, oracle, n, True).append(*oracle.step(1))
    oracle_a = Oracle(CFG, n, True, (0, 0))
    oracle_a.seqs = [list(q) for q in oracle.seqs]
    snapshot = {k: getattr(base, k).clone() for k in ("z", "kpe", "k_win", "v_win")}
    a = base.append(*oracle_a.step(2))
    oracle_b = Oracle(CFG, n, True, (0, 0), seed=7)
    oracle_b.seqs = [list(q) for q in oracle.seqs]
    b = base.append(*oracle_b.step(1))
    for name, x in snapshot.items():
        assert torch.equal(getattr(base, name), x), name
    oracle_a.check(a, "first branch")
    oracle_b.check(b, "second branch")
    oracle_a.check(a.append(*oracle_a.step(1)), "first branch grown after the second")


def test_ragged_old_container_keeps_its_tokens():
    oracle = Oracle(CFG, 4, True, (6, 2, 9))
    base = start(CFG, oracle, 4, True).append(*oracle.step(1))
    before = [base.parts(b) for b in range(3)]
    before = [[x.clone() for x in p] for p in before]
    base.append(*oracle.step(2))
    for b in range(3):
        for x, y in zip(base.parts(b), before[b]):
            assert torch.equal(x, y)


@pytest.mark.parametrize("n", [0, 3, 50])
def test_from_latent_batched_matches_per_sequence(n):
    w = weights(CFG)
    lat = LatentCache.stack([latent(CFG, 1, 6, seed=1), latent(CFG, 1, 2, seed=2), latent(CFG, 1, 9, seed=3)])
    for keep in (True, False):
        hyb = HybridCache.from_latent(lat, n, w.w_uk, w.w_uv, keep_latent_window=keep)
        for b in range(3):
            one = HybridCache.from_latent(lat.sequence(b), n, w.w_uk, w.w_uv, keep_latent_window=keep)
            for x, y in zip(hyb.parts(b), one.parts()):
                torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_reserve_keeps_contents(nan_empty):
    """Ragged, both windows full (every sequence evicts s tokens): in place below the reserve."""
    oracle = Oracle(CFG, 5, True, (6, 9))
    cache = start(CFG, oracle, 5, True)
    big = cache.reserve(100)
    oracle.check(big)
    assert big.reserved_bytes > big.nbytes == cache.nbytes
    ptr = big.z.untyped_storage().data_ptr()
    for _ in range(10):
        big = big.append(*oracle.step(2))
    oracle.check(big)
    assert big.z.untyped_storage().data_ptr() == ptr          # no reallocation below the reserve


# --- the latent cache's in-place appends against a per-token oracle -------------------------


class LatentOracle(Oracle):
    """The old latent semantics, one token at a time: ``z``/``kpe`` hold every token of each
    sequence at its own offset, zero padding, ``T = max(T, longest sequence)``."""

    def __init__(self, lengths, t=0, seed=0):
        super().__init__(CFG, 0, True, lengths, seed)
        self.t = max(t, *lengths)

    def branch(self, seed):
        other = LatentOracle([0] * len(self.seqs), self.t, seed)
        other.seqs = [list(q) for q in self.seqs]
        return other

    def step(self, s):
        z, kpe, _, _ = super().step(s)
        self.t = max(self.t, *(len(q) for q in self.seqs))
        return z, kpe

    def expected(self):
        lengths = [len(q) for q in self.seqs]
        z = torch.zeros(len(lengths), self.t, CFG.k, dtype=torch.float64)
        kpe = torch.zeros(len(lengths), self.t, CFG.p, dtype=torch.float64)
        for b, seq in enumerate(self.seqs):
            for i, (zi, pi, _, _) in enumerate(seq):
                z[b, i], kpe[b, i] = zi, pi
        return {"z": z, "kpe": kpe, "seqlens": torch.tensor(lengths, dtype=torch.int32)}

    def start(self):
        want = self.expected()
        return LatentCache(want["z"], want["kpe"], want["seqlens"])

    def check_tokens(self, cache, where=""):
        """Only the valid tokens (an old container's padding may hold a newer container's tokens)."""
        want = self.expected()
        assert cache.lengths == tuple(len(q) for q in self.seqs) and torch.equal(cache.seqlens, want["seqlens"])
        for b, L in enumerate(cache.lengths):
            assert torch.equal(cache.z[b, :L], want["z"][b, :L]), f"z {b} {where}"
            assert torch.equal(cache.kpe[b, :L], want["kpe"][b, :L]), f"kpe {b} {where}"


@pytest.mark.parametrize("steps", [(1,) * 12, (3, 1, 4, 1, 5), (7, 16, 2), (2, 130, 1, 1)])
@pytest.mark.parametrize("lengths,t", [((0, 0, 0), 0), ((4, 4, 4), 4), ((6, 2, 11), 11), ((0, 9, 3), 9),
                                       ((2, 3), 6), ((5, 5), 8)])
def test_latent_append_equals_token_oracle(steps, lengths, t, nan_empty):
    """After every step z/kpe hold exactly each sequence's tokens at its own offset and zero
    padding (uniform and ragged batches, T past the longest sequence, s > 1, buffers outgrown);
    every older container still holds its tokens; stack/sequence read the host lengths."""
    oracle = LatentOracle(lengths, t)
    cache = oracle.start()
    history = []
    for i, s in enumerate(steps):
        history.append((cache, oracle.branch(0)))
        cache = cache.append(*oracle.step(s))
        oracle.check(cache, f"after step {i} (s={s})")
        assert cache.uniform == (set(cache.lengths) == {cache.max_len})
        assert cache.nbytes == cache.batch * cache.max_len * (CFG.k + CFG.p) * 8 <= cache.reserved_bytes
    for i, (old, old_oracle) in enumerate(history):
        old_oracle.check_tokens(old, f"container {i}")
    both = LatentCache.stack([cache, cache.sequence(1)])
    twice = LatentOracle(lengths + lengths[1:2])
    twice.seqs = oracle.seqs + oracle.seqs[1:2]
    twice.t = max(len(q) for q in twice.seqs)
    twice.check(both)


@pytest.mark.parametrize("lengths", [(5, 5), (5, 2, 8)])
def test_latent_branches_independent(lengths, nan_empty):
    """Two appends from one container (a branch) give two correct, independent caches; the
    head keeps writing in place, the branch copies; an older head that outgrew its buffers
    into new ones may still write in place in the old ones."""
    oracle = LatentOracle(lengths)
    base = oracle.start().append(*oracle.step(1))
    oa, ob = oracle.branch(1), oracle.branch(2)
    a = base.append(*oa.step(3))                               # base is the head: in place
    assert a.z.untyped_storage().data_ptr() == base.z.untyped_storage().data_ptr()
    b = base.append(*ob.step(1))                               # a branch: new buffers, zero padding
    assert b.z.untyped_storage().data_ptr() != base.z.untyped_storage().data_ptr()
    a2 = a.append(*oa.step(1))                                 # a is still the head of its buffers
    assert a2.z.untyped_storage().data_ptr() == a.z.untyped_storage().data_ptr()
    oracle.check_tokens(base, "base")
    oa.check(a2, "first branch")
    ob.check(b, "second branch")
    oc, od = oa.branch(3), oa.branch(4)
    big = a2.append(*oc.step(200))                             # outgrows the buffers: new ones
    assert big.z.untyped_storage().data_ptr() != a2.z.untyped_storage().data_ptr()
    small = a2.append(*od.step(1))                             # a2 still heads the old buffers
    assert small.z.untyped_storage().data_ptr() == a2.z.untyped_storage().data_ptr()
    oc.check(big, "outgrown")
    od.check(small, "old buffers")
    ob.check(b.append(*ob.step(1)), "second branch grown")


def test_latent_decode_in_place(nan_empty):
    """Uniform decode steps write s rows in place; the buffers are copied once per >= 64 steps
    (the slack), never with reserve(); nbytes stays the memory model's number."""
    from mla_var3.analysis.memory import mla_cache_bytes

    for reserved in (False, True):
        oracle = LatentOracle((20, 20))
        cache = oracle.start()
        if reserved:
            cache = cache.reserve(400)
            oracle.check(cache)
        ptr, moves = cache.z.untyped_storage().data_ptr(), 0
        for i in range(300):
            cache = cache.append(*oracle.step(1))
            moves += cache.z.untyped_storage().data_ptr() != ptr
            ptr = cache.z.untyped_storage().data_ptr()
            if i % 37 == 0:
                oracle.check(cache, f"step {i}")
        oracle.check(cache)
        assert moves == 0 if reserved else 1 <= moves <= 300 // 64 + 1
        assert cache.nbytes == mla_cache_bytes(dims_for(CFG, torch.float64), 2, 320) < cache.reserved_bytes


def test_paged_reserve_then_appends_in_place():
    """After reserve(n), appends of up to n tokens write into the same pool and block table
    (device operations only: a decode step can be captured); past the reservation a new pool."""
    from mla_var3.model.cache import LatentCache, PagedLatentCache

    g = torch.Generator().manual_seed(0)
    z, kpe = torch.randn(2, 70, 8, generator=g), torch.randn(2, 70, 4, generator=g)
    paged = PagedLatentCache.from_latent(LatentCache(z, kpe, torch.tensor([70, 5], dtype=torch.int32)), block_size=16)
    r = paged.reserve(3)
    assert r.reserved == 3 and r.capacity >= 73 and r.kv is not paged.kv            # the old cache is untouched
    a = r.append(torch.ones(2, 2, 8), torch.ones(2, 2, 4))
    assert a.kv is r.kv and a.block_table is r.block_table and a.reserved == 1
    b = a.append(torch.full((2, 1, 8), 2.0), torch.full((2, 1, 4), 2.0))
    assert b.kv is r.kv and b.reserved == 0 and b.seqlens.tolist() == [73, 8]
    c = b.append(torch.full((2, 1, 8), 3.0), torch.full((2, 1, 4), 3.0))          # past the reservation
    assert c.kv is not b.kv and c.seqlens.tolist() == [74, 9]
    lat = c.to_latent()
    assert torch.equal(lat.z[0, :70], z[0]) and (lat.z[0, 70:72] == 1).all() and (lat.z[0, 72] == 2).all()
    assert (lat.z[1, 5:7] == 1).all() and (lat.z[1, 7] == 2).all() and (lat.z[1, 8] == 3).all()
    with pytest.raises(ValueError, match="tokens must be a non-negative integer"):
        paged.reserve(-1)

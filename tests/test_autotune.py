"""The autotune cache: keying, atomic writes, corruption, clearing; the tuning loop."""

import dataclasses
import json


import pytest

from mla_var3.runtime import autotune as at
from mla_var3.runtime.timing import summarize
from mla_var3.shapes import Problem, get_preset


@dataclasses.dataclass(frozen=True)
class Cfg:
    block: int
    warps: int = 4


def fake_timer(times):
    """timer(fn) that runs fn and returns the next time from ``times`` (µs)."""
    it = iter(times)

    def timer(fn):
        fn()
        return summarize([next(it)], method="fake", gpu=False, l2="-")

    return timer


@pytest.fixture
def cache(tmp_path):
    return at.AutotuneCache(tmp_path / "sub" / "autotune.json")


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path / "c"))
    assert at.cache_dir() == tmp_path / "c"
    assert at.AutotuneCache().path == tmp_path / "c" / "autotune.json"
    monkeypatch.delenv(at.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert at.cache_dir() == tmp_path / "x" / "mla_var3"


def test_key_distinguishes_every_field():
    dims = get_preset("deepseek-v3")
    base = dict(device="NVIDIA H200", design="flash_mla", dims=dims, problem=Problem(32, 16, 4096), dtype="bf16",
                triton_version="3.6.0")
    key = at.cache_key(**base)
    variants = [
        dict(device="NVIDIA H100"), dict(design="flash_attention"), dict(dims=get_preset("kimi-k2")),
        dict(problem=Problem(32, 8, 4096)), dict(problem=Problem(128, 16, 4096)), dict(problem=Problem(32, 16, 8192)),
        dict(problem=Problem(32, 16, 4096, causal=False)), dict(problem=Problem(32, 16, 4096, n=1024)),
        dict(dtype="fp16"), dict(triton_version="3.5.0"),
    ]
    keys = {at.cache_key(**{**base, **v}) for v in variants}
    assert key not in keys and len(keys) == len(variants)
    # inside one bucket: same key
    assert at.cache_key(**{**base, "problem": Problem(30, 16, 4000)}) == key
    assert at.shape_bucket(Problem(32, 100, 4096, n=0)) == "b32-s128-t4096-n0-causal"


def test_put_get_roundtrip_and_merge(cache):
    assert cache.get("a") is None
    cache.put("a", {"block": 64}, time_us=1.5)
    other = at.AutotuneCache(cache.path)           # another process writing meanwhile
    other.put("b", {"block": 32}, time_us=2.5)
    assert cache.get("a")["config"] == {"block": 64}
    assert cache.get("b")["time_us"] == 2.5
    assert set(cache.entries()) == {"a", "b"}


def test_write_is_atomic_no_temp_left_and_failure_keeps_old(cache, monkeypatch):
    cache.put("a", {"block": 64})
    before = cache.path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(at.os, "replace", boom)
    with pytest.raises(OSError):
        cache.put("b", {"block": 32})
    monkeypatch.undo()
    assert cache.path.read_text() == before                  # old file intact
    assert [p.name for p in cache.path.parent.iterdir()] == ["autotune.json"]   # no temp file left


@pytest.mark.parametrize("content", ['{"format": 1, "entries": {"a": {"conf', "not json", "[1, 2]", '{"entries": 3}', ""])
def test_corrupt_file_warns_and_retunes(cache, content):
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text(content)
    with pytest.warns(UserWarning, match="corrupt"):
        assert cache.get("a") is None
    cands = [Cfg(16), Cfg(32)]
    with pytest.warns(UserWarning):
        res = at.autotune("d", cands, lambda c: (lambda: None), key="a", cache=cache, timer=fake_timer([5.0, 3.0]),
                          log=None)
    assert res.config == Cfg(32) and not res.from_cache
    assert json.loads(cache.path.read_text())["entries"]["a"]["config"] == {"block": 32, "warps": 4}


def test_autotune_picks_fastest_skips_failures_and_caches(cache):
    ran = []

    def make_call(cfg):
        if cfg.block == 128:
            raise RuntimeError("out of resources: shared memory")
        return lambda: ran.append(cfg)

    cands = [Cfg(16), Cfg(32), Cfg(128), Cfg(64)]
    lines = []
    res = at.autotune("flash_mla", cands, make_call, key="k", cache=cache, timer=fake_timer([9.0, 4.0, 6.0]),
                      log=lines.append)
    assert res.config == Cfg(32) and res.time_us == 4.0 and not res.from_cache
    assert ran == [Cfg(16), Cfg(32), Cfg(64)]
    assert any("skipped" in l and "out of resources" in l for l in lines)
    assert any("[4/4, 0 left]" in l for l in lines)
    # second call: from the cache, nothing timed
    res2 = at.autotune("flash_mla", cands, make_call, key="k", cache=cache, timer=fake_timer([]), log=None)
    assert res2.from_cache and res2.config == Cfg(32)
    # retune ignores the cache
    res3 = at.autotune("flash_mla", cands, make_call, key="k", cache=cache, retune=True,
                       timer=fake_timer([1.0, 4.0, 6.0]), log=None)
    assert res3.config == Cfg(16) and cache.get("k")["config"]["block"] == 16


def test_stale_cached_config_is_retuned(cache):
    cache.put("k", {"block": 16, "warps": 4, "gone_field": 1})
    res = at.autotune("d", [Cfg(8)], lambda c: (lambda: None), key="k", cache=cache, timer=fake_timer([1.0]), log=None)
    assert res.config == Cfg(8) and not res.from_cache


def test_all_candidates_fail(cache):
    def make_call(cfg):
        raise ValueError("bad tiling")

    with pytest.raises(RuntimeError, match="every candidate failed"):
        at.autotune("d", [Cfg(1), Cfg(2)], make_call, key="k", cache=cache, log=None)
    assert cache.get("k") is None


def test_clear(cache):
    assert cache.clear() is False
    cache.put("a", {"block": 1})
    assert cache.clear() is True and not cache.path.exists()


def test_budget_stops_after_best_so_far(cache):
    import time as _time

    def slow_timer(fn):
        fn()
        _time.sleep(0.02)
        return summarize([1.0], method="fake", gpu=False, l2="-")

    lines = []
    res = at.autotune("d", [Cfg(1), Cfg(2), Cfg(3), Cfg(4)], lambda c: (lambda: None), key="k", cache=cache,
                      timer=slow_timer, log=lines.append, budget_s=0.001)
    assert res.config == Cfg(1) and len(res.trials) == 1
    assert any("time budget" in l for l in lines)
    assert cache.get("k")["tried"] == 1 and cache.get("k")["candidates"] == 4


# --- a corrupt cache is never fatal -------------------------------------------------------------

DAMAGED = [b"\xff\xfe\x00\x81random", b'{"format": 1, "entries": {"a": {"conf', b"", b"  ", b"[1, 2]", b"null",
           b'{"entries": [1]}', b'{"format": 1}']


@pytest.mark.parametrize("content", DAMAGED)
def test_put_rewrites_a_corrupt_file_atomically(cache, content):
    cache.path.parent.mkdir(parents=True)
    cache.path.write_bytes(content)
    with pytest.warns(UserWarning, match="corrupt autotune cache ignored: .*autotune.json"):
        cache.put("k", {"block": 16}, time_us=2.0)
    data = json.loads(cache.path.read_text())
    assert data["entries"]["k"]["config"] == {"block": 16}
    assert [p.name for p in cache.path.parent.iterdir()] == ["autotune.json"]    # no temp file left


def test_a_directory_for_the_cache_warns_and_tuning_still_returns(tmp_path):
    path = tmp_path / "autotune.json"
    path.mkdir()
    cache = at.AutotuneCache(path)
    with pytest.warns(UserWarning, match="it is a directory"):
        assert cache.entries() == {}
    with pytest.warns(UserWarning):          # unreadable, then not writable: the tuned config is still used
        res = at.autotune("d", [Cfg(16)], lambda c: (lambda: None), key="k", cache=cache,
                          timer=fake_timer([1.0]), log=None)
    assert res.config == Cfg(16) and not res.from_cache


BAD_ENTRIES = {
    "not an object": 3,
    "no config": {"time_us": 1.0},
    "config not an object": {"config": [16]},
    "empty config": {"config": {}},
    "NaN in config": {"config": {"block": float("nan")}},
    "negative time": {"config": {"block": 16}, "time_us": -1.0},
    "zero time": {"config": {"block": 16}, "time_us": 0},
    "NaN time": {"config": {"block": 16}, "time_us": float("nan")},
    "infinite time": {"config": {"block": 16}, "time_us": float("inf")},
    "string time": {"config": {"block": 16}, "time_us": "3"},
    "bool time": {"config": {"block": 16}, "time_us": True},
    "backend not a string": {"config": {"block": 16}, "time_us": 1.0, "backend": 3},
}


@pytest.mark.parametrize("name", list(BAD_ENTRIES))
def test_invalid_entries_are_absent_retuned_and_dropped_from_the_file(cache, name):
    cache.path.parent.mkdir(parents=True)
    good = {"config": {"block": 32, "warps": 4}, "time_us": 5.0}
    text = json.dumps({"format": 1, "entries": {"bad": BAD_ENTRIES[name], "good": good}})   # NaN written as NaN
    cache.path.write_text(text)
    with pytest.warns(UserWarning, match="ignoring 1 invalid entry"):
        assert set(cache.entries()) == {"good"}
    with pytest.warns(UserWarning):
        res = at.autotune("d", [Cfg(16), Cfg(32)], lambda c: (lambda: None), key="bad", cache=cache,
                          timer=fake_timer([3.0, 4.0]), log=None)
    assert res.config == Cfg(16) and not res.from_cache and res.time_us == 3.0
    entries = json.loads(cache.path.read_text())["entries"]                   # strict JSON: no NaN left
    assert entries["bad"]["config"] == {"block": 16, "warps": 4} and entries["good"] == good


@pytest.mark.parametrize("stored", [
    {"block": 24, "warps": 4},        # a tiling the enumerator never produces
    {"block": "16", "warps": 4},      # the right number as a string
    {"block": 16.0, "warps": 4},      # ... as a float
    {"block": 16, "warps": True},     # True == 1 in Python, not a warp count
    {"block": 16},                    # a field missing
])
def test_configs_that_are_not_candidates_are_never_returned_from_cache(cache, stored):
    cands = [Cfg(16), Cfg(32), Cfg(16, warps=1)]
    cache.put("k", stored, time_us=1.0)
    assert at.restore_config(stored, cands) is None
    res = at.autotune("d", cands, lambda c: (lambda: None), key="k", cache=cache, timer=fake_timer([3.0, 2.0, 4.0]),
                      log=None)
    assert not res.from_cache and res.config == Cfg(32)


def test_put_refuses_an_invalid_entry_and_keeps_the_file(cache):
    cache.put("a", {"block": 64}, time_us=1.0)
    before = cache.path.read_text()
    for bad in ({"time_us": float("nan")}, {"time_us": -2.0}):
        with pytest.raises(ValueError, match="time_us"):
            cache.put("b", {"block": 32}, **bad)
    with pytest.raises(ValueError, match="config"):
        cache.put("b", {"block": object()})
    assert cache.path.read_text() == before


def test_cli_lists_a_corrupt_cache_with_a_one_line_warning(tmp_path, monkeypatch, capsys):
    from mla_var3 import cli

    monkeypatch.setenv(at.CACHE_ENV, str(tmp_path))
    (tmp_path / at.CACHE_FILE).write_bytes(b"\x00\xff" * 50)
    for argv in (["autotune"], ["explain", "--b", "4", "--t", "256"]):
        assert cli.main(argv) == 0
        err = capsys.readouterr().err
        assert err.startswith("mla-var3: warning: corrupt autotune cache ignored") and err.count("\n") == 1, err


@pytest.mark.parametrize("time_us", [-300.0, float("nan"), float("inf"), 0.0])
def test_explain_never_shows_an_invalid_cached_time_as_measured(tmp_path, capsys, time_us):
    import triton

    from mla_var3 import cli

    path = tmp_path / "autotune.json"
    key = at.cache_key("NVIDIA H200", "flash_mla", get_preset("deepseek-v3"), Problem(32, 16, 4096), "bf16",
                       triton.__version__)
    path.write_text(json.dumps({"format": 1, "entries": {key: {"config": {"block_m": 64}, "time_us": time_us}}}))
    code = cli.main(["explain", "--s", "16", "--autotune-cache", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and "invalid entry" in err and err.count("\n") == 1
    d = json.loads(out)
    assert all(e["measured_s"] is None for e in d["estimates"]) and d["source"] == "model"

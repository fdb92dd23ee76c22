"""Nothing silent, nothing fatal (second round): each cause found by probing hostile inputs, and
the cases of the same kinds tried again after the fixes.

Every case ends with a correct result or a clean error that names the argument or the file (the
CLI: one line ``mla-var3: error: ...`` and exit status 2), never a traceback, a silent change
of meaning or a hang. The expectation of each case is written in its parameters; the ids name
the case. The causes:

* A: a JSON number that is not finite (an integer above 1e308, ``Infinity``, ``NaN``) in any file
  the package reads: one clean error naming the file (the autotune cache: the entry is dropped).
* B: calibration ``default_backends`` rules checked when the file is loaded.
* C: calibration ceilings and SM count finite and in a sane range; every field of its type.
* D: a corrupt hybrid key in the autotune cache is skipped with a warning naming the file.
* E: the expanded law's causal sum in closed form (no per-query-block loop at huge sizes).
* F: ``reserve`` takes an integer token count >= 0 and allocates without a per-block loop.
* G: the layer's W_UK / W_UV follow an in-place ``.data`` update of ``kv_b_proj.weight``.
* I: an attention module shared by two layers is refused by ``enable``.
* J: one softmax-scale validator (bool, str, non-finite, <= 0 refused) at every entry point.
* K: one length-dtype rule (int32 or int64; bool refused) for every tensor of lengths.
* O: ``mla-var3`` with no command: one usage line on stderr, exit status 2.
* P: ``calibrate`` checks its devices file and output path before timing anything.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from mla_var3.cli import main

#: where the entry points' inputs live: the GPU where there is one (the kernels' own path, whose
#: device check would otherwise answer before the check a test asserts), else the CPU under the
#: interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: the entry points' input dtype there: bf16 on the GPU (whose kernels refuse float32 before the
#: check a test asserts), float32 under the interpreter
KERNEL_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32

HUGE = "1" + "0" * 400                     # an integer beyond a float's range
#: JSON numbers that are not finite, as they appear in a file's text.
NOT_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "1e999": "1e999",
              "int 401 digits": HUGE, "int -401 digits": "-" + HUGE, "int 5000 digits": "9" * 5000}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code: int, err: str, *words: str) -> None:
    """Exit status 2 and one line ``mla-var3: error: ...`` holding each of ``words``."""
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("mla-var3: warning:")]
    assert len(lines) == 1 and lines[0].startswith("mla-var3: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


# ------------------------------------------------------------------------------------------------
# A. the finite-number reader: every file the package reads
# ------------------------------------------------------------------------------------------------

def _devices_text(value: str) -> str:
    return '{"x": {"name": "X", "bf16_tflops": %s, "bandwidth_gbs": 1000, "memory_gb": 80}}' % value


def _results_text(value: str) -> str:
    return ('{"records": [{"name": "flash_mla", "kind": "design", "model": "deepseek-v3", "b": 32, "s": 1, '
            '"t": 4096, "status": "ok", "time_us": %s}]}' % value)


def _sweep_text(value: str) -> str:
    return '{"sweep": [{"label": "hybrid", "b": 32, "s": 16, "n": 0, "us": %s}]}' % value


def _load_devices(path):
    from mla_var3.analysis.devices import load_devices
    return load_devices(path)


def _load_results(path):
    from mla_var3.runtime.records import load_results
    return load_results(path)


def _load_sweep(path):
    from mla_var3.analysis.plots import load_n_sweep
    return load_n_sweep(path)


def _points(path):
    from mla_var3.analysis.calibration_fit import points_from_results
    return points_from_results(path)


#: reader -> (what its messages call the file, the file's text around one number, the loader)
READERS = {
    "devices": ("devices file", _devices_text, _load_devices),
    "results": ("results file", _results_text, _load_results),
    "sweep": ("sweep file", _sweep_text, _load_sweep),
    "calibration points": ("results file", _results_text, _points),
}


@pytest.mark.parametrize("number", list(NOT_FINITE))
@pytest.mark.parametrize("reader", list(READERS))
def test_a_numbers_that_are_not_finite_are_one_error_naming_the_file(tmp_path, reader, number):
    what, text, load = READERS[reader]
    path = tmp_path / "file.json"
    path.write_text(text(NOT_FINITE[number]))
    with pytest.raises(ValueError) as info:
        load(path)
    msg = str(info.value)
    assert what in msg and str(path) in msg and "at line 1 column" in msg and "finite" in msg, msg


def test_a_the_reader_points_at_the_number_and_keeps_strings(tmp_path):
    from mla_var3._io import parse_json

    assert parse_json('{"a": "NaN", "b": "Infinity", "c": 1.5, "d": -2}', "f") == \
        {"a": "NaN", "b": "Infinity", "c": 1.5, "d": -2}
    with pytest.raises(ValueError, match=r"f holds -Infinity at line 3 column 7 \(not a JSON number\)"):
        parse_json('{"s": "Infinity",\n "t": 1,\n "u": -Infinity}', "f")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999", HUGE, "-" + HUGE, "9" * 5000])
@pytest.mark.parametrize("field", ["time_us", "config", "extra"])
def test_a_autotune_cache_drops_the_entry_never_fails(tmp_path, field, value):
    """The autotune cache is never fatal: a number that is not finite costs its entry alone."""
    from mla_var3.runtime.autotune import AutotuneCache

    good = '{"config": {"block": 32}, "time_us": 5.0}'
    bad = {"time_us": '{"config": {"block": 16}, "time_us": %s}',
           "config": '{"config": {"block": %s}, "time_us": 1.0}',
           "extra": '{"config": {"block": 16}, "time_us": 1.0, "tried": %s}'}[field] % value
    path = tmp_path / "autotune.json"
    path.write_text('{"format": 1, "entries": {"bad": %s, "good": %s}}' % (bad, good))
    with pytest.warns(UserWarning, match=r"ignoring 1 invalid entry \(bad: "):
        assert set(AutotuneCache(path).entries()) == {"good"}


@pytest.mark.parametrize("field,value", [("bf16_tflops", HUGE), ("sms", "1e999"), ("sms", HUGE),
                                         ("memory_gb", "Infinity"), ("bandwidth_gbs", "NaN")])
def test_a_cli_devices_file_with_a_number_that_is_not_finite(capsys, tmp_path, field, value):
    entry = {"name": '"X"', "bf16_tflops": "100", "bandwidth_gbs": "1000", "memory_gb": "80", field: value}
    path = tmp_path / "devs.json"
    path.write_text('{"x": {' + ", ".join(f'"{k}": {v}' for k, v in entry.items()) + "}}")
    for argv in (["cost", "--design", "flash_mla", "--devices-file", str(path)],
                 ["regime", "--device", "x", "--devices-file", str(path)], ["devices", "--devices-file", str(path)]):
        assert_usage_error(*run_cli(capsys, *argv)[::2], str(path), "finite")


# ------------------------------------------------------------------------------------------------
# B, C. calibration files: every field checked at load (rules, ceilings, sms, types)
# ------------------------------------------------------------------------------------------------

def _shipped_calibration() -> dict:
    from importlib import resources

    return json.loads(resources.files("mla_var3.conf").joinpath("calibration-h200.json").read_text())


def _write_calibration(tmp_path, change) -> str:
    raw = _shipped_calibration()
    change(raw)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def change(raw):
        obj = raw
        for key in keys[:-1]:
            obj = obj[key]
        obj[keys[-1]] = value
    return change


#: (change, words of the error): each made the file load and fail later (AttributeError,
#: TypeError) in every cost/regime/report/explain call and in mode="auto", or be read silently
#: with another meaning.
BAD_RULES = {
    "rule a string": (_set("default_backends", "flash_mla", ["gluon"]), "rule 0 must be a JSON object"),
    "rules an object": (_set("default_backends", "flash_mla", {"backend": "gluon"}), "must be a list of rules"),
    "s_gt a string": (_set("default_backends", "flash_attention", [{"backend": "gluon", "s_gt": "x"}]),
                      "'s_gt' must be an integer"),
    "s_gt a bool": (_set("default_backends", "flash_attention", [{"backend": "gluon", "s_gt": True}]),
                    "'s_gt' must be an integer"),
    "s_gt a float": (_set("default_backends", "flash_attention", [{"backend": "gluon", "s_gt": 64.5}]),
                     "'s_gt' must be an integer"),
    "misspelt s_gte": (_set("default_backends", "flash_attention", [{"backend": "gluon", "s_gte": 64}]),
                       "unknown key 's_gte'"),
    "no backend": (_set("default_backends", "flash_mla", [{"s_gt": 4}]), "missing 'backend'"),
    "backend a number": (_set("default_backends", "flash_mla", [{"backend": 3}]), "'backend' must be a string"),
    "unknown backend": (_set("default_backends", "flash_mla", [{"backend": "cutlass"}]), "no time law"),
    "unknown design": (_set("default_backends", "flash-mla", [{"backend": "gluon"}]), "unknown design"),
    "rules a list": (_set("default_backends", []), "must be a JSON object of design"),
}

BAD_FIELDS = {
    "flops 1e300": (_set("ceilings", "flops_per_s", 1e300), "'flops_per_s' must lie in"),
    "flops tiny": (_set("ceilings", "flops_per_s", 1e-300), "'flops_per_s' must lie in"),
    "bytes 1e-300": (_set("ceilings", "bytes_per_s", 1e-300), "'bytes_per_s' must lie in"),
    "bytes 0": (_set("ceilings", "bytes_per_s", 0), "'bytes_per_s' must be positive"),
    "bytes negative": (_set("ceilings", "bytes_per_s", -4e12), "'bytes_per_s' must be positive"),
    "flops a string": (_set("ceilings", "flops_per_s", "7.1e14"), "'flops_per_s' must be a number"),
    "flops a bool": (_set("ceilings", "flops_per_s", True), "'flops_per_s' must be a number"),
    "no bytes": (lambda raw: raw["ceilings"].pop("bytes_per_s"), "missing 'bytes_per_s'"),
    "ceilings a list": (_set("ceilings", [1, 2]), "'ceilings' must be a JSON object"),
    "sms 132.5": (_set("sms", 132.5), "'sms' must be an integer"),
    "sms a string": (_set("sms", "132"), "'sms' must be an integer"),
    "sms a bool": (_set("sms", True), "'sms' must be an integer"),
    "sms 0": (_set("sms", 0), "'sms' must be positive"),
    "sms 10**7": (_set("sms", 10**7), "'sms' must be at most"),
    "gpu a string": (_set("gpu", "false"), "'gpu' must be true or false"),
    "device a number": (_set("device", 200), "'device' must be a string"),
    "value a string": (lambda raw: raw["parameters"][0].update(value="116.8"), "'value' must be a number"),
    "value a bool": (lambda raw: raw["parameters"][0].update(value=True), "'value' must be a number"),
    "name twice": (lambda raw: raw["parameters"].append(dict(raw["parameters"][0])), "is given twice"),
    "parameter a list": (lambda raw: raw["parameters"].append([1]), "must be a JSON object"),
    "group unknown": (lambda raw: raw["parameters"][0].update(group="cpu"), "'group' must be 'gpu' or 'host'"),
    "fitted a string": (lambda raw: raw["parameters"][0].update(fitted="no"), "'fitted' must be true or false"),
    "commits not strings": (_set("commits", "measurements", [1, 2]), "must be a list of strings"),
    "points a dict": (_set("points", {}), "'points' must be a JSON list"),
}


@pytest.mark.parametrize("case", list(BAD_RULES) + list(BAD_FIELDS))
def test_bc_a_bad_calibration_field_is_refused_at_load(tmp_path, case):
    from mla_var3.analysis.calibration import CalibrationFileError, load_calibration

    change, words = {**BAD_RULES, **BAD_FIELDS}[case]
    path = _write_calibration(tmp_path, change)
    with pytest.raises(CalibrationFileError) as info:
        load_calibration(path)
    assert path in str(info.value) and words in str(info.value), str(info.value)


@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e999", HUGE])
@pytest.mark.parametrize("field", ["flops_per_s", "bytes_per_s", "sms", "value"])
def test_c_numbers_that_are_not_finite_in_a_calibration_file(tmp_path, field, value):
    """``"flops_per_s": Infinity`` made ``cost`` report 85 µs instead of 999 µs, exit 0."""
    from mla_var3.analysis.calibration import CalibrationFileError, load_calibration

    marker = 123456.789
    where = {"sms": _set("sms", marker), "value": lambda raw: raw["parameters"][0].update(value=marker)}
    path = _write_calibration(tmp_path, where.get(field, _set("ceilings", field, marker)))
    text = open(path).read().replace(repr(marker), value)
    open(path, "w").write(text)
    with pytest.raises(CalibrationFileError, match=r"calibration file .*cal\.json.* holds .* at line 1 column"):
        load_calibration(path)


@pytest.mark.parametrize("command", [["cost", "--design", "flash_mla"], ["regime"], ["explain"]])
@pytest.mark.parametrize("case", ["flops Infinity", "rule a string", "s_gt a string", "bytes 1e-300"])
def test_bc_cli_refuses_the_calibration_file_once(capsys, tmp_path, command, case):
    changes = {"flops Infinity": _set("ceilings", "flops_per_s", float("inf")), **{k: v[0] for k, v in BAD_RULES.items()},
               **{k: v[0] for k, v in BAD_FIELDS.items()}}
    path = _write_calibration(tmp_path, changes[case])
    code, out, err = run_cli(capsys, *command, "--calibration", path)
    assert_usage_error(code, err, path, "calibration file")


def test_bc_good_rules_still_load_and_pick(tmp_path):
    from mla_var3.analysis.calibration import load_calibration, predict
    from mla_var3.shapes import Problem, get_preset

    path = _write_calibration(tmp_path, _set("default_backends", "flash_attention",
                                             [{"backend": "gluon", "s_gt": 64}, {"backend": "triton", "s_gt": None}]))
    cal = load_calibration(path)
    v3 = get_preset("deepseek-v3")
    assert cal.default_backend("flash_attention", Problem(b=1, s=65, t=4096)) == "gluon"
    assert cal.default_backend("flash_attention", Problem(b=1, s=64, t=4096)) == "triton"     # null s_gt: any s
    assert predict(cal, "flash_attention", v3, Problem(b=1, s=16, t=4096)).backend == "triton"


# ------------------------------------------------------------------------------------------------
# D. a corrupt autotune key: skipped with a warning naming the file, never fatal mid-forward
# ------------------------------------------------------------------------------------------------

def _autotune_with_keys(path, buckets: list[str]) -> None:
    """An autotune cache whose hybrid entries have these shape buckets (and one good absorbed one)."""
    import triton

    from mla_var3.runtime.autotune import AutotuneCache, cache_key
    from mla_var3.shapes import Problem, get_preset

    v3 = get_preset("deepseek-v3")
    cache = AutotuneCache(path)
    good = cache_key("NVIDIA H200", "flash_mla", v3, Problem(32, 16, 4096), "bf16", triton.__version__)
    cache.put(good, {"BLOCK_N": 64}, time_us=1000.0)
    for bucket in buckets:
        parts = good.split("|")
        cache.put("|".join([parts[0], "mla_var6_plus", parts[2], bucket, *parts[4:]]), {"BLOCK_N": 64}, time_us=900.0)


BAD_BUCKETS = {"nX": "b32-s16-t4096-nX-causal", "n alone": "b32-s16-t4096-n-causal",
               "n 5000 digits": "b32-s16-t4096-n" + "9" * 5000 + "-causal", "two n": "b32-s16-t4096-n64-n128-causal",
               "no n": "b32-s16-t4096-causal", "n unicode digit": "b32-s16-t4096-n\u0663-causal",
               "n float": "b32-s16-t4096-n1e3-causal"}


@pytest.mark.parametrize("case", list(BAD_BUCKETS))
def test_d_corrupt_hybrid_keys_are_skipped_naming_the_file(tmp_path, case):
    from mla_var3.dispatch.decide import CacheInfo, Dispatcher
    from mla_var3.dispatch.measured import from_autotune
    from mla_var3.shapes import Problem, get_preset

    path = tmp_path / "autotune.json"
    _autotune_with_keys(path, [BAD_BUCKETS[case], "b32-s16-t4096-n1024-causal"])
    v3, pr = get_preset("deepseek-v3"), Problem(32, 16, 4096)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        found = from_autotune("h200", v3, pr, "bf16", path)
        dec = Dispatcher("h200", autotune_path=path).decide(v3, pr, CacheInfo("hybrid", 4096))
    assert sorted((m.kernel, m.n) for m in found) == [("flash_mla", None), ("mla_var6_plus", 1024)]
    assert dec.design in ("absorbed", "hybrid", "expanded")
    if case != "no n":       # a bucket without n is an older format, skipped quietly as before
        assert any(str(path) in str(w.message) and "holds no split n" in str(w.message) for w in seen)


def test_d_explain_with_a_corrupt_hybrid_key_runs(capsys, tmp_path):
    path = tmp_path / "autotune.json"
    _autotune_with_keys(path, [BAD_BUCKETS["nX"]])
    code, out, err = run_cli(capsys, "explain", "--b", "32", "--s", "16", "--t", "4096", "--autotune-cache", str(path))
    assert code == 0 and "choice:" in out, err
    assert str(path) in err and "warning" in err


# ------------------------------------------------------------------------------------------------
# E. the expanded law at sizes the CLI accepts
# ------------------------------------------------------------------------------------------------

def _visible_rows_keys_by_block(s: int, t: int, block_m: int) -> int:
    """The causal sum block by block, as the law states it (the closed form must equal it)."""
    blocks = -(-s // block_m)
    return sum(block_m * (t - s + min(s, (j + 1) * block_m)) for j in range(blocks))


@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
def test_e_closed_form_equals_the_block_sum(block_m):
    from mla_var3.analysis.kernel_laws import _visible_rows_keys

    for s in [*range(1, 300), 511, 512, 513, 4095, 4096, 4097]:
        for t in (s, s + 1, s + 63, s + 4096):
            assert _visible_rows_keys(s, t, block_m, True) == _visible_rows_keys_by_block(s, t, block_m), (s, t)
            assert _visible_rows_keys(s, t, block_m, False) == -(-s // block_m) * block_m * t


@pytest.mark.parametrize("design", ["flash_attention", "mla_var6_plus", "flash_mla"])
def test_e_huge_sizes_return(design):
    """``cost --s 2**53 --t 2**53`` summed 2**53 / block_m terms in Python: it never returned. Run
    in a child process so a regression fails here (the limit is a hang guard, generous on a
    loaded machine) instead of hanging the suite."""
    import subprocess
    import sys

    big = str(2**53)
    proc = subprocess.run([sys.executable, "-m", "mla_var3", "cost", "--design", design, "--s", big, "--t", big,
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["time_s"] > 0


# ------------------------------------------------------------------------------------------------
# F. reserve: a token count, checked; blocks allocated without a step per block
# ------------------------------------------------------------------------------------------------

#: (value, words): reserve("4") raised a TypeError, reserve(2.5) was accepted and reserve(10**12)
#: never returned (one Python iteration per block).
BAD_TOKENS = [("4", "non-negative integer"), (2.5, "non-negative integer"), (-1, "non-negative integer"),
              (True, "non-negative integer"), (None, "non-negative integer"), (float("nan"), "non-negative integer"),
              (10**12, "at most 2,147,483,647"), (2**31, "at most 2,147,483,647"), (10**400, "at most")]


@pytest.mark.parametrize("value,words", BAD_TOKENS, ids=[repr(v)[:12] for v, _ in BAD_TOKENS])
def test_f_paged_reserve_refuses_what_is_not_a_token_count(value, words):
    from mla_var3.model.cache import PagedLatentCache

    cache = PagedLatentCache.empty(2, 16, 16, block_size=16)
    with pytest.raises(ValueError, match=f"tokens must be .*{words}"):
        cache.reserve(value)


@pytest.mark.parametrize("value,words", BAD_TOKENS[:4] + BAD_TOKENS[6:8], ids=[repr(v)[:12] for v, _ in
                                                                              BAD_TOKENS[:4] + BAD_TOKENS[6:8]])
@pytest.mark.parametrize("kind", ["latent", "hybrid"])
def test_f_latent_and_hybrid_reserve_refuse_what_is_not_a_length(kind, value, words):
    from mla_var3.model.cache import LatentCache
    from mla_var3.model.hybrid_cache import HybridCache

    cache = LatentCache.empty(2, 16, 16) if kind == "latent" else HybridCache.empty(2, 2, 16, 16, 16, 4)
    with pytest.raises(ValueError, match=f"max_len must be .*{words}"):
        cache.reserve(value)


def test_f_a_reservation_too_large_to_allocate_names_the_argument():
    from mla_var3.model.cache import PagedLatentCache

    cache = PagedLatentCache.empty(2, 512, 64, block_size=64, dtype=torch.bfloat16)
    # refused before the allocator is asked (a host that overcommits memory would hand the pool out
    # and kill the process zeroing it: measured on a GPU machine's host)
    with pytest.raises(ValueError, match=r"tokens=2,147,483,647: the buffers \(4,947\.8 GB\) could not be allocated: "
                                         r"more than the [\d,.]+ GB of cpu"):
        cache.reserve(2**31 - 1)


@pytest.mark.parametrize("kind", ["latent", "hybrid"])
def test_f_a_latent_or_hybrid_reservation_beyond_the_memory_is_refused_before_allocating(kind):
    """The latent buffers of 2**31 - 1 tokens at DeepSeek-V3 widths (12.4 TB in fp32 for two
    sequences) exceed any device's memory: refused with the argument named, the allocator never asked."""
    from mla_var3.model.cache import LatentCache
    from mla_var3.model.hybrid_cache import HybridCache

    cache = LatentCache.empty(2, 512, 64) if kind == "latent" else HybridCache.empty(2, 2, 16, 512, 64, 4)
    with pytest.raises(ValueError, match=r"max_len=2,147,483,647: the buffers \([\d,.]+ GB\) could not be allocated: "
                                         r"more than the [\d,.]+ GB of cpu"):
        cache.reserve(2**31 - 1)


def _blocks_one_by_one(cache, lengths, s):
    """The allocation rule, one block at a time (what the closed form must reproduce)."""
    bs = cache.block_size
    table = [row[: -(-t // bs)] for row, t in zip(cache.block_table.tolist(), lengths)]
    free, grown = list(cache.free), cache.num_blocks
    for b, t in enumerate(lengths):
        while len(table[b]) * bs < t + s:
            if free:
                table[b].append(free.pop(0))
            else:
                table[b].append(grown)
                grown += 1
    width = max((len(r) for r in table), default=0)
    out = torch.zeros(cache.batch, width, dtype=torch.int32)
    for b, row in enumerate(table):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return grown, out, tuple(free)


def test_f_blocks_are_the_ones_a_block_by_block_rule_takes():
    import random

    from mla_var3.model.cache import PagedLatentCache

    rng = random.Random(1)
    for _ in range(150):
        b, bs, k, p = rng.randint(0, 4), rng.choice([1, 2, 16, 17, 64]), 4, 2
        cache = PagedLatentCache.empty(b, k, p, num_blocks=rng.randint(0, 6), block_size=bs)
        for _ in range(rng.randint(0, 3)):
            s = rng.randint(1, 40)
            cache = cache.append(torch.randn(b, s, k), torch.randn(b, s, p))
            if rng.random() < 0.5:
                cache = cache.reserve(rng.randint(0, 50))
        if b and rng.random() < 0.5:          # ragged lengths over the same blocks
            lengths = torch.tensor([rng.randint(0, cache.max_len) for _ in range(b)], dtype=torch.int32)
            cache = PagedLatentCache(cache.kv, cache.block_table, lengths, k, cache.free, 0)
        s = rng.randint(0, 100)
        kv, table, free = cache._blocks_for(cache.seqlens.tolist(), s, "s")
        grown, want, want_free = _blocks_one_by_one(cache, cache.seqlens.tolist(), s)
        assert kv.shape[0] == grown and torch.equal(kv[: cache.num_blocks], cache.kv) and not kv[cache.num_blocks:].any()
        assert torch.equal(table, want) and free == want_free


@pytest.mark.parametrize("b", [1, 3])
def test_f_empty_paged_cache_converts_to_latent(b):
    """``to_latent`` of a paged cache holding no token raised 'cannot reshape tensor of 0 elements'."""
    from mla_var3.model.cache import PagedLatentCache

    latent = PagedLatentCache.empty(b, 16, 16, block_size=16).reserve(5).to_latent()
    assert latent.z.shape == (b, 0, 16) and latent.kpe.shape == (b, 0, 16) and latent.lengths == (0,) * b


# ------------------------------------------------------------------------------------------------
# G. the layer's absorbed weights after an in-place update of kv_b_proj.weight
# ------------------------------------------------------------------------------------------------

#: ways a trainer or an adapter library changes the weight in place (PEFT's LoRA merge is the
#: first: ``base_layer.weight.data += delta``; its unmerge the second).
IN_PLACE = {
    "data +=": lambda w: w.data.__iadd__(0.3),
    "data -=": lambda w: w.data.__isub__(0.3),
    "data.copy_": lambda w: w.data.copy_(w.data * 1.5),
    "data[rows] =": lambda w: w.data[: w.shape[0] // 2].mul_(-1),
    "no_grad add_": lambda w: w.add_(0.1),
    "data = new": lambda w: setattr(w, "data", w.data + 0.2),
}


@pytest.mark.parametrize("mode", ["absorbed", "naive", "hybrid", "auto"])
@pytest.mark.parametrize("update", list(IN_PLACE))
def test_g_layer_follows_in_place_weight_updates(update, mode):
    """Was: max |out - fresh layer| = 2.67 after ``kv_b_proj.weight.data += 0.3`` (logits of an
    enabled model off the stock model's by up to 7.7 after a LoRA merge)."""
    from mla_var3.model import MLAConfig, MLALayer

    cfg = MLAConfig.from_preset("deepseek-v3").scaled(div=16, h=4)
    layer = MLALayer.random(cfg, dtype=torch.float64, seed=0).requires_grad_(False)
    x = torch.randn(2, 5, cfg.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(5).expand(2, 5)
    layer(x, pos, mode=mode)                                     # forms (and keeps) the absorbed weights
    IN_PLACE[update](layer.kv_b_proj.weight)
    fresh = MLALayer.from_state_dict(cfg, layer.state_dict())
    got, _ = layer(x, pos, mode=mode)
    want, _ = fresh(x, pos, mode=mode)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# I. enable() on a model whose attention modules share a module or a cache slot
# ------------------------------------------------------------------------------------------------

def _tiny_hf_model():
    transformers = pytest.importorskip("transformers")

    config = transformers.DeepseekV3Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        q_lora_rank=24, first_k_dense_replace=3, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(config).eval()


@pytest.mark.parametrize("pair", [(0, 1), (0, 2), (1, 2)])
def test_i_an_attention_module_shared_by_two_layers_is_refused(pair):
    """Was: replaced under its first name only; generate then failed on MLACache containers."""
    from mla_var3.integrations.transformers import enable, is_enabled

    model = _tiny_hf_model()
    a, b = pair
    model.model.layers[b].self_attn = model.model.layers[a].self_attn
    with pytest.raises(ValueError, match=rf"model\.layers\.{a}\.self_attn and model\.layers\.{b}\.self_attn are one "
                                         r"DeepseekV3Attention module shared by two layers"):
        enable(model)
    assert not is_enabled(model)


def test_i_two_attention_modules_with_one_layer_idx_are_refused():
    from mla_var3.integrations.transformers import enable, is_enabled

    model = _tiny_hf_model()
    model.model.layers[2].self_attn.layer_idx = 0
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn and model\.layers\.2\.self_attn both have "
                                         r"layer_idx=0"):
        enable(model)
    assert not is_enabled(model)


# ------------------------------------------------------------------------------------------------
# J. one softmax-scale validator at every entry point
# ------------------------------------------------------------------------------------------------

def _bad_scales():
    return {"True": True, "False": False, "'0.1'": "0.1", "None": None, "nan": float("nan"), "inf": float("inf"),
            "-inf": float("-inf"), "-0.5": -0.5, "0": 0, "0.0": 0.0, "[0.1]": [0.1], "1+0j": 1 + 0j,
            "10**400": 10**400, "tensor(True)": torch.tensor(True), "tensor 2 values": torch.tensor([0.1, 0.2])}


BAD_SCALES = ["True", "False", "'0.1'", "None", "nan", "inf", "-inf", "-0.5", "0", "0.0", "[0.1]", "1+0j", "10**400",
              "tensor(True)", "tensor 2 values"]


def _scale_calls():
    """entry point -> a call taking the scale (small valid inputs in :data:`KERNEL_DTYPE`: the
    scale is checked before anything runs)."""
    from mla_var3 import kernel, reference as ref
    from mla_var3.model import LatentCache, mla_attention
    from mla_var3.shapes import MLADims, Problem

    dims = MLADims(h=2, d=16, p=16, k=32, dv=16, name="tiny")
    x = ref.make_inputs(dims, Problem(b=2, s=1, t=16), dtype=KERNEL_DTYPE, device=DEVICE)
    lengths = torch.tensor([16, 9], dtype=torch.int32, device=DEVICE)
    kv, table = ref.make_paged(x.z, x.kpe, lengths, page_block_size=16)
    cache = LatentCache(x.z, x.kpe, lengths)
    return {
        "kernel.flash_attention": lambda sc: kernel.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, scale=sc),
        "kernel.flash_mla": lambda sc: kernel.flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=sc),
        "kernel.flash_mla_paged": lambda sc: kernel.flash_mla_paged(x.qc, x.qpe, kv, table, lengths, scale=sc),
        "kernel.mla_var6_plus": lambda sc: kernel.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new,
                                                                scale=sc),
        "reference.flash_attention": lambda sc: ref.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, sc),
        "reference.flash_mla": lambda sc: ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, sc),
        "reference.flash_mla_paged": lambda sc: ref.flash_mla_paged(x.qc, x.qpe, kv, table, lengths, sc),
        "reference.mla_var6_plus": lambda sc: ref.mla_var6_plus(x.q, x.qpe, x.qc, x.z_old, x.kpe, x.k_new, x.v_new, sc),
        "model.mla_attention": lambda sc: mla_attention(x.q, x.qpe, cache, x.w_uk, x.w_uv, scale=sc, design="absorbed",
                                                        backend="reference"),
    }


ENTRY_POINTS = ["kernel.flash_attention", "kernel.flash_mla", "kernel.flash_mla_paged", "kernel.mla_var6_plus",
                "reference.flash_attention", "reference.flash_mla", "reference.flash_mla_paged",
                "reference.mla_var6_plus", "model.mla_attention"]


@pytest.mark.parametrize("scale", BAD_SCALES)
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_j_bad_scales_are_refused_at_every_entry_point(entry, scale):
    if entry == "kernel.flash_attention" and scale == "None":
        pytest.skip("None is the expanded kernel's default scale, 1/sqrt(d + p)")
    call = _scale_calls()[entry]
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        call(_bad_scales()[scale])


def test_j_real_scales_of_other_types_give_the_float_result():
    import numpy as np

    call = _scale_calls()["reference.flash_mla"]
    want = call(0.125)
    for scale in (np.float32(0.125), np.float64(0.125), torch.tensor(0.125), torch.tensor([0.125])):
        for got, ref in zip(call(scale), want):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("scale", ["True", "'0.1'", "nan", "-0.5", "0"])
def test_j_compat_positional_mistake_is_refused(scale):
    """``flash_mla_with_kvcache(q, k, tb, sl, 64, meta, None, True)`` put ``causal`` in the scale's
    position and ran with scale 1.0; a string scale was accepted too."""
    from mla_var3 import reference as ref
    from mla_var3.compat import flash_mla_with_kvcache, get_mla_metadata
    from mla_var3.shapes import MLADims, Problem

    dims = MLADims(h=2, d=16, p=16, k=32, dv=16, name="tiny")
    x = ref.make_inputs(dims, Problem(b=2, s=1, t=16), dtype=torch.bfloat16)
    lengths = torch.tensor([16, 9], dtype=torch.int32)
    kv, table = ref.make_paged(x.z, x.kpe, lengths, page_block_size=16)
    q = torch.cat([x.qc, x.qpe], dim=-1).transpose(1, 2).contiguous()
    meta, _ = get_mla_metadata()
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        flash_mla_with_kvcache(q, kv, table, lengths, dims.k, meta, None, _bad_scales()[scale])


# ------------------------------------------------------------------------------------------------
# K. one length-dtype rule for every tensor of lengths
# ------------------------------------------------------------------------------------------------

def _bad_lengths():
    return {"bool": torch.tensor([True, True], device=DEVICE),
            "uint8": torch.tensor([1, 1], dtype=torch.uint8, device=DEVICE),
            "int16": torch.tensor([1, 1], dtype=torch.int16, device=DEVICE),
            "float32": torch.tensor([1.0, 1.0], device=DEVICE), "complex": torch.tensor([1 + 0j, 1 + 0j], device=DEVICE),
            "list": [1, 1]}


def _length_calls():
    """place -> a call taking a [2] tensor of lengths (1 is valid for every one of them)."""
    from mla_var3 import kernel, reference as ref
    from mla_var3.compat import flash_mla_with_kvcache
    from mla_var3.model import ExpandedCache, LatentCache, PagedLatentCache
    from mla_var3.model.hybrid_cache import HybridCache
    from mla_var3.shapes import MLADims, Problem

    dims = MLADims(h=2, d=16, p=16, k=32, dv=16, name="tiny")
    x = ref.make_inputs(dims, Problem(b=2, s=1, t=16), dtype=KERNEL_DTYPE, device=DEVICE)
    xb = ref.make_inputs(dims, Problem(b=2, s=1, t=16), dtype=torch.bfloat16, device=DEVICE)
    kv, table = ref.make_paged(x.z, x.kpe, torch.tensor([16, 16], dtype=torch.int32, device=DEVICE),
                               page_block_size=16)
    q = torch.cat([xb.qc, xb.qpe], dim=-1).transpose(1, 2).contiguous()
    return {
        "LatentCache": lambda sl: LatentCache(x.z, x.kpe, sl),
        "ExpandedCache": lambda sl: ExpandedCache(x.k, x.v, x.kpe, sl),
        "HybridCache": lambda sl: HybridCache(x.z, x.kpe, x.k[:, -4:], x.v[:, -4:], sl, 4),
        "PagedLatentCache": lambda sl: PagedLatentCache(kv, table, sl, dims.k),
        "kernel.flash_attention": lambda sl: kernel.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, seqlens=sl),
        "kernel.flash_mla": lambda sl: kernel.flash_mla(x.qc, x.qpe, x.z, x.kpe, scale=0.1, seqlens=sl),
        "kernel.flash_mla_paged": lambda sl: kernel.flash_mla_paged(x.qc, x.qpe, kv, table, sl, scale=0.1),
        "compat": lambda sl: flash_mla_with_kvcache(q, kv.to(torch.bfloat16), table, sl, dims.k, None),
        "reference.flash_attention": lambda sl: ref.flash_attention(x.q, x.qpe, x.k, x.v, x.kpe, 0.1, seqlens=sl),
        "reference.flash_mla": lambda sl: ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, 0.1, seqlens=sl),
        "reference.flash_mla_paged": lambda sl: ref.flash_mla_paged(x.qc, x.qpe, kv, table, sl, 0.1),
    }


LENGTH_PLACES = ["LatentCache", "ExpandedCache", "HybridCache", "PagedLatentCache", "kernel.flash_attention",
                 "kernel.flash_mla", "kernel.flash_mla_paged", "compat", "reference.flash_attention",
                 "reference.flash_mla", "reference.flash_mla_paged"]


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int16", "float32", "complex", "list"])
@pytest.mark.parametrize("place", LENGTH_PLACES)
def test_k_lengths_that_are_not_int32_or_int64_are_refused(place, dtype):
    """Was: ``LatentCache(z, kpe, torch.tensor([True, True]))`` gave lengths (1, 1)."""
    call = _length_calls()[place]
    words = "be an int32 or int64 tensor" if dtype == "list" else f"have dtype in (int32, int64), got {dtype}"
    with pytest.raises(ValueError, match=r"seqlens must " + words.replace("(", r"\(").replace(")", r"\)")):
        call(_bad_lengths()[dtype])


@pytest.mark.parametrize("place", ["LatentCache", "ExpandedCache", "HybridCache", "PagedLatentCache",
                                   "reference.flash_mla"])
def test_k_int32_and_int64_lengths_still_work(place):
    call = _length_calls()[place]
    for dtype in (torch.int32, torch.int64):
        call(torch.tensor([16, 3], dtype=dtype))


# ------------------------------------------------------------------------------------------------
# O. no command; P. calibrate checks its inputs before timing
# ------------------------------------------------------------------------------------------------

def test_o_no_command_is_one_usage_line_and_status_2(capsys):
    """Was: 16 lines of help on stderr. A missing command is a usage error (argparse's own answer
    to a required sub-command is status 2); the help stays with --help, on stdout, status 0."""
    code, out, err = run_cli(capsys)
    assert_usage_error(code, err, "a command is required", "cost", "calibrate", "--help")
    assert out == ""
    code, out, err = run_cli(capsys, "--help")
    assert code == 0 and "COMMAND" in out and err == ""


@pytest.fixture
def no_timing(monkeypatch):
    """calibrate must refuse bad input before the timing run starts."""
    from mla_var3.cli import calibrate as calibrate_command

    def refuse(**_):
        raise AssertionError("the timing run started")
    monkeypatch.setattr(calibrate_command, "run_calibration", refuse)


@pytest.mark.parametrize("content,words", [
    (b"\xff\xfegarbage", "not UTF-8 text"), (b"\x00\x01", "not valid JSON"), (b"", "is empty"),
    (b"[1]", "JSON object of devices"), (b'{"x": {"name": "X"}}', "missing"),
    (('{"x": {"name": "X", "bf16_tflops": %s, "bandwidth_gbs": 1, "memory_gb": 1}}' % HUGE).encode(), "finite"),
])
def test_p_calibrate_refuses_a_bad_devices_file_before_timing(capsys, tmp_path, no_timing, content, words):
    path = tmp_path / "devs.bin"
    path.write_bytes(content)
    code, out, err = run_cli(capsys, "calibrate", "--devices-file", str(path), "--out", str(tmp_path / "c.json"))
    assert_usage_error(code, err, "--devices-file", str(path), words)


@pytest.mark.parametrize("out,words", [
    ("missing_dir/x.json", "does not exist"), (".", "is a folder"), ("file.txt/x.json", "is not a folder"),
])
def test_p_calibrate_refuses_an_output_path_it_cannot_write_before_timing(capsys, tmp_path, monkeypatch, no_timing,
                                                                          out, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    code, _, err = run_cli(capsys, "calibrate", "--out", out)
    assert_usage_error(code, err, "--out", words)


def test_p_calibrate_missing_devices_file_and_env(capsys, tmp_path, monkeypatch, no_timing):
    code, _, err = run_cli(capsys, "calibrate", "--devices-file", str(tmp_path / "nope.json"))
    assert_usage_error(code, err, "--devices-file", "no such file")
    monkeypatch.setenv("MLA_VAR3_DEVICES", str(tmp_path / "gone.json"))
    code, _, err = run_cli(capsys, "calibrate", "--out", str(tmp_path / "c.json"))
    assert_usage_error(code, err, "$MLA_VAR3_DEVICES", "gone.json")


# ------------------------------------------------------------------------------------------------
# the probe after the fixes: variants of the same kinds, each case's expectation in its row
# (63 cases: 36 through the CLI, 27 through the API). Verdicts of the first run: 58 as expected;
# parse_calibration(None) and parse_calibration(5) raised AttributeError (fixed: the reader
# refuses what is not JSON text); three rows expected the key "source" where --json writes
# "calibrated_source" (the rows were wrong, not the program).
# ------------------------------------------------------------------------------------------------

def _cal_text(change) -> str:
    raw = _shipped_calibration()
    change(raw)
    return json.dumps(raw)


def _param(name: str, **fields):
    def change(raw):
        next(p for p in raw["parameters"] if p["name"] == name).update(fields)
    return change


_DEV = '{"x": {"name": "X", "bf16_tflops": 100, "bandwidth_gbs": 1000, "memory_gb": 80%s}}'
_DEEP = "[" * 100_000 + "]" * 100_000
BIG = str(2**53)

#: (id, files {name: text or bytes; "DIR" makes a folder}, argv ({name} is the file's path), exit status,
#: words of the one error line, or of stdout for status 0)
CLI_PROBES = [
    ("cal sms 1e308", {"c": _cal_text(_set("sms", 1e308))}, ["cost", "--design", "flash_mla", "--calibration", "{c}"],
     2, ["'sms' must be an integer"]),
    ("cal format other", {"c": '{"format": "x"}'}, ["cost", "--design", "flash_mla", "--calibration", "{c}"], 2,
     ["not a calibration file"]),
    ("cal a folder", {"c": "DIR"}, ["regime", "--calibration", "{c}"], 2, ["it is a directory"]),
    ("cal empty", {"c": ""}, ["explain", "--calibration", "{c}"], 2, ["is empty"]),
    ("cal key twice", {"c": _cal_text(lambda raw: None).replace('"sms": 132', '"sms": 132, "sms": 64')},
     ["cost", "--design", "flash_mla", "--calibration", "{c}"], 2, ["'sms' appears twice"]),
    ("cal BOM", {"c": b"\xef\xbb\xbf" + _cal_text(lambda raw: None).encode()},
     ["cost", "--design", "flash_mla", "--calibration", "{c}"], 2, ["not valid JSON"]),
    ("cal efficiency 1e308", {"c": _cal_text(_param("flash_mla.gluon.program_us", value=1e308))},
     ["regime", "--calibration", "{c}"], 2, ["flash_mla.gluon.program_us", "outside its range"]),
    ("cal ceilings kind 5", {"c": _cal_text(_set("ceilings", "kind", 5))}, ["explain", "--calibration", "{c}"], 2,
     ["'kind' must be a string"]),
    ("cal default_backends null", {"c": _cal_text(_set("default_backends", None))},
     ["cost", "--design", "flash_mla", "--calibration", "{c}", "--json"], 0, ['"calibrated_source": "roofline"']),
    ("cal rules empty list", {"c": _cal_text(_set("default_backends", "flash_mla", []))},
     ["cost", "--design", "flash_mla", "--calibration", "{c}", "--json"], 0, ['"calibrated_source": "roofline"']),
    ("cal s_gt 2**60", {"c": _cal_text(_set("default_backends", "flash_attention", [{"backend": "gluon",
                                                                                     "s_gt": 2**60}]))},
     ["cost", "--design", "flash_attention", "--calibration", "{c}"], 2, ["'s_gt' must be an integer of at most"]),
    ("calibration none", {}, ["cost", "--design", "flash_mla", "--calibration", "none", "--json"], 0,
     ['"calibrated_source": "roofline"']),
    ("dev sms 132.0", {"d": _DEV % ', "sms": 132.0'}, ["cost", "--design", "flash_mla", "--devices-file", "{d}"], 2,
     ["'sms' must be an integer"]),
    ("dev nested deep", {"d": _DEEP}, ["cost", "--design", "flash_mla", "--devices-file", "{d}"], 2,
     ["nested too deeply"]),
    ("dev key twice", {"d": '{"x": {"name": "X"}, "x": {"name": "Y"}}'}, ["devices", "--devices-file", "{d}"], 2,
     ["appears twice"]),
    ("dev measured -1e999", {"d": _DEV % ', "measured": {"bf16_tflops": -1e999}'}, ["devices", "--devices-file", "{d}"],
     2, ["-1e999", "finite"]),
    ("dev bandwidth -0", {"d": _DEV.replace('"bandwidth_gbs": 1000', '"bandwidth_gbs": -0') % ""},
     ["devices", "--devices-file", "{d}"], 2, ["positive number"]),
    ("dev 1E400", {"d": _DEV.replace("100,", "1E400,") % ""}, ["devices", "--devices-file", "{d}"], 2,
     ["1E400", "beyond a float's range"]),
    ("dev 309 nines", {"d": _DEV.replace("100,", "9" * 309 + ",") % ""}, ["devices", "--devices-file", "{d}"], 2,
     ["beyond a float's range"]),
    ("dev 309 ones: finite, out of range", {"d": _DEV.replace("100,", "1" * 309 + ",") % ""},
     ["devices", "--devices-file", "{d}"], 2, ["must be between"]),
    ("autotune config 1e999", {"a": '{"format": 1, "entries": {"k": {"config": {"a": 1e999}, "time_us": 1}}}'},
     ["explain", "--autotune-cache", "{a}"], 0, ["choice:"]),
    ("autotune random bytes", {"a": bytes(range(256))}, ["explain", "--autotune-cache", "{a}"], 0, ["choice:"]),
    ("autotune missing", {}, ["explain", "--autotune-cache", "missing.json"], 2, ["--autotune-cache", "no such file"]),
    ("results time 1e999", {"r": _results_text("1e999")}, ["explain", "--results", "{r}"], 2, ["--results", "finite"]),
    ("results records a string", {"r": '{"records": "x"}'}, ["regime", "--results", "{r}"], 2,
     ["'records' must be a JSON list"]),
    ("cost 2**53 everywhere", {}, ["cost", "--design", "flash_attention", "--b", BIG, "--s", BIG, "--t", BIG, "--json"],
     0, ['"time_s"']),
    ("hybrid n = t = 2**53", {}, ["cost", "--design", "mla_var6_plus", "--s", "16", "--t", BIG, "--n", BIG, "--json"],
     0, ['"time_s"']),
    ("explain 2**53", {}, ["explain", "--b", BIG, "--s", BIG, "--t", BIG], 0, ["choice:"]),
    ("regime s up to 2**53", {}, ["regime", "--b", "1", "--t", BIG, "--s", "1," + BIG], 0, ["crossover"]),
    ("empty command", {}, [""], 2, ["invalid choice"]),
    ("option without command", {}, ["--json"], 2, ["unrecognized arguments"]),
    ("misspelt command", {}, ["costt"], 2, ["invalid choice"]),
    ("calibrate out empty", {}, ["calibrate", "--out", ""], 2, ["--out"]),
    ("calibrate out a folder with slash", {"o": "DIR"}, ["calibrate", "--out", "{o}/"], 2, ["is a folder"]),
    ("calibrate devices a folder", {"d": "DIR"}, ["calibrate", "--devices-file", "{d}"], 2,
     ["--devices-file", "it is a directory"]),
    ("calibrate max-seconds 1e400", {}, ["calibrate", "--max-seconds", "1e400"], 2, ["--max-seconds"]),
]


@pytest.mark.parametrize("case", CLI_PROBES, ids=[c[0] for c in CLI_PROBES])
def test_probe_cli(capsys, tmp_path, monkeypatch, no_timing, case):
    _, files, argv, status, words = case
    monkeypatch.chdir(tmp_path)
    paths = {}
    for name, content in files.items():
        path = tmp_path / f"{name}.json"
        if content == "DIR":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        paths[name] = str(path)
    code, out, err = run_cli(capsys, *[a.format(**paths) for a in argv])
    if status == 2:
        assert_usage_error(code, err, *words)
    else:
        assert code == 0, err
        assert all(w in out for w in words), out
        assert "Traceback" not in err and all(line.startswith("mla-var3: warning:") for line in err.splitlines()), err


def _api_probes():
    import numpy as np

    from mla_var3 import _io, reference as ref
    from mla_var3.analysis.calibration import load_calibration, parse_calibration
    from mla_var3.compat import flash_mla_with_kvcache
    from mla_var3.model import ExpandedCache, LatentCache, PagedLatentCache, mla_attention
    from mla_var3.model.hybrid_cache import HybridCache
    from mla_var3.runtime.autotune import AutotuneCache
    from mla_var3.shapes import MLADims, Problem

    dims = MLADims(h=2, d=16, p=16, k=32, dv=16, name="tiny")
    x = ref.make_inputs(dims, Problem(b=2, s=1, t=16))
    xb = ref.make_inputs(dims, Problem(b=2, s=1, t=16), dtype=torch.bfloat16)
    lengths = torch.tensor([16, 9], dtype=torch.int32)
    kv, table = ref.make_paged(xb.z, xb.kpe, lengths, page_block_size=16)
    q = torch.cat([xb.qc, xb.qpe], dim=-1).transpose(1, 2).contiguous()
    paged = PagedLatentCache.empty(2, 16, 16, block_size=16)
    latent = LatentCache(x.z, x.kpe, lengths)

    def put(tmp, config, **info):
        AutotuneCache(tmp / "a.json").put("k", config, **info)

    # id -> (call(tmp_path), None for "works", else the words of the ValueError)
    return {
        "latent reserve np.int64": (lambda tmp: LatentCache.empty(2, 16, 16).reserve(np.int64(10)), None),
        "paged reserve np.int32": (lambda tmp: paged.reserve(np.int32(5)), None),
        "paged reserve 0 is itself": (lambda tmp: paged.reserve(0) is paged or 1 / 0, None),
        "paged reserve 0-d tensor": (lambda tmp: paged.reserve(torch.tensor(5)), "tokens must be a non-negative integer"),
        "hybrid reserve np.float64": (lambda tmp: HybridCache.empty(2, 2, 16, 16, 16, 4).reserve(np.float64(3.0)),
                                      "max_len must be a non-negative integer"),
        "lengths 0-d": (lambda tmp: LatentCache(x.z, x.kpe, torch.tensor(16, dtype=torch.int32)),
                        "seqlens must be a [B=2] tensor"),
        "expanded bool lengths": (lambda tmp: ExpandedCache(x.k, x.v, x.kpe, torch.tensor([True, False])),
                                  "seqlens must have dtype in (int32, int64), got bool"),
        "kernel lengths 2-d": (lambda tmp: __import__("mla_var3.kernel", fromlist=["x"]).flash_mla(
            *(t.to(DEVICE, KERNEL_DTYPE) for t in (x.qc, x.qpe, x.z, x.kpe)), scale=0.1,
            seqlens=lengths[None].to(DEVICE)),
            "seqlens must be [B]"),
        "scale np inf": (lambda tmp: ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, np.float64("inf")),
                         "scale must be a positive finite number"),
        "scale tensor nan": (lambda tmp: ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, torch.tensor(float("nan"))),
                             "scale must be a positive finite number"),
        "scale bf16 tensor": (lambda tmp: ref.flash_mla(x.qc, x.qpe, x.z, x.kpe, torch.tensor(0.1, dtype=torch.bfloat16)),
                              None),
        "compat softmax_scale 0.0": (lambda tmp: flash_mla_with_kvcache(q, kv, table, lengths, 32, None,
                                                                        softmax_scale=0.0), "scale must be"),
        "compat softmax_scale False": (lambda tmp: flash_mla_with_kvcache(q, kv, table, lengths, 32, None,
                                                                          softmax_scale=False), "scale must be"),
        "mla_attention scale True": (lambda tmp: mla_attention(x.q, x.qpe, latent, x.w_uk, x.w_uv, scale=True,
                                                               design="absorbed", backend="reference"), "scale must be"),
        "load_calibration int path": (lambda tmp: load_calibration(123), "expected a path"),
        "load_calibration bytes path": (lambda tmp: load_calibration(b"x.json"), "expected a path"),
        "parse_calibration None": (lambda tmp: parse_calibration(None), "expected JSON text"),
        "parse_calibration 5": (lambda tmp: parse_calibration(5), "expected JSON text"),
        "autotune put nan config": (lambda tmp: put(tmp, {"a": float("nan")}), "not a finite number"),
        "autotune put huge int config": (lambda tmp: put(tmp, {"a": 10**400}), "not a finite number"),
        "autotune put huge time": (lambda tmp: put(tmp, {"a": 1}, time_us=10**400), "not a positive time"),
        "autotune put time 1e308": (lambda tmp: put(tmp, {"a": 1}, time_us=1e308), None),
        "json 1e308 is finite": (lambda tmp: _io.parse_json('{"a": 1e308}', "f")["a"] == 1e308 or 1 / 0, None),
        "json -0.0": (lambda tmp: _io.parse_json('{"a": -0.0}', "f"), None),
        "json 30-digit int": (lambda tmp: _io.parse_json('{"a": 123456789012345678901234567890}', "f"), None),
        "json lenient NaN": (lambda tmp: _io.parse_json('{"a": NaN}', "f", finite=False), None),
        "json nested NaN in a list": (lambda tmp: _io.parse_json('{"a": [1, {"b": [NaN]}]}', "f"), "holds NaN"),
    }


API_PROBES = ["latent reserve np.int64", "paged reserve np.int32", "paged reserve 0 is itself",
              "paged reserve 0-d tensor", "hybrid reserve np.float64", "lengths 0-d", "expanded bool lengths",
              "kernel lengths 2-d", "scale np inf", "scale tensor nan", "scale bf16 tensor", "compat softmax_scale 0.0",
              "compat softmax_scale False", "mla_attention scale True", "load_calibration int path",
              "load_calibration bytes path", "parse_calibration None", "parse_calibration 5", "autotune put nan config",
              "autotune put huge int config", "autotune put huge time", "autotune put time 1e308",
              "json 1e308 is finite", "json -0.0", "json 30-digit int", "json lenient NaN", "json nested NaN in a list"]


@pytest.mark.parametrize("case", API_PROBES)
def test_probe_api(tmp_path, case):
    call, words = _api_probes()[case]
    if words is None:
        call(tmp_path)
    else:
        with pytest.raises(ValueError) as info:
            call(tmp_path)
        assert words in str(info.value), str(info.value)

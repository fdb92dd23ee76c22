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

from mla_var3.cli import main

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

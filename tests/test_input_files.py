"""Every file loader refuses a bad file with one ValueError that names the file and what is wrong
with it: devices files, benchmark results, measured n sweeps (the JSON loaders share
``mla_var3._io``), for every kind of damage a disk or a careless edit produces."""

from __future__ import annotations

import json
import math

import pytest

from mla_var3 import _io
from mla_var3.analysis.devices import DEVICES_ENV, DeviceFileError, load_devices
from mla_var3.analysis.plots import load_n_sweep
from mla_var3.runtime.records import Record, load_results

#: (name, bytes written, words the message must contain). The file name is always checked too.
DAMAGED = [
    ("random bytes", bytes(range(255, 0, -1)) * 3, "not UTF-8 text"),
    ("truncated", b'{"records": [{"name": "flash_mla", "kind"', "truncated?"),
    ("empty", b"", "is empty"),
    ("whitespace only", b"  \n\t", "is empty"),
    ("not JSON", b"hello", "not valid JSON"),
    ("a JSON list", b"[1, 2]", "JSON object"),
    ("a JSON string", b'"results"', "JSON object"),
    ("JSON null", b"null", "JSON object"),
]


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


LOADERS = {
    "devices file": lambda p: load_devices(p),
    "results file": lambda p: load_results(p),
    "sweep file": lambda p: load_n_sweep(p),
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("kind,data,words", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_files_name_the_path_and_the_problem(tmp_path, loader, kind, data, words):
    path = _write(tmp_path, "damaged.json", data)
    with pytest.raises(ValueError) as info:
        LOADERS[loader](path)
    msg = str(info.value)
    assert str(path) in msg and loader in msg and words in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize("loader", list(LOADERS))
def test_missing_file_and_directory(tmp_path, loader):
    with pytest.raises(ValueError, match=rf"cannot read {loader} .*nope.json.*: no such file"):
        LOADERS[loader](tmp_path / "nope.json")
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match=rf"cannot read {loader} .*'.*d': it is a directory"):
        LOADERS[loader](tmp_path / "d")


def test_devices_env_file_is_named_with_the_variable(tmp_path, monkeypatch):
    path = _write(tmp_path, "devs.json", b"\xff\xfe\x00garbage")
    monkeypatch.setenv(DEVICES_ENV, str(path))
    with pytest.raises(DeviceFileError, match=rf"\${DEVICES_ENV}.*devs.json.*not UTF-8"):
        load_devices()


@pytest.mark.parametrize("field,value,words", [
    ("bf16_tflops", "NaN", r"holds NaN at line 1 column \d+ \(not a JSON number\)"),   # refused by the reader
    ("bf16_tflops", "Infinity", r"holds Infinity at line 1 column \d+ \(not a JSON number\)"),
    ("bandwidth_gbs", "1e300", "between"),
    ("memory_gb", "1e-300", "between"),
    ("sms", "132.5", "integer"),
    ("name", '""', "non-empty string"),
])
def test_device_numbers_out_of_range(tmp_path, field, value, words):
    entry = {"name": '"X"', "bf16_tflops": "100", "bandwidth_gbs": "1000", "memory_gb": "80", field: value}
    text = "{" + '"x": {' + ", ".join(f'"{k}": {v}' for k, v in entry.items()) + "}}"
    path = _write(tmp_path, "devs.json", text.encode())
    with pytest.raises(DeviceFileError, match=words):
        load_devices(path)


# --- results files ------------------------------------------------------------------------------

GOOD_RECORD = {"name": "flash_mla", "kind": "design", "model": "deepseek-v3", "b": 32, "s": 1, "t": 4096,
               "status": "ok", "time_us": 80.5}


@pytest.mark.parametrize("change,words", [
    ({"records": 3}, "'records' must be a JSON list"),
    ({"records": None}, "'records' must not be null"),
    ({"meta": []}, "'meta' must be a JSON object"),
    ({"meta": {"dims": 5}}, "meta 'dims'"),
    ({"records": [5]}, "record 0 must be a JSON object"),
    ({"records": [{"name": "flash_mla"}]}, "record 0: missing 'kind'"),
    ({"records": [dict(GOOD_RECORD, b="32")]}, "record 0: 'b' must be an integer"),
    ({"records": [dict(GOOD_RECORD, b=0)]}, "'b' must be positive"),
    ({"records": [dict(GOOD_RECORD, s=True)]}, "'s' must be an integer"),
    ({"records": [GOOD_RECORD, dict(GOOD_RECORD, time_us=float("nan"))]}, "holds NaN at line 1 column"),   # the reader
    ({"records": [dict(GOOD_RECORD, time_us=float("inf"))]}, "holds Infinity at line 1 column"),
    ({"records": [dict(GOOD_RECORD, time_us=-3.0)]}, "'time_us' must be non-negative"),
    ({"records": [dict(GOOD_RECORD, time_us="fast")]}, "'time_us' must be a number"),
    ({"records": [dict(GOOD_RECORD, status="great")]}, "'status' must be one of"),
    ({"records": [dict(GOOD_RECORD, extra=[])]}, "'extra' must be a JSON object"),
    ({"records": [dict(GOOD_RECORD, name=None)]}, "'name' must not be null"),
])
def test_results_rows_with_missing_or_wrong_fields(tmp_path, change, words):
    data = {"meta": {}, "records": [GOOD_RECORD], **change}
    path = _write(tmp_path, "results.json", json.dumps(data).encode())
    with pytest.raises(ValueError, match=words) as info:
        load_results(path)
    assert str(path) in str(info.value)


def test_results_missing_records_key(tmp_path):
    path = _write(tmp_path, "results.json", b'{"meta": {}}')
    with pytest.raises(ValueError, match=r"results.json.*missing 'records'"):
        load_results(path)


def test_good_results_load_and_unknown_keys_are_ignored(tmp_path):
    path = _write(tmp_path, "results.json", json.dumps(
        {"meta": {"device_key": "h200"}, "records": [dict(GOOD_RECORD, future_field=1, n=None)]}).encode())
    meta, records = load_results(path)
    assert meta == {"device_key": "h200"} and records == [Record(**GOOD_RECORD)]


# --- measured n sweeps --------------------------------------------------------------------------

ROW = {"label": "hybrid", "b": 32, "s": 16, "n": 0, "us": 100.0}


@pytest.mark.parametrize("data,words", [
    ({}, "missing 'sweep'"),
    ({"sweep": {}}, "'sweep' must be a JSON list"),
    ({"sweep": [1]}, "sweep row 0 must be a JSON object"),
    ({"sweep": [{"b": 1}]}, "sweep row 0: missing 'label'"),
    ({"sweep": [ROW, dict(ROW, n=-1)]}, "sweep row 1: 'n' must be non-negative"),
    ({"sweep": [dict(ROW, n=1.5)]}, "'n' must be an integer"),
    ({"sweep": [dict(ROW, us=float("nan"))]}, "holds NaN at line 1 column"),
    ({"sweep": [dict(ROW, us=-1)]}, "'us' must be positive"),
    ({"sweep": [dict(ROW, label=3)]}, "'label' must be a string"),
])
def test_sweep_rows_with_missing_or_wrong_fields(tmp_path, data, words):
    path = _write(tmp_path, "sweep.json", json.dumps(data).encode())
    with pytest.raises(ValueError, match=words) as info:
        load_n_sweep(path)
    assert str(path) in str(info.value)


def test_sweep_rows_not_measured_are_skipped(tmp_path):
    rows = [dict(ROW, us=None), dict(ROW, n=64, us=90.0), dict(ROW, n=128, us=95.0)]
    path = _write(tmp_path, "sweep.json", json.dumps({"sweep": rows}).encode())
    assert load_n_sweep(path) == {"hybrid": [(64, 90.0), (128, 95.0)]}


# --- the shared helpers -------------------------------------------------------------------------


def test_quote_cuts_long_values():
    text = _io.quote("1" * 500)
    assert len(text) < 100 and "502 characters" in text


def test_finite_json_replaces_nan_and_infinity_everywhere():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (2, "x"), "e": None}
    assert _io.finite_json(value) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"], "e": None}
    json.dumps(_io.finite_json(value), allow_nan=False)


def test_oversized_file_is_refused(tmp_path):
    path = _write(tmp_path, "big.json", b"[" + b" " * 100 + b"]")
    with pytest.raises(_io.InputFileError, match="big.json.*larger than"):
        _io.read_bytes(path, "results file", limit=50)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_key_given_twice_is_refused(tmp_path, loader):
    path = _write(tmp_path, "dup.json", b'{"records": [], "sweep": [], "records": [], "sweep": []}')
    with pytest.raises(ValueError, match=r"dup.json' is ambiguous: key '(records|sweep)' appears twice"):
        LOADERS[loader](path)


@pytest.mark.parametrize("text,words", [
    ('{"H200": {"name": "a", "bf16_tflops": 1, "bandwidth_gbs": 1, "memory_gb": 1}, '
     '"h200": {"name": "b", "bf16_tflops": 1, "bandwidth_gbs": 1, "memory_gb": 1}}', "'h200' is given twice"),
    ('{" ": {"name": "a", "bf16_tflops": 1, "bandwidth_gbs": 1, "memory_gb": 1}}', "key must not be empty"),
])
def test_device_keys_are_unique_and_not_empty(tmp_path, text, words):
    with pytest.raises(DeviceFileError, match=words):
        load_devices(_write(tmp_path, "devs.json", text.encode()))


def test_huge_integers_in_rows_are_refused(tmp_path):
    path = _write(tmp_path, "results.json", json.dumps({"records": [dict(GOOD_RECORD, t=10**400)]}).encode())
    with pytest.raises(ValueError, match=r"holds 10000000000000000000… \(401 characters\) at line 1 column \d+ "
                                         r"\(beyond a float's range\)"):
        load_results(path)
    path = _write(tmp_path, "results.json", json.dumps({"records": [dict(GOOD_RECORD, t=10**300)]}).encode())
    with pytest.raises(ValueError, match=r"record 0: 't' must be an integer of at most 2\*\*53"):
        load_results(path)

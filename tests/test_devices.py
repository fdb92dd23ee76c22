"""The devices table, user device files and detection."""

import json

import pytest

from mla_var3.analysis.devices import (
    DEVICES_ENV, DeviceFileError, detect_device, device_names, get_device, load_devices, match_device_name,
)

REQUIRED = ["h200", "h100-sxm", "h800", "h20", "b200", "a100-80gb", "rtx-5090", "rtx-4090", "mi300x"]


def test_required_devices_have_sources():
    devices = load_devices()
    for key in REQUIRED:
        dev = devices[key]
        for field in ("bf16_tflops", "fp8_tflops", "bandwidth_gbs", "memory_gb", "sms", "l2_mb", "smem_per_sm_kb"):
            assert dev.sources.get(field), f"{key}.{field} has no source"


def test_h200_numbers():
    h200 = get_device("H200")
    assert h200.measured["bf16_tflops"] == 710 and h200.measured["bandwidth_gbs"] == 4257
    m, d = h200.ceilings("measured"), h200.ceilings("datasheet")
    assert (m.kind, m.flops_per_s, m.bytes_per_s) == ("measured", 710e12, 4257e9)
    assert (d.kind, d.flops_per_s, d.bytes_per_s) == ("datasheet", 989.4e12, 4800e9)
    assert m.ridge == pytest.approx(166.784, abs=1e-3)


def test_user_file_adds_and_overrides(tmp_path, monkeypatch):
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({
        "my-gpu": {"name": "My GPU", "bf16_tflops": 100, "bandwidth_gbs": 1000, "memory_gb": 48, "match": ["my gpu"]},
        "h200": {"name": "H200 at our clocks", "bf16_tflops": 900, "bandwidth_gbs": 4000, "memory_gb": 141},
    }))
    devs = load_devices(f)
    assert devs["my-gpu"].ridge() == 100.0
    assert devs["h200"].bf16_tflops == 900 and devs["h200"].measured is None
    assert "rtx-5090" in devs
    monkeypatch.setenv(DEVICES_ENV, str(f))
    assert get_device("my-gpu").name == "My GPU"
    assert "my-gpu" in device_names()


@pytest.mark.parametrize("text,match", [
    ('{"x": 1', "not valid JSON"),
    ("[1, 2]", "JSON object of devices"),
    ('{"x": 3}', "must be a JSON object"),
    ('{"x": {"name": "X", "bf16_tflops": 1}}', "missing bandwidth_gbs, memory_gb"),
    ('{"x": {"name": "X", "bf16_tflops": -1, "bandwidth_gbs": 1, "memory_gb": 1}}', "'bf16_tflops' must be a positive number"),
    ('{"x": {"name": "X", "bf16_tflops": "fast", "bandwidth_gbs": 1, "memory_gb": 1}}', "positive number"),
    ('{"x": {"name": "X", "bf16_tflops": 1, "bandwidth_gbs": 1, "memory_gb": 1, "measured": {"bandwidth_gbs": 0}}}', "measured"),
])
def test_malformed_files(tmp_path, text, match):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(DeviceFileError, match=match):
        load_devices(f)


def test_missing_file():
    with pytest.raises(DeviceFileError, match="cannot read devices file"):
        load_devices("/nonexistent/devices.json")


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu'.*h200"):
        get_device("tpu")


def test_match_names():
    assert match_device_name("NVIDIA H200").key == "h200"
    assert match_device_name("NVIDIA H20").key == "h20"
    assert match_device_name("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert match_device_name("NVIDIA GeForce RTX 5090").key == "rtx-5090"
    assert match_device_name("AMD Instinct MI300X").key == "mi300x"
    assert match_device_name("Some Other GPU") is None


def test_detect_without_gpu_falls_back_to_h200(monkeypatch):
    torch = pytest.importorskip("torch")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dev, note = detect_device()
    assert dev.key == "h200" and "no GPU" in note


def test_detect_with_a_known_and_an_unknown_gpu(monkeypatch):
    torch = pytest.importorskip("torch")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA GeForce RTX 4090")
    assert detect_device()[0].key == "rtx-4090"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mystery Accelerator")
    dev, note = detect_device()
    assert dev.key == "h200" and "not in the devices table" in note

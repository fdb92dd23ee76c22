"""HBM read bandwidth by SM count: the streaming-read probe (under the interpreter on a CPU: it
reads every element exactly once), the curve stored for the H200 and how it is read, and
``mla-var3 devices`` showing it."""

from __future__ import annotations

import json
import re

import pytest
import torch

from mla_var3 import cli
from mla_var3.analysis.devices import DeviceFileError, get_device, load_devices
from mla_var3.runtime.ceilings import (
    TMA_BLOCK_ROWS, TMA_CHECK_ROWS, TMA_ROW_ELEMENTS, NoGPUError, device_entry, measure_read_by_sms, stream_read,
    tma_read_available, tma_stream_read,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("programs", [1, 2, 5])
def test_stream_read_reads_every_element_once(programs):
    """Program i sums blocks i, i + P, ... of the buffer: the partials are exactly those sums (a
    block read twice or skipped, or a read past the end, would show)."""
    block = 8192                                  # 32 KB of float32
    n = 3 * block + 5                             # a ragged last block
    padded = torch.full((n + block,), float("nan"), device=DEVICE)
    padded[:n] = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    x = padded[:n]
    parts = stream_read(x, programs)
    want = [sum(x[j * block:(j + 1) * block].double().sum().item() for j in range(i, 4, programs))
            for i in range(programs)]
    assert parts.shape == (programs,) and parts.dtype == torch.float32
    assert parts.double().cpu().tolist() == pytest.approx(want, rel=1e-5, abs=1e-3)


def test_stream_read_refuses_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        stream_read(torch.zeros(4, 4, device=DEVICE), 1)
    with pytest.raises(ValueError, match="programs"):
        stream_read(torch.zeros(16, device=DEVICE), 0)


@pytest.mark.skipif(not tma_read_available(), reason="the TMA read needs Gluon and an sm_90 GPU")
@pytest.mark.parametrize("programs", [1, 3, 7])
def test_tma_read_delivers_every_block_once(programs):
    """Program i sums the first rows of blocks i, i + P, ...: a block skipped, read twice or given
    to the wrong slot would change the sums."""
    blocks = 11
    x = torch.randn(blocks * TMA_BLOCK_ROWS * TMA_ROW_ELEMENTS, generator=torch.Generator().manual_seed(1))
    x = x.to("cuda", torch.bfloat16)
    parts = tma_stream_read(x, programs)
    first_rows = x.view(blocks, TMA_BLOCK_ROWS, TMA_ROW_ELEMENTS)[:, :TMA_CHECK_ROWS].double().sum(dim=(1, 2))
    want = [first_rows[i::programs].sum().item() for i in range(programs)]
    assert parts.double().cpu().tolist() == pytest.approx(want, rel=1e-4, abs=1e-2)


def test_tma_read_refuses_bad_input():
    if not tma_read_available():
        with pytest.raises(NoGPUError, match="sm_90"):
            tma_stream_read(torch.zeros(TMA_BLOCK_ROWS * TMA_ROW_ELEMENTS, dtype=torch.bfloat16), 1)
        return
    with pytest.raises(ValueError, match="multiple"):
        tma_stream_read(torch.zeros(100, dtype=torch.bfloat16, device="cuda"), 1)
    with pytest.raises(ValueError, match="programs"):
        tma_stream_read(torch.zeros(TMA_BLOCK_ROWS * TMA_ROW_ELEMENTS, dtype=torch.bfloat16, device="cuda"), 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_measuring_needs_a_gpu():
    with pytest.raises(NoGPUError):
        measure_read_by_sms()


def test_the_h200_curve_is_the_recorded_one():
    """conf/devices.json holds the H200's curve as measured (2026-12-02): 110 GB/s from one SM,
    86 per SM on 44, 34 per SM on all 132."""
    h200 = get_device("h200")
    assert dict(h200.read_by_sms) == {1: 110, 16: 1720, 32: 3110, 44: 3800, 66: 4280, 88: 4230, 132: 4510}
    assert "measured on an H200, 2026-12-02" in h200.read_by_sms_source
    per_sm = {m: h200.read_bandwidth(m) / m / 1e9 for m in (1, 16, 44, 132)}
    assert per_sm == pytest.approx({1: 110, 16: 107.5, 44: 86.36, 132: 34.17}, rel=1e-3)
    assert h200.read_bandwidth(24) == pytest.approx((1720 + 1390 * 8 / 16) * 1e9)      # linear between points
    assert h200.read_bandwidth(8) == pytest.approx((110 + 1610 * 7 / 15) * 1e9)
    assert h200.read_bandwidth(200) == h200.read_bandwidth(132) == 4510e9               # above: all of them
    assert get_device("b200").read_bandwidth(10) is None


@pytest.mark.parametrize("field,block,match", [
    ("read_by_sms", {"sms": [1, 2], "gbs": [1]}, "one length"),
    ("read_by_sms", {"sms": [2, 1], "gbs": [1, 2]}, "increasing"),
    ("read_by_sms", {"sms": [1, 2], "gbs": [1, -2]}, "positive number"),
    ("read_by_sms", {"sms": 4, "gbs": [1]}, "lists"),
    ("window_by_sms", {"query_columns": {}}, "non-empty object 'query_columns'"),
    ("window_by_sms", {"query_columns": {"x": {"sms": [1], "gbs": [1]}}}, "positive integers"),
    ("window_by_sms", {"query_columns": {"16": {"sms": [2, 1], "gbs": [1, 2]}}}, "increasing"),
    ("window_by_sms", {"query_columns": {"16": {"sms": [1], "gbs": [1]}}, "source": 3}, "'source' must be a string"),
])
def test_malformed_curves_are_named(tmp_path, field, block, match):
    f = tmp_path / "devices.json"
    f.write_text(json.dumps({"x": {"name": "X", "bf16_tflops": 1, "bandwidth_gbs": 1, "memory_gb": 1, field: block}}))
    with pytest.raises(DeviceFileError, match=match):
        load_devices(f)


def test_a_measured_curve_is_written_to_the_devices_file(capsys, tmp_path):
    from mla_var3.analysis.devices import Ceilings

    c = Ceilings(700e12, 4.2e12, "measured", "here")
    entry = device_entry(c, base=get_device("h200"), read_by_sms=([(1, 100.0), (132, 4400.0)], "probe"))
    assert entry["read_by_sms"] == {"sms": [1, 132], "gbs": [100.0, 4400.0], "source": "measured in-process: probe"}
    kept = device_entry(c, base=get_device("h200"))
    assert kept["read_by_sms"]["gbs"][-1] == 4510
    f = tmp_path / "devices.json"
    f.write_text(json.dumps({"mine": entry}))
    assert load_devices(f)["mine"].read_bandwidth(132) == 4400e9
    assert cli.main(["devices", "--json"]) == 0
    out = {d["key"]: d for d in json.loads(capsys.readouterr().out)}
    assert out["h200"]["read_by_sms"]["sms"] == [1, 16, 32, 44, 66, 88, 132] and out["b200"]["read_by_sms"] is None
    assert out["h200"]["window_by_sms"] == get_device("h200").window_by_sms_block() and out["b200"]["window_by_sms"] is None
    assert kept["window_by_sms"] == get_device("h200").window_by_sms_block()


def test_explain_says_what_the_window_needs_against_what_the_chip_reads(capsys):
    """explain's "to win" line for the hybrid puts the window on an SM partition against the
    chip's HBM reads at that SM count: at b = 32, t = 4096, s = 32 (issue 40's accounting) a
    window on about a third of the SMs needs less per SM than they read; the sentence is absent
    for a device without a measured curve."""
    import dataclasses

    from mla_var3.analysis.calibration import load_calibration, predict
    from mla_var3.analysis.what_it_takes import partition_need
    from mla_var3.shapes import Problem, get_preset

    cal, v3, pb = load_calibration(device="h200"), get_preset("deepseek-v3"), Problem(32, 32, 4096)
    target = predict(cal, "flash_mla", v3, pb).time_s / 1.02
    need = partition_need(cal, v3, pb, target)
    h200 = get_device("h200")
    assert need.chip == pytest.approx(h200.read_bandwidth(need.sms) / need.sms)
    assert 16 <= need.sms <= 88 and need.rate <= need.chip
    halved = dataclasses.replace(h200, read_by_sms=tuple((m, g / 2) for m, g in h200.read_by_sms))
    worse = partition_need(cal, v3, pb, target, device=halved)
    assert worse.rate / worse.chip > 1 >= need.rate / need.chip
    assert partition_need(cal, v3, pb, target, device=dataclasses.replace(h200, read_by_sms=None)) is None
    assert cli.main(["explain", "--b", "32", "--s", "32", "--t", "4096", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["what_it_takes"]["hybrid"]
    found = re.search(r"at best (\d+) GB/s per SM on (\d+) SMs at n = (\d+), where the chip reads (\d+) per SM", text)
    rate, sms, n, chip = map(int, found.groups())
    assert chip == round(h200.read_bandwidth(sms) / sms / 1e9) and rate <= chip and 0 < n < 4096
    design = int(re.search(r"the window kernel's loads and products alone stream (\d+)", text).group(1))
    assert design == round(h200.window_bandwidth(sms, 32) / sms / 1e9)
    assert ("within both" in text) == (rate <= min(chip, design))
    plain = partition_need(cal, v3, pb, target, device=dataclasses.replace(h200, window_by_sms=None))
    assert plain.design is None and plain.gives == plain.chip


def test_the_window_designs_own_ceiling_by_sms_and_query_columns():
    """The H200's window curve (``window_ceiling.py`` part 5): per SM it stays below the HBM read
    at small counts, more query columns stream less, an s takes the fewest measured columns that
    hold it (none past 64), and a device without the curve has none."""
    h200 = get_device("h200")
    assert sorted(h200.window_by_sms) == [16, 32, 64] and "window_ceiling.py part 5" in h200.window_by_sms_source
    for m in (16, 44):
        per_sm = [h200.window_bandwidth(m, s) / m / 1e9 for s in (16, 32, 64)]
        assert per_sm == sorted(per_sm, reverse=True) and per_sm[0] < h200.read_bandwidth(m) / m / 1e9
    assert h200.window_bandwidth(44, 1) == h200.window_bandwidth(44, 16) == 3508e9
    assert h200.window_bandwidth(44, 17) == h200.window_bandwidth(44, 32)
    assert h200.window_bandwidth(30, 16) == pytest.approx((1473 + (3508 - 1473) * 14 / 28) * 1e9)
    assert h200.window_bandwidth(44, 65) is None and get_device("b200").window_bandwidth(44, 16) is None
    assert h200.window_by_sms_block()["query_columns"]["32"]["sms"] == [8, 16, 44, 66, 132]


def test_explain_at_s16_says_the_window_needs_more_than_this_design_streams(capsys):
    """At b = 32, s = 16, t = 4096 the partition needs more per SM than the window design's loads
    and products stream there (measured on an H200): explain says so."""
    assert cli.main(["explain", "--b", "32", "--s", "16", "--t", "4096", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["what_it_takes"]["hybrid"]
    found = re.search(r"at best (\d+) GB/s per SM on (\d+) SMs.*loads and products alone stream (\d+): (.*)$", text)
    rate, sms, design, verdict = int(found.group(1)), int(found.group(2)), int(found.group(3)), found.group(4)
    assert rate > design and verdict.startswith("more than")

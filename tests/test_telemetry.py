"""The GPU telemetry sampler (``mla_var3.runtime.telemetry``) with a scripted reader, and the
interference suite's no-interference finish time (``benchmarks/hybrid_check.py``)."""

import sys
import time

import pytest

from mla_var3.runtime.telemetry import TelemetrySampler, nvml_reader


def scripted(readings):
    """A reader that returns ``readings`` in turn, then repeats the last one."""
    it = iter(readings)
    last = [readings[-1]]

    def read():
        last[0] = next(it, last[0])
        return last[0]
    return read, {1: "GpuIdle", 4: "SwPowerCap", 8: "HwSlowdown"}


def test_summary_is_min_mean_max_and_the_union_of_reasons():
    sampler = TelemetrySampler(reader=scripted([(1980.0, 2619.0, 400.0, 0), (1755.0, 2619.0, 690.0, 4),
                                                (1800.0, 2619.0, 650.0, 4 | 8)]), period_s=0.001)
    with sampler:
        time.sleep(0.05)
    tel = sampler.summary()
    assert tel.samples >= 3 and tel.seconds >= 0.05
    assert tel.sm_mhz[0] == 1755.0 and tel.sm_mhz[2] == 1980.0 and 1755.0 < tel.sm_mhz[1] < 1980.0
    assert tel.power_w[0] == 400.0 and tel.power_w[2] == 690.0
    assert tel.mem_mhz == (2619.0, 2619.0, 2619.0)
    assert tel.reasons == ("SwPowerCap", "HwSlowdown")
    d = tel.as_dict()
    assert d["sm_mhz"] == list(tel.sm_mhz) and d["reasons"] == ["SwPowerCap", "HwSlowdown"]


def test_an_unnamed_reason_bit_is_kept_by_its_number():
    sampler = TelemetrySampler(reader=scripted([(1000.0, 1000.0, 100.0, 1 << 12)]))
    with sampler:
        time.sleep(0.01)
    assert sampler.summary().reasons == ("bit12",)


def test_a_new_block_starts_over_and_a_failing_reader_stops_quietly():
    calls = []

    def read():
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("driver gone")
        return (1500.0, 2000.0, 300.0, 0)
    sampler = TelemetrySampler(reader=(read, {}), period_s=0.001)
    with sampler:
        time.sleep(0.03)
    assert sampler.summary().samples == 2          # the third read raised: the thread ended
    calls.clear()
    with sampler:
        time.sleep(0.03)
    assert sampler.summary().samples == 2


def test_without_nvml_nothing_is_sampled(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # import pynvml raises ImportError
    assert nvml_reader(0) is None
    sampler = TelemetrySampler(0)
    assert not sampler.available
    with sampler:
        pass
    assert sampler.summary() is None


def test_bad_period():
    with pytest.raises(ValueError, match="period_s"):
        TelemetrySampler(reader=scripted([(1.0, 1.0, 1.0, 0)]), period_s=0)


def test_the_latent_part_without_interference(benchmark_module):
    """The latent part's SM-time alone (``latent_us`` on all SMs) runs on the SMs the window
    leaves until the window ends, then on all of them."""
    f = benchmark_module("hybrid_check").latent_without_interference
    # 1,000 us on 132 SMs = 132,000 SM-us; 66 SMs free for the window's 500 us do 33,000 of it,
    # the other 99,000 run on 132 SMs: 750 us more
    assert f(1000.0, 500.0, 66, 132) == pytest.approx(1250.0)
    # a window longer than the latent part on its 66 SMs: the latent part ends first, on 66 SMs
    assert f(1000.0, 5000.0, 66, 132) == pytest.approx(2000.0)
    assert f(1000.0, 0.0, 66, 132) == pytest.approx(1000.0)

"""Roofline time, bound and ceilings, pinned to hand-computed values."""

import pytest

from mla_var3.analysis.cost import Cost, flash_attention, flash_mla
from mla_var3.analysis.devices import Ceilings, get_device
from mla_var3.analysis.roofline import predict, roofline_time
from mla_var3.shapes import Problem, get_preset

V3 = get_preset("deepseek-v3")


def test_roofline_time_and_bound():
    ceil = Ceilings(100e12, 2e12, "datasheet", "")
    assert roofline_time(Cost(100 * 10**12, 10**12), ceil) == (1.0, "compute")   # 1 s compute, 0.5 s memory
    assert roofline_time(Cost(10**12, 4 * 10**12), ceil) == (2.0, "memory")
    assert ceil.ridge == 50.0


def test_predict_flash_mla_h200_measured():
    pr = predict("flash_mla", V3, Problem(b=32, s=1, t=4096), "h200")
    assert pr.ceilings.kind == "measured"
    assert pr.compute_s == pytest.approx(36_507_222_016 / 710e12, rel=1e-12)   # 51.42 µs
    assert pr.memory_s == pytest.approx(159_907_840 / 4257e9, rel=1e-12)       # 37.56 µs
    assert pr.time_s == pr.compute_s and pr.bound == "compute"


def test_predict_flash_attention_h200_datasheet():
    pr = predict("flash_attention", V3, Problem(b=32, s=1, t=4096), "h200", ceilings="datasheet")
    assert pr.ceilings.kind == "datasheet"
    assert pr.time_s == pytest.approx(10_740_039_680 / 4.8e12, rel=1e-12)      # 2,237.5 µs
    assert pr.bound == "memory"
    assert pr.to_dict()["time_s"] == pr.time_s


def test_measured_falls_back_to_datasheet_without_measurements():
    pr = predict("flash_mla", V3, Problem(b=1, s=1, t=64), "h800", ceilings="measured")
    assert pr.ceilings.kind == "datasheet"
    assert pr.ceilings.flops_per_s == 989.4e12


def test_fp8_uses_fp8_peak_and_datasheet():
    pr = predict("flash_mla", V3.with_dtype("fp8"), Problem(b=1, s=1, t=64), "h200")
    assert pr.ceilings.kind == "datasheet"          # no measured fp8 ceiling
    assert pr.ceilings.flops_per_s == 1978.9e12


def test_no_ceiling_for_fp32_or_missing_fp8():
    with pytest.raises(ValueError, match="2-byte"):
        predict("flash_mla", V3.with_dtype("fp32"), Problem(b=1, s=1, t=64), "h200")
    with pytest.raises(ValueError, match="no fp8"):
        predict("flash_mla", V3.with_dtype("fp8"), Problem(b=1, s=1, t=64), "a100-80gb")


def test_predict_unknown_names():
    with pytest.raises(ValueError, match="unknown device"):
        predict("flash_mla", V3, Problem(b=1, s=1, t=64), "tpu")
    with pytest.raises(ValueError, match="unknown ceilings"):
        predict("flash_mla", V3, Problem(b=1, s=1, t=64), "h200", ceilings="guess")


def test_stages_add_time():
    p = Problem(b=32, s=16, t=4096)
    assert predict("flash_mla", V3, p, stages=True).cost.flops > flash_mla(V3, p).flops
    assert predict("flash_attention", V3, p, stages=True).cost == flash_attention(V3, p)


def test_ridge_values():
    h200 = get_device("h200")
    assert h200.ridge("measured") == pytest.approx(710e12 / 4257e9)
    assert h200.ridge("datasheet") == pytest.approx(989.4e12 / 4800e9)

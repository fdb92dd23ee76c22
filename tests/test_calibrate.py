"""``mla-var3 calibrate``: on a CPU it times tiny calls under the interpreter and writes a file
marked as a CPU calibration (the plumbing); the GPU path's fit, keys and grid are checked here
with records made by the shipped H200 calibration itself."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources

import pytest
import torch

from mla_var3 import cli
from mla_var3.analysis.calibration import (
    host_time_s, kernel_hashes, load_calibration, parse_calibration, predict, stale_kernels,
)
from mla_var3.analysis.devices import get_device
from mla_var3.designs import DESIGNS
from mla_var3.cli.calibrate import GRID, QUICK, calibration_from_records, default_backends, records_of_points
from mla_var3.runtime.records import Record
from mla_var3.shapes import Problem, get_preset

V3 = get_preset("deepseek-v3")
H200 = load_calibration(device="h200")
ENV = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "commit": "abcdef0123",
       "dirty": False, "timestamp": "2026-12-02T00:00:00+00:00", "platform": "Linux"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU / interpreter path")
def test_calibrate_on_a_cpu_writes_a_cpu_calibration(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MLA_VAR3_CALIBRATION", raising=False)
    out = tmp_path / "cal.json"
    assert cli.main(["calibrate", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "CPU interpreter" in text and str(out) in text
    raw = json.loads(out.read_text())
    cal = parse_calibration(out.read_text())
    assert raw["gpu"] is False and cal.device == "cpu" and not cal.gpu
    assert set(cal.versions) == {"torch", "triton", "cuda"} and cal.commits["measurements"]
    assert set(cal.default_backends) == {d.kernel for d in DESIGNS}
    assert all(rules == [{"backend": "triton"}] for rules in cal.default_backends.values())
    assert len(cal.points) == 4 and all(p["source"].startswith("mla-var3 calibrate") for p in cal.points)
    assert sorted(p.get("h", 16) for p in cal.points) == [8, 16, 16, 16]      # one call at 8 of the preset's 16 heads
    fitted = [p for p in cal.parameters.values() if p.fitted]
    assert fitted and all("mla-var3 calibrate" in p.source for p in fitted)
    assert "never ship" in cal.notes
    # the code it describes: the commit and the sha256 of the kernel files of the designs it timed
    assert raw["kernels"]["commit"] == cal.commits["measurements"][0]
    assert raw["kernels"]["files"] == kernel_hashes() and not stale_kernels(cal)
    # a CPU calibration never stands for a GPU: asked about the H200, the commands fall back
    assert cli.main(["cost", "--design", "flash_mla", "--calibration", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["calibrated_source"] == "roofline" and "for cpu, not h200" in d["calibration"]


def test_no_cpu_calibration_is_shipped():
    for entry in resources.files("mla_var3.conf").iterdir():
        if entry.name.startswith("calibration-"):
            cal = parse_calibration(entry.read_text(), entry.name)
            assert cal.gpu and cal.device != "cpu", entry.name


def test_a_first_fit_takes_the_measured_ceilings_of_the_device_it_is_given():
    """A GPU with no shipped calibration is fitted in units of the ceilings ``devices --measure``
    wrote for it (the device passed in), not of the devices table's datasheet."""
    dev = dataclasses.replace(get_device("h100-sxm"), measured={"bf16_tflops": 793.0, "bandwidth_gbs": 3020.7,
                                                                 "source": "measured in-process"})
    cal = calibration_from_records(_records_from(H200, QUICK), ENV, dev, gpu=True, shipped=None)
    assert cal.device == "h100-sxm" and cal.ceilings["kind"] == "measured"
    assert (cal.ceilings["flops_per_s"], cal.ceilings["bytes_per_s"]) == (793.0e12, 3020.7e9)


def test_a_first_fit_holds_what_it_runs_to_a_bound_at_the_priors():
    """The shipped H100 file is its calibrate run's points refitted with no shipped base: the
    parameters that fit ran to a bound keep their priors (and say so), the rest are fitted; the
    same fit of the same points gives the same file. (A parameter a law gains after a run is held
    at its prior by the shipping script; the run shipped now, at 4e5c4b4, timed every one.)"""
    from mla_var3.analysis.kernel_laws import SPECS

    h100 = load_calibration(device="h100-sxm")
    held = [n for n, p in h100.parameters.items() if "ran it to a bound" in p.source]
    assert sorted(held) == ["flash_attention.triton.compute_efficiency_m64", "flash_attention.triton.memory_overlap"]
    priors = {f"{d}.{b}.{sp.name}": sp.prior for (d, b), sps in SPECS.items() for sp in sps}
    assert all(not h100.parameters[n].fitted and h100.parameters[n].value == priors[n] for n in held)
    assert "held at their priors" in h100.notes
    again = calibration_from_records(records_of_points(h100.points), {**ENV, "commit": "4e5c4b4"},
                                     get_device("h100-sxm"), gpu=True)
    assert not [n for n, p in h100.parameters.items() if "gained this parameter after the run" in p.source]
    for name, p in again.parameters.items():
        assert p.value == pytest.approx(h100.parameters[name].value, rel=1e-6), name


def _records_from(cal, grid) -> list[Record]:
    """What a GPU run of ``grid`` would record if the kernels ran exactly as ``cal`` says."""
    out = []
    for name, b, s, t, n, h in grid:
        pb = Problem(b=b, s=s, t=t, n=n)
        dims = V3 if h is None else V3.per_gpu(V3.h // h)
        backend = cal.default_backend(name, pb)
        gpu = predict(cal, name, dims, pb, eager=False).time_s * 1e6
        eager = predict(cal, name, dims, pb).time_s * 1e6
        host = host_time_s(cal, name, backend, dims, pb) * 1e6
        out.append(Record(name=name, kind="design", model=V3.name, b=b, s=s, t=t, n=n, time_us=gpu, method="cuda-graph",
                          gpu=True, backend=backend,
                          extra={"graph_us": gpu, "eager_us": eager, "host_us": host, "causal": pb.causal,
                                 "source": "mla-var3 calibrate (abcdef0)", **({"h": h} if h else {})}))
    return out


@pytest.mark.parametrize("shipped", [True, False], ids=["from the shipped file", "from the priors"])
def test_gpu_fit_reproduces_its_records_and_is_keyed(shipped):
    records = _records_from(H200, GRID)
    cal = calibration_from_records(records, ENV, get_device("h200"), gpu=True, shipped=H200 if shipped else None)
    assert cal.device == "h200" and cal.gpu and cal.versions == {"torch": "2.11.0+cu130", "triton": "3.6.0",
                                                                   "cuda": "13.0"}
    assert cal.commits["measurements"] == ["abcdef0"]
    assert cal.kernels["commit"] == "abcdef0" and cal.kernels["files"] == kernel_hashes()
    assert cal.default_backends["flash_attention"] == [{"backend": "gluon", "s_gt": 64}, {"backend": "triton"}]
    assert cal.default_backends["flash_mla"] == [{"backend": "gluon"}]
    for r in records:
        pb = Problem(b=r.b, s=r.s, t=r.t, n=r.n)
        dims = V3 if "h" not in r.extra else V3.per_gpu(V3.h // r.extra["h"])
        assert predict(cal, r.name, dims, pb, eager=False).time_s * 1e6 == pytest.approx(r.extra["graph_us"], rel=0.06), r
    # the points at fewer heads are fitted at their heads
    assert {p.get("h") for p in cal.points} == {None, 16, 32, 64}
    for name in ("flash_mla.gluon.compute_efficiency", "flash_attention.gluon.compute_efficiency",
                 "flash_attention.triton.program_gbs_m16"):    # the last: the grid's call with one short wave
        assert cal.parameters[name].fitted and "mla-var3 calibrate" in cal.parameters[name].source
    assert cal.parameters["flash_attention.triton.program_gbs_m16"].value == pytest.approx(
        H200.parameters["flash_attention.triton.program_gbs_m16"].value, rel=0.05)
    if shipped:     # a kernel the grid does not time keeps the shipped value and source
        assert cal.parameters["flash_mla.triton.compute_efficiency"] == H200.parameters["flash_mla.triton.compute_efficiency"]


def test_the_grid_covers_every_design_within_the_budget():
    assert {p[0] for p in GRID} == {p[0] for p in QUICK} == {d.kernel for d in DESIGNS}
    assert set(QUICK) < set(GRID)
    # every design at 16 heads (TP 8), the absorbed one at 16, 32 and 64 besides the model's 128
    assert {(p[0], p[5]) for p in GRID} == {(d.kernel, None) for d in DESIGNS} | {
        (d.kernel, 16) for d in DESIGNS} | {("flash_mla", 32), ("flash_mla", 64)}
    assert len(GRID) == 62 and len(QUICK) == 16        # 48 and 11 at 128 heads only
    for name, b, s, t, n, h in GRID:
        Problem(b=b, s=s, t=t, n=n)
        assert h is None or V3.h % h == 0
    # the timed work alone, by the shipped calibration: warm-up, capture, repetitions bounded by
    # 0.25 s per timing, 100 host calls; compilation comes on top and the run stops at 150 s
    def seconds(grid):
        total = 0.0
        for name, b, s, t, n, h in grid:
            dims = V3 if h is None else V3.per_gpu(V3.h // h)
            e = predict(H200, name, dims, Problem(b=b, s=s, t=t), n=n).time_s
            total += 2 * 0.25 + 2 * 5 * e + 115 * e
        return total
    assert seconds(GRID) < 75 and seconds(QUICK) < 20


def test_default_backend_rules_follow_the_records():
    recs = [Record("flash_attention", "design", V3.name, 32, s, 4096, backend="gluon" if s > 64 else "triton")
            for s in (1, 16, 64, 128, 1024)] + [Record("flash_mla", "design", V3.name, 32, s, 4096, backend="gluon")
                                                  for s in (1, 2)]
    assert default_backends(recs) == {"flash_attention": [{"backend": "gluon", "s_gt": 64}, {"backend": "triton"}],
                                      "flash_mla": [{"backend": "gluon"}]}


def test_records_name_the_kernel_that_ran(monkeypatch):
    """The expanded design's sm_90 backend hands s <= 64 to the portable kernel: calibrate and
    bench labelled those records "gluon", so the Gluon law was fitted to the portable kernel's
    times and the shipped rules sent s <= 64 to it (at a6efe19: [{"backend": "gluon"}])."""
    from mla_var3.kernel import launchers

    monkeypatch.setattr(launchers.backends, "available", lambda name, device: ["gluon", "triton"])
    assert [launchers.backend_name("flash_attention", "cuda", s=s) for s in (1, 64, 65, 1024)] == [
        "triton", "triton", "gluon", "gluon"]
    assert launchers.backend_name("flash_attention", "cuda") == "gluon"          # the registered default
    assert launchers.backend_name("flash_attention", "cuda", s=128, tuned=True) == "triton"
    assert launchers.backend_name("flash_mla", "cuda", s=1) == "gluon"


def test_host_times_of_short_calls_are_timed_twice_and_the_lower_kept(monkeypatch):
    """A call under HOST_RETIME_BELOW_US of GPU time is host-timed again after the grid and keeps
    the lower reading (both recorded); a longer call keeps its one reading."""
    import mla_var3.reference.inputs as inputs_mod
    import mla_var3.runtime.timing as timing_mod
    from mla_var3.cli import calibrate as C

    readings = iter([40.0, 90.0])
    monkeypatch.setattr(timing_mod, "host_time_us", lambda fn, **kw: next(readings))
    monkeypatch.setattr(inputs_mod, "design_inputs", lambda *a, **kw: {})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    dims = get_preset("deepseek-v3")
    recs = [Record(name="flash_mla", kind="design", model=dims.name, b=32, s=s, t=4096, time_us=us,
                   extra={"host_us": host}) for s, us, host in ((1, 77.0, 85.0), (2, 125.0, 60.0), (16, 2000.0, 99.0))]
    C._retime_host(recs, dims, "cuda", lambda m: None)
    assert [r.extra["host_us"] for r in recs] == [40.0, 60.0, 99.0]
    assert recs[0].extra["host_us_passes"] == [85.0, 40.0] and recs[1].extra["host_us_passes"] == [60.0, 90.0]
    assert "host_us_passes" not in recs[2].extra


def test_the_eager_law_is_fitted_from_both_sides_of_the_balance():
    """Records whose eager times follow eager = max(GPU + lead x host, host + tail x GPU) give back
    lead (from the GPU-bound calls) and tail (from the host-bound ones) for the absorbed kernel;
    the predictions then reproduce the eager times the law made."""
    h100 = load_calibration(device="h100-sxm")
    made = h100.with_parameters({f"flash_mla.gluon.{k}": dataclasses.replace(h100.parameters[f"flash_mla.gluon.{k}"],
                                                                               value=v)
                                 for k, v in (("eager_lead", 0.2), ("eager_tail", 0.15))})
    records = [r for r in _records_from(made, GRID) if r.name == "flash_mla"]
    cal = calibration_from_records(records, ENV, get_device("h100-sxm"), gpu=True, shipped=made)
    assert cal.parameters["flash_mla.gluon.eager_lead"].value == pytest.approx(0.2, abs=0.02)
    assert cal.parameters["flash_mla.gluon.eager_tail"].value == pytest.approx(0.15, abs=0.02)
    assert "GPU-bound" in cal.parameters["flash_mla.gluon.eager_lead"].source
    for r in records:
        pb = Problem(b=r.b, s=r.s, t=r.t, n=r.n)
        dims = V3 if "h" not in r.extra else V3.per_gpu(V3.h // r.extra["h"])
        assert predict(cal, r.name, dims, pb).time_s * 1e6 == pytest.approx(r.extra["eager_us"], rel=0.06), r

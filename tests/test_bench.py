"""The bench runner, baselines, ceilings helpers and the measurement CLI commands (CPU)."""

import json

import pytest
import torch

from mla_var3 import cli, reference
from mla_var3.runtime import baselines as BL
from mla_var3.analysis.regime import N_ALIGN, aligned_best_n
from mla_var3.cli import sweep as B
from mla_var3.reference.inputs import design_inputs
from mla_var3.shapes import Problem, get_preset
from mla_var3.testing import assert_close


#: tests of the no-GPU path (refusals, interpreter grid).
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU / interpreter path")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_VAR3_CACHE_DIR", str(tmp_path / "cache"))


def test_default_grid_plan():
    dims = get_preset("deepseek-v3")
    spec = B.BenchSpec(dims=dims, baselines=("torch_eager_absorbed", "torch_sdpa_expanded"))
    points = B.plan_points(spec, "h200")
    main = [p for p in points if not p.extra.get("sweep")]
    sweep = [p for p in points if p.extra.get("sweep") == "n"]
    assert len(main) == 2 * 10 * (3 + 2)
    assert {p.problem.b for p in points} == {32, 64} and {p.problem.t for p in points} == {4096}
    hyb = [p for p in main if p.name == "mla_var6_plus"]
    assert all(p.problem.n is not None and p.problem.n % N_ALIGN == 0 for p in hyb)
    for b in (32, 64):
        ns = [p.problem.n for p in sweep if p.problem.b == b]
        best = aligned_best_n(dims, Problem(b, 16, 4096), "h200")
        assert best in ns and 0 in ns and 4096 in ns and all(p.problem.s == 16 for p in sweep)


def test_the_auto_n_is_the_one_the_guide_runs():
    """With a calibration the bench times the hybrid at the n ``explain`` and the dispatcher
    choose (the calibrated model's best split), so its record measures the call the guide
    predicts; without one, at the roofline's aligned optimum."""
    from mla_var3.analysis.calibration import load_calibration
    from mla_var3.dispatch import CacheInfo, Dispatcher

    dims = get_preset("deepseek-v3")
    cal = load_calibration(None, device="h200")
    spec = B.BenchSpec(dims=dims, designs=("mla_var6_plus",), ss=(1, 28, 36), bs=(5, 20), t=7168, sweep_s=None)
    guide = Dispatcher("h200", use_measured=False, calibration=cal)
    for p in B.plan_points(spec, "h200", cal):
        est = {e.design: e for e in guide.decide(dims, p.problem.with_n(None), CacheInfo("hybrid", 7168)).estimates}
        assert p.problem.n == est["hybrid"].n and p.extra["n_choice"] == "calibrated model optimum"
    for p in B.plan_points(spec, "h200"):
        assert p.problem.n == aligned_best_n(dims, p.problem.with_n(None), "h200")
        assert p.extra["n_choice"] == "roofline optimum"


def test_a_shape_s_designs_and_baselines_form_one_group():
    """Every design and baseline at one (b, s, t) is one group, timed together (the hybrid's n
    is part of its problem, not of the shape); the n sweep at one shape is one group too."""
    dims = get_preset("deepseek-v3")
    spec = B.BenchSpec(dims=dims, baselines=("torch_eager_absorbed", "flashmla_official"), ss=(1, 16), bs=(32,))
    points = B.plan_points(spec, "h200")
    groups = B.shape_groups(points)
    assert sum(len(g) for g in groups) == len(points) and [p for g in groups for p in g] == points
    assert [(g[0].problem.b, g[0].problem.s) for g in groups] == [(32, 1), (32, 16)]
    for g in groups:
        n_main = len(spec.designs) + len(spec.baselines)
        assert [p.name for p in g[:n_main]] == [*spec.designs, *spec.baselines]
        assert len({(p.problem.b, p.problem.s, p.problem.t) for p in g}) == 1
    # the n sweep follows the main points of its shape (b = 32, s = 16 here) and joins their group
    sweep = [p for p in groups[1] if p.extra.get("sweep")]
    assert len(sweep) == len(groups[1]) - 5 and len({p.problem.n for p in sweep}) == len(sweep) > 1
    # ragged points of other lengths never join a dense shape's group
    ragged = B.BenchSpec(dims=dims, designs=("flash_mla",), baselines=("flashmla_official",), ss=(1,), bs=(4,),
                         seqlens="random:10:4096")
    kinds = [[bool(p.extra.get("lengths")) for p in g] for g in B.shape_groups(B.plan_points(ragged, "h200"))]
    assert kinds == [[False, False], [True, True]]


def _fake_prepared(name, fn):
    rec = B.Record(name=name, kind=B.BASELINE, model="m", b=1, s=1, t=64, n=None, dtype="bf16")
    return B._Prepared(B.Point(name, B.BASELINE, Problem(1, 1, 64)), rec, fn, 1e-4)


def test_points_of_a_shape_are_timed_in_the_same_repetitions(monkeypatch):
    """One interleaved timing for the whole shape; each point records the others, and with
    official FlashMLA among them FlashMLA / it as the median of per-repetition ratios."""
    from mla_var3.runtime import timing as T

    seen = []

    def fake(fns, *, use_graph=True, **kw):
        seen.append((tuple(fns), use_graph))
        base = {"0": [10.0, 20.0, 30.0], "1": [20.0, 20.0, 20.0]}   # "0": ours, "1": FlashMLA
        samples = {k: base[k] for k in fns}
        timings = {k: T.summarize(v, method="cuda-graph" if use_graph else "cuda-events", gpu=True, l2="x")
                   for k, v in samples.items()}
        return T.Interleaved(timings, samples)

    monkeypatch.setattr(T, "time_interleaved", fake)
    monkeypatch.setattr(T, "host_times_us", lambda fns, calls, warmup: {k: 5.0 + int(k) for k in fns})
    spec = B.BenchSpec(dims=get_preset("deepseek-v3").replace(h=4), designs=(), warmup=1, reps=3, min_reps=1)
    ours, fm = _fake_prepared("flash_mla", lambda: None), _fake_prepared(B.FLASHMLA, lambda: None)
    _tiny_runner(spec)._time_together([ours, fm])
    assert seen == [(("0", "1"), True), (("0", "1"), False)]       # one graph and one eager timing, both calls
    assert ours.rec.time_us == 20.0 and fm.rec.time_us == 20.0
    assert ours.rec.extra["flashmla_ratio"] == 1.0                  # median of 2.0, 1.0, 0.667 per repetition
    assert ours.rec.extra["flashmla_ratio_eager"] == 1.0 and "flashmla_ratio" not in fm.rec.extra
    assert ours.rec.extra["timed_with"] == [B.FLASHMLA] and fm.rec.extra["timed_with"] == ["flash_mla"]
    assert ours.rec.extra["host_us"] == 5.0 and fm.rec.extra["host_us"] == 6.0 and ours.rec.extra["graph_us"] == 20.0


def test_a_shape_that_does_not_fit_together_is_timed_point_by_point(monkeypatch):
    spec = B.BenchSpec(dims=get_preset("deepseek-v3").replace(h=4), designs=(), warmup=1, reps=2, min_reps=1)
    runner = _tiny_runner(spec)
    sizes = []

    def together(live):
        sizes.append(len(live))
        if len(live) > 1:
            raise torch.cuda.OutOfMemoryError("no room for both")
        live[0].rec.time_us = 1.0

    monkeypatch.setattr(runner, "_time_together", together)
    preps = iter([_fake_prepared("a", lambda: None), _fake_prepared("b", lambda: None)])
    monkeypatch.setattr(runner, "_prepare", lambda point: next(preps))
    monkeypatch.setattr(runner, "_finish", lambda p: p.rec)
    recs = runner.run_group([None, None])
    assert sizes == [2, 1, 1] and all(r.time_us == 1.0 and "timed_alone" in r.extra for r in recs)


def test_eager_absorbed_matches_reference():
    dims = get_preset("deepseek-v3").replace(h=4)
    pr = Problem(b=2, s=3, t=37)
    x = design_inputs("flash_mla", dims, pr, dtype="fp32", device="cpu")
    out = BL.eager_absorbed(x["qc"], x["qpe"], x["z"], x["kpe"], x["scale"], BL.bottom_right_mask(3, 37, "cpu"))
    ref, _ = reference.flash_mla(x["qc"], x["qpe"], x["z"], x["kpe"], x["scale"], causal=True)
    assert_close(out, ref, torch.float32, tol=1e-5)


def test_sdpa_expanded_baseline_uses_bottom_right_mask():
    dims = get_preset("deepseek-v3").replace(h=4)
    pr = Problem(b=2, s=5, t=33)
    bl = BL.make_baseline("torch_sdpa_expanded", dims, pr, dtype="fp32", device="cpu")
    x = design_inputs("flash_attention", dims, pr, dtype="fp32", device="cpu")     # same seed: same tensors
    ref, _ = reference.flash_attention(x["q"], x["qpe"], x["k"], x["v"], x["kpe"], x["scale"], causal=True)
    assert_close(bl.call(), ref, torch.float32, tol=1e-5)
    assert bl.backend.startswith("sdpa:") and "bottom-right" in bl.backend
    # SDPA's own is_causal would align top-left: a different answer for s < t
    bottom_right = BL.bottom_right_mask(5, 33, "cpu")
    assert not torch.equal(bottom_right, torch.ones(5, 33, dtype=torch.bool).tril())
    assert bottom_right[0].sum() == 33 - 5 + 1 and bottom_right[-1].all()


def test_optional_baselines_skip_cleanly():
    dims = get_preset("deepseek-v3").replace(h=4)
    for name in ("flashmla_official", "flashinfer_mla"):
        with pytest.raises(BL.BaselineUnavailable):
            BL.make_baseline(name, dims, Problem(1, 1, 64), device="cpu")
    with pytest.raises(ValueError, match="unknown baseline"):
        BL.make_baseline("nope", dims, Problem(1, 1, 64))


def _tiny_runner(spec):
    from mla_var3.analysis.devices import get_device

    dev = get_device("h200")
    return B.Runner(spec, "cpu", dev, dev.ceilings("measured"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="drives the CPU runner; the GPU runner is exercised by the benchmark itself")
def test_runner_keeps_points_on_ctrl_c_and_skips_slow_points():
    dims = get_preset("deepseek-v3").replace(h=4)
    spec = B.BenchSpec(dims=dims, designs=(), bs=(1,), ss=(1, 2), t=64, sweep_s=None,
                       baselines=("torch_eager_absorbed", "torch_sdpa_expanded"), warmup=1, reps=2, min_reps=1)
    runner = _tiny_runner(spec)
    points = B.plan_points(spec, "h200")
    seen = []

    def on_record(r):
        seen.append(r)
        if len(seen) == 2:
            raise KeyboardInterrupt

    records, interrupted = runner.run(points, on_record=on_record, progress=False)
    assert interrupted and len(records) == 2 and all(r.status == "ok" and r.time_us > 0 for r in records)
    assert records[0].gpu is False and records[0].method == "perf-counter"

    slow = B.BenchSpec(dims=dims, designs=(), bs=(1,), ss=(1,), t=64, sweep_s=None,
                       baselines=("torch_eager_absorbed",), slow_point_seconds=1e-9)
    (r,), _ = _tiny_runner(slow).run(B.plan_points(slow, "h200"), progress=False)
    assert r.status == "skipped" and "per-point budget" in r.note and r.time_us is None


@CPU_ONLY
def test_bench_refuses_on_cpu(capsys):
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--interpret" in err


@CPU_ONLY
def test_bench_interpret_tiny_grid(tmp_path, capsys):
    out = tmp_path / "res"
    rc = cli.main(["bench", "--interpret", "--designs", "flash_mla", "--s", "1", "--baselines", "--out", str(out),
                   "--no-progress"])
    assert rc == 0, capsys.readouterr()
    data = json.loads((out / "results.json").read_text())
    recs = {r["name"]: r for r in data["records"]}
    assert set(recs) == {"flash_mla", "torch_eager_absorbed", "torch_sdpa_expanded", "flashmla_official",
                         "flashinfer_mla"}
    assert recs["flash_mla"]["status"] == "ok" and recs["flash_mla"]["gpu"] is False
    assert recs["flash_mla"]["backend"] == "triton" and recs["flash_mla"]["flops"] > 0  # the default call: no config forced
    assert recs["flash_mla"]["config"] is None and recs["flash_mla"]["extra"]["config_source"] == "default"
    assert recs["flashmla_official"]["status"] == "skipped"
    assert data["meta"]["ceilings"]["kind"] in ("measured", "datasheet")
    assert data["meta"]["environment"]["interpreter"] is True
    assert "not GPU timings" in (out / "results.md").read_text()
    assert (out / "roofline.png").stat().st_size > 0 and (out / "time_vs_s.png").stat().st_size > 0
    # each design record carries the calibrated prediction of its default call (the shipped H200's)
    assert recs["flash_mla"]["extra"]["calibrated_source"] == "calibrated"
    assert recs["flash_mla"]["extra"]["calibrated_us"] > 0 and "cal/meas" in (out / "results.md").read_text()
    assert "calibrated_us" not in recs["torch_eager_absorbed"]["extra"]
    # every point also records its eager time and its host time per call
    assert recs["flash_mla"]["extra"]["eager_us"] > 0 and recs["flash_mla"]["extra"]["host_us"] > 0


@CPU_ONLY
def test_bench_interpret_ragged_paged_batches(tmp_path, capsys):
    """--seqlens adds ragged paged points: the compat call over FlashMLA's layout, and official
    FlashMLA (skipped here: not importable on a CPU) on the same inputs."""
    out = tmp_path / "res"
    rc = cli.main(["bench", "--interpret", "--designs", "flash_mla", "--s", "1", "--baselines", "--seqlens",
                   "random:100:4096", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr()
    recs = json.loads((out / "results.json").read_text())["records"]
    ragged = [r for r in recs if r["extra"].get("lengths") is not None]
    assert {r["name"] for r in ragged} == {"flash_mla_paged", "flashmla_official"}
    ours = next(r for r in ragged if r["name"] == "flash_mla_paged")
    assert ours["status"] == "ok" and "compat" in ours["backend"] and len(ours["extra"]["lengths"]) == ours["b"]
    assert all(2 <= n <= 64 for n in ours["extra"]["lengths"]) and ours["extra"]["host_us"] > 0
    assert next(r for r in ragged if r["name"] == "flashmla_official")["status"] == "skipped"


def test_ragged_lengths_spec():
    assert B.ragged_lengths("random:3:9", 50, 10, seed=1) == B.ragged_lengths("random:3:9", 50, 10, seed=1)
    assert all(3 <= n <= 9 for n in B.ragged_lengths("random:3:9", 50, 10))
    assert B.ragged_lengths("5,7", 5, 10) == [5, 7, 5, 7, 5]
    for bad in ("random:5", "random:0:3", "random:4:3", "x", "3,,4", "random:1:99"):
        with pytest.raises(ValueError, match="seqlens"):
            B.ragged_lengths(bad, 4, 10)


@CPU_ONLY
def test_devices_measure_refuses_on_cpu(capsys):
    assert cli.main(["devices", "--measure"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert cli.main(["devices", "--write", "x.json"]) == 2
    assert cli.main(["devices", "--json"]) == 0                 # the table still works


@CPU_ONLY
def test_measure_ceilings_needs_gpu():
    from mla_var3.runtime.ceilings import NoGPUError, measure_ceilings

    with pytest.raises(NoGPUError, match="needs a CUDA GPU"):
        measure_ceilings()


def test_user_device_file_written_and_loadable(tmp_path):
    from mla_var3.analysis.devices import Ceilings, get_device, load_devices
    from mla_var3.runtime.ceilings import device_entry, write_user_device

    measured = Ceilings(700e12, 4.2e12, "measured", "test run")
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"mine": {"name": "Mine", "bf16_tflops": 1, "bandwidth_gbs": 1, "memory_gb": 1}}))
    write_user_device(path, "h200", device_entry(measured, base=get_device("h200")))
    write_user_device(path, "newgpu", device_entry(measured, name="New GPU", memory_gb=80.0, sms=100))
    devs = load_devices(path)
    assert {"mine", "h200", "newgpu"} <= set(devs)
    c = devs["h200"].ceilings("measured")
    assert c.kind == "measured" and c.flops_per_s == 700e12 and c.bytes_per_s == 4.2e12
    assert devs["h200"].bf16_tflops == get_device("h200").bf16_tflops          # datasheet kept
    assert devs["newgpu"].ceilings("measured").flops_per_s == 700e12
    path.write_text("{broken")
    with pytest.raises(ValueError, match="not valid JSON"):
        write_user_device(path, "h200", device_entry(measured, base=get_device("h200")))


def test_autotune_command_show_and_clear(tmp_path, capsys):
    from mla_var3.runtime.autotune import AutotuneCache

    AutotuneCache().put("dev|flash_mla|x", {"block_m": 64}, time_us=3.0)
    assert cli.main(["autotune"]) == 0
    assert "1 tuned configs" in capsys.readouterr().out
    assert cli.main(["autotune", "--clear"]) == 0
    assert not AutotuneCache().path.exists()


@pytest.mark.parametrize("change,words", [
    (dict(bs=()), "bs must be a non-empty tuple"),
    (dict(ss=(0,)), "ss must be"),
    (dict(ss=[1, 2]), "ss must be"),
    (dict(t=True), "t must be"),
    (dict(n=(-1,)), "n must be"),
    (dict(designs=("magic",)), "unknown design"),
    (dict(point_seconds=float("nan")), "point_seconds"),
    (dict(max_seconds=float("inf")), "max_seconds"),
    (dict(reps=0), "reps must be"),
])
def test_bench_spec_refuses_bad_values(change, words):
    """interpret_spec(ss=()) raised 'max() arg is an empty sequence'; NaN budgets never stop."""
    with pytest.raises(ValueError, match=f"BenchSpec: {words}"):
        B.BenchSpec(dims=get_preset("deepseek-v3"), **change)

"""The commands that predict use the calibrated model: each takes ``--calibration``, says
"roofline" where the device has no calibration, shows the roofline, the calibrated and (with a
results file) the measured time side by side; ``explain`` picks the design of least calibrated
time and says what the losing designs would need."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import pytest

from mla_var3 import cli
from mla_var3.analysis.calibration import load_calibration, predict, save_calibration
from mla_var3.analysis.regime import HYBRID_MARGIN, calibrated_crossover_s, calibrated_split, regime_guide
from mla_var3.analysis.what_it_takes import hybrid_need, requirement, resource_law_s
from mla_var3.shapes import Problem, get_preset

V3 = get_preset("deepseek-v3")
H200 = load_calibration(device="h200")

#: every command that predicts, with the arguments that make it print quickly.
PREDICTING = {
    "cost": ["cost", "--design", "flash_mla", "--s", "16"],
    "regime": ["regime", "--s", "1,16,1024"],
    "report": ["report", "--no-kernel-check", "--format", "md,json"],
    "explain": ["explain", "--s", "16", "--no-measured"],
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_VAR3_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLA_VAR3_CALIBRATION", raising=False)
    monkeypatch.delenv("MLA_VAR3_DEVICES", raising=False)


def run(capsys, argv):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _argv(name, tmp_path, *extra):
    argv = PREDICTING[name] + list(extra)
    return argv + (["--out", str(tmp_path / "report")] if name == "report" else [])


def test_the_predicting_commands_are_the_ones_with_calibration():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    with_flag = {name for name, p in sub.choices.items() if any("--calibration" in a.option_strings for a in p._actions)}
    assert with_flag == set(PREDICTING) | {"bench"}     # bench: each record's calibrated prediction


@pytest.mark.parametrize("name", list(PREDICTING))
def test_without_a_calibration_the_command_says_roofline(capsys, tmp_path, name):
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "b200"))
    assert code == 0, err
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert "no calibration for b200" in text and "roofline" in text
    if name != "report":
        code, out, err = run(capsys, _argv(name, tmp_path, "--device", "b200", "--json"))
        d = json.loads(out)
        assert {"cost": d.get("calibrated_source"), "regime": d.get("prediction"),
                "explain": d.get("prediction")}[name] == "roofline"
    else:
        d = json.loads((tmp_path / "report" / "report.json").read_text())
        assert d["regime"]["prediction"] == "roofline"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU (interpreter) bench")
def test_bench_records_say_roofline_without_a_calibration(capsys, tmp_path):
    out = tmp_path / "res"
    argv = ["bench", "--interpret", "--designs", "flash_mla", "--s", "1", "--out", str(out), "--no-progress"]
    assert cli.main(argv + ["--device", "b200"]) == 0, capsys.readouterr()
    rec = json.loads((out / "results.json").read_text())["records"][0]
    assert rec["extra"]["calibrated_source"] == "roofline"
    path = save_calibration(H200, tmp_path / "mine.json")
    assert cli.main(argv + ["--device", "h200", "--calibration", str(path)]) == 0, capsys.readouterr()
    rec = json.loads((out / "results.json").read_text())["records"][0]
    assert rec["extra"]["calibrated_source"] == "calibrated"


@pytest.mark.parametrize("name", list(PREDICTING))
def test_every_predicting_command_takes_a_calibration_file(capsys, tmp_path, name):
    path = save_calibration(H200, tmp_path / "mine.json")
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "h200", "--calibration", str(path)))
    assert code == 0, err
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert "mine.json" in text
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "h200", "--calibration", "none"))
    assert code == 0, err
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert "roofline" in text and "mine.json" not in text


@pytest.mark.parametrize("name", list(PREDICTING))
@pytest.mark.parametrize("damage", [b"\xff\xfe" * 10, b"{", b'{"format": "x"}', None])
def test_a_bad_calibration_file_is_one_line_naming_it(capsys, tmp_path, name, damage):
    path = tmp_path / "cal.json"
    if damage is not None:
        path.write_bytes(damage)
    code, out, err = run(capsys, _argv(name, tmp_path, "--calibration", str(path)))
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err, err


@pytest.mark.parametrize("argv", [["regime"], ["report", "--no-kernel-check"]], ids=["regime", "report"])
@pytest.mark.parametrize("damage", [b"\xff\xfe" * 10, b'{"records": [', None])
def test_a_bad_results_file_is_one_line_naming_it(capsys, tmp_path, argv, damage):
    path = tmp_path / "results.json"
    if damage is not None:
        path.write_bytes(damage)
    code, _, err = run(capsys, argv + ["--out", str(tmp_path / "r")] * (argv[0] == "report") + ["--results", str(path)])
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err and "--results" in err, err


def _crossover() -> int:
    """The shipped H200 calibration's crossover at b = 32, t = 4,096 (38 at 8d7f6ec, 40 at
    a6efe19), within the measured bracket: the absorbed design faster at s = 32, the expanded
    one at s = 64 on an H200."""
    s = calibrated_crossover_s(H200, V3, 32, 4096)
    assert s is not None and 32 < s <= 64, s
    return s


def test_regime_table_has_roofline_calibrated_and_measured(capsys, tmp_path):
    from mla_var3.runtime.records import Record, write_results

    recs = [Record("flash_mla", "design", V3.name, 32, 16, 4096, time_us=1003.0),
            Record("mla_var6_plus", "design", V3.name, 32, 16, 4096, n=2048, time_us=4100.0),
            Record("mla_var6_plus", "design", V3.name, 32, 16, 4096, n=4096, time_us=1930.0)]
    path = write_results(tmp_path / "results.json", recs, {"device_key": "h200"})
    code, out, err = run(capsys, ["regime", "--s", "1,16", "--results", str(path)])
    assert code == 0, err
    for word in ("roofline", "calibrated", "measured", "1,003.0 µs", "1,930.0 µs", "regimes (calibrated)",
                 "calibration-h200.json"):
        assert word in out, word
    code, out, err = run(capsys, ["regime", "--s", "1,16", "--results", str(path), "--json"])
    d = json.loads(out)
    assert d["prediction"] == "calibrated" and d["calibrated_crossover_s"] == _crossover()
    assert d["measured"] == [{"s": 16, "times_s": {"flash_mla": pytest.approx(1003e-6),
                                                   "mla_var6_plus": pytest.approx(1930e-6)}, "n": {"mla_var6_plus": 4096}}]
    row = d["rows"][1]
    assert row["calibrated"]["best"] == "flash_mla" and row["calibrated"]["source"]["flash_mla"] == "calibrated"
    assert row["calibrated"]["times_s"]["flash_mla"] == predict(H200, "flash_mla", V3, Problem(b=32, s=16, t=4096)).time_s


def test_report_and_plots_with_calibration_and_results(capsys, tmp_path):
    from mla_var3.runtime.records import Record, write_results

    path = write_results(tmp_path / "r.json", [Record("flash_attention", "design", V3.name, 32, 1024, 4096,
                                                      time_us=16800.0)], {"device_key": "h200"})
    out_dir = tmp_path / "rep"
    code, out, err = run(capsys, ["report", "--no-kernel-check", "--device", "h200", "--out", str(out_dir),
                                  "--results", str(path)])
    assert code == 0, err
    md = (out_dir / "report.md").read_text()
    assert "FlashAttention measured" in md and "16,800.0" in md and "Regime table (calibrated)" in md
    assert f"by the calibrated model at **s = {_crossover()}**" in md
    data = json.loads((out_dir / "report.json").read_text())
    assert data["measured"] == [{"s": 1024, "times_s": {"flash_attention": pytest.approx(0.0168)}, "n": {}}]
    for png in ("roofline.png", "time_vs_s.png"):
        assert (out_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run(capsys, ["regime", "--plot-n", str(tmp_path / "n.png"), "--s", "16"])
    assert code == 0 and (tmp_path / "n.png").exists() and "wrote" in err


# ------------------------------------------------------------------------ the regime guide


def test_calibrated_guide_rows_pick_the_least_calibrated_time():
    g = regime_guide(V3, "h200", 32, 4096, [1, 16, 32, 64, 1024], calibration=H200)
    assert g.prediction == "calibrated" and "calibration-h200.json" in g.calibration
    for r in g.rows:
        times = r.calibrated_times
        single = min(("flash_mla", "flash_attention"), key=times.get)
        want = "mla_var6_plus" if times["mla_var6_plus"] * (1 + HYBRID_MARGIN) < times[single] else single
        assert r.calibrated_best == want
        n, pr = calibrated_split(H200, V3, Problem(b=32, s=r.s, t=4096))
        assert (r.calibrated_n, times["mla_var6_plus"]) == (n, pr.time_s)
    # s = 32: the hybrid's partition priced 2-3 % under the absorbed call (measured on an H200 2.6 % over it
    # at its best n: docs/regimes.md shows both); decode stays absorbed, prefill expanded
    assert [r.calibrated_best for r in g.rows] == ["flash_mla"] * 2 + ["mla_var6_plus"] + ["flash_attention"] * 2
    assert {e.regime: e.best for e in g.calibrated_regimes} == {
        "decode": "flash_mla", "speculative": "flash_mla (s 16), mla_var6_plus (s 32)", "prefill": "flash_attention"}
    # the roofline's own answers are unchanged beside it
    assert {r.s: r.best for r in g.rows}[16] == "mla_var6_plus"


def test_calibrated_split_scans_n_and_falls_back_to_the_roofline():
    pb = Problem(b=32, s=16, t=4096)
    n, pr = calibrated_split(H200, V3, pb)
    grid = [predict(H200, "mla_var6_plus", V3, pb, n=m).time_s for m in range(0, 4097, 64)]
    assert pr.time_s == pytest.approx(min(grid)) and n == 0      # no split at s = 16: as measured (the absorbed kernel)
    n, pr = calibrated_split(H200, V3, pb, lo=0, hi=512)
    assert n <= 512 and pr.time_s == pytest.approx(min(grid[:9]))
    n, pr = calibrated_split(None, V3, pb)
    assert pr.source == "roofline" and n == 1190


def test_the_split_and_the_crossover_ask_about_the_calibrations_own_device():
    """Given another device's calibration and no device, the split and the crossover are the
    calibrated ones of that device, not the H200's roofline (a calibration asked about another
    device does not apply)."""
    h100 = load_calibration(device="h100-sxm")
    pb = Problem(b=32, s=1, t=4096)
    n, pr = calibrated_split(h100, V3, pb)
    assert pr.source == "calibrated" and pr.device == "h100-sxm"
    assert (n, pr.time_s) == (lambda m: (m[0], m[1].time_s))(calibrated_split(h100, V3, pb, "h100-sxm"))
    assert calibrated_crossover_s(h100, V3, 32, 4096) == calibrated_crossover_s(h100, V3, 32, 4096, "h100-sxm")
    assert calibrated_split(h100, V3, pb, "h200")[1].source == "roofline"     # asked about the H200: no calibration


# ------------------------------------------------------------------------ explain


@pytest.mark.parametrize("b", [32, 64])
@pytest.mark.parametrize("s", [1, 2, 4, 8, 16, 32, 64, 128, 512, 1024])
def test_default_explain_picks_the_least_calibrated_time(capsys, b, s):
    """The bar's grid: the default ``explain --json`` (no results file, no autotune cache) reports
    each design's calibrated kernel time and picks the design whose calibrated whole-call time
    (the kernel plus the stages around it) is least, the hybrid only beyond HYBRID_MARGIN."""
    code, out, err = run(capsys, ["explain", "--device", "h200", "--b", str(b), "--s", str(s), "--t", "4096", "--json"])
    assert code == 0, err
    d = json.loads(out)
    pb = Problem(b=b, s=s, t=4096)
    est = {e["design"]: e for e in d["estimates"]}
    # the kernel column is the calibrated model's (the hybrid's within 1 %: explain and
    # calibrated_split each search the split n their own way)
    assert est["absorbed"]["kernel_s"] == pytest.approx(predict(H200, "flash_mla", V3, pb).time_s, rel=1e-9)
    assert est["expanded"]["kernel_s"] == pytest.approx(predict(H200, "flash_attention", V3, pb).time_s, rel=1e-9)
    assert est["hybrid"]["kernel_s"] == pytest.approx(calibrated_split(H200, V3, pb)[1].time_s, rel=1e-2)
    whole = {k: est[k]["predicted_s"] for k in ("absorbed", "expanded")}
    single = min(whole, key=whole.get)
    assert d["design"] == ("hybrid" if est["hybrid"]["predicted_s"] * (1 + HYBRID_MARGIN) < whole[single] else single)
    assert d["prediction"] == "calibrated" and d["source"] == "model"
    # of the single designs, the absorbed one below the calibrated crossover (s = 40), the expanded above
    assert single == ("absorbed" if s <= 32 else "expanded")
    assert set(d["what_it_takes"]) == {"absorbed", "expanded", "hybrid"} - {d["design"]}


def test_explain_says_what_the_hybrid_would_need(capsys):
    code, out, err = run(capsys, ["explain", "--device", "h200", "--b", "32", "--s", "16", "--no-measured"])
    assert code == 0, err
    line = next(x for x in out.replace("\n", " ").split("to win: ") if x.startswith("the hybrid"))
    assert "GB/s per SM" in line and "absorbed design's rate" in line and "SM·µs per latent key" in line


def test_hybrid_need_meets_the_target_by_its_own_law():
    pb = Problem(b=32, s=16, t=4096)
    target = predict(H200, "flash_mla", V3, pb).time_s / (1 + HYBRID_MARGIN)
    need = hybrid_need(H200, V3, pb, target)
    assert 0 < need.n < 4096
    assert resource_law_s(H200, V3, pb, need.n, need.rate) == pytest.approx(target, rel=1e-9)
    # faster than the default call's window reaches, and more than one SM's share of the copy rate:
    # no window kernel reaches it, so the hybrid loses here (docs/kernels/mla-var6-plus/partition.md,
    # "A window kernel for few SMs (Gluon), and the measured limit of the SM partition")
    m = H200.machine()
    assert need.rate > need.own_rate and need.rate > m.bytes_per_s / m.sms
    # every other split needs more
    for n in (1024, 2048, 3072):
        lat_free = resource_law_s(H200, V3, pb, n, math.inf)
        assert lat_free >= target or resource_law_s(H200, V3, pb, n, need.rate) >= target * (1 - 1e-9)
    # a looser target needs less
    assert hybrid_need(H200, V3, pb, 2 * target).rate < need.rate
    assert hybrid_need(H200, V3, pb, 1e-6) is None


@pytest.mark.parametrize("kernel,s,factor,word", [("flash_mla", 1024, 0.5, "tile steps"),
                                                  ("flash_attention", 16, 0.5, "stream"),
                                                  ("flash_attention", 1, 0.04, "host time")])
def test_single_design_requirements(kernel, s, factor, word):
    pb = Problem(b=32, s=s, t=4096)
    own = predict(H200, kernel, V3, pb).time_s
    text = requirement(H200, kernel, V3, pb, own * factor)
    assert word in text and text.startswith("the ")
    assert requirement(H200, kernel, V3, pb, own * 2) == ""          # it already wins
    assert requirement(None, kernel, V3, pb, own * factor) == ""     # the roofline: nothing to say


def test_the_h100_guide_document_is_up_to_date():
    """docs/regimes-h100-sxm.md is what ``benchmarks/regimes.py --device h100-sxm`` makes of the
    shipped H100 calibration: TP 1 and TP 8, b = 32 and 64, every row resting on its data."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "benchmarks/regimes.py", "--device", "h100-sxm", "--print"],
                          cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = (root / "docs" / "regimes-h100-sxm.md").read_text()
    assert proc.stdout == doc and doc.startswith("# The regime guide on the NVIDIA H100")
    rows = [line for line in doc.splitlines() if line.startswith("| ") and "---" not in line and not line.startswith("| s |")]
    assert len(rows) == 44
    for line in rows:
        assert line.rstrip(" |").rsplit("| ", 1)[-1].startswith(("measurements", "calibrated model", "measured ")), line
    assert "--device h100-sxm" in doc and "calibration-h100-sxm.json" in doc


def test_the_regime_guide_document_is_up_to_date():
    """docs/regimes.md is what benchmarks/regimes.py makes of the shipped calibration and the
    committed results (run as a program, as a user runs it); every guide row says on which data
    it rests."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "benchmarks/regimes.py", "benchmarks/results/h200/results.json", "--print"],
                          cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = (root / "docs" / "regimes.md").read_text()
    assert proc.stdout == doc
    rows = [line for line in doc.split("## The benchmark grid")[0].splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| s |")]
    assert len(rows) == 44          # TP 1 and TP 8, b = 32 and 64, 11 s each
    for line in rows:
        assert line.rstrip(" |").rsplit("| ", 1)[-1].startswith(("measurements", "calibrated model", "measured ")), line


@pytest.mark.parametrize("name", list(PREDICTING))
def test_a_calibration_calibrate_made_here_on_the_gpu_is_used(capsys, tmp_path, monkeypatch, name):
    """``mla-var3 calibrate`` writes ./calibration-<device>.json by default; the predicting
    commands run in that folder use it (a calibration of this machine beats the shipped one),
    below --calibration and $MLA_VAR3_CALIBRATION; a file of that name made under the CPU
    interpreter or for another device is skipped with a one-line warning."""
    import dataclasses

    monkeypatch.chdir(tmp_path)
    local = dataclasses.replace(H200, commits={"measurements": ["here001"]}, path=None)
    save_calibration(local, tmp_path / "calibration-h200.json")
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "h200"))
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert code == 0 and "here001" in text, err
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "h200", "--calibration", "none"))
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert code == 0 and "here001" not in text
    monkeypatch.setenv("MLA_VAR3_CALIBRATION", str(save_calibration(H200, tmp_path / "env.json")))
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "h200"))
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert code == 0 and "here001" not in text and "env.json" in text
    monkeypatch.delenv("MLA_VAR3_CALIBRATION")
    save_calibration(dataclasses.replace(local, gpu=False), tmp_path / "calibration-h200.json")
    code, out, err = run(capsys, _argv(name, tmp_path, "--device", "h200"))
    text = out + ((tmp_path / "report" / "report.md").read_text() if name == "report" else "")
    assert code == 0 and "here001" not in text
    assert "calibration-h200.json: not used (CPU interpreter timings)" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------ the held-out check suite

HELDOUT = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout_check.py"


def _heldout_run(capsys, tmp_path, scale: dict) -> Path:
    """A finished held-out run in ``tmp_path`` made from the shipped H200 calibration itself: the
    predictions ``explain --json`` writes, and a results file whose default calls measure the
    calibrated GPU and eager times times ``scale[design]`` (b = 20, s = 1 and 4, t = 10,240)."""
    from mla_var3.analysis.calibration import host_time_s

    cal = load_calibration(device="h200")
    V3 = get_preset("deepseek-v3")
    points, records = [], []
    for s in (1, 4):
        pb = Problem(b=20, s=s, t=10240)
        code, out, err = run(capsys, ["explain", "--json", "--device", "h200", "--b", "20", "--s", str(s), "--t", "10240"])
        assert code == 0, err
        points.append({"h": 128, "b": 20, "s": s, "t": 10240, "explain": json.loads(out)})
        for name in ("flash_mla", "flash_attention", "mla_var6_plus"):
            n = 0 if name == "mla_var6_plus" else None
            backend = cal.default_backend(name, pb)
            gpu = predict(cal, name, V3, pb.with_n(n) if n is not None else pb, eager=False).time_s * 1e6
            eager = predict(cal, name, V3, pb.with_n(n) if n is not None else pb).time_s * 1e6
            host = host_time_s(cal, name, backend, V3, pb.with_n(n) if n is not None else pb) * 1e6
            f = scale.get(name, 1.0)
            records.append({"name": name, "kind": "design", "status": "ok", "model": "deepseek-v3", "b": 20, "s": s,
                            "t": 10240, "n": n, "dtype": "bf16", "time_us": gpu * f, "method": "cuda-graph",
                            "backend": backend, "extra": {"graph_us": gpu * f, "eager_us": eager * f, "host_us": host}})
    folder = tmp_path / "run"
    (folder / "h128-b20-t10240").mkdir(parents=True)
    (folder / "predicted-before-the-run.json").write_text(json.dumps({"device": "h200", "calibration_path": None,
                                                                   "points": points}))
    (folder / "h128-b20-t10240" / "results.json").write_text(json.dumps(
        {"meta": {"dims": {"h": 128}, "environment": {"commit": "test"}}, "records": records}))
    return folder


@pytest.mark.parametrize("scale,misses", [({}, 0), ({"flash_attention": 1.3}, 4), ({"flash_mla": 1.3}, 6)],
                         ids=["exact", "expanded-slow", "absorbed-slow"])
def test_the_heldout_check_scores_a_run_against_the_bar(capsys, tmp_path, scale, misses):
    """``benchmarks/heldout_check.py --compare``: every default call's calibrated ÷ measured time
    against its design's bounds and each pick against the fastest measured design. A run measured
    exactly as the calibration says passes; one design measured 30 % off misses both its kind's
    bound at every point (GPU and eager), and where that makes another design fastest, the pick."""
    import subprocess
    import sys

    folder = _heldout_run(capsys, tmp_path, scale)
    proc = subprocess.run([sys.executable, str(HELDOUT), "--compare", str(folder)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}, timeout=300)
    result = json.loads((folder / "compared.json").read_text())
    assert proc.returncode == (1 if misses else 0), proc.stderr
    assert result["predictions"] == 12 and result["picks_measured"] == 2
    assert result["misses"] == misses, (result["ratios"], result["picks"])
    assert "predictions within bounds" in (folder / "summary.md").read_text()
    if not misses:
        assert all(abs(r["ratio"] - 1) < 1e-9 for r in result["ratios"]) and result["picks_ok"] == 2
    # the eager law alone, at each call's measured GPU and host time: exact where the run is; where
    # the absorbed call's GPU time is 30 % off, its eager misses while the law at the measured
    # times still reads it (the miss is the GPU time's prediction, not the law's)
    eager = [r for r in result["ratios"] if r["kind"] == "eager"]
    assert len(eager) == 6 and all(r["law_at_measured"] > 0 for r in eager)
    for r in eager:
        if not misses or r["design"] != next(iter(scale)):
            assert r["law_at_measured"] == pytest.approx(1.0, abs=1e-9)
        elif r["design"] == "flash_mla":
            assert not r["in_bounds"] and 0.85 <= r["law_at_measured"] <= 1.15
    assert "law at measured" in (folder / "summary.md").read_text()


def test_the_heldout_check_dry_run_writes_predictions_before_timing(tmp_path):
    """``benchmarks/heldout_check.py --dry-run``: the plumbing on a CPU (one tiny shape, ``mla-var3
    bench --interpret`` in its own process): the predictions file, then the shape's results and
    the comparison; a second run into the same folder is refused (predictions are written once)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(HELDOUT), "--dry-run", "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stdout.index("before any timing") < proc.stdout.index("bench status 0")
    predicted = json.loads((out / "predicted-before-the-run.json").read_text())
    assert [(p["h"], p["b"], p["s"], p["t"]) for p in predicted["points"]] == [(16, 1, 1, 64)]
    assert predicted["points"][0]["explain"]["design"] in ("absorbed", "expanded", "hybrid")
    assert (out / "h16-b1-t64" / "results.json").is_file() and (out / "compared.json").is_file()
    again = subprocess.run([sys.executable, str(HELDOUT), "--dry-run", "--out", str(out)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert again.returncode == 2 and "written once" in again.stderr


def test_the_heldout_check_reads_a_calibration_the_run_made_from_its_folder(capsys, tmp_path):
    """A run made with ``--calibrate`` records its calibration as ``calibrate.json``, relative to
    the run's folder: ``--compare`` reads it from there (from any working directory) when no
    ``--calibration`` is given. ``--calibrate`` is refused beside ``--dry-run`` or ``--calibration``."""
    import shutil
    import subprocess
    import sys

    from importlib import resources

    from mla_var3.analysis.calibration import calibration_file_name

    folder = _heldout_run(capsys, tmp_path, {})
    shutil.copy(resources.files("mla_var3") / "conf" / calibration_file_name("h200"), folder / "calibrate.json")
    predicted = json.loads((folder / "predicted-before-the-run.json").read_text())
    (folder / "predicted-before-the-run.json").write_text(json.dumps({**predicted, "calibration_path": "calibrate.json"}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run([sys.executable, str(HELDOUT), "--compare", str(folder)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((folder / "compared.json").read_text())["misses"] == 0
    (folder / "calibrate.json").unlink()                       # the recorded file is the one read: gone, it fails
    gone = subprocess.run([sys.executable, str(HELDOUT), "--compare", str(folder)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert gone.returncode != 0 and "calibrate.json" in gone.stderr
    own = (folder / "compared.json").read_bytes(), (folder / "summary.md").read_bytes()
    other = resources.files("mla_var3") / "conf" / calibration_file_name("h200")
    again = subprocess.run([sys.executable, str(HELDOUT), "--compare", str(folder), "--calibration", str(other)],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr               # another calibration's score is written beside
    stem = Path(str(other)).stem
    assert json.loads((folder / f"compared-{stem}.json").read_text())["misses"] == 0
    assert (folder / f"summary-{stem}.md").is_file()
    assert ((folder / "compared.json").read_bytes(), (folder / "summary.md").read_bytes()) == own
    for extra in (["--dry-run"], ["--calibration", "x.json"]):
        bad = subprocess.run([sys.executable, str(HELDOUT), "--calibrate", "--out", str(tmp_path / "r"), *extra],
                             capture_output=True, text=True, env=env, timeout=120)
        assert bad.returncode == 2 and "--calibrate" in bad.stderr, (extra, bad.stderr)


def test_the_heldout_default_set_is_held_out(benchmark_module):
    """The default shapes of ``benchmarks/heldout_check.py`` share no (heads, b, s, t) with an
    earlier held-out run (``USED_SHAPES``) nor with ``mla-var3 calibrate``'s grid, and the check
    names the points of a set that an earlier run measured."""
    from mla_var3.cli.calibrate import GRID

    mod = benchmark_module("heldout_check")
    default = mod.parse_shapes(mod.DEFAULT_SHAPES)
    points = {(h, b, s, t) for h, b, ss, t in default for s in ss}
    grid = {(h or 128, b, s, t) for _, b, s, t, _, h in GRID}
    assert len(points) >= 17 and not points & grid
    assert mod.seen_before(default) == []
    used = mod.parse_shapes(mod.USED_SHAPES)
    assert mod.seen_before(used) == used
    assert mod.seen_before([(128, 1, (1, 2), 65536)]) == [(128, 1, (1,), 65536)]

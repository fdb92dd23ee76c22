"""Tensor-parallel head counts: ``cost``, ``regime``, ``explain`` and ``report`` take ``--tp N`` and
predict the call on one GPU of it (h/N heads, the latent cache whole on every rank); a bad N is
one error line and exit status 2; the dispatcher decides with the heads of the call it sees."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mla_var3 import cli
from mla_var3.analysis.calibration import load_calibration, predict
from mla_var3.analysis.cost import flash_mla
from mla_var3.analysis.regime import regime_guide
from mla_var3.dispatch import CacheInfo, Dispatcher
from mla_var3.model import LatentCache, mla_attention
from mla_var3.shapes import Problem, get_preset

V3 = get_preset("deepseek-v3")
H200 = load_calibration(device="h200")


@pytest.fixture(autouse=True)
def _no_user_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_VAR3_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("MLA_VAR3_DEVICES", "MLA_VAR3_CALIBRATION"):
        monkeypatch.delenv(name, raising=False)


def _json(capsys, *argv):
    code = cli.main(list(argv) + ["--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_per_gpu_divides_the_heads_only():
    rank = V3.per_gpu(8)
    assert (rank.h, rank.d, rank.p, rank.k, rank.dv, rank.w) == (16, V3.d, V3.p, V3.k, V3.dv, V3.w)
    assert V3.per_gpu(1) is V3
    for bad in (0, 3, -8, True, 2.0):
        with pytest.raises(ValueError, match="positive divisor of the heads h=128"):
            V3.per_gpu(bad)


@pytest.mark.parametrize("design", ["flash_mla", "flash_attention", "mla_var6_plus"])
def test_cost_at_tp8_is_one_gpu_with_the_whole_latent(capsys, design):
    d = _json(capsys, "cost", "--design", design, "--b", "32", "--s", "1", "--t", "4096", "--tp", "8")
    assert d["dims"]["h"] == 16 and d["tp"] == 8
    b, s, t, h, k, p, w = 32, 1, 4096, 16, V3.k, V3.p, V3.w
    if design == "flash_mla":
        # the queries and outputs of 16 heads; Z and KPE whole (not divided by 8)
        assert d["bytes"] == w * (b * h * s * (2 * k + p) + b * t * (k + p))
        assert d["bytes"] == flash_mla(dataclasses.replace(V3, h=16), Problem(b, s, t)).bytes
        assert d["flops"] * 8 == flash_mla(V3, Problem(b, s, t)).flops
        # 30 FLOP per byte at 16 heads, s = 1: memory-bound on the H200 (ridge 167)
        assert d["intensity"] == pytest.approx(30.0, abs=0.05) and d["bound"] == "memory"
    pr = predict(H200, design, V3.per_gpu(8), Problem(b, s, t, n=d["n"]))
    assert d["calibrated_time_s"] == pytest.approx(pr.time_s, rel=1e-12)
    assert d["calibrated_gpu_s"] == pytest.approx(pr.gpu_s, rel=1e-12)
    assert d["calibrated_gpu_s"] < 0.9 * predict(H200, design, V3, Problem(b, s, t, n=d["n"])).gpu_s


def test_regime_and_explain_at_tp8_predict_sixteen_heads(capsys):
    rank = V3.per_gpu(8)
    g = _json(capsys, "regime", "--b", "32", "--t", "4096", "--s", "1,16,64", "--tp", "8")
    want = regime_guide(rank, "h200", 32, 4096, [1, 16, 64], calibration=H200).to_dict()
    assert g["tp"] == 8 and g["rows"] == want["rows"]
    assert g["rows"] != regime_guide(V3, "h200", 32, 4096, [1, 16, 64], calibration=H200).to_dict()["rows"]
    e = _json(capsys, "explain", "--b", "32", "--s", "16", "--t", "4096", "--tp", "8")
    dec = Dispatcher("h200", use_measured=False).decide(rank, Problem(32, 16, 4096), CacheInfo("hybrid", 4096))
    assert e["heads"] == 16 and e["tp"] == 8
    assert e["predicted_s"] == pytest.approx(dict(dec.predicted_s), rel=1e-12)


def test_report_at_tp8(capsys, tmp_path):
    code = cli.main(["report", "--out", str(tmp_path), "--tp", "8", "--no-kernel-check", "--format", "json",
                     "--device", "h200"])
    capsys.readouterr()
    assert code == 0
    data = json.loads((tmp_path / "report.json").read_text())
    want = regime_guide(V3.per_gpu(8), "h200", 32, 4096, calibration=H200).to_dict()
    assert data["tp"] == 8 and data["regime"]["rows"] == want["rows"]
    assert data["memory"]["plans"], "the memory table stays the whole model's (a capacity plan needs it)"


@pytest.mark.parametrize("command", [["cost", "--design", "flash_mla"], ["regime"], ["explain"],
                                     ["report", "--no-kernel-check"]])
@pytest.mark.parametrize("tp,words", [("3", "--tp 3 does not divide the heads h = 128"),
                                      ("0", "expected a positive integer"), ("x", "expected a positive integer"),
                                      ("256", "--tp 256 does not divide the heads h = 128")])
def test_bad_tp_is_one_line_and_status_2(capsys, tmp_path, command, tp, words):
    argv = command + ["--tp", tp] + (["--out", str(tmp_path)] if command[0] == "report" else [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mla-var3: error:") and words in err, err


def test_tp_follows_heads_overrides(capsys):
    d = _json(capsys, "cost", "--design", "flash_mla", "--h", "64", "--tp", "4")
    assert d["dims"]["h"] == 16
    assert cli.main(["cost", "--design", "flash_mla", "--h", "40", "--tp", "16"]) == 2
    assert "does not divide the heads h = 40" in capsys.readouterr().err


def test_the_dispatcher_decides_with_the_heads_of_the_call():
    """mla_attention hands the dispatcher the heads of its query tensor, and the decision's
    predicted times are those of that many heads."""
    seen = []

    @dataclasses.dataclass(frozen=True)
    class Recording(Dispatcher):
        def decide(self, dims, problem, cache=None, design="auto", n=None):
            seen.append(dims)
            return super().decide(dims, problem, cache, design, n)

    g = torch.Generator().manual_seed(0)
    b, h, s, t, d, p, k = 2, 4, 1, 40, 16, 16, 32
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    cache = LatentCache(r(b, t, k), r(b, t, p))
    mla_attention(r(b, h, s, d), r(b, h, s, p), cache, r(h, d, k), r(h, k, d), scale=0.2,
                  dispatcher=Recording("h200", use_measured=False), backend="reference")
    assert [x.h for x in seen] == [h]
    disp = Dispatcher("h200", use_measured=False)
    pb = Problem(32, 1, 4096)
    times = []
    for heads in (16, 32, 64, 128):
        dims = dataclasses.replace(V3, h=heads)
        est = {e.design: e for e in disp.decide(dims, pb, CacheInfo("latent")).estimates}
        for design, kernel in (("absorbed", "flash_mla"), ("expanded", "flash_attention")):
            assert est[design].kernel_s == pytest.approx(predict(H200, kernel, dims, pb).time_s, rel=1e-12)
        times.append(est["expanded"].kernel_s)
    assert times == sorted(times) and len(set(times)) == 4

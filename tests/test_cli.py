"""The mla-var3 command: tables, --json numbers, errors, the report, the extension hook."""

import json
import os
import subprocess
import sys

import pytest

from mla_var3 import cli
from mla_var3.analysis.cost import flash_mla, mla_var6_plus
from mla_var3.analysis.regime import best_hybrid_n, crossover_s
from mla_var3.shapes import Problem, get_preset

V3 = get_preset("deepseek-v3")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cost_json_exact(capsys):
    code, out, err = run(capsys, "cost", "--design", "flash_mla", "--b", "32", "--s", "16", "--t", "4096", "--json")
    assert code == 0 and err == ""
    d = json.loads(out)
    c = flash_mla(V3, Problem(b=32, s=16, t=4096))
    assert d["flops"] == c.flops and d["bytes"] == c.bytes and d["intensity"] == c.intensity
    assert d["time_s"] == pytest.approx(c.flops / 710e12, rel=1e-12) and d["bound"] == "compute"
    assert d["ceilings"] == "measured" and d["device"] == "h200"


def test_cost_hybrid_default_n_and_overrides(capsys):
    code, out, _ = run(capsys, "cost", "--design", "mla_var6_plus", "--s", "16", "--json")
    d = json.loads(out)
    assert code == 0 and d["n"] == best_hybrid_n(V3, Problem(b=32, s=16, t=4096)).n
    code, out, _ = run(capsys, "cost", "--design", "mla_var6_plus", "--s", "16", "--n", "1024", "--h", "64",
                       "--device", "b200", "--ceilings", "datasheet", "--json")
    d = json.loads(out)
    assert d["flops"] == mla_var6_plus(V3.replace(h=64), Problem(b=32, s=16, t=4096, n=1024)).flops
    assert d["dims"]["h"] == 64 and d["device"] == "b200"


def test_cost_table(capsys):
    code, out, _ = run(capsys, "cost", "--design", "flash_attention", "--s", "1")
    assert code == 0
    assert "predicted time" in out and "memory-bound" in out and "10,737,418,240" in out


def test_regime_json_and_table(capsys):
    code, out, _ = run(capsys, "regime", "--b", "32", "--t", "4096", "--s", "1,16,1024", "--json")
    d = json.loads(out)
    assert code == 0 and [r["s"] for r in d["rows"]] == [1, 16, 1024]
    assert d["crossover_s"] == crossover_s(V3, 32, 4096, "h200") == 50
    assert d["rows"][1]["best_n"] == 1190
    code, out, _ = run(capsys, "regime", "--device", "rtx-5090", "--t", "4096")
    assert code == 0 and "crossover" in out and "s = 35" in out and "speculative" in out


def test_memory_json_and_table(capsys):
    code, out, _ = run(capsys, "memory", "--tp", "8", "--context", "32768", "--json")
    d = json.loads(out)
    assert code == 0
    lay = {x["layout"]: x for x in d["layouts"]}
    assert lay["MLA latent"]["bytes_per_token_layer"] == 1152
    assert d["plans"][0]["tokens"] == 612_263 and d["plans"][0]["sequences"] == 18
    code, out, _ = run(capsys, "memory", "--model", "kimi-k2", "--tp", "8")
    assert code == 0 and "MLA latent" in out and "capacity" in out


def test_devices(capsys, tmp_path):
    code, out, _ = run(capsys, "devices", "--json")
    d = {x["key"]: x for x in json.loads(out)}
    assert code == 0 and d["h200"]["ridge_measured"] == pytest.approx(710e12 / 4257e9)
    assert d["rtx-5090"]["ridge_measured"] is None
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"x1": {"name": "X1", "bf16_tflops": 10, "bandwidth_gbs": 100, "memory_gb": 8}}))
    code, out, _ = run(capsys, "devices", "--devices-file", str(f))
    assert code == 0 and "X1" in out
    code, out, _ = run(capsys, "cost", "--design", "flash_mla", "--device", "x1", "--devices-file", str(f), "--json")
    assert code == 0 and json.loads(out)["ridge"] == pytest.approx(100.0)


@pytest.mark.parametrize("argv,needle", [
    (["cost", "--design", "flash_magic"], "invalid choice"),
    (["cost", "--design", "flash_mla", "--model", "llama"], "unknown model 'llama'"),
    (["cost", "--design", "flash_mla", "--device", "tpu"], "unknown device 'tpu'"),
    (["cost", "--design", "flash_mla", "--b", "0"], "positive integer"),
    (["cost", "--design", "flash_mla", "--t", "-5"], "positive integer"),
    (["cost", "--design", "flash_mla", "--s", "9", "--t", "8"], "exceed the context"),
    (["cost", "--design", "mla_var6_plus", "--n", "9", "--t", "8"], "hybrid window n"),
    (["cost", "--design", "flash_mla", "--n", "4"], "mla_var6_plus only"),
    (["cost", "--design", "flash_mla", "--h", "0"], "positive integer"),
    (["regime", "--s", "1,x"], "positive integer"),
    (["regime", "--s", "8192"], "exceed the context"),
    (["memory", "--tp", "3"], "divisor"),
    (["memory", "--n", "5000", "--context", "4096"], "exceeds"),
    (["devices", "--devices-file", "/nonexistent.json"], "cannot read devices file"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_one_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and err.startswith("mla-var3: error:")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_devices_file_via_env(capsys, tmp_path, monkeypatch):
    f = tmp_path / "bad.json"
    f.write_text('{"x": {"name": "X"}}')
    monkeypatch.setenv("MLA_VAR3_DEVICES", str(f))
    code, _, err = run(capsys, "devices")
    assert code == 2 and "missing" in err and err.count("\n") == 1


def test_no_command_and_help(capsys):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert "report" in capsys.readouterr().out


def test_report_writes_files(capsys, tmp_path):
    out_dir = tmp_path / "rep"
    code, out, err = run(capsys, "report", "--out", str(out_dir), "--device", "h200", "--t", "2048", "--no-kernel-check")
    assert code == 0, err
    names = {p.name for p in out_dir.iterdir()}
    assert names == {"report.md", "report.json", "roofline.png", "time_vs_s.png"}
    for name in names:
        assert str(out_dir / name) in out
    assert (out_dir / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out_dir / "report.json").read_text())
    assert data["regime"]["t"] == 2048 and data["regime"]["crossover_s"] == crossover_s(V3, 32, 2048, "h200")
    md = (out_dir / "report.md").read_text()
    assert "Regime table" in md and "Cache is not total memory" in md


def test_extension_hook(capsys):
    def add(sub):
        p = sub.add_parser("hello", help="say hi")
        p.set_defaults(func=lambda args: print("hi") or 0)

    cli._EXTRA_COMMANDS.append(add)
    try:
        assert "hello" in cli.build_parser().format_help()
        assert cli.main(["hello"]) == 0 and capsys.readouterr().out == "hi\n"
    finally:
        cli._EXTRA_COMMANDS.remove(add)


def test_no_torch_at_import():
    """The CLI and the analysis import without torch (checked in a fresh interpreter)."""
    code = ("import sys, mla_var3.cli, mla_var3.analysis, mla_var3.analysis.report, mla_var3.analysis.plots; "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_int_lists_reject_zero_except_where_it_is_a_valid_value():
    import argparse

    from mla_var3.cli.bench import n_list as _n_list

    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        cli.int_list("0,4")
    assert cli.int_list("1, 4") == [1, 4]
    # the hybrid's split n = 0 is the absorbed design: `mla-var3 bench --n 0,256,...` must accept it
    assert _n_list("0,256") == (0, 256) and _n_list("auto") == "auto"
    with pytest.raises(argparse.ArgumentTypeError, match="non-negative"):
        _n_list("-1")

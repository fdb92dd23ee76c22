"""``python -m mla_var3.kernel``: --check, timing, --profile, refusals (CPU, interpreter)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from mla_var3.kernel import __main__ as K
from mla_var3.shapes import Problem, get_preset

#: tests of the no-GPU path (interpreter, refusals); on a GPU machine the same calls run on the GPU.
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU / interpreter path")
TINY = ["--b", "1", "--s", "2", "--t", "64", "--h", "16"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_VAR3_CACHE_DIR", str(tmp_path / "cache"))


@CPU_ONLY
def test_refuses_sizes_too_slow_for_the_interpreter(capsys):
    assert K.main(["flash_mla"]) == 2
    err = capsys.readouterr().err
    assert "interpreter" in err and "Practical here" in err and "--b 1 --s 2 --t 256 --h 16" in err


def test_interpreter_estimate_formula():
    dims = get_preset("deepseek-v3")
    # b=32, h*s = 2048 rows -> 32 programs of 64 rows; t=4096 -> 64 key blocks
    assert K.interpreter_estimate("flash_mla", dims, Problem(32, 16, 4096)) == 32 * 32 * 64 * K.INTERP_S_LATENT_BLOCK
    assert K.interpreter_estimate("flash_attention", dims, Problem(1, 2, 64)) == 128 * 1 * 1 * K.INTERP_S_EXPANDED_BLOCK
    tiny = K.interpreter_estimate("mla_var6_plus", dims.replace(h=16), Problem(1, 2, 256, n=128))
    assert tiny < K.INTERP_LIMIT_S


def test_check_pass_flash_mla(capsys):
    assert K.main(["flash_mla", *TINY, "--check"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "o_latent" in out and "lse" in out
    assert ("interpreter" in out) == (not torch.cuda.is_available())


def test_check_fail_exits_1(capsys, monkeypatch):
    from mla_var3.kernel import launchers as D

    real_run = D.run

    def broken(name, inputs, config=None):
        out = real_run(name, inputs, config)
        out["o"] = out["o"] * 1.5
        return out

    monkeypatch.setattr(D, "run", broken)
    assert K.main(["flash_attention", *TINY, "--check"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "TOO LARGE" in out


@CPU_ONLY
def test_time_prints_prediction(capsys):
    assert K.main(["flash_attention", *TINY]) == 0
    out = capsys.readouterr().out
    assert "measured :" in out and "not a GPU timing" in out and "predicted:" in out and "bound on h200" in out


@CPU_ONLY
def test_profile_writes_params_and_report(tmp_path, capsys):
    out_dir = tmp_path / "prof"
    assert K.main(["flash_attention", *TINY, "--profile", "--out", str(out_dir)]) == 0
    params = json.loads((out_dir / "params.json").read_text())
    assert params["problem"] == {"b": 1, "s": 2, "t": 64, "n": None, "causal": True}
    (stage,) = params["stages"]
    assert stage["stage"] == "attention" and stage["time_us"] > 0 and stage["bound"] in ("compute", "memory")
    report = (out_dir / "report.md").read_text()
    assert "| attention |" in report and "% of bound" in report and "not GPU timings" in report


@CPU_ONLY
def test_profile_ncu_and_bad_args_refused(capsys):
    assert K.main(["flash_mla", *TINY, "--profile", "ncu"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert K.main(["flash_mla", *TINY, "--n", "4"]) == 2
    assert "--n applies to mla_var6_plus only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        K.main(["no_such_design"])


@CPU_ONLY
def test_module_entry_point_sets_interpreter():
    """A fresh process without TRITON_INTERPRET: the package selects the interpreter itself."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "mla_var3.kernel", "flash_mla"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2
    assert "Triton interpreter" in proc.stdout and "would take" in proc.stderr

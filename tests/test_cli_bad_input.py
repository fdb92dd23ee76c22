"""The README's promise, for every command: bad input is one line on stderr and exit status 2,
never a traceback; and ``--json`` output is strict JSON (no NaN, no Infinity).

The commands and their numeric flags are read from the parser itself, so a command or flag
added later is covered (or the test names what it lacks)."""

from __future__ import annotations

import argparse
import json

import pytest

from mla_var3 import cli
from mla_var3.cli import bench
from mla_var3.cli._common import print_json

BIG = "1" + "0" * 400

#: one bad invocation per command at least (a new command must add its own here).
BAD_PER_COMMAND = {
    "cost": [["cost", "--design", "flash_mla", "--t", BIG], ["cost", "--design", "flash_mla", "--b", "nan"]],
    "regime": [["regime", "--sweep", "x.json"], ["regime", "--s", "1,inf"], ["regime", "--plot-n", "."],
               ["regime", "--plot-n", "no_extension"]],
    "memory": [["memory", "--reserve-gb", "nan"], ["memory", "--reserve-gb", "inf", "--json"]],
    "devices": [["devices", "--devices-file", ""], ["devices", "--write", "x.json"]],
    "report": [["report", "--b", "-1"], ["report", "--out", ""], ["report", "--format", ""],
               ["report", "--format", "md,html"]],
    "bench": [["bench", "--b", "abc"], ["bench", "--s", "0"], ["bench", "--n=-3"], ["bench", "--designs", "magic"],
              ["bench", "--interpret", "--s", "100", "--t", "64"], ["bench", "--interpret", "--seqlens", "random:5"],
              ["bench", "--interpret", "--seqlens", "3,x"]],
    "autotune": [["autotune", "--clear", "extra"]],
    "explain": [["explain", "--results", ""], ["explain", "--window", "4", "--cache", "latent"],
                ["explain", "--no-latent-window", "--cache", "paged"]],
    "calibrate": [["calibrate", "--max-seconds", "0"], ["calibrate", "--out", ""], ["calibrate", "--quick", "x"]],
}

NUMERIC_TYPES = {cli.positive_int, cli.nonneg_int, cli.positive_float, cli.nonneg_float, cli.n_arg,
                 cli.window_budget_arg, cli.int_list, cli.nonneg_int_list, bench.n_list}
#: bad for every numeric type above.
BAD_NUMBERS = ["abc", "nan", "NaN", "inf", "-inf", "1e400", BIG, "-" + BIG, "-3", "", " ", "0x10", "12abc"]


@pytest.fixture(autouse=True)
def _own_cache_and_devices(tmp_path, monkeypatch):
    """No user autotune cache or devices file leaks into these runs."""
    monkeypatch.setenv("MLA_VAR3_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLA_VAR3_DEVICES", raising=False)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _numeric_flags() -> list[tuple[str, str]]:
    return [(name, a.option_strings[-1]) for name, p in _subparsers().items() for a in p._actions
            if a.type in NUMERIC_TYPES]


def run(capsys, *argv):
    argv = argv[0] if len(argv) == 1 and isinstance(argv[0], list) else argv
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    assert err.startswith("mla-var3: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_every_command_has_bad_input_cases():
    assert set(_subparsers()) == set(BAD_PER_COMMAND)


@pytest.mark.parametrize("argv", [argv for cases in BAD_PER_COMMAND.values() for argv in cases],
                         ids=lambda argv: " ".join(a[:12] for a in argv))
def test_bad_input_per_command(capsys, argv):
    code, _, err = run(capsys, argv)
    assert_one_line_error(code, err)


def test_no_builtin_int_or_float_types():
    """Every numeric flag goes through the checked types (NaN, infinity, huge integers refused)."""
    loose = [(name, a.option_strings) for name, p in _subparsers().items() for a in p._actions
             if a.type in (int, float)]
    assert not loose


@pytest.mark.parametrize("command,flag", _numeric_flags())
def test_every_numeric_flag_refuses_nan_infinity_huge_and_junk(capsys, command, flag):
    prefix = {"cost": ["cost", "--design", "mla_var6_plus"]}.get(command, [command])
    for value in BAD_NUMBERS:
        code, out, err = run(capsys, prefix + [f"{flag}={value}"])
        assert_one_line_error(code, err, f"argument {flag}")
        assert out == ""
        assert len(err) < 300, err                        # a 400-digit value is not echoed whole


@pytest.mark.parametrize("flag", ["--b", "--t", "--s"])
def test_largest_integers_give_finite_numbers(capsys, flag):
    code, out, err = run(capsys, "cost", "--design", "mla_var6_plus", flag, str(cli.MAX_INT if flag != "--s" else 4096),
                         "--json")
    assert code == 0, err
    json.loads(out, parse_constant=_refuse)
    code, _, err = run(capsys, "cost", "--design", "flash_mla", flag, str(cli.MAX_INT + 1))
    assert_one_line_error(code, err, "at most 2**53")


def _refuse(constant):
    raise AssertionError(f"--json printed {constant}, which is not JSON")


@pytest.mark.parametrize("argv", [
    ["cost", "--design", "flash_mla", "--b", str(cli.MAX_INT), "--t", str(cli.MAX_INT)],
    ["cost", "--design", "mla_var6_plus", "--window-budget", "9e18"],
    ["regime", "--t", str(cli.MAX_INT), "--s", "1,16"],
    ["regime", "--window-budget", "0", "--tp", "8", "--s", "16"],
    ["memory", "--reserve-gb", "0"],
    ["memory", "--reserve-gb", "1e15", "--memory-gb", "1e-9"],
    ["memory", "--params", "1e15", "--context", str(cli.MAX_INT)],
    ["explain", "--t", str(cli.MAX_INT), "--s", "1"],
    ["devices"],
])
def test_json_output_is_strict_json(capsys, argv):
    code, out, err = run(capsys, argv + ["--json"])
    assert code == 0, err
    json.loads(out, parse_constant=_refuse)


def test_print_json_writes_null_for_non_finite_numbers(capsys):
    print_json({"a": float("nan"), "b": [float("inf")]})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [None]}


DAMAGED = {"random bytes": b"\x00\xff\xfe\x81" * 40, "truncated": b'{"records": [', "empty": b"",
           "a JSON list": b"[1, 2]"}


@pytest.mark.parametrize("kind", list(DAMAGED) + ["a directory", "missing"])
@pytest.mark.parametrize("argv", [
    ["devices", "--devices-file"],
    ["cost", "--design", "flash_mla", "--devices-file"],
    ["regime", "--devices-file"],
    ["memory", "--devices-file"],
    ["report", "--no-kernel-check", "--devices-file"],
    ["bench", "--devices-file"],
    ["explain", "--devices-file"],
    ["explain", "--results"],
    ["explain", "--grid"],
    ["regime", "--plot-n", "OUT.png", "--sweep"],
], ids=lambda argv: " ".join(argv))
def test_every_file_flag_names_the_file(capsys, tmp_path, monkeypatch, argv, kind):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "input.json"
    if kind == "a directory":
        path.mkdir()
    elif kind != "missing":
        path.write_bytes(DAMAGED[kind])
    code, _, err = run(capsys, [a.replace("OUT.png", str(tmp_path / "n.png")) for a in argv] + [str(path)])
    assert_one_line_error(code, err, str(path))


def test_devices_env_variable_file_is_named(capsys, tmp_path, monkeypatch):
    path = tmp_path / "devs.json"
    path.write_bytes(b"\xff" * 10)
    monkeypatch.setenv("MLA_VAR3_DEVICES", str(path))
    for argv in (["devices"], ["cost", "--design", "flash_mla"], ["explain"]):
        code, _, err = run(capsys, argv)
        assert_one_line_error(code, err, str(path), "MLA_VAR3_DEVICES", "not UTF-8")


def test_sweep_without_matching_rows_is_an_error(capsys, tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"sweep": [{"label": "h", "b": 64, "s": 16, "n": n, "us": 10.0} for n in (0, 64)]}))
    code, _, err = run(capsys, "regime", "--plot-n", str(tmp_path / "n.png"), "--sweep", str(path))
    assert_one_line_error(code, err, "no n sweep", "b=32, s=16")
    code, _, err = run(capsys, "regime", "--b", "64", "--plot-n", str(tmp_path / "n.png"), "--sweep", str(path))
    assert code == 0 and (tmp_path / "n.png").exists()


def test_explicit_autotune_cache_that_does_not_exist(capsys, tmp_path):
    code, _, err = run(capsys, "explain", "--autotune-cache", str(tmp_path / "nope.json"))
    assert_one_line_error(code, err, "nope.json", "no such file")


def test_multi_line_errors_become_one_line(capsys):
    def boom(args):
        raise ValueError("weights do not match:\n  missing a\n  missing b")

    parser_add = lambda sub: sub.add_parser("boom").set_defaults(func=boom)   # noqa: E731
    cli.register_command(parser_add)
    try:
        code, _, err = run(capsys, ["boom"])
    finally:
        cli._EXTRA_COMMANDS.remove(parser_add)
    assert_one_line_error(code, err, "weights do not match:; missing a; missing b")


@pytest.mark.parametrize("extra", [["--h", "12"], ["--p", "8", "--d", "64"], ["--context", "1", "--t", "1", "--b", "1"]],
                         ids=["h not divisible by 8", "custom dims", "context 1"])
def test_report_terminal_tables_follow_the_report_options(capsys, tmp_path, extra):
    """The memory table printed by `report` used flags the report does not have (--n 1024 beyond a
    short --context, tp = 8 for any h, --params for custom dims) and failed after writing."""
    code, out, err = run(capsys, ["report", "--no-kernel-check", "--out", str(tmp_path / "r")] + extra)
    assert code == 0, err
    assert (tmp_path / "r" / "report.md").exists()

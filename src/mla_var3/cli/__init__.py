"""The ``mla-var3`` command (also ``python -m mla_var3``).

Commands (one module each, listed in :data:`COMMANDS`): ``cost``, ``regime``, ``memory``,
``devices``, ``report``, ``bench``, ``autotune``, ``explain``, ``calibrate``. Each prints a table, or exact
numbers as one JSON value with ``--json``. Bad input gives one error line on stderr and exit
status 2. A command module has ``add(subparsers)``, which adds its subparser with
``func=handler`` where ``handler(args) -> int``; other code adds commands the same way with
:func:`register_command`.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Callable

from mla_var3._argtypes import (  # noqa: F401  (re-exported: the argument types of every command)
    MAX_BYTES, MAX_INT, MAX_NUMBER, int_list, n_arg, nonneg_float, nonneg_int, nonneg_int_list, path_arg,
    positive_float, positive_int, window_budget_arg,
)
from mla_var3.cli import autotune, bench, calibrate, cost, devices, explain, memory, regime, report
from mla_var3.cli._common import PROG, CLIError, Parser, one_line

#: the built-in commands, in the order of ``mla-var3 --help``.
COMMANDS = (cost, regime, memory, devices, report, bench, autotune, explain, calibrate)

#: functions ``add(subparsers)`` of commands added from outside the package.
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def register_command(add: Callable[[argparse._SubParsersAction], None]):
    """Register ``add(subparsers)`` so :func:`build_parser` includes its command."""
    _EXTRA_COMMANDS.append(add)
    return add


def build_parser() -> argparse.ArgumentParser:
    """The full parser: the built-in commands plus every function in :data:`_EXTRA_COMMANDS`."""
    parser = Parser(prog=PROG, description="MLA analysis: cost models, roofline, regime guide, KV-cache memory.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (*(c.add for c in COMMANDS), *_EXTRA_COMMANDS):
        add(sub)
    return parser


def _command_names(parser: argparse.ArgumentParser) -> list[str]:
    """The commands of ``parser`` in the order of its help."""
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices]


def _error(message: str) -> int:
    print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
    return 2


def _warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"{PROG}: warning: {one_line(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input). Warnings are one line each."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as e:
        return _error(str(e).removeprefix(f"{PROG}: ").removeprefix(f"{PROG} "))
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if not getattr(args, "func", None):
        # a usage error like any other (argparse's own answer to a missing required command):
        # one line on stderr and status 2, so a script that forgot the command fails visibly;
        # the full help is what --help is for (on stdout, status 0)
        return _error(f"a command is required: one of {', '.join(_command_names(parser))} "
                      f"(see '{PROG} --help' or '{PROG} COMMAND --help')")
    shown = warnings.showwarning
    warnings.showwarning = _warning
    try:
        return int(args.func(args) or 0)
    except (ValueError, CLIError, argparse.ArgumentTypeError) as e:   # DeviceFileError is a ValueError
        return _error(str(e))
    except OSError as e:
        return _error(f"{e.strerror or e}: {e.filename}" if getattr(e, "filename", None) else str(e))
    finally:
        warnings.showwarning = shown


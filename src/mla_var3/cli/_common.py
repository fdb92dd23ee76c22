"""What the ``mla-var3`` commands share: the usage error, the shared options and how they
resolve, and the output helpers (rich tables, strict JSON). Nothing here imports torch."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

# the model options live with the argument types (``python -m mla_var3.kernel`` takes them too)
from mla_var3._argtypes import add_model_args, dims_from_args  # noqa: F401
from mla_var3._argtypes import path_arg, positive_int, window_budget_arg
from mla_var3._io import finite_json
from mla_var3.analysis.devices import DEFAULT_DEVICE, DEVICES_ENV, get_device

PROG = "mla-var3"


class CLIError(Exception):
    """A usage error: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise CLIError(f"{self.prog}: {message}")


# --- shared options -------------------------------------------------------------------------


def add_devices_file_arg(p: argparse.ArgumentParser) -> None:
    """--devices-file."""
    p.add_argument("--devices-file", type=path_arg, metavar="JSON", help=f"JSON file of extra devices (also ${DEVICES_ENV})")


def add_device_args(p: argparse.ArgumentParser, default: str | None = DEFAULT_DEVICE) -> None:
    """--device, --devices-file, --ceilings."""
    p.add_argument("--device", default=default, help=f"device key (see `{PROG} devices`; default {default or 'detected'})")
    add_devices_file_arg(p)
    p.add_argument("--ceilings", default="measured", choices=("measured", "datasheet"),
                   help="roofline ceilings: measured when the device has them (default), or datasheet")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exact numbers as JSON")


def add_calibration_arg(p: argparse.ArgumentParser) -> None:
    """--calibration PATH|none."""
    p.add_argument("--calibration", type=path_arg, metavar="PATH|none",
                   help="calibrated model: a calibration file (default: $MLA_VAR3_CALIBRATION, else "
                        "./calibration-<device>.json when `mla-var3 calibrate` wrote it on a GPU of the device, else "
                        "the one the package ships for the device, else the roofline); 'none': the ideal roofline "
                        "alone")




def calibration_from_args(args, device):
    """The Calibration for --calibration (None for 'none' or a device without one). Without the
    flag or ``$MLA_VAR3_CALIBRATION``: the file ``mla-var3 calibrate`` wrote by default in the
    working folder when it was made on a GPU of ``device`` (a calibration of this machine beats
    the shipped one), else the shipped one. A file of that name made otherwise (under the CPU
    interpreter, for another device) is skipped with a warning."""
    from mla_var3.analysis.calibration import CALIBRATION_ENV, calibration_file_name, device_key, load_calibration

    value = getattr(args, "calibration", None)
    if value is not None and value.strip().lower() == "none":
        return None
    if value is None and not os.environ.get(CALIBRATION_ENV) and device is not None:
        local, key = Path(calibration_file_name(device)), device_key(device)
        if local.is_file():
            cal = load_calibration(local, device=None)
            if cal.gpu and cal.device == key:
                return cal
            why = "CPU interpreter timings" if not cal.gpu else f"made for {cal.device!r}"
            warnings.warn(f"{local}: not used ({why}); the shipped calibration for {key!r} applies")
    return load_calibration(value, device=device)


def check_output_file(flag: str, path) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, or a path whose
    folder is missing, is not a folder or cannot be written to. ValueError naming ``flag``."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag}: {str(p)!r} is a folder; give the path of a file to write")
    check_output_folder(flag, p.parent, f"cannot write {str(p)!r}: ")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{flag}: cannot write {str(p)!r}: permission denied")


def check_output_folder(flag: str, folder, prefix: str = "") -> None:
    """Refuse, before any work, a folder files cannot be written into (missing, not a folder,
    not writable). ValueError naming ``flag``."""
    folder = Path(folder)
    if not folder.exists():
        raise ValueError(f"{flag}: {prefix}the folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{flag}: {prefix}{str(folder)!r} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: {prefix}the folder {str(folder)!r} is not writable")


def add_results_arg(p: argparse.ArgumentParser, what: str) -> None:
    """--results PATH (repeatable): benchmark results.json files with measured times."""
    p.add_argument("--results", action="append", type=path_arg, metavar="PATH",
                   help=f"benchmark results.json with measured times {what} (repeatable)")


def check_results_files(flag: str, paths) -> None:
    """Read each benchmark results file once up front: a bad one is one error naming the flag,
    the file and what is wrong with it."""
    from mla_var3.runtime.records import load_results

    for path in paths or ():
        try:
            load_results(path)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None


def measured_by_s(paths, device_key: str, dims, b: int, t: int, s_values, dtype: str) -> dict[int, dict]:
    """{s: {kernel: (seconds, n)}}: the fastest measured time of each design's kernel at (b, s, t)
    in the results files (the hybrid: its fastest n)."""
    from mla_var3.dispatch.measured import from_results
    from mla_var3.shapes import Problem

    out: dict[int, dict] = {}
    for s in s_values:
        for m in from_results(paths, device_key, dims, Problem(b=b, s=s, t=t), dtype):
            if m.kernel not in out.setdefault(s, {}) or m.time_s < out[s][m.kernel][0]:
                out[s][m.kernel] = (m.time_s, m.n)
    return {s: v for s, v in out.items() if v}


def add_tp_arg(p: argparse.ArgumentParser) -> None:
    """--tp: tensor-parallel degree, the call on one GPU of it."""
    p.add_argument("--tp", type=positive_int, default=1,
                   help="tensor-parallel degree: every prediction is the call on one GPU, with h/tp heads (h/tp "
                        "must be whole) and the whole latent cache (replicated on every rank); default 1")


def add_budget_args(p: argparse.ArgumentParser) -> None:
    """--window-budget and --tp: the hybrid's expanded window, the heads per GPU."""
    p.add_argument("--window-budget", type=window_budget_arg, metavar="BYTES|latent",
                   help="cap the hybrid's expanded window per sequence per layer per rank (n·(h/tp)·2d·w): bytes "
                        "(4.5MB, 4.5MiB) or 'latent' = the latent cache's own size t·(k+p)·w")
    add_tp_arg(p)


def window_budget_bytes(value, dims, t: int) -> float | None:
    """Resolve a :func:`~mla_var3._argtypes.window_budget_arg` value (None stays None)."""
    if value == "latent":
        from mla_var3.analysis.regime import latent_window_budget

        return latent_window_budget(dims, t)
    return value


def per_rank(dims, tp: int):
    """The dims of one GPU of a tensor-parallel group of ``tp``: h/tp heads (ValueError naming
    --tp when tp does not divide h). The latent cache (Z, KPE) is whole on every rank: no other
    dim changes, so its bytes are not divided."""
    if dims.h % tp:
        raise ValueError(f"--tp {tp} does not divide the heads h = {dims.h} (heads per GPU = h / tp must be whole)")
    return dims.per_gpu(tp)


def rank_dims_from_args(args):
    """The MLADims of the call on one GPU: :func:`dims_from_args` with h / ``--tp`` heads."""
    return per_rank(dims_from_args(args), getattr(args, "tp", 1))


def device_from_args(args):
    return get_device(args.device, args.devices_file)


# --- output ---------------------------------------------------------------------------------


def console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def table(title: str, columns: list[str], rows: list[list], right_from: int = 1):
    from rich.table import Table

    tbl = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        tbl.add_column(col, justify="right" if i >= right_from else "left")
    for row in rows:
        tbl.add_row(*[str(x) for x in row])
    return tbl


def print_json(obj) -> None:
    """``obj`` as JSON on stdout. NaN and infinity (which JSON lacks) are written as null."""
    print(json.dumps(finite_json(obj), indent=2, allow_nan=False))


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.2f} MB"


def one_line(message: str) -> str:
    """A message of several lines (a list of problems) as one line."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())

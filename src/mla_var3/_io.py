"""Reading the package's input files, and checking the fields of what they hold.

Every loader (devices files, benchmark results, measured n sweeps, the autotune cache) reads
through :func:`load_json`, so a bad file is one :class:`InputFileError` (a ``ValueError``) that
names the path and says what is wrong with it: missing, a directory, unreadable, empty, not
UTF-8 text, not JSON (with the line and column, and "truncated?" when the text stops early), or
JSON of the wrong shape. :func:`check_field` does the same for one field of a JSON object: a
wrong type, NaN, infinity or a value out of range names the file, the row and the key.

No torch here.

Example
-------
>>> import json, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "rows.json")
>>> with open(path, "w") as f:
...     _ = f.write("[1, 2]")
>>> load_json(path, "results file")                      # doctest: +ELLIPSIS
Traceback (most recent call last):
...
mla_var3._io.InputFileError: results file '...rows.json' must hold a JSON object, got a JSON list
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping

#: the longest piece of a user's text quoted back in a message.
_QUOTE = 60
#: the largest integer taken from a user (2**53: every integer up to it is exact as a float).
MAX_INT = 2**53
#: the largest JSON file read (results and caches are kilobytes to a few megabytes).
MAX_READ_BYTES = 64 * 2**20
#: the most digits of a JSON integer converted (a float holds at most 309 integer digits).
_MAX_INT_DIGITS = 310


class InputFileError(ValueError):
    """A file that cannot be read or does not hold what it should; the message names the file."""


def quote(value) -> str:
    """``repr(value)``, cut to a readable length (a 400-digit number is not repeated whole)."""
    text = repr(value)
    if len(text) <= _QUOTE:
        return text
    return f"{text[:_QUOTE - 1]}… ({len(text)} characters)"


def show_path(path) -> str:
    """A path as messages quote it: whole (a path cut short names no file)."""
    return repr(os.fspath(path))


_JSON_TYPE = {dict: "a JSON object", list: "a JSON list", str: "a JSON string", bool: "a JSON boolean",
              int: "a JSON number", float: "a JSON number", type(None): "JSON null"}


def json_type(value) -> str:
    """How a parsed JSON value is called in messages: 'a JSON object', 'a JSON list', ..."""
    return _JSON_TYPE.get(type(value), type(value).__name__)


def _open_error(exc: OSError, what: str, path, error: type[InputFileError]) -> InputFileError:
    shown = show_path(path)
    if isinstance(exc, FileNotFoundError):
        return error(f"cannot read {what} {shown}: no such file")
    if isinstance(exc, IsADirectoryError):
        return error(f"cannot read {what} {shown}: it is a directory, not a file")
    return error(f"cannot read {what} {shown}: {exc.strerror or exc}")


def _check_path(path, what: str, error: type[InputFileError]) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"{what}: expected a path, got {quote(path)}")
    if os.fspath(path) == "":
        raise error(f"{what}: the path is empty")


def check_file(path: str | os.PathLike, what: str, error: type[InputFileError] = InputFileError) -> int:
    """The size in bytes of a readable file; ``error`` naming ``what`` and the path when it is
    missing, a directory or cannot be opened (nothing is read)."""
    _check_path(path, what, error)
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise _open_error(exc, what, path, error) from None


def read_bytes(path: str | os.PathLike, what: str, error: type[InputFileError] = InputFileError,
               limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of ``path`` (at most ``limit``: ``/dev/zero`` is not read forever); ``error``
    naming ``what`` and the path when it cannot be read or is larger."""
    _check_path(path, what, error)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise _open_error(exc, what, path, error) from None
    if len(data) > limit:
        raise error(f"{what} {show_path(path)} is larger than {limit / 2**20:g} MiB: not a {what}?")
    return data


class _DuplicateKey(Exception):
    pass


class _NotFinite(Exception):
    """A JSON number the finite reader refuses: ``args`` = (its text, why)."""


def is_finite(value) -> bool:
    """Whether ``value`` is an int or float a float holds finitely (never raises: an int of 400
    digits is simply not finite, where ``math.isfinite`` would raise OverflowError). bool is not
    a number here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return -sys.float_info.max <= value <= sys.float_info.max
    return math.isfinite(value)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text, "beyond a float's range")
    return value


def _finite_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS or not is_finite(value := int(text)):
        raise _NotFinite(text, "beyond a float's range")
    return value


def _no_constant(name: str):
    raise _NotFinite(name, "not a JSON number")


def _position(text: str, token: str) -> str:
    """' at line L column C' of the first ``token`` outside the strings of JSON ``text`` (the
    reader's hooks get a number's text, not its place), or '' when it cannot be found."""
    import re

    pattern = r'"(?:[^"\\]|\\.)*"|(?<![\w.+-])' + re.escape(token) + r"(?![\w.])"
    for match in re.finditer(pattern, text):
        if not match.group().startswith('"'):
            line = text.count("\n", 0, match.start()) + 1
            return f" at line {line} column {match.start() - text.rfind(chr(10), 0, match.start())}"
    return ""


def _lenient_int(text: str) -> int | float:
    """An integer as Python reads it, or infinity past :data:`_MAX_INT_DIGITS` digits (``int()``
    refuses 4,300 and more; :func:`is_finite` is False for both)."""
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        return -math.inf if text.startswith("-") else math.inf
    return int(text)


def _short(text: str) -> str:
    return text if len(text) <= _QUOTE else f"{text[:20]}… ({len(text)} characters)"


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, refusing a key given twice (``json.loads`` would keep the last silently)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def parse_json(text: str | bytes, where: str, expect: type | None = dict,
               error: type[InputFileError] = InputFileError, *, finite: bool = True):
    """Parse JSON ``text`` (``where`` names its source in messages) and check its top-level type.

    ``finite`` (the default; every file the package reads but the autotune cache): a number that
    is not finite (``NaN``, ``Infinity``, ``-Infinity``, ``1e999``, an integer beyond a float's
    range) is refused with ``error`` naming ``where``. ``finite=False`` reads them as Python does
    (NaN and infinite floats; an integer of more than 310 digits as infinity) for a reader that
    checks its entries one by one and drops the bad ones (:func:`is_finite` never raises on them).
    """
    if not isinstance(text, (str, bytes)):
        raise error(f"{where}: expected JSON text (str or bytes), got {type(text).__name__}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where} is not UTF-8 text (byte {exc.start} is 0x{text[exc.start]:02x}): "
                        "a binary or corrupt file?") from None
    if not text.strip():
        raise error(f"{where} is empty")
    try:
        if finite:
            value = json.loads(text, object_pairs_hook=_no_duplicates, parse_float=_finite_float,
                               parse_int=_finite_int, parse_constant=_no_constant)
        else:
            value = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_lenient_int)
    except _NotFinite as exc:
        token, why = exc.args
        raise error(f"{where} holds {_short(token)}{_position(text, token)} ({why}): every number must be "
                    "finite; write null for a missing value") from None
    except _DuplicateKey as exc:
        raise error(f"{where} is ambiguous: key {quote(exc.args[0])} appears twice in one object") from None
    except json.JSONDecodeError as exc:
        hint = " (truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise error(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{hint}") from None
    except RecursionError:
        raise error(f"{where} is not usable JSON: it is nested too deeply") from None
    if expect is not None and not isinstance(value, expect):
        raise error(f"{where} must hold {_JSON_TYPE[expect]}, got {json_type(value)}")
    return value


def load_json(path: str | os.PathLike, what: str, expect: type | None = dict,
              error: type[InputFileError] = InputFileError, *, finite: bool = True):
    """The parsed JSON of ``path`` (:func:`read_bytes` + :func:`parse_json`); ``what`` names the
    kind of file ('devices file', 'results file', ...) in every message."""
    data = read_bytes(path, what, error)
    return parse_json(data, f"{what} {show_path(path)}", expect, error, finite=finite)


def finite_json(value):
    """``value`` with every NaN or infinite float (nested in dicts, lists and tuples) replaced by
    None: JSON has no NaN or Infinity, and ``json.dumps`` would write them anyway."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


# --------------------------------------------------------------------------------------------
# fields of JSON objects

#: kinds accepted by :func:`check_field`.
KINDS = ("str", "bool", "dict", "list", "int", "int>0", "int>=0", "number", "number>0", "number>=0")


def field_problem(value, kind: str) -> str | None:
    """Why ``value`` is not of ``kind`` (one of :data:`KINDS`), or None when it is."""
    if kind in ("str", "bool", "dict", "list"):
        want = {"str": str, "bool": bool, "dict": dict, "list": list}[kind]
        names = {"str": "a string", "bool": "true or false", "dict": "a JSON object", "list": "a JSON list"}
        return None if isinstance(value, want) else f"must be {names[kind]}, got {quote(value)}"
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {quote(value)}"
        if abs(value) > MAX_INT:
            return f"must be an integer of at most 2**53, got {quote(value)}"
    elif kind.startswith("number"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {quote(value)}"
        if not is_finite(value):
            return f"must be a finite number, got {quote(value)}"
    else:
        raise ValueError(f"unknown field kind {kind!r}; expected one of {KINDS}")
    if kind.endswith(">0") and not value > 0:
        return f"must be positive, got {quote(value)}"
    if kind.endswith(">=0") and not value >= 0:
        return f"must be non-negative, got {quote(value)}"
    return None


def check_field(obj: Mapping, key: str, kind: str, where: str, *, optional: bool = False,
                error: type[InputFileError] = InputFileError):
    """``obj[key]`` checked against ``kind``; ``error`` naming ``where`` and the key otherwise.

    With ``optional``, a missing key or null is None.
    """
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise error(f"{where}: missing {key!r}" if key not in obj else f"{where}: {key!r} must not be null")
    problem = field_problem(obj[key], kind)
    if problem:
        raise error(f"{where}: {key!r} {problem}")
    return obj[key]

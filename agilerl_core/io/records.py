"""One parser for every stored JSON record (member.json, population.json, a generation's manifest, run.json, the
lease, lineage, dataset attributes, prompt sets) and field access that names the file and the field.

A record is data someone else may have written: :func:`read_record` checks its size before reading it, its
nesting depth before parsing it (no recursion), every number's digits (no huge ints or floats), refuses
``NaN``/``Infinity`` unless the record kind allows them, and refuses duplicate keys. :func:`field` and friends
read one value by its dotted path and check its type, so a tampered value either loads as data or raises the
project's error naming the file and the field, never a TypeError, KeyError, OverflowError, RecursionError or
ValueError.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agilerl_core import limits as _limits
from agilerl_core.errors import AgileRLError, CheckpointError
from agilerl_core.io.files import quote, read_bytes
from agilerl_core.limits import Limits

_MISSING = object()


class _Refused(Exception):
    """Raised from inside a parse hook; turned into the caller's error naming the file."""


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _depth(raw: bytes) -> int:
    """Largest nesting depth of `raw` as JSON text (brackets inside strings skipped); vectorised, no recursion."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    arr = np.frombuffer(brackets, np.uint8)
    steps = np.where((arr == 0x5B) | (arr == 0x7B), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max())


def read_record(source: str | os.PathLike | bytes, label: str | None = None, limits: Limits | None = None,
                error: type[AgileRLError] = CheckpointError, allow_nan: bool = False,
                root: str | os.PathLike | None = None) -> Any:
    """Parse one stored JSON record (a path, or its bytes with `label` naming where they came from).

    Refused with `error` naming the file: more than ``limits.json_bytes`` (checked before reading), nesting
    deeper than ``limits.json_depth``, a number of more than ``limits.json_digits`` digits, ``NaN``/``Infinity``
    (unless `allow_nan`), duplicate keys, bytes that are not UTF-8 JSON. A path must be a regular file (inside
    `root`, symbolic links resolved, when given)."""
    lim = limits or _limits.current()
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
        name = label or "<record>"
        if len(raw) > lim.json_bytes:
            raise error(f"{name}: {len(raw):,} bytes is over the limit limits.json_bytes = {lim.json_bytes:,}; "
                        f"raise limits.json_bytes in your own config if this record is meant")
    else:
        path = Path(source)
        name = label or str(path)
        raw = read_bytes(path, lim.json_bytes, "json_bytes", name, error, root)  # a regular file in `root` only
    depth = _depth(raw) if raw.count(b"[") + raw.count(b"{") > lim.json_depth else 0
    if depth > lim.json_depth:
        raise error(f"{name}: nested {depth} deep, over the limit limits.json_depth = {lim.json_depth}; the file "
                    f"is damaged or not one of ours")
    digits = lim.json_digits

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > digits:
            raise _Refused(f"a number of {len(text.lstrip('-')):,} digits is over the limit limits.json_digits = "
                           f"{digits}")
        return int(text)

    def parse_float(text: str) -> float:
        if len(text) > digits + 8:
            raise _Refused(f"a number of {len(text):,} characters is over the limit limits.json_digits = {digits}")
        value = float(text)
        if not math.isfinite(value) and not allow_nan:
            raise _Refused(f"the number {text[:40]} overflows a float")
        return value

    def parse_constant(text: str) -> float:
        if not allow_nan:
            raise _Refused(f"{text} is not a number this record may hold")
        return float(text)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise _Refused(f"key {k!r} appears twice in one object")
            out[k] = v
        return out

    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant,
                          object_pairs_hook=pairs)
    except _Refused as err:
        raise error(f"{name}: {err}; the file is damaged or not one of ours") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as err:
        raise error(f"{name}: not valid JSON ({err}); the file is truncated or not one of ours") from None


def read_format(source: str | os.PathLike | bytes, fmt: str, version: int, label: str | None = None,
                limits: Limits | None = None, error: type[AgileRLError] = CheckpointError,
                allow_nan: bool = False, root: str | os.PathLike | None = None) -> dict[str, Any]:
    """:func:`read_record`, then the record must be an object with ``format`` `fmt` and ``version`` `version`."""
    name = label or (str(source) if not isinstance(source, (bytes, bytearray, memoryview)) else "<record>")
    data = read_record(source, name, limits, error, allow_nan, root)
    if not isinstance(data, dict) or data.get("format") != fmt:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise error(f"{name}: not a {fmt} file (format {_short(found)})")
    if data.get("version") != version or isinstance(data.get("version"), bool):
        raise error(f"{name}: format version {_short(data.get('version'))} is not supported (expected {version})")
    return data


def _short(value: Any) -> str:
    return quote(value, 80)  # never the whole of a huge value: an error costs no more than a few lines


def _type_name(kind: Any) -> str:
    if isinstance(kind, tuple):
        return " or ".join(_type_name(k) for k in kind)
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false", list: "a list",
            dict: "an object", type(None): "null"}.get(kind, getattr(kind, "__name__", str(kind)))


def field(data: Any, path: str, kind: Any = _MISSING, file: str = "<record>", default: Any = _MISSING,
          error: type[AgileRLError] = CheckpointError) -> Any:
    """The value at dotted `path` (e.g. ``record.member_id``; list items by index, ``lineage.3.slot``) in `data`,
    checked to be of `kind` (a type or a tuple of types; ``int`` accepts no bool, ``float`` accepts an int;
    finite unless NaN was allowed at parsing). A missing key gives `default` when one is given; otherwise, and on
    a wrong type, `error` naming `file` and the field."""
    cur = data
    walked: list[str] = []
    for part in path.split("."):
        walked.append(part)
        if isinstance(cur, dict):
            if part not in cur:
                if default is not _MISSING:
                    return default
                raise error(f"{file}: field {'.'.join(walked)} is missing; the file is damaged or not one of ours")
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            where = ".".join(walked[:-1]) or "(top level)"
            raise error(f"{file}: field {where} is {_short(cur)}, not an object holding {part!r}")
    return check_type(cur, kind, path, file, error) if kind is not _MISSING else cur


def check_type(value: Any, kind: Any, path: str, file: str, error: type[AgileRLError] = CheckpointError) -> Any:
    """`value` when it is of `kind` (see :func:`field`), otherwise `error` naming `file` and field `path`."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for k in kinds:
        if k is None or k is type(None):
            if value is None:
                return value
        elif k is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif k is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif isinstance(value, k):
            return value
    raise error(f"{file}: field {path} is {_short(value)}, expected {_type_name(kind)}")


def sized(data: Any, path: str, limit: str, file: str, error: type[AgileRLError] = CheckpointError,
          limits: Limits | None = None, default: Any = _MISSING) -> int:
    """The whole number at `path`, no larger than limit `limit` (the refusal names file, field and limit)."""
    value = field(data, path, int, file, default, error)
    return _limits.check(limit, value, f"{file}: field {path}", error, limits)


def guarded(file: str, what: str, fn: Callable[[], Any], error: type[AgileRLError] = CheckpointError) -> Any:
    """Run `fn`; a stray TypeError/KeyError/ValueError/OverflowError/IndexError/RecursionError (a value of a
    shape no check foresaw) becomes `error` naming `file` and `what` (a field or part of the record)."""
    try:
        return fn()
    except AgileRLError:
        raise
    except (TypeError, KeyError, ValueError, OverflowError, IndexError, AttributeError, RecursionError) as err:
        raise error(f"{file}: field {what} is malformed ({type(err).__name__}: {str(err)[:200]})") from None

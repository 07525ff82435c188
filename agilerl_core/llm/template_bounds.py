"""The bounds a chat template renders within: what one render may still do (:class:`Budget`), what a value
holds or an operation would build (:func:`size_of`, :func:`printf_units`...), which built-in methods a template may
call, and the bounded filters and hooks :func:`agilerl_core.llm.chat_template.environment` routes every
operation of a template through (see :mod:`agilerl_core.llm.chat_template` for what is bounded and why).

Every hook charges the render's budget, set by :func:`agilerl_core.llm.chat_template.render` in
:data:`active_budget`; past a bound it raises :class:`TemplateBounds`, which the render reports as a ConfigError
naming the template's file and field.
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import inspect
import re
import string
import time
import types
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from typing import Any

from agilerl_core.io.files import quote

TEMPLATE_CHARS = 262_144  # characters of a template's source (genuine ones: a few thousand)
VALUE_UNITS = 1_048_576  # characters one value may hold (a container's entry counts ITEM more), plus 2x the message
WORK_FACTOR = 8  # all values built by one render together: this many times VALUE_UNITS
STEPS = 200_000  # loop iterations, calls, filters, operators and outputs of one render
SECONDS = 5.0  # wall-clock bound of one render (the steps bound it first for any template seen so far)
INT_BITS = 65_536  # the largest integer an operator may build
ITEM = 8  # what one entry of a container counts beyond its value (a reference)
_PARAM_CHARS = 32  # tojson's indent and separators, wordwrap's wrapstring, at most

COUNT_FILTER = "agilerl_count"  # the filter every for-loop's iterable goes through (each iteration a step)
CONCAT_FILTER = "agilerl_concat"  # the filter every ~ concatenation goes through (sized before it is joined)


class TemplateBounds(Exception):
    """A template went past one of the bounds (reported as a ConfigError naming the template's file and field)."""


class Budget:
    """What is left to one render: steps, work (units of all values built), the deadline."""

    __slots__ = ("deadline", "steps", "units", "work")

    def __init__(self, units: int) -> None:
        self.units = units
        self.work = units * WORK_FACTOR
        self.steps = STEPS
        self.deadline = time.monotonic() + SECONDS

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise TemplateBounds(f"takes more than {STEPS:,} steps (loop iterations, calls, filters, operators, "
                                 f"outputs)")
        if time.monotonic() > self.deadline:
            raise TemplateBounds(f"runs longer than {SECONDS:g} seconds")

    def fits(self, units: int, what: str) -> None:
        if units > self.units:
            raise TemplateBounds(f"builds {what} of more than {self.units:,} characters (an entry of a list or "
                                 f"dict counts {ITEM})")

    def charge(self, units: int, what: str) -> None:
        self.fits(units, what)
        self.work -= units
        if self.work < 0:
            raise TemplateBounds(f"builds more than {self.units * WORK_FACTOR:,} characters of values in all")


active_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("agilerl_template_budget", default=None)


def current_budget() -> Budget:
    b = active_budget.get()
    if b is None:  # Jinja folding a constant at compile time: leave it to the render, where it is bounded
        raise RuntimeError("a bounded chat template operation outside a render")
    return b


def size_of(value: Any, limit: int) -> int:
    """About how many characters `value` holds, or would print as (strings their length, numbers a few, every
    entry of a container :data:`ITEM` more than its value), counted up to just over `limit` and no further: a
    list holding one string a million times costs no more to size than `limit` does."""
    from jinja2.utils import Namespace

    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif v is None or isinstance(v, (bool, float)):
            total += ITEM
        elif isinstance(v, int):
            total += ITEM + v.bit_length() // 3
        elif isinstance(v, range):
            try:
                total += ITEM * (1 + len(v))
            except OverflowError:
                return limit + 1
        else:
            if isinstance(v, Namespace):
                v = getattr(v, "_Namespace__attrs", {})
            if isinstance(v, Mapping):
                total += ITEM * (1 + 2 * len(v))
                if total > limit:
                    return total
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)):
                total += ITEM * (1 + len(v))
                if total > limit:
                    return total
                stack.extend(v)
            else:
                total += ITEM
        if total > limit:
            return total
    return total


# ---- what an operation would build, known before it is built ---------------------------------------------------
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
_NUMBER_CHARS = 330  # a float printed with %f (1e308 has 309 digits)


def _number(text: str | None) -> int:
    if not text:
        return 0
    if text == "*" or len(text) > 9:
        raise TemplateBounds(f"formats with a width or precision of {quote(text)} (a width taken from the "
                             f"arguments, or one of a billion or more)")
    return int(text)


def _largest(values: Any, limit: int) -> int:
    items = list(values.values()) if isinstance(values, Mapping) else \
        list(values) if isinstance(values, tuple) else [values]
    return max((size_of(v, limit) for v in items), default=0)


def printf_units(fmt: str, values: Any, limit: int) -> int:
    """Characters ``fmt % values`` may hold at most (widths, precisions and the largest value per field)."""
    biggest = _largest(values, limit)
    total = len(fmt)
    for m in _PRINTF.finditer(fmt):
        width, precision, conversion = m.groups()
        total += _number(width) + _number(precision) + (0 if conversion == "%" else biggest + _NUMBER_CHARS)
    return total


def format_units(fmt: str, args: tuple, kwargs: dict, limit: int) -> int:
    """Characters ``fmt.format(*args, **kwargs)`` may hold at most."""
    biggest = max(_largest(args, limit), _largest(kwargs, limit))
    total = len(fmt)
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return total  # str.format raises the same error
    for _, name, spec, _ in fields:
        if name is None:
            continue
        if spec and ("{" in spec or "}" in spec):
            raise TemplateBounds(f"formats with a nested field in a format spec ({quote(spec)})")
        total += sum(_number(n) for n in re.findall(r"\d+", spec or "")) + biggest + _NUMBER_CHARS
    return total


def _replace_units(s: Any, old: Any, new: Any, count: Any) -> int:
    if not all(isinstance(x, str) for x in (s, old, new)):
        return 0  # not a string replace: the call raises, or builds from its inputs
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _joined(b: Budget, sep: Any, iterable: Any, what: str) -> list:
    """The items of `iterable` (at most the value bound's worth, each a step), after checking that joining them
    with `sep` stays within the bound."""
    items: list = []
    total = 0
    sep_len = size_of(sep, b.units)
    for item in iterable:
        b.step()
        total += size_of(item, b.units) + sep_len + ITEM
        b.fits(total, what)
        items.append(item)
    return items


def binop_units(b: Budget, operator: str, left: Any, right: Any) -> int:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                return max(n, 0) * size_of(seq, b.units) if n > 0 else 0
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > INT_BITS:
            raise TemplateBounds(f"multiplies integers into one of more than {INT_BITS:,} bits")
    elif operator == "+":
        if (isinstance(left, str) and isinstance(right, str)) or \
                (isinstance(left, (list, tuple)) and isinstance(right, (list, tuple))):
            return size_of(left, b.units) + size_of(right, b.units)
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1 \
                and right * left.bit_length() > INT_BITS:
            raise TemplateBounds(f"raises an integer to a power of more than {INT_BITS:,} bits")
    elif operator == "%" and isinstance(left, str):
        return printf_units(left, right, b.units)
    return 0


# ---- built-in methods a template may call -----------------------------------------------------------------------
_STR_METHODS = frozenset({
    "capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha", "isascii", "isdecimal",
    "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "lower",
    "lstrip", "partition", "removeprefix", "removesuffix", "rfind", "rindex", "rpartition", "rsplit", "rstrip",
    "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper", "striptags", "unescape",
    # sized before they run:
    "center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join"})
_METHODS: tuple[tuple[type | tuple[type, ...], frozenset[str]], ...] = (
    (str, _STR_METHODS),
    (bool, frozenset()),
    (int, frozenset({"bit_length", "is_integer", "conjugate"})),
    (float, frozenset({"is_integer", "conjugate"})),
    ((list, tuple), frozenset({"count", "index", "copy"})),
    (dict, frozenset({"get", "items", "keys", "values", "copy"})),
    ((set, frozenset), frozenset({"isdisjoint", "issubset", "issuperset", "copy"})),
)


def method_args(b: Budget, func: Any, owner: Any, args: tuple, kwargs: dict) -> tuple:
    """The arguments to call built-in method `func` of `owner` with, after refusing a method not on the list and
    sizing what a sized one would build."""
    name = getattr(func, "__name__", "?")
    allowed = next((names for kinds, names in _METHODS
                    if isinstance(owner, kinds) or (isinstance(owner, type) and issubclass(owner, kinds))), None)
    if allowed is None and not isinstance(func, types.BuiltinMethodType):
        return args  # a method of a Jinja object (loop.cycle, a macro's caller...) or of transformers' globals
    if allowed is None or name not in allowed or isinstance(owner, type):
        raise TemplateBounds(f"calls {type(owner).__name__ if not isinstance(owner, type) else owner.__name__}."
                             f"{name}(), which a chat template may not call")
    if isinstance(owner, str):
        if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
            b.charge(max(len(owner), args[0]), f"a str.{name}() result")
        elif name == "expandtabs":
            size = kwargs.get("tabsize", args[0] if args else 8)
            if isinstance(size, int):
                b.charge(len(owner) + owner.count("\t") * max(size, 0), "a str.expandtabs() result")
        elif name == "replace" and len(args) >= 2:
            b.charge(_replace_units(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)),
                     "a str.replace() result")
        elif name == "join" and args:
            return (_joined(b, owner, args[0], "a str.join() result"), *args[1:])
    return args


# ---- filters: every one sized around, a few sized before -------------------------------------------------------
def _bound_args(sig: inspect.Signature | None, args: tuple, kwargs: dict) -> dict[str, Any]:
    if sig is None:
        return {}
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return {}  # the filter itself raises the same error
    bound.apply_defaults()
    return bound.arguments


def _check_filter(b: Budget, name: str, p: dict[str, Any], env: Any) -> dict[str, Any] | None:
    """Refuse (or replace the arguments of) filter `name` called with arguments `p` when what it would build is
    over the bound; None: call it as it is."""
    value = next(iter(p.values()), None) if p else None
    for key in ("s", "value"):
        if key in p:
            value = p[key]
            break
    if name == "center" and isinstance(p.get("width"), int):
        b.charge(max(len(str(value)) if isinstance(value, str) else 0, p["width"]), "a center result")
    elif name == "indent" and isinstance(value, str):
        width = p.get("width", 4)
        per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        b.charge(len(value) + (value.count("\n") + 1) * max(per_line, 0), "an indent result")
    elif name == "wordwrap" and isinstance(value, str):
        wrap = p.get("wrapstring") or getattr(env, "newline_sequence", "\n")
        width = p.get("width", 79)
        if isinstance(wrap, str) and isinstance(width, int) and width > 0:
            b.charge(len(value) + (len(value) // width + 1) * len(wrap), "a wordwrap result")
    elif name == "format" and isinstance(value, str):
        values = p.get("kwargs") or p.get("args") or ()
        b.charge(printf_units(value, values if isinstance(values, (tuple, Mapping)) else (values,), b.units),
                 "a format result")
    elif name == "replace" and "old" in p:
        b.charge(_replace_units(str(value) if value is not None else "", p["old"], p["new"], p.get("count")),
                 "a replace result")
    elif name == "join":
        p = dict(p)
        p["value"] = _joined(b, p.get("d", ""), value if value is not None else [], "a join result")
        return p
    elif name == "batch" and isinstance(p.get("linecount"), int):
        b.charge(ITEM * max(p["linecount"], 0) + size_of(value, b.units), "a batch result")
    elif name == "slice" and isinstance(p.get("slices"), int):
        b.charge(ITEM * 2 * max(p["slices"], 0) + size_of(value, b.units), "a slice result")
    elif name == "sum" and not isinstance(p.get("start", 0), (int, float)):
        raise TemplateBounds("sums with a start that is not a number (summing lists or strings takes time "
                             "quadratic in their length)")
    elif name == "tojson":
        indent, separators = p.get("indent"), p.get("separators")
        too_long = (isinstance(indent, int) and not isinstance(indent, bool) and indent > _PARAM_CHARS) or \
            (isinstance(indent, str) and len(indent) > _PARAM_CHARS) or \
            (isinstance(separators, (tuple, list)) and any(isinstance(s, str) and len(s) > _PARAM_CHARS
                                                           for s in separators))
        if too_long:
            raise TemplateBounds(f"calls tojson with an indent or separators of more than {_PARAM_CHARS} "
                                 f"characters")
    return None


_REFUSED_FILTERS = frozenset({"urlize"})  # builds markup around every word that looks like a URL: no template needs it


def bounded_filter(name: str, func: Any) -> Any:
    """`func` (a Jinja filter) as a step that sizes its inputs and output, and what it would build first where
    that is known from its arguments."""
    from jinja2.utils import _PassArg

    skip = 0 if _PassArg.from_obj(func) is None else 1
    try:
        sig: inspect.Signature | None = inspect.signature(func)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        b = current_budget()
        b.step()
        if name in _REFUSED_FILTERS:
            raise TemplateBounds(f"uses the filter {name!r}, which a chat template may not use")
        for a in (*args[skip:], *kwargs.values()):
            b.fits(size_of(a, b.units), f"the input of filter {name!r}")
        p = _bound_args(sig, args, kwargs)
        replaced = _check_filter(b, name, p, args[0] if skip else None) if p else None
        if replaced is not None:
            out = func(*[replaced[k] for k, prm in sig.parameters.items()  # type: ignore[union-attr]
                         if prm.kind in (prm.POSITIONAL_ONLY, prm.POSITIONAL_OR_KEYWORD) and k in replaced])
        else:
            out = func(*args, **kwargs)
        b.charge(size_of(out, b.units), f"the output of filter {name!r}")
        return out

    return bounded


def count_iterations(iterable: Any) -> Any:
    """A for-loop's iterable, each iteration a step."""
    b = current_budget()

    def counted():
        for item in iterable:
            b.step()
            yield item

    return counted()


def bounded_concat(eval_ctx: Any, parts: list) -> str:
    """``a ~ b ~ ...``: Jinja's own join, sized first."""
    from jinja2.runtime import markup_join, str_join

    b = current_budget()
    b.step()
    total = 0
    for p in parts:
        total += size_of(p, b.units)
        b.fits(total, "a ~ concatenation")
    out = markup_join(parts) if (eval_ctx.volatile or eval_ctx.autoescape) else str_join(parts)
    b.charge(len(out), "a ~ concatenation")
    return out


def bounded_finalize(value: Any) -> Any:
    """Every output (``{{ ... }}`` and the text between), a step, sized; a value printed as a string is made one
    here, after its size was checked (what Jinja's ``str()`` of it would give)."""
    b = current_budget()
    b.step()
    if not isinstance(value, str) and not hasattr(value, "__html__"):
        b.fits(size_of(value, b.units), "an output")
        value = str(value)
    b.charge(len(value), "an output")
    return value


def bounded_lipsum(lipsum: Any) -> Any:
    def bounded(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        words = n * builtins.max(min, max) if all(isinstance(x, int) for x in (n, min, max)) else None
        if words is None or words * 16 > current_budget().units:
            raise TemplateBounds("calls lipsum for more text than a chat template may build")
        return lipsum(n=n, html=html, min=min, max=max)

    return functools.update_wrapper(bounded, lipsum)


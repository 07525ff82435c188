"""A model folder's chat template is data: it is rendered in a bounded sandbox, never by transformers' own renderer.

A chat template (``tokenizer_config.json: field chat_template``, ``chat_template.jinja``, a GGUF file's
``tokenizer.chat_template``) is a Jinja program that came with the base's files, and a checkpoint can name such a
folder. transformers renders it in Jinja's sandbox, which stops it reading attributes it should not, but not from
running without bound: ``{{ 'ab' * 1000000000 }}`` takes gigabytes, two nested ``range(20000)`` loops never end.

:func:`render_chat` renders it in :class:`BoundedSandbox`, transformers' own sandboxed environment (its globals
``raise_exception``, ``strftime_now``, ``dict``, ``namespace``, its ``tojson`` filter, its extensions, its
whitespace settings) with every way of making work bounded:

- every value the template builds (an operator's result, a filter's or call's result, a ``~`` concatenation, a
  slice, an output) is sized *before* it is built where its size can be known from its inputs (``*``, ``+``,
  ``%``, ``str.format``, ``center``, ``indent``, ``replace``, ``join``...) and after otherwise, against
  :data:`VALUE_UNITS` (plus twice the message's own length); all of them together against
  ``WORK_FACTOR`` times that;
- every loop iteration, call, filter, operator and output is a step: at most :data:`STEPS`, and the whole render
  at most :data:`SECONDS`;
- a method of a built-in value (``str``, ``list``, ``dict``...) is called only when it is on a short list of those
  whose result is no larger than their inputs or is sized first (``str.translate``, ``int.to_bytes`` and the like
  are refused); the template source is at most :data:`TEMPLATE_CHARS` characters.

A template past a bound, or one that cannot render a user message, is refused with a ConfigError naming the file
and field it came from. Genuine templates render exactly what ``tokenizer.apply_chat_template`` renders (tests
compare them).
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

from agilerl_core.errors import ConfigError
from agilerl_core.io.files import quote

TEMPLATE_CHARS = 262_144  # characters of a template's source (genuine ones: a few thousand)
VALUE_UNITS = 1_048_576  # characters one value may hold (a container's entry counts ITEM more), plus 2x the message
WORK_FACTOR = 8  # all values built by one render together: this many times VALUE_UNITS
STEPS = 200_000  # loop iterations, calls, filters, operators and outputs of one render
SECONDS = 5.0  # wall-clock bound of one render (the steps bound it first for any template seen so far)
INT_BITS = 65_536  # the largest integer an operator may build
ITEM = 8  # what one entry of a container counts beyond its value (a reference)
_PARAM_CHARS = 32  # tojson's indent and separators, wordwrap's wrapstring, at most

_COUNT = "agilerl_count"  # the filter every for-loop's iterable goes through (each iteration a step)
_CONCAT = "agilerl_concat"  # the filter every ~ concatenation goes through (sized before it is joined)


class TemplateBounds(Exception):
    """A template went past one of the bounds (reported as a ConfigError naming the template's file and field)."""


class _Budget:
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


_active: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("agilerl_template_budget", default=None)


def _budget() -> _Budget:
    b = _active.get()
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


def _joined(b: _Budget, sep: Any, iterable: Any, what: str) -> list:
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


def _binop_units(b: _Budget, operator: str, left: Any, right: Any) -> int:
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


def _method_args(b: _Budget, func: Any, owner: Any, args: tuple, kwargs: dict) -> tuple:
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


def _check_filter(b: _Budget, name: str, p: dict[str, Any], env: Any) -> dict[str, Any] | None:
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


def _bounded_filter(name: str, func: Any) -> Any:
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
        b = _budget()
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


def _count(iterable: Any) -> Any:
    """A for-loop's iterable, each iteration a step."""
    b = _budget()

    def counted():
        for item in iterable:
            b.step()
            yield item

    return counted()


def _concat(eval_ctx: Any, parts: list) -> str:
    """``a ~ b ~ ...``: Jinja's own join, sized first."""
    from jinja2.runtime import markup_join, str_join

    b = _budget()
    b.step()
    total = 0
    for p in parts:
        total += size_of(p, b.units)
        b.fits(total, "a ~ concatenation")
    out = markup_join(parts) if (eval_ctx.volatile or eval_ctx.autoescape) else str_join(parts)
    b.charge(len(out), "a ~ concatenation")
    return out


def _finalize(value: Any) -> Any:
    """Every output (``{{ ... }}`` and the text between), a step, sized; a value printed as a string is made one
    here, after its size was checked (what Jinja's ``str()`` of it would give)."""
    b = _budget()
    b.step()
    if not isinstance(value, str) and not hasattr(value, "__html__"):
        b.fits(size_of(value, b.units), "an output")
        value = str(value)
    b.charge(len(value), "an output")
    return value


def _lipsum(lipsum: Any) -> Any:
    def bounded(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        words = n * builtins.max(min, max) if all(isinstance(x, int) for x in (n, min, max)) else None
        if words is None or words * 16 > _budget().units:
            raise TemplateBounds("calls lipsum for more text than a chat template may build")
        return lipsum(n=n, html=html, min=min, max=max)

    return functools.update_wrapper(bounded, lipsum)


# ---- the environment ---------------------------------------------------------------------------------------------
def _reference() -> Any:
    """transformers' own chat-template environment (its globals, filters, extensions and settings)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template("").environment
    except (ImportError, AttributeError):  # another transformers: Jinja's sandbox as transformers sets it up
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                             extensions=[jinja2.ext.loopcontrols])


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    """The one :class:`BoundedSandbox` (built on first use, like transformers' own)."""
    from jinja2 import nodes, pass_eval_context
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ref = _reference()

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """transformers' chat-template sandbox with every operation a bounded step (see the module)."""

        intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            fors, concats, outputs = (list(tree.find_all(kind)) for kind in (nodes.For, nodes.Concat, nodes.Output))
            for node in fors:
                node.iter = nodes.Filter(node.iter, _COUNT, [], [], None, None, lineno=node.lineno)
            for node in concats:
                node.nodes = [nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), _CONCAT, [], [], None, None,
                                           lineno=node.lineno)]
            for node in outputs:  # the text between tags goes through finalize too (a loop's text is output)
                node.nodes = [nodes.MarkSafeIfAutoescape(nodes.Const(c.data, lineno=c.lineno), lineno=c.lineno)
                              if isinstance(c, nodes.TemplateData) else c for c in node.nodes]
            tree.set_environment(self)
            return tree

        def call_binop(self, context, operator, left, right):
            b = _budget()
            b.step()
            units = _binop_units(b, operator, left, right)
            if units:
                b.charge(units, f"the result of {operator!r}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):
            b = _budget()
            b.step()
            for a in (*args, *kwargs.values()):
                b.fits(size_of(a, b.units), "an argument of a call")
            owner = getattr(__obj, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType) and \
                    isinstance(__obj, (types.BuiltinMethodType, types.MethodType)):
                args = _method_args(b, __obj, owner, args, kwargs)
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's inner iterable: counted too
                args = (_count(args[0]), *args[1:])
            out = super().call(__context, __obj, *args, **kwargs)
            b.charge(size_of(out, b.units), "a call's result")
            return out

        def getitem(self, obj, argument):
            b = _budget()
            b.step()
            if isinstance(argument, slice) and isinstance(obj, (str, list, tuple)):
                try:
                    n = len(range(*argument.indices(len(obj))))
                except (TypeError, ValueError):
                    n = 0  # the subscript raises
                b.charge(n * (1 if isinstance(obj, str) else ITEM), "a slice")
            return super().getitem(obj, argument)

        def getattr(self, obj, attribute):
            _budget().step()
            return super().getattr(obj, attribute)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt, is_map = value.__self__, value.__name__ == "format_map"

            def bounded(*args, **kwargs):
                b = _budget()
                mapping = args[0] if is_map and args and isinstance(args[0], Mapping) else kwargs
                b.charge(format_units(fmt, () if is_map else args, mapping, b.units), f"a str.{value.__name__} result")
                return wrapped(*args, **kwargs)

            return functools.update_wrapper(bounded, wrapped)

    options = {k: getattr(ref, k) for k in (
        "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
        "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
        "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized", "autoescape")}
    env = BoundedSandbox(extensions=[type(e) for e in ref.extensions.values()], finalize=_finalize, **options)
    env.policies = dict(ref.policies)
    env.tests = dict(ref.tests)
    env.globals.update(ref.globals)
    if "lipsum" in env.globals:
        env.globals["lipsum"] = _lipsum(env.globals["lipsum"])
    env.filters = {name: _bounded_filter(name, f) for name, f in ref.filters.items()}
    env.filters[_COUNT] = _count
    env.filters[_CONCAT] = pass_eval_context(_concat)
    return env


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> Any:
    return environment().from_string(source)


def _plain(value: Any) -> Any:
    """What transformers hands a template for `value` (plain JSON types; anything else a placeholder)."""
    try:
        from transformers.utils.chat_template_utils import _plain_template_data
    except ImportError:
        return value
    return _plain_template_data(value)


def compiled(source: Any, where: str) -> Any:
    """`source` compiled in the bounded sandbox; a ConfigError naming `where` (the file and field) when it is not
    a string, longer than :data:`TEMPLATE_CHARS` or not a Jinja template."""
    if not isinstance(source, str):
        raise ConfigError(f"{where}: is {quote(source)}, not a Jinja template (a string)")
    if len(source) > TEMPLATE_CHARS:
        raise ConfigError(f"{where}: {len(source):,} characters, over the {TEMPLATE_CHARS:,} a chat template may "
                          f"have; use the base model's own template (or model.chat_template: off)")
    try:
        return _compiled(source)
    except Exception as err:  # a syntax error, a recursion too deep to parse: the template is data
        raise ConfigError(f"{where}: not a Jinja template this sandbox compiles ({type(err).__name__}: "
                          f"{quote(str(err))})") from None


def render(source: Any, where: str, message_chars: int = 0, **context: Any) -> str:
    """`source` (a chat template) rendered with `context` in the bounded sandbox: the value bound is
    :data:`VALUE_UNITS` plus twice `message_chars` (the messages' own length). A template past a bound, or one that
    fails, is a ConfigError naming `where` (its file and field)."""
    template = compiled(source, where)
    budget = _Budget(VALUE_UNITS + 2 * message_chars)
    token = _active.set(budget)
    pieces = template.generate(**context)
    try:
        out: list[str] = []
        size = 0
        for piece in pieces:
            size += len(piece)
            budget.fits(size, "an output")
            out.append(piece)
        return "".join(out)
    except TemplateBounds as err:
        raise ConfigError(f"{where}: the chat template {err}; a chat template is data, rendered within bounds: use "
                          f"the base model's own template (or model.chat_template: off)") from None
    except Exception as err:  # raise_exception, a type error, a recursion too deep...: the template's own error
        raise ConfigError(f"{where}: the chat template cannot render a user message ({type(err).__name__}: "
                          f"{quote(str(err))})") from None
    finally:
        pieces.close()
        _active.reset(token)


def chat_text(tokenizer: Any, text: str, where: str) -> str:
    """One user message `text` through the tokenizer's chat template with the generation prompt: the text
    ``tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
    tokenize=False)`` gives, rendered in the bounded sandbox (a ConfigError naming `where` past its bounds)."""
    try:
        source = tokenizer.get_chat_template()
    except ValueError as err:  # no template, or several and none the default
        raise ConfigError(f"{where}: {quote(str(err))}") from None
    specials = _plain(dict(tokenizer.special_tokens_map))  # what transformers hands the template besides
    messages = _plain([{"role": "user", "content": text}])
    return render(source, where, len(text), messages=messages, tools=None, documents=None,
                  add_generation_prompt=True, **specials)


def chat_prompt(tokenizer: Any, text: str, where: str) -> list[int]:
    """Token ids of :func:`chat_text` (what ``apply_chat_template(..., tokenize=True)`` gives)."""
    return list(tokenizer(chat_text(tokenizer, text, where), add_special_tokens=False)["input_ids"])

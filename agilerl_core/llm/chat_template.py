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

This module builds the sandbox and renders in it; the bounds themselves (the budget of one render, how values and
operations are sized, the methods a template may call, the bounded filters) are in
:mod:`agilerl_core.llm.template_bounds`.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any

from agilerl_core.errors import ConfigError
from agilerl_core.io.files import quote
from agilerl_core.llm.template_bounds import (
    CONCAT_FILTER,
    COUNT_FILTER,
    ITEM,
    TEMPLATE_CHARS,
    VALUE_UNITS,
    Budget,
    TemplateBounds,
    active_budget,
    binop_units,
    bounded_concat,
    bounded_filter,
    bounded_finalize,
    bounded_lipsum,
    count_iterations,
    current_budget,
    format_units,
    method_args,
    size_of,
)


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
                node.iter = nodes.Filter(node.iter, COUNT_FILTER, [], [], None, None, lineno=node.lineno)
            for node in concats:
                node.nodes = [nodes.Filter(nodes.List(node.nodes, lineno=node.lineno), CONCAT_FILTER, [], [], None, None,
                                           lineno=node.lineno)]
            for node in outputs:  # the text between tags goes through finalize too (a loop's text is output)
                node.nodes = [nodes.MarkSafeIfAutoescape(nodes.Const(c.data, lineno=c.lineno), lineno=c.lineno)
                              if isinstance(c, nodes.TemplateData) else c for c in node.nodes]
            tree.set_environment(self)
            return tree

        def call_binop(self, context, operator, left, right):
            b = current_budget()
            b.step()
            units = binop_units(b, operator, left, right)
            if units:
                b.charge(units, f"the result of {operator!r}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):
            b = current_budget()
            b.step()
            for a in (*args, *kwargs.values()):
                b.fits(size_of(a, b.units), "an argument of a call")
            owner = getattr(__obj, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType) and \
                    isinstance(__obj, (types.BuiltinMethodType, types.MethodType)):
                args = method_args(b, __obj, owner, args, kwargs)
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's inner iterable: counted too
                args = (count_iterations(args[0]), *args[1:])
            out = super().call(__context, __obj, *args, **kwargs)
            b.charge(size_of(out, b.units), "a call's result")
            return out

        def getitem(self, obj, argument):
            b = current_budget()
            b.step()
            if isinstance(argument, slice) and isinstance(obj, (str, list, tuple)):
                try:
                    n = len(range(*argument.indices(len(obj))))
                except (TypeError, ValueError):
                    n = 0  # the subscript raises
                b.charge(n * (1 if isinstance(obj, str) else ITEM), "a slice")
            return super().getitem(obj, argument)

        def getattr(self, obj, attribute):
            current_budget().step()
            return super().getattr(obj, attribute)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt, is_map = value.__self__, value.__name__ == "format_map"

            def bounded(*args, **kwargs):
                b = current_budget()
                mapping = args[0] if is_map and args and isinstance(args[0], Mapping) else kwargs
                b.charge(format_units(fmt, () if is_map else args, mapping, b.units), f"a str.{value.__name__} result")
                return wrapped(*args, **kwargs)

            return functools.update_wrapper(bounded, wrapped)

    options = {k: getattr(ref, k) for k in (
        "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
        "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
        "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized", "autoescape")}
    env = BoundedSandbox(extensions=[type(e) for e in ref.extensions.values()], finalize=bounded_finalize, **options)
    env.policies = dict(ref.policies)
    env.tests = dict(ref.tests)
    env.globals.update(ref.globals)
    if "lipsum" in env.globals:
        env.globals["lipsum"] = bounded_lipsum(env.globals["lipsum"])
    env.filters = {name: bounded_filter(name, f) for name, f in ref.filters.items()}
    env.filters[COUNT_FILTER] = count_iterations
    env.filters[CONCAT_FILTER] = pass_eval_context(bounded_concat)
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
    budget = Budget(VALUE_UNITS + 2 * message_chars)
    token = active_budget.set(budget)
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
        active_budget.reset(token)


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

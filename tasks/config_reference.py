"""The configuration reference as Markdown, generated from the config models themselves (every field's type,
default and description), so the documentation site can never drift from what validation accepts. The docs
build calls :func:`config_reference` (``docs/_hooks/config_reference.py``)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agilerl_core.algorithms.registry import ALGORITHMS
from tasks.config import PIPELINE_KINDS

_TITLES = {"gym": "Gymnasium (`kind: gym`, the default)", "offline": "Offline (`kind: offline`)",
           "multi_agent": "Multi-agent (`kind: multi_agent`)", "llm": "LLM fine-tuning (`kind: llm`)",
           "language": "Language games (`kind: language`)", "bandit": "Contextual bandits (`kind: bandit`)"}


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation)).replace("|", "\\|")


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    else:
        return "**required**"
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{value!r}`".replace("|", "\\|")


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation holds (a section, or one inside Optional / a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _sections(a)]


def _table(model: type[BaseModel], prefix: str, out: list[str], seen: set[str]) -> None:
    nested: list[tuple[str, type[BaseModel]]] = []
    out += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if prefix == "" and name == "hyperparameters":
            desc = "The algorithm's hyperparameters: see *Hyperparameters* below."
        else:
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            for section in _sections(field.annotation):
                nested.append((f"{prefix}{name}", section))
        out.append(f"| `{prefix}{name}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |")
    out.append("")
    for path, section in nested:
        key = f"{path}:{section.__name__}"
        if key in seen:
            continue
        seen.add(key)
        doc = (section.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out += [f"#### `{path}`", "", doc, ""] if doc else [f"#### `{path}`", ""]
        _table(section, f"{path}.", out, seen)


def config_reference() -> str:
    """Every kind of config, section by section, then each algorithm's hyperparameters, as Markdown."""
    out: list[str] = []
    for kind, model in PIPELINE_KINDS.kinds.items():
        out += [f"## {_TITLES.get(kind, kind)}", "", (model.__doc__ or "").strip(), ""]
        _table(model, "", out, set())
    out += ["## Hyperparameters", "",
            "`hyperparameters:` takes the fields of the config's `algorithm` (unknown fields are errors).", ""]
    for name, info in ALGORITHMS.items():
        out += [f"### `{name}`", ""]
        out += ["| field | type | default | description |", "|---|---|---|---|"]
        for fname, field in info.hp_model.model_fields.items():
            desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{fname}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |")
        out.append("")
    return "\n".join(out)

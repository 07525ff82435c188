"""The documentation: every public name documented (the API page renders each), the config reference complete.
The site itself is built with ``mkdocs build --strict`` by .ci/run (a broken reference fails CI)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import agilerl_core
import flows
from tasks.config import PIPELINE_KINDS
from tasks.config_reference import config_reference

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _public(obj) -> list[tuple[str, object]]:
    out = [("", obj)]
    if inspect.isclass(obj):
        out += [(f".{n}", m) for n, m in vars(obj).items() if not n.startswith("_") and
                (inspect.isfunction(m) or isinstance(m, property))]
    return out


def _resolve(ref: str):
    """The object a mkdocstrings reference names: the longest importable module prefix, then attributes."""
    import importlib

    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"docs/reference/api.md: ::: {ref} names nothing importable")


def test_every_public_name_has_a_docstring_and_a_place_on_the_api_page():
    api_page = (DOCS / "reference" / "api.md").read_text()
    rendered = set(re.findall(r"^::: ([\w.]+)$", api_page, re.M))
    shown = [_resolve(ref) for ref in rendered]  # by its public path (agilerl_core.api.evolve), wherever defined
    names = [n for n in agilerl_core.__all__ if n != "__version__"]
    for name in names:
        obj = getattr(agilerl_core, name)
        assert any(obj is o for o in shown), f"{name} is not on docs/reference/api.md"
        for suffix, member in _public(obj):
            doc = inspect.getdoc(member.fget if isinstance(member, property) else member)
            assert doc and doc.strip(), f"agilerl_core.{name}{suffix} has no docstring"
    assert "flows.api.run" in rendered and inspect.getdoc(flows.run)


def test_the_config_reference_lists_every_field_with_a_description():
    text = config_reference()
    for model in PIPELINE_KINDS.kinds.values():
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in text
            assert field.description, f"{model.__name__}.{name} has no description"
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows and all(not line.rstrip().endswith("|  |") for line in rows), "a field without a description"


def test_every_page_in_the_nav_exists():
    nav = re.findall(r": ([\w/]+\.md)$", (DOCS.parent / "mkdocs.yml").read_text(), re.M)
    assert nav and all((DOCS / p).is_file() for p in nav)
    assert sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")) == sorted(nav)

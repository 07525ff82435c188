"""The API reference a user reads: every field of the records the API returns is documented, cross-references
render as code (not Sphinx roles), and printing a result is short."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ["agilerl_core.api.EvolveResult", "agilerl_core.results.GenerationStats",
           "agilerl_core.results.TrainResult", "agilerl_core.results.RunResult"]


@pytest.mark.parametrize("path", RECORDS)
def test_every_field_of_a_returned_record_is_documented(path):
    module, name = path.rsplit(".", 1)
    cls = griffe.load(module, search_paths=[str(ROOT)])[name]  # what mkdocstrings renders the reference from
    fields = [m for m in cls.members.values() if m.is_attribute and not m.name.startswith("_")]
    assert fields, path
    undocumented = [f.name for f in fields if not (f.docstring and f.docstring.value.strip())]
    assert not undocumented, f"{path}: {undocumented} have no docstring in the reference"


def test_sphinx_roles_render_as_code_spans():
    spec = importlib.util.spec_from_file_location("sphinx_roles", ROOT / "docs" / "_hooks" / "sphinx_roles.py")
    hook = importlib.util.module_from_spec(spec)
    sys.modules["sphinx_roles"] = hook
    spec.loader.exec_module(hook)
    html = ("see :meth:<code>Evolution.save</code>, :class:<code>~agilerl_core.api.Policy</code> and "
            ":py:func:<code>load</code>; a plain <code>x</code>:")
    assert hook.render_roles(html) == ("see <code>Evolution.save</code>, <code>Policy</code> and <code>load</code>; "
                                       "a plain <code>x</code>:")


def test_printing_a_result_is_short(tmp_path):
    import agilerl_core as ac
    from tests.test_api import Corridor, corridor_config

    res = ac.evolve(corridor_config(output_dir=str(tmp_path), max_env_steps=600, population_size=2), env=Corridor,
                    progress=False)
    assert len(repr(res)) < 400 and "best=Policy(" in repr(res)
    assert len(repr(res.run)) < 1200 and "history" not in repr(res.run)

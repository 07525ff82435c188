"""The import graph, read with ast: module-level imports only (what runs at import time).

* agilerl_core never imports prefect, mlflow or the pipeline layers (tasks, flows);
* the layers call down only: agilerl_core <- tasks <- flows;
* no circle among the project's modules;
* the config imports no algorithm implementation (it validates without torch)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agilerl_core", "tasks", "flows")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, lazy: bool = False) -> set[str]:
    """Modules imported at import time: module-level statements, outside `if TYPE_CHECKING:` blocks and
    function bodies (a lazy import inside a function is not part of the import-time graph). With `lazy`,
    the imports inside functions and classes too: every module the file can pull in when used."""
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                if lazy:
                    for handler in node.handlers:
                        visit(handler.body)
                    visit(node.orelse)
                    visit(node.finalbody)
            elif lazy and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.With
                                     | ast.For | ast.While):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found


def _graph(lazy: bool = False) -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for imp in _top_level_imports(path, lazy):
            if imp in modules:
                deps.add(imp)
            # importing a.b.c runs a/__init__ and a/b/__init__ too (but a module's own parent packages are
            # initialised before it in any case: that is nesting, not a circle)
            parts = imp.split(".")
            deps.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                        if p in modules and not name.startswith(p + "."))
        graph[name] = deps - {name}
    return graph


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_engine_imports_neither_orchestration_nor_tracking():
    for path in (ROOT / "agilerl_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):  # lazy imports included
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert name.split(".")[0] not in ("prefect", "mlflow", "prefect_dask", "tasks", "flows"), \
                    f"{path.relative_to(ROOT)} imports {name}"


def test_layers_call_down_only():
    for name, deps in _graph().items():
        if name.startswith("tasks"):
            assert not any(d.startswith("flows") for d in deps), f"{name} imports {deps}"


@pytest.mark.parametrize("lazy", [False, True], ids=["import-time", "function-level-too"])
def test_no_circle_in_the_import_graph(lazy):
    """No circle among the project's modules, neither at import time nor through imports made inside
    functions (a lazy import that closes a circle hides a layering knot, it does not untie it)."""
    graph = _graph(lazy)
    # the walk must see function-level imports, or this check proves nothing (initial_arch imports lazily)
    assert ("agilerl_core.errors" in graph["agilerl_core.networks.evolvable"]) == lazy
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(dep):], dep]))
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_the_config_imports_no_algorithm():
    graph = _graph()
    models = ("agilerl_core.algorithms.hyperparameters", "agilerl_core.algorithms.registry")
    implementations = {n for n in graph if n.startswith(("agilerl_core.algorithms.", "agilerl_core.llm.",
                                                         "agilerl_core.language.")) and not n.startswith(models)}
    assert implementations, "the algorithm modules moved: update this test"
    loaded = _closure(graph, "agilerl_core.config")
    assert not loaded & implementations, f"agilerl_core.config imports {sorted(loaded & implementations)}"
    assert "agilerl_core.algorithms.hyperparameters.dqn" in loaded  # it does read the hyperparameter models


def test_the_config_never_imports_an_algorithm_even_lazily():
    """The old config reached the algorithm classes through a function-level import of the registry's
    spaces (a circle: algorithms imported the config): the registry now holds the traits as data."""
    for path in (ROOT / "agilerl_core" / "config").rglob("*.py"):  # the config package, every module of it
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agilerl_core.algorithms."):
                assert node.module.startswith(("agilerl_core.algorithms.hyperparameters.",
                                               "agilerl_core.algorithms.registry")), f"{path.name}: {node.module}"


# The engine's layers, lowest first, are tests/test_layers.py's LAYERS.


def test_the_evolution_knows_no_kind_of_training():
    """Selection, mutation, commit and resume act on members through the Evolvable protocol: no algorithm,
    network or arena is imported by hpo/ or evolution.py, even lazily."""
    graph = _graph(lazy=True)
    for name, deps in graph.items():
        if name.startswith(("agilerl_core.hpo", "agilerl_core.evolution")):
            bad = sorted(d for d in deps if d.startswith(("agilerl_core.algorithms", "agilerl_core.networks",
                                                          "agilerl_core.arenas")))
            assert not bad, f"{name} imports {bad}"


def test_the_cli_calls_the_python_api_not_the_other_way():
    graph = _graph(lazy=True)
    assert "flows.api" in graph["flows.cli"] or any("flows.api" in graph[m] for m in graph["flows.cli"]), \
        "the CLI no longer runs flows through flows.api.run: update this test"
    below = _closure(graph, "flows.api")
    cli = sorted(m for m in below if m.startswith("flows.cli"))
    assert not cli, f"flows.api reaches {cli}"

"""The house points down: each folder (or top-level module) of ``agilerl_core`` imports only itself and the
units below it in :data:`LAYERS`, and no module imports its way back to itself. Imports under
``if TYPE_CHECKING:`` are annotations, not dependencies, and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "agilerl_core"

# Bottom first. A unit is a folder of agilerl_core or one of its top-level modules.
LAYERS = [
    {"errors"},
    {"limits", "finite", "rng", "net", "progress", "code_refs", "results"},
    {"envs"},
    {"networks", "buffers"},
    {"hpo"},
    {"io"},
    {"data"},
    {"language"},
    {"llm"},
    {"algorithms"},
    {"config"},
    {"arenas"},
    {"evolution"},
    {"champion"},
    {"experiment"},
    {"api"},
    {"__init__"},
]
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _module_name(path: Path) -> str:
    parts = ("agilerl_core", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports() -> dict[str, set[str]]:
    """module -> the agilerl_core modules it imports (at module level or inside functions)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base_pkg = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(base_pkg + ([node.module] if node.module else []))
                # `from pkg import name`: the module pkg.name where there is one, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:  # `from pkg import name` names a module or an attribute
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("agilerl_core"):
                    found.add(t)
        graph[name] = found
    return graph


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in _imports()}
    assert units <= set(LEVEL), f"place these in LAYERS: {sorted(units - set(LEVEL))}"


def test_no_unit_imports_a_unit_above_it():
    upward = sorted(f"{m} imports {t}" for m, ts in _imports().items() for t in ts
                    if _unit(t) != _unit(m) and LEVEL[_unit(t)] >= LEVEL[_unit(m)])
    assert not upward, "imports pointing up (or sideways) the layers:\n" + "\n".join(upward)


def test_no_module_circle():
    graph = nx.DiGraph([(m, t) for m, ts in _imports().items() for t in ts
                        if not m.endswith("__init__") and t != m])
    # a package's __init__ re-exporting its own modules is not a circle of the house: drop edges into parents
    graph.remove_edges_from([(m, t) for m, t in list(graph.edges) if m.startswith(t + ".")])
    circles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert not circles, f"module circles: {circles[:5]}"

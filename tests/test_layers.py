"""The house points down: each folder (or top-level module) of ``agilerl_core`` imports only itself and the
units below it in :data:`LAYERS`, and no module imports its way back to itself. Imports under
``if TYPE_CHECKING:`` are annotations, not dependencies, and are left out."""

from __future__ import annotations

import networkx as nx

from tests.test_import_graph import _graph

# Bottom first. A unit is a folder of agilerl_core or one of its top-level modules.
LAYERS = [
    {"errors"},
    {"limits", "finite", "rng", "net", "progress", "code_refs", "results", "train_metrics"},
    {"envs"},
    {"networks", "buffers"},
    {"hpo"},
    {"io"},
    {"data"},
    {"algorithms"},  # the RL families and every family's hyperparameter model (the config reads them)
    {"language"},  # the language games and their small GPT members
    {"llm"},  # the shared base, its adapters and the LLM algorithms
    {"loops"},  # the RL training loops over a group: on-policy, off-policy, offline
    {"config"},
    {"arenas"},
    {"evolution"},
    {"champion"},
    {"experiment"},
    {"api"},
    {"__init__"},
]
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports() -> dict[str, set[str]]:
    """agilerl_core module -> the agilerl_core modules it imports, lazily (inside functions) too: the import
    graph of tests/test_import_graph.py. The root package is every module's parent (initialised first in any
    case: nesting, not a layer), so importing it is not counted."""
    return {m: {t for t in deps if t.startswith("agilerl_core.")}
            for m, deps in _graph(lazy=True).items() if m.startswith("agilerl_core")}


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in _imports()}
    assert units <= set(LEVEL), f"place these in LAYERS: {sorted(units - set(LEVEL))}"


def test_no_unit_imports_a_unit_above_it():
    upward = sorted(f"{m} imports {t}" for m, ts in _imports().items() for t in ts
                    if _unit(t) != _unit(m) and LEVEL[_unit(t)] >= LEVEL[_unit(m)])
    assert not upward, "imports pointing up (or sideways) the layers:\n" + "\n".join(upward)


def test_no_module_circle():
    graph = nx.DiGraph([(m, t) for m, ts in _imports().items() for t in ts])
    # a package's __init__ re-exporting its own modules is not a circle of the house
    graph.remove_edges_from([(m, t) for m, t in list(graph.edges) if t.startswith(m + ".")])
    circles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert not circles, f"module circles: {circles[:5]}"

"""Prefect flows: one generation = one DAG of tasks; a flow = generations.

``flows.run(config, env=..., callbacks=...)`` runs one from Python (:func:`flows.api.run`);
``flows.run_stages(path)`` runs a chain of LLM stages (:func:`flows.api.run_stages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["run", "run_stages"]

if TYPE_CHECKING:
    from flows.api import run, run_stages


def __getattr__(name: str) -> Any:
    if name in __all__:
        import flows.api

        return getattr(flows.api, name)
    raise AttributeError(f"module 'flows' has no attribute {name!r}")

"""Prefect flows: one generation = one DAG of tasks; a flow = generations.

``flows.run(config, env=..., callbacks=...)`` runs one from Python (:func:`flows.api.run`);
``flows.run_stages(path)`` runs a chain of LLM stages (:func:`flows.stages.run_stages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["run", "run_stages"]

if TYPE_CHECKING:
    from flows.api import run
    from flows.stages import run_stages


def __getattr__(name: str) -> Any:
    if name == "run":
        from flows.api import run

        return run
    if name == "run_stages":
        from flows.stages import run_stages

        return run_stages
    raise AttributeError(f"module 'flows' has no attribute {name!r}")

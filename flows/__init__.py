"""Prefect flows: one generation = one DAG of tasks; a flow = generations.

``flows.run(config, env=..., callbacks=...)`` runs one from Python (:func:`flows.api.run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["run"]

if TYPE_CHECKING:
    from flows.api import run


def __getattr__(name: str) -> Any:
    if name == "run":
        from flows.api import run

        return run
    raise AttributeError(f"module 'flows' has no attribute {name!r}")

"""RL members from checkpoints: the ``io`` loaders with this layer's registry handed in.

``io.checkpoint`` reads and verifies a member's files and imports no algorithm; here the algorithm a checkpoint
names is looked up in the fixed table (:func:`~agilerl_core.algorithms.registry.get_algorithm`), never imported
by name. Arenas that build members of their own (LLM, language) pass their ``member_from_state`` instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agilerl_core.algorithms.registry import get_algorithm


def load_member(path: str | Path, obs_spec: Any = None, device: str = "cpu",
                root: str | Path | None = None) -> tuple[Any, dict]:
    """(member, env description) of a saved RL member; see :func:`agilerl_core.io.checkpoint.load_member`."""
    from agilerl_core.io.checkpoint import load_member as load

    return load(path, obs_spec, device, root=root, algorithms=get_algorithm)


def load_population(path: str | Path, obs_spec: Any = None, buffer: Any = None,
                    device: str = "cpu") -> tuple[Any, dict]:
    """(population, metadata) of a saved RL population; see :func:`agilerl_core.io.checkpoint.load_population`."""
    from agilerl_core.io.checkpoint import load_population as load

    return load(path, obs_spec, buffer, device, algorithms=get_algorithm)

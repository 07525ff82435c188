"""Algorithms by config name."""

from __future__ import annotations

from agilerl_core.hpo.space import HyperparameterSpec


def _algorithms() -> dict[str, type]:
    from agilerl_core.algorithms.dqn import DQN

    return {"dqn": DQN}


def get_algorithm(name: str) -> type:
    algos = _algorithms()
    if name not in algos:
        raise KeyError(f"unknown algorithm {name!r}; available: {sorted(algos)}")
    return algos[name]


class _Spaces(dict):
    def __missing__(self, key: str) -> dict[str, HyperparameterSpec]:
        return get_algorithm(key).default_hp_space


ALGORITHM_HP_SPACES = _Spaces()

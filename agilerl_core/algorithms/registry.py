"""Algorithms by config name."""

from __future__ import annotations

from agilerl_core.hpo.space import HyperparameterSpec


def _algorithms() -> dict[str, type]:
    from agilerl_core.algorithms.bc import BC
    from agilerl_core.algorithms.cql import CQL, CQN
    from agilerl_core.algorithms.dqn import DQN, Rainbow
    from agilerl_core.algorithms.ppo import PPO
    from agilerl_core.algorithms.sac import SAC
    from agilerl_core.algorithms.td3 import DDPG, TD3

    return {cls.name: cls for cls in (DQN, Rainbow, DDPG, TD3, SAC, PPO, CQN, CQL, BC)}


def algorithms_for(action_kind: str) -> list[str]:
    """Names of the algorithms that act in spaces of `action_kind` ("discrete" or "box")."""
    return sorted(n for n, cls in _algorithms().items() if action_kind in cls.action_kinds)


def get_algorithm(name: str) -> type:
    algos = _algorithms()
    if name not in algos:
        raise KeyError(f"unknown algorithm {name!r}; available: {sorted(algos)}")
    return algos[name]


class _Spaces(dict):
    def __missing__(self, key: str) -> dict[str, HyperparameterSpec]:
        return get_algorithm(key).default_hp_space


ALGORITHM_HP_SPACES = _Spaces()

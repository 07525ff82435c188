"""Arenas: one per kind of training. An arena builds members, trains a slot, evaluates it and hands out
the experience members share; the evolution core (``agilerl_core.evolution``) drives any of them.

The registry (``agilerl_core.algorithms.registry``) names the arena of each algorithm for each kind of
experiment; a new kind of training adds an arena here and a config kind, never a branch in the core.
"""

from __future__ import annotations

import importlib
from typing import Any

ARENAS = {
    "gym_off_policy": "agilerl_core.arenas.gym_off_policy:OffPolicyArena",
    "gym_on_policy": "agilerl_core.arenas.gym_on_policy:OnPolicyArena",
    "offline": "agilerl_core.arenas.offline:OfflineArena",
    "multi_agent_off_policy": "agilerl_core.arenas.multi_agent:MultiAgentOffPolicyArena",
    "multi_agent_on_policy": "agilerl_core.arenas.multi_agent:MultiAgentOnPolicyArena",
    "llm": "agilerl_core.arenas.llm:LLMArena",
    "language": "agilerl_core.arenas.language:LanguageArena",
    "bandit": "agilerl_core.arenas.bandit:BanditArena",
}


def arena_class(name: str) -> type:
    """The arena class registered as `name` (imports its module)."""
    module, _, cls = ARENAS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_arena(cfg: Any) -> Any:
    """The arena of `cfg`'s kind and algorithm (a validated config), built (and so checked) from it."""
    from agilerl_core.algorithms.registry import algorithm_info, get_algorithm

    return arena_class(algorithm_info(cfg.algorithm).arenas[cfg.kind])(cfg, get_algorithm(cfg.algorithm))

"""The Evolvable protocol: what the evolution needs of a population member, whatever it is (an RL agent, a
team of agents, a language model with adapters).

The evolution clones tournament winners, applies one mutation to each non-elite child, records the
hyperparameters and architecture of every member in the lineage, and persists members as tensors + JSON.
Which mutations a member supports is its own declaration: the evolution draws only among those, and the
member applies every kind but ``none`` and ``rl_hp`` itself (``rl_hp`` is generic over the declared
hyperparameter space and :meth:`Evolvable.set_hyperparameter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

# every mutation kind a member may support; a new kind is added here and applied by the members that declare
# it (adapter_rank: an LLM member's LoRA rank; adapter_crossover: a child of two parents' adapters)
MUTATION_KINDS = ("none", "architecture", "parameters", "activation", "rl_hp", "adapter_rank", "adapter_crossover")
# the kinds of an RL member (networks it owns); the adapter kinds are an LLM member's
RL_MUTATION_KINDS = frozenset({"none", "architecture", "parameters", "activation", "rl_hp"})


@dataclass(frozen=True)
class MutationSettings:
    """What a member's own mutations need: their strengths and the bounds of its architecture."""

    new_layer_share: float  # share of architecture mutations that add/remove layers (vs nodes/channels)
    parameter_strength: float  # parameter noise std relative to each tensor's std
    arch_bounds: Any  # the member's architecture bounds (networks.ArchBounds for RL agents)


@runtime_checkable
class Evolvable(Protocol):
    """A population member."""

    mutation_kinds: ClassVar[frozenset[str]]  # the subset of MUTATION_KINDS it supports ("none" always)
    hp: BaseModel  # its current hyperparameters

    def set_hyperparameter(self, name: str, value: Any) -> None:
        """Set one hyperparameter (validated), taking effect at once (e.g. an optimiser's learning rate)."""

    def mutate(self, kind: str, rng: np.random.Generator, settings: MutationSettings) -> str:
        """Apply one mutation of `kind` (one of its own kinds) in place, drawing from `rng`; return what was done.
        (A member supporting ``adapter_crossover`` also has ``crossover(other, rng) -> str``: it becomes a child
        of itself and `other`, a second parent.)"""

    def describe(self) -> str:
        """Its architecture in one line (the lineage's ``architecture`` column)."""

    def param_count(self) -> int:
        """Trainable parameters (the network size the tracker plots)."""

    def clone(self) -> Evolvable:
        """An independent copy: same weights, optimiser state, hyperparameters and RNG."""

    def reseed(self, seed: int) -> None:
        """Give it generators of its own drawn from `seed` (a new member after selection: never its parent's or
        a sibling's draws)."""

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, JSON-able metadata) that fully determine it; its arena rebuilds it from them."""

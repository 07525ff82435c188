"""The on-policy Gymnasium arena: every member learns from its own fresh rollouts only (PPO); nothing is
shared between members, so a generation commits no experience."""

from __future__ import annotations

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.arenas.base import GymArena
from agilerl_core.loops.on_policy import train_group_on_policy
from agilerl_core.results import TrainResult


class OnPolicyArena(GymArena):
    """Members act in their own envs (a group's stepped as one) and learn from their own rollouts."""

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        # one vector env per slot (host envs); the on-device backend builds a group's envs per phase
        self.envs = [] if self.recipe.backend == "torch" else [self.recipe.vector(cfg.num_envs)
                                                                for _ in range(cfg.population_size)]

    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        group = self.algo_cls.group(members)
        return train_group_on_policy(group, slots, self.group_env(slots, group.device), steps, seeds)

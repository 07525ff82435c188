"""IPPO teams learning as one population-batched group: each policy unit is stacked over the teams as a
:class:`~agilerl_core.algorithms.ppo.PPOGroup` (the unit's learners of every team: one forward to act,
one update per minibatch round), so K teams of U units cost U batched calls instead of K * U. Each team's
learners keep their own hyperparameters, generators and rollouts (a team's rows where an agent was out of
its episode are left out, as when it learns alone)."""

from __future__ import annotations

from collections.abc import Sequence

from agilerl_core.algorithms.ppo import PPOGroup


class IPPOGroup:
    def __init__(self, teams: Sequence) -> None:
        self.agents = list(teams)
        self.units = {u: PPOGroup([t.learners[u] for t in self.agents]) for u in self.agents[0].learners}

    def write_back(self) -> None:
        """Every unit's weights and optimiser state back into each team's learners (end of the phase)."""
        for unit in self.units.values():
            unit.write_back()

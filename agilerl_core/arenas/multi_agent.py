"""The multi-agent arenas: members are teams of agents acting in their own vectorised PettingZoo parallel
envs. Off-policy teams (MADDPG, MATD3) learn from one replay buffer the population shares; on-policy teams
(IPPO) from their own rollouts.

One budget unit is one parallel-env step of one sub-env (every agent acts once). A transition row holds
every agent's observation, action, reward, next observation, termination and whether it acted (an agent
dead for the rest of its episode did not). Fitness is the team's greedy return: each agent's mean
episode return over ``eval_episodes`` episodes, reduced by ``fitness`` (the sum by default, or the mean,
over all agents or the chosen agents and groups).

Population-major, as the Gymnasium arenas: the unit of work is a group of teams (a team alone is a group of
one). Its teams' vector envs step as one (:class:`~agilerl_core.envs.team_group.TeamGroupEnv`, member-major
rows) and evaluation runs every team's episodes as one vector; the training loops over such a group are in
:mod:`agilerl_core.loops.team_off_policy` and :mod:`agilerl_core.loops.team_on_policy`.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from agilerl_core.arenas.base import checked_space, keep_freed_memory, torch_device
from agilerl_core.arenas.experience import OwnExperience, SharedReplay
from agilerl_core.buffers.replay import ReplayBuffer, multi_agent_fields
from agilerl_core.envs.multi_agent import (
    ParallelVectorEnv,
    agent_group,
    make_parallel_env,
    make_parallel_vector_env,
    policy_units,
)
from agilerl_core.envs.spaces import MultiAgentSpec
from agilerl_core.envs.team_group import TeamGroupEnv
from agilerl_core.errors import ConfigError
from agilerl_core.loops.team_off_policy import train_team_group
from agilerl_core.loops.team_on_policy import train_team_group_on_policy
from agilerl_core.networks.evolvable import ArchBounds, ArchSpec
from agilerl_core.networks.mlp import MLPSpec
from agilerl_core.results import TrainResult


@dataclass(frozen=True)
class TeamFitness:
    """How per-agent mean returns become one fitness: `reduce` ("sum" or "mean") over `agents`."""

    reduce: str
    agents: tuple[str, ...]

    @classmethod
    def from_config(cls, fitness, agents: tuple[str, ...]) -> TeamFitness:
        if not fitness.agents:
            return cls(fitness.reduce, agents)
        groups = sorted({agent_group(a) for a in agents})
        chosen = []
        for name in fitness.agents:
            found = [a for a in agents if a == name or agent_group(a) == name]
            if not found:
                raise ConfigError(f"fitness.agents: {name!r} is neither an agent nor a group of this env; agents: "
                                  f"{', '.join(agents)}; groups: {', '.join(groups)}")
            chosen += [a for a in found if a not in chosen]
        return cls(fitness.reduce, tuple(chosen))

    def __call__(self, returns: dict[str, float]) -> float:
        values = [returns[a] for a in self.agents]
        return float(np.sum(values) if self.reduce == "sum" else np.mean(values))


@torch.no_grad()
def evaluate_teams(group: Any, envs: TeamGroupEnv, seed: int, fitness: TeamFitness, max_steps: int | None = None
                   ) -> list[tuple[float, dict[str, float]]]:
    """Every team's (fitness, per-agent mean return) from one greedy episode per sub-env of its envs, each
    team's reset with `seed`: the group's envs step as one and ``group.greedy`` chooses every team's actions
    (one forward per policy unit), so a team's fitness does not depend on its group."""
    k, n = envs.k, envs.n
    obs, masks, _ = envs.reset([seed] * k)
    totals = {a: np.zeros(k * n) for a in envs.spec.agents}
    active = np.ones(k * n, dtype=bool)
    steps = 0
    while active.any() and (max_steps is None or steps < max_steps):
        step = envs.step(group.greedy(obs, masks))
        for a, total in totals.items():
            total += step.reward[a] * active
        active &= ~step.env_done
        obs, masks = step.obs, step.mask
        steps += 1
    out = []
    for i in range(k):
        means = {a: float(total.reshape(k, n)[i].mean()) for a, total in totals.items()}
        out.append((fitness(means), means))
    return out


class MultiAgentArena(OwnExperience, ABC):
    """Teams of one multi-agent algorithm in a PettingZoo parallel env: spaces, fitness and evaluation.
    Subclasses say how teams train and what experience they share."""

    kind: ClassVar[str] = "multi_agent"
    evaluation_notes: ClassVar[tuple[str, ...]] = ("agent_returns",)  # per agent, beside the team's fitness

    def __init__(self, cfg, algo_cls) -> None:
        self.cfg = cfg
        self.algo_cls = algo_cls
        self.device = torch_device(cfg.device, cfg.tf32)
        torch.set_num_threads(cfg.torch_threads)
        if self.device == "cpu":
            keep_freed_memory()
        probe = make_parallel_env(cfg.env_id, cfg.env_kwargs)
        try:
            agents = list(probe.possible_agents)
            obs_spaces = {a: probe.observation_space(a) for a in agents}
            act_spaces = {a: probe.action_space(a) for a in agents}
        finally:
            probe.close()
        self.spec = MultiAgentSpec.from_spaces(agents, obs_spaces, act_spaces)
        self._check_actions()
        policy_units(self.spec, cfg.hyperparameters.share_policy)  # a group that cannot share fails here
        if cfg.hyperparameters.normalize_obs:
            raise ConfigError("hyperparameters.normalize_obs: not supported for multi-agent experiments yet; set "
                              "normalize_obs: false")
        self.fitness = TeamFitness.from_config(cfg.fitness, self.spec.agents)
        self.env_desc: dict[str, Any] = {"kind": "multi_agent", "env_id": cfg.env_id, "env_kwargs": cfg.env_kwargs}
        self.space = checked_space(cfg, algo_cls)
        self.arch_bounds = ArchBounds.from_config(cfg.network)
        net = cfg.network
        self.arch = ArchSpec(MLPSpec(0, 0, tuple(net.hidden_sizes), net.activation))  # sized per network
        self.obs_space = self.spec.joint.space
        self.act_space = act_spaces
        self.envs = [self._vector_env(cfg.num_envs) for _ in range(cfg.population_size)]
        self.eval_env = self._vector_env(cfg.eval_episodes)
        self._eval_envs: dict[int, ParallelVectorEnv] = {}
        self._lock = threading.Lock()

    def _vector_env(self, copies: int) -> ParallelVectorEnv:
        return make_parallel_vector_env(self.cfg.env_id, copies, self.cfg.env_kwargs, self.cfg.vector_workers)

    def _check_actions(self) -> None:
        for a, act in self.spec.actions.items():
            if act.kind not in self.algo_cls.action_kinds:
                kinds = " or ".join("Discrete" if k == "discrete" else "Box" for k in self.algo_cls.action_kinds)
                raise ConfigError(f"algorithm: {self.cfg.algorithm} needs {kinds} actions, but agent {a!r} of "
                                  f"{self.cfg.env_id} acts in a {act.kind} space")

    # ---- members ---------------------------------------------------------------------------------------
    def build_members(self, seeds: list[int]) -> list[Any]:
        return [self.algo_cls(self.spec, self.spec.actions, self.arch, self.cfg.hyperparameters, s, self.device)
                for s in seeds]

    def member_from_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Any:
        return self.algo_cls.from_state(self.spec, tensors, meta, self.device)

    # ---- a generation ----------------------------------------------------------------------------------
    @abstractmethod
    def train_group(self, members: list, slots: list[int], seeds: list[int], steps: int) -> list[TrainResult]:
        """Train teams `members` (in `slots`, one batch key) for `steps` env steps each, team i's envs reset with
        ``seeds[i]``; a team alone is a group of one."""

    def batch_key(self, member):
        return member.batch_key()

    def group_env(self, slots: list[int], device: torch.device | str, evaluation: bool = False) -> TeamGroupEnv:
        """The envs of the teams in `slots` as one group vector: the slots' own training envs, checked for
        non-finite values at every step, or (`evaluation`) each slot's evaluation env."""
        envs = [self.slot_eval_env(s) for s in slots] if evaluation else [self.envs[s] for s in slots]
        return TeamGroupEnv(envs, slots, self.spec, device, checked=not evaluation)

    def evaluate(self, member, seed: int, slot: int | None = None) -> float:
        env = self.eval_env if slot is None else self.slot_eval_env(slot)
        return self._evaluate([member], TeamGroupEnv([env], [-1 if slot is None else slot], self.spec, self.device,
                                                     checked=False), seed)[0]

    def evaluate_group(self, members: list, seed: int, slots: list[int]) -> list[float]:
        """Fitness of every team at once (teams of one batch key; others one by one): all teams' evaluation
        episodes as one [K, E] vector, greedy actions from one forward per policy unit, each team's envs reset
        with `seed` as :meth:`evaluate` does, so a team's fitness does not depend on its group."""
        keys = [m.batch_key() for m in members]
        if any(key != keys[0] for key in keys):
            return [self.evaluate(m, seed, s) for m, s in zip(members, slots, strict=True)]
        return self._evaluate(members, self.group_env(slots, self.device, evaluation=True), seed)

    def _evaluate(self, members: list, envs: TeamGroupEnv, seed: int) -> list[float]:
        results = evaluate_teams(self.algo_cls.group(members), envs, seed, self.fitness, self.cfg.eval_max_steps)
        for member, (_, per_agent) in zip(members, results, strict=True):
            member.agent_returns = per_agent  # logged beside the fitness
        return [fitness for fitness, _ in results]

    def slot_eval_env(self, slot: int) -> ParallelVectorEnv:
        """Slot `slot`'s own evaluation env (a keyed cache: built once per slot)."""
        with self._lock:
            if slot not in self._eval_envs:
                self._eval_envs[slot] = self._vector_env(self.cfg.eval_episodes)
            return self._eval_envs[slot]


class MultiAgentOffPolicyArena(SharedReplay, MultiAgentArena):
    """Off-policy teams (MADDPG, MATD3) sharing one replay buffer of every agent's transitions."""

    def __init__(self, cfg, algo_cls) -> None:
        super().__init__(cfg, algo_cls)
        self.buffer = ReplayBuffer(multi_agent_fields(self.spec), cfg.hyperparameters.buffer_size, self.device)
        self.slot_capacity = math.ceil(cfg.evo_steps / cfg.num_envs) * cfg.num_envs

    def train_group(self, members: list, slots: list[int], seeds: list[int], steps: int) -> list[TrainResult]:
        for s in slots:
            self.buffer.reset_slot(s)
        group = self.algo_cls.group(members)
        return train_team_group(group, slots, self.group_env(slots, group.device), self.buffer, steps, seeds,
                                self.fitness)


class MultiAgentOnPolicyArena(MultiAgentArena):
    """On-policy teams (IPPO, MAPPO): each learns from its own rollouts only."""

    def train_group(self, members: list, slots: list[int], seeds: list[int], steps: int) -> list[TrainResult]:
        group = self.algo_cls.group(members)
        return train_team_group_on_policy(group, slots, self.group_env(slots, group.device), steps, seeds,
                                          self.fitness)



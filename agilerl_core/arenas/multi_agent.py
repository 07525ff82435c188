"""The multi-agent arenas: members are teams of agents acting in their own vectorised PettingZoo parallel
envs. Off-policy teams (MADDPG, MATD3) learn from one replay buffer the population shares; on-policy teams
(IPPO) from their own rollouts.

One budget unit is one parallel-env step of one sub-env (every agent acts once). A transition row holds
every agent's observation, action, reward, next observation, termination and whether it acted (an agent
dead for the rest of its episode did not). Fitness is the team's greedy return: each agent's mean
episode return over ``eval_episodes`` episodes, reduced by ``fitness`` (the sum by default, or the mean,
over all agents or the chosen agents and groups).
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from agilerl_core.algorithms.group import ReplayGroup
from agilerl_core.arenas.base import EpisodeReturns, checked_space, torch_device
from agilerl_core.arenas.experience import OwnExperience, ReplayLearning, SharedReplay, replay_group_phase, rollout_lengths
from agilerl_core.buffers.replay import ReplayBuffer, multi_agent_fields
from agilerl_core.buffers.rollout import Rollout, compute_gae
from agilerl_core.envs.multi_agent import (
    ParallelVectorEnv,
    agent_group,
    make_parallel_env,
    make_parallel_vector_env,
    policy_units,
)
from agilerl_core.envs.spaces import MultiAgentSpec
from agilerl_core.errors import ConfigError
from agilerl_core.finite import check_host, check_loss
from agilerl_core.hpo.evolution import TrainResult
from agilerl_core.networks.evolvable import ArchBounds, ArchSpec
from agilerl_core.networks.mlp import MLPSpec


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


class TeamReturns:
    """Each agent's running returns per sub-env and those of its finished episodes."""

    def __init__(self, agents: tuple[str, ...], num_envs: int) -> None:
        self.per_agent = {a: EpisodeReturns(num_envs) for a in agents}

    def step(self, rewards: dict[str, np.ndarray], done: np.ndarray) -> None:
        for a, returns in self.per_agent.items():
            returns.step(rewards[a], done)

    @property
    def episodes(self) -> int:
        return len(next(iter(self.per_agent.values())).finished)

    def means(self) -> dict[str, float]:
        return {a: returns.mean() for a, returns in self.per_agent.items()}


def _mask_rows(mask: np.ndarray | None, n: int, dim: int) -> torch.Tensor:
    """An agent's masks of `n` env copies as stored (all allowed where the env gives none)."""
    return torch.ones((n, dim), dtype=torch.bool) if mask is None else torch.as_tensor(np.asarray(mask, dtype=bool))


class _TeamCollector:
    """One team's side of an off-policy training phase: its envs, staging slot, returns and the gradient steps
    its collection earns."""

    def __init__(self, agent, slot: int, env: ParallelVectorEnv, buffer: ReplayBuffer, seed: int) -> None:
        self.agent, self.slot, self.env, self.buffer = agent, slot, env, buffer
        self.spec: MultiAgentSpec = agent.ma
        self.num_envs = env.num_envs
        self.obs, info = env.reset(seed=seed)
        check_host(self.obs, "observation (after reset)", slot, 0)
        self.t = 0  # vector steps taken this phase
        self.mask = info["action_mask"]
        agent.begin_rollout(self.num_envs)
        self.returns = TeamReturns(self.spec.agents, self.num_envs)
        self.learning = ReplayLearning(agent, buffer, slot)
        self.obs_t = None

    def observation(self) -> dict[str, torch.Tensor]:
        self.obs_t = self.spec.to_tensors(self.obs, self.agent.device)
        return self.obs_t

    def step(self, actions: dict[str, np.ndarray]) -> None:
        """Step the envs with every agent's `actions` and stage the transitions."""
        agent, spec, n = self.agent, self.spec, self.num_envs
        next_obs, rewards, terminated, _, info = self.env.step(agent.env_actions(actions))
        self.t += 1
        check_host(rewards, "reward", self.slot, self.t)  # host arrays: no device wait
        check_host((next_obs, info["final_obs"]), "observation", self.slot, self.t)
        done = info["env_done"]
        final = spec.to_tensors(info["final_obs"], agent.device)
        data = {}
        for a in spec.agents:
            data[f"obs.{a}"] = self.obs_t[a]
            data[f"next_obs.{a}"] = final[a]
            data[f"action.{a}"] = torch.as_tensor(actions[a])
            data[f"reward.{a}"] = torch.as_tensor(rewards[a], dtype=torch.float32)
            data[f"terminated.{a}"] = torch.as_tensor(terminated[a], dtype=torch.float32)
            data[f"acted.{a}"] = torch.as_tensor(info["acted"][a], dtype=torch.float32)
            if spec.actions[a].discrete:  # what the actor (and, next, the target actor) could choose among
                data[f"mask.{a}"] = _mask_rows(self.mask.get(a), n, spec.actions[a].dim)
                data[f"next_mask.{a}"] = _mask_rows(info["final_action_mask"].get(a), n, spec.actions[a].dim)
        self.buffer.add(self.slot, data)
        agent.env_steps += n
        agent.episodes_done(done)
        self.returns.step(rewards, done)
        self.obs, self.mask = next_obs, info["action_mask"]

    def finish(self, vector_steps: int, fitness: TeamFitness, wall_s: float) -> TrainResult:
        team = fitness(self.returns.means()) if self.returns.episodes else float("nan")
        return TrainResult(self.slot, vector_steps * self.num_envs, self.learning.steps, self.returns.episodes, team,
                           self.learning.mean_loss, wall_s)


def train_team_group(group: ReplayGroup, slots: list[int], envs: list[ParallelVectorEnv], buffer: ReplayBuffer,
                     evo_steps: int, seeds: list[int], fitness: TeamFitness) -> list[TrainResult]:
    """Collect `evo_steps` env steps per team (whole vector steps) into its staging slot, learning every
    `learn_step` steps once `learning_delay` steps have passed (see
    :func:`agilerl_core.arenas.gym_off_policy.train_group`): one batched forward per agent acts in every
    team's envs, each round of gradient steps is one batched step. Each team's envs are reset with its seed
    first; a team alone is a group of one."""
    t0 = time.perf_counter()
    cs = [_TeamCollector(a, s, envs[s], buffer, seed) for a, s, seed in zip(group.agents, slots, seeds, strict=True)]
    vector_steps = replay_group_phase(group, cs, buffer, slots, evo_steps)
    wall = time.perf_counter() - t0
    return [c.finish(vector_steps, fitness, wall) for c in cs]


def evaluate_team(agent, env: ParallelVectorEnv, seed: int, fitness: TeamFitness,
                  max_steps: int | None = None) -> tuple[float, dict[str, float]]:
    """(fitness, per-agent mean return) of one greedy episode per sub-env of `env` after a reset with `seed`."""
    spec: MultiAgentSpec = agent.ma
    n = env.num_envs
    obs, info = env.reset(seed=seed)
    masks = info["action_mask"]
    totals = {a: np.zeros(n) for a in spec.agents}
    active = np.ones(n, dtype=bool)
    steps = 0
    while active.any() and (max_steps is None or steps < max_steps):
        actions = agent.env_action(spec.to_tensors(obs, agent.device), masks)
        obs, rewards, _, _, info = env.step(actions)
        for a in spec.agents:
            totals[a] += rewards[a] * active
        active &= ~info["env_done"]
        masks = info["action_mask"]
        steps += 1
    means = {a: float(v.mean()) for a, v in totals.items()}
    return fitness(means), means


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
    def train(self, member, slot: int, seed: int, steps: int) -> TrainResult:
        """Train team `member` (in slot `slot`) for `steps` env steps from envs reset with `seed`."""

    def evaluate(self, member, seed: int, slot: int | None = None) -> float:
        env = self.eval_env if slot is None else self.slot_eval_env(slot)
        fitness, per_agent = evaluate_team(member, env, seed, self.fitness, self.cfg.eval_max_steps)
        member.agent_returns = per_agent  # logged beside the fitness
        return fitness

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

    def train(self, member, slot: int, seed: int, steps: int) -> TrainResult:
        return self.train_group([member], [slot], [seed], steps)[0]  # learning is written for a population

    def batch_key(self, member):
        return member.batch_key()

    def train_group(self, members: list, slots: list[int], seeds: list[int], steps: int) -> list[TrainResult]:
        for s in slots:
            self.buffer.reset_slot(s)
        return train_team_group(self.algo_cls.group(members), slots, self.envs, self.buffer, steps, seeds,
                                self.fitness)


class MultiAgentOnPolicyArena(MultiAgentArena):
    """On-policy teams (IPPO, MAPPO): each learns from its own rollouts only."""

    def train(self, member, slot: int, seed: int, steps: int) -> TrainResult:
        if member.batch_key() is not None:  # a team alone is a group of one: the same draws as in any group
            return self.train_group([member], [slot], [seed], steps)[0]
        return train_team_on_policy(member, slot, self.envs[slot], steps, seed, self.fitness)

    def batch_key(self, member):
        return member.batch_key()

    def train_group(self, members: list, slots: list[int], seeds: list[int], steps: int) -> list[TrainResult]:
        return train_team_group_on_policy(self.algo_cls.group(members), slots, self.envs, steps, seeds, self.fitness)


class _TeamRollouts:
    """One IPPO team's side of an on-policy training phase: its envs, a rollout per policy unit (k agents of a
    unit over N envs are k * N columns, agent after agent), which rows are real, returns and losses. `value`
    gives V(s) of a unit (its learner's critic, or its row of a group's stacked one)."""

    def __init__(self, team, slot: int, env: ParallelVectorEnv, seed: int, value) -> None:
        self.team, self.slot, self.env, self.value = team, slot, env, value
        self.spec: MultiAgentSpec = team.ma
        self.hp = team.hp
        n = self.num_envs = env.num_envs
        obs, info = env.reset(seed=seed)
        check_host(obs, "observation (after reset)", slot, 0)
        self.t = 0  # vector steps taken this phase
        self.masks, self.alive = info["action_mask"], info["alive"]
        self.returns = TeamReturns(self.spec.agents, n)
        self.obs_t = self.spec.to_tensors(obs, team.device)
        self.rollouts: dict[str, Rollout] = {}
        self.valid: dict[str, torch.Tensor] = {}
        for u in team.learners:
            act = team.action_spec_of(u)
            first = team.units[u][0]
            cols = n * len(team.units[u])
            mask_dim = act.dim if act.discrete and self.masks[first] is not None else None
            self.rollouts[u] = Rollout.allocate(self.hp.rollout_steps, cols, {"obs": team.stack(u, self.obs_t)},
                                                () if act.discrete else (act.dim,),
                                                torch.int64 if act.discrete else torch.float32, mask_dim)
            central = team.critic_input(u, self.obs_t)
            if central is not None:  # MAPPO: the critic's joint input is kept beside each row
                self.rollouts[u].with_critic_obs(central)
            self.valid[u] = torch.zeros(self.hp.rollout_steps, cols)
        self.actions: dict[str, np.ndarray] = {}
        self.losses: list[float] = []
        self.learn0 = self.learn_steps()

    def learn_steps(self) -> int:
        return sum(learner.learn_steps for learner in self.team.learners.values())

    def unit_input(self, u: str) -> tuple[dict[str, torch.Tensor], np.ndarray | None, dict[str, torch.Tensor] | None]:
        """Unit `u`'s policy input now: its agents' observations and action masks, stacked, and a centralised
        critic's input (None: the critic reads the observations)."""
        m = None if self.rollouts[u].masks is None else self.team.stack(u, self.masks)
        return {"obs": self.team.stack(u, self.obs_t)}, m, self.team.critic_input(u, self.obs_t)

    def record(self, u: str, t: int, acts: np.ndarray, logp: torch.Tensor, value: torch.Tensor) -> None:
        """Unit `u`'s sampled actions (with their log-probs, in states valued `value`) into row t."""
        r, team, n = self.rollouts[u], self.team, self.num_envs
        x, m, central = self.unit_input(u)
        r.obs["obs"][t] = x["obs"]
        if central is not None:
            for key, v in central.items():
                r.critic_obs[key][t] = v
        r.actions[t] = torch.as_tensor(acts)
        r.logprobs[t], r.values[t] = logp.cpu(), value.cpu()
        if r.masks is not None:
            r.masks[t] = torch.as_tensor(m)
        self.valid[u][t] = torch.as_tensor(team.stack(u, self.alive), dtype=torch.float32)
        for i, a in enumerate(team.units[u]):
            self.actions[a] = acts[i * n:(i + 1) * n]

    def step(self, t: int) -> None:
        """Step the envs with every unit's recorded actions; rewards and dones into row t."""
        team, spec, hp, n = self.team, self.spec, self.hp, self.num_envs
        next_obs, rewards, terminated, truncated, info = self.env.step(team.env_actions(self.actions))
        self.t += 1
        check_host(rewards, "reward", self.slot, self.t)  # host arrays: no device wait
        check_host((next_obs, info["final_obs"]), "observation", self.slot, self.t)
        env_done = info["env_done"]
        final = spec.to_tensors(info["final_obs"], team.device)
        for u in team.learners:
            r = self.rollouts[u]
            rew = torch.as_tensor(team.stack(u, rewards), dtype=torch.float32)
            term = team.stack(u, terminated)
            cut = team.stack(u, truncated) & ~term
            if cut.any():  # a time limit is not the end of the world: credit the final state's value
                with torch.no_grad():
                    v_final = self.value(u, team.value_input(u, final)).cpu()
                rew = rew + hp.gamma * v_final * torch.as_tensor(cut, dtype=torch.float32)
            done = term | cut | np.tile(env_done, len(team.units[u])) | ~team.stack(u, info["acted"])
            r.rewards[t] = rew * self.valid[u][t]
            r.dones[t] = torch.as_tensor(done, dtype=torch.float32)
        team.env_steps += n
        self.returns.step(rewards, env_done)
        self.masks, self.alive = info["action_mask"], info["alive"]
        self.obs_t = spec.to_tensors(next_obs, team.device)

    def advantages(self, u: str, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Unit `u`'s GAE over the first `steps` rows (bootstrapped from V after them), and which rows are
        real (None: all)."""
        r = self.rollouts[u]
        with torch.no_grad():
            last_value = self.value(u, self.team.value_input(u, self.obs_t)).cpu()
        adv, ret = compute_gae(r.rewards[:steps], r.values[:steps], r.dones[:steps], last_value, self.hp.gamma,
                               self.hp.gae_lambda)
        return adv, ret, None if bool(self.valid[u][:steps].all()) else self.valid[u]

    def result(self, vector_steps: int, fitness: TeamFitness, wall_s: float) -> TrainResult:
        team = self.team
        team.learn_steps = self.learn_steps()
        team_return = fitness(self.returns.means()) if self.returns.episodes else float("nan")
        return TrainResult(self.slot, vector_steps * self.num_envs, team.learn_steps - self.learn0,
                           self.returns.episodes, team_return,
                           float(np.mean(self.losses)) if self.losses else float("nan"), wall_s)


def train_team_on_policy(team, slot: int, env: ParallelVectorEnv, evo_steps: int, seed: int,
                         fitness: TeamFitness) -> TrainResult:
    """Collect `evo_steps` env steps (whole vector steps) in rollouts of `rollout_steps`, every policy unit
    learning with PPO after each rollout from its agents' rows (see :class:`_TeamRollouts`). A time limit
    credits gamma * V(final observation); an agent out of its episode pads its column (done, not learned
    from) until the env resets."""
    t0 = time.perf_counter()
    c = _TeamRollouts(team, slot, env, seed, lambda u, obs: team.learners[u].value(obs))
    vector_steps = math.ceil(evo_steps / c.num_envs)
    for n_rollout, steps in enumerate(rollout_lengths(vector_steps, team.hp.rollout_steps), 1):
        for t in range(steps):
            for u, learner in team.learners.items():
                c.record(u, t, *learner.policy_step(*c.unit_input(u)))
            c.step(t)
        for u, learner in team.learners.items():
            adv, ret, valid = c.advantages(u, steps)
            c.losses.append(learner.learn_rollout(c.rollouts[u], steps, adv, ret, valid)["loss"])
            check_loss(c.losses[-1], slot, n_rollout, f"the loss of policy unit {u}", "update of rollout")
    return c.result(vector_steps, fitness, time.perf_counter() - t0)


def train_team_group_on_policy(group, slots: list[int], envs: list[ParallelVectorEnv], evo_steps: int,
                               seeds: list[int], fitness: TeamFitness) -> list[TrainResult]:
    """:func:`train_team_on_policy` for the teams of a stacked group at once: per policy unit, one batched
    forward samples every team's actions and one batched PPO update per minibatch round (see
    :class:`~agilerl_core.algorithms.ippo.IPPOGroup`)."""
    t0 = time.perf_counter()
    cs = [_TeamRollouts(team, s, envs[s], seed, lambda u, obs, i=i: group.units[u].value(i, obs))
          for i, (team, s, seed) in enumerate(zip(group.agents, slots, seeds, strict=True))]
    vector_steps = math.ceil(evo_steps / cs[0].num_envs)
    rollout_steps = group.agents[0].hp.rollout_steps  # structural: equal within a group
    for n_rollout, steps in enumerate(rollout_lengths(vector_steps, rollout_steps), 1):
        for t in range(steps):
            for u, unit in group.units.items():
                inputs = [c.unit_input(u) for c in cs]
                central = None if inputs[0][2] is None else [v for _, _, v in inputs]
                outs = unit.policy_step([x for x, _, _ in inputs], [m for _, m, _ in inputs], None, central)
                for c, out in zip(cs, outs, strict=True):
                    c.record(u, t, *out)
            for c in cs:
                c.step(t)
        for u, unit in group.units.items():
            rows = [c.team.learners[u].rollout_rows(c.rollouts[u], steps, *c.advantages(u, steps)) for c in cs]
            stats = unit.learn_rollouts([d for d, _, _ in rows], [a for _, a, _ in rows], [r for _, _, r in rows])
            for c, st in zip(cs, stats, strict=True):
                c.losses.append(st["loss"])
                check_loss(c.losses[-1], c.slot, n_rollout, f"the loss of policy unit {u}", "update of rollout")
    group.write_back()
    wall = time.perf_counter() - t0
    return [c.result(vector_steps, fitness, wall) for c in cs]

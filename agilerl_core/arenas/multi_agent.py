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

from agilerl_core.arenas.base import EpisodeReturns, checked_space, torch_device
from agilerl_core.arenas.experience import OwnExperience, ReplayLearning, SharedReplay
from agilerl_core.buffers.replay import ReplayBuffer, multi_agent_fields
from agilerl_core.buffers.rollout import Rollout, compute_gae
from agilerl_core.envs.multi_agent import ParallelVectorEnv, agent_group, make_parallel_env, make_parallel_vector_env
from agilerl_core.envs.spaces import MultiAgentSpec
from agilerl_core.errors import ConfigError
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


def train_team(agent, slot: int, env: ParallelVectorEnv, buffer: ReplayBuffer, evo_steps: int, seed: int,
               fitness: TeamFitness) -> TrainResult:
    """Collect `evo_steps` env steps (rounded up to whole vector steps) into `slot`'s staging area, learning
    every `learn_step` steps once `learning_delay` steps have passed. The envs are reset with `seed` first."""
    t0 = time.perf_counter()
    spec: MultiAgentSpec = agent.ma
    n = env.num_envs
    obs, info = env.reset(seed=seed)
    masks = info["action_mask"]
    agent.begin_rollout(n)
    returns = TeamReturns(spec.agents, n)
    learning = ReplayLearning(agent, buffer, slot)
    vector_steps = math.ceil(evo_steps / n)
    for _ in range(vector_steps):
        obs_t = spec.to_tensors(obs, agent.device)
        actions = agent.explore_action(obs_t, masks)
        next_obs, rewards, terminated, _, info = env.step(agent.env_actions(actions))
        done = info["env_done"]
        final = spec.to_tensors(info["final_obs"], agent.device)
        data = {}
        for a in spec.agents:
            data[f"obs.{a}"] = obs_t[a]
            data[f"next_obs.{a}"] = final[a]
            data[f"action.{a}"] = torch.as_tensor(actions[a])
            data[f"reward.{a}"] = torch.as_tensor(rewards[a], dtype=torch.float32)
            data[f"terminated.{a}"] = torch.as_tensor(terminated[a], dtype=torch.float32)
            data[f"acted.{a}"] = torch.as_tensor(info["acted"][a], dtype=torch.float32)
        buffer.add(slot, data)
        agent.env_steps += n
        agent.episodes_done(done)
        returns.step(rewards, done)
        obs, masks = next_obs, info["action_mask"]
        learning.collected(n)
    means = returns.means()
    team = fitness(means) if returns.episodes else float("nan")
    return TrainResult(slot, vector_steps * n, learning.steps, returns.episodes, team, learning.mean_loss,
                       time.perf_counter() - t0)


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
        self.buffer.reset_slot(slot)
        return train_team(member, slot, self.envs[slot], self.buffer, steps, seed, self.fitness)


class MultiAgentOnPolicyArena(MultiAgentArena):
    """On-policy teams (IPPO): each learns from its own rollouts only."""

    def __init__(self, cfg, algo_cls) -> None:
        super().__init__(cfg, algo_cls)
        from agilerl_core.algorithms.ippo import policy_units

        policy_units(self.spec, cfg.hyperparameters.share_policy)  # a group that cannot share fails here

    def train(self, member, slot: int, seed: int, steps: int) -> TrainResult:
        return train_team_on_policy(member, slot, self.envs[slot], steps, seed, self.fitness)


def train_team_on_policy(team, slot: int, env: ParallelVectorEnv, evo_steps: int, seed: int,
                         fitness: TeamFitness) -> TrainResult:
    """Collect `evo_steps` env steps (whole vector steps) in rollouts of `rollout_steps`, every policy unit
    learning with PPO after each rollout from its agents' rows (stacked agent after agent: k agents of a
    unit over N envs are k * N rollout columns). A time limit credits gamma * V(final observation); an agent
    out of its episode pads its column (done, not learned from) until the env resets."""
    t0 = time.perf_counter()
    spec: MultiAgentSpec = team.ma
    hp = team.hp
    n = env.num_envs
    obs, info = env.reset(seed=seed)
    masks, alive = info["action_mask"], info["alive"]
    returns = TeamReturns(spec.agents, n)
    vector_steps = math.ceil(evo_steps / n)
    obs_t = spec.to_tensors(obs, team.device)
    rollouts, valid = {}, {}
    for u in team.learners:
        act = team.action_spec_of(u)
        first = team.units[u][0]
        cols = n * len(team.units[u])
        mask_dim = act.dim if act.discrete and masks[first] is not None else None
        rollouts[u] = Rollout.allocate(hp.rollout_steps, cols, {"obs": team.stack(u, obs_t)},
                                       () if act.discrete else (act.dim,),
                                       torch.int64 if act.discrete else torch.float32, mask_dim)
        valid[u] = torch.zeros(hp.rollout_steps, cols)
    losses: list[float] = []
    done_steps = 0
    learn0 = sum(learner.learn_steps for learner in team.learners.values())
    while done_steps < vector_steps:
        steps = min(hp.rollout_steps, vector_steps - done_steps)
        for t in range(steps):
            actions = {}
            for u, learner in team.learners.items():
                r = rollouts[u]
                x = team.stack(u, obs_t)
                m = None if r.masks is None else team.stack(u, masks)
                acts, logp, value = learner.policy_step({"obs": x}, m)
                r.obs["obs"][t] = x
                r.actions[t] = torch.as_tensor(acts)
                r.logprobs[t], r.values[t] = logp.cpu(), value.cpu()
                if r.masks is not None:
                    r.masks[t] = torch.as_tensor(m)
                valid[u][t] = torch.as_tensor(team.stack(u, alive), dtype=torch.float32)
                for i, a in enumerate(team.units[u]):
                    actions[a] = acts[i * n:(i + 1) * n]
            next_obs, rewards, terminated, truncated, info = env.step(team.env_actions(actions))
            env_done = info["env_done"]
            final = spec.to_tensors(info["final_obs"], team.device)
            for u, learner in team.learners.items():
                r = rollouts[u]
                rew = torch.as_tensor(team.stack(u, rewards), dtype=torch.float32)
                term = team.stack(u, terminated)
                cut = team.stack(u, truncated) & ~term
                if cut.any():  # a time limit is not the end of the world: credit the final state's value
                    with torch.no_grad():
                        v_final = learner.value({"obs": team.stack(u, final)}).cpu()
                    rew = rew + hp.gamma * v_final * torch.as_tensor(cut, dtype=torch.float32)
                done = term | cut | np.tile(env_done, len(team.units[u])) | ~team.stack(u, info["acted"])
                r.rewards[t] = rew * valid[u][t]
                r.dones[t] = torch.as_tensor(done, dtype=torch.float32)
            team.env_steps += n
            returns.step(rewards, env_done)
            obs, masks, alive = next_obs, info["action_mask"], info["alive"]
            obs_t = spec.to_tensors(obs, team.device)
        for u, learner in team.learners.items():
            r = rollouts[u]
            with torch.no_grad():
                last_value = learner.value({"obs": team.stack(u, obs_t)}).cpu()
            adv, ret = compute_gae(r.rewards[:steps], r.values[:steps], r.dones[:steps], last_value, hp.gamma,
                                   hp.gae_lambda)
            every = bool(valid[u][:steps].all())
            losses.append(learner.learn_rollout(r, steps, adv, ret, None if every else valid[u])["loss"])
        done_steps += steps
    team.learn_steps = sum(learner.learn_steps for learner in team.learners.values())
    means = returns.means()
    team_return = fitness(means) if returns.episodes else float("nan")
    return TrainResult(slot, vector_steps * n, team.learn_steps - learn0, returns.episodes, team_return,
                       float(np.mean(losses)) if losses else float("nan"), time.perf_counter() - t0)

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
rows), one forward per policy unit chooses every team's actions, every random number comes from keyed streams
(a team draws the same alone or in any group), each step's transitions reach every team's staging slot (or
rollout rows [T, K, ...]) at once, and evaluation runs every team's episodes as one vector.
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

from agilerl_core import progress
from agilerl_core.algorithms.ippo import IPPOGroup
from agilerl_core.algorithms.maddpg import MADDPGGroup
from agilerl_core.algorithms.ppo.maths import explained_variance
from agilerl_core.arenas.base import checked_space, keep_freed_memory, torch_device
from agilerl_core.arenas.experience import OwnExperience, SharedReplay
from agilerl_core.buffers.replay import ReplayBuffer, multi_agent_fields
from agilerl_core.buffers.rollout import compute_gae, members_rows
from agilerl_core.envs.multi_agent import (
    ParallelVectorEnv,
    agent_group,
    make_parallel_env,
    make_parallel_vector_env,
    policy_units,
)
from agilerl_core.envs.spaces import MultiAgentSpec, Obs
from agilerl_core.envs.team_group import AgentMasks, TeamGroupEnv, TeamStep
from agilerl_core.errors import ConfigError
from agilerl_core.finite import FirstBad
from agilerl_core.loops.off_policy import LearnRounds, ReplayLearning
from agilerl_core.loops.on_policy import rollout_lengths
from agilerl_core.networks.evolvable import ArchBounds, ArchSpec
from agilerl_core.networks.mlp import MLPSpec
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import marks, per_unit, per_unit_points, phase_metrics


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
    """The returns of a group's teams, on the host: each agent's running return per sub-env and, per member, the
    summed returns of its finished episodes (rows member-major, as :class:`TeamStep` gives them)."""

    def __init__(self, agents: tuple[str, ...], k: int, n: int) -> None:
        self.k, self.n = k, n
        self.running = {a: np.zeros(k * n) for a in agents}
        self.finished = {a: np.zeros(k) for a in agents}
        self.count = np.zeros(k, dtype=np.int64)
        self.length, self.length_sum = np.zeros(k * n), np.zeros(k)  # episode lengths (env steps)

    def step(self, rewards: dict[str, np.ndarray], done: np.ndarray) -> None:
        ended = bool(done.any())
        for a, running in self.running.items():
            running += rewards[a]
            if ended:
                self.finished[a] += (running * done).reshape(self.k, self.n).sum(1)
                running[done] = 0.0
        self.length += 1.0
        if ended:
            self.count += done.reshape(self.k, self.n).sum(1)
            self.length_sum += (self.length * done).reshape(self.k, self.n).sum(1)
            self.length[done] = 0.0

    def mean_length(self, i: int) -> float:
        """Member i's mean episode length (nan if none finished)."""
        return float(self.length_sum[i] / self.count[i]) if self.count[i] else float("nan")

    def episodes(self, i: int) -> int:
        return int(self.count[i])

    def team(self, i: int, fitness: TeamFitness) -> float:
        """Member i's team return over its finished episodes (each agent's mean, reduced by `fitness`); nan if
        none finished."""
        if not self.count[i]:
            return float("nan")
        return fitness({a: float(total[i] / self.count[i]) for a, total in self.finished.items()})


def _transitions(spec: MultiAgentSpec, obs: Obs, masks: AgentMasks, actions: dict[str, torch.Tensor],
                 step: TeamStep, device: torch.device) -> dict[str, torch.Tensor]:
    """A group step's transition rows [K * N, ...] for the replay buffer: every agent's observation, action,
    reward, next observation, termination and whether it acted, and a Discrete agent's action masks on both
    observations (what the actor and, next, the target actor could choose among)."""
    data = {}
    for a in spec.agents:
        data[f"obs.{a}"], data[f"next_obs.{a}"], data[f"action.{a}"] = obs[a], step.final_obs[a], actions[a]
        data[f"reward.{a}"] = torch.as_tensor(step.reward[a], device=device)
        data[f"terminated.{a}"] = torch.as_tensor(step.terminated[a], device=device)
        data[f"acted.{a}"] = torch.as_tensor(step.acted[a], device=device)
        if spec.actions[a].discrete:
            data[f"mask.{a}"], data[f"next_mask.{a}"] = masks[a], step.final_mask[a]
    return data


def train_team_group(group: MADDPGGroup, slots: list[int], envs: TeamGroupEnv, buffer: ReplayBuffer,
                     evo_steps: int, seeds: list[int], fitness: TeamFitness) -> list[TrainResult]:
    """Collect `evo_steps` env steps per team (whole vector steps) into its staging slot, learning every
    `learn_step` steps once `learning_delay` steps have passed (see
    :func:`agilerl_core.loops.off_policy.train_group_off_policy`). The group's envs step as one (`envs`, K teams x N
    sub-envs), one forward per policy unit chooses every team's actions (exploration drawn from keyed streams,
    :meth:`~agilerl_core.algorithms.maddpg.MADDPGGroup.explore_group`), each step's transitions go to every
    team's staging slot in one indexed copy, and each round of gradient steps is one batched step. Each team's
    envs are reset with its seed first; a team alone is a group of one."""
    t0 = time.perf_counter()
    spec, k, n = group.ma, envs.k, envs.n
    obs, masks, _ = envs.reset(seeds)
    group.begin_acting(n)
    rounds = LearnRounds(group, [ReplayLearning(a, buffer, s) for a, s in zip(group.agents, slots, strict=True)],
                         buffer, slots)
    returns = TeamReturns(spec.agents, k, n)
    vector_steps = math.ceil(evo_steps / n)
    marked = marks(vector_steps, vector_steps * n)  # a long phase's points
    for t in range(vector_steps):
        actions = group.explore_group(obs, masks)
        step = envs.step(actions)
        buffer.add_group(slots, _transitions(spec, obs, masks, actions, step, group.device))
        for a in group.agents:
            a.env_steps += n
        progress.advance(k * n)
        if step.env_done.any():  # the noise processes of ended episodes start again
            group.episodes_done(torch.as_tensor(step.env_done, device=group.device))
        returns.step(step.reward, step.env_done)
        obs, masks = step.obs, step.mask
        rounds.after_step(n, t + 1)
        if t + 1 in marked:
            group.metrics.mark([a.env_steps for a in group.agents])
    rounds.finish()
    group.write_back()
    diagnostics, points = group.metrics.means(), group.metrics.points()
    wall = time.perf_counter() - t0
    return [TrainResult(s, vector_steps * n, lr.steps, returns.episodes(i), returns.team(i, fitness), lr.mean_loss,
                        wall, phase_metrics(diagnostics[i], vector_steps * n, wall, returns.mean_length(i),
                                            lr.mean_loss), points[i])
            for i, (s, lr) in enumerate(zip(slots, rounds.learnings, strict=True))]


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


class _UnitRollout:
    """One policy unit's rollout for every team of a group, [T, K, U * N] tensors on the group's device: a
    team's columns are the unit's U agents one after another over its N envs (as a team alone stacks them),
    and `valid` marks the rows where the agent was in its episode (the others pad: done, never learned from)."""

    def __init__(self, group: IPPOGroup, u: str, steps: int, obs: Obs) -> None:
        self.u, self.unit = u, group.units[u]
        dev, k = group.device, group.k
        act = group.agents[0].action_spec_of(u)
        x = group.rows(u, obs)
        rows = (steps, k, x.shape[1])
        self.obs = torch.zeros((*rows, *x.shape[2:]), dtype=x.dtype, device=dev)
        central = group.critic_input(u, obs)
        self.critic_obs = None if central is None else torch.zeros((*rows, central["obs"].shape[-1]), device=dev)
        self.actions = torch.zeros(rows if act.discrete else (*rows, act.dim),
                                   dtype=torch.int64 if act.discrete else torch.float32, device=dev)
        self.logprobs, self.values, self.rewards, self.dones, self.valid = (torch.zeros(rows, device=dev)
                                                                            for _ in range(5))
        self.masks = torch.ones((*rows, act.dim), dtype=torch.bool, device=dev) if act.discrete else None
        self.gamma, self.lam = self.unit.hp_tensor("gamma").view(k, 1), self.unit.hp_tensor("gae_lambda").view(k, 1)

    def value_input(self, group: IPPOGroup, obs: Obs) -> Obs:
        """What the unit's critics read of every team's observations [K * U * N, ...]."""
        central = group.critic_input(self.u, obs)
        return {"obs": group.rows(self.u, obs).flatten(0, 1)} if central is None else central

    @torch.no_grad()
    def act(self, group: IPPOGroup, t: int, obs: Obs, masks: AgentMasks, alive: dict[str, np.ndarray]
            ) -> torch.Tensor:
        """Every team's sampled actions [K, U * N(, dim)] (one forward of the unit's stacked actor and critic, one
        draw of its keyed stream), recorded in row t with their log-probs, values and inputs."""
        unit, k = self.unit, group.k
        x = group.rows(self.u, obs)
        out = unit.nets["actor"]({"obs": x.flatten(0, 1)})
        mask = None if self.masks is None else group.rows(self.u, masks)
        actions, logp = unit.sample(out, mask)
        central = group.critic_input(self.u, obs)
        self.obs[t], self.actions[t], self.logprobs[t] = x, actions, logp
        self.values[t] = unit.nets["critic"]({"obs": x.flatten(0, 1)} if central is None else central).squeeze(2)
        if central is not None:
            self.critic_obs[t] = central["obs"].view(k, x.shape[1], -1)
        if mask is not None:
            self.masks[t] = mask
        self.valid[t] = torch.as_tensor(group.rows(self.u, alive), device=group.device)
        return actions

    @torch.no_grad()
    def record(self, group: IPPOGroup, t: int, step: TeamStep) -> None:
        """Row t's rewards (a time limit credits gamma * V(final observation)) and dones (the agent's episode
        ended, or it did not act: a padded row)."""
        u, k, dev = self.u, group.k, group.device
        reward = torch.as_tensor(group.rows(u, step.reward), device=dev)
        term = group.rows(u, step.terminated)
        cut = group.rows(u, step.truncated) & ~term
        if cut.any():
            v_final = self.unit.nets["critic"](self.value_input(group, step.final_obs)).squeeze(2)
            reward = reward + self.gamma * v_final * torch.as_tensor(cut, device=dev)
        ended = np.broadcast_to(step.env_done.reshape(k, 1, -1), (k, len(group.unit_agents[u]), step.env_done.size // k))
        done = term | cut | ended.reshape(k, -1) | ~group.rows(u, step.acted)
        self.rewards[t] = reward * self.valid[t]
        self.dones[t] = torch.as_tensor(done, device=dev)

    @torch.no_grad()
    def advantages(self, group: IPPOGroup, steps: int, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the first `steps` rows of every team (one reverse scan), bootstrapped from V after them:
        (advantages, returns), [T, K, U * N] each."""
        last = self.unit.nets["critic"](self.value_input(group, obs)).squeeze(2)
        return compute_gae(self.rewards[:steps], self.values[:steps], self.dones[:steps], last, self.gamma,
                           self.lam)

    def stacked(self, steps: int, adv: torch.Tensor, ret: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor,
                                                                                  list[int]]:
        """What the unit's update learns from (:meth:`~agilerl_core.algorithms.ppo.PPOGroup.learn_stacked`): every
        team's rows [K, steps * U * N, ...] with the rows where its agent acted gathered to the front (in their
        order), its advantages and returns alike, and how many such rows each team has."""
        real = members_rows(self.valid, steps) > 0
        rows = real.sum(1).tolist()  # the plan's sizes: one read per update
        order = None if min(rows) == real.shape[1] else torch.argsort((~real).to(torch.int8), dim=1, stable=True)

        def member(x: torch.Tensor) -> torch.Tensor:
            m = members_rows(x, steps)
            return m if order is None else m.gather(1, order.view(*order.shape, *[1] * (m.dim() - 2)).expand_as(m))

        data = {"obs": {"obs": member(self.obs)}, "actions": member(self.actions), "logprobs": member(self.logprobs),
                "values": member(self.values)}
        if self.masks is not None:
            data["masks"] = member(self.masks)
        if self.critic_obs is not None:
            data["critic_obs"] = {"obs": member(self.critic_obs)}
        return data, member(adv), member(ret), rows


def train_team_group_on_policy(group: IPPOGroup, slots: list[int], envs: TeamGroupEnv, evo_steps: int,
                               seeds: list[int], fitness: TeamFitness) -> list[TrainResult]:
    """Collect `evo_steps` env steps per team (whole vector steps) in rollouts of `rollout_steps`, every policy
    unit learning with PPO after each rollout from its agents' rows. The whole loop carries the member axis:
    the group's envs step as one (`envs`, K teams x N sub-envs), one forward per policy unit samples every
    team's actions from its keyed stream, each unit's rollout lives in [T, K, U * N] tensors
    (:class:`_UnitRollout`), GAE is one reverse scan per unit, and each unit's update is one batched PPO update
    for all teams (:class:`~agilerl_core.algorithms.ippo.IPPOGroup`). A time limit credits gamma * V(final
    observation); an agent out of its episode pads its column (done, not learned from) until the env resets.
    Each team's envs are reset with its seed first; a team alone is a group of one."""
    t0 = time.perf_counter()
    teams, k, n = group.agents, envs.k, envs.n
    learned = [sum(learner.learn_steps for learner in team.learners.values()) for team in teams]
    obs, masks, alive = envs.reset(seeds)
    returns = TeamReturns(group.ma.agents, k, n)
    vector_steps = math.ceil(evo_steps / n)
    rollout_steps = teams[0].hp.rollout_steps  # structural: equal within a group
    losses: list[torch.Tensor] = []  # each update's mean loss per team [K], read once at the end
    bad_loss = {u: FirstBad(k, group.device) for u in group.units}
    updates = {u: torch.zeros(k, dtype=torch.long, device=group.device) for u in group.units}  # read at the end
    rollouts = rollout_lengths(vector_steps, rollout_steps)
    marked = marks(len(rollouts), vector_steps * n)  # a long phase's points: after some rollouts
    for n_rollout, steps in enumerate(rollouts, 1):
        units = [_UnitRollout(group, u, steps, obs) for u in group.units]
        for t in range(steps):
            actions = {}
            for r in units:
                actions.update(group.per_agent(r.u, r.act(group, t, obs, masks, alive)))
            step = envs.step(actions)
            for r in units:
                r.record(group, t, step)
            for team in teams:
                team.env_steps += n
            progress.advance(len(teams) * n)
            returns.step(step.reward, step.env_done)
            obs, masks, alive = step.obs, step.mask, step.alive
        for r in units:
            data, adv, ret, rows = r.stacked(steps, *r.advantages(group, steps, obs))
            real = torch.arange(adv.shape[1], device=adv.device) < torch.tensor(rows, device=adv.device).unsqueeze(1)
            r.unit.metrics.add(explained_variance=explained_variance(data["values"], ret, real))
            stats = r.unit.learn_stacked(data, adv, ret, rows)
            updates[r.u] += stats["updates"]
            mean = stats["loss_sum"] / stats["updates"].clamp(min=1)
            bad_loss[r.u].see(mean, n_rollout)
            losses.append(mean)
        if n_rollout in marked:
            for unit in group.units.values():
                unit.metrics.mark([team.env_steps for team in teams])
    group.write_back()
    for u, bad in bad_loss.items():
        bad.check(slots, f"the loss of policy unit {u}", "update of rollout")
        for team, taken in zip(teams, updates[u].tolist(), strict=True):
            team.learners[u].learn_steps += taken
    loss_means = torch.stack(losses).mean(0).tolist() if losses else [float("nan")] * k
    diagnostics = per_unit({u: unit.metrics.means() for u, unit in group.units.items()})
    points = per_unit_points({u: unit.metrics.points() for u, unit in group.units.items()})
    wall = time.perf_counter() - t0
    out = []
    for i, (team, slot) in enumerate(zip(teams, slots, strict=True)):
        team.learn_steps = sum(learner.learn_steps for learner in team.learners.values())
        out.append(TrainResult(slot, vector_steps * n, team.learn_steps - learned[i], returns.episodes(i),
                               returns.team(i, fitness), loss_means[i], wall,
                               phase_metrics(diagnostics[i], vector_steps * n, wall, returns.mean_length(i),
                                             loss_means[i]), points[i]))
    return out

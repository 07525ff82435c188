"""The off-policy loop of a group of teams (MADDPG, MATD3): the group's PettingZoo envs step as one, every
step's transitions go to each team's staging slot of the shared replay buffer, and each round of gradient steps
is one batched step (:class:`~agilerl_core.loops.off_policy.LearnRounds`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from agilerl_core import progress
from agilerl_core.algorithms.maddpg import MADDPGGroup
from agilerl_core.buffers.replay import ReplayBuffer
from agilerl_core.envs.spaces import MultiAgentSpec, Obs
from agilerl_core.envs.team_group import AgentMasks, TeamGroupEnv, TeamStep
from agilerl_core.loops.off_policy import LearnRounds, ReplayLearning
from agilerl_core.loops.teams import TeamReturns
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import marks, phase_metrics


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
                     evo_steps: int, seeds: list[int], fitness: Callable[[dict[str, float]], float]) -> list[TrainResult]:
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

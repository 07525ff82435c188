"""The on-policy loop of a group of teams (IPPO, MAPPO): rollouts per policy unit in [T, K, U * N] tensors, one
GAE scan and one batched PPO update per unit for all teams (:class:`~agilerl_core.algorithms.ippo.IPPOGroup`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from agilerl_core import progress
from agilerl_core.algorithms.ippo import IPPOGroup
from agilerl_core.algorithms.ppo.maths import explained_variance
from agilerl_core.buffers.rollout import compute_gae, members_rows
from agilerl_core.envs.spaces import Obs
from agilerl_core.envs.team_group import AgentMasks, TeamGroupEnv, TeamStep
from agilerl_core.finite import FirstBad
from agilerl_core.loops.on_policy import rollout_lengths
from agilerl_core.loops.teams import TeamReturns
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import marks, per_unit, per_unit_points, phase_metrics


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
                               seeds: list[int], fitness: Callable[[dict[str, float]], float]) -> list[TrainResult]:
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

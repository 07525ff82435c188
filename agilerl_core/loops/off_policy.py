"""The off-policy loop: a group's members collect experience in their own envs into their staging slots of one
shared replay buffer and learn from it as they earn steps (:func:`train_group_off_policy`, which the off-policy,
bandit and multi-agent arenas call); :class:`ReplayLearning` and :class:`LearnRounds` count and take the
earned steps."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from agilerl_core import progress
from agilerl_core.algorithms.group import ReplayGroup
from agilerl_core.buffers.nstep import NStepCollector
from agilerl_core.buffers.replay import ReplayBuffer
from agilerl_core.envs.group import GroupEnv
from agilerl_core.finite import FirstBad
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import EpisodeTally, marks, phase_metrics


class ReplayLearning:
    """The gradient steps a member's collection earns in an off-policy training phase: once it has taken
    `learning_delay` env steps and its view of the buffer holds a batch, one per `learn_step` env steps."""

    def __init__(self, agent: Any, buffer: ReplayBuffer, slot: int) -> None:
        self.agent, self.buffer, self.slot = agent, buffer, slot
        self.credit = 0
        self.steps = 0
        self.loss_sum = torch.zeros(())

    def earned(self, env_steps: int) -> int:
        """How many gradient steps `env_steps` more collected steps earn (the caller takes them)."""
        agent, hp = self.agent, self.agent.hp
        if agent.env_steps < hp.learning_delay or self.buffer.available(self.slot) < hp.batch_size:
            return 0
        self.credit += env_steps
        steps, self.credit = divmod(self.credit, hp.learn_step)
        return steps

    def record(self, loss_sum: torch.Tensor, steps: int) -> None:
        """`steps` more gradient steps taken, their losses summing to `loss_sum`."""
        self.loss_sum += loss_sum
        self.steps += steps

    @property
    def mean_loss(self) -> float:
        return float(self.loss_sum) / self.steps if self.steps else float("nan")


class LearnRounds:
    """The gradient steps a group's collection earns during an off-policy phase: after each vector step every
    member's :class:`ReplayLearning` says how many it earned; each round of them is one batched step (a member
    that earned fewer sits the extra rounds out). Losses stay on the device until :meth:`finish`."""

    def __init__(self, group: Any, learnings: list[ReplayLearning], buffer: ReplayBuffer, slots: list[int]) -> None:
        self.group, self.learnings, self.buffer, self.slots = group, learnings, buffer, slots
        self.loss_sums = torch.zeros(len(learnings), device=group.device)  # each member's (0 when it sat out)
        self.bad_loss = FirstBad(len(learnings), group.device)  # the env step whose learning first gave a non-finite loss
        self.steps = [0] * len(learnings)

    def after_step(self, env_steps: int, t: int) -> None:
        """Take the steps `env_steps` more collected steps per member earned (at vector step `t`, 1-based)."""
        earned = [lr.earned(env_steps) for lr in self.learnings]
        for r in range(max(earned, default=0)):
            loss = self.group.learn_step(self.buffer, self.slots, [e > r for e in earned])
            self.bad_loss.see(loss, t)
            self.loss_sums += loss
        self.steps = [s + e for s, e in zip(self.steps, earned, strict=True)]

    def finish(self) -> None:
        """Raise for a non-finite loss; record each member's losses and steps (one host read)."""
        self.bad_loss.check(self.slots, "the loss of the learn steps taken", "env step")
        for lr, loss, n in zip(self.learnings, self.loss_sums.cpu(), self.steps, strict=True):
            lr.record(loss, n)


def train_group_off_policy(group: ReplayGroup, slots: list[int], envs: GroupEnv, buffer: ReplayBuffer,
                           evo_steps: int, seeds: list[int]) -> list[TrainResult]:
    """Collect `evo_steps` env steps per member (rounded up to whole vector steps) into its staging slot,
    learning every `learn_step` steps once `learning_delay` steps have passed. The group's envs step as one
    (`envs`, K members x N sub-envs), one batched forward chooses every member's actions
    (:meth:`~agilerl_core.algorithms.group.ReplayGroup.explore_group`: the DQN family draws its exploration on
    the device from keyed streams), the step's transitions go to every member's staging slot in one indexed
    copy, and each round of gradient steps is one batched step (a member whose learn_step earns it fewer steps
    than another sits the extra ones out). Returns and losses stay on the device until the end. A member
    alone is a group of one.

    Each member's envs are reset with its seed first, so the result depends only on the members, the
    committed buffer and the seeds (episodes do not straddle generations). n-step windows are kept for the
    group's K x N sub-envs at once (on the host: which windows end depends on the episodes that ended), and
    each member's completed transitions go to its slot in the order its own collector would give them."""
    t0 = time.perf_counter()
    agents, k, n = group.agents, envs.k, envs.n
    dev = group.device
    obs, mask = envs.reset(seeds)  # the group's keyed stream starts at its first draw (algorithms that draw)
    for a in agents:
        a.begin_rollout(n)
    n_step = getattr(agents[0].hp, "n_step", 1)  # structural: equal within a group
    nstep = NStepCollector(k * n, n_step) if n_step > 1 else None  # the group's K x N sub-envs at once
    rounds = LearnRounds(group, [ReplayLearning(a, buffer, s) for a, s in zip(agents, slots, strict=True)],
                         buffer, slots)
    episodes = EpisodeTally(k, n, dev)
    vector_steps = math.ceil(evo_steps / n)
    marked = marks(vector_steps, vector_steps * n)  # a long phase's points
    for t in range(vector_steps):
        group.observe(obs)  # each member folds its own envs' observations into its statistics
        actions = group.explore_group(obs, mask)
        step = envs.step(actions)
        done = step.terminated | step.truncated
        data = {f"obs.{key}": v for key, v in obs.items()}
        data.update({f"next_obs.{key}": v for key, v in step.final_obs.items()})
        data["action"] = actions.reshape(k * n, *actions.shape[2:])
        data["reward"] = step.reward.to(torch.float32)
        data["terminated"] = step.terminated.to(torch.float32)
        if step.next_mask is not None:
            data["next_action_mask"] = step.next_mask
        if nstep is not None:  # host envs know which episodes ended already; on-device envs: one read
            host_done = step.host_done if step.host_done is not None else done.cpu().numpy()
            out = nstep.push(data, host_done)
            for s, rows in zip(slots, nstep.split(out, k), strict=True):
                if rows is not None:
                    buffer.add(s, rows)
        else:
            buffer.add_group(slots, data)
        for a in agents:
            a.env_steps += n
        progress.advance(k * n)
        group.episodes_done(done)
        episodes.step(step.reward, done)
        obs, mask = step.obs, step.mask
        rounds.after_step(n, t + 1)
        if t + 1 in marked:
            group.metrics.mark([a.env_steps for a in agents])
    rounds.finish()
    group.write_back()
    envs.check(slots)
    if nstep is not None:  # the unfinished tails bootstrap from the state they stop at
        tails = nstep.split(nstep.flush(), k)
        for s, tail in zip(slots, tails, strict=True):
            if tail is not None:
                buffer.add(s, tail)
    counts, returns, lengths = episodes.read()  # the phase's numbers, read once
    diagnostics, points = group.metrics.means(), group.metrics.points()
    wall = time.perf_counter() - t0
    return [TrainResult(s, vector_steps * n, lr.steps, c, ret, lr.mean_loss, wall,
                        phase_metrics(d, vector_steps * n, wall, length, lr.mean_loss), p)
            for s, lr, c, ret, length, d, p in zip(slots, rounds.learnings, counts, returns, lengths, diagnostics,
                                                    points, strict=True)]

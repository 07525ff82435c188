"""What an arena does with its members' experience between generations.

:class:`SharedReplay`: one replay buffer shared by the population (every off-policy arena, Gymnasium or
multi-agent). During generation g a member samples from the buffer as committed at the end of g-1 plus its
own staging slot; at the commit the slots' shards are appended in member order.
:class:`OwnExperience`: members learn only from what they collect themselves (on-policy arenas), so a
generation commits no experience."""

from __future__ import annotations

from typing import Any

import torch

from agilerl_core.buffers.replay import ReplayBuffer, Shard, shard_rows
from agilerl_core.finite import FirstBad


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


def rollout_lengths(vector_steps: int, rollout_steps: int) -> list[int]:
    """An on-policy phase's rollouts: `rollout_steps` vector steps each, the last one shorter if need be."""
    return [min(rollout_steps, vector_steps - done) for done in range(0, vector_steps, rollout_steps)]


class SharedReplay:
    """Mixin of an arena holding `buffer` (a ReplayBuffer) and `slot_capacity` (fresh transitions per slot
    per generation)."""

    shares_experience = True
    buffer: ReplayBuffer
    slot_capacity: int

    def begin_generation(self, slots: int) -> None:
        self.buffer.reserve_staging(slots, self.slot_capacity)

    def shard(self, slot: int) -> Shard:
        return self.buffer.shard(slot)

    def commit_experience(self, shards: list[Shard], members: list[Any]) -> None:
        first = self.buffer.pos
        self.buffer.commit(shards)
        count = sum(shard_rows(sh) for sh in shards)
        dead = self.buffer.dead_committed_rows()
        for m in members:  # e.g. prioritised replay: the new rows enter every member's priorities
            m.committed(first, count, dead)

    def experience_state(self) -> dict[str, int]:
        b = self.buffer
        return {"size": b.size, "pos": b.pos, "capacity": b.capacity}

    def restore_experience(self, store: Any, generation: int) -> None:
        store.rebuild_buffer(generation, self.buffer)

    def sync_experience(self, store: Any, synced: int, target: int) -> None:
        """A worker process's shared experience from the commit of generation `synced` to that of `target`."""
        if synced == target:
            return
        if synced == target - 1 and target >= 0:
            store.extend_buffer(target, self.buffer)
        elif target >= 0:
            store.rebuild_buffer(target, self.buffer)
        else:
            self.buffer.size, self.buffer.pos = 0, 0


class OwnExperience:
    """Mixin of an arena whose members share no experience: nothing to stage, commit or restore."""

    shares_experience = False
    buffer = None

    def begin_generation(self, slots: int) -> None:
        return None

    def shard(self, slot: int) -> None:
        return None

    def commit_experience(self, shards: list[Any], members: list[Any]) -> None:
        return None

    def experience_state(self) -> dict[str, int]:
        return {"size": 0, "pos": 0, "capacity": 0}

    def restore_experience(self, store: Any, generation: int) -> None:
        return None

    def sync_experience(self, store: Any, synced: int, target: int) -> None:
        return None

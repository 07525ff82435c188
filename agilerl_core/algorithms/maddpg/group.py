"""MADDPG and MATD3 learning, written once for a population of teams.

A team keeps its C x N critics (C per agent, N agents) stacked in one buffer; K teams' buffers stack once
more, so every critic of every member is one [K * C * N, out, in] block per layer: the target, the critic
regression and the actors' critic term are one batched pass each, differentiated by autograd. Each agent's
actor is stacked over the members. Box actions go through a tanh, Discrete ones through a straight-through
Gumbel-softmax sample whose noise each member draws from its own generator, as alone. Members keep their
own learning rates, gamma, tau, batch size, policy_freq, smoothing noise, Gumbel temperature and
exploration. A team alone is K = 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.group import (
    ReplayGroup,
    StackedRows,
    actor_turns,
    clipped_step,
    gradients,
    param_shapes,
    stacked_blocks,
)
from agilerl_core.algorithms.maddpg.maths import gumbel_noise, gumbel_softmax, masked_logits
from agilerl_core.buffers.replay import AgentTensors, MultiAgentBatch
from agilerl_core.networks.stacked import Layers, StackedNetwork, stacked_forward, trainable_blocks


def merged(layers: Layers) -> Layers:
    """[K, M, ...] blocks (K members' stacks of M networks each) as [K * M, ...] blocks: one network each."""
    return [(w.reshape(-1, *w.shape[2:]), b.reshape(-1, *b.shape[2:])) for w, b in layers]


class MADDPGGroup(ReplayGroup):
    """K MADDPG (MATD3) teams: stacked actors per agent, every critic of every team in one stack."""

    def __init__(self, agents: Sequence) -> None:
        first = agents[0]
        self.names = first.agents
        self.units, self.unit_of = first.units, first.unit_of  # actors are per policy unit
        self.c, self.n = len(first.critic_names), len(first.agents)
        super().__init__(agents)
        self.ma, self.specs = first.ma, first.action_specs
        self.gamma, self.tau = self.hp_tensor("gamma"), self.hp_tensor("tau")
        self.noise, self.noise_clip = self.hp_tensor("target_noise"), self.hp_tensor("target_noise_clip")
        self.temperature = self.hp_tensor("gumbel_temperature").view(-1, 1, 1)
        self.policy_freq = [a.hp.policy_freq for a in self.agents]
        self.max_grad_norm = first.hp.max_grad_norm
        self.critics = self.adams["critics"]
        self.critic_leaves = trainable_blocks(self.critics.flat, self.k, self.critics.padded)
        self.critic_target_layers = merged(stacked_blocks(self.targets["critics.target"], self.k, self.critics.padded))
        self.actors: dict[str, StackedNetwork] = {}
        self.actor_targets: dict[str, StackedNetwork] = {}
        for u in self.units:
            adam = self.adams[f"actor.{u}"]
            self.actors[u] = StackedNetwork([a.networks[f"actor.{u}"] for a in self.agents], adam.flat, adam.padded,
                                            trainable=True)
            self.actor_targets[u] = StackedNetwork([a.networks[f"actor.{u}.target"] for a in self.agents],
                                                   self.targets[f"actor.{u}.target"], adam.padded)
        self.columns: dict[str, slice] = {}  # each agent's action columns in the critics' input
        start = self.ma.joint.vector_dim
        for x in self.names:
            self.columns[x] = slice(start, start + self.specs[x].dim)
            start += self.specs[x].dim

    def critic_layers(self) -> Layers:
        """Every critic of every member as one network each, (weight, bias) per layer [K * C * N, ...]: views
        of the leaves made for each pass (a view kept across optimiser steps would lose its way to them)."""
        return merged(list(zip(self.critic_leaves[0::2], self.critic_leaves[1::2], strict=True)))

    # ---- what stacks --------------------------------------------------------------------------------------
    def stacked_optimizers(self) -> dict[str, tuple]:
        out = {f"actor.{u}": ([a.optimizers[f"actor.{u}"] for a in self.agents],
                              [param_shapes(a.networks[f"actor.{u}"]) for a in self.agents]) for u in self.units}
        m = self.c * self.n  # a member's critics live as [C * N, *shape] blocks (critic-major, then agent)
        out["critics"] = ([a.critic_adam for a in self.agents],
                          [[(m, *s) for s in param_shapes(a.networks[f"critic_1.{self.names[0]}"])]
                           for a in self.agents], m)
        return out

    def stacked_targets(self) -> dict[str, tuple[str, list[torch.Tensor]]]:
        out = {f"actor.{u}.target": (f"actor.{u}", [a.target_flat[f"actor.{u}.target"] for a in self.agents])
               for u in self.units}
        out["critics.target"] = ("critics", [a.critic_target_flat for a in self.agents])
        return out

    # ---- acting -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def explore(self, obs: Sequence, masks: Sequence) -> list[dict[str, np.ndarray]]:
        out = {}
        for u, agents in self.units.items():  # a unit's agents through its one actor, member-major then agent
            y = self.actors[u]({"obs": torch.cat([o[x] for o in obs for x in agents])})
            for j, x in enumerate(y.view(self.k, len(agents), -1, y.shape[-1]).unbind(1)):
                out[agents[j]] = x
        return [a.actions_from({x: out[x][i] for x in self.names}, True, masks[i]) for i, a in enumerate(self.agents)]

    # ---- targets ------------------------------------------------------------------------------------------
    def batch(self, buffer, index: torch.Tensor) -> MultiAgentBatch:
        return MultiAgentBatch.from_fields(buffer.gather(index), self.names)

    def rows_in(self, batch: MultiAgentBatch) -> int:
        return next(iter(batch.reward.values())).shape[0]

    def joint(self, obs, actions: AgentTensors, k: int) -> torch.Tensor:
        """The critics' input [K, B, D]: the joint observation and every agent's action (Discrete one-hot)."""
        vec, _ = self.ma.joint.preprocess(obs)
        return torch.cat([vec, self.agents[0].joint_action(actions)], dim=1).view(k, -1, vec.shape[1] + sum(
            s.dim for s in self.specs.values()))

    @staticmethod
    def _mask(batch: MultiAgentBatch, agent: str, k: int, following: bool = False) -> torch.Tensor | None:
        """Agent `agent`'s action masks [K, B, A] (on next_obs when `following`), None when it has none."""
        m = batch.agent_mask(agent, following)
        return None if m is None else m.view(k, -1, m.shape[-1])

    def _per_agent(self, field: AgentTensors, k: int) -> torch.Tensor:
        return torch.stack([field[x].view(k, -1) for x in self.names], dim=1)  # [K, N, B]

    @torch.no_grad()
    def next_actions(self, batch: MultiAgentBatch, rows: StackedRows, smoothing: AgentTensors | None = None
                     ) -> AgentTensors:
        """Every agent's target-actor action on the next observations ([K * B, dim]): Box ones with MATD3's
        clipped smoothing noise (standard normal [K, B, dim] per agent, drawn from each member's generator
        unless given), Discrete ones one-hot greedy among the actions their next mask allows."""
        k = rows.k
        who = [on and a.hp.target_noise > 0 for a, on in zip(self.agents, rows.active.tolist(), strict=True)]
        out = {}
        for x in self.names:
            y = self.actor_targets[self.unit_of[x]]({"obs": batch.next_obs[x]})
            if self.specs[x].discrete:
                y = masked_logits(y, self._mask(batch, x, k, following=True))
                out[x] = F.one_hot(y.argmax(-1), y.shape[-1]).to(torch.float32).view(-1, y.shape[-1])
                continue
            t = torch.tanh(y)
            if any(who):
                eps = self.member_noise(rows, who, self.specs[x].dim) if smoothing is None else smoothing[x]
                clip = self.noise_clip.view(k, 1, 1)
                smoothed = (t + (eps * self.noise.view(k, 1, 1)).clamp(-clip, clip)).clamp(-1.0, 1.0)
                t = torch.where(torch.tensor(who, device=self.device).view(k, 1, 1), smoothed, t)
            out[x] = t.reshape(-1, t.shape[-1])
        return out

    @torch.no_grad()
    def target_values(self, batch: MultiAgentBatch, rows: StackedRows, smoothing: AgentTensors | None = None) -> torch.Tensor:
        """y [K, N, B]: r_i + gamma (1 - terminated_i) min_c Q'_c,i(x', mu'_1(o'_1), .., mu'_N(o'_N)) for every
        member and agent i, every target critic in one batched pass."""
        k, m = rows.k, self.c * self.n
        xn = self.joint(batch.next_obs, self.next_actions(batch, rows, smoothing), k)
        b = xn.shape[1]
        q = stacked_forward(self.critic_target_layers, xn.unsqueeze(1).expand(k, m, b, -1).reshape(k * m, b, -1),
                            self.activation).view(k, self.c, self.n, b).min(1).values
        reward, terminated = self._per_agent(batch.reward, k), self._per_agent(batch.terminated, k)
        return reward + self.gamma.view(k, 1, 1) * (1.0 - terminated) * q

    # ---- learning -----------------------------------------------------------------------------------------
    def learn(self, batch: MultiAgentBatch, rows: StackedRows) -> torch.Tensor:
        """One step of every critic of every active member (each regressed on the rows where its agent acted);
        every `policy_freq`-th step of a member also its actors and targets. Returns each member's summed
        critic loss [K]."""
        k, m = rows.k, self.c * self.n
        y = self.target_values(batch, rows)
        acted = self._per_agent(batch.acted, k) * (rows.weight > 0).unsqueeze(1)  # padding never acted
        weight = acted / acted.sum(2, keepdim=True).clamp_min(1.0)  # [K, N, B]: each agent's mean over its rows
        xa = self.joint(batch.obs, batch.action, k)
        b = xa.shape[1]
        q = stacked_forward(self.critic_layers(), xa.unsqueeze(1).expand(k, m, b, -1).reshape(k * m, b, -1),
                            self.activation).view(k, self.c, self.n, b)
        losses = (weight.unsqueeze(1) * (q - y.unsqueeze(1)).square()).sum((1, 2, 3))
        (self.critics.grad,) = gradients(losses.sum(), self.critic_leaves)
        clipped_step(self.critics, self.max_grad_norm, None if rows.all_active else rows.active)
        turns = actor_turns(self.agents, rows.who, self.policy_freq)
        if any(turns):
            turn = torch.tensor(turns, device=self.device)
            self.actor_step(batch, xa, rows, weight * turn.view(k, 1, 1), turns)
            self.update_targets([tau * t for tau, t in zip(self.hp_list("tau"), turns, strict=True)])
        return losses.detach()

    def actor_step(self, batch: MultiAgentBatch, xa: torch.Tensor, rows: StackedRows, weight: torch.Tensor,
                   turns: list[bool]) -> None:
        """Every actor i of the members whose turn it is descends -Q_1,i(x, a_1, .., mu_i(o_i), .., a_N) over
        the rows where agent i acted, the other agents' actions from the batch."""
        k = rows.k
        inputs = []
        for x in self.names:
            pre = self.actors[self.unit_of[x]]({"obs": batch.obs[x]})  # a shared actor sums its agents' terms
            if self.specs[x].discrete:  # masked actions get no probability, so no gradient either
                noise = self._gumbel(rows, turns, pre.shape[-1])
                mine = gumbel_softmax(masked_logits(pre, self._mask(batch, x, k)), self.temperature, noise=noise)
            else:
                mine = torch.tanh(pre)
            cols = self.columns[x]
            inputs.append(torch.cat([xa[..., : cols.start], mine, xa[..., cols.stop:]], dim=2))
        xs = torch.stack(inputs, dim=1)  # [K, N, B, D]: row i holds agent i's own action
        m = self.c * self.n  # critic_1 of every agent: the first N of each member's C * N critics
        critic_1 = [(w.view(k, m, *w.shape[1:])[:, : self.n].reshape(-1, *w.shape[1:]),
                     b.view(k, m, -1)[:, : self.n].reshape(-1, b.shape[1])) for w, b in self.critic_layers()]
        q = stacked_forward(critic_1, xs.view(k * self.n, xs.shape[2], -1), self.activation)
        loss = -(weight * q.view(weight.shape)).sum()
        adams = [self.adams[f"actor.{u}"] for u in self.units]
        grads = gradients(loss, *(self.actors[u].leaves for u in self.units))
        active = None if all(turns) else torch.tensor(turns, device=self.device)
        for adam, grad in zip(adams, grads, strict=True):
            adam.grad = grad
            clipped_step(adam, self.max_grad_norm, active)

    def _gumbel(self, rows: StackedRows, who: Sequence[bool], dim: int) -> torch.Tensor:
        """Gumbel noise [K, B, dim]: each member in `who` draws its own rows' worth from its generator."""
        g = torch.zeros(rows.k, rows.b, dim, device=self.device)
        for i, (a, on) in enumerate(zip(self.agents, who, strict=True)):
            if on:
                g[i, : rows.counts[i]] = gumbel_noise((rows.counts[i], dim), a.torch_gen).to(self.device)
        return g

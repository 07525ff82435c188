"""MADDPG and MATD3 teams learning as one population-batched group (:mod:`agilerl_core.algorithms.group`).

A team already keeps its C x N critics (C per agent, N agents) stacked in one buffer; K teams' buffers stack
once more, so every critic of every member is one [K * C * N, out, in] block per layer: the target, the
critic regression and the actors' critic gradient are one batched pass each, with a hand-written backward.
Each agent's actor is stacked over the members ([K, out, in]) and stepped by hand too: Box actions through
the tanh, Discrete ones through the straight-through Gumbel-softmax (its noise drawn from each member's own
generator, as when the member learns alone). Members keep their own learning rates, gamma, tau, batch size,
policy_freq, smoothing noise, Gumbel temperature and exploration.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.fused_mlp import stacked_backward, stacked_forward_cached
from agilerl_core.algorithms.group import ReplayGroup, StackedRows, actor_turns, clipped_step, param_shapes
from agilerl_core.buffers.replay import MultiAgentBatch
from agilerl_core.networks.stacked import Layers, stacked_forward


def masked_logits(logits: torch.Tensor, mask: np.ndarray | torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return logits
    m = torch.as_tensor(np.asarray(mask), dtype=torch.bool, device=logits.device)
    return logits.masked_fill(~m, torch.finfo(logits.dtype).min)



def merged(layers: Layers) -> Layers:
    """[K, M, ...] blocks (K members' stacks of M networks each) as [K * M, ...] blocks: one network each."""
    return [(w.reshape(-1, *w.shape[2:]), b.reshape(-1, *b.shape[2:])) for w, b in layers]


class MADDPGGroup(ReplayGroup):
    def __init__(self, agents: Sequence) -> None:
        first = agents[0]
        self.names = first.agents
        self.c, self.n = len(first.critic_names), len(first.agents)
        super().__init__(agents)
        self.ma = first.ma
        self.specs = first.action_specs
        self.gamma, self.tau = self.hp_tensor("gamma"), self.hp_tensor("tau")
        self.noise, self.noise_clip = self.hp_tensor("target_noise"), self.hp_tensor("target_noise_clip")
        self.temperature = self.hp_tensor("gumbel_temperature").view(-1, 1, 1)
        self.policy_freq = [a.hp.policy_freq for a in self.agents]
        self.max_grad_norm = first.hp.max_grad_norm
        self.critics = self.adams["critics"]
        self.critic_layers = merged(self.critics.layers)
        self.critic_grads = merged(self.critics.grad_layers)
        self.critic_target_layers = merged(self.target_layers["critics.target"])
        self.obs_nets = {x: first.networks[f"actor.{x}"] for x in self.names}
        self.columns: dict[str, slice] = {}  # each agent's action columns in the critics' input
        start = self.ma.joint.vector_dim
        for x in self.names:
            self.columns[x] = slice(start, start + self.specs[x].dim)
            start += self.specs[x].dim

    # ---- what stacks --------------------------------------------------------------------------------------
    def stacked_optimizers(self) -> dict[str, tuple]:
        out = {f"actor.{x}": ([a.optimizers[f"actor.{x}"] for a in self.agents],
                              [param_shapes(a.networks[f"actor.{x}"]) for a in self.agents]) for x in self.names}
        m = self.c * self.n  # a member's critics live as [C * N, *shape] blocks (critic-major, then agent)
        out["critics"] = ([a.critic_adam for a in self.agents],
                          [[(m, *s) for s in param_shapes(a.networks[f"critic_1.{self.names[0]}"])]
                           for a in self.agents], m)
        return out

    def stacked_targets(self) -> dict[str, tuple[str, list[torch.Tensor]]]:
        out = {f"actor.{x}.target": (f"actor.{x}", [a.target_flat[f"actor.{x}.target"] for a in self.agents])
               for x in self.names}
        out["critics.target"] = ("critics", [a.critic_target_flat for a in self.agents])
        return out

    # ---- acting -------------------------------------------------------------------------------------------
    def _actor_input(self, x: str, obs: torch.Tensor) -> torch.Tensor:
        return self.obs_nets[x].features({"obs": obs})

    @torch.no_grad()
    def explore(self, obs: Sequence, masks: Sequence) -> list[dict[str, np.ndarray]]:
        out = {x: stacked_forward(self.adams[f"actor.{x}"].layers,
                                  torch.stack([self._actor_input(x, o[x]) for o in obs]), self.activation)
               for x in self.names}
        return [a.actions_from({x: out[x][i] for x in self.names}, True, masks[i]) for i, a in enumerate(self.agents)]

    # ---- learning -----------------------------------------------------------------------------------------
    def batch(self, buffer, index: torch.Tensor) -> MultiAgentBatch:
        return MultiAgentBatch.from_fields(buffer.gather(index), self.names)

    def _joint(self, obs, actions, k: int, b: int) -> torch.Tensor:
        """The critics' input [K, B, D]: the joint observation and every agent's action (Discrete one-hot)."""
        vec, _ = self.ma.joint.preprocess(obs)
        return torch.cat([vec, self.agents[0].joint_action(actions)], dim=1).view(k, b, -1)

    @staticmethod
    def _mask(batch: MultiAgentBatch, agent: str, k: int, b: int, following: bool = False) -> torch.Tensor | None:
        """Agent `agent`'s action masks [K, B, A] (on next_obs when `following`), None when it has none."""
        m = batch.agent_mask(agent, following)
        return None if m is None else m.view(k, b, -1)

    def _per_agent(self, batch_field, k: int, b: int) -> torch.Tensor:
        return torch.stack([batch_field[x].view(k, b) for x in self.names], dim=1)  # [K, N, B]

    @torch.no_grad()
    def _targets(self, batch: MultiAgentBatch, rows: StackedRows) -> torch.Tensor:
        """y [K, N, B] (see :meth:`MADDPG.target_values`), each member's smoothing noise its own."""
        k, b = rows.k, rows.b
        active = rows.active.tolist()
        nxt = {}
        for x in self.names:
            y = stacked_forward(self.target_layers[f"actor.{x}.target"],
                                self._actor_input(x, batch.next_obs[x]).view(k, b, -1), self.activation)
            if self.specs[x].discrete:
                y = masked_logits(y, self._mask(batch, x, k, b, following=True))
                nxt[x] = F.one_hot(y.argmax(-1), y.shape[-1]).to(torch.float32).view(k * b, -1)
                continue
            t = torch.tanh(y)
            who = [on and a.hp.target_noise > 0 for a, on in zip(self.agents, active, strict=True)]
            if any(who):
                eps = self.member_noise(rows, who, self.specs[x].dim)
                clip = self.noise_clip.view(k, 1, 1)
                smoothed = (t + (eps * self.noise.view(k, 1, 1)).clamp(-clip, clip)).clamp(-1.0, 1.0)
                t = torch.where(torch.tensor(who, device=self.device).view(k, 1, 1), smoothed, t)
            nxt[x] = t.reshape(k * b, -1)
        xn = self._joint(batch.next_obs, nxt, k, b)
        m = self.c * self.n
        q = stacked_forward(self.critic_target_layers, xn.unsqueeze(1).expand(k, m, b, -1).reshape(k * m, b, -1),
                            self.activation).view(k, self.c, self.n, b).min(1).values
        reward, terminated = self._per_agent(batch.reward, k, b), self._per_agent(batch.terminated, k, b)
        return reward + self.gamma.view(k, 1, 1) * (1.0 - terminated) * q

    @torch.no_grad()
    def learn(self, batch: MultiAgentBatch, rows: StackedRows) -> torch.Tensor:
        k, b, m = rows.k, rows.b, self.c * self.n
        y = self._targets(batch, rows)
        acted = self._per_agent(batch.acted, k, b) * (rows.weight > 0).unsqueeze(1)  # padding never acted
        weight = acted / acted.sum(2, keepdim=True).clamp_min(1.0)  # [K, N, B]: each agent's mean over its rows
        xa = self._joint(batch.obs, batch.action, k, b)
        q, inputs = stacked_forward_cached(self.critic_layers, xa.unsqueeze(1).expand(k, m, b, -1).reshape(k * m, b, -1),
                                           self.activation)
        err = q.view(k, self.c, self.n, b) - y.unsqueeze(1)
        w = weight.unsqueeze(1)
        losses = (w * err.square()).sum((1, 2, 3))
        self.critics.zero_grad()
        stacked_backward(self.critic_layers, inputs, (2.0 * w * err).view(k * m, b, 1), self.activation,
                         grads=self.critic_grads)
        clipped_step(self.critics, self.max_grad_norm, None if rows.all_active else rows.active)
        turns = actor_turns(self.agents, rows.active, self.policy_freq)
        turn = torch.tensor(turns, device=self.device)
        if turn.any():
            self._actor_step(batch, xa, rows, weight * turn.view(k, 1, 1), turns)
            self.update_targets(self.tau * turn.to(self.tau.dtype))
        return losses

    def _actor_step(self, batch: MultiAgentBatch, xa: torch.Tensor, rows: StackedRows, weight: torch.Tensor,
                    turns: list[bool]) -> None:
        """Every actor i descends -Q_1,i(x, a_1, .., mu_i(o_i), .., a_N) (see :meth:`MADDPG.actor_step`), by
        hand: critic_1's input gradient at agent i's action columns, through the tanh or the Gumbel-softmax,
        back through the stacked actor."""
        k, b, n = rows.k, rows.b, self.n
        own: dict[str, tuple] = {}
        xs = xa.unsqueeze(1).repeat(1, n, 1, 1)  # [K, N, B, D]: row i gets agent i's own action
        for j, x in enumerate(self.names):
            pre, inputs = stacked_forward_cached(self.adams[f"actor.{x}"].layers,
                                                 self._actor_input(x, batch.obs[x]).view(k, b, -1), self.activation)
            if self.specs[x].discrete:  # masked actions get no probability, so no gradient either
                pre = masked_logits(pre, self._mask(batch, x, k, b))
                soft = F.softmax((pre + self._gumbel(rows, turns, pre.shape[-1])) / self.temperature, dim=-1)
                mine = F.one_hot(soft.argmax(-1), pre.shape[-1]).to(soft.dtype) + soft - soft
            else:
                soft = mine = torch.tanh(pre)
            xs[:, j, :, self.columns[x]] = mine
            own[x] = (inputs, soft)
        critic_1 = [(cw[:, :n].reshape(k * n, *cw.shape[2:]), cb[:, :n].reshape(k * n, -1))
                    for cw, cb in self.critics.layers]
        _, c_inputs = stacked_forward_cached(critic_1, xs.view(k * n, b, -1), self.activation)
        g_in = stacked_backward(critic_1, c_inputs, -weight.reshape(k * n, b, 1), self.activation,
                                input_grad=True).view(k, n, b, -1)
        active = None if all(turns) else torch.tensor(turns, device=self.device)
        for j, x in enumerate(self.names):
            inputs, soft = own[x]
            g = g_in[:, j, :, self.columns[x]]
            if self.specs[x].discrete:  # straight through the one-hot, then the softmax of (logits + noise) / T
                g_pre = soft * (g - (g * soft).sum(-1, keepdim=True)) / self.temperature
            else:
                g_pre = g * (1.0 - soft * soft)
            adam = self.adams[f"actor.{x}"]
            adam.zero_grad()
            stacked_backward(adam.layers, inputs, g_pre, self.activation, grads=adam.grad_layers)
            clipped_step(adam, self.max_grad_norm, active)

    def _gumbel(self, rows: StackedRows, who: Sequence[bool], dim: int) -> torch.Tensor:
        """Gumbel noise [K, B, dim] for the straight-through samples: each member in `who` draws its own
        rows' worth from its generator (as :func:`~agilerl_core.algorithms.maddpg.gumbel_softmax` would)."""
        g = torch.zeros(rows.k, rows.b, dim, device=self.device)
        for i, (a, on) in enumerate(zip(self.agents, who, strict=True)):
            if on:
                cnt = int((rows.weight[i] > 0).sum())
                u = torch.rand((cnt, dim), generator=a.torch_gen).to(self.device).clamp_(1e-10, 1.0 - 1e-10)
                g[i, :cnt] = -torch.log(-torch.log(u))
        return g

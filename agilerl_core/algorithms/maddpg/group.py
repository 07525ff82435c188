"""MADDPG and MATD3 learning, written once for a population of teams.

A team keeps its C x N critics (C per agent, N agents) stacked in one buffer; K teams' buffers stack once
more, so every critic of every member is one [K * C * N, out, in] block per layer: the target, the critic
regression and the actors' critic term are one batched pass each. Each policy unit's actor is stacked over
the members. Gradients are written by hand for ReLU and tanh networks (the critics' regression, the actors'
term through critic_1; :meth:`StackedNetwork.backward` for the weights) and taken by autograd otherwise. Box
actions go through a tanh, Discrete ones through a straight-through Gumbel-softmax sample. Members keep their
own learning rates, gamma, tau, batch size, policy_freq, smoothing noise, Gumbel temperature and
exploration. A team alone is K = 1.

Acting is written for the group too: one forward per policy unit chooses every member's actions in all its
envs. Every random number (exploration noise and samples, minibatches, target smoothing, Gumbel noise) comes
from keyed streams (:mod:`agilerl_core.rng`): drawn for the whole group in one op, each member's from its own
key, so a member draws the same values alone or in any group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from agilerl_core.algorithms.group import (
    ReplayGroup,
    StackedRows,
    actor_turns,
    clipped_step,
    gradients,
)
from agilerl_core.algorithms.group_state import stacked_blocks
from agilerl_core.algorithms.maddpg.maths import gumbel_of, gumbel_softmax, masked_logits
from agilerl_core.buffers.replay import AgentTensors, MultiAgentBatch
from agilerl_core.envs.spaces import Obs
from agilerl_core.networks.stacked import _DERIVATIVES, Layers, StackedNetwork, stacked_forward, trainable_blocks
from agilerl_core.rng import SALT_NOISE, normal, uniform

SALT_GUMBEL = 0x5A3C_0103  # the keyed draws of the actors' Gumbel noise (beside rng.SALT_SAMPLE, SALT_NOISE)
DRAW_BLOCK = 32  # exploration steps whose random numbers one keyed draw takes at once


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
        self.box = tuple(x for x in self.names if not self.specs[x].discrete)
        self.discrete = tuple(x for x in self.names if self.specs[x].discrete)
        ou = [a.hp.noise_type == "ou" for a in self.agents]  # exploration: Gaussian or Ornstein-Uhlenbeck noise
        self.any_ou, self.all_ou = any(ou), all(ou)
        self.ou = torch.tensor(ou, device=self.device).view(-1, 1, 1)
        self.expl_noise, theta, dt = (self.hp_tensor(name).view(-1, 1, 1) for name in ("expl_noise", "ou_theta", "ou_dt"))
        self.ou_keep, self.ou_scale = 1.0 - theta * dt, self.expl_noise * dt.sqrt()
        self.ou_state = torch.zeros(0)  # every env's process, [K, N, every Box agent's dims] (begin_acting)
        self._explore_block: list | None = None  # the exploration draws of the block of steps under way, and the step
        self.policy_freq = [a.hp.policy_freq for a in self.agents]
        self.max_grad_norm = first.hp.max_grad_norm
        self.critics = self.adams["critics"]
        # every critic of every member as a stack of K * C * N networks: a member's state row holds its C * N
        # critics one after another, so the [K, P] state viewed [K * C * N, P / (C * N)] is one row per critic
        km, padded = self.k * self.c * self.n, self.critics.padded
        self.critic_leaves = trainable_blocks(self.critics.flat.view(km, -1), km, padded)
        # its layers as plain views (what the target and the actors' critic term read) and its hand-written backward
        self.critic_net = self.stacked([a.layouts[f"{c}.{x}"] for a in self.agents for c in first.critic_names
                                          for x in self.names], self.critics.flat.view(km, -1), padded)
        self.critic_plain = stacked_blocks(self.critics.flat.view(km, -1), km, padded)
        self.critic_target_layers = stacked_blocks(self.targets["critics.target"].view(km, -1), km, padded)
        self.actors: dict[str, StackedNetwork] = {}
        self.actor_targets: dict[str, StackedNetwork] = {}
        for u in self.units:
            adam = self.adams[f"actor.{u}"]
            self.actors[u] = self.stacked([a.layouts[f"actor.{u}"] for a in self.agents], adam.flat, adam.padded,
                                            trainable=True)
            self.actor_targets[u] = self.stacked([a.layouts[f"actor.{u}.target"] for a in self.agents],
                                                   self.targets[f"actor.{u}.target"], adam.padded)
        self.columns: dict[str, slice] = {}  # each agent's action columns in the critics' input
        start = self.ma.joint.vector_dim
        for x in self.names:
            self.columns[x] = slice(start, start + self.specs[x].dim)
            start += self.specs[x].dim

    def critic_layers(self) -> Layers:
        """Every critic of every member as one network each, (weight, bias) per layer [K * C * N, ...]: views
        of the leaves made for each pass (a view kept across optimiser steps would lose its way to them), for
        autograd (activations without a hand-written derivative)."""
        return list(zip(self.critic_leaves[0::2], self.critic_leaves[1::2], strict=True))

    # ---- what stacks --------------------------------------------------------------------------------------
    def stacked_optimizers(self) -> dict[str, tuple]:
        out = {f"actor.{u}": ([a.optimizers[f"actor.{u}"] for a in self.agents],
                              [a.param_shapes(f"actor.{u}") for a in self.agents]) for u in self.units}
        # a member's C * N critics one after another in its buffer (critic-major, then agent)
        out["critics"] = ([a.critic_adam for a in self.agents],
                          [a.param_shapes(f"critic_1.{self.names[0]}") for a in self.agents], self.c * self.n)
        return out

    def stacked_targets(self) -> dict[str, tuple[str, list[torch.Tensor]]]:
        out = {f"actor.{u}.target": (f"actor.{u}", [a.target_flat[f"actor.{u}.target"] for a in self.agents])
               for u in self.units}
        out["critics.target"] = ("critics", [a.critic_target_flat for a in self.agents])
        return out

    # ---- acting -------------------------------------------------------------------------------------------
    def policies(self, obs: Obs) -> dict[str, torch.Tensor]:
        """Every agent's actor outputs [K, N, out] for member-major observations (every agent's [K * N, ...]):
        one forward per policy unit, a shared unit's agents side by side in its rows."""
        k, out = self.k, {}
        for u, agents in self.units.items():
            if len(agents) == 1:
                out[agents[0]] = self.actors[u]({"obs": obs[agents[0]]})
                continue
            x = torch.stack([obs[a].view(k, -1, *obs[a].shape[1:]) for a in agents], 1)  # [K, U, N, ...]
            y = self.actors[u]({"obs": x.reshape(-1, *x.shape[3:])})
            for a, part in zip(agents, y.view(k, len(agents), -1, y.shape[-1]).unbind(1), strict=True):
                out[a] = part
        return out

    @staticmethod
    def _logits(y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Actor outputs [K, N, A] with the actions `mask` ([K * N, A], None: all allowed) forbids masked out."""
        return masked_logits(y, None if mask is None else mask.view(y.shape))

    @torch.no_grad()
    def greedy(self, obs: Obs, masks: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """Every agent's greedy actions [K * N(, dim)] (agent scale) for member-major observations: tanh of the
        actor (Box), the best allowed action (Discrete; `masks`: [K * N, A] per agent, or None)."""
        out = {}
        for x, y in self.policies(obs).items():
            out[x] = self._logits(y, masks.get(x)).argmax(-1).reshape(-1) if self.specs[x].discrete else \
                torch.tanh(y).reshape(-1, y.shape[-1])
        return out

    def begin_acting(self, num_envs: int) -> None:
        """Fresh envs: the Ornstein-Uhlenbeck process of every env starts at 0 ([K, N, every Box agent's dims])."""
        self.ou_state = torch.zeros(self.k, num_envs, sum(self.specs[x].dim for x in self.box), device=self.device)
        self._explore_block = None

    def _exploration_draws(self, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This step's standard normals [K, N, every Box agent's dims] and uniforms [K, N, one per Discrete
        agent; None where the team has no such agent), from blocks of DRAW_BLOCK steps drawn at once from the
        group's keyed stream: step t of a block reads counter base + 1 + t (its uniforms base + 1 + DRAW_BLOCK +
        t), as DRAW_BLOCK draws one by one would, in one op."""
        if self._explore_block is None or self._explore_block[2] == DRAW_BLOCK:
            stream, k = self.stream, self.k
            steps = torch.arange(stream.counter + 1, stream.counter + 1 + DRAW_BLOCK, device=self.device)
            stream.counter += 2 * DRAW_BLOCK
            keys, box, discrete = stream.keys.unsqueeze(1), sum(self.specs[x].dim for x in self.box), len(self.discrete)
            self._explore_block = [normal(keys, steps, n * box).view(k, DRAW_BLOCK, n, box) if box else None,
                           uniform(keys, steps + DRAW_BLOCK, n * discrete).view(k, DRAW_BLOCK, n, discrete)
                           if discrete else None, 0]
        z, u, t = self._explore_block
        self._explore_block[2] = t + 1
        return None if z is None else z[:, t], None if u is None else u[:, t]

    def episodes_done(self, done: torch.Tensor) -> None:
        self.ou_state.masked_fill_(done.view(self.k, -1, 1), 0.0)  # an ended episode's process starts again

    @torch.no_grad()
    def explore_group(self, obs: Obs, masks: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """Every agent's exploration actions [K * N(, dim)] (agent scale) for member-major observations, one
        forward per policy unit: a Box agent adds its member's Gaussian or Ornstein-Uhlenbeck noise to tanh of
        the actor (clipped to [-1, 1]); a Discrete one samples its actor's softmax among the allowed actions.
        The random numbers come from the group's keyed stream (:meth:`_exploration_draws`): a member draws the
        same alone or in any group. Call :meth:`begin_acting` first."""
        ys = self.policies(obs)
        k, n = self.k, ys[self.names[0]].shape[1]
        z, u = self._exploration_draws(n)
        out = {}
        if self.box:
            dims = [self.specs[x].dim for x in self.box]
            mean = torch.tanh(torch.cat([ys[x] for x in self.box], dim=2) if len(dims) > 1 else ys[self.box[0]])
            noise = self.expl_noise * z
            if self.any_ou:  # x <- x - theta x dt + scale sqrt(dt) z
                stepped = self.ou_state * self.ou_keep + self.ou_scale * z
                self.ou_state = stepped if self.all_ou else torch.where(self.ou, stepped, 0.0)
                noise = stepped if self.all_ou else torch.where(self.ou, stepped, noise)
            for x, act in zip(self.box, (mean + noise).clamp(-1.0, 1.0).split(dims, dim=2), strict=True):
                out[x] = act.reshape(k * n, -1)
        if self.discrete:
            for j, x in enumerate(self.discrete):
                cdf = F.softmax(self._logits(ys[x], masks.get(x)), dim=-1).cumsum(-1)
                # u scaled by the summed probability (rounding may leave it below 1): never past the last allowed
                below = cdf < u[..., j: j + 1] * cdf[..., -1:]
                out[x] = below.sum(-1).clamp(max=cdf.shape[-1] - 1).reshape(-1)
        return out

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
        clipped smoothing noise (standard normal [K, B, dim] per agent, :meth:`smoothing_noise`, unless given),
        Discrete ones one-hot greedy among the actions their next mask allows."""
        k = rows.k
        who = [on and a.hp.target_noise > 0 for a, on in zip(self.agents, rows.who, strict=True)]
        smooth = any(who) and bool(self.box)
        if smooth and smoothing is None:
            smoothing = self.smoothing_noise(rows, who)
        on = None if all(who) else torch.tensor(who, device=self.device).view(k, 1, 1)
        scale, clip = self.noise.view(k, 1, 1), self.noise_clip.view(k, 1, 1)
        out = {}
        for x in self.names:
            y = self.actor_targets[self.unit_of[x]]({"obs": batch.next_obs[x]})
            if self.specs[x].discrete:
                y = masked_logits(y, self._mask(batch, x, k, following=True))
                out[x] = F.one_hot(y.argmax(-1), y.shape[-1]).to(torch.float32).view(-1, y.shape[-1])
                continue
            t = torch.tanh(y)
            if smooth:
                smoothed = (t + (smoothing[x] * scale).clamp(-clip, clip)).clamp(-1.0, 1.0)
                t = smoothed if on is None else torch.where(on, smoothed, t)
            out[x] = t.reshape(-1, t.shape[-1])
        return out

    def smoothing_noise(self, rows: StackedRows, who: Sequence[bool]) -> AgentTensors:
        """Standard normal smoothing noise [K, B, dim] for every Box agent: what one
        :meth:`~agilerl_core.algorithms.group.ReplayGroup.member_noise` per agent, in agent order, draws (each
        member in `who` its own rows' worth from its keyed draws, at one counter per agent; zeros elsewhere), in
        one op for all agents."""
        draws = self.member_draws(SALT_NOISE)
        take = torch.tensor(list(who), device=self.device)
        dims = [self.specs[x].dim for x in self.box]
        counter = draws.count.unsqueeze(1) + torch.arange(len(dims), device=self.device) * take.unsqueeze(1)
        eps = normal(draws.keys.unsqueeze(1), counter, rows.b * max(dims))  # [K, agents, B * widest]
        draws.count = draws.count + len(dims) * take
        keep = (rows.valid & take.unsqueeze(1)).unsqueeze(2)
        return {x: eps[:, j, : rows.b * d].view(rows.k, rows.b, d) * keep
                for j, (x, d) in enumerate(zip(self.box, dims, strict=True))}

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
        acted = self._per_agent(batch.acted, k)
        if not (rows.all_active and min(rows.counts) == rows.b):  # padding never acted
            acted = acted * rows.valid.unsqueeze(1)
        weight = acted / acted.sum(2, keepdim=True).clamp_min(1.0)  # [K, N, B]: each agent's mean over its rows
        xa = self.joint(batch.obs, batch.action, k)
        b = xa.shape[1]
        x = xa.unsqueeze(1).expand(k, m, b, -1).reshape(k * m, b, -1)
        w = weight.unsqueeze(1)
        if self.critic_net.hand_backward:  # plain TD regression: the gradient by hand
            saved: list[torch.Tensor] = []
            with torch.no_grad():
                diff = stacked_forward(self.critic_plain, x, self.activation, saved).view(k, self.c, self.n, b) - \
                    y.unsqueeze(1)
                losses = (w * diff.square()).sum((1, 2, 3))
                self.critic_net.backward(saved, (2.0 * w * diff).view(k * m, b, 1), out=self.critics.grad)
        else:
            q = stacked_forward(self.critic_layers(), x, self.activation).view(k, self.c, self.n, b)
            losses = (w * (q - y.unsqueeze(1)).square()).sum((1, 2, 3))
            (grad,) = gradients(losses.sum(), self.critic_leaves)
            self.critics.grad = grad.view(self.k, -1)
            diff = None  # made only on a measured step
        due = self.metrics.due()
        norm = clipped_step(self.critics, self.max_grad_norm, None if rows.all_active else rows.active, due)
        if due:
            self._record_critics(rows, (q.detach() - y.unsqueeze(1)) if diff is None else diff, y, w, weight, norm)
        turns = actor_turns(self.agents, rows.who, self.policy_freq)
        if any(turns):  # the actors' rows weigh as their agent's critic rows, for the members whose turn it is
            on = weight if all(turns) else weight * torch.tensor(turns, device=self.device).view(k, 1, 1)
            self.actor_step(batch, xa, rows, on, turns, self.metrics.due("actor"))
            self.update_targets([tau * t for tau, t in zip(self.hp_list("tau"), turns, strict=True)])
        return losses.detach()

    @torch.no_grad()
    def _record_critics(self, rows: StackedRows, diff: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                        weight: torch.Tensor, norm: torch.Tensor) -> None:
        """A step's critic diagnostics into :attr:`metrics`, per agent: its critics' summed loss and critic 1's
        mean Q over the rows where it acted (`diff` [K, C, N, B]: Q - y), and the critics' gradient norm."""
        per_agent = (w * diff.square()).sum((1, 3))  # [K, N]
        q = ((diff[:, 0] + y) * weight).sum(2)  # [K, N]
        values = {f"critic_loss.{x}": per_agent[:, i] for i, x in enumerate(self.names)}
        values.update({f"q.{x}": q[:, i] for i, x in enumerate(self.names)})
        self.metrics.add(None if rows.all_active else rows.active, critic_grad_norm=norm, **values)

    def actor_step(self, batch: MultiAgentBatch, xa: torch.Tensor, rows: StackedRows, weight: torch.Tensor,
                   turns: list[bool], measure: bool = False) -> None:
        """Every actor i of the members whose turn it is descends -Q_1,i(x, a_1, .., mu_i(o_i), .., a_N) over
        the rows where agent i acted (`weight` [K, N, B]), the other agents' actions from the batch; a shared
        actor sums its agents' terms. `measure`: each unit's gradient norm into :attr:`metrics`."""
        hand = self.critic_net.hand_backward and all(net.hand_backward for net in self.actors.values())
        grads = (self._actor_gradients_by_hand if hand else self._actor_gradients)(batch, xa, rows, weight, turns)
        active = None if all(turns) else torch.tensor(turns, device=self.device)
        norms = {}
        for u, grad in zip(self.units, grads, strict=True):
            adam = self.adams[f"actor.{u}"]
            adam.grad = grad
            norms[f"actor_grad_norm.{u}"] = clipped_step(adam, self.max_grad_norm, active, measure)
        if measure:
            self.metrics.add(active, **norms)

    def _critic_1(self, k: int) -> Layers:
        """critic_1 of every agent of every member (the first N of each member's C * N critics), [K * N, ...]."""
        m = self.c * self.n
        return [(w.view(k, m, *w.shape[1:])[:, : self.n].reshape(-1, *w.shape[1:]),
                 b.view(k, m, -1)[:, : self.n].reshape(-1, b.shape[1])) for w, b in self.critic_plain]

    def _own_actions(self, xa: torch.Tensor, mine: AgentTensors) -> torch.Tensor:
        """The critics' inputs [K * N, B, D] of the actor terms: row i holds agent i's own action `mine[i]`,
        the other agents' from the batch (`xa` [K, B, D])."""
        cols = self.columns
        xs = torch.stack([torch.cat([xa[..., : cols[x].start], mine[x], xa[..., cols[x].stop:]], dim=2)
                          for x in self.names], dim=1)
        return xs.view(-1, xa.shape[1], xa.shape[2])

    def _actor_gradients(self, batch: MultiAgentBatch, xa: torch.Tensor, rows: StackedRows, weight: torch.Tensor,
                         turns: list[bool]) -> list[torch.Tensor]:
        """Each unit's actor gradient [its stacked buffer] by autograd (any activation)."""
        k, mine = rows.k, {}
        for x in self.names:
            pre = self.actors[self.unit_of[x]]({"obs": batch.obs[x]})
            if self.specs[x].discrete:  # masked actions get no probability, so no gradient either
                noise = self._gumbel(rows, turns, pre.shape[-1])
                mine[x] = gumbel_softmax(masked_logits(pre, self._mask(batch, x, k)), self.temperature, noise=noise)
            else:
                mine[x] = torch.tanh(pre)
        q = stacked_forward(self._critic_1(k), self._own_actions(xa, mine), self.activation)
        loss = -(weight * q.view(weight.shape)).sum()
        return gradients(loss, *(self.actors[u].leaves for u in self.units))

    @torch.no_grad()
    def _actor_gradients_by_hand(self, batch: MultiAgentBatch, xa: torch.Tensor, rows: StackedRows,
                                 weight: torch.Tensor, turns: list[bool]) -> list[torch.Tensor]:
        """:meth:`_actor_gradients` without autograd (ReLU or tanh networks): one forward of each unit's actor
        over all its agents' rows, critic_1's gradient for its own action columns by hand, then back through
        tanh (Box) or the straight-through Gumbel-softmax (Discrete: the softmax's gradient) and the actor
        (:meth:`StackedNetwork.backward`)."""
        k, b = rows.k, xa.shape[1]
        runs, mine, through = {}, {}, {}  # per unit its actor's (outputs, saved); per agent its action, and
        for u, agents in self.units.items():  # what its action's gradient goes through
            obs = [batch.obs[x].view(k, b, *batch.obs[x].shape[1:]) for x in agents]
            x_u = obs[0] if len(obs) == 1 else torch.cat(obs, dim=1)
            out, saved = self.actors[u].forward_saving({"obs": x_u.reshape(-1, *x_u.shape[2:])})
            runs[u] = (out, saved)
            for x, pre in zip(agents, out.view(k, len(agents), b, -1).unbind(1), strict=True):
                if self.specs[x].discrete:
                    z = (masked_logits(pre, self._mask(batch, x, k)) + self._gumbel(rows, turns, pre.shape[-1]))
                    soft = F.softmax(z / self.temperature, dim=-1)
                    hard = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
                    mine[x], through[x] = hard + soft - soft, soft  # gumbel_softmax's straight-through value
                else:
                    mine[x] = through[x] = torch.tanh(pre)
        layers, saved_q = self._critic_1(k), []
        stacked_forward(layers, self._own_actions(xa, mine), self.activation, saved_q)
        g = -weight.reshape(-1, b, 1)  # d loss / d Q
        derivative = _DERIVATIVES[self.activation]
        for i in range(len(layers) - 1, -1, -1):  # to the critics' input (their weights do not learn here)
            w = layers[i][0]
            g = g * w if w.shape[1] == 1 else torch.bmm(g, w)  # (one output: a product each, as bmm's)
            if i:
                g = derivative(g, saved_q[i])
        g = g.view(k, self.n, b, -1)
        grads = []
        for u, agents in self.units.items():
            parts = []
            for x in agents:
                d = g[:, self.names.index(x), :, self.columns[x]]
                if self.specs[x].discrete:  # softmax((logits + noise) / T): masked actions have soft 0, so 0
                    soft = through[x]
                    d = soft * (d - (d * soft).sum(-1, keepdim=True)) / self.temperature
                else:
                    d = torch.ops.aten.tanh_backward(d, through[x])
                parts.append(d)
            out, saved = runs[u]
            grad = self.actors[u].backward(saved, parts[0] if len(parts) == 1 else torch.cat(parts, dim=1),
                                           out=self.adams[f"actor.{u}"].grad)
            grads.append(grad)
        return grads

    def _gumbel(self, rows: StackedRows, who: Sequence[bool], dim: int) -> torch.Tensor:
        """Gumbel noise [K, B, dim] for the actors' straight-through samples: each member in `who` draws its own
        rows' worth from its keyed draws (one op for the group; a member's values do not depend on its group),
        zeros elsewhere."""
        take = torch.tensor(list(who), device=self.device)
        bits = self.member_draws(SALT_GUMBEL).below(take, rows.b * dim, 1 << 24)
        u = (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # uniform on (0, 1), ends excluded
        return gumbel_of(u).view(rows.k, rows.b, dim) * (rows.valid & take.unsqueeze(1)).unsqueeze(2)

"""DQN-family learning, written once for a population: K members' TD (or C51) losses in one batched pass,
one autograd backward through their stacked networks and one stacked Adam step. A member alone is K = 1.

Each member keeps its own learning rate, gamma, tau, batch size, exploration schedule, minibatches,
parameter noise and priorities (drawn for the whole group at once from keyed streams, member i's values from
its own key and counter, so they are what it would draw alone);
structural options (double Q, the loss, target-update mode, n-step, noisy/dueling/C51 heads, prioritised
replay) are equal within a group (:meth:`DQN.batch_key`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agilerl_core.algorithms.dqn.maths import categorical_projection, mask_invalid, regression_loss, regression_loss_grad
from agilerl_core.algorithms.group import ReplayGroup, StackedRows, clipped_step, gradients
from agilerl_core.buffers.prioritized import GroupPriorities
from agilerl_core.buffers.replay import Transition
from agilerl_core.rng import SALT_NOISY, SALT_SAMPLE


class DQNGroup(ReplayGroup):
    """K DQN (Rainbow, CQN) members learning together from the shared replay buffer (or a dataset)."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        hp = first.hp
        self.q = self.adams["q"]
        self.online = self.stacked([a.layouts["q"] for a in self.agents], self.q.flat, self.q.padded, trainable=True)
        self.target = self.stacked([a.layouts["q_target"] for a in self.agents], self.targets["q_target"],
                                     self.q.padded)
        self.gamma, self.tau = self.hp_tensor("gamma"), self.hp_tensor("tau")
        self.hard_every, self.double, self.huber = hp.hard_update_every, hp.double, hp.loss == "huber"
        self.max_grad_norm = hp.max_grad_norm
        self.noisy, self.support, self.per = hp.noisy, first.support, hp.per
        # C51's support ends as host floats, read once (the projection clamps to them at every step)
        self._ends = None if self.support is None else (float(self.support[0]), float(self.support[-1]))
        self.actions = first.action_dim
        self._everyone = torch.ones(len(self.agents), dtype=torch.bool, device=self.device)
        self._eps = tuple(self.hp_tensor64(n) for n in ("eps_start", "eps_end", "eps_decay_steps"))
        self.priorities = GroupPriorities([a.per for a in self.agents]) if self.per else None
        self._drawn: tuple[torch.Tensor, list[int]] | None = None  # the leaves prioritised replay drew last
        if self.per:  # each member's importance-sampling exponent, annealed over its env steps (on the device)
            self._beta = (self.hp_tensor64("per_beta"), self.hp_tensor64("per_beta_steps"))
        self.compiled: str | None = None  # the torch.compile backend every step goes through (:meth:`compile_learn`)

    @property
    def plain_td(self) -> bool:
        """Whether a step is the plain TD regression on a plain MLP (hand-written backward, no noise, C51 or
        penalty): what :meth:`compile_learn` compiles."""
        return (self.online.hand_backward and self.support is None and not self.noisy
                and type(self).penalty is DQNGroup.penalty)

    def compile_learn(self, backend: str = "inductor") -> bool:
        """Take every later step through one graph compiled by torch.compile with `backend` (:func:`fused_td_step`),
        when the step is :attr:`plain_td`; returns whether it is. The online network then reads the parameters as plain
        views (no autograd leaves): the compiled graph steps the buffer they view in place."""
        if not self.plain_td:
            return False
        self.online = self.stacked([a.layouts["q"] for a in self.agents], self.q.flat, self.q.padded)
        self.compiled = backend
        return True

    def learn_step(self, buffer, slots: Sequence[int], active: Sequence[bool]) -> torch.Tensor:
        """With prioritised replay: every member's stratified draw from its own sum tree in one descent, from
        keyed uniforms (one draw for the group, each member's at its own counter), weighted by importance."""
        if self.priorities is None:
            return super().learn_step(buffer, slots, active)
        sizes = [a.hp.batch_size if on else 0 for a, on in zip(self.agents, active, strict=True)]
        who = self.const(active, torch.bool)
        u = self.member_draws(SALT_SAMPLE).uniform(who, max(sizes))
        start, steps = self._beta  # per_beta of every member at once, in float64 as on the host
        beta = start + (1.0 - start) * (self.env_steps() / steps).clamp(max=1.0)
        rows, weights, leaves = self.priorities.sample_rows(buffer, list(slots), sizes, beta, u)
        self._drawn = (leaves, sizes)
        stacked = StackedRows.of_matrix(rows, sizes, self.device, self.const(sizes))
        stacked.weight = stacked.weight * weights.to(torch.float32)
        return self.learn(self.batch(buffer, stacked.index), stacked)

    # ---- values ---------------------------------------------------------------------------------------
    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        """Q(s, .) [K, B, A] from a network's outputs: the outputs, or the means of its return distributions."""
        if self.support is None:
            return out
        k, b = out.shape[:2]
        return (torch.softmax(out.view(k, b, self.actions, -1), dim=3) * self.support).sum(dim=3)

    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        if self.noisy:
            self.online.noise_off()
        q = self.q_values(self.online(obs))
        return mask_invalid(q, None if mask is None else mask.view(q.shape)).argmax(dim=2)

    @torch.no_grad()
    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Every member's epsilon-greedy actions [K, N] in one forward and one draw of the group's keyed stream
        (fresh parameter noise first, for noisy members): each member explores at its own epsilon, a random
        action uniform over the allowed ones."""
        if self.noisy:
            self.online.resample_noise(self.member_draws(SALT_NOISY), self._everyone)
        q = self.q_values(self.online(obs))
        k, n, a = q.shape
        allowed = None if mask is None else mask.view(k, n, a)
        greedy = mask_invalid(q, allowed).argmax(dim=2)
        eps = self.epsilon()
        self.metrics.last(epsilon=eps)
        u = self.stream.uniform(n, 1 + a)
        if allowed is None:
            random = (u[..., 1] * a).long().clamp(max=a - 1)
        else:  # uniform over the allowed actions (all of them where none is)
            ok = allowed | ~allowed.any(dim=2, keepdim=True)
            random = (u[..., 1:] * ok + ok).argmax(dim=2)
        return torch.where(u[..., 0] < eps.unsqueeze(1), random, greedy)

    def epsilon(self) -> torch.Tensor:
        """Every member's exploration rate now [K]: linear_epsilon at its env steps, in float64 as on the host."""
        start, end, decay = self._eps
        return (start + (self.env_steps().clamp(min=0) / decay).clamp(max=1.0) * (end - start)).to(torch.float32)

    # ---- targets --------------------------------------------------------------------------------------
    @torch.no_grad()
    def td_target(self, batch: Transition, k: int, next_online: torch.Tensor | None = None) -> torch.Tensor:
        """r + gamma * (1 - terminated) * Q_target(s', a*) [K, B], a* = argmax of Q_online (double) or Q_target
        over the valid next actions. Truncated transitions are stored with terminated = 0 and bootstrap from
        their final state; an n-step row bootstraps with the member's own gamma^L."""
        next_target = self.q_values(self.target(batch.next_obs))
        chooser = next_target if not self.double else (
            self.q_values(self.online(batch.next_obs)) if next_online is None else next_online)
        best = mask_invalid(chooser, self._next_mask(batch, k)).argmax(dim=2, keepdim=True)
        reward, discount = self.returns(batch, k)
        return reward + discount * torch.rsub(batch.terminated.view(k, -1), 1.0) * next_target.gather(2, best).squeeze(2)

    @torch.no_grad()
    def target_distribution(self, batch: Transition, k: int) -> torch.Tensor:
        """C51's target [K, B, atoms]: the next state's return distribution of the greedy next action (the
        online network's choice when double), projected through the Bellman update."""
        out = self.target(batch.next_obs)
        probs = torch.softmax(out.view(k, out.shape[1], self.actions, -1), dim=3)
        q_next = self.q_values(self.online(batch.next_obs)) if self.double else (probs * self.support).sum(dim=3)
        best = mask_invalid(q_next, self._next_mask(batch, k)).argmax(dim=2)
        next_probs = probs.gather(2, best[..., None, None].expand(-1, -1, 1, probs.shape[3])).squeeze(2)
        reward, discount = self.returns(batch, k)
        discount = discount * (1.0 - batch.terminated.view(k, -1))
        return categorical_projection(next_probs, reward, discount.expand_as(reward), self.support, self._ends)

    @staticmethod
    def _next_mask(batch: Transition, k: int) -> torch.Tensor | None:
        m = batch.next_action_mask
        return None if m is None else m.view(k, -1, m.shape[-1])

    # ---- losses ---------------------------------------------------------------------------------------
    def sample_losses(self, batch: Transition, k: int, out: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-sample loss [K, B] (differentiable), per-sample priority signal [K, B]): the TD error's
        regression loss, or the cross-entropy to the projected target (C51). `out`: the online network's
        outputs on ``batch.obs`` when already computed."""
        out = self.online(batch.obs) if out is None else out
        action = batch.action.view(k, -1, 1)
        if self.support is not None:
            logits = out.view(k, out.shape[1], self.actions, -1)
            taken = logits.gather(2, action.unsqueeze(3).expand(-1, -1, 1, logits.shape[3])).squeeze(2)
            ce = -(self.target_distribution(batch, k) * torch.log_softmax(taken, dim=2)).sum(dim=2)
            return ce, ce.detach()
        target = self.td_target(batch, k)
        q_taken = out.gather(2, action).squeeze(2)
        loss = regression_loss(q_taken, target, self.huber)
        penalty = self.penalty(out, action.squeeze(2))
        return loss if penalty is None else loss + penalty, (q_taken - target).detach().abs()

    @torch.no_grad()
    def td_loss_and_grad(self, batch: Transition, k: int, out: torch.Tensor, weight: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The TD regression loss of :meth:`sample_losses` without autograd: (per-sample loss [K, B], priority
        signal |TD error| [K, B], the gradient of sum(weight * loss) for the outputs `out` [K, B, A])."""
        target = self.td_target(batch, k)
        action = batch.action.view(k, -1, 1)
        q_taken = out.gather(2, action).squeeze(2)
        diff = q_taken - target
        grad = torch.zeros_like(out).scatter_(2, action, (weight * regression_loss_grad(diff, self.huber)).unsqueeze(2))
        return regression_loss(q_taken, target, self.huber), diff.abs(), grad

    def penalty(self, q: torch.Tensor, action: torch.Tensor) -> torch.Tensor | None:
        """A per-sample term [K, B] added to the TD loss given all Q-values [K, B, A] and the actions taken
        [K, B] (CQN's conservative penalty); None for DQN."""
        return None

    # ---- learning -------------------------------------------------------------------------------------
    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        """One gradient step of every active member on its own rows of `batch`; returns each member's loss [K].
        Its diagnostics (mean Q of the actions taken, |TD error|, gradient norm) go to :attr:`metrics`."""
        k = rows.k
        active = rows.who
        if self.compiled is not None:
            return self._learn_compiled(batch, rows)
        due = self.metrics.due()
        if self.noisy:  # independent noise for the online and target networks at every step
            noise = self.member_draws(SALT_NOISY)
            self.online.resample_noise(noise, rows.active)
            self.target.resample_noise(noise, rows.active)
        if self.online.hand_backward:  # the trunk's backward by hand (StackedNetwork.backward)
            out, saved = self.online.forward_saving(batch.obs)
            if self.support is None and type(self).penalty is DQNGroup.penalty:
                per_sample, signal, grad_out = self.td_loss_and_grad(batch, k, out, rows.weight)
                weighted = per_sample * rows.weight
            else:  # autograd for the loss on the outputs
                out.requires_grad_(True)
                per_sample, signal = self.sample_losses(batch, k, out)
                weighted = per_sample * rows.weight
                (grad_out,) = torch.autograd.grad(weighted.sum(), (out,))
            self.online.backward(saved, grad_out, out=self.q.grad)
        else:
            out = self.online(batch.obs)
            per_sample, signal = self.sample_losses(batch, k, out)
            weighted = per_sample * rows.weight
            (self.q.grad,) = gradients(weighted.sum(), self.online.leaves)
        norm = clipped_step(self.q, self.max_grad_norm, None if rows.all_active else rows.active, due)
        self._count_steps(active)
        self._new_priorities(signal)
        self.update_targets(self._target_weights(active))
        if due:
            self._record(rows, batch, out.detach(), None if self.support is not None else signal, norm)
        return weighted.detach().sum(1)

    def _record(self, rows: StackedRows, batch: Transition, out: torch.Tensor, td_error: torch.Tensor | None,
                norm: torch.Tensor) -> None:
        """A measured step's diagnostics into :attr:`metrics`: each member's mean Q(s, a) of its rows' actions,
        mean |TD error| (not for C51, whose loss is a cross-entropy) and gradient norm; plain means over its rows."""
        w = rows.weight if self.priorities is None else rows.valid / rows.valid.sum(1, keepdim=True).clamp(min=1)
        q = self.q_values(out).gather(2, batch.action.view(rows.k, -1, 1)).squeeze(2)
        per_row = q.unsqueeze(0) if td_error is None else torch.stack([q, td_error])
        means = (per_row * w).sum(2)
        values = {"q": means[0], "grad_norm": norm}
        if td_error is not None:
            values["td_error"] = means[1]
        self.metrics.add(None if rows.all_active else rows.active, **values)

    def _learn_compiled(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        """:meth:`learn` as one compiled graph: the same maths (tests compare them)."""
        self._count_steps(rows.who)
        weights = torch.tensor(self._target_weights(rows.who), dtype=torch.float32, device=self.device)
        loss, signal, out, norm = _compiled_step(self.compiled)(self, batch, rows.weight, rows.active, weights)
        self._new_priorities(signal)
        if self.metrics.due():
            self._record(rows, batch, out, signal, norm)
        return loss

    def _count_steps(self, active: Sequence[bool]) -> None:
        for a, on in zip(self.agents, active, strict=True):
            a.learn_steps += int(on)

    def write_back(self) -> None:
        super().write_back()
        if self.priorities is not None:
            self.priorities.check()  # a draw from a tree without mass, read once at the end of the phase

    def _new_priorities(self, signal: torch.Tensor) -> None:
        if self.priorities is not None and self._drawn is not None:  # the drawn rows' new priorities
            leaves, sizes = self._drawn
            self.priorities.update(leaves, signal, sizes)
            self._drawn = None

    def _target_weights(self, active: Sequence[bool]) -> list[float]:
        """How far each member's target moves after this step (learn steps already counted): tau, or 1 on a
        hard update's step, 0 for members that sat out."""
        if self.hard_every is None:
            return [tau * on for tau, on in zip(self.hp_list("tau"), active, strict=True)]
        return [float(on and a.learn_steps % self.hard_every == 0) for a, on in zip(self.agents, active, strict=True)]


@torch.no_grad()
def fused_td_step(group: DQNGroup, batch: Transition, weight: torch.Tensor, active: torch.Tensor,
                  target_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One plain TD step of every `active` member ([K] bool) of a :attr:`DQNGroup.plain_td` group, as
    :meth:`DQNGroup.learn` takes it: forward, the TD loss's gradient, the hand-written backward, clipping, Adam
    and every target moved towards its online network by `target_weight` [K]. Written to compile as one graph
    (:func:`_compiled_step`); returns (each member's loss [K], the priority signal [K, B], the online outputs
    [K, B, A], each member's gradient norm before clipping [K])."""
    out, saved = group.online.forward_saving(batch.obs)
    per_sample, signal, grad_out = group.td_loss_and_grad(batch, group.k, out, weight)
    group.online.backward(saved, grad_out, out=group.q.grad)
    norm = clipped_step(group.q, group.max_grad_norm, active)
    for flat in group.targets.values():
        flat.lerp_(group.q.flat, target_weight.unsqueeze(1))
    return (per_sample * weight).sum(1), signal, out, norm


_COMPILED: dict[str, object] = {}


def _compiled_step(backend: str):
    """:func:`fused_td_step` compiled by torch.compile with `backend`, once per process and shape: Dynamo guards on
    the group's shapes and options, and a new shape (another group size, mutated widths) compiles again, statically
    (Inductor's dynamic-shape code for this graph failed to run in torch 2.13), up to Dynamo's recompile limit
    (then eager)."""
    if backend not in _COMPILED:
        _COMPILED[backend] = torch.compile(fused_td_step, fullgraph=True, dynamic=False, backend=backend)
    return _COMPILED[backend]

"""Actor-critic learning (DDPG, TD3, SAC; CQL builds on SAC), written once for a population: K members'
critic, actor and temperature steps, each one batched pass through their stacked networks, one autograd
backward and one stacked Adam step. A member alone is K = 1.

A learn step: the bootstrapped target y (each algorithm's own), one step of every critic towards y (MSE plus
any penalty), every ``policy_freq``-th step also an actor step (through critic 1 for TD3, both critics for
SAC) and, for SAC, a temperature step; targets move with the actor (TD3) or after every critic step (SAC).
Each member keeps its own learning rates, gamma, tau, batch size, policy_freq, noise scales, temperature and
target entropy, and draws its minibatches and noise from its own generator in the order it would alone.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence

import torch

from agilerl_core.algorithms.actor_critic.colored import ColoredNoise
from agilerl_core.algorithms.actor_critic.maths import LOG_STD_MAX, LOG_STD_MIN, SDE_MEAN_CLIP, squashed_log_prob
from agilerl_core.algorithms.group import ReplayGroup, StackedRows, actor_turns, clipped_step, gradients
from agilerl_core.algorithms.gsde import StateDependentNoise, log_scales, sde_log_std
from agilerl_core.algorithms.optim import adam_update_stacked_
from agilerl_core.buffers.replay import Transition
from agilerl_core.networks.stacked import StackedNetwork

Penalty = Callable[[str], torch.Tensor]  # critic name -> each member's penalty [K] (differentiable)


class ActorCriticGroup(ReplayGroup):
    """K actor-critic members: stacked actor, critics and targets; subclasses give the target, the actor's
    loss and exploration."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        self.random_steps = self.hp_tensor64("random_steps")  # each member's warm-up (0: none)
        self.nets: dict[str, StackedNetwork] = {}
        for name in first.online_networks:
            adam = self.adams[name]
            self.nets[name] = self.stacked([a.layouts[name] for a in self.agents], adam.flat, adam.padded,
                                             trainable=True)
        for tname, online in first.target_networks.items():
            self.nets[tname] = self.stacked([a.layouts[tname] for a in self.agents], self.targets[tname],
                                              self.adams[online].padded)
        self.critics = first.critics
        self.gamma, self.tau = self.hp_tensor("gamma"), self.hp_tensor("tau")
        self.max_grad_norm = first.hp.max_grad_norm
        self.dim = first.action_dim
        self.delayed = first.delayed_targets
        self.policy_freq = [a.hp.policy_freq for a in self.agents]
        self._due = True  # whether this learn step's diagnostics are measured (MetricSums.due)

    def q(self, name: str, obs, action: torch.Tensor) -> torch.Tensor:
        """Critic (or target critic) `name`'s Q(s, a) [K, B] for member-major obs and actions [K, B, dim]."""
        return self.nets[name](obs, action).squeeze(2)

    def step(self, name: str, loss: torch.Tensor, active: torch.Tensor | None, measure: bool = False
             ) -> torch.Tensor | None:
        """One clipped Adam step of network `name` of every member on the gradient of `loss` (the sum of the
        members' losses, so each member gets its own gradient); returns each member's gradient norm [K] when
        `measure` asks for it (else None, unless clipping computed it)."""
        adam = self.adams[name]
        (adam.grad,) = gradients(loss, self.nets[name].leaves)
        return clipped_step(adam, self.max_grad_norm, active, measure)

    def learn(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        """One step of every active member; returns each member's summed critic loss [K]. Its diagnostics (the
        mean Q of the first critic on the batch's actions, the critics' gradient norm; the actor's in
        :meth:`actor_step`) go to :attr:`metrics` on the steps it measures (the loss is the arena's)."""
        k = rows.k
        self._due = self.metrics.due()
        y = self.target(batch, rows)
        penalty = self.critic_penalty(batch, rows)
        active = None if rows.all_active else rows.active
        action = batch.action.view(k, -1, self.dim)
        on = rows.active.to(y.dtype)
        total = torch.zeros(k, device=self.device)
        norms, q_first = [], None
        for c in self.critics:
            net = self.nets[c]
            if penalty is None and net.hand_backward:  # plain TD regression: the gradient by hand
                out, saved = net.forward_saving(batch.obs, action)
                q = out.squeeze(2)
                diff = q - y
                losses = (diff.square() * rows.weight).sum(1)
                net.backward(saved, (2.0 * diff * rows.weight).unsqueeze(2), out=self.adams[c].grad)
                norms.append(clipped_step(self.adams[c], self.max_grad_norm, active, self._due))
            else:
                q = self.q(c, batch.obs, action)
                losses = ((q - y).square() * rows.weight).sum(1)
                if penalty is not None:
                    losses = losses + penalty(c) * on
                norms.append(self.step(c, losses.sum(), active, self._due))
            total += losses.detach()
            q_first = q.detach() if q_first is None else q_first
        if self._due:
            self.metrics.add(None if rows.all_active else rows.active, q=(q_first * rows.weight).sum(1),
                             critic_grad_norm=torch.stack(norms).square().sum(0).sqrt())
        turn_list = actor_turns(self.agents, rows.who, self.policy_freq)
        if any(turn_list):
            self.actor_step(batch, rows, torch.tensor(turn_list, device=self.device), turn_list)
        moved = turn_list if self.delayed else rows.who
        self.update_targets([tau * m for tau, m in zip(self.hp_list("tau"), moved, strict=True)])
        return total

    @abstractmethod
    def target(self, batch: Transition, rows: StackedRows) -> torch.Tensor:
        """The critics' regression target y [K, B] (no gradient)."""

    @abstractmethod
    def actor_step(self, batch: Transition, rows: StackedRows, turns: torch.Tensor, turn_list: list[bool]) -> None:
        """The actor step of the members whose turn it is (`turns` [K] bool)."""

    def critic_penalty(self, batch: Transition, rows: StackedRows) -> Penalty | None:
        """A term added to each critic's loss (CQL); None: plain TD regression."""
        return None


def colored_noise(group: ActorCriticGroup) -> ColoredNoise | None:
    """The group's pink exploration noise when its members asked for it (``noise_type: pink``), else None."""
    first = group.agents[0].hp
    if getattr(first, "noise_type", None) != "pink":
        return None
    return ColoredNoise(first.noise_length, group.hp_tensor("noise_beta").view(-1, 1, 1, 1))


class TD3Group(ActorCriticGroup):
    """TD3 and DDPG members."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        self.noise, self.noise_clip = self.hp_tensor("target_noise"), self.hp_tensor("target_noise_clip")
        self.ou = torch.tensor([a.hp.noise_type == "ou" for a in self.agents], device=self.device).view(-1, 1, 1)
        self.ou_state: torch.Tensor | None = None  # each member's OU process per env [K, N, A] (0: Gaussian)
        self.pink = colored_noise(self)

    def episodes_done(self, done: torch.Tensor) -> None:
        if self.ou_state is not None:  # an ended episode's OU process starts again from 0
            self.ou_state.masked_fill_(done.view(self.k, -1, 1), 0.0)

    @torch.no_grad()
    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Every member's exploration actions [K, N, A]: its policy plus its own Gaussian or Ornstein-Uhlenbeck
        noise (:class:`~agilerl_core.algorithms.actor_critic.noise.OUNoise`'s process, on the device), or
        uniform random actions while it warms up; one draw of the group's keyed stream each."""
        greedy = torch.tanh(self.nets["actor"](obs))
        k, n, a = greedy.shape
        if self.ou_state is None or self.ou_state.shape != greedy.shape:
            self.ou_state = torch.zeros_like(greedy)
        scale, theta, dt = (self.hp_tensor(name).view(k, 1, 1) for name in ("expl_noise", "ou_theta", "ou_dt"))
        self.metrics.last(noise_scale=scale)
        z, u = self.stream.normal(n, a), self.stream.uniform(n, a)
        if self.pink is not None:  # a group is all pink or none (the batch key)
            z = self.pink.next(self.stream, n, a)
        stepped = self.ou_state - theta * self.ou_state * dt + scale * dt.sqrt() * z
        self.ou_state = torch.where(self.ou, stepped, 0.0)
        act = (greedy + torch.where(self.ou, stepped, scale * z)).clamp(-1.0, 1.0)
        warm = (self.env_steps() < self.random_steps).view(k, 1, 1)
        return torch.where(warm, 2.0 * u - 1.0, act)

    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        return torch.tanh(self.nets["actor"](obs))

    @torch.no_grad()
    def target(self, batch: Transition, rows: StackedRows, smoothing: torch.Tensor | None = None) -> torch.Tensor:
        """y = r + discount * (1 - terminated) * min_i Q_i'(s', clip(mu'(s') + clip(noise, -c, c), -1, 1)), the
        standard normal `smoothing` noise [K, B, dim] drawn from each member's generator when not given and
        scaled by its target_noise (no smoothing where that is 0). One critic: the minimum is over one."""
        k = rows.k
        next_a = torch.tanh(self.nets["actor_target"](batch.next_obs))
        if smoothing is None:
            who = [on and a.hp.target_noise > 0 for a, on in zip(self.agents, rows.who, strict=True)]
            smoothing = self.member_noise(rows, who, self.dim)
        clip = self.noise_clip.view(k, 1, 1)
        eps = (smoothing * self.noise.view(k, 1, 1)).clamp(-clip, clip)
        next_a = torch.where(self.noise.view(k, 1, 1) > 0, (next_a + eps).clamp(-1.0, 1.0), next_a)
        q_next = torch.stack([self.q(f"{c}_target", batch.next_obs, next_a) for c in self.critics]).min(0).values
        reward, discount = self.returns(batch, k)
        return reward + discount * (1.0 - batch.terminated.view(k, -1)) * q_next

    def actor_step(self, batch: Transition, rows: StackedRows, turns: torch.Tensor, turn_list: list[bool]) -> None:
        """The deterministic policy gradient: -mean Q_1(s, tanh(actor(s)))."""
        mu = torch.tanh(self.nets["actor"](batch.obs))
        q = self.q("critic_1", batch.obs, mu)
        loss = -(q * rows.weight * turns.unsqueeze(1)).sum()
        due = self.metrics.due("actor")
        norm = self.step("actor", loss, None if all(turn_list) else turns, due)
        if due:
            self.metrics.add(turns, actor_loss=-(q.detach() * rows.weight).sum(1), actor_grad_norm=norm)


class SACGroup(ActorCriticGroup):
    """SAC members (and CQL's, which add a critic penalty)."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        self.target_entropy = torch.tensor([a.target_entropy for a in self.agents], device=self.device)
        self.log_alpha = torch.stack([a.log_alpha for a in self.agents])
        self.alpha_adam = torch.stack([a.alpha_adam for a in self.agents])  # each member's temperature Adam
        self.lr_alpha = self.hp_tensor("lr_alpha")
        self.auto_entropy = [bool(a.hp.auto_entropy) for a in self.agents]
        self.pink = colored_noise(self)
        # unit-variance Ornstein-Uhlenbeck noise in place of the white draw (per member, as TD3's)
        ou = [a.hp.noise_type == "ou" for a in self.agents]  # (host list: once per group, outside the step loop)
        self.any_ou = any(ou)
        self.ou = torch.tensor(ou, device=self.device).view(-1, 1, 1)
        self.ou_state: torch.Tensor | None = None  # [K, N, A]
        self.ou_keep = (1.0 - self.hp_tensor("ou_theta") * self.hp_tensor("ou_dt")).clamp(0.0, 1.0).view(-1, 1, 1)
        self.gsde = self.agents[0].gsde  # a group is all gSDE or none (the batch key)
        if self.gsde:
            self.log_std_init = self.hp_tensor("log_std_init").view(-1, 1, 1)
            self.sde: StateDependentNoise | None = None  # the phase's exploration weights (drawn when acting)

    def log_sigma(self) -> torch.Tensor:
        """gSDE: each member's log noise scale per action and hidden unit [K, dim, L] (a padded unit's activation
        is 0)."""
        return log_scales(self.nets["actor"].p["mlp.out.weight"], self.dim, self.log_std_init)

    def distribution(self, name: str, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, clamped log std) [K, B, dim] of actor `name` (gSDE: the state-dependent scale)."""
        if self.gsde:
            out, latent = self.nets[name].forward_latent(obs)
            log_std = sde_log_std(latent, self.log_sigma())
            return out[..., : self.dim].clamp(-SDE_MEAN_CLIP, SDE_MEAN_CLIP), log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        out = self.nets[name](obs)
        return out[..., : self.dim], out[..., self.dim:].clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample_action(self, obs, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, log pi(a|s)) [K, B, dim], [K, B]: a = tanh(mean + std * noise), reparameterised."""
        mean, log_std = self.distribution("actor", obs)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)

    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        return torch.tanh(self.distribution("actor", obs)[0])

    def episodes_done(self, done: torch.Tensor) -> None:
        if self.ou_state is not None:  # an ended episode's OU process starts again from 0
            self.ou_state.masked_fill_(done.view(self.k, -1, 1), 0.0)

    @torch.no_grad()
    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """Every member's actions [K, N, A] sampled from its squashed Gaussian policy (its standard normal draw
        white, pink or Ornstein-Uhlenbeck), or through gSDE's noise weights, or uniform random ones while it
        warms up; one draw of the group's keyed stream each."""
        if self.gsde:
            return self._explore_sde(obs)
        mean, log_std = self.distribution("actor", obs)
        k, n, a = mean.shape
        z, u = self.stream.normal(n, a), self.stream.uniform(n, a)
        if self.pink is not None:  # a group is all pink or none (the batch key)
            z = self.pink.next(self.stream, n, a)
        if self.any_ou:  # (a group without OU members skips it: nothing extra on its env step)
            if self.ou_state is None or self.ou_state.shape != z.shape:
                self.ou_state = torch.zeros_like(z)
            keep = self.ou_keep
            stepped = keep * self.ou_state + (1.0 - keep.square()).sqrt() * z  # stationary variance 1
            self.ou_state = torch.where(self.ou, stepped, 0.0)
            z = torch.where(self.ou, stepped, z)
        warm = (self.env_steps() < self.random_steps).view(k, 1, 1)
        return torch.where(warm, 2.0 * u - 1.0, torch.tanh(mean + log_std.exp() * z))

    def _explore_sde(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """gSDE's actions: tanh(mean(s) + latent(s) . (sigma * W)), W fixed for sde_sample_freq steps."""
        out, latent = self.nets["actor"].forward_latent(obs)
        mean = out[..., : self.dim].clamp(-SDE_MEAN_CLIP, SDE_MEAN_CLIP)
        k, n, a = mean.shape
        u = self.stream.uniform(n, a)
        if self.sde is None:
            self.sde = StateDependentNoise(self.stream.keys, self.agents[0].hp.sde_sample_freq)
        noise = self.sde(latent, self.log_sigma())
        warm = (self.env_steps() < self.random_steps).view(k, 1, 1)
        return torch.where(warm, 2.0 * u - 1.0, torch.tanh(mean + noise))

    @torch.no_grad()
    def target(self, batch: Transition, rows: StackedRows, noise: torch.Tensor | None = None) -> torch.Tensor:
        """y = r + discount * (1 - terminated) * (min_i Q_i'(s', a') - alpha * log pi(a'|s')), a' ~ pi(.|s')."""
        k = rows.k
        if noise is None:
            noise = self.member_noise(rows, rows.who, self.dim)
        next_a, next_logp = self.sample_action(batch.next_obs, noise)
        q_next = torch.min(*(self.q(f"{c}_target", batch.next_obs, next_a) for c in self.critics))
        soft = q_next - self.log_alpha.exp().unsqueeze(1) * next_logp
        reward, discount = self.returns(batch, k)
        return reward + discount * (1.0 - batch.terminated.view(k, -1)) * soft

    def actor_step(self, batch: Transition, rows: StackedRows, turns: torch.Tensor, turn_list: list[bool]) -> None:
        """E[alpha log pi - min Q] through the reparameterised sample (critics as they are after their step),
        then each member's temperature step from the same log-probs."""
        alpha = self.log_alpha.exp().unsqueeze(1)
        a, logp = self.sample_action(batch.obs, self.member_noise(rows, turn_list, self.dim))
        q = torch.min(*(self.q(c, batch.obs, a) for c in self.critics))
        due = self.metrics.due("actor")
        norm = self.step("actor", ((alpha * logp - q) * rows.weight * turns.unsqueeze(1)).sum(),
                         None if all(turn_list) else turns, due)
        if due:
            with torch.no_grad():
                self.metrics.add(turns, actor_loss=((alpha * logp - q) * rows.weight).sum(1),
                                 entropy=-(logp * rows.weight).sum(1), actor_grad_norm=norm)
        tuning = [t and auto for t, auto in zip(turn_list, self.auto_entropy, strict=True)]
        if any(tuning):  # alpha_loss's gradient: -mean(log pi + target entropy) over each member's rows
            real = rows.valid
            mean_logp = (logp.detach() * real).sum(1) / real.sum(1).clamp(min=1)
            grad = -(mean_logp + self.target_entropy)
            adam_update_stacked_(self.log_alpha.view(self.k, 1), grad.view(self.k, 1), self.alpha_adam,
                                 self.lr_alpha, torch.tensor(tuning, device=self.device))
        if due:
            self.metrics.last(alpha=self.log_alpha.exp())

    def write_back(self) -> None:
        super().write_back()
        for i, a in enumerate(self.agents):
            a.log_alpha = self.log_alpha[i].clone()
            a.alpha_adam.copy_(self.alpha_adam[i])

"""PPO learning, written once for a population: K members act through one forward of their stacked actor and
critic, and each minibatch round is one batched loss, one autograd backward and one stacked Adam step per
network. A member alone is K = 1.

Each member keeps its own learning rate, clip range, entropy and value coefficients, epochs, minibatch count,
KL early stop, rollout rows, and its own shuffles and action samples (drawn from its own generator in the
order it would draw them alone); a member whose update has ended sits the remaining rounds out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from agilerl_core.algorithms.group import MemberGroup, clipped_step, gradients
from agilerl_core.algorithms.gsde import StateDependentNoise, log_scales, sde_log_std
from agilerl_core.algorithms.optim import adam_update_stacked_
from agilerl_core.algorithms.ppo.maths import (
    log_prob,
    log_prob_entropy,
    minibatch_bounds,
    normalized_advantages,
    policy_params,
    ppo_loss,
    value_loss,
)
from agilerl_core.networks.stacked import StackedNetwork, sequences
from agilerl_core.rng import normal, uniform


class PPOGroup(MemberGroup):
    """K PPO members: stacked actor and critic (and, for Box actions, each member's state-independent log std)."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        self.nets: dict[str, StackedNetwork] = {}
        for name in ("actor", "critic"):
            adam = self.adams[name]
            self.nets[name] = self.stacked([a.layouts[name] for a in self.agents], adam.flat, adam.padded,
                                             trainable=True)
        self.continuous = first.continuous
        self.clip, self.ent_coef, self.vf_coef = (self.hp_tensor(n) for n in ("clip_coef", "ent_coef", "vf_coef"))
        self.norm_adv, self.clip_vloss, self.max_grad_norm = first.hp.norm_adv, first.hp.clip_vloss, first.hp.max_grad_norm
        self.log_std = torch.stack([a.log_std for a in self.agents]) if self.continuous else None
        self.log_std_adam = torch.stack([a.log_std_adam for a in self.agents]) if self.continuous else None
        self.dim = first.action_dim
        self.gsde = first.gsde  # a group is all gSDE or none (the batch key); its std is the features'
        self.free_std = self.continuous and not self.gsde  # the state-independent log std learns
        if self.gsde:
            self.log_std_init = self.hp_tensor("log_std_init").view(-1, 1, 1)
            self.sde: StateDependentNoise | None = None  # the phase's exploration weights (drawn when acting)
        self.lr = self.hp_tensor("lr")
        # a recurrent group: every member's state of each network while acting, [K, N, layers, S, H] (the
        # group's widest hidden size; a narrower member's extra units stay 0)
        rnn = first.arch.rnn
        self.rnn = None if rnn is None else (rnn.layers, rnn.state_shape()[1], max(a.arch.rnn.hidden for a in self.agents))
        self.seq_len = first.hp.seq_len
        self.act_state: dict[str, torch.Tensor] = {}

    def begin_acting(self, num_envs: int) -> None:
        """Recurrent members: every env starts from a zero state (a no-op otherwise)."""
        if self.rnn is not None:
            self.act_state = {n: torch.zeros(self.k, num_envs, *self.rnn, device=self.device) for n in self.nets}

    # ---- gSDE -----------------------------------------------------------------------------------------
    def log_sigma(self) -> torch.Tensor:
        """gSDE: each member's log noise scale per action and hidden unit [K, dim, L]."""
        return log_scales(self.nets["actor"].p["mlp.out.weight"], self.dim, self.log_std_init)

    def sde_distribution(self, out: torch.Tensor, latent: torch.Tensor, log_sigma: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """gSDE: (means, state-dependent log std) [K, B, A] from the actor's outputs and last hidden activations
        (`log_sigma`: :meth:`log_sigma`, when the caller has it)."""
        return out[..., : self.dim], sde_log_std(latent, self.log_sigma() if log_sigma is None else log_sigma)

    def _forward_actor(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A feed-forward actor's outputs [K, N, out] and, for gSDE, its last hidden activations (else None)."""
        if self.gsde:
            return self.nets["actor"].forward_latent(obs)
        return self.nets["actor"](obs), None

    # ---- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, out: torch.Tensor, mask: torch.Tensor | None, draw: torch.Tensor | None = None,
               latent: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's actions [K, N(, A)] sampled from its policy given the actor's outputs `out` [K, N, A]
        (`mask` [K, N, A]: allowed actions), and their log-probs. The randomness is the next draw of the group's
        keyed stream, or `draw` (one step of :meth:`action_draws`: the same values, taken ahead); gSDE's
        (`latent`: the actor's last hidden activations) is its weights', drawn every sde_sample_freq steps."""
        n = out.shape[1]
        first = self.agents[0]
        if self.gsde:
            if draw is None:
                self.stream.normal(n, self.dim)  # the stream moves as it would with Gaussian members
            log_sigma = self.log_sigma()
            mean, ls = self.sde_distribution(out, latent, log_sigma)
            if self.sde is None:
                self.sde = StateDependentNoise(self.stream.keys, first.hp.sde_sample_freq)
            actions = mean + self.sde(latent, log_sigma)
            return actions, log_prob(mean, ls, actions)
        p, ls = policy_params(out, mask, None if self.log_std is None else self.log_std.unsqueeze(1), self.dim)
        if self.continuous:
            actions = p + ls.exp() * (self.stream.normal(n, p.shape[2]) if draw is None else draw)
        else:
            u = self.stream.uniform(n, 1) if draw is None else draw
            cdf = torch.softmax(p, dim=2).cumsum(dim=2)
            actions = (u > cdf).sum(dim=2).clamp(max=p.shape[2] - 1)
        return actions, log_prob(p, ls, actions)

    def action_draws(self, steps: int, n: int) -> torch.Tensor:
        """The keyed draws of the next `steps` calls of :meth:`sample` for N envs per member, taken in one op:
        [steps, K, N, 1] uniforms (discrete actions) or [steps, K, N, A] standard normals (Box actions); step
        t's equal what the stream's (t + 1)-th next draw would give, and the stream moves past them all."""
        stream = self.stream
        counters = torch.arange(stream.counter + 1, stream.counter + 1 + steps, device=self.device)
        stream.counter += steps
        keys = stream.keys.unsqueeze(1)  # [K, 1] against the counters [steps]: [K, steps, values]
        if self.continuous:
            a = self.log_std.shape[1]
            return normal(keys, counters, n * a).view(self.k, steps, n, a).transpose(0, 1)
        return uniform(keys, counters, n).view(self.k, steps, n, 1).transpose(0, 1)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None,
            draw: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict | None]:
        """Every member's sampled actions [K, N(, A)], their log-probs [K, N] and the state values [K, N] for
        the group's observations (member-major [K * N, ...] tensors), the samples drawn from each member's
        keyed stream (one draw for the group, or `draw` taken ahead by :meth:`action_draws`; no host round
        trip). `mask` [K * N, A]: allowed actions. Recurrent members: `starts` [K, N] bool marks envs that begin
        an episode (their state is zeroed first); the fourth item is each network's state before the step
        ({name: [K, N, layers, S, H]})."""
        before, latent = None, None
        if self.rnn is None:
            out, latent = self._forward_actor(obs)
            values = self.nets["critic"](obs).squeeze(2)
        else:
            before = self.act_state
            (out, actor_state), (values, critic_state) = sequences(
                [self.nets["actor"], self.nets["critic"]], obs, [before["actor"], before["critic"]],
                starts.view(self.k, -1, 1), 1)
            values = values.squeeze(2)
            self.act_state = {"actor": actor_state, "critic": critic_state}
        actions, logp = self.sample(out, None if mask is None else mask.view(self.k, out.shape[1], -1), draw, latent)
        return actions, logp, values, before

    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        out = self._actor_out(obs, starts)  # a recurrent acting state advances (evaluation keeps no rollout)
        if self.continuous:
            return out[..., : self.agents[0].action_dim]  # (gsde: the rows after the means are its scales)
        p, _ = policy_params(out, None if mask is None else mask.view(self.k, out.shape[1], -1), None, self.dim)
        return p.argmax(dim=2)

    @torch.no_grad()
    def values_all(self, obs: dict[str, torch.Tensor], starts: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's V(s) [K, N] for member-major observations (a recurrent critic: from its current acting
        state, zeroed where `starts` [K, N] is set; the state is not advanced)."""
        critic = self.nets["critic"]
        if self.rnn is None:
            return critic(obs).squeeze(2)
        begin = None if starts is None else starts.view(self.k, -1, 1)
        return critic.sequence(obs, self.act_state["critic"], begin, 1)[0].squeeze(2)

    @torch.no_grad()
    def explore_group(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None,
                      starts: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's sampled actions [K, N(, A)]: :meth:`act`'s, without the values a rollout records (the
        actor alone: a centralised critic's input is not needed)."""
        mask = None if mask is None else mask.view(self.k, -1, mask.shape[-1])
        if self.gsde:
            out, latent = self._forward_actor(obs)
            return self.sample(out, mask, latent=latent)[0]
        return self.sample(self._actor_out(obs, starts), mask)[0]

    def _actor_out(self, obs: dict[str, torch.Tensor], starts: torch.Tensor | None) -> torch.Tensor:
        """The stacked actor's outputs [K, N, A] (a recurrent one steps its acting state, zeroed where `starts`)."""
        if self.rnn is None:
            return self.nets["actor"](obs)
        out, actor_state = self.nets["actor"].sequence(obs, self.act_state["actor"], starts.view(self.k, -1, 1), 1)
        self.act_state = {**self.act_state, "actor": actor_state}
        return out

    # ---- learning -------------------------------------------------------------------------------------
    def learn_stacked(self, data: dict, advantages: torch.Tensor, returns: torch.Tensor,
                      rows: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
        """Every member's PPO update on its own rollout rows, stacked: `data` fields [K, R, ...] (``obs``, and a
        centralised critic's ``critic_obs``, dicts of them), `advantages` and `returns` [K, R]; `rows` (host ints,
        None: R each): how many leading rows of each member are real (a multi-agent member's rows where its agent
        acted, gathered to the front), the rest padding that is never drawn. Recurrent members' rows are sequences (:meth:`
        agilerl_core.buffers.rollout.Rollout.sequences`, stacked): every field [K, R, L, ...] with ``valid`` and
        ``starts`` [K, R, L] and each network's state before the sequence ``state/<name>`` [K, R, ...], and each
        real step weighs alike in its member's minibatch.

        Each member keeps its own epochs, minibatch count and KL target; its shuffles are one permutation per
        epoch from its keyed stream. The whole plan is known before any work: all members' permutations of all
        epochs are one draw, every round's rows one index, the per-row fields of all rounds one gather each
        (the observations, the bulk, one gather per round). Nothing is read back to the host: returns each
        member's summed loss, last approximate KL and updates taken ([K] tensors on the device)."""
        k, width = advantages.shape[0], advantages.shape[1]
        dev = self.device
        rows = [width] * k if rows is None else [int(r) for r in rows]
        sizes_of = [[e - s for s, e in minibatch_bounds(r, a.hp.num_minibatches)] if r else []
                    for r, a in zip(rows, self.agents, strict=True)]
        epochs = [a.hp.update_epochs for a in self.agents]
        # the plan (host ints): each member's minibatches in order, as (epoch, start, size); round r takes each
        # member's r-th (a member past its last sits the round out)
        plans = [[(r // len(sz), sum(sz[: r % len(sz)]), sz[r % len(sz)]) for r in range(e * len(sz))]
                 for sz, e in zip(sizes_of, epochs, strict=True)]
        rounds, batch = max(len(p) for p in plans), max(max(sz, default=1) for sz in sizes_of)
        idle = (0, 0, 1)  # a member past its last minibatch: any rows (they weigh nothing)
        epoch_of, start, size = (torch.tensor([[p[r][j] if r < len(p) else idle[j] for p in plans]
                                               for r in range(rounds)], device=dev) for j in range(3))  # [rounds, K]
        planned = torch.tensor([[r < len(p) for p in plans] for r in range(rounds)], device=dev)
        everyone = [all(r < len(p) for p in plans) for r in range(rounds)]
        targets = [a.hp.target_kl for a in self.agents]
        kl_target = torch.tensor([math.inf if t is None else float(t) for t in targets], device=dev)
        may_stop = any(t is not None for t in targets)
        # epoch e of member i permutes its real rows by its stream's uniforms at counter base + 1 + e (the first
        # rows of [K, epochs, R]: a draw's leading values do not depend on its length); padding sorts last
        base = self.reserve_shuffles(max(epochs))
        real_rows = torch.tensor(rows, device=dev)
        u = uniform(self.stream.keys.unsqueeze(1), base + 1 + torch.arange(max(epochs), device=dev), width)
        if min(rows) < width:
            u = u.masked_fill(torch.arange(width, device=dev) >= real_rows.view(k, 1, 1), 2.0)
        perms = torch.argsort(u, dim=2, stable=True)
        col = torch.arange(batch, device=dev)
        last = (real_rows - 1).clamp(min=0).view(1, k, 1)
        position = epoch_of.unsqueeze(2) * width + torch.minimum(start.unsqueeze(2) + col, last)
        member = torch.arange(k, device=dev).view(k, 1)
        idx = perms.view(k, -1)[member, position]  # [rounds, K, batch]: each round's rows of every member

        def pick(x: torch.Tensor) -> torch.Tensor:  # [K, R, ...] -> every round's minibatches [rounds, K, batch, ...]
            return x[member, idx]

        valid = col < size.unsqueeze(2)  # [rounds, K, batch]: real rows (the others pad)
        weight = valid * (planned / size).unsqueeze(2)  # each row's share of its member's mean
        mb = {"actions": pick(data["actions"]), "logp": pick(data["logprobs"]), "values": pick(data["values"]),
              "adv": pick(advantages), "ret": pick(returns)}
        if "masks" in data:
            mb["masks"] = pick(data["masks"])
        if self.rnn is not None:  # rows are sequences: the loss weighs steps, each real step of a member alike
            mb = {key: v.flatten(2, 3) for key, v in mb.items()}  # [rounds, K, batch * L(, ...)]
            mb["starts"] = pick(data["starts"])
            mb.update({f"state/{name}": pick(data[f"state/{name}"]) for name in self.nets})
            steps = pick(data["valid"]) & (weight > 0).unsqueeze(3)
            weight = (steps / steps.sum((2, 3), keepdim=True).clamp(min=1)).flatten(2)
            valid = weight > 0
        row_dims = 1 if self.rnn is None else 2  # observations as member-major rows (then sequence, then step)
        stopped = torch.zeros(k, dtype=torch.bool, device=dev)
        loss_sum = torch.zeros(k, device=dev)
        kl_last = torch.zeros(k, device=dev)
        updates = torch.zeros(k, dtype=torch.long, device=dev)
        for r in range(rounds):
            f = {key: v[r] for key, v in mb.items()}
            f["obs"] = {key: v[member, idx[r]].flatten(0, row_dims) for key, v in data["obs"].items()}
            if "critic_obs" in data:
                f["critic_obs"] = {key: v[member, idx[r]].flatten(0, row_dims) for key, v in data["critic_obs"].items()}
            on, w, real = planned[r], weight[r], valid[r]
            if may_stop:
                on = on & ~stopped
                w, real = w * on.unsqueeze(1), real & on.unsqueeze(1)
            kl, loss = self._update(f, w, real, on, None if everyone[r] and not may_stop else on)
            loss_sum += loss * on
            updates += on
            kl_last = torch.where(on, kl, kl_last)
            if may_stop:
                stopped |= on & (kl > kl_target)
        return {"loss_sum": loss_sum, "approx_kl": kl_last, "updates": updates}

    def reserve_shuffles(self, epochs: int) -> int:
        """Counters for an update's shuffles: epoch e of every member permutes with counter base + 1 + e of its
        stream (the same whether the member updates alone or in a group). Returns base."""
        base = self.stream.counter
        self.stream.counter += epochs + 1
        return base

    def _update(self, f: dict, w: torch.Tensor, valid: torch.Tensor, active: torch.Tensor,
                step_active: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of the `active` [K] members on their stacked minibatches `f` (rows weighted `w`
        [K, B], `valid` marking real rows); `step_active` None: every member steps (the unmasked Adam).
        Returns ([K] approximate KL, [K] loss)."""
        ls_leaf = self.log_std.detach().clone().requires_grad_(True) if self.free_std else None
        actor, critic = self.nets["actor"], self.nets["critic"]
        # the trunks' backward by hand, the losses' autograd (gSDE's scales are read beside the outputs: autograd)
        hand = actor.hand_backward and critic.hand_backward and not self.gsde
        if self.gsde:
            a_out, latent = actor.forward_latent(f["obs"])
            c_out = critic(f.get("critic_obs", f["obs"]))
        elif self.rnn is not None:  # truncated BPTT over each sequence, from the state stored before it
            (a_out, _), (c_out, _) = sequences([actor, critic], f["obs"], [f["state/actor"], f["state/critic"]],
                                               f["starts"], self.seq_len)
        elif hand:
            a_out, a_saved = actor.forward_saving(f["obs"])
            c_out, c_saved = critic.forward_saving(f.get("critic_obs", f["obs"]))
            a_out.requires_grad_(True)
            c_out.requires_grad_(True)
        else:
            a_out, c_out = actor(f["obs"]), critic(f.get("critic_obs", f["obs"]))
        if self.gsde:
            p, ls = self.sde_distribution(a_out, latent)
        else:
            p, ls = policy_params(a_out, f.get("masks"), None if ls_leaf is None else ls_leaf.unsqueeze(1), self.dim)
        new_logp, entropy = log_prob_entropy(p, ls, f["actions"])
        adv = normalized_advantages(f["adv"], valid) if self.norm_adv else f["adv"]
        clip = self.clip.unsqueeze(1)
        vloss = value_loss(c_out.squeeze(2), f["ret"], f["values"], clip if self.clip_vloss else None, w)
        pg_loss, mean_entropy = ppo_loss(new_logp, f["logp"], adv, clip, w), (entropy * w).sum(1)
        losses = pg_loss - self.ent_coef * mean_entropy + self.vf_coef * vloss
        if hand:
            outs = torch.autograd.grad(losses.sum(), [a_out, c_out, *([ls_leaf] if self.free_std else [])],
                                       materialize_grads=True)
            grads = [actor.backward(a_saved, outs[0], out=self.adams["actor"].grad),
                     critic.backward(c_saved, outs[1], out=self.adams["critic"].grad), *outs[2:]]
        else:
            grads = gradients(losses.sum(), actor.leaves, critic.leaves, *([[ls_leaf]] if self.free_std else []))
        if self.free_std:
            grads[2] = grads[2].view_as(ls_leaf)
        norms = []
        for name, grad in zip(("actor", "critic"), grads, strict=False):
            adam = self.adams[name]
            adam.grad = grad
            if self.max_grad_norm is not None and name == "actor" and self.free_std:
                norms.append(adam.clip_grad_norm(self.max_grad_norm, grads[2]))  # log_std is clipped with its actor
                adam.step(step_active)
            else:
                norms.append(clipped_step(adam, self.max_grad_norm, step_active))
        if self.free_std:  # Adam with the actor's learning rate, as the member's own update
            adam_update_stacked_(self.log_std, grads[2], self.log_std_adam, self.lr, active)
        with torch.no_grad():
            log_ratio = new_logp.detach() - f["logp"]
            ratio_m1 = log_ratio.exp() - 1
            kl = ((ratio_m1 - log_ratio) * valid).sum(1) / valid.sum(1).clamp(min=1)
            clipped = (ratio_m1.abs() > clip) * w  # the rows whose ratio left [1 - c, 1 + c]
            self.metrics.add(step_active, loss=losses, pg_loss=pg_loss, value_loss=vloss, entropy=mean_entropy,
                             approx_kl=kl, clip_fraction=clipped.sum(1), actor_grad_norm=norms[0],
                             critic_grad_norm=norms[1])
        return kl, losses.detach()

    @torch.no_grad()
    def write_back(self) -> None:
        super().write_back()
        if self.continuous:
            for i, a in enumerate(self.agents):
                a.log_std.copy_(self.log_std[i])
                a.log_std_adam.copy_(self.log_std_adam[i])

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

import numpy as np
import torch

from agilerl_core.algorithms.group import MemberGroup, clipped_step, gradients
from agilerl_core.algorithms.optim import adam_update_stacked_
from agilerl_core.algorithms.ppo.maths import MinibatchSchedule, minibatch_bounds, normalized_advantages, ppo_loss, value_loss
from agilerl_core.networks.stacked import StackedNetwork
from agilerl_core.rng import uniform


class PPOGroup(MemberGroup):
    """K PPO members: stacked actor and critic (and, for Box actions, each member's state-independent log std)."""

    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        self.nets: dict[str, StackedNetwork] = {}
        for name in ("actor", "critic"):
            adam = self.adams[name]
            self.nets[name] = StackedNetwork([a.networks[name] for a in self.agents], adam.flat, adam.padded,
                                             trainable=True)
        self.continuous = first.continuous
        self.clip, self.ent_coef, self.vf_coef = (self.hp_tensor(n) for n in ("clip_coef", "ent_coef", "vf_coef"))
        self.norm_adv, self.clip_vloss, self.max_grad_norm = first.hp.norm_adv, first.hp.clip_vloss, first.hp.max_grad_norm
        self.log_std = torch.stack([a.log_std for a in self.agents]) if self.continuous else None
        self.log_std_adam = torch.stack([a.log_std_adam for a in self.agents]) if self.continuous else None
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

    # ---- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def policy_step(self, obs: Sequence, masks: Sequence, starts: Sequence | None = None,
                    critic_obs: Sequence | None = None) -> list[tuple]:
        """Every member's (actions, log-probs, values) for its envs' observations (one batch each, the same
        size), as :meth:`PPO.policy_step`: the actions sampled from each member's own generator. Recurrent
        members also give each network's state before the step ({name: [N, layers, S, H]}), and `starts`
        (per member, [N] bool) says which envs begin an episode at this step (their state is zeroed first).
        A centralised critic (MAPPO) values each member's `critic_obs` instead of its observations."""
        joined = self.joined(obs)
        before = None
        if self.rnn is None:
            out = self.nets["actor"](joined)
            values = self.nets["critic"](joined if critic_obs is None else self.joined(critic_obs)).squeeze(2)
        else:
            begin = torch.as_tensor(np.stack(starts), device=self.device).view(self.k, -1, 1)
            before = self.act_state
            out, actor_state = self.nets["actor"].sequence(joined, before["actor"], begin, 1)
            values, critic_state = self.nets["critic"].sequence(joined, before["critic"], begin, 1)
            values = values.squeeze(2)
            self.act_state = {"actor": actor_state, "critic": critic_state}
        mask = None if masks[0] is None else torch.stack(
            [torch.as_tensor(m, dtype=torch.bool, device=self.device) for m in masks])
        actions, logp = self.sample(out, mask)
        acts = actions.cpu().numpy()  # one read for the group: its callers step host envs with them
        states = None if before is None else {name: st.cpu() for name, st in before.items()}
        return [(acts[i], logp[i], values[i]) if states is None else
                (acts[i], logp[i], values[i], {name: st[i] for name, st in states.items()})
                for i in range(self.k)]

    @torch.no_grad()
    def sample(self, out: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's actions [K, N(, A)] sampled from its policy given the actor's outputs `out` [K, N, A]
        (`mask` [K, N, A]: allowed actions), one draw from the group's keyed stream, and their log-probs."""
        n = out.shape[1]
        first = self.agents[0]
        p, ls = first.dist_from(out, mask, None if self.log_std is None else self.log_std.unsqueeze(1))
        if self.continuous:
            actions = p + ls.exp() * self.stream.normal(n, p.shape[2])
        else:
            u = self.stream.uniform(n, 1)
            cdf = torch.softmax(p, dim=2).cumsum(dim=2)
            actions = (u > cdf).sum(dim=2).clamp(max=p.shape[2] - 1)
        logp, _ = first.log_prob_entropy_from(p, ls, actions)
        return actions, logp

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict | None]:
        """Every member's sampled actions [K, N(, A)], their log-probs [K, N] and the state values [K, N] for
        the group's observations (member-major [K * N, ...] tensors), the samples drawn from each member's
        keyed stream (one draw for the group, no host round trip). `mask` [K * N, A]: allowed actions.
        Recurrent members: `starts` [K, N] bool marks envs that begin an episode (their state is zeroed
        first); the fourth item is each network's state before the step ({name: [K, N, layers, S, H]})."""
        before = None
        if self.rnn is None:
            out = self.nets["actor"](obs)
            values = self.nets["critic"](obs).squeeze(2)
        else:
            before = self.act_state
            begin = starts.view(self.k, -1, 1)
            out, actor_state = self.nets["actor"].sequence(obs, before["actor"], begin, 1)
            values, critic_state = self.nets["critic"].sequence(obs, before["critic"], begin, 1)
            values = values.squeeze(2)
            self.act_state = {"actor": actor_state, "critic": critic_state}
        actions, logp = self.sample(out, None if mask is None else mask.view(self.k, out.shape[1], -1))
        return actions, logp, values, before

    @torch.no_grad()
    def greedy(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None, starts: torch.Tensor | None = None
               ) -> torch.Tensor:
        if self.rnn is None:
            out = self.nets["actor"](obs)
        else:  # the acting state advances (evaluation keeps no rollout)
            begin = starts.view(self.k, -1, 1)
            out, actor_state = self.nets["actor"].sequence(obs, self.act_state["actor"], begin, 1)
            self.act_state = {**self.act_state, "actor": actor_state}
        if self.continuous:
            return out
        p, _ = self.agents[0].dist_from(out, None if mask is None else mask.view(self.k, out.shape[1], -1))
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

    def explore(self, obs: Sequence, masks: Sequence) -> list[np.ndarray]:
        return [r[0] for r in self.policy_step(obs, masks)]

    @torch.no_grad()
    def value(self, i: int, obs, starts: np.ndarray | None = None) -> torch.Tensor:
        """Member i's V(s) [N] for a batch of its observations (a recurrent critic: from its current acting
        state, zeroed first where `starts` is set; the state is not advanced)."""
        critic = self.nets["critic"].member(i)
        if self.rnn is None:
            return critic(obs)[0, :, 0]
        begin = None if starts is None else torch.as_tensor(starts, device=self.device).view(1, -1, 1)
        return critic.sequence(obs, self.act_state["critic"][i: i + 1], begin, 1)[0][0, :, 0]

    # ---- learning -------------------------------------------------------------------------------------
    def learn_rollouts(self, datas: list[dict], advantages: list[torch.Tensor], returns: list[torch.Tensor]
                       ) -> list[dict[str, float]]:
        """Every member's PPO update on its own rollout rows (:meth:`PPO.rollout_rows`: their number may differ
        between members), advantages and returns; returns each member's statistics (mean loss, last approximate
        KL, updates taken)."""
        base = self.reserve_shuffles(max(a.hp.update_epochs for a in self.agents))
        keys = self.stream.keys
        schedules = [MinibatchSchedule(a, adv.shape[0], lambda e, n, i=i, dev=adv.device: torch.argsort(
                         uniform(keys[i], base + 1 + e, n), stable=True).to(dev))  # where the rows live
                     for i, (a, adv) in enumerate(zip(self.agents, advantages, strict=True))]
        stats = [{"loss": 0.0, "approx_kl": 0.0, "updates": 0} for _ in self.agents]
        while True:
            idxs = [s.next() for s in schedules]
            if all(i is None for i in idxs):
                break
            kl, loss = self.minibatch_step(datas, advantages, returns, idxs)
            for i, (s, idx) in enumerate(zip(schedules, idxs, strict=True)):
                if idx is None:
                    continue
                st = stats[i]
                st["loss"] += float(loss[i])
                st["approx_kl"] = float(kl[i])
                st["updates"] += 1
                target = self.agents[i].hp.target_kl
                if target is not None and st["approx_kl"] > target:
                    s.stopped = True
        for st in stats:
            st["loss"] /= max(st["updates"], 1)
        return stats

    def learn_stacked(self, data: dict, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every member's PPO update on its own rollout rows, stacked: `data` fields [K, R, ...] (``obs`` a dict
        of them), `advantages` and `returns` [K, R]. Each member keeps its own epochs, minibatch count and KL
        target; its shuffles are one permutation per epoch from its keyed stream, all members' drawn in one op,
        and each round's minibatches come from one gather. Nothing is read back to the host: returns each
        member's summed loss, last approximate KL and updates taken ([K] tensors on the device)."""
        k, rows = advantages.shape
        dev = self.device
        sizes_of = [[e - s for s, e in minibatch_bounds(rows, a.hp.num_minibatches)] for a in self.agents]
        counts = [len(sz) for sz in sizes_of]
        epochs = [a.hp.update_epochs for a in self.agents]
        rounds = max(e * c for e, c in zip(epochs, counts, strict=True))
        # the plan of every round (host ints, known before any work): each member's minibatch start and size,
        # whether it takes part, and whether a new epoch (a fresh permutation) begins for it
        start = torch.zeros(rounds, k, dtype=torch.long)
        size = torch.ones(rounds, k, dtype=torch.long)
        planned = torch.zeros(rounds, k, dtype=torch.bool)
        epoch_of = torch.zeros(rounds, k, dtype=torch.long)
        fresh = [False] * rounds
        for i, (sz, e) in enumerate(zip(sizes_of, epochs, strict=True)):
            c = len(sz)
            offsets = [sum(sz[:j]) for j in range(c)]
            for r in range(e * c):
                start[r, i], size[r, i], planned[r, i], epoch_of[r, i] = offsets[r % c], sz[r % c], True, r // c
                fresh[r] = fresh[r] or r % c == 0
        batch = max(max(sz) for sz in sizes_of)
        start, size, planned, epoch_of = (t.to(dev) for t in (start, size, planned, epoch_of))
        targets = [a.hp.target_kl for a in self.agents]
        kl_target = torch.tensor([math.inf if t is None else float(t) for t in targets], device=dev)
        may_stop = any(t is not None for t in targets)
        stopped = torch.zeros(k, dtype=torch.bool, device=dev)
        loss_sum = torch.zeros(k, device=dev)
        kl_last = torch.zeros(k, device=dev)
        updates = torch.zeros(k, dtype=torch.long, device=dev)
        col = torch.arange(batch, device=dev)
        stream = self.stream
        base = self.reserve_shuffles(max(epochs))
        perm = None
        for r in range(rounds):
            if fresh[r]:  # a member starting an epoch this round takes its epoch's permutation
                new = torch.argsort(uniform(stream.keys, base + 1 + epoch_of[r], rows), dim=1, stable=True)
                perm = new if perm is None else torch.where((start[r] == 0).unsqueeze(1), new, perm)
            idx = perm.gather(1, (start[r].unsqueeze(1) + col).clamp(max=rows - 1))
            on = planned[r] & ~stopped if may_stop else planned[r]
            valid = col < size[r].unsqueeze(1)
            w = valid * (on.unsqueeze(1) / size[r].unsqueeze(1))

            def pick(x: torch.Tensor, idx: torch.Tensor = idx) -> torch.Tensor:
                return x.gather(1, idx.view(k, batch, *([1] * (x.dim() - 2))).expand(k, batch, *x.shape[2:]))

            f = {"obs": {key: pick(v).flatten(0, 1) for key, v in data["obs"].items()},
                 "actions": pick(data["actions"]), "logp": pick(data["logprobs"]), "values": pick(data["values"]),
                 "adv": pick(advantages), "ret": pick(returns)}
            if "masks" in data:
                f["masks"] = pick(data["masks"])
            everyone = not may_stop and all(e * c > r for e, c in zip(epochs, counts, strict=True))
            kl, loss = self._update(f, w, valid & on.unsqueeze(1), on, None if everyone else on)
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

    def stack_rows(self, datas, advantages, returns, idxs) -> tuple[dict, torch.Tensor]:
        """Each member's minibatch rows padded to the largest: (fields [K, B, ...], weights [K, B]: 1 / its
        minibatch size, 0 on padding and for members without a minibatch)."""
        k = self.k
        b = max(i.shape[0] for i in idxs if i is not None)
        pad = [torch.zeros(b, dtype=torch.long, device=advantages[m].device) if i is None
               else torch.cat([i, i.new_zeros(b - i.shape[0])]) for m, i in enumerate(idxs)]
        w = torch.zeros(k, b, device=self.device)
        for m, i in enumerate(idxs):
            if i is not None:
                w[m, : i.shape[0]] = 1.0 / i.shape[0]

        def pick(get):
            return torch.stack([get(m).index_select(0, pad[m]) for m in range(k)]).to(self.device)

        f = {"obs": {key: pick(lambda m, key=key: datas[m]["obs"][key]) for key in datas[0]["obs"]},
             "actions": pick(lambda m: datas[m]["actions"]), "logp": pick(lambda m: datas[m]["logprobs"]),
             "values": pick(lambda m: datas[m]["values"]), "adv": pick(lambda m: advantages[m]),
             "ret": pick(lambda m: returns[m])}
        if "masks" in datas[0]:
            f["masks"] = pick(lambda m: datas[m]["masks"])
        if self.rnn is None:
            f["obs"] = {key: v.flatten(0, 1) for key, v in f["obs"].items()}
            if "critic_obs" in datas[0]:
                f["critic_obs"] = {key: pick(lambda m, key=key: datas[m]["critic_obs"][key]).flatten(0, 1)
                                   for key in datas[0]["critic_obs"]}
            return f, w
        # recurrent: rows are sequences [K, b, L]; each real step weighs 1 / its member's count of real steps
        steps = pick(lambda m: datas[m]["valid"]).float() * (w > 0).unsqueeze(2)
        w = (steps / steps.sum((1, 2), keepdim=True).clamp(min=1)).flatten(1)
        width = self.rnn[2]
        for name in self.nets:  # a state a member stored alone is as wide as its own core: padded with zeros
            f[f"state/{name}"] = pick(lambda m, name=name: torch.nn.functional.pad(
                datas[m][f"state/{name}"], (0, width - datas[m][f"state/{name}"].shape[-1])))
        f["starts"] = pick(lambda m: datas[m]["starts"])
        f["obs"] = {key: v.flatten(0, 2) for key, v in f["obs"].items()}
        for key in ("actions", "logp", "values", "adv", "ret", "masks"):
            if key in f:
                f[key] = f[key].flatten(1, 2)
        return f, w

    def minibatch_step(self, datas, advantages, returns, idxs) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of every member that has a minibatch (`idxs[i]`: its rows, or None); returns each
        member's ([K] approximate KL, [K] loss)."""
        f, w = self.stack_rows(datas, advantages, returns, idxs)
        active = torch.tensor([i is not None for i in idxs], device=self.device)
        kl, loss = self._update(f, w, w > 0, active, None if all(i is not None for i in idxs) else active)
        for i, a in enumerate(self.agents):
            if idxs[i] is not None:
                a.learn_steps += 1
        return kl, loss

    def _update(self, f: dict, w: torch.Tensor, valid: torch.Tensor, active: torch.Tensor,
                step_active: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of the `active` [K] members on their stacked minibatches `f` (rows weighted `w`
        [K, B], `valid` marking real rows); `step_active` None: every member steps (the unmasked Adam).
        Returns ([K] approximate KL, [K] loss)."""
        ls_leaf = self.log_std.detach().clone().requires_grad_(True) if self.continuous else None
        first = self.agents[0]
        actor, critic = self.nets["actor"], self.nets["critic"]
        hand = actor.hand_backward and critic.hand_backward  # the trunks' backward by hand, the losses' autograd
        if self.rnn is not None:  # truncated BPTT over each sequence, from the state stored before it
            a_out = actor.sequence(f["obs"], f["state/actor"], f["starts"], self.seq_len)[0]
            c_out = critic.sequence(f["obs"], f["state/critic"], f["starts"], self.seq_len)[0]
        elif hand:
            a_out, a_saved = actor.forward_saving(f["obs"])
            c_out, c_saved = critic.forward_saving(f.get("critic_obs", f["obs"]))
            a_out.requires_grad_(True)
            c_out.requires_grad_(True)
        else:
            a_out, c_out = actor(f["obs"]), critic(f.get("critic_obs", f["obs"]))
        p, ls = first.dist_from(a_out, f.get("masks"), None if ls_leaf is None else ls_leaf.unsqueeze(1))
        new_logp, entropy = first.log_prob_entropy_from(p, ls, f["actions"])
        adv = normalized_advantages(f["adv"], valid) if self.norm_adv else f["adv"]
        clip = self.clip.unsqueeze(1)
        vloss = value_loss(c_out.squeeze(2), f["ret"], f["values"], clip if self.clip_vloss else None, w)
        losses = ppo_loss(new_logp, f["logp"], adv, clip, w) - self.ent_coef * (entropy * w).sum(1) \
            + self.vf_coef * vloss
        if hand:
            outs = torch.autograd.grad(losses.sum(), [a_out, c_out, *([ls_leaf] if self.continuous else [])],
                                       materialize_grads=True)
            grads = [actor.backward(a_saved, outs[0], out=self.adams["actor"].grad),
                     critic.backward(c_saved, outs[1], out=self.adams["critic"].grad), *outs[2:]]
        else:
            grads = gradients(losses.sum(), actor.leaves, critic.leaves, *([[ls_leaf]] if self.continuous else []))
        if self.continuous:
            grads[2] = grads[2].view_as(ls_leaf)
        for name, grad in zip(("actor", "critic"), grads, strict=False):
            adam = self.adams[name]
            adam.grad = grad
            if self.max_grad_norm is not None and name == "actor" and self.continuous:
                adam.clip_grad_norm(self.max_grad_norm, grads[2])  # log_std is clipped with its actor
                adam.step(step_active)
            else:
                clipped_step(adam, self.max_grad_norm, step_active)
        if self.continuous:  # Adam with the actor's learning rate, as the member's own update
            adam_update_stacked_(self.log_std, grads[2], self.log_std_adam, self.lr, active)
        with torch.no_grad():
            log_ratio = new_logp.detach() - f["logp"]
            kl = (((log_ratio.exp() - 1) - log_ratio) * valid).sum(1) / valid.sum(1).clamp(min=1)
        return kl, losses.detach()

    @torch.no_grad()
    def write_back(self) -> None:
        super().write_back()
        if self.continuous:
            for i, a in enumerate(self.agents):
                a.log_std.copy_(self.log_std[i])
                a.log_std_adam.copy_(self.log_std_adam[i])

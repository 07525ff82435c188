"""PPO members learning as one population-batched group (:mod:`agilerl_core.algorithms.group`): one stacked
forward of every member's actor and critic to act and to score a minibatch, the members' losses summed so
one autograd backward gives each member its own gradients (their weights are independent), one Adam step
per network for the group. Each member keeps its own learning rate, clip range, entropy and value
coefficients, epochs, minibatch count, KL early stop, and its own shuffles and action samples (drawn from
its own generator), so its update is the one it takes alone, up to float rounding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from agilerl_core.algorithms.group import MemberGroup, stacked_blocks
from agilerl_core.algorithms.optim import adam_update_
from agilerl_core.networks.stacked import Layers, stacked_forward


def minibatch_bounds(n: int, num_minibatches: int) -> list[tuple[int, int]]:
    """(start, end) of `num_minibatches` minibatches covering `n` shuffled rows, sizes differing by at most one
    (never a tail of a few rows that would weigh as much as a whole minibatch); fewer when n is smaller."""
    m = max(1, min(num_minibatches, n))
    size, extra = divmod(n, m)
    out, start = [], 0
    for i in range(m):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out



class _Schedule:
    """One member's minibatches of a rollout update, drawn as its own learn_rollout draws them: a fresh
    permutation at each epoch's start, split into `num_minibatches` near-equal minibatches, until its epochs end or its
    approximate KL passes target_kl."""

    def __init__(self, agent, n: int) -> None:
        self.agent, self.n = agent, n
        self.bounds = minibatch_bounds(n, agent.hp.num_minibatches)
        self.epoch, self.pos, self.perm, self.stopped = 0, len(self.bounds), None, False

    def next(self) -> torch.Tensor | None:
        if self.stopped:
            return None
        if self.pos >= len(self.bounds):
            if self.perm is not None:
                self.epoch += 1
            if self.epoch >= self.agent.hp.update_epochs:
                self.stopped = True
                return None
            self.perm, self.pos = torch.randperm(self.n, generator=self.agent.torch_gen), 0
        start, end = self.bounds[self.pos]
        self.pos += 1
        return self.perm[start: end]


class PPOGroup(MemberGroup):
    def __init__(self, agents: Sequence) -> None:
        super().__init__(agents)
        first = self.agents[0]
        self.actor, self.critic = self.adams["actor"], self.adams["critic"]
        self.continuous = first.continuous
        self.clip, self.ent_coef, self.vf_coef = (self.hp_tensor(n) for n in ("clip_coef", "ent_coef", "vf_coef"))
        self.norm_adv, self.clip_vloss, self.max_grad_norm = first.hp.norm_adv, first.hp.clip_vloss, first.hp.max_grad_norm
        self.log_std = torch.stack([a.log_std for a in self.agents]) if self.continuous else None

    # ---- acting ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def policy_step(self, obs: Sequence, masks: Sequence) -> list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
        """Every member's (actions, log-probs, values) for its envs' observations, as PPO.policy_step."""
        x = self.stacked_obs(obs)
        out = stacked_forward(self.actor.layers, x, self.activation)
        values = stacked_forward(self.critic.layers, x, self.activation).squeeze(2)
        res = []
        for i, a in enumerate(self.agents):
            mask = None if masks[i] is None else torch.as_tensor(masks[i], dtype=torch.bool, device=self.device)
            actions, logp = a.sample_from(*a.dist_from(out[i], mask, None if self.log_std is None else self.log_std[i]))
            res.append((actions, logp, values[i]))
        return res

    def explore(self, obs: Sequence, masks: Sequence) -> list[np.ndarray]:
        return [r[0] for r in self.policy_step(obs, masks)]

    @torch.no_grad()
    def value(self, i: int, obs) -> torch.Tensor:
        """Member i's V(s) for a batch of observations (its row of the stacked critic)."""
        layers = [(w[i: i + 1], b[i: i + 1]) for w, b in self.critic.layers]
        return stacked_forward(layers, self.net.features(obs).unsqueeze(0), self.activation)[0, :, 0]

    # ---- learning -------------------------------------------------------------------------------------
    def learn_rollouts(self, datas: list[dict], advantages: list[torch.Tensor], returns: list[torch.Tensor]
                       ) -> list[dict[str, float]]:
        """Every member's PPO update on its own rollout rows (:meth:`PPO.rollout_rows`: their number may differ
        between members), advantages and returns; returns each member's loss statistics, as PPO.learn_rollout."""
        schedules = [_Schedule(a, adv.shape[0]) for a, adv in zip(self.agents, advantages, strict=True)]
        stats = [{"loss": 0.0, "approx_kl": 0.0, "updates": 0} for _ in self.agents]
        while True:
            idxs = [s.next() for s in schedules]
            if all(i is None for i in idxs):
                break
            kl = self._minibatch_step(datas, advantages, returns, idxs)
            for i, (s, idx) in enumerate(zip(schedules, idxs, strict=True)):
                if idx is None:
                    continue
                st = stats[i]
                st["loss"] += float(kl[1][i])
                st["approx_kl"] = float(kl[0][i])
                st["updates"] += 1
                target = self.agents[i].hp.target_kl
                if target is not None and st["approx_kl"] > target:
                    s.stopped = True
        for st in stats:
            st["loss"] /= max(st["updates"], 1)
        return stats

    def _stack(self, datas, advantages, returns, idxs):
        """Each member's minibatch rows padded to the largest: (fields [K, B, ...], weights [K, B])."""
        k = self.k
        b = max(i.shape[0] for i in idxs if i is not None)
        pad = [torch.zeros(b, dtype=torch.long) if i is None else torch.cat([i, i.new_zeros(b - i.shape[0])])
               for i in idxs]
        w = torch.zeros(k, b, device=self.device)
        for m, i in enumerate(idxs):
            if i is not None:
                w[m, : i.shape[0]] = 1.0 / i.shape[0]

        def pick(get):
            return torch.stack([get(m).index_select(0, pad[m]) for m in range(k)]).to(self.device)

        obs = {key: pick(lambda m, key=key: datas[m]["obs"][key]) for key in datas[0]["obs"]}
        f = {"obs": obs, "actions": pick(lambda m: datas[m]["actions"]), "logp": pick(lambda m: datas[m]["logprobs"]),
             "values": pick(lambda m: datas[m]["values"]), "adv": pick(lambda m: advantages[m]),
             "ret": pick(lambda m: returns[m])}
        if "masks" in datas[0]:
            f["masks"] = pick(lambda m: datas[m]["masks"])
        return f, w

    def _minibatch_step(self, datas, advantages, returns, idxs) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of every member that has a minibatch; returns ([K] approx KL, [K] loss)."""
        k = self.k
        f, w = self._stack(datas, advantages, returns, idxs)
        b = w.shape[1]
        valid = w > 0
        active = torch.tensor([i is not None for i in idxs], device=self.device)
        x = self.net.features({key: v.reshape(k * b, *v.shape[2:]) for key, v in f["obs"].items()}).view(k, b, -1)
        leaves = {n: a.flat.detach().requires_grad_(True) for n, a in (("actor", self.actor), ("critic", self.critic))}
        layers: dict[str, Layers] = {n: stacked_blocks(leaf, k, self.adams[n].padded) for n, leaf in leaves.items()}
        ls_leaf = self.log_std.detach().clone().requires_grad_(True) if self.continuous else None
        with torch.enable_grad():
            out = stacked_forward(layers["actor"], x, self.activation)
            v = stacked_forward(layers["critic"], x, self.activation).squeeze(2)
            first = self.agents[0]
            p, ls = first.dist_from(out, f.get("masks"), None if ls_leaf is None else ls_leaf.unsqueeze(1))
            new_logp, entropy = first.log_prob_entropy_from(p, ls, f["actions"])
            adv = f["adv"]
            if self.norm_adv:
                count = valid.sum(1, keepdim=True)
                mean = (adv * valid).sum(1, keepdim=True) / count.clamp(min=1)
                var = ((adv - mean).square() * valid).sum(1, keepdim=True) / (count - 1).clamp(min=1)
                adv = torch.where(count > 1, (adv - mean) / (var.sqrt() + 1e-8), adv)
            ratio = (new_logp - f["logp"]).exp()
            clip = self.clip.unsqueeze(1)
            pg = (torch.max(-adv * ratio, -adv * torch.minimum(torch.maximum(ratio, 1.0 - clip), 1.0 + clip)) * w).sum(1)
            unclipped = (v - f["ret"]).square()
            if self.clip_vloss:
                clipped = (f["values"] + torch.minimum(torch.maximum(v - f["values"], -clip), clip) - f["ret"]).square()
                unclipped = torch.max(unclipped, clipped)
            vloss = 0.5 * (unclipped * w).sum(1)
            losses = pg - self.ent_coef * (entropy * w).sum(1) + self.vf_coef * vloss
            losses.sum().backward()
        step_active = None if bool(active.all()) else active
        for n, adam in (("actor", self.actor), ("critic", self.critic)):
            adam.grad.copy_(leaves[n].grad)
            if self.max_grad_norm is not None:  # log_std is clipped with its actor, as in the member's own update
                adam.clip_grad_norm(self.max_grad_norm, ls_leaf.grad if n == "actor" and self.continuous else None)
            adam.step(step_active)
        for i, a in enumerate(self.agents):
            if idxs[i] is None:
                continue
            if self.continuous:  # Adam with the actor's learning rate, as the member's own update
                adam_update_(self.log_std[i], ls_leaf.grad[i], a.log_std_adam, a.hp.lr)
            a.learn_steps += 1
        with torch.no_grad():
            log_ratio = new_logp.detach() - f["logp"]
            kl = ((((log_ratio.exp() - 1) - log_ratio) * valid).sum(1) / valid.sum(1).clamp(min=1))
        return kl, losses.detach()

    def write_back(self) -> None:
        super().write_back()
        if self.continuous:
            for i, a in enumerate(self.agents):
                a.log_std.copy_(self.log_std[i])

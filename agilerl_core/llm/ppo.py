"""LLM-PPO: PPO on language-model completions (Ouyang et al. 2022's RLHF recipe, with verifiable rewards) for a
LoRA adapter on the shared base, with a value head on the same adapted model.

One learn step: ``batch_size`` prompts, ``group_size`` completions each (sampled as GRPO samples them); the
member's value head (a linear map of the last hidden layer) values the state before every completion token.
Every token's reward is ``-beta * (log pi_old - log pi_ref)`` (the KL to the base, as a per-token penalty), plus the
completion's reward on its last token; token-level GAE (``gamma``, ``gae_lambda``) over each completion gives
advantages (whitened over the member's tokens) and returns. Then ``update_epochs`` passes over the micro-batches
of the clipped surrogate plus ``vf_coef`` times the (clipped, ``value_clip``) value loss; the adapter and the head
take one Adam step per pass. The value head trains through the adapter it shares with the policy.

A member's checkpoint holds the adapter, the head and the Adam moments of both; rank mutations and crossovers act
on the adapter and keep the head. Everything else (the group's rows through one forward of the base, sampling
with each member's own generator, evaluation) is GRPO's.
"""

from __future__ import annotations

import numpy as np
import torch

from agilerl_core.algorithms.hyperparameters.llm import LLMPPOHyperparameters
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.grpo import GRPO, PromptData, grpo_token_loss, k3_kl
from agilerl_core.llm.learning import token_gae  # noqa: F401 (LLM-PPO's GAE, written beside the rollouts)
from agilerl_core.llm.rewards import Rewards


def clipped_value_loss(values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Per-token 0.5 (V - R)^2, or with `clip` 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)."""
    loss = (values - returns).square()
    if clip is not None:
        loss = torch.max(loss, (old + (values - old).clamp(-clip, clip) - returns).square())
    return 0.5 * loss


class LLMPPO(GRPO):
    hp_model = LLMPPOHyperparameters
    algorithm_name = "llm_ppo"

    @classmethod
    def new_head(cls, base: SharedBase) -> dict[str, torch.Tensor]:
        """A zero value head (V = 0 at first) on the base's hidden size."""
        width = int(base.model.config.hidden_size)
        return {"value.weight": torch.zeros(width, device=base.device),
                "value.bias": torch.zeros(1, device=base.device)}

    def value_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values [..., T] of hidden states [..., T, H]."""
        return hidden @ self.head["value.weight"] + self.head["value.bias"]

    @staticmethod
    def learn_group(members: list[LLMPPO], batches: list[list[int]], data: PromptData, rewards: Rewards,
                    generators: list[torch.Generator], kl_metric: bool = True) -> list[dict[str, float]]:
        """One LLM-PPO step of each member on its own batch of prompts; returns each one's metrics. The group's
        rows share the base's forwards as in :meth:`GRPO.learn_group`; rewards, GAE, whitening and losses are each
        member's own."""
        first = members[0]
        base, k = first.base, len(members)
        hps = [m.hp for m in members]
        with base.bound_many([m.adapter for m in members]) as model:
            roll = data.rollout(model, members, batches, rewards, generators)
            parts, fmask, ntok = roll.parts, roll.fmask, roll.ntok
            shapes = [c[0].shape for c in roll.comps]
            old_lp = [torch.zeros(s, device=base.device) for s in shapes]
            old_v = [torch.zeros(s, device=base.device) for s in shapes]
            ref_lp = [torch.zeros(s, device=base.device) for s in shapes]
            use_ref = any(h.beta > 0 for h in hps) or kl_metric
            with torch.no_grad():  # the rollout's log-probs, values and reference log-probs, scattered per member
                for piece in parts:
                    lps, vals = roll.forward(piece, values=True)
                    refs = roll.forward(piece, reference=True) if use_ref else lps
                    for (i, s), lp, v, ref in zip(piece, lps, vals, refs, strict=True):
                        old_lp[i][s], old_v[i][s], ref_lp[i][s] = lp, v, ref
            adv, ret, kls = [], [], []
            for i, h in enumerate(hps):
                kl = (old_lp[i] - ref_lp[i]) * fmask[i]
                tok_r = roll.place_rewards(i, -h.beta * kl)
                a, r_ = roll.gae(i, tok_r, old_v[i], h.gamma, h.gae_lambda)
                if h.norm_adv:
                    count = fmask[i].sum().clamp(min=1)
                    mean = (a * fmask[i]).sum() / count
                    std = (((a - mean) * fmask[i]).square().sum() / count).sqrt()
                    a = (a - mean) / (std + 1e-8) * fmask[i]
                adv.append(a)
                ret.append(r_)
                kls.append(float((k3_kl(old_lp[i], ref_lp[i]) * fmask[i]).sum() / ntok[i]) if use_ref else float("nan"))
            sums = [[0.0, 0.0] for _ in members]  # policy loss, value loss
            norms = [0.0] * k
            for epoch in range(max(h.update_epochs for h in hps)):
                for piece in parts:
                    live = [n for n, (i, _) in enumerate(piece) if epoch < hps[i].update_epochs]
                    if not live:
                        continue
                    logps, vals = roll.forward([piece[n] for n in live], values=True)
                    losses = []
                    for n, logp, v in zip(live, logps, vals, strict=True):
                        i, s = piece[n]
                        h = hps[i]
                        pg = grpo_token_loss(logp, old_lp[i][s], None, adv[i][s], h.clip, 0.0)
                        vl = clipped_value_loss(v, old_v[i][s], ret[i][s], h.value_clip)
                        pg_sum, vl_sum = ((pg * fmask[i][s]).sum() / ntok[i], (vl * fmask[i][s]).sum() / ntok[i])
                        losses.append(pg_sum + h.vf_coef * vl_sum)
                        if epoch == 0:
                            sums[i][0] += float(pg_sum.detach())
                            sums[i][1] += float(vl_sum.detach())
                    (losses[0] if len(losses) == 1 else torch.stack(losses).sum()).backward()
                for i, m in enumerate(members):
                    if epoch < hps[i].update_epochs:
                        norms[i] = m._step()
        out = []
        for i, m in enumerate(members):
            pg_sum, vl_sum = m.summed(*sums[i])
            r = roll.rewards[i]
            out.append({"reward": float(np.mean(r)), "reward_std": float(np.std(r)), "loss": pg_sum, "value_loss": vl_sum,
                        "kl": kls[i], "completion_length": float(fmask[i].sum(dim=1).mean()), "grad_norm": norms[i]})
        return out

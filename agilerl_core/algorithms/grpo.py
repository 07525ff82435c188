"""GRPO (Group Relative Policy Optimisation) with verifiable rewards, for a LoRA adapter on the shared base.

One learn step: ``batch_size`` prompts, ``group_size`` completions each (sampled with a KV cache at
``temperature``), rewards from the config's reward functions, advantages normalised within each prompt's group,
then ``update_epochs`` passes of the clipped-ratio loss plus ``beta`` times the k3 estimate of the KL to the
reference policy (the base with the adapter disabled). The loss is token-level: every completion token of the
batch weighs the same, whatever its completion's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from agilerl_core.algorithms.hyperparameters.llm import GRPOHyperparameters
from agilerl_core.algorithms.llm_base import LLMAlgorithm, PhaseMetrics, chunks
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.rewards import Rewards
from agilerl_core.llm.sampling import completion_logprobs, sample


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """Each reward minus its group's mean, over the group's standard deviation (groups are consecutive runs
    of `group_size`); a group whose rewards are all equal gets zero advantages."""
    r = rewards.reshape(-1, group_size)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True, correction=0) + eps)
    return adv.reshape(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    diff = ref_logp - logp
    return torch.exp(diff) - diff - 1


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, clip: float, beta: float) -> torch.Tensor:
    """Per-token loss [batch, T]: the clipped surrogate -min(ratio A, clip(ratio) A), plus beta k3 when
    `ref_logp` is given and beta > 0."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None]
    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    if ref_logp is not None and beta > 0:
        loss = loss + beta * k3_kl(logp, ref_logp)
    return loss


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class PromptData:
    """Prompts as token ids (the chat template applied when configured), their texts and answers."""

    ids: list[list[int]]
    prompts: list[str]
    answers: list[str | None]

    def __len__(self) -> int:
        return len(self.ids)


def _pad_right(parts: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(c.shape[1] for c, _ in parts)
    ids = torch.cat([F.pad(c, (0, width - c.shape[1]), value=pad_id) for c, _ in parts])
    mask = torch.cat([F.pad(m, (0, width - m.shape[1]), value=0) for _, m in parts])
    return ids, mask


class GRPO(LLMAlgorithm):
    hp_model = GRPOHyperparameters
    algorithm_name = "grpo"
    data_kind = "prompts"

    @staticmethod
    def prepare(base: SharedBase, records: Any, chat_template: bool) -> PromptData:
        answers = records.answers if records.answers is not None else [None] * len(records)
        return PromptData(base.encode(records.prompts, chat_template), list(records.prompts), list(answers))

    def batch_key(self) -> tuple | None:
        return (self.algorithm_name, self.hp.max_new_tokens)

    # ---- training ----------------------------------------------------------------------------------------
    def train_phase(self, data: PromptData, rewards: Rewards, budget: int, seed: int, kl_metric: bool = True
                    ) -> PhaseMetrics:
        """Learn steps until `budget` completions were sampled (the last step is whole)."""
        gen = torch.Generator().manual_seed(seed)

        def learn_on(idx: list[int]) -> tuple[int, dict[str, float]]:
            step = self.learn([data.ids[i] for i in idx], [data.prompts[i] for i in idx],
                              [data.answers[i] for i in idx], rewards, gen, kl_metric)
            return len(idx) * self.hp.group_size, step

        return self._run_phase(len(data), budget, seed, learn_on)

    def learn(self, prompt_ids: list[list[int]], prompts: list[str], answers: list[str | None], rewards: Rewards,
              generator: torch.Generator, kl_metric: bool = True) -> dict[str, float]:
        """One GRPO step on a batch of prompts; returns its metrics (mean reward, KL, completion length...)."""
        hp, base = self.hp, self.base
        g = hp.group_size
        ids, mask = self.prompt_batch([p for p in prompt_ids for _ in range(g)])
        parts = chunks(ids.shape[0], hp.micro_batch_size)
        with base.bound(self.adapter) as model:
            comp, cmask = _pad_right([sample(model, ids[s], mask[s], hp.max_new_tokens, hp.temperature, base.eos_id,
                                             base.pad_id, generator)
                                      for s in chunks(ids.shape[0], hp.generation_batch_size)], base.pad_id)
            texts = base.decode(comp, cmask)
            r = rewards(texts, [a for a in answers for _ in range(g)], [p for p in prompts for _ in range(g)])
            adv = group_advantages(torch.as_tensor(r, dtype=torch.float32), g).to(ids.device)
            fmask = cmask.float()
            ntok = fmask.sum().clamp(min=1)
            ref = old = None
            temp = hp.temperature  # the sampling policy's: ratio, KL and gradient all belong to it
            with torch.no_grad():
                if hp.beta > 0 or kl_metric:
                    with base.reference():
                        ref = torch.cat([completion_logprobs(model, ids[s], mask[s], comp[s], cmask[s], temp) for s in parts])
                if hp.update_epochs > 1:
                    old = torch.cat([completion_logprobs(model, ids[s], mask[s], comp[s], cmask[s], temp) for s in parts])
            loss_sum, kl_sum, norm = 0.0, 0.0, 0.0
            for epoch in range(hp.update_epochs):
                for s in self.my_parts(parts):
                    logp = completion_logprobs(model, ids[s], mask[s], comp[s], cmask[s], temp)
                    ref_s = None if ref is None else ref[s]
                    tok = grpo_token_loss(logp, logp.detach() if old is None else old[s], ref_s, adv[s], hp.clip,
                                          hp.beta)
                    loss = (tok * fmask[s]).sum() / ntok
                    loss.backward()
                    if epoch == 0:
                        loss_sum += float(loss.detach())
                        if ref_s is not None:
                            kl_sum += float((k3_kl(logp.detach(), ref_s) * fmask[s]).sum() / ntok)
                norm = self._step()
            loss_sum, kl_sum = self.summed(loss_sum, kl_sum)
        return {"reward": float(np.mean(r)), "reward_std": float(np.std(r)), "loss": loss_sum,
                "kl": kl_sum if ref is not None else float("nan"),
                "completion_length": float(fmask.sum(dim=1).mean()), "grad_norm": norm}

    # ---- fitness -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, data: PromptData, rewards: Rewards, n_samples: int = 0) -> float:
        """Mean reward of greedy completions of the held-out prompts; keeps the first `n_samples` as
        :attr:`samples`."""
        hp, base = self.hp, self.base
        ids, mask = self.prompt_batch(data.ids)
        with base.bound(self.adapter) as model:
            texts: list[str] = []
            for s in chunks(len(data), hp.generation_batch_size):
                comp, cmask = sample(model, ids[s], mask[s], hp.max_new_tokens, 0.0, base.eos_id, base.pad_id)
                texts += base.decode(comp, cmask)
        return self._score(texts, data, rewards, n_samples)

    @staticmethod
    @torch.no_grad()
    def evaluate_many(members: list[GRPO], data: PromptData, rewards: Rewards, n_samples: int = 0) -> list[float]:
        """:meth:`evaluate` of several members (one base, equal generation settings) in shared batches: each
        chunk of the held-out prompts is generated for every member at once, each row through its member's
        adapter, so the base runs once per chunk instead of once per member. The completions are each
        member's own greedy ones (equal up to float rounding)."""
        first = members[0]
        hp, base = first.hp, first.base
        if any(m.hp.max_new_tokens != hp.max_new_tokens or m.base is not base for m in members):
            raise ValueError("evaluate_many: members must share the base and max_new_tokens")
        ids, mask = first.prompt_batch(data.ids)
        k = len(members)
        texts: list[list[str]] = [[] for _ in members]
        with base.bound_many([m.adapter for m in members]) as (model, names):
            for s in chunks(len(data), hp.generation_batch_size):
                rows = ids[s].shape[0]
                comp, cmask = sample(model, ids[s].repeat(k, 1), mask[s].repeat(k, 1), hp.max_new_tokens, 0.0,
                                     base.eos_id, base.pad_id, adapter_names=[n for n in names for _ in range(rows)])
                decoded = base.decode(comp, cmask)
                for i in range(k):
                    texts[i] += decoded[i * rows:(i + 1) * rows]
        return [m._score(t, data, rewards, n_samples) for m, t in zip(members, texts, strict=True)]

    def _score(self, texts: list[str], data: PromptData, rewards: Rewards, n_samples: int) -> float:
        """Mean reward of the held-out completions `texts`; keeps the first `n_samples` as :attr:`samples`."""
        r = rewards(texts, data.answers, data.prompts)
        self.samples = [{"prompt": p, "completion": c, "answer": a, "reward": float(x)}
                        for p, c, a, x in list(zip(data.prompts, texts, data.answers, r, strict=True))[:n_samples]]
        return float(np.mean(r))

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
from agilerl_core.llm.algorithm import LLMAlgorithm
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.learning import PhaseMetrics, chunks, row_pieces, token_gae
from agilerl_core.llm.rewards import Rewards
from agilerl_core.llm.sampling import RowBlock, completion_logprobs, pad_prompts, sample


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
    `ref_logp` is given and beta > 0. `advantages`: one per completion [batch], or per token [batch, T]."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
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

    def rollout(self, model, members: list, batches: list[list[int]], rewards: Rewards,
                generators: list[torch.Generator]) -> GroupRollout:
        """One learn step's completions of the members' batches (see :class:`GroupRollout`)."""
        return GroupRollout(model, members, batches, self, rewards, generators)


def _pad_right(parts: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(c.shape[1] for c, _ in parts)
    ids = torch.cat([F.pad(c, (0, width - c.shape[1]), value=pad_id) for c, _ in parts])
    mask = torch.cat([F.pad(m, (0, width - m.shape[1]), value=0) for _, m in parts])
    return ids, mask


class GroupRollout:
    """One learn step's completions for a group of members, each on its own prompts, inside the group's bound
    model (:meth:`~agilerl_core.llm.base_model.SharedBase.bound_many`): what GRPO, REINFORCE and LLM-PPO share.

    Member i samples at its own temperature from generators[i], its rows in the chunks (of
    ``generation_batch_size``) and the order it samples them alone; its completions are scored by `rewards`.
    :attr:`parts` cuts every member's rows into micro-batches of ``micro_batch_size`` rows across members, and
    :meth:`forward` scores a micro-batch's completions (each row through its member's adapter)."""

    def __init__(self, model, members: list, batches: list[list[int]], data: PromptData, rewards: Rewards,
                 generators: list[torch.Generator]) -> None:
        first = members[0]
        base, k = first.base, len(members)
        hps = [m.hp for m in members]
        if any(m.base is not base or h.max_new_tokens != hps[0].max_new_tokens for m, h in zip(members, hps, strict=True)):
            raise ValueError("learn_group: members must share the base and max_new_tokens")
        self.model, self.members, self.base, self.hps = model, members, base, hps
        rows = [[data.ids[p] for p in idx for _ in range(h.group_size)] for idx, h in zip(batches, hps, strict=True)]
        width = max(len(r) for member_rows in rows for r in member_rows)  # every prompt left-padded alike
        self.prompts = [pad_prompts(r, base.pad_id, base.device, width) for r in rows]
        # sampling: the j-th chunk of every member's rows in one batch
        cuts = [chunks(len(r), h.generation_batch_size) for r, h in zip(rows, hps, strict=True)]
        pieces: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in members]
        for j in range(max(len(c) for c in cuts)):
            who = [i for i in range(k) if j < len(cuts[i])]
            blocks, start = [], 0
            for i in who:
                n = cuts[i][j].stop - cuts[i][j].start
                blocks.append(RowBlock(slice(start, start + n), hps[i].temperature, generators[i]))
                start += n
            ids, mask = self.joined([(i, cuts[i][j]) for i in who])
            comp, cmask = sample(model, ids, mask, hps[0].max_new_tokens, 0.0, base.eos_id, base.pad_id,
                                 rows=[(i, b.rows.stop - b.rows.start) for i, b in zip(who, blocks, strict=True)],
                                 blocks=blocks)
            for i, b in zip(who, blocks, strict=True):
                pieces[i].append((comp[b.rows], cmask[b.rows]))
        self.comps = [_pad_right(p, base.pad_id) for p in pieces]
        self.rewards: list[np.ndarray] = []
        for i, (idx, h) in enumerate(zip(batches, hps, strict=True)):
            texts = base.decode(*self.comps[i])
            g = h.group_size
            self.rewards.append(rewards(texts, [data.answers[p] for p in idx for _ in range(g)],
                                        [data.prompts[p] for p in idx for _ in range(g)]))
        self.fmask = [c[1].float() for c in self.comps]
        self.ntok = [f.sum().clamp(min=1) for f in self.fmask]
        self.parts = LLMAlgorithm.group_parts(members, row_pieces([len(x) for x in rows], hps[0].micro_batch_size))

    def place_rewards(self, i: int, token_rewards: torch.Tensor) -> torch.Tensor:
        """Member i's completion rewards added on each completion's last token (LLM-PPO's token rewards)."""
        last = (self.fmask[i].sum(1).long() - 1).clamp(min=0)
        token_rewards[torch.arange(len(last)), last] += torch.as_tensor(self.rewards[i], dtype=torch.float32,
                                                                        device=token_rewards.device)
        return token_rewards

    def gae(self, i: int, token_rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-level GAE over each of member i's completions."""
        return token_gae(token_rewards, values * self.fmask[i], self.fmask[i], gamma, lam)

    def joined(self, segments: list[tuple[int, slice]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts (ids, mask) of (member, rows) segments, in order."""
        prompts = self.prompts
        if len(segments) == 1:
            i, s = segments[0]
            return prompts[i][0][s], prompts[i][1][s]
        return (torch.cat([prompts[i][0][s] for i, s in segments]),
                torch.cat([prompts[i][1][s] for i, s in segments]))

    def forward(self, piece: list[tuple[int, slice]], reference: bool = False, values: bool = False):
        """Each member's completion log-probs [its rows in the piece, its width], at the temperature it sampled at
        (the reference: the base alone, scored likewise); with `values`, also each member's values of the states
        before every completion token (its value head on the last hidden layer): (log-probs, values)."""
        comps, hps, base, k = self.comps, self.hps, self.base, len(self.members)
        ids, mask = self.joined(piece)
        comp, cmask = _pad_right([(comps[i][0][s], comps[i][1][s]) for i, s in piece], base.pad_id)
        temp = hps[piece[0][0]].temperature if k == 1 else torch.tensor(
            [hps[i].temperature for i, s in piece for _ in range(s.stop - s.start)])
        blocks = [(i, s.stop - s.start) for i, s in piece]
        if reference:
            with base.reference():
                lp = completion_logprobs(self.model, ids, mask, comp, cmask, temp, blocks)
            hidden = None
        elif values:
            lp, hidden = completion_logprobs(self.model, ids, mask, comp, cmask, temp, blocks, hidden=True)
        else:
            lp, hidden = completion_logprobs(self.model, ids, mask, comp, cmask, temp, blocks), None
        out, vals, start = [], [], 0
        for i, s in piece:
            n, w = s.stop - s.start, comps[i][0].shape[1]
            out.append(lp[start:start + n, :w])
            if hidden is not None:
                vals.append(self.members[i].value_of(hidden[start:start + n, :w]))
            start += n
        return (out, vals) if values else out


class GRPO(LLMAlgorithm):
    hp_model = GRPOHyperparameters
    algorithm_name = "grpo"
    data_kind = "prompts"

    @staticmethod
    def advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """Each completion's advantage from the rewards of its prompt's group (consecutive runs of
        `group_size`): GRPO's group-normalised rewards."""
        return group_advantages(rewards, group_size)

    @staticmethod
    def prepare(base: SharedBase, records: Any, chat_template: bool) -> PromptData:
        answers = records.answers if records.answers is not None else [None] * len(records)
        return PromptData(base.encode(records.prompts, chat_template), list(records.prompts), list(answers))

    def batch_key(self) -> tuple | None:
        return (self.algorithm_name, self.hp.max_new_tokens)  # one sampling loop for the group

    @staticmethod
    def piece_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, hp: GRPOHyperparameters, ntok, nseq: int
                   ) -> torch.Tensor:
        """A micro-batch piece's share of its member's loss (`mask` [rows, T]: its completion tokens; `ntok`: the
        member's completion tokens in the whole step, `nseq` its completions): GRPO's token-level clipped surrogate
        plus beta k3, every completion token of the step weighing the same. GSPO and CISPO change only this."""
        return (grpo_token_loss(logp, old_logp, ref_logp, advantages, hp.clip, hp.beta) * mask).sum() / ntok

    # ---- training ----------------------------------------------------------------------------------------
    @staticmethod
    def train_group(members: list[GRPO], data: PromptData, rewards: Rewards, budget: int, seeds: list[int],
                    kl_metric: bool = True) -> list[PhaseMetrics]:
        """Every member's training phase (:meth:`train_phase`), their learn steps taken together
        (:meth:`learn_group`); member i's prompt batches and samples come from seeds[i] alone."""
        gens = [torch.Generator().manual_seed(s) for s in seeds]

        def step(who: list[int], batches: list[list[int]]) -> list[tuple[int, dict[str, float]]]:
            group = [members[i] for i in who]
            values = type(members[0]).learn_group(group, batches, data, rewards, [gens[i] for i in who], kl_metric)
            return [(len(b) * m.hp.group_size, v) for m, b, v in zip(group, batches, values, strict=True)]

        return LLMAlgorithm.run_group_phase(members, len(data), budget, seeds, step)

    @staticmethod
    def learn_group(members: list[GRPO], batches: list[list[int]], data: PromptData, rewards: Rewards,
                    generators: list[torch.Generator], kl_metric: bool = True) -> list[dict[str, float]]:
        """One GRPO step of each member on its own batch of prompts (indices into `data`); returns each one's
        metrics (mean reward, KL, completion length...).

        The group's rows go through one forward of the shared base, each row through its own member's adapter
        (K members: one base pass where K would run). Member i samples at its own temperature from
        generators[i], its rows in the chunks (of ``generation_batch_size``) and the order it samples them
        alone. Advantages, the clipped loss and the KL are each member's own; micro-batches of
        ``micro_batch_size`` rows cut across members, each member's loss summed over its pieces, then each
        member's Adam step."""
        first = members[0]
        base, k = first.base, len(members)
        hps = [m.hp for m in members]
        with base.bound_many([m.adapter for m in members]) as model:
            roll = data.rollout(model, members, batches, rewards, generators)
            r, fmask, ntok, parts, forward = roll.rewards, roll.fmask, roll.ntok, roll.parts, roll.forward
            adv = [m.advantages(torch.as_tensor(r[i], dtype=torch.float32), h.group_size).to(base.device)
                   for i, (m, h) in enumerate(zip(members, hps, strict=True))]
            ref = old = None
            with torch.no_grad():
                if any(h.beta > 0 for h in hps) or kl_metric:
                    ref = [forward(piece, reference=True) for piece in parts]
                if any(h.update_epochs > 1 for h in hps):
                    old = [forward(piece) for piece in parts]
            # loss, KL: summed on the device in float64 (as host floats would), read once after the update
            sums = torch.zeros(k, 2, dtype=torch.float64, device=base.device)
            norms = [0.0] * k
            for epoch in range(max(h.update_epochs for h in hps)):
                for j, piece in enumerate(parts):
                    live = [n for n, (i, _) in enumerate(piece) if epoch < hps[i].update_epochs]
                    if not live:
                        continue
                    logps = forward([piece[n] for n in live])
                    losses = []
                    for n, logp in zip(live, logps, strict=True):
                        i, s = piece[n]
                        h = hps[i]
                        ref_s = None if ref is None else ref[j][n]
                        losses.append(members[i].piece_loss(logp, logp.detach() if old is None else old[j][n], ref_s,
                                                            adv[i][s], fmask[i][s], h, ntok[i], len(r[i])))
                        if epoch == 0:
                            sums[i, 0] += losses[-1].detach().double()
                            if ref_s is not None:
                                sums[i, 1] += ((k3_kl(logp.detach(), ref_s) * fmask[i][s]).sum() / ntok[i]).double()
                    (losses[0] if len(losses) == 1 else torch.stack(losses).sum()).backward()
                for i, m in enumerate(members):
                    if epoch < hps[i].update_epochs:
                        norms[i] = m._step()
        out = []
        sums = sums.tolist()
        for i, m in enumerate(members):
            loss_sum, kl_sum = m.summed(*sums[i])
            out.append({"reward": float(np.mean(r[i])), "reward_std": float(np.std(r[i])), "loss": loss_sum,
                        "kl": kl_sum if ref is not None else float("nan"),
                        "completion_length": float(fmask[i].sum(dim=1).mean()), "grad_norm": norms[i]})
        return out

    # ---- fitness -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, data: PromptData, rewards: Rewards, n_samples: int = 0) -> float:
        """Mean reward of greedy completions of the held-out prompts; keeps the first `n_samples` as
        :attr:`samples`. Games (multi-turn data) are played whole: the mean return."""
        if hasattr(data, "score_many"):
            return data.score_many([self], rewards, n_samples)[0]
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
        member's own greedy ones (equal up to float rounding). Games (multi-turn data) are played whole."""
        if hasattr(data, "score_many"):
            return data.score_many(members, rewards, n_samples)
        first = members[0]
        hp, base = first.hp, first.base
        if any(m.hp.max_new_tokens != hp.max_new_tokens or m.base is not base for m in members):
            raise ValueError("evaluate_many: members must share the base and max_new_tokens")
        ids, mask = first.prompt_batch(data.ids)
        k = len(members)
        texts: list[list[str]] = [[] for _ in members]
        with base.bound_many([m.adapter for m in members]) as model:
            for s in chunks(len(data), hp.generation_batch_size):
                rows = ids[s].shape[0]
                comp, cmask = sample(model, ids[s].repeat(k, 1), mask[s].repeat(k, 1), hp.max_new_tokens, 0.0,
                                     base.eos_id, base.pad_id, rows=[(i, rows) for i in range(k)])
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

"""DPO (Direct Preference Optimisation) on (prompt, chosen, rejected) pairs, for a LoRA adapter on the shared
base.

Loss per pair: -log sigmoid(beta * ((log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))))
with sequence log-probabilities summed over the completion's tokens (its EOS included), plus ``nll_weight``
times the chosen completion's mean token NLL. The reference is the base with the adapter disabled; its
log-probabilities do not depend on the member, so they are computed once per pair, in fixed blocks (the
same numbers whichever member or runner asks first), and shared by the population.

Fitness is held-out preference accuracy: the share of pairs whose implicit reward margin is positive (a tie
counts half). It does not depend on beta, so selection cannot reward a large beta for itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from agilerl_core.algorithms.hyperparameters.llm import DPOHyperparameters
from agilerl_core.llm.algorithm import LLMAlgorithm
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.learning import PhaseMetrics, batch_ids, row_pieces
from agilerl_core.llm.sampling import completion_logprobs, pad_prompts

REFERENCE_BLOCK = 32  # pairs whose reference log-probabilities are computed together


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-pair sigmoid DPO loss from sequence log-probabilities."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin)


@dataclass
class PreferenceData:
    """Pairs as token ids: prompts (chat template applied when configured), chosen and rejected completions
    (each ending with EOS), and the reference log-probabilities, computed on first use."""

    base: SharedBase
    prompt_ids: list[list[int]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    prompts: list[str]
    chosen: list[str]
    rejected: list[str]
    _ref: dict[int, torch.Tensor] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        """(prompt ids, prompt mask, completion ids, completion mask) of the pairs: chosen rows, then rejected."""
        dev = self.base.device
        ids, mask = pad_prompts([self.prompt_ids[i] for i in idx] * 2, self.base.pad_id, dev)
        comp, cmask = batch_ids([self.chosen_ids[i] for i in idx] + [self.rejected_ids[i] for i in idx],
                                self.base.pad_id, dev)
        return ids, mask, comp, cmask

    def reference(self, idx: list[int]) -> torch.Tensor:
        """[len(idx), 2] reference log-probabilities (chosen, rejected) of the pairs."""
        with self._lock:
            for block in sorted({i // REFERENCE_BLOCK for i in idx} - set(self._ref)):
                members = list(range(block * REFERENCE_BLOCK, min((block + 1) * REFERENCE_BLOCK, len(self))))
                ids, mask, comp, cmask = self.batch(members)
                with torch.no_grad(), self.base.reference() as model:
                    lp = (completion_logprobs(model, ids, mask, comp, cmask) * cmask).sum(dim=1)
                self._ref[block] = lp.reshape(2, -1).T.cpu()
            return torch.stack([self._ref[i // REFERENCE_BLOCK][i % REFERENCE_BLOCK] for i in idx]).to(self.base.device)


class DPO(LLMAlgorithm):
    hp_model = DPOHyperparameters
    algorithm_name = "dpo"
    data_kind = "preferences"

    @staticmethod
    def prepare(base: SharedBase, records: Any, chat_template: bool) -> PreferenceData:
        tok = base.tokenizer

        def completion(text: str) -> list[int]:
            return [*tok.encode(text, add_special_tokens=False), base.eos_id]

        return PreferenceData(base, base.encode(records.prompts, chat_template),
                              [completion(t) for t in records.chosen], [completion(t) for t in records.rejected],
                              list(records.prompts), list(records.chosen), list(records.rejected))

    @staticmethod
    def _policy_logps(model, data: PreferenceData, piece: list[tuple[int, list[int]]]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each member's (sequence log-probs [n, 2] (chosen, rejected), chosen token counts [n]) of its pairs
        in `piece` ((member, pair indices) segments), every row through its member's adapter, in one forward
        (the chosen rows of every segment, then their rejected rows)."""
        idx = [p for _, pairs in piece for p in pairs]
        ids, mask, comp, cmask = data.batch(idx)
        rows = [(i, len(pairs)) for i, pairs in piece]
        lp = (completion_logprobs(model, ids, mask, comp, cmask, rows=rows + rows)
              * cmask).sum(dim=1).reshape(2, -1).T
        ntok = cmask[: len(idx)].sum(dim=1)
        out, start = [], 0
        for _, pairs in piece:
            out.append((lp[start:start + len(pairs)], ntok[start:start + len(pairs)]))
            start += len(pairs)
        return out

    @staticmethod
    def _pieces(members: list[DPO], pairs: list[list[int]]) -> list[list[tuple[int, list[int]]]]:
        """The group's pairs cut into micro-batches of ``micro_batch_size / 2`` pairs (two rows each)."""
        size = max(members[0].hp.micro_batch_size // 2, 1)
        return [[(i, pairs[i][s]) for i, s in piece] for piece in row_pieces([len(p) for p in pairs], size)]

    @staticmethod
    def train_group(members: list[DPO], data: PreferenceData, budget: int, seeds: list[int]) -> list[PhaseMetrics]:
        """Every member's training phase, their learn steps taken together (:meth:`learn_group`); member i's
        batches come from seeds[i] alone."""
        return DPO.train_on_records(members, data, budget, seeds)

    @staticmethod
    def learn_group(members: list[DPO], data: PreferenceData, batches: list[list[int]]) -> list[dict[str, float]]:
        """One DPO step of each member on its own pairs: the group's rows through one forward of the base per
        micro-batch, each row through its member's adapter; each member's loss, then its Adam step."""
        sums = [[0.0, 0.0, 0.0] for _ in members]  # loss, accuracy, margin
        with members[0].base.bound_many([m.adapter for m in members]) as model:
            for piece in LLMAlgorithm.group_parts(members, DPO._pieces(members, batches)):
                losses = []
                for (i, pairs), (lp, ntok) in zip(piece, DPO._policy_logps(model, data, piece), strict=True):
                    hp, n = members[i].hp, len(batches[i])
                    r = data.reference(pairs)
                    per_pair = dpo_loss(lp[:, 0], lp[:, 1], r[:, 0], r[:, 1], hp.beta)
                    if hp.nll_weight > 0:
                        per_pair = per_pair + hp.nll_weight * (-lp[:, 0] / ntok.clamp(min=1))
                    losses.append(per_pair.sum() / n)
                    margin = ((lp[:, 0] - r[:, 0]) - (lp[:, 1] - r[:, 1])).detach()
                    sums[i][0] += float(losses[-1].detach())
                    sums[i][1] += float((margin > 0).float().sum() + 0.5 * (margin == 0).float().sum())
                    sums[i][2] += float(margin.sum())
                (losses[0] if len(losses) == 1 else torch.stack(losses).sum()).backward()
            norms = [m._step() for m in members]
        out = []
        for m, b, total, norm in zip(members, batches, sums, norms, strict=True):
            loss_sum, acc, margin_sum = m.summed(*total)
            out.append({"loss": loss_sum, "accuracy": acc / len(b), "margin": margin_sum / len(b), "grad_norm": norm})
        return out

    @torch.no_grad()
    def evaluate(self, data: PreferenceData, n_samples: int = 0) -> float:
        """Held-out preference accuracy (a tie counts half); keeps the first `n_samples` pairs' margins as
        :attr:`samples`."""
        return DPO.evaluate_many([self], data, n_samples)[0]

    @staticmethod
    @torch.no_grad()
    def evaluate_many(members: list[DPO], data: PreferenceData, n_samples: int = 0) -> list[float]:
        """:meth:`evaluate` of several members, their held-out pairs scored in shared forwards of the base."""
        idx = list(range(len(data)))
        ref = data.reference(idx)
        margins: list[list[torch.Tensor]] = [[] for _ in members]
        with members[0].base.bound_many([m.adapter for m in members]) as model:
            for piece in DPO._pieces(members, [idx] * len(members)):
                for (i, pairs), (lp, _) in zip(piece, DPO._policy_logps(model, data, piece), strict=True):
                    r = ref[pairs]
                    margins[i].append((lp[:, 0] - r[:, 0]) - (lp[:, 1] - r[:, 1]))
        out = []
        for member, parts in zip(members, margins, strict=True):
            m = torch.cat(parts).cpu()
            member.samples = [{"prompt": data.prompts[i], "chosen": data.chosen[i], "rejected": data.rejected[i],
                               "margin": float(m[i])} for i in idx[:n_samples]]
            out.append(float(((m > 0).float() + 0.5 * (m == 0).float()).mean()))
        return out

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
from agilerl_core.algorithms.llm_base import LLMAlgorithm, PhaseMetrics, batch_ids, chunks
from agilerl_core.llm.base_model import SharedBase
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

    def _policy_logps(self, model, data: PreferenceData, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence log-probs [n, 2] (chosen, rejected), chosen token counts [n]) under the bound adapter."""
        ids, mask, comp, cmask = data.batch(idx)
        lp = (completion_logprobs(model, ids, mask, comp, cmask) * cmask).sum(dim=1)
        return lp.reshape(2, -1).T, cmask[: len(idx)].sum(dim=1)

    def train_phase(self, data: PreferenceData, budget: int, seed: int) -> PhaseMetrics:
        """Learn steps until `budget` pairs were used (the last step is whole)."""
        return self._run_phase(len(data), budget, seed, lambda idx: (len(idx), self.learn(data, idx)))

    def learn(self, data: PreferenceData, idx: list[int]) -> dict[str, float]:
        """One DPO step on the pairs `idx`."""
        hp = self.hp
        ref = data.reference(idx)
        n = len(idx)
        loss_sum = acc = margin_sum = 0.0
        with self.base.bound(self.adapter) as model:
            for s in self.my_parts(chunks(n, max(hp.micro_batch_size // 2, 1))):
                lp, ntok = self._policy_logps(model, data, idx[s])
                r = ref[s]
                losses = dpo_loss(lp[:, 0], lp[:, 1], r[:, 0], r[:, 1], hp.beta)
                if hp.nll_weight > 0:
                    losses = losses + hp.nll_weight * (-lp[:, 0] / ntok.clamp(min=1))
                loss = losses.sum() / n
                loss.backward()
                margin = ((lp[:, 0] - r[:, 0]) - (lp[:, 1] - r[:, 1])).detach()
                loss_sum += float(loss.detach())
                acc += float((margin > 0).float().sum() + 0.5 * (margin == 0).float().sum())
                margin_sum += float(margin.sum())
            norm = self._step()
        loss_sum, acc, margin_sum = self.summed(loss_sum, acc, margin_sum)
        return {"loss": loss_sum, "accuracy": acc / n, "margin": margin_sum / n, "grad_norm": norm}

    @torch.no_grad()
    def evaluate(self, data: PreferenceData, n_samples: int = 0) -> float:
        """Held-out preference accuracy (a tie counts half); keeps the first `n_samples` pairs' margins as
        :attr:`samples`."""
        idx = list(range(len(data)))
        ref = data.reference(idx)
        margins = []
        with self.base.bound(self.adapter) as model:
            for s in chunks(len(idx), max(self.hp.micro_batch_size // 2, 1)):
                lp, _ = self._policy_logps(model, data, idx[s])
                r = ref[s]
                margins.append((lp[:, 0] - r[:, 0]) - (lp[:, 1] - r[:, 1]))
        m = torch.cat(margins).cpu()
        self.samples = [{"prompt": data.prompts[i], "chosen": data.chosen[i], "rejected": data.rejected[i],
                         "margin": float(m[i])} for i in idx[:n_samples]]
        return float(((m > 0).float() + 0.5 * (m == 0).float()).mean())

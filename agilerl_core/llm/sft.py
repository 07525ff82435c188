"""Supervised fine-tuning (``sft``) of LoRA members on (prompt, response) demonstrations.

The recorded-games machinery of :mod:`~agilerl_core.llm.ilql` on general records: each demonstration becomes a prompt (through
the chat template when the run uses one) and a continuation, the response's tokens and EOS, all of them the
member's; the loss is their cross-entropy (the prompt is context, never a target), normalised by the step's
response tokens, a group's rows through shared forwards of the base as every LLM algorithm does.

Fitness is the held-out responses' mean log-likelihood per token (their EOS included): higher is better, 0 is a
member that predicts every response token with certainty. It is what the loss minimises, measured on records no
member trains on, so selection rewards generalisation, not memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from agilerl_core.algorithms.hyperparameters.llm import SFTHyperparameters
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.ilql import LLMBC, GameTranscripts
from agilerl_core.llm.learning import row_pieces
from agilerl_core.llm.sampling import completion_logprobs


@dataclass
class Demonstrations(GameTranscripts):
    """(prompt, response) records as token sequences: every continuation token is the member's, no rewards."""

    prompts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)

    @classmethod
    def of_records(cls, base: SharedBase, records: Any, chat_template: bool) -> Demonstrations:
        tok = base.tokenizer
        prompt_ids = base.encode(records.prompts, chat_template)
        tokens = [[*tok.encode(r, add_special_tokens=False), base.eos_id] for r in records.responses]
        return cls(prompt_ids, tokens, [[True] * len(t) for t in tokens], [[] for _ in tokens], base.pad_id,
                   list(records.prompts), list(records.responses))


class SFT(LLMBC):
    """A LoRA member imitating demonstrated responses."""

    hp_model = SFTHyperparameters
    algorithm_name = "sft"
    data_kind = "demonstrations"

    def batch_key(self) -> tuple | None:
        return (self.algorithm_name,)

    @staticmethod
    def prepare(base: SharedBase, records: Any, chat_template: bool) -> Demonstrations:
        return Demonstrations.of_records(base, records, chat_template)

    def evaluate(self, data: Demonstrations, n_samples: int = 0) -> float:
        """Mean log-likelihood per response token of the held-out demonstrations."""
        return SFT.evaluate_many([self], data, n_samples)[0]

    @staticmethod
    @torch.no_grad()
    def evaluate_many(members: list[SFT], data: Demonstrations, n_samples: int = 0) -> list[float]:
        """:meth:`evaluate` of several members, the held-out records scored in shared forwards of the base
        (``micro_batch_size`` rows each, every row through its member's adapter); each member's first
        `n_samples` prompts answered greedily beside the reference response (MLflow's sample table)."""
        base = members[0].base
        idx = list(range(len(data)))
        sums = [torch.zeros((), device=base.device) for _ in members]
        with base.bound_many([m.adapter for m in members]) as model:
            for piece in row_pieces([len(idx)] * len(members), members[0].hp.micro_batch_size):
                rows = [i for _, s in piece for i in idx[s]]
                ids, mask, comp, cmask, _, _ = data.batch(rows, base.device)
                logp = completion_logprobs(model, ids, mask, comp, cmask, 1.0,
                                           [(i, s.stop - s.start) for i, s in piece])
                start = 0
                for i, s in piece:
                    n = s.stop - s.start
                    sums[i] += (logp[start:start + n] * cmask[start:start + n]).sum()
                    start += n
        ntok = max(data.own_tokens(idx), 1)
        scores = (torch.stack(sums) / ntok).tolist()  # one host read for the group
        for m in members:
            shown = idx[:n_samples]
            texts = m.generate_ids([data.prompt_ids[i] for i in shown]) if shown else []
            m.samples = [{"prompt": data.prompts[i], "reference": data.responses[i], "completion": t}
                         for i, t in zip(shown, texts, strict=True)]
        return scores

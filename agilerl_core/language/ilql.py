"""Implicit Language Q-Learning (Snell et al., 2022, "Offline RL for Natural Language Generation with Implicit
Language Q Learning"): offline RL on token sequences, here a character-level GPT on game transcripts.

Per action (a character the player wrote) from state s (the hidden state before it):

- V(s) by expectile regression on the target Q of the data's action: ``|e - 1(Q' - V < 0)| (Q' - V)^2``;
- each Q(s, a) by TD to the next action's state: ``(r + gamma V(s') (1 - done) - Q(s, a))^2``, V(s') fixed;
- a conservative term pushing Q down off the data: ``logsumexp_a' Q(s, a') - Q(s, a)``;
- the language model's own cross-entropy on the data (the behaviour policy ILQL perturbs).

Q' is the minimum of two target Q heads, updated softly by ``tau`` every step. Acting takes the language
model's logits plus ``beta * (Q'(s, a) - V(s))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agilerl_core.algorithms.hyperparameters.language import ILQLHyperparameters, LanguageHyperparameters
from agilerl_core.language.agent import LanguageAgent, masked_mean
from agilerl_core.language.bc_lm import bc_loss
from agilerl_core.language.tensors import LETTER_IDS, GameTensors


def per_member(hps: Sequence[LanguageHyperparameters], name: str, like: torch.Tensor) -> torch.Tensor:
    """Hyperparameter `name` of every member as [K, 1, 1] (broadcasts over a [K, B, T] batch)."""
    return torch.tensor([float(getattr(hp, name)) for hp in hps], dtype=like.dtype, device=like.device).view(-1, 1, 1)


def expectile_loss(diff: torch.Tensor, expectile: torch.Tensor | float) -> torch.Tensor:
    """Asymmetric squared error of ``diff = target - V``: weight `expectile` above, 1 - `expectile` below."""
    weight = torch.where(diff > 0, torch.as_tensor(expectile, dtype=diff.dtype), 1.0 - torch.as_tensor(expectile))
    return weight * diff.square()


def taken(q: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Q [..., A] at the actions taken [...]."""
    return q.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def ilql_terms(qs: Sequence[torch.Tensor], v: torch.Tensor, target_qs: Sequence[torch.Tensor], batch: GameTensors,
               gamma: torch.Tensor | float, expectile: torch.Tensor | float) -> dict[str, torch.Tensor]:
    """Each member's Q, V and conservative losses [K]: `qs` and `target_qs` [K, B, T, A], `v` [K, B, T]."""
    q_target = torch.stack([taken(q, batch.action) for q in target_qs]).amin(0).detach()
    v_loss = masked_mean(expectile_loss(q_target - v, expectile), batch.act)
    v_next = v.detach().gather(-1, batch.next_state).masked_fill(batch.done, 0.0)
    td_target = batch.reward + gamma * v_next
    q_loss = sum(masked_mean((taken(q, batch.action) - td_target).square(), batch.act) for q in qs)
    cql = sum(masked_mean(torch.logsumexp(q, -1) - taken(q, batch.action), batch.act) for q in qs)
    return {"q": q_loss, "v": v_loss, "cql": cql}


class ILQL(LanguageAgent):
    """A character-level GPT with Q (two by default), target Q and V heads on its hidden states."""

    algorithm_name: ClassVar[str] = "ilql"
    hp_model = ILQLHyperparameters
    target_heads: ClassVar[tuple[str, ...]] = ("q1", "q2")

    @classmethod
    def heads_of(cls, hp: ILQLHyperparameters) -> dict[str, int]:
        heads = {"q1": len(LETTER_IDS), "v": 1}
        if hp.two_q:
            heads["q2"] = len(LETTER_IDS)
        return heads

    @staticmethod
    def _qs(out: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [out[n] for n in ("q1", "q2") if n in out]

    @classmethod
    def losses(cls, out: dict[str, torch.Tensor], target: dict[str, torch.Tensor], batch: GameTensors,
               hps: Sequence[LanguageHyperparameters]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        like = out["lm"]
        terms = ilql_terms(cls._qs(out), out["v"].squeeze(-1), cls._qs(target), batch,
                           per_member(hps, "gamma", like), per_member(hps, "expectile", like))
        bc = bc_loss(out["lm"], batch)
        cql_w, bc_w = (per_member(hps, n, like).view(-1) for n in ("cql_weight", "bc_weight"))
        loss = terms["q"] + terms["v"] + cql_w * terms["cql"] + bc_w * bc
        return loss, {**{k: t.detach() for k, t in terms.items()}, "bc": bc.detach()}

    @classmethod
    def policy_logits(cls, out: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                      hps: Sequence[LanguageHyperparameters]) -> torch.Tensor:
        advantage = torch.stack(cls._qs(target)).amin(0) - out["v"]
        beta = per_member(hps, "beta", out["lm"]).unsqueeze(-1)
        return out["lm"] + beta * advantage

"""Behaviour cloning of a language agent on game transcripts (``bc_lm``): next-character cross-entropy on the
characters the players wrote (their guesses), the env's feedback read as context only. With
``dataset.min_return`` it imitates only the better games (filtered BC). The baseline ILQL is measured against
(Snell et al., 2022, "Offline RL for Natural Language Generation with Implicit Language Q Learning")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from agilerl_core.algorithms.hyperparameters.language import BCLMHyperparameters, LanguageHyperparameters
from agilerl_core.language.agent import LanguageAgent, letter_cross_entropy, masked_mean
from agilerl_core.language.tensors import GameTensors


def bc_loss(lm: torch.Tensor, batch: GameTensors) -> torch.Tensor:
    """Each member's mean cross-entropy [K] of its letter logits `lm` [K, B, T, 26] on the guess letters."""
    return masked_mean(letter_cross_entropy(lm, batch.action), batch.act)


class BCLM(LanguageAgent):
    """A character-level GPT imitating the data's guesses."""

    algorithm_name: ClassVar[str] = "bc_lm"
    hp_model = BCLMHyperparameters

    @classmethod
    def losses(cls, out: dict[str, torch.Tensor], target: dict[str, torch.Tensor], batch: GameTensors,
               hps: Sequence[LanguageHyperparameters]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = bc_loss(out["lm"], batch)
        return loss, {"bc": loss.detach()}

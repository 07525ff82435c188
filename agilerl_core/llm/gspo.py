"""GSPO (Group Sequence Policy Optimization: Zheng et al., "Group Sequence Policy Optimization", 2025) for a LoRA
adapter on the shared base: GRPO's sampling and group-normalised advantages, with the importance ratio and its clip
taken per *sequence* instead of per token.

A completion's ratio is the geometric mean of its tokens' ratios, ``s_i = exp(mean_t (log pi(y_t) - log pi_old(y_t)))``
(length-normalised, so long and short completions sit on one scale), and its loss is
``-min(s_i A_i, clip(s_i, 1 - c, 1 + c) A_i)``: a whole completion is kept or clipped, never some of its tokens.
Each completion weighs the same in a member's loss (the mean over its completions), and ``beta`` times the k3 KL
to the base is added per token as GRPO adds it. Sequence-level ratios stay close to 1, so the clip is small
(``clip`` 4e-4 by default, the paper's range being 3e-4 to 4e-4). With ``update_epochs`` 1 the ratio is 1 and the
gradient is each completion's advantage times the mean of its tokens' log-prob gradients.

Everything else (sampling with each member's own generator, one forward of the base for the group, micro-batches,
checkpoints, evaluation) is GRPO's: only the piece loss differs.
"""

from __future__ import annotations

import torch

from agilerl_core.algorithms.hyperparameters.llm import GSPOHyperparameters
from agilerl_core.llm.grpo import GRPO, k3_kl


def gspo_sequence_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       clip: float) -> torch.Tensor:
    """Per-completion loss [batch]: -min(s A, clip(s, 1 - c, 1 + c) A), s the exp of the mean over the completion's
    tokens (`mask` [batch, T]) of logp - old_logp; `advantages` one per completion [batch]."""
    length = mask.sum(dim=1).clamp(min=1)
    ratio = torch.exp(((logp - old_logp) * mask).sum(dim=1) / length)
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)


class GSPO(GRPO):
    hp_model = GSPOHyperparameters
    algorithm_name = "gspo"

    @staticmethod
    def piece_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, hp, ntok, nseq: int) -> torch.Tensor:
        """This piece's share of its member's loss: the mean over the member's `nseq` completions of each
        completion's sequence loss, plus beta k3 per completion token (over its `ntok` tokens)."""
        loss = gspo_sequence_loss(logp, old_logp, advantages, mask, hp.clip).sum() / nseq
        if ref_logp is not None and hp.beta > 0:
            loss = loss + hp.beta * (k3_kl(logp, ref_logp) * mask).sum() / ntok
        return loss

"""CISPO (Clipped IS-weight Policy Optimization: MiniMax, "MiniMax-M1", 2025) for a LoRA adapter on the shared base:
GRPO's sampling and group-normalised advantages, with the importance-sampling *weight* truncated instead of the
update clipped.

Each token's loss is ``-sg(min(r_t, 1 + clip)) A log pi(y_t)``: the ratio ``r_t = pi / pi_old`` is truncated from
above and detached, so it only scales the token's log-prob gradient, and every token keeps its gradient (PPO's and
GRPO's clip drops the gradient of a token whose ratio left the range, and with it the rare tokens where a reasoning
path forks). As in the paper there is no lower bound on the weight; ``clip`` 0.28 by default. The loss is
token-level (every completion token of a member's batch weighs the same), plus ``beta`` times the k3 KL to the base.
With ``update_epochs`` 1 the weight is 1 and this is REINFORCE with GRPO's advantages.

Everything else is GRPO's: only the piece loss differs.
"""

from __future__ import annotations

import torch

from agilerl_core.algorithms.hyperparameters.llm import CISPOHyperparameters
from agilerl_core.llm.grpo import GRPO, k3_kl


def cispo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip: float
                     ) -> torch.Tensor:
    """Per-token loss [batch, T]: -sg(min(exp(logp - old_logp), 1 + clip)) A logp; `advantages` one per completion
    [batch], or per token [batch, T]."""
    weight = torch.exp(logp - old_logp).clamp(max=1 + clip).detach()
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    return -weight * adv * logp


class CISPO(GRPO):
    hp_model = CISPOHyperparameters
    algorithm_name = "cispo"

    @staticmethod
    def piece_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, hp, ntok, nseq: int) -> torch.Tensor:
        """This piece's share of its member's token-level loss (over the member's `ntok` completion tokens)."""
        tok = cispo_token_loss(logp, old_logp, advantages, hp.clip)
        if ref_logp is not None and hp.beta > 0:
            tok = tok + hp.beta * k3_kl(logp, ref_logp)
        return (tok * mask).sum() / ntok

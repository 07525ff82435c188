"""REINFORCE with a leave-one-out baseline (RLOO: Kool et al., "Buy 4 REINFORCE Samples, Get a Baseline for Free!",
ICLR 2019 workshop; Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
Human Feedback in LLMs", ACL 2024) for a LoRA adapter on the shared base.

Each prompt gets ``group_size`` sampled completions; a completion's advantage is its reward minus the mean reward
of the *other* completions of its prompt, ``A_i = r_i - (sum_j r_j - r_i) / (k - 1)``: an unbiased baseline (it
does not depend on completion i), unlike GRPO's group mean, and no division by the group's standard deviation.
The update is the policy gradient ``-A_i grad log pi(completion_i)`` (token-level, as GRPO's loss) plus
``beta`` times the k3 KL to the base; with ``update_epochs`` 1 (the default) the ratio is 1 and the clip never
binds, so this is plain REINFORCE; more epochs reuse the samples under PPO's clipped ratio.

Everything else (sampling with each member's own generator, the group's rows through one forward of the base,
micro-batches, checkpoints, rank mutation, evaluation) is GRPO's: only the advantage differs.
"""

from __future__ import annotations

import torch

from agilerl_core.algorithms.hyperparameters.llm import REINFORCEHyperparameters
from agilerl_core.llm.grpo import GRPO


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each reward minus the mean of the other rewards of its group (groups: consecutive runs of `group_size`)."""
    if group_size < 2:
        raise ValueError("a leave-one-out baseline needs at least two completions per prompt (group_size >= 2)")
    r = rewards.reshape(-1, group_size)
    others = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - others).reshape(-1)


class REINFORCE(GRPO):
    hp_model = REINFORCEHyperparameters
    algorithm_name = "reinforce"

    @staticmethod
    def advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return rloo_advantages(rewards, group_size)

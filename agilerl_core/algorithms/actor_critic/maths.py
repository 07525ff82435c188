"""Actor-critic maths on tensors with any leading dimensions ([B] alone, [K, B] for a population): the
squashed Gaussian policy's log density and SAC's temperature loss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
SDE_MEAN_CLIP = 2.0  # gSDE actors keep their pre-squash mean in [-2, 2] (as SB3 does), so tanh never saturates


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) for u ~ N(mean, exp(log_std)): the Gaussian log density minus the tanh Jacobian,
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (numerically stable), summed over the last dim."""
    gauss = -0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    jac = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gauss - jac).sum(dim=-1)


def alpha_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float | torch.Tensor) -> torch.Tensor:
    """Temperature loss: its gradient raises alpha when the entropy (-log_prob) is below the target."""
    return -(log_alpha * (log_prob.detach() + target_entropy)).mean()

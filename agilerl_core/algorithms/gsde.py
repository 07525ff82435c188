"""Generalized state-dependent exploration (gSDE: Raffin, Kober & Stulp, "Smooth Exploration for Robotic
Reinforcement Learning", CoRL 2022), for any actor whose Gaussian policy reads an MLP head (SAC, PPO).

The exploration noise on action j is sum_l latent_l W_lj, with latent the actor's last hidden activations and
W_lj ~ N(0, sigma_lj^2) drawn anew every ``sde_sample_freq`` steps: between draws the noise is a smooth function of
the state, so an actor commits to a direction for many steps instead of averaging white noise away. Given the
state it is Gaussian with variance sum_l latent_l^2 sigma_lj^2, which is the policy's log-density (and entropy)
learning uses; the features are not differentiated through it (the scales sigma are what it learns).

Where sigma lives: an actor with gSDE has ``2 * dim`` outputs like SAC's, but the rows after the mean are no head.
Their weights [dim, L] hold log sigma - log_std_init (their biases are unused), so the scales are parameters of
the actor like any other (stacked, stepped by its Adam, checkpointed, perturbed by a parameter mutation), and a
hidden unit added by an architecture mutation (its weights there zero) starts at log_std_init.
"""

from __future__ import annotations

import torch

from agilerl_core.rng import SALT_SDE, mix, normal

SDE_VARIANCE_EPS = 1e-6


def sde_log_std(latent: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
    """The state-dependent log std [..., B, dim] from the last hidden activations `latent` [..., B, L] (not
    differentiated) and the log scales `log_sigma` [..., dim, L]."""
    variance = torch.matmul(latent.detach().square(), (2.0 * log_sigma).exp().transpose(-1, -2))
    return 0.5 * torch.log(variance + SDE_VARIANCE_EPS)


def log_scales(out_weight: torch.Tensor, dim: int, log_std_init: torch.Tensor | float) -> torch.Tensor:
    """log sigma [..., dim, L] from an actor's output-layer weights [..., 2 * dim, L] (a member's own, or a stack's
    [K, 2 * dim, L] with `log_std_init` [K, 1, 1])."""
    return out_weight[..., dim:, :] + log_std_init


@torch.no_grad()
def zero_scale_rows(out_layer: torch.nn.Linear, dim: int) -> None:
    """A new gSDE actor's scale rows: every log sigma at log_std_init."""
    out_layer.weight[dim:].zero_()
    out_layer.bias[dim:].zero_()


class StateDependentNoise:
    """A group's gSDE exploration for one training phase: each member's weights W [L, N, dim] (per env), standard
    normal, from its phase key (salted) and a counter of its draws, so they do not depend on its group; drawn
    hidden-unit-major, so unit l's values are the same whatever the group's widest member; a new draw every
    `every` calls (or when the envs or widths change)."""

    def __init__(self, keys: torch.Tensor, every: int) -> None:
        self.keys = mix(keys ^ SALT_SDE)
        self.every = int(every)
        self.weights: torch.Tensor | None = None
        self.age = 0
        self.draws = 0

    def __call__(self, latent: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
        """The noise [K, N, dim] for this step from `latent` [K, N, L] and `log_sigma` [K, dim, L]."""
        k, n, width = latent.shape
        dim = log_sigma.shape[1]
        if self.weights is None or self.age >= self.every or self.weights.shape[1:] != (width, n, dim):
            self.draws += 1
            self.weights = normal(self.keys, self.draws, width * n * dim).view(k, width, n, dim)
            self.age = 0
        self.age += 1
        return torch.einsum("knl,kal,klna->kna", latent, log_sigma.exp(), self.weights)

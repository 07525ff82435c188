"""DQN-family maths on tensors with a leading member axis (a member alone is K = 1): the exploration
schedule, action masks, the TD regression losses and C51's projection (Bellemare et al., ICML 2017)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Epsilon after `step` env steps: linear from `start` to `end` over `decay_steps`, then flat."""
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + frac * (end - start)


def mask_invalid(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`q` [..., A] with the actions `mask` [..., A] rules out at -inf (a state with no valid action: all
    count as valid)."""
    if mask is None:
        return q
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    return q.masked_fill(~mask, float("-inf"))


def regression_loss(pred: torch.Tensor, target: torch.Tensor, huber: bool) -> torch.Tensor:
    """Per-sample loss of `pred` towards `target`: squared error, or Huber with delta 1."""
    if huber:
        return F.smooth_l1_loss(pred, target, reduction="none")
    return (pred - target).square()


def regression_loss_grad(diff: torch.Tensor, huber: bool) -> torch.Tensor:
    """d regression_loss / d pred at ``diff = pred - target``: 2 diff, or Huber's clamp(diff, -1, 1)."""
    return diff.clamp(-1.0, 1.0) if huber else 2.0 * diff


def categorical_projection(next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                           support: torch.Tensor, ends: tuple[float, float] | None = None) -> torch.Tensor:
    """C51's projection (Bellemare et al. 2017, Algorithm 1) of the target distribution onto `support`.

    Atom z_j of the next-state distribution (probability next_probs[..., j]) moves to
    Tz_j = clip(r + discount * z_j, v_min, v_max) and its mass is split between the two neighbouring atoms in
    proportion to closeness; `discount` already holds gamma^L * (1 - terminated). A Tz_j that lands exactly
    on an atom gives it all its mass. Any leading dimensions ([B] or [K, B]) on every argument but `support`.
    `ends`: the support's first and last atoms as host floats, when the caller holds them (else read here).
    """
    atoms = support.shape[0]
    lead = next_probs.shape[:-1]
    next_probs, reward, discount = next_probs.reshape(-1, atoms), reward.reshape(-1), discount.reshape(-1)
    v_min, v_max = (float(support[0]), float(support[-1])) if ends is None else ends
    dz = (v_max - v_min) / (atoms - 1)
    tz = (reward.unsqueeze(1) + discount.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = ((tz - v_min) / dz).clamp(0, atoms - 1)
    lower, upper = b.floor().long(), b.ceil().long()
    out = torch.zeros_like(next_probs)
    out.scatter_add_(1, lower, next_probs * (upper.to(b.dtype) - b + (upper == lower).to(b.dtype)))
    out.scatter_add_(1, upper, next_probs * (b - lower.to(b.dtype)))
    return out.view(*lead, atoms)

"""PPO's losses and minibatch schedule, written over any leading dimensions: a member's minibatch [B] or K
members' minibatches [K, B] with per-member weights (each row's share of its member's mean)."""

from __future__ import annotations

import math

import torch


def policy_params(out: torch.Tensor, mask: torch.Tensor | None, log_std: torch.Tensor | None, dim: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The policy's distribution parameters from the actor's outputs `out` [..., A]: (means, log std broadcast to
    them) for Box actions (`log_std` given; the first `dim` outputs are the means), (logits with masked actions at
    -1e9, None) for discrete ones (`log_std` None; `mask`: the allowed actions, a row allowing none allows all)."""
    if log_std is not None:
        out = out[..., :dim]  # (gsde: the means; the scales come with the features)
        return out, log_std.expand_as(out)
    if mask is not None:
        mask = mask | ~mask.any(dim=-1, keepdim=True)
        out = out.masked_fill(~mask, -1e9)
    return out, None


def log_prob(p: torch.Tensor, log_std: torch.Tensor | None, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) from :func:`policy_params`' (means, log std) of a diagonal Gaussian, or (logits, None)."""
    if log_std is not None:
        return (-0.5 * ((actions - p) / log_std.exp()).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    return torch.log_softmax(p, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def log_prob_entropy(p: torch.Tensor, log_std: torch.Tensor | None, actions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`log_prob`, the policy's entropy) from :func:`policy_params`' output; leading dims kept."""
    if log_std is not None:
        return log_prob(p, log_std, actions), (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
    logits = torch.log_softmax(p, dim=-1)
    probs = logits.exp()  # (before the gather: the order autograd sums the log-probs' three gradients in)
    return logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), -(probs * logits).sum(-1)


def weighted_mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The mean of `x` over its last dimension: plain, or with each row's `weight` (summing to 1 per member)."""
    return x.mean(-1) if weight is None else (x * weight).sum(-1)


def ppo_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float | torch.Tensor,
             weight: torch.Tensor | None = None) -> torch.Tensor:
    """Clipped surrogate (to minimise): mean of max(-A r, -A clip(r, 1 - c, 1 + c)), r = pi_new / pi_old.
    `clip`: a number, or each member's [K, 1]."""
    ratio = (new_logp - old_logp).exp()
    return weighted_mean(torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)), weight)


def value_loss(values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, clip: float | torch.Tensor | None,
               weight: torch.Tensor | None = None) -> torch.Tensor:
    """0.5 (V - R)^2, or with clipping 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), averaged."""
    loss = (values - returns).square()
    if clip is not None:
        loss = torch.max(loss, (old_values + torch.clamp(values - old_values, -clip, clip) - returns).square())
    return 0.5 * weighted_mean(loss, weight)


def normalized_advantages(adv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Each member's minibatch advantages [K, B] standardised over its `valid` rows (unbiased std; a minibatch
    of one row is left as it is)."""
    count = valid.sum(-1, keepdim=True)
    mean = (adv * valid).sum(-1, keepdim=True) / count.clamp(min=1)
    var = ((adv - mean).square() * valid).sum(-1, keepdim=True) / (count - 1).clamp(min=1)
    return torch.where(count > 1, (adv - mean) / (var.sqrt() + 1e-8), adv)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, valid: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns) per member, over its rows [K, R] (the `valid` ones [K, R] when
    given; nan where the returns do not vary): 1 is a critic that predicts every return, 0 one no better than
    their mean (SB3's and CleanRL's diagnostic)."""
    def var(x: torch.Tensor) -> torch.Tensor:
        if valid is None:
            return x.var(dim=1, unbiased=False)
        count = valid.sum(1).clamp(min=1)
        mean = (x * valid).sum(1, keepdim=True) / count.unsqueeze(1)
        return ((x - mean).square() * valid).sum(1) / count

    total = var(returns)
    return torch.where(total > 0, 1.0 - var(returns - values) / total, torch.nan)


def minibatch_bounds(n: int, num_minibatches: int) -> list[tuple[int, int]]:
    """(start, end) of `num_minibatches` minibatches covering `n` shuffled rows, sizes differing by at most one
    (never a tail of a few rows that would weigh as much as a whole minibatch); fewer when n is smaller."""
    m = max(1, min(num_minibatches, n))
    size, extra = divmod(n, m)
    out, start = [], 0
    for i in range(m):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out

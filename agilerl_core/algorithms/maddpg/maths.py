"""What MADDPG's members and groups share: masked logits and the straight-through Gumbel-softmax sample."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def masked_logits(logits: torch.Tensor, mask: np.ndarray | torch.Tensor | None) -> torch.Tensor:
    """`logits` with the actions `mask` forbids at the dtype's lowest value (no probability, no gradient)."""
    if mask is None:
        return logits
    m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
    return logits.masked_fill(~m.to(device=logits.device, dtype=torch.bool), torch.finfo(logits.dtype).min)


def gumbel_of(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise -log(-log(u)) of uniforms `u` on (0, 1)."""
    return -torch.log(-torch.log(u))


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise of shape `shape`, its uniforms from `generator`."""
    return gumbel_of(torch.rand(shape, generator=generator).clamp_(1e-10, 1.0 - 1e-10))


def gumbel_softmax(logits: torch.Tensor, temperature: float | torch.Tensor, generator: torch.Generator | None = None,
                   hard: bool = True, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A (straight-through, when `hard`) Gumbel-softmax sample of `logits` [..., A]: the one-hot argmax in the
    forward pass, the softmax of (logits + noise) / temperature's gradient in the backward. The noise is
    drawn from `generator` unless given."""
    if noise is None:
        noise = gumbel_noise(logits.shape, generator).to(logits.device)
    soft = F.softmax((logits + noise) / temperature, dim=-1)
    if not hard:
        return soft
    return F.one_hot(soft.argmax(-1), logits.shape[-1]).to(soft.dtype) + soft - soft.detach()

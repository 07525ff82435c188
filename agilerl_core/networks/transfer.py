"""Weight transfer between an old network and its mutated rebuild.

Rule: every entry that exists in both keeps its trained value. In an output row (unit, channel) that
existed before, new input entries are zero, so adding units or channels leaves the function unchanged;
brand-new rows keep their fresh initialisation.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ACTIVATION_FNS = {
    "relu": torch.relu,
    "leaky_relu": torch.nn.functional.leaky_relu,
    "elu": torch.nn.functional.elu,
    "tanh": torch.tanh,
}


def overlap_slices(new_shape, old_shape, centered_dims=()) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """Slices selecting the common region of two shapes (start-aligned, or centred on some dims)."""
    s_new, s_old = [], []
    for d, (n, o) in enumerate(zip(new_shape, old_shape, strict=True)):
        m = min(n, o)
        off_n, off_o = ((n - m) // 2, (o - m) // 2) if d in centered_dims else (0, 0)
        s_new.append(slice(off_n, off_n + m))
        s_old.append(slice(off_o, off_o + m))
    return tuple(s_new), tuple(s_old)


@torch.no_grad()
def copy_overlap(new: torch.Tensor, old: torch.Tensor, centered_dims=()) -> None:
    """Copy `old` into `new` where they overlap; zero the rest of rows that already existed."""
    if new.ndim >= 2:
        new[: min(new.shape[0], old.shape[0])].zero_()
    s_new, s_old = overlap_slices(new.shape, old.shape, centered_dims)
    new[s_new] = old[s_old].to(new.dtype)


@torch.no_grad()
def init_linear(layer: nn.Linear, generator: torch.Generator | None) -> None:
    """PyTorch's default Linear init, drawn from an explicit generator (reproducible)."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    bound = 1.0 / math.sqrt(layer.weight.shape[1]) if layer.weight.shape[1] > 0 else 0.0
    layer.bias.uniform_(-bound, bound, generator=generator)


@torch.no_grad()
def init_conv(layer: nn.Conv2d, generator: torch.Generator | None) -> None:
    """PyTorch's default Conv2d init, drawn from an explicit generator (reproducible)."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    fan_in = layer.weight.shape[1] * layer.weight.shape[2] * layer.weight.shape[3]
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    layer.bias.uniform_(-bound, bound, generator=generator)

"""K plain MLPs of one architecture evaluated in one batched pass.

The networks' parameters live stacked in one flat buffer (``algorithms.optim.stack_parameters``): layer i
of all K networks is one [K, out, in] weight block and one [K, out] bias block. A batched forward is then
one matmul per layer for all K networks instead of K small ones; for the tiny critics of multi-agent
actor-critics the per-op overhead, not the arithmetic, is what costs, so this is where the speed is.
"""

from __future__ import annotations

import torch
from torch import nn

from agilerl_core.networks.transfer import ACTIVATION_FNS

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # (weight [K, out, in], bias [K, out]) per layer


def stackable(nets: list[nn.Module]) -> bool:
    """Whether `nets` (EvolvableNetworks) are plain MLPs of one architecture (no encoders, noise or dueling
    head), which :func:`stacked_forward` can evaluate together."""
    first = nets[0]
    spec = first.mlp.spec
    return (all(n.plain_mlp and n.mlp.spec == spec for n in nets) and not spec.noisy and not spec.dueling
            and first.obs_norm is None)


def layer_blocks(flat: torch.Tensor, nets: list[nn.Module]) -> Layers:
    """The (weight, bias) blocks of stacked `nets` as views of `flat` (their stacked parameter buffer, or a
    leaf tensor sharing its storage, so autograd reaches it), in layer order."""
    k = len(nets)
    shapes = [tuple(p.shape) for p in nets[0].parameters()]
    views, i = [], 0
    for shape in shapes:
        n = k
        for d in shape:
            n *= d
        views.append(flat[i: i + n].view(k, *shape))
        i += n
    return list(zip(views[0::2], views[1::2], strict=True))


def stacked_layer(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One linear layer of K stacked networks: [K, B, out] from a shared input [B, in] (one matmul against
    every network's rows) or one input each [K, B, in]."""
    k, out = w.shape[0], w.shape[1]
    if x.dim() == 2:
        return torch.addmm(b.reshape(-1), x, w.reshape(k * out, -1).t()).view(x.shape[0], k, out).transpose(0, 1)
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


def stacked_forward(layers: Layers, x: torch.Tensor, activation: str,
                    inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Outputs [K, B, out] of K stacked MLPs on `x`: one input [B, in] for all of them, or one each
    [K, B, in]. Each network computes exactly what its own forward would (up to float rounding). With
    `inputs` (a list), every layer's input is appended to it (what a hand-written backward needs)."""
    act = ACTIVATION_FNS[activation]
    h = x
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        if inputs is not None:
            inputs.append(h)
        h = stacked_layer(w, b, h)
        if i < last:
            h = act(h)
    return h

"""Hand-written forward/backward for plain MLP networks (no autograd).

For the small MLPs of classic-control RL, a gradient step is dominated by per-op overhead: autograd
roughly doubles the op count. Here the forward keeps its activations and the backward writes
gradients straight into the flat gradient buffer of :class:`FlatAdam`. The maths is identical to
autograd's (a test checks every activation and loss against it); networks with conv encoders use
autograd instead.
"""

from __future__ import annotations

import torch

from agilerl_core.networks.mlp import EvolvableMLP
from agilerl_core.networks.stacked import Layers, stacked_forward


def _layers(mlp: EvolvableMLP) -> list[torch.nn.Linear]:
    return [*mlp.hidden, mlp.out]


def forward_cached(mlp: EvolvableMLP, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and the inputs of every layer (x, then each post-activation hidden output)."""
    act = mlp.act
    inputs = [x]
    for layer in mlp.hidden:
        x = act(torch.addmm(layer.bias, x, layer.weight.t()))
        inputs.append(x)
    return torch.addmm(mlp.out.bias, x, mlp.out.weight.t()), inputs


def _act_grad_(grad: torch.Tensor, h: torch.Tensor, activation: str) -> torch.Tensor:
    """grad *= act'(pre-activation), computed from the activation's output h."""
    if activation == "relu":
        return grad.mul_(h > 0)
    if activation == "leaky_relu":
        return grad.mul_(torch.where(h > 0, 1.0, 0.01))
    if activation == "elu":
        return grad.mul_(torch.where(h > 0, 1.0, h + 1.0))
    if activation == "tanh":
        return grad.mul_(1.0 - h * h)
    raise ValueError(f"no fused gradient for activation {activation!r}")


def backward_into(mlp: EvolvableMLP, inputs: list[torch.Tensor], grad_out: torch.Tensor) -> None:
    """Accumulate d(loss)/d(params) into each parameter's .grad (views of the flat gradient)."""
    layers = _layers(mlp)
    activation = mlp.spec.activation
    g = grad_out
    for i in range(len(layers) - 1, -1, -1):
        layer, x = layers[i], inputs[i]
        layer.weight.grad.addmm_(g.t(), x)
        layer.bias.grad.add_(g.sum(0))
        if i > 0:
            g = _act_grad_(g.mm(layer.weight), x, activation)


# ---- K stacked MLPs (agilerl_core.networks.stacked) --------------------------------------------------------
def stacked_forward_cached(layers: Layers, x: torch.Tensor, activation: str
                           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """:func:`~agilerl_core.networks.stacked.stacked_forward`, also returning every layer's input."""
    inputs: list[torch.Tensor] = []
    return stacked_forward(layers, x, activation, inputs), inputs


def stacked_backward(layers: Layers, inputs: list[torch.Tensor], grad_out: torch.Tensor, activation: str,
                     grads: Layers | None = None, input_grad: bool = False) -> torch.Tensor | None:
    """Back-propagate `grad_out` [K, B, out] through K stacked MLPs: accumulate the weight and bias gradients
    into `grads` (blocks shaped like `layers`) when given; return the gradient of the input when
    `input_grad` ([B, in] for a shared input, else [K, B, in])."""
    g = grad_out
    for i in range(len(layers) - 1, -1, -1):
        w, x = layers[i][0], inputs[i]
        k, out = w.shape[0], w.shape[1]
        shared = x.dim() == 2
        if grads is not None:
            gw, gb = grads[i]
            if shared:
                gw.view(k * out, -1).addmm_(g.permute(0, 2, 1).reshape(k * out, -1), x)
            else:
                gw.baddbmm_(g.transpose(1, 2), x)
            gb.add_(g.sum(1))
        if i == 0 and not input_grad:
            return None
        if shared:
            g = g.transpose(0, 1).reshape(x.shape[0], k * out).mm(w.reshape(k * out, -1))
        else:
            g = torch.bmm(g, w)
        if i > 0:
            g = _act_grad_(g, x, activation)
    return g

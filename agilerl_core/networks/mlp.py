"""Evolvable multi-layer perceptron, optionally with noisy linear layers and a dueling head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from agilerl_core.networks.transfer import ACTIVATION_FNS, copy_overlap, init_linear


@dataclass(frozen=True)
class MLPSpec:
    """Architecture of an MLP: input width, hidden widths, output width, hidden activation.

    ``noisy``: every layer is a :class:`NoisyLinear`. ``dueling`` = k > 0: the output is
    (out_dim // k) advantage groups of k values each plus one value group of k (Wang et al. 2016),
    combined as V + A - mean(A); k is 1 for a dueling Q head, the number of atoms for C51.
    """

    in_dim: int
    out_dim: int
    hidden: tuple[int, ...]
    activation: str = "relu"
    noisy: bool = False
    dueling: int = 0

    def to_dict(self) -> dict:
        d = {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": list(self.hidden),
             "activation": self.activation}
        if self.noisy or self.dueling:
            d.update(noisy=self.noisy, dueling=self.dueling)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MLPSpec:
        return cls(int(d["in_dim"]), int(d["out_dim"]), tuple(int(h) for h in d["hidden"]), str(d["activation"]),
                   bool(d.get("noisy", False)), int(d.get("dueling", 0)))


class NoisyLinear(nn.Module):
    """Linear layer with factorised Gaussian parameter noise (Fortunato et al., ICLR 2018)::

        y = (mu_w + sigma_w * f(e_out) f(e_in)^T) x + mu_b + sigma_b * f(e_out),  f(e) = sign(e) sqrt(|e|)

    The noise is redrawn by :meth:`resample` from an explicit generator; with noise off (evaluation)
    the layer is the mean linear map. Parameters keep Linear-like names (`weight_mu`, `bias_mu`, ...).
    """

    def __init__(self, in_dim: int, out_dim: int, std_init: float = 0.5,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.std_init = in_dim, out_dim, std_init
        self.weight_mu = nn.Parameter(torch.empty(out_dim, in_dim))
        self.weight_sigma = nn.Parameter(torch.empty(out_dim, in_dim))
        self.bias_mu = nn.Parameter(torch.empty(out_dim))
        self.bias_sigma = nn.Parameter(torch.empty(out_dim))
        self.register_buffer("eps_in", torch.zeros(in_dim), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_dim), persistent=False)
        self.noise_on = False
        bound = 1.0 / math.sqrt(in_dim) if in_dim else 0.0
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound, generator=generator)
            self.bias_mu.uniform_(-bound, bound, generator=generator)
            self.weight_sigma.fill_(std_init * bound)
            self.bias_sigma.fill_(std_init * bound)

    @staticmethod
    def _f(x: torch.Tensor) -> torch.Tensor:
        return x.sign() * x.abs().sqrt()

    @torch.no_grad()
    def resample(self, generator: torch.Generator | None) -> None:
        self.eps_in.copy_(self._f(torch.randn(self.in_dim, generator=generator)))
        self.eps_out.copy_(self._f(torch.randn(self.out_dim, generator=generator)))
        self.noise_on = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.noise_on:
            return torch.nn.functional.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in)
        return torch.nn.functional.linear(x, weight, self.bias_mu + self.bias_sigma * self.eps_out)


class EvolvableMLP(nn.Module):
    """An MLP rebuilt from its spec; parameter names (`hidden.i`, `out`, `value`) are stable across mutations."""

    def __init__(self, spec: MLPSpec, generator: torch.Generator | None = None, noisy_std: float = 0.5) -> None:
        super().__init__()
        self.spec = spec
        self.noisy_std = noisy_std
        dims = [spec.in_dim, *spec.hidden]
        self.hidden = nn.ModuleList(self._layer(a, b, generator) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = self._layer(dims[-1], spec.out_dim, generator)
        self.value = self._layer(dims[-1], spec.dueling, generator) if spec.dueling else None
        self.act = ACTIVATION_FNS[spec.activation]

    def _layer(self, a: int, b: int, generator: torch.Generator | None) -> nn.Module:
        if self.spec.noisy:
            return NoisyLinear(a, b, self.noisy_std, generator)
        layer = nn.Linear(a, b)
        init_linear(layer, generator)
        return layer

    def noisy_layers(self) -> list[NoisyLinear]:
        return [m for m in self.modules() if isinstance(m, NoisyLinear)]

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden layers: the output layer's input (`x` itself when there are none)."""
        act = self.act
        for layer in self.hidden:
            x = act(layer(x))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.trunk(x)
        if self.value is None:
            return self.out(x)
        k = self.spec.dueling
        adv = self.out(x).view(x.shape[0], -1, k)
        q = self.value(x).view(x.shape[0], 1, k) + adv - adv.mean(dim=1, keepdim=True)
        return q.reshape(x.shape[0], -1)

    def rebuilt(self, spec: MLPSpec, generator: torch.Generator | None = None) -> EvolvableMLP:
        """A new MLP with `spec` in which every weight that still exists keeps its value.

        A new hidden layer appended after the last one starts as the identity (noise scales zero), so
        with ReLU the network computes exactly the same function; new units get zero outgoing weights.
        """
        return EvolvableMLP.rebuilt_from(dict(self.named_parameters()), spec, generator, self.noisy_std)

    @classmethod
    def rebuilt_from(cls, old_params: dict[str, torch.Tensor], spec: MLPSpec, generator: torch.Generator | None,
                     noisy_std: float = 0.5) -> EvolvableMLP:
        """:meth:`rebuilt` from the old MLP's parameters by name (views of a member's buffer: no old module)."""
        new = cls(spec, generator, noisy_std)
        new_params = dict(new.named_parameters())
        with torch.no_grad():
            for name, p in new_params.items():
                layer, _, kind = name.rpartition(".")
                weight = new_params.get(f"{layer}.weight", new_params.get(f"{layer}.weight_mu"))
                square_new = f"{layer}.{kind}" not in old_params and weight.shape[0] == weight.shape[1]
                if name in old_params:
                    copy_overlap(p, old_params[name])
                elif square_new and kind in ("weight", "weight_mu"):
                    p.copy_(torch.eye(p.shape[0]))
                elif square_new:  # its bias, and the noise scales of a new identity layer start at zero
                    p.zero_()
        return new


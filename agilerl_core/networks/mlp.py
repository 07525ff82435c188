"""Evolvable multi-layer perceptron."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from agilerl_core.networks.transfer import ACTIVATION_FNS, copy_overlap, init_linear


@dataclass(frozen=True)
class MLPSpec:
    """Architecture of an MLP: input width, hidden widths, output width, hidden activation."""

    in_dim: int
    out_dim: int
    hidden: tuple[int, ...]
    activation: str = "relu"

    def to_dict(self) -> dict:
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": list(self.hidden),
                "activation": self.activation}

    @classmethod
    def from_dict(cls, d: dict) -> MLPSpec:
        return cls(int(d["in_dim"]), int(d["out_dim"]), tuple(int(h) for h in d["hidden"]), str(d["activation"]))


class EvolvableMLP(nn.Module):
    """An MLP rebuilt from its spec; parameter names (`hidden.i`, `out`) are stable across mutations."""

    def __init__(self, spec: MLPSpec, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.spec = spec
        dims = [spec.in_dim, *spec.hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = nn.Linear(dims[-1], spec.out_dim)
        for layer in [*self.hidden, self.out]:
            init_linear(layer, generator)
        self.act = ACTIVATION_FNS[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.act
        for layer in self.hidden:
            x = act(layer(x))
        return self.out(x)

    def rebuilt(self, spec: MLPSpec, generator: torch.Generator | None = None) -> EvolvableMLP:
        """A new MLP with `spec` in which every weight that still exists keeps its value.

        A new hidden layer appended after the last one starts as the identity, so with ReLU the
        network computes exactly the same function; new units get zero outgoing weights.
        """
        new = EvolvableMLP(spec, generator)
        old_params = dict(self.named_parameters())
        with torch.no_grad():
            for name, p in new.named_parameters():
                if name in old_params:
                    copy_overlap(p, old_params[name])
                elif name.endswith("weight") and p.shape[0] == p.shape[1]:
                    p.copy_(torch.eye(p.shape[0]))
                elif name.endswith("bias") and f"{name[:-4]}weight" not in old_params:
                    w = dict(new.named_parameters())[f"{name[:-4]}weight"]
                    if w.shape[0] == w.shape[1]:
                        p.zero_()
        return new


"""Evolvable convolutional encoder: convs, flatten, linear projection to a latent vector."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from agilerl_core.networks.transfer import ACTIVATION_FNS, copy_overlap, init_conv, init_linear


@dataclass(frozen=True)
class CNNSpec:
    """Architecture of a conv encoder over images of shape in_chw (channels first)."""

    in_chw: tuple[int, int, int]
    channels: tuple[int, ...]
    kernels: tuple[int, ...]
    strides: tuple[int, ...]
    latent_dim: int
    activation: str = "relu"

    def conv_output(self) -> tuple[int, int, int]:
        """(C, H, W) after the convs; H or W <= 0 means the spec is invalid."""
        _, h, w = self.in_chw
        for k, s in zip(self.kernels, self.strides, strict=True):
            h, w = (h - k) // s + 1, (w - k) // s + 1
        return self.channels[-1], h, w

    def is_valid(self) -> bool:
        _, h, w = self.in_chw
        for k, s in zip(self.kernels, self.strides, strict=True):
            if k > h or k > w:
                return False
            h, w = (h - k) // s + 1, (w - k) // s + 1
        return h >= 1 and w >= 1

    def to_dict(self) -> dict:
        return {"in_chw": list(self.in_chw), "channels": list(self.channels), "kernels": list(self.kernels),
                "strides": list(self.strides), "latent_dim": self.latent_dim, "activation": self.activation}

    @classmethod
    def from_dict(cls, d: dict) -> CNNSpec:
        return cls(tuple(int(x) for x in d["in_chw"]), tuple(int(x) for x in d["channels"]),
                   tuple(int(x) for x in d["kernels"]), tuple(int(x) for x in d["strides"]),
                   int(d["latent_dim"]), str(d["activation"]))


class EvolvableCNN(nn.Module):
    """Conv layers (`convs.i`) then a projection (`proj`) to `latent_dim`, activation after each."""

    def __init__(self, spec: CNNSpec, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not spec.is_valid():
            raise ValueError(f"conv spec {spec} leaves no spatial output for images of shape {spec.in_chw}")
        self.spec = spec
        chans = [spec.in_chw[0], *spec.channels]
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, kernel_size=k, stride=s)
            for a, b, k, s in zip(chans[:-1], chans[1:], spec.kernels, spec.strides, strict=True))
        c, h, w = spec.conv_output()
        self.proj = nn.Linear(c * h * w, spec.latent_dim)
        for conv in self.convs:
            init_conv(conv, generator)
        init_linear(self.proj, generator)
        self.act = ACTIVATION_FNS[spec.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.act
        for conv in self.convs:
            x = act(conv(x))
        return act(self.proj(x.flatten(1)))

    def rebuilt(self, spec: CNNSpec, generator: torch.Generator | None = None) -> EvolvableCNN:
        """A new encoder with `spec` in which every weight that still exists keeps its value.

        Kernels are aligned on their centres; the projection is matched per (channel, row, column) of
        the conv output, so a channel keeps its projection weights when others are added or removed.
        """
        new = EvolvableCNN(spec, generator)
        old_params = dict(self.named_parameters())
        c_new, h_new, w_new = spec.conv_output()
        c_old, h_old, w_old = self.spec.conv_output()
        with torch.no_grad():
            for name, p in new.named_parameters():
                if name not in old_params:
                    continue
                old = old_params[name]
                if name == "proj.weight":
                    copy_overlap(p.view(p.shape[0], c_new, h_new, w_new),
                                 old.view(old.shape[0], c_old, h_old, w_old))
                elif p.ndim == 4:
                    copy_overlap(p, old, centered_dims=(2, 3))
                else:
                    copy_overlap(p, old)
        return new

"""Evolvable convolutional encoder: convs, flatten, linear projection to a latent vector."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from agilerl_core.envs.spaces import IMAGE_SCALES as INPUT_SCALES
from agilerl_core.networks.transfer import ACTIVATION_FNS, copy_overlap, init_conv, init_linear

ATARI_CHANNELS = (32, 64, 64)
ATARI_KERNELS = (8, 4, 3)  # the Nature-DQN encoder (Mnih et al. 2015), for frames of ATARI_MIN_SIDE px or more
ATARI_STRIDES = (4, 2, 1)
ATARI_MIN_SIDE = 36  # the smallest square frame the Atari stack leaves a 1x1 output for


def default_conv_layers(h: int, w: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(kernels, strides) of the default conv stack for frames of h x w pixels; None when no conv fits.

    Chosen from the short side s, so that every layer fits without padding (which the stacked member-major
    convolutions do not take) and small grids are not strided away:

    - s >= 36 (Atari-like): kernels 8, 4, 3 with strides 4, 2, 1, the encoder every existing config and
      checkpoint of such frames has;
    - 20 <= s < 36: kernels 5, 4, 3 with strides 2, 2, 1;
    - 12 <= s < 20: kernels 4, 3, 3 with strides 2, 1, 1;
    - 5 <= s < 12 (grid views such as MiniGrid's 7x7): 3x3 kernels with stride 1, as many (up to 3) as keep
      an output of at least 3x3 (7x7: two layers, 7 -> 5 -> 3; 10x10: three, 10 -> 8 -> 6 -> 4);
    - 2 <= s < 5: 2x2 kernels with stride 1, one layer (two for s = 4);
    - s < 2: None.
    """
    s = min(h, w)
    if s >= ATARI_MIN_SIDE:
        return ATARI_KERNELS, ATARI_STRIDES
    if s >= 20:
        return (5, 4, 3), (2, 2, 1)
    if s >= 12:
        return (4, 3, 3), (2, 1, 1)
    if s >= 5:
        n = min(3, (s - 3) // 2)
        return (3,) * n, (1,) * n
    if s >= 2:
        n = 2 if s == 4 else 1
        return (2,) * n, (1,) * n
    return None


@dataclass(frozen=True)
class CNNSpec:
    """Architecture of a conv encoder over images of shape in_chw (channels first).

    `input_scale` records how the encoder's images were scaled into network input (see
    :func:`agilerl_core.envs.spaces.image_scale`); None is the scaling every checkpoint written before the
    field existed was trained with (uint8 / 255, other dtypes as they are), and is left out of :meth:`to_dict`
    so such specs read and write exactly as before. ``observed`` (a uint8 image declared 0-255 whose env showed
    only small codes) scales channel c by ``1 / input_high[c]``, the tops a probe of the env found
    (:func:`agilerl_core.envs.spaces.observed_highs`): recorded here, so a saved member scales as in training
    whatever its env shows when it is loaded."""

    in_chw: tuple[int, int, int]
    channels: tuple[int, ...]
    kernels: tuple[int, ...]
    strides: tuple[int, ...]
    latent_dim: int
    activation: str = "relu"
    input_scale: str | None = None  # "pixels", "bounds", "none", "observed"; None: by the stored dtype, as before
    input_high: tuple[float, ...] | None = None  # "observed" only: each channel's top

    def conv_output(self) -> tuple[int, int, int]:
        """(C, H, W) after the convs; H or W <= 0 means the spec is invalid."""
        _, h, w = self.in_chw
        for k, s in zip(self.kernels, self.strides, strict=True):
            h, w = (h - k) // s + 1, (w - k) // s + 1
        return self.channels[-1], h, w

    def is_valid(self) -> bool:
        """Whether every layer fits its input and leaves at least a 1x1 output."""
        _, h, w = self.in_chw
        for k, s in zip(self.kernels, self.strides, strict=True):
            if k > h or k > w:
                return False
            h, w = (h - k) // s + 1, (w - k) // s + 1
        return h >= 1 and w >= 1

    def to_dict(self) -> dict:
        """The spec as JSON data (`input_scale` only where set)."""
        d = {"in_chw": list(self.in_chw), "channels": list(self.channels), "kernels": list(self.kernels),
             "strides": list(self.strides), "latent_dim": self.latent_dim, "activation": self.activation}
        if self.input_scale is not None:
            d["input_scale"] = self.input_scale
        if self.input_high is not None:
            d["input_high"] = list(self.input_high)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> CNNSpec:
        """Inverse of :meth:`to_dict`; a spec without `input_scale` (written before it existed) keeps None."""
        scale = d.get("input_scale")
        if scale is not None and scale not in INPUT_SCALES:
            raise ValueError(f"cnn input_scale {str(scale)[:40]!r} is not one of {', '.join(INPUT_SCALES)}")
        chw = tuple(int(x) for x in d["in_chw"])
        high = d.get("input_high")
        if (scale == "observed") != (high is not None):
            raise ValueError("cnn input_high is given with input_scale observed, and only then")
        if high is not None:
            if not (isinstance(high, list) and len(high) == chw[0] and all(
                    isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                    for x in high)):
                raise ValueError(f"cnn input_high: expected {chw[0]} finite positive numbers (one per channel), "
                                 f"found {str(high)[:100]}")
            high = tuple(float(x) for x in high)
        return cls(chw, tuple(int(x) for x in d["channels"]),
                   tuple(int(x) for x in d["kernels"]), tuple(int(x) for x in d["strides"]),
                   int(d["latent_dim"]), str(d["activation"]), scale, high)


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
        return EvolvableCNN.rebuilt_from(dict(self.named_parameters()), self.spec, spec, generator)

    @classmethod
    def rebuilt_from(cls, old_params: dict[str, torch.Tensor], old_spec: CNNSpec, spec: CNNSpec,
                     generator: torch.Generator | None) -> EvolvableCNN:
        """:meth:`rebuilt` from the old encoder's spec and parameters by name (no old module)."""
        new = cls(spec, generator)
        c_new, h_new, w_new = spec.conv_output()
        c_old, h_old, w_old = old_spec.conv_output()
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

"""Temporally correlated exploration noise: colored (1/f^beta) Gaussian sequences, pink for beta = 1 (Eberhard
et al. 2023, "Pink Noise Is All You Need"). White noise (beta = 0) changes every step and averages out over a
few; pink noise drifts on every time scale at once, so an actor pushed by it commits to a direction long enough to
leave a valley (MountainCarContinuous) while still varying step to step. Each sequence has unit variance, so the
exploration scale means what it means for Gaussian noise."""

from __future__ import annotations

import torch


def colored_sequences(white: torch.Tensor, beta: torch.Tensor | float) -> torch.Tensor:
    """Sequences along the last dim of `white` (standard normals) whose power spectrum falls as 1/f^beta, each of
    unit variance in expectation. `beta`: a float or a tensor broadcasting against ``white[..., :1]`` (one exponent
    per member)."""
    length = white.shape[-1]
    freqs = torch.fft.rfftfreq(length, device=white.device, dtype=torch.float64)
    freqs[0] = 1.0 / length  # the lowest frequency stands for the constant term (as colorednoise does)
    beta = torch.as_tensor(beta, dtype=torch.float64, device=white.device)
    scale = freqs.pow(-beta / 2.0)  # [..., F] by broadcasting
    full = scale.pow(2)  # the one-sided spectrum counted twice but for the constant term (and Nyquist, L even)
    total = 2.0 * full.sum(-1, keepdim=True) - full[..., :1]
    if length % 2 == 0:
        total = total - full[..., -1:]
    std = (total / length).sqrt()
    spectrum = torch.fft.rfft(white.double(), dim=-1) * scale
    return (torch.fft.irfft(spectrum, n=length, dim=-1) / std).to(white.dtype)


class ColoredNoise:
    """A group's colored exploration noise for one training phase: per member and env, a sequence of `length`
    steps drawn at once from the group's keyed stream and read a step per call; a new one every `length` calls.
    The draws happen at the same calls whatever the group (a phase's groups are built afresh and all members
    step together), so a member's noise is the same alone or in any group."""

    def __init__(self, length: int, beta: torch.Tensor) -> None:
        self.length, self.beta = int(length), beta  # beta [K, 1, 1, 1]
        self.seq: torch.Tensor | None = None
        self.t = 0

    def next(self, stream, n: int, a: int) -> torch.Tensor:
        """[K, N, A] unit-variance noise for this step."""
        if self.seq is None or self.t >= self.length or self.seq.shape[1:3] != (n, a):
            self.seq = colored_sequences(stream.normal(n, a, self.length), self.beta)
            self.t = 0
        z = self.seq[..., self.t]
        self.t += 1
        return z

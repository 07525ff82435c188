"""Running observation normalisation: x -> clip((x - mean) / sqrt(var + eps), -clip, clip).

One normaliser belongs to an agent and is shared by reference by all of its networks (online and
target), so every network sees the same input scale. The statistics are float64 sums merged batch by
batch (Chan et al.'s parallel update), updated only from the experience the member collects while
training (never during evaluation), and saved with the member's checkpoint; a clone copies them.
Replay buffers and rollouts keep raw observations: a batch is normalised with the statistics current
when it is used.
"""

from __future__ import annotations

import torch


class RunningObsNorm:
    """Running mean and variance of the flat observation vector, applied at the networks' input."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        if dim < 1:  # Experiment's config check names the field; this guards direct engine use
            raise ValueError("observation normalisation needs a vector part in the observation")
        self.dim = int(dim)
        self.clip = float(clip)
        self.eps = float(eps)
        self.mean = torch.zeros(self.dim, dtype=torch.float64)
        self.var = torch.ones(self.dim, dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.float64)
        self._refresh()

    def _refresh(self) -> None:
        self._shift = self.mean.to(torch.float32)
        self._scale = torch.rsqrt(self.var + self.eps).to(torch.float32)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch [B, dim] of observations into the statistics."""
        x = x.detach().reshape(-1, self.dim).to(device="cpu", dtype=torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean = x.mean(0)
        batch_var = x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta.square() * (self.count * n / total)
        self.mean = self.mean + delta * (n / total)
        self.var = m2 / total
        self.count = total
        self._refresh()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shift, scale = self._shift, self._scale
        if shift.device != x.device:
            shift, scale = self._shift, self._scale = shift.to(x.device), scale.to(x.device)
        return ((x - shift) * scale).clamp_(-self.clip, self.clip)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count.clone()}

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`tensors` output (shapes checked: a checkpoint for another env is refused)."""
        for key in ("mean", "var", "count"):
            if key not in tensors:
                raise ValueError(f"observation normaliser state is missing {key!r}")
        if tuple(tensors["mean"].shape) != (self.dim,) or tuple(tensors["var"].shape) != (self.dim,):
            raise ValueError(f"observation normaliser state has shape {tuple(tensors['mean'].shape)}, "
                             f"the observation vector has {self.dim} values")
        self.mean = tensors["mean"].to(torch.float64).clone()
        self.var = tensors["var"].to(torch.float64).clone()
        self.count = tensors["count"].to(torch.float64).reshape(()).clone()
        self._refresh()

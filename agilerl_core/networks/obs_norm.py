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


def merged(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, x: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Statistics ``mean``, ``var`` [..., dim] over ``count`` [...] observations with the batch `x` [..., B, dim]
    (float64) merged in (Chan et al.'s parallel update): the new (mean, var, count)."""
    n = x.shape[-2]
    batch_mean = x.mean(-2)
    batch_var = x.var(-2, unbiased=False)
    total = count + n
    delta = batch_mean - mean
    m2 = var * count.unsqueeze(-1) + batch_var * n + delta.square() * (count * n / total).unsqueeze(-1)
    return mean + delta * (n / total).unsqueeze(-1), m2 / total.unsqueeze(-1), total


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
        self.stack: StackedObsNorm | None = None  # the group that took it last (see StackedObsNorm)
        self._refresh()

    def _refresh(self) -> None:
        self._shift = self.mean.to(torch.float32)
        self._scale = torch.rsqrt(self.var + self.eps).to(torch.float32)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch [B, dim] of observations into the statistics."""
        x = x.detach().reshape(-1, self.dim).to(device="cpu", dtype=torch.float64)
        if x.shape[0] == 0:
            return
        self.mean, self.var, self.count = merged(self.mean, self.var, self.count, x)
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


class StackedObsNorm:
    """K members' normalisers as one [K, dim] state on the group's device for a training phase: a group's
    networks normalise every member's rows in one op, and :meth:`update` folds a step's observations of all
    members in at once (no per-member copy to the host). :meth:`write_back` returns each member's statistics
    to its own normaliser at the end of the phase; until then the members' own are left as they were."""

    def __init__(self, norms: list[RunningObsNorm], device: torch.device | str) -> None:
        self.norms = list(norms)
        self.clip, self.eps = norms[0].clip, norms[0].eps
        self.mean = torch.stack([n.mean for n in norms]).to(device)
        self.var = torch.stack([n.var for n in norms]).to(device)
        self.count = torch.stack([n.count for n in norms]).to(device)
        for n in norms:
            n.stack = self  # the group's networks, built next, normalise through this
        self._refresh()

    def _refresh(self) -> None:
        self.shift = self.mean.to(torch.float32).unsqueeze(1)  # [K, 1, dim]
        self.scale = torch.rsqrt(self.var + self.eps).to(torch.float32).unsqueeze(1)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge every member's batch `x` [K, B, dim] into its statistics."""
        if x.shape[1]:
            self.mean, self.var, self.count = merged(self.mean, self.var, self.count, x.detach().to(torch.float64))
            self._refresh()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Member-major vectors [K, B, dim], each normalised with its member's statistics."""
        return ((x - self.shift) * self.scale).clamp(-self.clip, self.clip)

    def write_back(self) -> None:
        mean, var, count = self.mean.cpu(), self.var.cpu(), self.count.cpu()  # one read for the group
        for i, n in enumerate(self.norms):
            n.mean, n.var, n.count = mean[i].clone(), var[i].clone(), count[i].clone()
            n._refresh()

"""A member's LoRA adapter as plain tensors: for every target module of the base, A (rank x in) and B
(out x rank); the module's output gains ``scale * B @ A @ x``.

The adapter owns its tensors; the shared base model borrows them while the member works
(:meth:`agilerl_core.llm.base_model.SharedBase.bound`). So cloning a member is copying a few small tensors,
and a member that leaves the population frees its adapter with it: no per-member state lives in the base.

Rank mutations keep what the adapter has learned: growing appends new rows of A (freshly initialised) and
zero columns of B, so the adapter's function is unchanged; shrinking keeps the largest singular components of
each ``B @ A``. ``scale`` stays fixed through both (it is set once from the config's alpha / rank), so a rank
change never rescales the update.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _init_a(rank: int, fan_in: int, generator: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """LoRA's usual A initialisation (Kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)))."""
    bound = 1.0 / math.sqrt(fan_in)
    a = torch.rand(rank, fan_in, generator=generator) * (2 * bound) - bound
    return a.to(device)


class LoraAdapter:
    """One member's LoRA weights over the shared base's target modules (named as in the base)."""

    def __init__(self, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], scale: float) -> None:
        if set(a) != set(b):
            raise ValueError("every LoRA target needs both A and B")
        self.names = sorted(a)
        self.a = {n: nn.Parameter(a[n].detach().clone()) for n in self.names}
        self.b = {n: nn.Parameter(b[n].detach().clone()) for n in self.names}
        ranks = {self.a[n].shape[0] for n in self.names} | {self.b[n].shape[1] for n in self.names}
        if len(ranks) != 1:
            raise ValueError(f"LoRA tensors disagree on the rank: {sorted(ranks)}")
        self.scale = float(scale)
        if not math.isfinite(self.scale):
            raise ValueError(f"LoRA scale {scale!r} is not a finite number")

    @classmethod
    def initial(cls, shapes: dict[str, tuple[int, int]], rank: int, scale: float, generator: torch.Generator,
                device: str | torch.device = "cpu") -> LoraAdapter:
        """A fresh adapter: random A, zero B (the base model's function, exactly)."""
        names = sorted(shapes)
        a = {n: _init_a(rank, shapes[n][0], generator, device) for n in names}
        b = {n: torch.zeros(shapes[n][1], rank, device=device) for n in names}
        return cls(a, b, scale)

    @property
    def rank(self) -> int:
        return int(self.a[self.names[0]].shape[0])

    def parameters(self) -> list[nn.Parameter]:
        """Every trainable tensor, in a fixed order (A then B per module, modules sorted)."""
        return [p for n in self.names for p in (self.a[n], self.b[n])]

    def param_names(self) -> list[str]:
        return [f"{n}.{part}" for n in self.names for part in ("lora_A", "lora_B")]

    def numel(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: p.detach() for k, p in zip(self.param_names(), self.parameters(), strict=True)}

    def clone(self) -> LoraAdapter:
        return LoraAdapter({n: self.a[n] for n in self.names}, {n: self.b[n] for n in self.names}, self.scale)

    def delta(self, name: str) -> torch.Tensor:
        """The module's weight update ``scale * B @ A`` (out x in)."""
        return self.scale * (self.b[name] @ self.a[name])

    # ---- rank mutations --------------------------------------------------------------------------------
    @torch.no_grad()
    def grown(self, rank: int, generator: torch.Generator) -> LoraAdapter:
        """The same function at a larger rank: new A rows initialised as LoRA does, new B columns zero."""
        if rank < self.rank:
            raise ValueError(f"grown: rank {rank} is smaller than the current {self.rank}")
        extra = rank - self.rank
        a, b = {}, {}
        for n in self.names:
            old_a, old_b = self.a[n], self.b[n]
            a[n] = torch.cat([old_a, _init_a(extra, old_a.shape[1], generator, old_a.device)])
            b[n] = torch.cat([old_b, old_b.new_zeros(old_b.shape[0], extra)], dim=1)
        return LoraAdapter(a, b, self.scale)

    @torch.no_grad()
    def shrunk(self, rank: int) -> LoraAdapter:
        """The best rank-`rank` approximation of every module's ``B @ A`` (its largest singular components),
        split evenly between the new B and A."""
        if not 1 <= rank <= self.rank:
            raise ValueError(f"shrunk: rank {rank} must lie in [1, {self.rank}]")
        a, b = {}, {}
        for n in self.names:
            # B @ A = (Qb Rb)(Ra^T Qa^T): the SVD of the small r x r core gives that of the product
            qb, rb = torch.linalg.qr(self.b[n].double())
            qa, ra = torch.linalg.qr(self.a[n].double().T)
            u, s, vh = torch.linalg.svd(rb @ ra.T)
            root = s[:rank].sqrt()
            b[n] = ((qb @ u[:, :rank]) * root).to(self.b[n].dtype)
            a[n] = (root[:, None] * (vh[:rank] @ qa.T)).to(self.a[n].dtype)
        return LoraAdapter(a, b, self.scale)

"""The pieces the LLM algorithms' learn steps are built from: what a training phase reports
(:class:`PhaseMetrics`), the cuts of a batch, or of a group's rows, into micro-batches (:func:`chunks`,
:func:`row_pieces`), right-padded completion ids (:func:`batch_ids`) and per-token GAE (:func:`token_gae`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PhaseMetrics:
    """What a member's training phase reports (summed over its learn steps, averaged by :meth:`means`)."""

    steps: int = 0
    samples: int = 0
    sums: dict[str, float] | None = None

    def add(self, samples: int, **values: float) -> None:
        self.steps += 1
        self.samples += samples
        self.sums = self.sums or {}
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def means(self) -> dict[str, float]:
        return {k: v / self.steps for k, v in (self.sums or {}).items()}


def chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def row_pieces(sizes: list[int], size: int) -> list[list[tuple[int, slice]]]:
    """The rows of several members (member i has sizes[i], in member order) cut into pieces of at most `size`
    rows: each piece is a list of (member, that member's rows in it). A group's micro-batches: memory per
    forward stays what `size` says, whatever the group's size; the maths is the same for any cut."""
    pieces: list[list[tuple[int, slice]]] = []
    room = 0
    for i, n in enumerate(sizes):
        start = 0
        while start < n:
            if room == 0:
                pieces.append([])
                room = size
            take = min(room, n - start)
            pieces[-1].append((i, slice(start, start + take)))
            start, room = start + take, room - take
    return pieces


def batch_ids(seqs: list[list[int]], pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (ids, mask) of completion token lists."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    return ids.to(device), mask.to(device)


def token_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [n, T], of completions whose token rewards and values are [n, T] (`mask`: 1 on
    real tokens; a completion ends after its last real token, where the value of what follows is 0)."""
    n, steps = rewards.shape
    adv = torch.zeros_like(rewards)
    running = torch.zeros(n, dtype=rewards.dtype, device=rewards.device)
    for t in range(steps - 1, -1, -1):
        alive = mask[:, t + 1] if t + 1 < steps else torch.zeros_like(running)
        next_value = values[:, t + 1] * alive if t + 1 < steps else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * alive * running) * mask[:, t]
        adv[:, t] = running
    return adv, (adv + values) * mask

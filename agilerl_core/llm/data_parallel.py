"""Data-parallel training of one LLM member across processes (Accelerate): for a member too large or too
slow for one device, `model.data_parallel: N` trains each phase in N processes, one device each.

Every process holds the base and the member's adapter and draws the same samples (GRPO's completions come
from one seeded generator, so they are identical everywhere); the backward passes over the step's
micro-batches are shared out (process r takes micro-batches r, r+N, ...); the adapter gradients are summed
across processes before clipping, and every process takes the same Adam step. The result is the
single-process step up to float summation order (a test checks it with two CPU processes).

This module is a process's share of such a step; the launcher (one phase in N processes) is the LLM arena's,
:mod:`agilerl_core.arenas.llm_data_parallel`.
"""

from __future__ import annotations

from typing import Any

import torch


class DataParallel:
    """This process's share of a data-parallel step and the sums across processes."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.rank, self.world = accelerator.process_index, accelerator.num_processes

    def mine(self, parts: list) -> list:
        """This process's micro-batches of a step."""
        return parts[self.rank:: self.world]

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        """Every process's gradients summed into each process's `params` (missing ones count as 0)."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        flat = self.accelerator.reduce(torch.cat([g.reshape(-1) for g in grads]), reduction="sum")
        i = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[i: i + n].view_as(g).clone()
            i += n

    def sum_floats(self, values: list[float]) -> list[float]:
        return self.accelerator.reduce(torch.tensor(values, dtype=torch.float64), reduction="sum").tolist()

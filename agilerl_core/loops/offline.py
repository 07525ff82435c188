"""The offline loop: a group's members take gradient steps on one fixed dataset, no env stepped
(:func:`train_group_offline`, which :class:`~agilerl_core.arenas.offline.OfflineArena` calls)."""

from __future__ import annotations

import time

import torch

from agilerl_core import progress
from agilerl_core.algorithms.group import ReplayGroup
from agilerl_core.buffers.replay import ReplayBuffer
from agilerl_core.finite import FirstBad
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import marks


def train_group_offline(group: ReplayGroup, slots: list[int], dataset: ReplayBuffer, learn_steps: int
                        ) -> list[TrainResult]:
    """`learn_steps` gradient steps of every member of a stacked group on the dataset's buffer (no env
    interaction): every step is one batched step, each member on its own batch drawn with its own generator
    (which its checkpoint carries), so the result depends only on the members and the dataset;
    ``env_steps`` reports the gradient steps (the offline budget unit). A member alone is a group of one."""
    t0 = time.perf_counter()
    loss_sum = torch.zeros(group.k)
    everyone = [True] * group.k
    bad_loss = FirstBad(group.k, group.device)  # each member's first non-finite loss, read once at the end
    marked = marks(learn_steps, learn_steps)  # a long phase's points, at each member's gradient steps so far
    for step in range(1, learn_steps + 1):
        loss = group.learn_step(dataset, slots, everyone)
        bad_loss.see(loss, step)
        loss_sum += loss
        progress.advance(group.k)
        if step in marked:
            group.metrics.mark([a.learn_steps for a in group.agents])
    bad_loss.check(slots, "the loss")
    group.write_back()
    diagnostics, points = group.metrics.means(), group.metrics.points()
    wall = time.perf_counter() - t0
    out = []
    for s, loss, d, p in zip(slots, loss_sum.tolist(), diagnostics, points, strict=True):
        mean = float(loss) / max(learn_steps, 1)
        metrics = {**d, "loss": mean, **({"learn_steps_per_s": learn_steps / wall} if wall > 0 else {})}
        out.append(TrainResult(s, learn_steps, learn_steps, 0, float("nan"), mean, wall, metrics, p))
    return out

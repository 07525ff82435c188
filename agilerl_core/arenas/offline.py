"""The offline arena: members learn from one fixed dataset (CQN, CQL, behaviour cloning, or any off-policy
algorithm) and are evaluated online in the env. The budget counts gradient steps.

The dataset is resolved (an ``s3://`` one downloaded into the local cache and verified), checked against
the env and against the pinned content hash (``dataset.sha256``), and loaded into one read-only buffer that
every member samples from with its own generator.
"""

from __future__ import annotations

import time

import torch

from agilerl_core import progress
from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.algorithms.group import ReplayGroup
from agilerl_core.arenas.base import GymArena
from agilerl_core.buffers.replay import ReplayBuffer
from agilerl_core.data.fetch import check_pin
from agilerl_core.data.loader import Dataset, check_fits, dataset_buffer, load_dataset
from agilerl_core.finite import FirstBad
from agilerl_core.io.storage import s3_options
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


def load_checked_dataset(cfg, obs_space, act_space) -> Dataset:
    """The config's dataset (downloaded into the cache if on S3), checked against the env and its pin."""
    ds = load_dataset(cfg.dataset.uri, cfg.dataset.format, s3_options(cfg), cfg.dataset.cache_dir,
                      getattr(cfg, "limits", None))
    check_pin(cfg.dataset.uri, ds.sha256, cfg.dataset.sha256)
    check_fits(ds, cfg.env_id, obs_space, act_space)
    return ds


class OfflineArena(GymArena):
    """Members take gradient steps on the dataset's buffer; evaluation is online, in the env."""

    kind = "offline"

    def __init__(self, cfg, algo_cls: type[RLAlgorithm]) -> None:
        super().__init__(cfg, algo_cls)
        self.dataset = load_checked_dataset(cfg, self.obs_space, self.act_space)
        self.cfg = cfg.pinned(dataset=self.dataset.sha256)  # the data it read, named in the run's record
        self.dataset_buffer = dataset_buffer(self.dataset.transitions, self.obs_spec, self.action_spec, self.device)

    def build_members(self, seeds: list[int]) -> list[RLAlgorithm]:
        agents = super().build_members(seeds)
        if self.cfg.hyperparameters.normalize_obs:
            obs = self.obs_spec.to_tensors(self.dataset.transitions.observations)
            for agent in agents:  # the statistics of the whole dataset, from the start
                agent.observe(obs)
        return agents

    def train_group(self, members: list[RLAlgorithm], slots: list[int], seeds: list[int], steps: int
                    ) -> list[TrainResult]:
        return train_group_offline(self.learning_group(members), slots, self.dataset_buffer, steps)

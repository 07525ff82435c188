"""The offline arena: members learn from one fixed dataset (CQN, CQL, behaviour cloning, or any off-policy
algorithm) and are evaluated online in the env. The budget counts gradient steps.

The dataset is resolved (an ``s3://`` one downloaded into the local cache and verified), checked against
the env and against the pinned content hash (``dataset.sha256``), and loaded into one read-only buffer that
every member samples from with its own generator.
"""

from __future__ import annotations

from agilerl_core.algorithms.base import RLAlgorithm
from agilerl_core.arenas.base import GymArena
from agilerl_core.data.fetch import check_pin
from agilerl_core.data.loader import Dataset, check_fits, dataset_buffer, load_dataset
from agilerl_core.io.storage import s3_options
from agilerl_core.loops.offline import train_group_offline
from agilerl_core.results import TrainResult


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

"""Replay buffer: ring wrap-around, sampling shapes, per-member staging, memory use."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from agilerl_core.buffers import ReplayBuffer, transition_fields
from agilerl_core.envs.spaces import ObsSpec


def _buffer(capacity=5, mask=None):
    spec = ObsSpec(spaces.Box(-1, 1, (2,), np.float32))
    return ReplayBuffer(transition_fields(spec, mask), capacity)


def _shard(values):
    v = torch.tensor(values, dtype=torch.float32)
    n = len(values)
    return {"obs.obs": v[:, None].repeat(1, 2), "next_obs.obs": v[:, None].repeat(1, 2) + 0.5,
            "action": torch.arange(n) % 2, "reward": v, "terminated": torch.zeros(n)}


def test_ring_wraps_and_keeps_the_newest_in_order():
    buf = _buffer(5)
    buf.extend(_shard([0, 1, 2]))
    buf.extend(_shard([3, 4, 5, 6]))
    assert buf.size == 5 and buf.pos == 2
    assert buf.committed()["reward"].tolist() == [2, 3, 4, 5, 6]
    buf.extend(_shard(list(range(10, 22))))  # more than capacity at once: only the newest survive
    assert buf.committed()["reward"].tolist() == [17, 18, 19, 20, 21]


def test_sampling_shapes_and_types():
    spec = ObsSpec(spaces.Dict({"img": spaces.Box(0, 255, (4, 4, 3), np.uint8), "d": spaces.Discrete(3)}))
    buf = ReplayBuffer(transition_fields(spec, action_mask_dim=3), 100)
    buf.reserve_staging(1, 16)
    n = 8
    buf.add(0, {"obs.img": torch.zeros(n, 4, 4, 3, dtype=torch.uint8), "obs.d": torch.ones(n, dtype=torch.int64),
                "next_obs.img": torch.zeros(n, 4, 4, 3, dtype=torch.uint8), "next_obs.d": torch.zeros(n, dtype=torch.int64),
                "action": torch.zeros(n, dtype=torch.int64), "reward": torch.ones(n), "terminated": torch.zeros(n),
                "next_action_mask": torch.ones(n, 3, dtype=torch.bool)})
    b = buf.sample(32, 0, torch.Generator().manual_seed(0))
    assert b.obs["img"].shape == (32, 4, 4, 3) and b.obs["img"].dtype == torch.uint8
    assert b.obs["d"].shape == (32,) and b.action.dtype == torch.int64
    assert b.reward.shape == (32,) and b.terminated.shape == (32,) and b.next_action_mask.shape == (32, 3)


def test_members_see_committed_data_and_only_their_own_fresh_data():
    buf = _buffer(100)
    buf.extend(_shard([0, 1, 2, 3]))
    buf.reserve_staging(3, 10)
    for slot in range(3):
        buf.add(slot, _shard([100 * (slot + 1) + i for i in range(5)]))
    g = torch.Generator().manual_seed(0)
    for slot in range(3):
        seen = set(buf.sample(2000, slot, g).reward.tolist())
        own = {100 * (slot + 1) + i for i in range(5)}
        assert seen == {0, 1, 2, 3} | own
    assert set(buf.sample(500, None, g).reward.tolist()) == {0, 1, 2, 3}
    buf.commit([buf.shard(s) for s in range(3)])  # appended in member order
    assert buf.committed()["reward"].tolist() == [0, 1, 2, 3, *range(100, 105), *range(200, 205), *range(300, 305)]
    assert buf.available(0) == buf.size == 19


def test_sampling_is_uniform():
    buf = _buffer(10)
    buf.extend(_shard(list(range(10))))
    counts = np.bincount(buf.sample(50_000, None, torch.Generator().manual_seed(1)).reward.long().numpy(), minlength=10)
    assert np.all(np.abs(counts / 50_000 - 0.1) < 0.01)


def test_one_million_cartpole_transitions_fit_in_100_mb():
    spec = ObsSpec(gym.make("CartPole-v1").observation_space)
    buf = ReplayBuffer(transition_fields(spec), 1_000_000)
    assert buf.memory_bytes < 100e6

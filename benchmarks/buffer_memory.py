"""Memory of the replay buffer for 1M CartPole transitions (target: under 100 MB).

    python benchmarks/buffer_memory.py
"""

from __future__ import annotations

import json

import gymnasium as gym

from agilerl_core.buffers.replay import ReplayBuffer, transition_fields
from agilerl_core.envs.spaces import ObsSpec


def main() -> None:
    spec = ObsSpec(gym.make("CartPole-v1").observation_space)
    buf = ReplayBuffer(transition_fields(spec), 1_000_000)
    mb = buf.memory_bytes / 1e6
    print(json.dumps({"benchmark": "buffer_memory", "transitions": 1_000_000, "megabytes": round(mb, 1),
                      "bytes_per_transition": buf.memory_bytes / 1_000_000, "target_mb": 100, "ok": mb < 100}))


if __name__ == "__main__":
    main()

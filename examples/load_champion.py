"""Load a saved member (a run's elite, a population member, a registered champion's checkpoint) and act.

    python examples/load_champion.py runs/cartpole-dqn-seed0/elite [--episodes 3]
    python examples/load_champion.py s3://agilerl/runs/RUN_ID/elite        # with the AWS_* variables set

The checkpoint is data (safetensors + JSON, checksums verified): nothing it names is imported or called, so
the env to act in is yours to choose (here: the Gymnasium id the checkpoint records, when it is one). Prints one
JSON line with each episode's return.
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym

import agilerl_core as ac


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("uri", help="a member directory, local or s3://")
    p.add_argument("--env", default=None, help="Gymnasium id to act in (default: the one the checkpoint records)")
    p.add_argument("--episodes", type=int, default=3)
    args = p.parse_args()

    policy = ac.load(args.uri)
    env_id = args.env or policy.env["env_id"]
    env = gym.make(env_id)
    returns = []
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.predict(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    print(json.dumps({"member": policy.member_id, "algorithm": policy.algorithm, "fitness": policy.fitness,
                      "env_id": env_id, "returns": returns}))


if __name__ == "__main__":
    main()

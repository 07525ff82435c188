"""Population scaling: wall time of one generation (training + evaluation, the same steps per member) at
population 1, 4, 16 and 64, with population-batched learning on and off, for DQN (CartPole), TD3
(Pendulum) and PPO (CartPole). One torch thread, in-process (`Evolution.run_generation`), no mutation (so
the groups stay whole: it measures the batched path, not how a run's architectures spread).

    python benchmarks/population_scaling.py [--pops 1,4,16,64] [--algos dqn,td3,ppo] [--repeats 3]

Prints one JSON object: per algorithm and population the median generation wall time (and its training
part), and the ratio to population 1. Target: population 16 <= 3x population 1 with batching on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

CONFIGS = {
    "dqn": {"env_id": "CartPole-v1", "algorithm": "dqn", "num_envs": 8, "evo_steps": 1024,
            "hyperparameters": {"batch_size": 128, "learn_step": 4, "learning_delay": 0, "buffer_size": 100_000}},
    "td3": {"env_id": "Pendulum-v1", "algorithm": "td3", "num_envs": 8, "evo_steps": 1024, "eval_max_steps": 200,
            "hyperparameters": {"batch_size": 128, "learn_step": 4, "learning_delay": 0, "random_steps": 0,
                                "buffer_size": 100_000}},
    "ppo": {"env_id": "CartPole-v1", "algorithm": "ppo", "num_envs": 8, "evo_steps": 1024,
            "hyperparameters": {"rollout_steps": 128, "num_minibatches": 4, "update_epochs": 4}},
}


def one(algo: str, pop: int, batch: bool, out: str) -> tuple[float, float]:
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    data = {"name": f"scale-{algo}", "population_size": pop, "eval_episodes": 1, "seed": 0, "output_dir": out,
            "max_env_steps": 10**9, "network": {"hidden_sizes": [64, 64]},
            "mutation": {"no_mutation": 1.0, "architecture": 0, "parameters": 0, "activation": 0, "rl_hp": 0},
            "runner": {"batch_members": batch}, **CONFIGS[algo]}
    cfg = validate_config(data)
    evo = build_evolution(cfg, batch_members=cfg.runner.batch_members)
    evo.run_generation()  # warm-up: buffers filled, envs built
    evo.evolve()
    t0 = time.perf_counter()
    stats = evo.run_generation()
    wall = time.perf_counter() - t0
    return wall, stats.wall_s


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pops", default="1,4,16,64")
    p.add_argument("--algos", default="dqn,td3,ppo")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    pops = [int(x) for x in args.pops.split(",")]
    out: dict = {"benchmark": "population_scaling", "repeats": args.repeats, "threads": 1, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            res = {}
            for batch in (True, False):
                walls = {pop: [] for pop in pops}
                for _ in range(args.repeats):
                    for pop in pops:
                        walls[pop].append(one(algo, pop, batch, tmp)[0])
                med = {pop: statistics.median(w) for pop, w in walls.items()}
                res["batched" if batch else "one_by_one"] = {
                    str(pop): {"generation_s": round(med[pop], 3), "vs_pop1": round(med[pop] / med[pops[0]], 2)}
                    for pop in pops}
            out["results"][algo] = res
            print(json.dumps({algo: res}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Image DQN throughput at population 4: a 16x16x3 gridworld and a MinAtar-sized 10x10x4 frame
(benchmarks/gridworld.py), conv 16 3x3 stride 1 (latent 128) + MLP 64x64, 4 envs, batch 64, one gradient step
per vector step. The population learns batched (one group: grouped convolutions) and one member at a time
(`batch_members` off), alternating, `--repeats` times; env steps/s is training env steps over wall time,
evaluation included. Medians are reported.

To compare with another checkout (e.g. the code before population-first algorithms), run this same file with
that checkout first on the path: ``PYTHONPATH=/path/to/old python benchmarks/image_dqn.py``; it adapts to the
config API it finds.

    python benchmarks/image_dqn.py [--envs Gridworld16-v0,Gridworld10x4-v0] [--budget 8000] [--repeats 3]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(env_id: str, budget: int, seed: int, out: str, batch: bool) -> dict:
    import torch

    from agilerl_core.experiment import train_local

    torch.set_num_threads(1)
    data = {"name": "image-dqn", "env_id": f"gridworld:{env_id}", "num_envs": 4, "population_size": 4,
            "evo_steps": budget // 8, "eval_episodes": 2, "max_env_steps": budget, "seed": seed, "output_dir": out,
            "hyperparameters": {"batch_size": 64, "learn_step": 4, "learning_delay": 256, "buffer_size": 20_000},
            "network": {"hidden_sizes": [64, 64], "cnn": {"channels": [16], "kernel_sizes": [3], "strides": [1],
                                                          "latent_dim": 128}},
            "mutation": {"no_mutation": 1.0, "architecture": 0, "parameters": 0, "activation": 0, "rl_hp": 0}}
    try:  # this checkout: the grouping is an argument
        from tasks.config import validate_config

        res = train_local(validate_config(data), progress=False, batch_members=batch)
    except ImportError:  # an older checkout: the runner section held it
        from agilerl_core.config import validate_config

        res = train_local(validate_config({**data, "runner": {"batch_members": batch}}), progress=False)
    return {"wall_s": round(res.wall_s, 2), "env_steps_per_s": round(res.env_steps_per_s, 1),
            "batching": res.batching, "best_fitness": res.best_fitness}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--envs", default="Gridworld16-v0,Gridworld10x4-v0")
    p.add_argument("--budget", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    out: dict = {"benchmark": "image_dqn", "population": 4, "budget": args.budget, "repeats": args.repeats,
                 "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in args.envs.split(","):
            runs: dict[str, list] = {"batched": [], "one_by_one": []}
            for i in range(args.repeats):
                runs["batched"].append(run(env_id, args.budget, i + 1, tmp, True))
                runs["one_by_one"].append(run(env_id, args.budget, i + 1, tmp, False))
            med = {k: statistics.median(r["env_steps_per_s"] for r in v) for k, v in runs.items()}
            out["results"][env_id] = {"batched_env_steps_per_s": med["batched"],
                                      "one_by_one_env_steps_per_s": med["one_by_one"],
                                      "batched_over_one_by_one": round(med["batched"] / med["one_by_one"], 2),
                                      "runs": runs}
            print(json.dumps({env_id: out["results"][env_id]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

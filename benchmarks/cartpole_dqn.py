"""Learning target: from deployments/configs/cartpole_dqn.yaml (population 4, DQN), the elite's
10-episode evaluation mean reaches 475 within 150,000 global training env steps, for seeds 0, 1, 2.

Also re-evaluates each final elite on 10 fresh episodes (seeds never used in training or selection),
so the reported fitness is not an artefact of selection on fixed evaluation seeds.

    python benchmarks/cartpole_dqn.py [--seeds 0 1 2] [--config PATH]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from agilerl_core.config import load_config
from agilerl_core.envs.make import make_vector_env
from agilerl_core.io.checkpoint import load_member
from agilerl_core.training.experiment import train_local
from agilerl_core.training.generation import evaluate_member

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default=str(ROOT / "deployments/configs/cartpole_dqn.yaml"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=150_000)
    args = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cfg = load_config(args.config, {"seed": seed, "max_env_steps": args.budget, "output_dir": tmp})
            res = train_local(cfg, progress=False)
            elite, _ = load_member(res.elite_uri)
            env = make_vector_env(cfg.env_id, 10, cfg.env_kwargs)
            fresh = evaluate_member(elite.agent, env, seed=10_000 + seed)
            runs.append({"seed": seed, "reached_target": res.reached_target, "global_steps": res.global_steps,
                         "best_fitness": res.best_fitness, "fresh_eval10_mean": fresh,
                         "generations": res.generations, "wall_s": round(res.wall_s, 2),
                         "env_steps_per_s": round(res.env_steps_per_s, 1)})
    print(json.dumps({
        "benchmark": "cartpole_dqn", "target": 475, "budget": args.budget,
        "all_reached": all(r["reached_target"] and r["global_steps"] <= args.budget for r in runs),
        "median_global_steps": statistics.median(r["global_steps"] for r in runs),
        "runs": runs,
    }))


if __name__ == "__main__":
    main()

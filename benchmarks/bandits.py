"""Contextual bandits on scikit-learn's bundled digits (10 arms, 1,797 rows, 20% held out): the held-out reward
of each run's elite (the share of held-out digits its greedy pull gets right) for NeuralTS (the shipped
digits_neural_ts.yaml), NeuralUCB and the epsilon-greedy network at the same budget and architecture, beside a
uniformly random policy (0.1 expected).

    python benchmarks/bandits.py [--seeds 0 1 2] [--pulls 40000] [--config digits_neural_ts.yaml]

Each run: population 4, evo_steps 1,000 pulls per member per generation, `--pulls` over the population (the
shipped config's budget by default). Prints one JSON object: per algorithm and seed the elite's held-out reward,
the run's best and its first generation reaching 0.9, the regret of all the population's training pulls, the wall
time and pulls per second; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agilerl_core.arenas.bandit import SPLIT_SEED
from agilerl_core.data.tables import BanditSplit, load_table
from agilerl_core.experiment import train_local
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"
ALGORITHMS = {"neural_ts": {}, "neural_ucb": {"gamma": 1.0, "lamb": 1.0}, "neural_eps_greedy": {"epsilon": 0.1}}


def run(config: str, algorithm: str, seed: int, pulls: int | None) -> dict:
    base = load_config(CONFIGS / config)
    hp = {k: v for k, v in base.hyperparameters.model_dump().items() if k in ("lr", "batch_size")}
    over = {"seed": seed, "algorithm": algorithm, "hyperparameters": {**hp, **ALGORITHMS[algorithm]},
            "target_fitness": None, **({"max_env_steps": pulls} if pulls else {})}
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(CONFIGS / config, {**over, "output_dir": out})
        t0 = time.perf_counter()
        res = train_local(cfg, progress=False)
        wall = time.perf_counter() - t0
    curve = [round(h.best_fitness, 3) for h in res.history]
    first = next((i for i, f in enumerate(curve) if f >= 0.9), None)
    regret = sum(m.get("regret", 0.0) for h in res.history for m in h.train_metrics)  # every member's pulls
    return {"seed": seed, "elite": round(res.elite_fitness, 4), "best": round(res.best_fitness, 4),
            "population_regret": regret,
            "first_generation_at_0.9": first, "pulls_at_0.9": None if first is None else
            (first + 1) * cfg.population_size * cfg.evo_steps, "curve": curve, "wall_s": round(wall, 1),
            "pulls_per_s": round(res.global_steps / wall)}


def random_policy(config: str, seeds: list[int]) -> dict:
    """A uniformly random arm per held-out row (the same rows the runs are judged on)."""
    cfg = load_config(CONFIGS / config)
    split = BanditSplit.of(load_table(cfg.data.source), cfg.data.held_out, SPLIT_SEED)
    rewards = [float((np.random.default_rng(s).integers(split.arms, size=len(split.held_y)) == split.held_y).mean())
               for s in seeds]
    return {"per_seed": rewards, "expected": 1 / split.arms, "held_out_rows": len(split.held_y)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--pulls", type=int, default=None, help="max_env_steps (default: the config's)")
    p.add_argument("--config", default="digits_neural_ts.yaml")
    p.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    args = p.parse_args()
    cfg = load_config(CONFIGS / args.config)
    out: dict = {"budget": {"config": args.config, "pulls": args.pulls or cfg.max_env_steps,
                            "population": cfg.population_size, "evo_steps": cfg.evo_steps,
                            "hidden_sizes": cfg.network.hidden_sizes, "seeds": args.seeds},
                 "random": random_policy(args.config, args.seeds)}
    for algo in args.algorithms:
        runs = []
        for seed in args.seeds:
            print(f"{algo} seed {seed}...", file=sys.stderr)
            runs.append(run(args.config, algo, seed, args.pulls))
        elites = [r["elite"] for r in runs]
        out[algo] = {"runs": runs, "elite_median": statistics.median(elites), "elite_min": min(elites),
                     "every_seed_at_least_0.9": all(e >= 0.9 for e in elites)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

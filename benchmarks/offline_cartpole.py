"""Offline target: on a medium CartPole dataset (50 episodes of a trained policy, each action replaced by a random
one with probability `--epsilon`: return mean ~160 of 500 with the defaults, as docs/training/offline.md makes
it), the CQN population's elite reaches at least the dataset's mean return; behaviour cloning is reported beside it.

    python benchmarks/offline_cartpole.py [--seeds 0 1 2] [--medium 200] [--epsilon 0.4]

1. The medium policy: the shipped online DQN config (cartpole_dqn.yaml, seed 0), run generation by
   generation (the same Experiment steps as `train_local`) until its best member's fitness first
   reaches `--medium`; that member is saved (the shipped config's first generation already reaches ~474).
2. The dataset: 50 episodes of that member (greedy, each action replaced by a random one with
   probability `--epsilon`), recorded with the dataset tool's functions into a flat HDF5 file.
3. cartpole_cqn.yaml and cartpole_bc.yaml on that dataset (population 4, their own budgets), for each
   seed, with the dataset's mean return as target_fitness (as the online targets: the run stops at the
   first generation whose best member's 10-episode evaluation mean reaches it): whether and after how
   many gradient steps it did, the best fitness per generation, and the final elite re-evaluated on 10
   fresh episodes.

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agilerl_core.algorithms.acting import Acting
from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.algorithms.saved import load_member
from agilerl_core.arenas.base import evaluate_member
from agilerl_core.data.collect import collect_episodes, write_dataset
from agilerl_core.data.loader import load_dataset
from agilerl_core.envs.make import make_vector_env
from agilerl_core.experiment import build_evolution, train_local
from agilerl_core.io.checkpoint import save_member
from tasks.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "deployments" / "configs"


def medium_policy(out: Path, medium: float) -> dict:
    cfg = load_config(CONFIGS / "cartpole_dqn.yaml", {"seed": 0, "target_fitness": None, "output_dir": str(out)})
    exp = build_evolution(cfg)
    while True:
        if exp.history:
            exp.evolve()
        stats = exp.run_generation()
        print(f"online dqn: generation {stats.generation}, best {stats.best_fitness:.1f}", file=sys.stderr)
        if stats.best_fitness >= medium or exp.global_steps >= cfg.max_env_steps:
            break
    best = max(exp.population.members, key=lambda m: m.fitness)
    save_member(out / "medium", best, exp.env_desc)
    return {"fitness": best.fitness, "generation": stats.generation, "online_env_steps": exp.global_steps}


def run_offline(config: str, dataset: str, seed: int, out: str, target: float) -> dict:
    cfg = load_config(CONFIGS / config, {"seed": seed, "dataset.uri": dataset, "output_dir": out,
                                         "target_fitness": target})
    t0 = time.perf_counter()
    res = train_local(cfg, progress=False)
    wall = time.perf_counter() - t0
    elite, _ = load_member(res.elite_uri)
    env = make_vector_env(cfg.env_id, 10, cfg.env_kwargs)
    fresh = evaluate_member(elite.agent, env, seed=10_000 + seed)
    env.close()
    first = next((h for h in res.history if h.best_fitness >= target), None)
    return {"seed": seed, "reached_dataset_mean": first is not None,
            "gradient_steps_to_target": first.global_steps if first else None,
            "best_fitness": round(max(h.best_fitness for h in res.history), 2), "fresh_eval10_mean": round(fresh, 2),
            "best_by_generation": [round(h.best_fitness, 1) for h in res.history],
            "gradient_steps": res.global_steps, "wall_s": round(wall, 1),
            "gradient_steps_per_s": round(res.global_steps / wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--medium", type=float, default=200.0, help="stop the online run once its best reaches this")
    p.add_argument("--epsilon", type=float, default=0.4, help="random-action probability while recording (0.4: "
                                                             "a medium dataset from the trained policy)")
    p.add_argument("--episodes", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="agilerl-offline-") as tmp:
        tmp_p = Path(tmp)
        policy = medium_policy(tmp_p, args.medium)
        episodes = collect_episodes("CartPole-v1", str(tmp_p / "medium"), args.episodes, seed=123,
                                    epsilon=args.epsilon, algorithms=get_algorithm, acting=Acting)
        path = write_dataset(str(tmp_p / "cartpole-medium.hdf5"), episodes, "CartPole-v1", str(tmp_p / "medium"))
        info = load_dataset(path).describe()
        mean = info["return_mean"]
        print(f"dataset: {info['episodes']} episodes, mean return {mean}", file=sys.stderr)
        report: dict = {"benchmark": "offline_cartpole", "medium_policy": policy,
                        "dataset": {k: info[k] for k in ("transitions", "episodes", "return_mean", "return_std",
                                                          "return_min", "return_max")},
                        "epsilon": args.epsilon, "results": {}}
        for name, config in (("cqn", "cartpole_cqn.yaml"), ("bc", "cartpole_bc.yaml")):
            runs = []
            for seed in args.seeds:
                r = run_offline(config, path, seed, str(tmp_p / "runs"), mean)
                print(f"{name} seed {seed}: {r}", file=sys.stderr)
                runs.append(r)
            report["results"][name] = {
                "all_reached_dataset_mean": all(r["reached_dataset_mean"] for r in runs),
                "median_best_fitness": statistics.median(r["best_fitness"] for r in runs),
                "median_fresh_eval10_mean": statistics.median(r["fresh_eval10_mean"] for r in runs),
                "runs": runs}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

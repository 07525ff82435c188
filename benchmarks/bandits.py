"""Contextual bandits on scikit-learn's bundled digits (10 arms, 1,797 rows, 20% held out): the held-out reward
of each run's elite (the share of held-out digits its greedy pull gets right) for NeuralTS (the shipped
digits_neural_ts.yaml), NeuralUCB and the epsilon-greedy network at the same budget and architecture, beside a
uniformly random policy (0.1 expected).

    python benchmarks/bandits.py [--seeds 0 1 2] [--pulls 40000] [--config digits_neural_ts.yaml] [--peer]

With ``--peer``, AgileRL 2.58's NeuralTS and NeuralUCB run the same budget on the same split right after ours
(``benchmarks/peers/agilerl_bandit.py`` in the peer's own venv, see ../shared/bench/README.md; its own
``train_bandits``, its BanditEnv layout and network, on our split's rows standardised as our members see them), so
the wall-time ratios come from one run.

Each run: population 4, evo_steps 1,000 pulls per member per generation, `--pulls` over the population (the
shipped config's budget by default). Prints one JSON object: per algorithm and seed the elite's held-out reward,
the run's best and its first generation reaching 0.9, the regret of all the population's training pulls, the wall
time and pulls per second; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import peer_result

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


def write_split(config: str, path: Path) -> Path:
    """Our run's split of the config's table, standardised by its training rows (as our members see contexts),
    as the .npz the peer runner reads."""
    cfg = load_config(CONFIGS / config)
    split = BanditSplit.of(load_table(cfg.data.source), cfg.data.held_out, SPLIT_SEED)
    np.savez(path, train_x=(split.train_x - split.mean) / split.std, train_y=split.train_y,
             held_x=(split.held_x - split.mean) / split.std, held_y=split.held_y)
    return path


def peer(python: str, algo: str, seed: int, pulls: int, config: str) -> dict:
    """AgileRL 2.58's population (its NeuralTS or NeuralUCB) on the same split and budget: its elite's held-out
    reward, the population's training regret and its wall time."""
    cfg = load_config(CONFIGS / config)
    with tempfile.TemporaryDirectory() as tmp:
        split = write_split(config, Path(tmp) / "split.npz")
        r = peer_result(python, "agilerl_bandit.py", "--split", str(split), "--algo", algo, "--seed", str(seed),
                        "--threads", "1", "--pulls-per-member", str(pulls // cfg.population_size),
                        "--population", str(cfg.population_size), "--evo-steps", str(cfg.evo_steps),
                        "--lr", str(cfg.hyperparameters.lr), "--batch-size", str(cfg.hyperparameters.batch_size))
    return {"seed": seed, "elite": round(r["holdout_reward_elite"], 4), "best": round(r["holdout_reward_best"], 4),
            "population_regret": r["population_regret_total"], "wall_s": round(r["wall_s"], 1),
            "pulls_per_s": round(r["total_pulls"] / r["wall_s"])}


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
    p.add_argument("--peer", action="store_true", help="also AgileRL 2.58's NeuralTS and NeuralUCB (slow: minutes)")
    p.add_argument("--peer-python", default=os.path.expanduser("~/peer-venv/bin/python"))
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
    for algo in ("NeuralTS", "NeuralUCB") if args.peer else ():  # population 4, as the config's
        runs = []
        for seed in args.seeds:
            print(f"peer {algo} seed {seed}...", file=sys.stderr)
            runs.append(peer(args.peer_python, algo, seed, args.pulls or cfg.max_env_steps, args.config))
        row = {"runs": runs, "elite_median": statistics.median(r["elite"] for r in runs)}
        ours = out.get("neural_ts" if algo == "NeuralTS" else "neural_ucb")
        if ours:  # the peer's median wall time over ours, same algorithm, same run
            row["wall_ratio_median"] = round(statistics.median(p["wall_s"] for p in runs) /
                                             statistics.median(r["wall_s"] for r in ours["runs"]), 1)
        out[f"agilerl_{algo}"] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()

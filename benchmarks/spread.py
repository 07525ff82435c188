"""Does spread_matd3.yaml learn mpe2 simple_spread_v3? Its team return (the sum of the three agents' mean
returns over 10 greedy episodes) against a uniformly random policy's, measured the same way; with
``--share-policy group`` (or ``both``) also with the three identical agents acting through one shared actor
(hyperparameters.share_policy: group; each agent keeps its own critic).

    python benchmarks/spread.py [--budget 500000] [--seed 0] [--share-policy agent|group|both]

Prints one JSON object: the random policy's team return (100 episodes) and per variant the run's best and elite
fitness, the best per generation, the wall time and env steps/s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from agilerl_core.envs.multi_agent import make_parallel_vector_env
from agilerl_core.experiment import train_local
from tasks.config import load_config

CONFIG = Path(__file__).resolve().parents[1] / "deployments" / "configs" / "spread_matd3.yaml"


def random_team_return(env_id: str, env_kwargs: dict, episodes: int, seed: int) -> float:
    """Sum over agents of the mean episode return of uniformly random actions."""
    env = make_parallel_vector_env(env_id, episodes, env_kwargs)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    totals = {a: np.zeros(episodes) for a in env.agents}
    active = np.ones(episodes, dtype=bool)
    while active.any():
        actions = {}
        for a, space in env.action_spaces.items():
            actions[a] = rng.uniform(space.low, space.high, (episodes, *space.shape)).astype(np.float32)
        _, rewards, _, _, info = env.step(actions)
        for a in env.agents:
            totals[a] += rewards[a] * active
        active &= ~info["env_done"]
    return float(sum(v.mean() for v in totals.values()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=500_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--share-policy", choices=["agent", "group", "both"], default="agent")
    args = p.parse_args()
    variants = ["agent", "group"] if args.share_policy == "both" else [args.share_policy]
    out: dict = {"benchmark": "spread", "budget": args.budget, "seed": args.seed}
    with tempfile.TemporaryDirectory() as tmp:
        for share in variants:
            cfg = load_config(CONFIG, {"seed": args.seed, "max_env_steps": args.budget, "output_dir": tmp,
                                       "hyperparameters.share_policy": share})
            if "random_team_return" not in out:
                out["random_team_return"] = round(random_team_return(cfg.env_id, cfg.env_kwargs, 100, args.seed), 2)
            res = train_local(cfg, progress=False)
            out[f"share_policy_{share}"] = {
                "best_fitness": round(res.best_fitness, 2), "elite_fitness": round(res.elite_fitness, 2),
                "best_per_generation": [round(h.best_fitness, 1) for h in res.history],
                "wall_s": round(res.wall_s, 1), "env_steps_per_s": round(res.env_steps_per_s, 1)}
            print(json.dumps({share: out[f"share_policy_{share}"]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

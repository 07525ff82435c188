"""Atari throughput and an affordable learning check: the shipped pong_dqn and breakout_ppo configs (standard
preprocessing, Nature-DQN encoder, population 4, one torch thread) for `--budget` env steps (population-wide),
learning starting early so that the gradient steps are part of the measure. Reports env steps/s (training env
steps over wall time, evaluation included) and the best evaluation reached, beside SB3 zoo's published return
for one agent at 10M steps and the random policy's score: at budgets this CPU affords (thousands of steps) a
run measures throughput, not learning; the configs are meant for a GPU.

    python benchmarks/atari.py [--configs pong_dqn,breakout_ppo] [--budget 8000] [--eval-max-steps 2000]

Needs the atari extra. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# SB3 zoo's benchmark.md (one agent, 10M steps, the NoFrameskip-v4 envs) and the random policy's score
REFERENCE = {"pong_dqn": {"sb3_zoo_10M_steps": 20.6, "random": -21.0},
             "breakout_ppo": {"sb3_zoo_10M_steps": 398.0, "random": 1.7}}


def run(name: str, budget: int, eval_max_steps: int, out: str) -> dict:
    import torch

    from agilerl_core.experiment import build_evolution, train_local
    from tasks.config import grouping, load_config

    torch.set_num_threads(1)
    over = {"max_env_steps": budget, "evo_steps": budget // 8, "eval_max_steps": eval_max_steps, "output_dir": out,
            "device": "cpu", "target_fitness": None}
    cfg = load_config(ROOT / "deployments" / "configs" / f"{name}.yaml", over)
    if hasattr(cfg.hyperparameters, "learning_delay"):
        cfg = load_config(ROOT / "deployments" / "configs" / f"{name}.yaml",
                          {**over, "hyperparameters.learning_delay": 1000, "hyperparameters.buffer_size": 20_000})
    res = train_local(cfg, progress=False, evolution=build_evolution(cfg, **grouping(cfg)))
    return {"env_steps_per_s": round(res.env_steps_per_s, 1), "wall_s": round(res.wall_s, 1),
            "frames": res.global_steps * 4, "best_fitness": res.best_fitness, "eval_capped_at_steps": eval_max_steps,
            "batching": res.batching,
            **REFERENCE.get(name, {})}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="pong_dqn,breakout_ppo")
    p.add_argument("--budget", type=int, default=8000)
    p.add_argument("--eval-max-steps", type=int, default=2000)
    args = p.parse_args()
    out = {"benchmark": "atari", "budget_env_steps": args.budget, "population": 4, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            out["results"][name] = run(name, args.budget, args.eval_max_steps, tmp)
            print(json.dumps({name: out["results"][name]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

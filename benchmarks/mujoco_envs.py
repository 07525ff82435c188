"""MuJoCo envs: the shipped halfcheetah_sac, hopper_td3 and hopper_ppo configs at population 4 on one torch
thread for `--budget` env steps (population-wide; learning starts after `--delay` steps for the off-policy ones), beside the
published one-agent returns the configs quote (SB3 zoo, 1M steps). Reports env steps/s (training env
steps over wall time, evaluation included) and the best evaluation reached at this budget: a CPU run of tens of
thousands of steps measures throughput and the start of learning, not the 1M-step figure.

    python benchmarks/mujoco_envs.py [--configs halfcheetah_sac,hopper_td3,hopper_ppo] [--budget 20000]

Needs the mujoco extra. Prints one JSON object. (Not named mujoco.py: a script's folder comes first on the
path, and it would shadow the mujoco package.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# SB3 zoo's benchmark.md (one agent, 1M steps, the -v3 envs), as the configs' headers quote them
REFERENCE_1M = {"halfcheetah_sac": {"sb3_zoo": 9535.5}, "hopper_td3": {"sb3_zoo": 3606.4},
                "hopper_ppo": {"sb3_zoo": 2410.4}}


def run(name: str, budget: int, delay: int, out: str) -> dict:
    import torch

    from agilerl_core.experiment import build_evolution, train_local
    from tasks.config import grouping, load_config

    torch.set_num_threads(1)
    path = ROOT / "deployments" / "configs" / f"{name}.yaml"
    over = {"max_env_steps": budget, "evo_steps": max(budget // 16, 1000), "output_dir": out, "device": "cpu",
            "target_fitness": None, "eval_episodes": 2}
    cfg = load_config(path)
    if hasattr(cfg.hyperparameters, "learning_delay"):
        over.update({"hyperparameters.learning_delay": delay, "hyperparameters.random_steps": delay,
                     "hyperparameters.buffer_size": max(budget, 10_000)})
    cfg = load_config(path, over)
    res = train_local(cfg, progress=False, evolution=build_evolution(cfg, **grouping(cfg)))
    return {"env_steps_per_s": round(res.env_steps_per_s, 1), "wall_s": round(res.wall_s, 1),
            "global_steps": res.global_steps, "best_fitness": round(res.best_fitness, 1),
            "fitness_by_generation": [round(h.best_fitness, 1) for h in res.history], "batching": res.batching,
            "reference_1M_steps_one_agent": REFERENCE_1M.get(name)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="halfcheetah_sac,hopper_td3,hopper_ppo")
    p.add_argument("--budget", type=int, default=20_000)
    p.add_argument("--delay", type=int, default=1000, help="off-policy: random steps and learning delay per member")
    args = p.parse_args()
    out = {"benchmark": "mujoco", "budget_env_steps": args.budget, "population": 4, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            out["results"][name] = run(name, args.budget, args.delay, tmp)
            print(json.dumps({name: out["results"][name]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

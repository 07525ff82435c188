"""CarRacing PPO (96x96 RGB pixels, the shipped config's Nature-CNN encoder) at population 2: one generation of
`--steps` env steps per member, batched (one group) and one member at a time, alternating; env steps/s of
training (evaluation cut to one 50-step episode). Compute-bound on a CPU. To compare with another checkout,
run this file with it first on ``PYTHONPATH`` (it adapts to the config API it finds).

    python benchmarks/carracing_ppo.py [--steps 2048] [--repeats 1]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "deployments" / "configs" / "carracing_ppo.yaml"


def run(steps: int, seed: int, out: str, batch: bool) -> float:
    import torch

    from agilerl_core.experiment import train_local

    torch.set_num_threads(1)
    over = {"population_size": 2, "evo_steps": steps, "max_env_steps": 2 * steps, "eval_episodes": 1,
            "eval_max_steps": 50, "seed": seed, "output_dir": out, "device": "cpu", "target_fitness": None}
    try:  # this checkout: the grouping is an argument
        from tasks.config import load_config

        res = train_local(load_config(CONFIG, over), progress=False, batch_members=batch)
    except ImportError:  # an older checkout: the runner section held it
        from agilerl_core.config import load_config

        res = train_local(load_config(CONFIG, {**over, "runner.batch_members": batch}), progress=False)
    return res.env_steps_per_s


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    runs: dict[str, list[float]] = {"batched": [], "one_by_one": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            runs["batched"].append(run(args.steps, i + 1, tmp, True))
            runs["one_by_one"].append(run(args.steps, i + 1, tmp, False))
    med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    print(json.dumps({"benchmark": "carracing_ppo", "population": 2, "steps_per_member": args.steps,
                      "batched_env_steps_per_s": med["batched"], "one_by_one_env_steps_per_s": med["one_by_one"],
                      "batched_over_one_by_one": round(med["batched"] / med["one_by_one"], 2), "runs": runs}))


if __name__ == "__main__":
    main()

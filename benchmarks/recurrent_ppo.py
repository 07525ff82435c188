"""Recurrent PPO on the partially observed CartPole (velocities hidden): the shipped cartpole_pomdp_ppo config
(LSTM core) beside the same config with a GRU core and without a core (feed-forward, which cannot see
velocities), and AgileRL 2.58's recurrent PPO on the same POMDP (its LSTM encoder, hidden state 64, chunked
BPTT of 16 steps; ../shared/bench/peer_agilerl_ppo.py --pomdp), each at population 4 on one torch thread for
`--budget` global env steps, stopping at 475.

Reports the first global step count at which the elite reached 475 (None: not within the budget), the best
fitness and env steps/s (training env steps over wall time, evaluation included), per seed and the medians, and
each variant's median env steps/s as a fraction of the feed-forward one's (target: a recurrent core >= 0.5).

    python benchmarks/recurrent_ppo.py [--budget 400000] [--seeds 0,1] [--variants lstm,gru,feedforward,peer]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = os.environ.get("AGILERL_PEER_PYTHON", str(Path.home() / "peer-venv" / "bin" / "python"))


def ours(variant: str, seed: int, budget: int, out: str) -> dict:
    import torch

    from agilerl_core.experiment import build_evolution, train_local
    from tasks.config import grouping, load_config

    torch.set_num_threads(1)
    over = {"max_env_steps": budget, "output_dir": out, "seed": seed, "device": "cpu"}
    if variant == "gru":
        over["network.rnn.cell"] = "gru"
    elif variant == "feedforward":
        over["network.rnn"] = None
    cfg = load_config(ROOT / "deployments" / "configs" / "cartpole_pomdp_ppo.yaml", over)
    res = train_local(cfg, progress=False, evolution=build_evolution(cfg, **grouping(cfg)))
    reached = next((h.global_steps for h in res.history if h.best_fitness >= 475), None)
    return {"first_475_global_steps": reached, "best_fitness": round(res.best_fitness, 1),
            "env_steps_per_s": round(res.env_steps_per_s, 1), "wall_s": round(res.wall_s, 1),
            "global_steps": res.global_steps, "batching": res.batching}


def peer(seed: int, budget: int) -> dict:
    import re
    import subprocess

    from peer import PEER_DIR

    proc = subprocess.run([PEER_PYTHON, "peer_agilerl_ppo.py", "--pomdp", "--seed", str(seed + 1), "--global-budget",
                           str(budget), "--threads", "1", "--evo-steps", "8192", "--out",
                           f"/tmp/peer_rppo_seed{seed}.json"], cwd=PEER_DIR, capture_output=True, text=True,
                          check=False)
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"peer run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    r = json.loads(m.group(1))
    first = r.get("first")
    return {"first_475_global_steps": None if first is None else first["train_steps"],
            "best_fitness": r["final_best_fitness_agilerl"], "env_steps_per_s": round(r["train_env_steps"] / r["wall_s"], 1),
            "wall_s": round(r["wall_s"], 1), "global_steps": r["train_env_steps"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=400_000)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--variants", default="lstm,gru,feedforward,peer")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out: dict = {"benchmark": "recurrent_ppo", "env": "CartPole-v1, velocities hidden", "population": 4,
                 "budget_env_steps": args.budget, "results": {}}
    for variant in args.variants.split(","):
        runs = []
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                r = peer(seed, args.budget) if variant == "peer" else ours(variant, seed, args.budget, tmp)
            runs.append(r)
            print(json.dumps({variant: r, "seed": seed}), flush=True)
        reached = [r["first_475_global_steps"] for r in runs]
        out["results"][variant] = {
            "runs": runs, "reached_475": sum(x is not None for x in reached),
            "median_env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in runs),
            "median_best_fitness": statistics.median(r["best_fitness"] for r in runs)}
    ff = out["results"].get("feedforward")
    for res in out["results"].values() if ff else ():  # the target: a recurrent core at >= half of it
        res["vs_feedforward_env_steps_per_s"] = round(res["median_env_steps_per_s"] / ff["median_env_steps_per_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

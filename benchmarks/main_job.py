"""The README's main job (``deployments/configs/cartpole_ppo.yaml``) over seeds: does every seed show evolution
(at least three generations, selection and mutation) and end solved, and how long does it take?

    python benchmarks/main_job.py [--config CONFIG] [--seeds 0 1 ... 9] [--set field=value ...]

Each seed runs in process (``train_local``: the flow's engine without Prefect or MLflow; the CLI adds about
10-15 s of start-up and records on top). Per seed: generations, the mutations that made non-elite children
(``none``, ``elite`` and evolution-off's ``kept`` left out), steps, wall, whether the target was held, and the
champion's fresh-seed fitness (its re-scoring over unseen episode seeds). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "deployments" / "configs" / "cartpole_ppo.yaml"


def run_seed(config: Path, seed: int, overrides: dict) -> dict:
    from agilerl_core.experiment import train_local
    from tasks.config import load_config

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(config, {"seed": seed, "output_dir": out, **overrides})
        t0 = time.perf_counter()
        res = train_local(cfg, progress=False)
        wall = time.perf_counter() - t0
    mutated = [m for h in res.history[1:] for m in h.mutations if m not in ("none", "elite", "kept")]
    champion = res.champion or {}
    fresh = [c.get("fresh_fitness") for c in champion.get("candidates", []) if c.get("role") == champion.get("chosen")]
    return {"seed": seed, "generations": res.generations, "mutations": len(mutated), "global_steps": res.global_steps,
            "wall_s": round(wall, 1), "target_held": res.target_held, "best_fitness": round(res.best_fitness, 1),
            "champion_fresh_fitness": None if not fresh or fresh[0] is None else round(fresh[0], 1)}


def main() -> None:
    from agilerl_core.config import parse_overrides

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=CONFIG, help="a config (default: the README's main job)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a config override")
    args = p.parse_args()
    overrides = parse_overrides(args.set)
    runs = [run_seed(args.config, s, overrides) for s in args.seeds]
    from tasks.config import load_config

    cfg = load_config(args.config, overrides)
    target = cfg.target_fitness
    print(json.dumps({"benchmark": "main_job", "config": str(args.config.resolve().relative_to(ROOT)), "overrides": overrides,
                      "target_fitness": target, "target_generations": cfg.target_generations,
                      "seeds_held": sum(r["target_held"] for r in runs),
                      "seeds_champion_solved": sum((r["champion_fresh_fitness"] or float("-inf")) >= target
                                                   for r in runs) if target is not None else None,
                      "min_generations": min(r["generations"] for r in runs),
                      "median_wall_s": statistics.median(r["wall_s"] for r in runs),
                      "max_wall_s": max(r["wall_s"] for r in runs), "runs": runs}))


if __name__ == "__main__":
    main()

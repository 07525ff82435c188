"""Learning targets on mpe2 simple_speaker_listener_v4 (continuous actions), from the shipped configs:

* MATD3 (deployments/configs/speaker_listener_matd3.yaml), population 4: best evaluated team return
  >= -30 within 500k global steps, seeds 0, 1, 2 (and >= -20 within 2M: `--matd3-budget 2000000`);
* IPPO (speaker_listener_ippo.yaml), population 4: >= -30 within 1M;
* MAPPO (speaker_listener_mappo.yaml: IPPO's settings, critics on the joint observation): as IPPO.

Fitness is the sum of both agents' mean return over 10 greedy episodes (they share the reward), as the
peer reports it; the peer (AgileRL 2.58, README in ../shared/bench) reached -54 (MATD3) and -34 (IPPO) at
200k here. Reported per run: the best fitness, the final elite's, the global step at which -30 was first
reached (null if never) and the wall time. Runs are repeatable: same config + seed, same numbers.

    python benchmarks/speaker_listener.py [--seeds 0 1 2] [--matd3-budget 500000] [--ippo-budget 1000000]
                                          [--skip-ippo] [--skip-matd3] [--skip-mappo]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from agilerl_core.experiment import train_local
from tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "deployments" / "configs"
THRESHOLD = -30.0


def run(config: str, seed: int, budget: int, out: str) -> dict:
    cfg = load_config(CONFIGS / config, {"seed": seed, "max_env_steps": budget, "target_fitness": None,
                                         "output_dir": out})
    res = train_local(cfg, progress=False)
    first = next((h.global_steps for h in res.history if h.best_fitness >= THRESHOLD), None)
    return {"seed": seed, "budget": budget, "best_fitness": round(res.best_fitness, 2),
            "elite_fitness": round(res.elite_fitness, 2), "steps_to_minus_30": first,
            "best_per_generation": [round(h.best_fitness, 1) for h in res.history], "wall_s": round(res.wall_s, 1),
            "env_steps_per_s": round(res.env_steps_per_s, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--matd3-budget", type=int, default=500_000)
    p.add_argument("--ippo-budget", type=int, default=1_000_000)
    p.add_argument("--skip-matd3", action="store_true")
    p.add_argument("--skip-ippo", action="store_true")
    p.add_argument("--skip-mappo", action="store_true")
    args = p.parse_args()
    out: dict = {"benchmark": "speaker_listener", "threshold": THRESHOLD}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_matd3:
            out["matd3"] = [run("speaker_listener_matd3.yaml", s, args.matd3_budget, tmp) for s in args.seeds]
        if not args.skip_ippo:
            out["ippo"] = [run("speaker_listener_ippo.yaml", s, args.ippo_budget, tmp) for s in args.seeds]
        if not args.skip_mappo:
            out["mappo"] = [run("speaker_listener_mappo.yaml", s, args.ippo_budget, tmp) for s in args.seeds]
    for name in ("matd3", "ippo", "mappo"):
        if name in out:
            out[f"{name}_all_reached"] = all(r["steps_to_minus_30"] is not None for r in out[name])
    print(json.dumps(out))


if __name__ == "__main__":
    main()

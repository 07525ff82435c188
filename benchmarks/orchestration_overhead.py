"""Orchestration overhead: the same CartPole evolution (population 4, 5 generations of 10k env steps per
member, no early stop) run in-process (`--local`: train_local) and as the Prefect flow against a
running Prefect server with MLflow server tracking (local-disk storage), alternating, in one process.

Target: flow wall time <= 1.05x the in-process wall time (median of --repeats).

Two flow variants are timed: the default thread runner (members train concurrently) and the thread
runner limited to one thread (members train one after another, as `--local` does), which isolates the
pure cost of Prefect + MLflow + per-generation commits. Imports happen once, before timing; the cost
of importing prefect and mlflow into a fresh process is reported separately.

    python benchmarks/orchestration_overhead.py [--repeats 3] [--evo-steps 10000] [--generations 5]

Starts (and stops) its own Prefect, MLflow and SeaweedFS servers on free loopback ports. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--evo-steps", type=int, default=10_000)
    p.add_argument("--generations", type=int, default=5)
    p.add_argument("--population", type=int, default=4)
    p.add_argument("--variants", nargs="+", default=["local", "flow_1_thread"],
                   choices=["local", "flow_1_thread", "flow_threads"])
    args = p.parse_args()

    from infra.stack import Stack, free_port

    tmp = Path(tempfile.mkdtemp(prefix="agilerl-bench-"))
    stack = Stack(tmp / "stack", ports={k: free_port() for k in ("s3", "mlflow", "prefect")})
    t = time.perf_counter()
    stack.start_s3()
    stack.start_mlflow()
    stack.start_prefect()
    stack_s = time.perf_counter() - t
    try:
        env = stack.client_env(("mlflow", "prefect"))
        os.environ.update(env, PREFECT_LOGGING_LEVEL="WARNING", PREFECT_SERVER_ANALYTICS_ENABLED="false")
        import_s = _import_cost(env)

        from agilerl_core.experiment import train_local
        from flows.online import online_evolution
        from flows.run_setup import Handover, prepare_run
        from tasks.config import load_config

        budget = args.evo_steps * args.population * args.generations
        base = {"evo_steps": args.evo_steps, "population_size": args.population, "max_env_steps": budget,
                "target_fitness": None, "output_dir": str(tmp / "out"), "storage.uri": str(tmp / "storage"),
                "name": "overhead-bench"}
        cfg_path = ROOT / "deployments/configs/cartpole_dqn.yaml"
        times: dict[str, list[float]] = {k: [] for k in args.variants}
        best: dict[str, list[float]] = {k: [] for k in times}
        for r in range(args.repeats):
            for kind in times:
                over = dict(base)
                over["runner.max_threads"] = 1 if kind == "flow_1_thread" else args.population
                cfg = load_config(cfg_path, over)
                t0 = time.perf_counter()
                if kind == "local":
                    res = train_local(cfg, progress=False, run_dir=tmp / f"local-{r}")
                    fitness = res.best_fitness
                else:
                    prepared = prepare_run(cfg, f"{kind.replace('_', '-')}-{r}")  # what the CLI does
                    fitness = online_evolution(config=prepared.cfg, run_id=prepared.run_id,
                                               handover=Handover(prepared))["best_fitness"]
                times[kind].append(time.perf_counter() - t0)
                best[kind].append(fitness)
                print(f"repeat {r} {kind}: {times[kind][-1]:.1f}s (best fitness {fitness})", file=sys.stderr)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({
            "benchmark": "orchestration_overhead", "env_steps_per_run": budget, "repeats": args.repeats,
            "wall_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "median_wall_s": {k: round(v, 2) for k, v in med.items()},
            **{f"ratio_{k}_vs_local": round(med[k] / med["local"], 3) for k in med if k != "local"},
            "target_ratio": 1.05, "best_fitness": best,
            "same_result_all_variants": all(best[k] == best["local"] for k in best),
            "fresh_process_import_s": round(import_s, 2), "stack_start_s": round(stack_s, 1),
        }))
    finally:
        stack.down()


def _import_cost(env: dict) -> float:
    code = "import time; t=time.perf_counter(); import flows.online; print(time.perf_counter()-t)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()

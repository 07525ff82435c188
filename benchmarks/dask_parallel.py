"""Parallel members: one generation of a population of 4 (CartPole DQN, 10k env steps per member) run
sequentially in-process vs through the flow's Dask runner on a local cluster of 2 worker processes.

Target: the Dask generation takes <= 0.6x the sequential one. Generation 0 includes the workers'
warm-up (building their envs and buffers), so the comparison uses the steady-state generations
(1 and later; median). Tracking is off and storage is a local folder, so this measures the runner.

    python benchmarks/dask_parallel.py [--generations 4] [--evo-steps 10000]

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--evo-steps", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from agilerl_core.config import load_config
    from agilerl_core.experiment import train_local
    from flows.online import online_evolution

    with tempfile.TemporaryDirectory(prefix="agilerl-bench-") as tmp:
        over = {"evo_steps": args.evo_steps, "population_size": 4, "target_fitness": None,
                "max_env_steps": args.evo_steps * 4 * args.generations, "output_dir": tmp, "tracking.enabled": False,
                "storage.uri": str(Path(tmp) / "storage")}
        cfg_path = ROOT / "deployments/configs/cartpole_dqn.yaml"
        t0 = time.perf_counter()
        seq = train_local(load_config(cfg_path, over), progress=False, run_dir=Path(tmp) / "seq")
        seq_total = time.perf_counter() - t0
        seq_gen = [h.wall_s for h in seq.history]
        cfg = load_config(cfg_path, {**over, "runner.kind": "dask", "runner.workers": args.workers})
        t0 = time.perf_counter()
        summary = online_evolution(config=cfg, run_id="dask-bench")
        dask_total = time.perf_counter() - t0
        from agilerl_core.io.run_store import RunStore
        from agilerl_core.io.storage import open_storage

        store = RunStore(open_storage(str(Path(tmp) / "storage")), "dask-bench")
        pop = json.loads(store.storage.get_bytes(store.key(store.gen_dir(store.latest_generation()), "population",
                                                           "population.json")))
        dask_gen = [h["wall_s"] for h in pop["extra"]["history"]]
    steady_seq = statistics.median(seq_gen[1:])
    steady_dask = statistics.median(dask_gen[1:])
    print(json.dumps({
        "benchmark": "dask_parallel", "population": 4, "evo_steps": args.evo_steps, "workers": args.workers,
        "cpu_count": os.cpu_count(), "sequential_generation_s": [round(x, 2) for x in seq_gen],
        "dask_generation_s": [round(x, 2) for x in dask_gen],
        "median_steady_sequential_s": round(steady_seq, 2), "median_steady_dask_s": round(steady_dask, 2),
        "ratio_dask_vs_sequential": round(steady_dask / steady_seq, 3), "target_ratio": 0.6,
        "total_s": {"sequential": round(seq_total, 1), "dask_flow": round(dask_total, 1)},
        "same_best_fitness": summary["best_fitness"] == seq.best_fitness,
    }))
    print(f"sequential {seq_gen}, dask {dask_gen}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Parallel members: one generation of a population of 4 (CartPole DQN, 10k env steps per member) run
in-process (all four one batched group; and one by one, as before population batching) vs through the
flow's Dask or Ray runner on 2 worker processes (two groups of two, one per worker).

Target: the runner's generation takes <= 0.6x the in-process one. Generation 0 includes the workers'
warm-up (building their envs and buffers), so the comparison uses the steady-state generations (1 and
later; median). Tracking is off and storage is a local folder, so this measures the runner. The per-task
overhead is measured apart: generations of one vector step per member, whose wall time is nearly all
task shipping and scheduling, divided by the tasks of a generation (a train and an evaluate per group).

    python benchmarks/parallel_runner.py [--runner dask|ray] [--generations 4] [--evo-steps 10000]

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
    p.add_argument("--runner", choices=["dask", "ray"], default="dask")
    args = p.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from agilerl_core.experiment import train_local
    from flows.online import online_evolution
    from tasks.config import load_config

    with tempfile.TemporaryDirectory(prefix="agilerl-bench-") as tmp:
        over = {"evo_steps": args.evo_steps, "population_size": 4, "target_fitness": None,
                "max_env_steps": args.evo_steps * 4 * args.generations, "output_dir": tmp, "tracking.enabled": False,
                "storage.uri": str(Path(tmp) / "storage")}
        cfg_path = ROOT / "deployments/configs/cartpole_dqn.yaml"
        t0 = time.perf_counter()
        seq = train_local(load_config(cfg_path, over), progress=False, run_dir=Path(tmp) / "seq")
        seq_total = time.perf_counter() - t0
        seq_gen = [h.wall_s for h in seq.history]
        one = train_local(load_config(cfg_path, over), batch_members=False, progress=False,
                          run_dir=Path(tmp) / "one")  # the reference before population batching
        one_gen = [h.wall_s for h in one.history]
        runner = {"runner.kind": args.runner, "runner.workers": args.workers}
        cfg = load_config(cfg_path, {**over, **runner})
        t0 = time.perf_counter()
        summary = online_evolution(config=cfg, run_id="runner-bench")
        flow_total = time.perf_counter() - t0
        flow_gen = _history(tmp, "runner-bench")
        tiny = load_config(cfg_path, {**over, **runner, "evo_steps": 8, "max_env_steps": 8 * 4 * 6,
                                      "hyperparameters.learning_delay": 0})
        online_evolution(config=tiny, run_id="overhead-bench")
        tiny_gen = _history(tmp, "overhead-bench")
    steady_seq = statistics.median(seq_gen[1:])
    steady_flow = statistics.median(flow_gen[1:])
    tasks = 2 * len(summary["group_sizes"])
    print(json.dumps({
        "benchmark": "parallel_runner", "runner": args.runner, "population": 4, "evo_steps": args.evo_steps,
        "workers": args.workers, "cpu_count": os.cpu_count(), "groups": summary["group_sizes"],
        "sequential_generation_s": [round(x, 2) for x in seq_gen],
        "runner_generation_s": [round(x, 2) for x in flow_gen],
        "median_steady_sequential_s": round(steady_seq, 2), "median_steady_runner_s": round(steady_flow, 2),
        "ratio_runner_vs_sequential": round(steady_flow / steady_seq, 3), "target_ratio": 0.6,
        "sequential_one_by_one_generation_s": [round(x, 2) for x in one_gen],
        "ratio_runner_vs_sequential_one_by_one": round(steady_flow / statistics.median(one_gen[1:]), 3),
        "overhead_per_task_s": round(statistics.median(tiny_gen[1:]) / tasks, 3),
        "total_s": {"sequential": round(seq_total, 1), "runner_flow": round(flow_total, 1)},
    }))
    print(f"sequential {seq_gen}, {args.runner} {flow_gen}", file=sys.stderr)


def _history(tmp: str, run_id: str) -> list[float]:
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage

    store = RunStore(open_storage(str(Path(tmp) / "storage")), run_id)
    pop = json.loads(store.storage.get_bytes(store.key(store.gen_dir(store.latest_generation()), "population",
                                                       "population.json")))
    return [h["wall_s"] for h in pop["extra"]["history"]]


if __name__ == "__main__":
    main()

"""Multi-agent throughput beside AgileRL 2.58 on the peer's MATD3 configuration, measured in one run.

Configuration (../shared/bench/peer_agilerl_matd3.py, --hp-set yaml, i.e. AgileRL's matd3.yaml):
mpe2 simple_speaker_listener_v4 with continuous actions, population 4, 16 envs per member, batch 128,
learn_step 16 (one gradient step of every agent's critics per vector step, actors every second), lr_actor
1e-4, lr_critic 1e-3, gamma 0.95, tau 1e-3, Ornstein-Uhlenbeck exploration (0.1, theta 0.15, dt 0.01),
learning from the first step, replay 100k, networks of two 64-unit layers, evo_steps 10,000. Ours steps the
env's copies as arrays (agilerl_core/envs/mpe_batched.py, bit for bit mpe2's results), the peer mpe2. Both sides
run on one torch thread, alternating, `--repeats` times (ours twice: the teams learning as one stacked group,
the default, and one by one); env steps/s is training steps (one step = one
parallel-env step of one sub-env, both agents acting) over wall time, evaluation included on both sides.
Medians are reported, and the ratio of each repeat (ours over the peer's run right after it, same seed):
this machine's speed drifts by up to 1.5x within minutes, which one side's median can catch and the
other's miss. The target is 6x the peer (issue 39: teams population-major). `--env-workers N` also runs ours
with the 16 copies in N worker processes (``vector_workers``).
`--dask-workers 2` also runs ours through the flow's
Dask runner (members in worker processes at once: what a 2-core machine offers that the peer's
sequential population loop does not use).

Set up the peer first (its own venv, see ../shared/bench/README.md), then:

    python benchmarks/throughput_matd3.py [--peer-python ~/peer-venv/bin/python] [--budget 40000] [--repeats 2]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from agilerl_core.experiment import train_local
from tasks.config import validate_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import run_peer  # noqa: E402  (beside this script)


def _config(budget: int, evo_steps: int, seed: int, out: str, **extra):
    return validate_config({**extra,
        "kind": "multi_agent", "name": "throughput-matd3", "env_id": "mpe2:simple_speaker_listener_v4",
        "env_kwargs": {"continuous_actions": True}, "algorithm": "matd3", "num_envs": 16, "population_size": 4,
        "evo_steps": evo_steps, "eval_episodes": 16, "max_env_steps": budget, "seed": seed, "output_dir": out,
        "hyperparameters": {"batch_size": 128, "lr_actor": 1e-4, "lr_critic": 1e-3, "gamma": 0.95, "tau": 1e-3,
                            "learn_step": 16, "policy_freq": 2, "noise_type": "ou", "expl_noise": 0.1,
                            "ou_theta": 0.15, "ou_dt": 0.01, "learning_delay": 0, "buffer_size": 100_000},
        "network": {"hidden_sizes": [64, 64], "min_nodes": 64, "max_nodes": 500, "max_hidden_layers": 3},
        "mutation": {"no_mutation": 0.4, "architecture": 0.2, "new_layer_share": 0.2, "parameters": 0.2,
                     "activation": 0.2, "rl_hp": 0.2},
        "hp_space": {"learn_step": None},  # one gradient step per vector step throughout, as measured for the peer
    })


def ours(budget: int, evo_steps: int, seed: int, out: str, env_workers: int = 0, batch: bool = True) -> dict:
    """The population in-process: teams stacked into one batched group (`batch`, the default) or one after
    another (what the peer does); with `env_workers`, the env copies step in that many worker processes."""
    res = train_local(_config(budget, evo_steps, seed, out, vector_workers=env_workers), progress=False,
                      batch_members=batch)
    return {"wall_s": res.wall_s, "train_env_steps": res.global_steps, "env_steps_per_s": res.env_steps_per_s,
            "best_fitness": res.best_fitness}


def ours_dask(budget: int, evo_steps: int, seed: int, out: str, workers: int) -> dict:
    """Through the multi-agent flow with the Dask runner: members train in `workers` processes at once.
    The rate is the flow's own training loop (cluster start included; Prefect's server start is not)."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.multi_agent import multi_agent_evolution

    cfg = _config(budget, evo_steps, seed, out, runner={"kind": "dask", "workers": workers},
                  tracking={"enabled": False}, storage={"uri": str(Path(out) / f"storage-{seed}")})
    summary = multi_agent_evolution(config=cfg, run_id=f"throughput-{seed}")
    return {"wall_s": summary["wall_s"], "train_env_steps": summary["global_steps"],
            "env_steps_per_s": summary["env_steps_per_s"], "best_fitness": summary["best_fitness"]}


def peer(python: str, budget: int, evo_steps: int, seed: int, out: str) -> dict:
    return run_peer(python, "peer_agilerl_matd3.py", "--seed", str(seed), "--global-budget", str(budget), "--evo-steps",
                    str(evo_steps), "--threads", "1", "--vec", "sync", "--out", out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer-python", default=os.path.expanduser("~/peer-venv/bin/python"))
    p.add_argument("--budget", type=int, default=40_000)
    p.add_argument("--evo-steps", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--env-workers", type=int, default=0,
                   help="also run ours with the env copies in this many worker processes (0: skip)")
    p.add_argument("--dask-workers", type=int, default=0,
                   help="also run ours through the flow's Dask runner with this many worker processes")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    mine, single, theirs, dask, overlapped = [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            mine.append(ours(args.budget, args.evo_steps, i + 1, tmp))
            single.append(ours(args.budget, args.evo_steps, i + 1, tmp, batch=False))
            if args.env_workers:
                overlapped.append(ours(args.budget, args.evo_steps, i + 1, tmp, args.env_workers))
            if args.dask_workers:
                dask.append(ours_dask(args.budget, args.evo_steps, i + 1, tmp, args.dask_workers))
            if not args.no_peer:
                theirs.append(peer(args.peer_python, args.budget, args.evo_steps, i + 1, f"{tmp}/peer{i}.json"))
    med_ours = statistics.median(r["env_steps_per_s"] for r in mine)
    out = {"benchmark": "throughput_matd3", "budget": args.budget, "repeats": args.repeats,
           "ours_env_steps_per_s_median": round(med_ours, 1), "ours": mine,
           "ours_one_by_one_env_steps_per_s_median": round(statistics.median(r["env_steps_per_s"] for r in single), 1),
           "ours_one_by_one": single}
    if overlapped:
        med_over = statistics.median(r["env_steps_per_s"] for r in overlapped)
        out.update({"env_workers": args.env_workers, "ours_env_workers_env_steps_per_s_median": round(med_over, 1),
                    "ours_env_workers": overlapped})
    if dask:
        med_dask = statistics.median(r["env_steps_per_s"] for r in dask)
        out.update({"dask_workers": args.dask_workers, "ours_dask_env_steps_per_s_median": round(med_dask, 1),
                    "ours_dask": dask})
    if theirs:
        med_peer = statistics.median(r["env_steps_per_s"] for r in theirs)
        pairs = [m["env_steps_per_s"] / t["env_steps_per_s"] for m, t in zip(mine, theirs, strict=True)]
        out.update({"peer_env_steps_per_s_median": round(med_peer, 1), "peer": theirs,
                    "speedup_median": round(med_ours / med_peer, 2),
                    "speedup_per_repeat": [round(r, 2) for r in pairs],
                    "speedup_per_repeat_median": round(statistics.median(pairs), 2), "target_speedup": 6.0})
        if overlapped:
            out["env_workers_speedup_median"] = round(med_over / med_peer, 2)
        if dask:
            out["dask_speedup_median"] = round(med_dask / med_peer, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

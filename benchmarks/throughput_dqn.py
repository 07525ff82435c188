"""Throughput beside AgileRL 2.58 on the peer's DQN configuration, measured in one run.

Configuration (../shared/bench/peer_agilerl_dqn.py): CartPole-v1, population 4, 8 envs, learn_step 1
(one gradient step per env step: 8 per vector step), batch 128, MLP 2x32, double Q, no target so the
whole budget runs. Both sides run on one torch thread, alternating, `--repeats` times; env steps/s
is training env steps over wall time (evaluation included on both sides). Medians are reported.

Set up the peer first (its own venv, see ../shared/bench/README.md), then:

    python benchmarks/throughput_dqn.py [--peer-python ~/peer-venv/bin/python] [--budget 40000] [--repeats 3]
        [--backends gymnasium,torch] [--no-unbatched] [--compile-learn]

`--compile-learn` measures each backend once more with compile_learn on (DQN's step compiled, the compile
inside the run's wall time), reported as "<backend>+compile_learn".

Targets (issue 39): 20x the peer with Python envs (gymnasium), 40x with the on-device envs (torch).

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
from tasks.config import GymPipelineConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import run_peer  # noqa: E402  (beside this script)


def ours(budget: int, evo_steps: int, seed: int, out: str, batch: bool = True, backend: str = "gymnasium") -> dict:
    backend, _, compiled = backend.partition("+")
    cfg = GymPipelineConfig(
        name="throughput", env_id="CartPole-v1", num_envs=8, env_backend=backend, population_size=4, evo_steps=evo_steps,
        compile_learn=compiled == "compile_learn",
        eval_episodes=1, max_env_steps=budget, target_fitness=None, seed=seed, output_dir=out,
        hyperparameters={"lr": 1e-3, "batch_size": 128, "learn_step": 1, "tau": 1e-3, "double": True,
                         "learning_delay": 0, "buffer_size": 100_000, "eps_end": 0.1},
        network={"hidden_sizes": [32, 32]},
        mutation={"no_mutation": 0.4, "architecture": 0.2, "new_layer_share": 0.2, "parameters": 0.2,
                  "activation": 0.0, "rl_hp": 0.2},
        hp_space={"learn_step": None},  # keep one gradient step per env step, as the peer's run does
        runner={"batch_members": batch},
    )
    res = train_local(cfg, progress=False, batch_members=cfg.runner.batch_members)
    return {"wall_s": res.wall_s, "train_env_steps": res.global_steps, "env_steps_per_s": res.env_steps_per_s,
            "group_sizes": [[len(g) for g in h.groups] for h in res.history]}


def peer(python: str, budget: int, evo_steps: int, seed: int, out: str) -> dict:
    return run_peer(python, "peer_agilerl_dqn.py", "--seed", str(seed), "--global-budget", str(budget), "--evo-steps",
                    str(evo_steps), "--threads", "1", "--out", out)


TARGETS = {"gymnasium": 20.0, "torch": 40.0}  # speedup over the peer (issue 39); envpool has none of its own


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peer-python", default=os.path.expanduser("~/peer-venv/bin/python"))
    p.add_argument("--budget", type=int, default=40_000)
    p.add_argument("--evo-steps", type=int, default=5_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--no-unbatched", action="store_true", help="skip the one-by-one runs")
    p.add_argument("--backends", default="gymnasium",
                   help="what steps our envs, comma-separated (gymnasium, torch, envpool): each measured in turn")
    p.add_argument("--compile-learn", action="store_true", help="each backend also with compile_learn on")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    backends = args.backends.split(",")
    if args.compile_learn:
        backends += [f"{b}+compile_learn" for b in backends]
    mine: dict[str, list] = {b: [] for b in backends}
    unbatched, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):  # alternating: each backend batched, the first one by one, the peer
            for b in backends:
                mine[b].append(ours(args.budget, args.evo_steps, i + 1, tmp, backend=b))
            if not args.no_unbatched:
                unbatched.append(ours(args.budget, args.evo_steps, i + 1, tmp, batch=False, backend=backends[0]))
            if not args.no_peer:
                theirs.append(peer(args.peer_python, args.budget, args.evo_steps, i + 1, f"{tmp}/peer{i}.json"))
    out = {"benchmark": "throughput_dqn", "budget": args.budget, "repeats": args.repeats, "backends": {}}
    med_peer = statistics.median(r["env_steps_per_s"] for r in theirs) if theirs else None
    for b, runs in mine.items():
        med = statistics.median(r["env_steps_per_s"] for r in runs)
        row = {"env_steps_per_s_median": round(med, 1), "runs": runs}
        if med_peer:  # each repeat's ratio to the peer's run right after it, and the ratio of the medians
            row.update(speedup_median=round(med / med_peer, 2), target_speedup=TARGETS.get(b.partition("+")[0]),
                       speedup_per_repeat=[round(r["env_steps_per_s"] / t["env_steps_per_s"], 2)
                                           for r, t in zip(runs, theirs, strict=True)])
        out["backends"][b] = row
    if unbatched:
        med_one = statistics.median(r["env_steps_per_s"] for r in unbatched)
        out.update(unbatched_backend=backends[0], unbatched_env_steps_per_s_median=round(med_one, 1),
                   batching_speedup_median=round(out["backends"][backends[0]]["env_steps_per_s_median"] / med_one, 2))
    if theirs:
        out.update(peer_env_steps_per_s_median=round(med_peer, 1), peer=theirs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

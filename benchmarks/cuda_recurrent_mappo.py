"""The GPU checks of recurrent PPO and MAPPO (CI has no GPU; run where one is lent):

1. a population-batched group of recurrent PPO members of different core sizes (LSTM and GRU) updates on the
   GPU as each member does alone there (largest weight difference), and as it does on the CPU;
2. the shipped cartpole_pomdp_ppo config trained on the GPU: env steps/s, whether it reached 475, and the
   wall time of one generation at population 4 and 16 (same steps per member);
3. a MAPPO team run (the tests' two-agent env, shared policy off) on the GPU: it trains and evaluates.

    python benchmarks/cuda_recurrent_mappo.py [--budget 200000]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from tests.conftest import ppo_learn_alone, ppo_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def group_matches_alone(device: str) -> dict:
    from agilerl_core.algorithms.ppo import PPO
    from tests.test_recurrent import _sequences, rppo, stack_sequence_rows

    out = {}
    for cell in ("lstm", "gru"):
        hidden = [16, 24, 8]
        solo = []
        for i, h in enumerate(hidden):
            a = rppo(50 + i, cell, h, lr=1e-3 * (i + 1), update_epochs=2, num_minibatches=2)
            cpu_twin = a.clone()
            moved = PPO.from_state(a.obs_spec, *a.state(), device=device)
            solo.append((moved, cpu_twin))
        together = [m.clone() for m, _ in solo]
        data = []
        for h in hidden:
            r, adv, ret = _sequences(60 + h, hidden=h)
            if cell == "gru":
                r.states = {k: v[:, :, :, :1] for k, v in r.states.items()}
            data.append((r, adv, ret))
        for (m, cpu), (r, adv, ret) in zip(solo, data, strict=True):
            ppo_learn_alone(m, r, 10, adv, ret)
            ppo_learn_alone(cpu, r, 10, adv, ret)
        group = PPO.group(together)
        rows = [ppo_rows(a, r, 10, adv, ret) for a, (r, adv, ret) in zip(together, data, strict=True)]
        group.learn_stacked(*stack_sequence_rows(rows))
        group.write_back()

        def diff(x, y):
            tx, ty = x.state()[0], y.state()[0]
            return max(float((tx[k].float() - ty[k].float()).abs().max()) for k in tx if not k.startswith("rng/"))

        out[cell] = {"group_vs_alone_on_gpu": max(diff(t, m) for t, (m, _) in zip(together, solo, strict=True)),
                     "gpu_vs_cpu": max(diff(m, c) for m, c in solo)}
    return out


def pomdp_run(device: str, budget: int) -> dict:
    from agilerl_core.experiment import build_evolution, train_local
    from tasks.config import grouping, load_config

    with tempfile.TemporaryDirectory() as tmp:
        over = {"device": device, "max_env_steps": budget, "output_dir": tmp}
        cfg = load_config(ROOT / "deployments" / "configs" / "cartpole_pomdp_ppo.yaml", over)
        res = train_local(cfg, progress=False, evolution=build_evolution(cfg, **grouping(cfg)))
        reached = next((h.global_steps for h in res.history if h.best_fitness >= 475), None)
        scaling = {}
        for pop in (4, 16):
            cfg = load_config(ROOT / "deployments" / "configs" / "cartpole_pomdp_ppo.yaml",
                              {**over, "population_size": pop, "max_env_steps": pop * 8192, "target_fitness": None})
            t = time.perf_counter()
            one = train_local(cfg, progress=False, evolution=build_evolution(cfg, **grouping(cfg)))
            scaling[pop] = {"generation_wall_s": round(time.perf_counter() - t, 2), "batching": one.batching}
    return {"first_475_global_steps": reached, "best_fitness": round(res.best_fitness, 1),
            "env_steps_per_s": round(res.env_steps_per_s, 1), "population_generation_wall_s": scaling}


def mappo_run(device: str) -> dict:
    from agilerl_core.experiment import train_local
    from tests.test_multi_agent import ma_config

    with tempfile.TemporaryDirectory() as tmp:
        cfg = ma_config(algorithm="mappo", device=device, hyperparameters={"rollout_steps": 16}, evo_steps=400,
                        max_env_steps=1600)
        res = train_local(cfg, progress=False, run_dir=Path(tmp) / "run")
    return {"generations": res.generations, "best_fitness": round(res.best_fitness, 2), "batching": res.batching}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=200_000)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"benchmark": "cuda_recurrent_mappo", "device": device,
           "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}
    for name, fn in (("recurrent_group", lambda: group_matches_alone(device)),
                     ("pomdp", lambda: pomdp_run(device, args.budget)), ("mappo", lambda: mappo_run(device))):
        t = time.perf_counter()
        out[name] = fn()
        out[name]["wall_s"] = round(time.perf_counter() - t, 1)
        print(json.dumps({name: out[name]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""What compile_learn buys: one DQN gradient step of a group of K members (the shipped CartPole DQN sizes: 64x64
MLP, batch 128, double Q, MSE, soft targets), eager against compiled by torch.compile (Inductor), on the same
minibatches, and what the compile costs: the first call (a fresh process: Inductor's on-disk cache may be warm
from an earlier run) and the first call at a second shape (wider members: every new shape compiles again).
One torch thread, medians of `--repeats` timings of `--steps` steps each.

    python benchmarks/compile_learn.py [--ks 1,4,16] [--steps 200] [--repeats 5] [--device cpu]

Prints one JSON object (microseconds per step for all K members together; seconds for the compiles).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched_learn_paths import timed

from agilerl_core.algorithms.dqn import DQN
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.buffers.replay import Transition
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.networks import initial_arch

SPEC = ObsSpec(spaces.Box(-5, 5, (4,), np.float32))


def group(k: int, hidden: int, device: str, compiled: bool):
    arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=[hidden, hidden]))
    g = DQN.group([DQN(SPEC, 2, arch, DQNHyperparameters(batch_size=128, lr=1e-3 * (1 + i % 3)), i, device)
                   for i in range(k)])
    if compiled:
        assert g.compile_learn()
    return g


def data(k: int, b: int, device: str) -> Transition:
    gen = torch.Generator().manual_seed(0)
    t = Transition({"obs": torch.randn(k * b, 4, generator=gen)}, torch.randint(0, 2, (k * b,), generator=gen),
                   torch.randn(k * b, generator=gen), {"obs": torch.randn(k * b, 4, generator=gen)},
                   (torch.rand(k * b, generator=gen) < 0.05).float())
    return Transition({"obs": t.obs["obs"].to(device)}, t.action.to(device), t.reward.to(device),
                      {"obs": t.next_obs["obs"].to(device)}, t.terminated.to(device))


def first_call(g, batch, rows, device: str) -> float:
    t0 = time.perf_counter()
    g.learn(batch, rows)
    if device == "cuda":
        torch.cuda.synchronize()
    return round(time.perf_counter() - t0, 2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ks", default="1,4,16")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    dev, b = args.device, 128
    ks = [int(x) for x in args.ks.split(",")]
    out = {"benchmark": "compile_learn", "net": "64x64", "batch": b, "device": dev, "torch": torch.__version__}
    rows = {k: StackedRows([torch.arange(b)] * k, torch.device(dev)) for k in ks}
    batches = {k: data(k, b, dev) for k in ks}
    out["first_compile_s"] = first_call(group(ks[0], 64, dev, True), batches[ks[0]], rows[ks[0]], dev)
    out["second_shape_compile_s"] = first_call(group(ks[0], 96, dev, True), batches[ks[0]], rows[ks[0]], dev)
    out["us_per_step"] = {}
    for k in ks:
        eager, compiled = group(k, 64, dev, False), group(k, 64, dev, True)
        res = {name: round(timed(lambda g=g, x=batches[k], r=rows[k]: g.learn(x, r), args.steps, args.repeats), 1)
               for name, g in (("eager", eager), ("compiled", compiled))}
        res["speedup"] = round(res["eager"] / res["compiled"], 2)
        out["us_per_step"][str(k)] = res
    print(json.dumps(out))


if __name__ == "__main__":
    main()

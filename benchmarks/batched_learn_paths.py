"""Which batched learning path is faster here: one DQN gradient step (double Q, MSE, Adam, soft target
update) for K members of one architecture, three ways, on the same minibatches:

* ``one_by_one``: each member alone, a group of one (K calls of the population code at K = 1);
* ``stacked``: the group's step (`agilerl_core.algorithms.dqn.group`): stacked networks, autograd, one
  stacked Adam step - what the pipeline uses;
* ``vmap``: torch.func (`stack_module_state` + `vmap(grad(loss))` through `functional_call`), then the
  same Adam maths on the stacked parameters.

Shipped CartPole DQN sizes (64x64 MLP, batch 128), one torch thread, medians of `--repeats` timings of
`--steps` steps each. Prints one JSON object (microseconds per step for all K members together).
benchmarks/population_flops.py measures the group step of every family against the GEMM peak.

    python benchmarks/batched_learn_paths.py [--ks 1,4,16] [--steps 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import numpy as np
import torch
from gymnasium import spaces
from torch.func import functional_call, grad, stack_module_state, vmap

from agilerl_core.algorithms.dqn import DQN
from agilerl_core.algorithms.group import StackedRows
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.buffers.replay import Transition
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.networks import initial_arch

SPEC = ObsSpec(spaces.Box(-5, 5, (4,), np.float32))


def members(k: int) -> list[DQN]:
    arch = initial_arch(SPEC, 2, NetworkConfig(hidden_sizes=[64, 64]))
    return [DQN(SPEC, 2, arch, DQNHyperparameters(batch_size=128, lr=1e-3 * (1 + i % 3)), i) for i in range(k)]


def batch(k: int, b: int, seed: int = 0) -> Transition:
    g = torch.Generator().manual_seed(seed)
    obs = {"obs": torch.randn(k * b, 4, generator=g)}
    nxt = {"obs": torch.randn(k * b, 4, generator=g)}
    return Transition(obs, torch.randint(0, 2, (k * b,), generator=g), torch.randn(k * b, generator=g), nxt,
                      (torch.rand(k * b, generator=g) < 0.05).float())


def timed(fn, steps: int, repeats: int) -> float:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        runs.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(runs)


def one_by_one(k: int, b: int):
    agents, full = members(k), batch(k, b)
    parts = [Transition({"obs": full.obs["obs"][i * b:(i + 1) * b]}, full.action[i * b:(i + 1) * b],
                        full.reward[i * b:(i + 1) * b], {"obs": full.next_obs["obs"][i * b:(i + 1) * b]},
                        full.terminated[i * b:(i + 1) * b]) for i in range(k)]
    groups = [DQN.group([a]) for a in agents]
    return lambda: [g.learn_batch(p) for g, p in zip(groups, parts, strict=True)]


def stacked(k: int, b: int):
    group = DQN.group(members(k))
    full = batch(k, b)
    rows = StackedRows([torch.arange(b)] * k, torch.device("cpu"))
    return lambda: group.learn(full, rows)


def vmapped(k: int, b: int):
    agents = members(k)
    online = [a.networks["q"].mlp for a in agents]
    target = [copy.deepcopy(m) for m in online]
    params, _ = stack_module_state(online)
    tparams, _ = stack_module_state(target)
    base = copy.deepcopy(online[0]).to("meta")
    full = batch(k, b)
    obs, nxt = full.obs["obs"].view(k, b, 4), full.next_obs["obs"].view(k, b, 4)
    act, rew, term = full.action.view(k, b), full.reward.view(k, b), full.terminated.view(k, b)
    lr = torch.tensor([a.hp.lr for a in agents])
    state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    step = [0]

    def loss(p, tp, o, n, a, r, t):
        q = functional_call(base, p, (o,))
        with torch.no_grad():
            best = functional_call(base, p, (n,)).argmax(1, keepdim=True)
            nq = functional_call(base, tp, (n,)).gather(1, best).squeeze(1)
            y = r + 0.99 * (1 - t) * nq
        return (q.gather(1, a.unsqueeze(1)).squeeze(1) - y).square().mean()

    grads_fn = vmap(grad(loss))

    def run():
        g = grads_fn(params, tparams, obs, nxt, act, rew, term)
        step[0] += 1
        with torch.no_grad():
            for name, p in params.items():
                m, v = state[name]
                m.lerp_(g[name], 0.1)
                v.mul_(0.999).addcmul_(g[name], g[name], value=0.001)
                denom = (v / (1 - 0.999 ** step[0])).sqrt_().add_(1e-8)
                p.sub_((m / (1 - 0.9 ** step[0])) / denom * lr.view(-1, *[1] * (p.dim() - 1)))
                tparams[name].lerp_(p, 0.005)

    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ks", default="1,4,16")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    out = {"benchmark": "batched_learn_paths", "net": "64x64", "batch": 128, "us_per_step": {}}
    for k in (int(x) for x in args.ks.split(",")):
        res = {name: round(timed(make(k, 128), args.steps, args.repeats), 1)
               for name, make in (("one_by_one", one_by_one), ("stacked", stacked), ("vmap", vmapped))}
        res["vmap_over_stacked"] = round(res["vmap"] / res["stacked"], 2)
        out["us_per_step"][str(k)] = res
    print(json.dumps(out))


if __name__ == "__main__":
    main()

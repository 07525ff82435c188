"""How close population-batched learning gets to this CPU's matmul peak: one learn step of K members (one
group: stacked networks, autograd, one stacked Adam) for K = 1, 4, 16, 64, with its matmul and convolution
FLOPs counted by torch's FlopCounterMode (forward and backward, as executed) and the step timed.

* dqn: CartPole-sized DQN (obs 4, MLP 64x64, 2 actions, batch 128; double Q, soft target);
* ppo: CartPole-sized PPO minibatch (obs 4, actor and critic MLP 64x64, minibatch 256);
* cnn_ppo: MinAtar-sized frames (10x10x4 uint8, conv 16 3x3 stride 1, latent 128, MLP 64x64), minibatch 256;
* matd3: simple_speaker_listener-sized MATD3 team (obs 3 and 11, actions 3 and 5, MLP 64x64, batch 128);
* grpo: one GRPO learn step of K LoRA adapters (rank 8 on c_attn, c_proj, c_fc) on one shared GPT-2 built from a
  config (n_embd 64, 2 layers, the GRPO speed benchmark's), 8 prompts x group 8 per member, 4 new tokens at
  temperature 1, one update epoch, no reference pass: sampling with the KV cache plus the loss's forward and
  backward, the K members' rows through one forward of the base.

Beside it, the single-thread GEMM peak: float32 `torch.mm` of square matrices (256 to 1024, the best median).
On a CPU a population is compute-bound once its matmuls are large enough, so the figure to chase is the
share of that peak; small members leave it to per-op overhead. One torch thread throughout.

    python benchmarks/population_flops.py [--ks 1,4,16,64] [--algos dqn,ppo,cnn_ppo,matd3,grpo] [--steps 20] [--repeats 5]

Prints one JSON object: per algorithm and K the median µs per step, µs per member-step, GFLOP per step,
achieved GFLOP/s and its share of the GEMM peak.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from gymnasium import spaces
from torch.utils.flop_counter import FlopCounterMode

from agilerl_core.algorithms.dqn import DQN
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.algorithms.hyperparameters.maddpg import MATD3Hyperparameters
from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
from agilerl_core.algorithms.maddpg import MATD3
from agilerl_core.algorithms.ppo import PPO
from agilerl_core.buffers.replay import MultiAgentBatch, Transition
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.spaces import MultiAgentSpec, ObsSpec
from agilerl_core.networks import initial_arch
from agilerl_core.networks.evolvable import ArchSpec
from agilerl_core.networks.mlp import MLPSpec

NET = NetworkConfig(hidden_sizes=[64, 64])
IMAGE = spaces.Box(0, 255, (10, 10, 4), np.uint8)
CNN_NET = NetworkConfig(hidden_sizes=[64, 64], cnn={"channels": [16], "kernel_sizes": [3], "strides": [1],
                                                     "latent_dim": 128})


def gemm_peak(repeats: int = 5) -> dict:
    """Single-thread float32 matmul rate (GFLOP/s) of square matrices; the best size's median."""
    rates = {}
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        runs = []
        for _ in range(repeats):
            reps = max(1, int(2e9 / (2 * n ** 3)))
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            runs.append(2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9)
        rates[n] = statistics.median(runs)
    return {"gflops": round(max(rates.values()), 1), "by_size": {str(n): round(r, 1) for n, r in rates.items()}}


def _rows(k: int, b: int, g: torch.Generator, obs: torch.Tensor, actions: torch.Tensor) -> Transition:
    return Transition({"obs": obs}, actions, torch.randn(k * b, generator=g), {"obs": obs.flip(0)},
                      (torch.rand(k * b, generator=g) < 0.05).float())


def dqn_step(k: int):
    spec = ObsSpec(spaces.Box(-5, 5, (4,), np.float32))
    arch = initial_arch(spec, 2, NET)
    group = DQN.group([DQN(spec, 2, arch, DQNHyperparameters(batch_size=128, lr=1e-3 * (1 + i % 3)), i)
                       for i in range(k)])
    g = torch.Generator().manual_seed(0)
    batch = _rows(k, 128, g, torch.randn(k * 128, 4, generator=g), torch.randint(0, 2, (k * 128,), generator=g))
    return lambda: group.learn_batch(batch)


def _ppo_step(k: int, spec: ObsSpec, net: NetworkConfig, obs: torch.Tensor):
    """One minibatch step of K members (an update of one epoch and one minibatch)."""
    arch = initial_arch(spec, 3, net)
    group = PPO.group([PPO(spec, 3, arch, PPOHyperparameters(lr=1e-3 * (1 + i % 3), update_epochs=1,
                                                             num_minibatches=1), i) for i in range(k)])
    g = torch.Generator().manual_seed(0)
    b = obs.shape[0]
    data = {"obs": {"obs": obs.unsqueeze(0).expand(k, *obs.shape)}, "actions": torch.randint(0, 3, (k, b), generator=g),
            "logprobs": -torch.rand(k, b, generator=g), "values": torch.randn(k, b, generator=g)}
    adv, ret = torch.randn(k, b, generator=g), torch.randn(k, b, generator=g)
    return lambda: group.learn_stacked(data, adv, ret)


def ppo_step(k: int):
    return _ppo_step(k, ObsSpec(spaces.Box(-5, 5, (4,), np.float32)), NET,
                     torch.randn(256, 4, generator=torch.Generator().manual_seed(1)))


def cnn_ppo_step(k: int):
    frames = torch.randint(0, 2, (256, 10, 10, 4), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    return _ppo_step(k, ObsSpec(IMAGE, channels_last=True), CNN_NET, frames)


def matd3_step(k: int):
    agents = ("speaker_0", "listener_0")
    spec = MultiAgentSpec.from_spaces(agents, {"speaker_0": spaces.Box(-1, 1, (3,), np.float32),
                                               "listener_0": spaces.Box(-1, 1, (11,), np.float32)},
                                      {"speaker_0": spaces.Box(-1, 1, (3,), np.float32),
                                       "listener_0": spaces.Box(-1, 1, (5,), np.float32)})
    arch = ArchSpec(MLPSpec(0, 0, (64, 64), "relu"))
    group = MATD3.group([MATD3(spec, spec.actions, arch, MATD3Hyperparameters(policy_freq=1, batch_size=128), i)
                         for i in range(k)])
    g = torch.Generator().manual_seed(0)
    n = k * 128
    obs = {"speaker_0": torch.randn(n, 3, generator=g), "listener_0": torch.randn(n, 11, generator=g)}
    batch = MultiAgentBatch(obs, {"speaker_0": torch.rand(n, 3, generator=g) * 2 - 1,
                                  "listener_0": torch.rand(n, 5, generator=g) * 2 - 1},
                            {a: torch.randn(n, generator=g) for a in agents},
                            {a: v.flip(0) for a, v in obs.items()}, {a: torch.zeros(n) for a in agents},
                            {a: torch.ones(n) for a in agents})
    return lambda: group.learn_batch(batch)


def grpo_step(k: int):
    import tempfile
    from pathlib import Path

    from agilerl_core.arenas import build_arena
    from agilerl_core.data.prompts import write_jsonl
    from agilerl_core.llm.grpo import GRPO
    from tasks.config import validate_config

    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_jsonl(Path(tmp) / "digit_sum.jsonl", [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10)}
                                                               for a in range(10) for b in range(10)]))
        arena = build_arena(validate_config({
            "kind": "llm", "name": "grpo-flops", "algorithm": "grpo", "population_size": k, "seed": 1,
            "model": {"config": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128,
                                 "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0},
                      "tokenizer_chars": "0123456789+=", "lora": {"rank": 8, "alpha": 16,
                                                                  "targets": ["c_attn", "c_proj", "c_fc"]}},
            "dataset": {"uri": data, "held_out": 10},
            "hyperparameters": {"batch_size": 8, "group_size": 8, "beta": 0.0, "max_new_tokens": 4,
                                "temperature": 1.0, "micro_batch_size": 4096, "generation_batch_size": 4096},
            "kl_metric": False}))
    members = arena.build_members(list(range(k)))
    gens = [torch.Generator().manual_seed(i) for i in range(k)]
    rng = np.random.default_rng(0)
    n = len(arena.train_data)
    return lambda: GRPO.learn_group(members, [rng.choice(n, 8, replace=False).tolist() for _ in members],
                                    arena.train_data, arena.rewards, gens, kl_metric=False)


STEPS = {"dqn": dqn_step, "ppo": ppo_step, "cnn_ppo": cnn_ppo_step, "matd3": matd3_step, "grpo": grpo_step}


def measure(make, k: int, steps: int, repeats: int) -> tuple[float, float]:
    """(median seconds per step, FLOPs per step) of one K-member learn step."""
    step = make(k)
    step()  # warm-up
    with FlopCounterMode(display=False) as counter:
        step()
    flops = counter.get_total_flops()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        runs.append((time.perf_counter() - t0) / steps)
    return statistics.median(runs), flops


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ks", default="1,4,16,64")
    p.add_argument("--algos", default="dqn,ppo,cnn_ppo,matd3,grpo")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    peak = gemm_peak(args.repeats)
    out: dict = {"benchmark": "population_flops", "threads": 1, "gemm_peak": peak, "results": {}}
    for algo in args.algos.split(","):
        res = {}
        for k in (int(x) for x in args.ks.split(",")):
            sec, flops = measure(STEPS[algo], k, args.steps, args.repeats)
            rate = flops / sec / 1e9
            res[str(k)] = {"us_per_step": round(sec * 1e6, 1), "us_per_member_step": round(sec * 1e6 / k, 1),
                           "gflop_per_step": round(flops / 1e9, 4), "gflops": round(rate, 2),
                           "share_of_peak": round(rate / peak["gflops"], 3)}
        out["results"][algo] = res
        print(json.dumps({algo: res}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

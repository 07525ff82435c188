"""GRPO (and LLM-PPO, REINFORCE) speed beside AgileRL 2.58 on the peer's tiny model, measured alternately in one run.

Configuration (../shared/bench/peer_agilerl_grpo.py, --task digit_sum, from AgileRL's
grpo_constant_target.yaml): a GPT-2 built from a config (n_embd 64, 2 layers, 2 heads, random weights) with
a 15-token character-level tokenizer; prompts "a+b=" with a, b in 0..4; reward 1 when the one generated
character is (a+b) % 10. Batch 32 prompts, group 8, lr 1e-3, beta 0, clip 0.2, grad-norm 1, temperature 0.5,
2 update epochs, LoRA r 8 / alpha 16 on c_attn, c_proj, c_fc; mutations of lr and beta only; 4,096 training
completions per member, 1,024 per generation. Both sides on one torch thread. Ours skips the reference pass
as the peer does at beta 0 (``kl_metric: false``); ``--kl-metric`` measures ours with it.

Completions/s is training completions over wall time (evaluation included on both sides: the peer's 32
held-out episodes per evaluation, ours the 5 held-out prompts of the 25 the task has); learn steps/s counts
one optimiser update over a whole batch (both epochs) as one step, as the peer's learn() call does.

    python benchmarks/llm_grpo_speed.py [--peer-python ~/peer-venv/bin/python] [--pops 1 2 4]
                                        [--algorithms grpo llm_ppo reinforce]

``--algorithms`` runs each of ours with the same settings (LLM-PPO: the same batch and group, its value head
and GAE on top; REINFORCE: its leave-one-out baseline) beside the peer's same-named algorithm (its ``PPO`` and
``REINFORCE`` of ``agilerl.algorithms.ppo_llm`` / ``reinforce_llm``, ``peer_agilerl_grpo.py --algo``).

The peer needs its cpu-llm extra (see ../shared/bench/README.md). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from agilerl_core.data.prompts import write_jsonl
from agilerl_core.experiment import build_evolution
from tasks.config import validate_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import PEER_DIR, in_fresh_process  # beside this script


def _config(pop: int, data: str, kl_metric: bool, algorithm: str = "grpo") -> dict:
    return {"kind": "llm", "name": "grpo-speed", "algorithm": algorithm, "population_size": pop, "seed": 1,
            "model": {"config": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128,
                                 "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0},
                      "tokenizer_chars": "0123456789+=",
                      "lora": {"rank": 8, "alpha": 16, "targets": ["c_attn", "c_proj", "c_fc"]}},
            "dataset": {"uri": data, "held_out": 5},
            "hyperparameters": {"lr": 1e-3, "batch_size": 32, "group_size": 8, "beta": 0.0, "clip": 0.2,
                                "max_grad_norm": 1.0, "temperature": 0.5, "update_epochs": 2, "max_new_tokens": 1,
                                "micro_batch_size": 256},
            "hp_space": {"group_size": None, "temperature": None},
            "mutation": {"no_mutation": 0.1, "rl_hp": 0.6, "adapter_rank": 0.0},
            "evo_steps": 1024, "max_env_steps": 4096 * pop, "kl_metric": kl_metric, "sample_completions": 0}


def ours(pop: int, data: str, kl_metric: bool, algorithm: str = "grpo") -> dict:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    evo = build_evolution(validate_config(_config(pop, data, kl_metric, algorithm)))
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    while not evo.finished():
        if evo.history:
            evo.evolve()
        evo.run_generation()
    wall = time.perf_counter() - t0
    completions = evo.global_steps
    learn = completions // (32 * 8)  # every step is one batch of 32 prompts x 8 (group_size does not mutate here)
    return {"build_s": round(build, 2), "wall_s": round(wall, 3), "train_completions": completions,
            "completions_per_s": round(completions / wall, 1), "learn_steps_per_s": round(learn / wall, 2),
            "best_fitness": evo.best_fitness(),
            "train_mean_reward": round(sum(sum(h.train_returns) for h in evo.history)
                                       / sum(len(h.train_returns) for h in evo.history), 4),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


PEER_ALGO = {"grpo": "grpo", "llm_ppo": "ppo", "reinforce": "reinforce"}


def peer(python: str, pop: int, algorithm: str = "grpo") -> dict:
    import re
    import subprocess

    args = ["--pop", str(pop), "--seed", "1", "--task", "digit_sum", "--max-steps", str(4096 * pop),
            "--evo-steps", "4", "--eval-interval", "4", "--eval-loop", "32", "--threads", "1",
            "--algo", PEER_ALGO[algorithm]]
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([python, "peer_agilerl_grpo.py", *args, "--out", f"{tmp}/r.json"], cwd=PEER_DIR,
                              capture_output=True, text=True, check=False)
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"peer run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    r = json.loads(m.group(1))
    return {"wall_s": round(r["wall_s"], 3), "train_completions": r["train_completions"],
            "completions_per_s": round(r["train_completions"] / r["wall_s"], 1),
            "learn_steps_per_s": round(r["iterations"] * pop / r["wall_s"], 2),
            "best_fitness": r["best_eval_fitness"], "train_mean_reward": round(r["train_mean_reward"], 4),
            "peak_rss_mib": round(r["peak_rss_mib"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--peer-python", default=os.path.expanduser("~/peer-venv/bin/python"))
    p.add_argument("--pops", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--kl-metric", action="store_true", help="ours also computes the KL to the base (beta 0)")
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--algorithms", nargs="+", default=["grpo"], choices=sorted(PEER_ALGO))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_jsonl(Path(tmp) / "digit_sum.jsonl",
                               [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10)} for a in range(5) for b in range(5)]))
        rows = []
        for algorithm in args.algorithms:
            for pop in args.pops:
                row = {"algorithm": algorithm, "pop": pop,
                       "ours": in_fresh_process("llm_grpo_speed", f"ours({pop}, {data!r}, {args.kl_metric}, {algorithm!r})")}
                if not args.no_peer:
                    row["peer"] = peer(args.peer_python, pop, algorithm)
                    row["completions_speedup"] = round(row["ours"]["completions_per_s"] / row["peer"]["completions_per_s"], 2)
                    row["learn_steps_speedup"] = round(row["ours"]["learn_steps_per_s"] / row["peer"]["learn_steps_per_s"], 2)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "llm_grpo_speed", "kl_metric": args.kl_metric, "rows": rows, "target_speedup": 3.0}))


if __name__ == "__main__":
    main()

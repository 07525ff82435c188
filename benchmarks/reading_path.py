"""What a reader must open to follow one algorithm end to end: the project files whose code runs in a short
in-process run (``train_local``: config to env step, update, evaluation, selection, checkpoint), with their
lines, from one run under cProfile (every function that ran, by file; tests excluded).

    python benchmarks/reading_path.py [--algorithm ppo] [--env CartPole-v1]

Issue 51's target for PPO and DQN: at most 10 files and 2,500 lines. Prints one JSON object (files sorted by
path, each with its lines and how many of its functions ran).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def reading_path(algorithm: str, env_id: str) -> dict:
    import torch

    from agilerl_core.experiment import train_local
    from tasks.config import validate_config

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        cfg = validate_config({"name": "reading-path", "env_id": env_id, "algorithm": algorithm, "population_size": 2,
                               "num_envs": 4, "evo_steps": 512, "max_env_steps": 2048, "eval_episodes": 1, "seed": 0,
                               "output_dir": out})
        prof = cProfile.Profile()
        prof.enable()
        train_local(cfg, progress=False)
        prof.disable()
    ran: dict[str, set[str]] = {}
    for (filename, _, function), _ in pstats.Stats(prof).stats.items():
        path = Path(filename)
        if path.is_file() and ROOT in path.parents and "tests" not in path.relative_to(ROOT).parts:
            ran.setdefault(str(path.relative_to(ROOT)), set()).add(function)
    files = {f: {"lines": len((ROOT / f).read_text().splitlines()), "functions_run": len(fns)}
             for f, fns in sorted(ran.items())}
    return {"benchmark": "reading_path", "algorithm": algorithm, "env_id": env_id, "files": len(files),
            "lines": sum(v["lines"] for v in files.values()), "target": {"files": 10, "lines": 2500},
            "by_file": files}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="ppo")
    p.add_argument("--env", default="CartPole-v1")
    args = p.parse_args()
    print(json.dumps(reading_path(args.algorithm, args.env)))


if __name__ == "__main__":
    main()

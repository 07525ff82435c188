"""One LLM member's training phase in N processes (``model.data_parallel: N``), launched by the LLM arena.

The arena's train launches this module under ``accelerate launch --multi_gpu --num_processes N`` (with
``Accelerator(cpu=True)`` on a machine without CUDA: Accelerate's ``--cpu`` flag would run one process); the
member travels as safetensors + JSON through a temporary directory. Each process trains its share
(:class:`agilerl_core.llm.data_parallel.DataParallel`); rank 0 writes the trained member back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agilerl_core.errors import AgileRLError
from agilerl_core.llm.data_parallel import DataParallel
from agilerl_core.net import free_port


def _save(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path / "member.safetensors"))
    (path / "member.json").write_text(json.dumps(meta))


def _load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return load_file(str(path / "member.safetensors")), json.loads((path / "member.json").read_text())


def train_data_parallel(arena, member, slot: int, seed: int, steps: int, processes: int):
    """Train `member` for one phase in `processes` processes; the member takes the trained state in place.
    Returns the phase's TrainResult (as rank 0 measured it)."""
    from agilerl_core.config import engine_data
    from agilerl_core.results import TrainResult

    with tempfile.TemporaryDirectory(prefix="agilerl-dp-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "in").mkdir()
        (tmp_path / "out").mkdir()
        _save(tmp_path / "in", *member.state())
        cfg = engine_data(arena.cfg)
        cfg["model"]["data_parallel"] = 1  # the processes train in-process
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), "-m", "agilerl_core.arenas.llm_data_parallel",
               "--dir", str(tmp_path), "--slot", str(slot), "--seed", str(seed), "--steps", str(steps)]
        env = {**os.environ, "OMP_NUM_THREADS": str(arena.cfg.torch_threads)}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if p.returncode != 0:
            raise AgileRLError(f"model.data_parallel: the {processes}-process training of member {slot} failed "
                               f"(exit {p.returncode}):\n{p.stderr[-3000:]}")
        tensors, meta = _load(tmp_path / "out")
        out = json.loads((tmp_path / "out" / "result.json").read_text())
    if out["processes"] != processes:  # e.g. `accelerate launch --cpu` silently runs one
        raise AgileRLError(f"model.data_parallel: {processes} processes were asked for, but the phase ran in "
                           f"{out['processes']}")
    member.take(arena.member_from_state(tensors, meta))
    return TrainResult(**out["result"])


def main() -> None:
    """One process of a data-parallel phase (launched by :func:`train_data_parallel`)."""
    from dataclasses import asdict

    from accelerate import Accelerator

    from agilerl_core.arenas import build_arena
    from agilerl_core.config import validate_config

    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--slot", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    args = p.parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    root = Path(args.dir)
    data = json.loads((root / "config.json").read_text())
    if accelerator.device.type == "cuda":
        data["device"] = str(accelerator.device)  # this process's own GPU
    arena = build_arena(validate_config(data))
    member = arena.member_from_state(*_load(root / "in"))
    member.parallel = DataParallel(accelerator)
    result = arena.train(member, args.slot, args.seed, args.steps)
    if accelerator.is_main_process:
        _save(root / "out", *member.state())
        (root / "out" / "result.json").write_text(json.dumps({"result": asdict(result),
                                                              "processes": accelerator.num_processes}))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()

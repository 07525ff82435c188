"""Running a peer script (AgileRL 2.58 in its own venv: this project's runners in benchmarks/peers, else the shared
ones in ../shared/bench) and reading its RESULT line; running one of our measurements in a fresh process."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

PEER_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench"
OWN_PEERS = Path(__file__).resolve().parent / "peers"  # peer runners this project ships (own code, peer's API)


def peer_script(script: str) -> Path:
    """Where peer runner `script` lives: benchmarks/peers, else ../shared/bench; a FileNotFoundError naming both
    when neither has it."""
    for folder in (OWN_PEERS, PEER_DIR):
        if (folder / script).is_file():
            return folder / script
    raise FileNotFoundError(f"peer runner {script} is in neither {OWN_PEERS} nor {PEER_DIR}")


def peer_result(python: str, script: str, *args: str) -> dict:
    """Run `script` (see :func:`peer_script`) with `args` under the peer's `python`, from its folder (a shared
    runner imports its neighbours): its RESULT line's JSON, whole."""
    path = peer_script(script)
    proc = subprocess.run([python, path.name, *args], cwd=path.parent, capture_output=True, text=True, check=False)
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"peer run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(m.group(1))


def run_peer(python: str, script: str, *args: str) -> dict:
    """Run `script` with `args` under the peer's `python`; its RESULT as wall_s, train_env_steps and
    env_steps_per_s (training steps over wall time, evaluation included)."""
    r = peer_result(python, script, *args)
    return {"wall_s": r["wall_s"], "train_env_steps": r["train_env_steps"],
            "env_steps_per_s": r["train_env_steps"] / r["wall_s"]}


def in_fresh_process(module: str, call: str) -> dict:
    """`module.call` (e.g. ``measure(4, '/tmp/x')``) evaluated in a fresh Python process, a benchmark module beside
    this one: its printed JSON. A fresh process has a peak RSS of its own and nothing warmed up by earlier work."""
    import os
    import sys

    here = Path(__file__).resolve().parent
    code = f"import json, sys; sys.path.insert(0, {str(here)!r}); import {module} as m; print(json.dumps(m.{call}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(here.parent)})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])

"""Running a peer script of ../shared/bench (AgileRL 2.58 in its own venv) and reading its RESULT line."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

PEER_DIR = Path(__file__).resolve().parents[2] / "shared" / "bench"


def run_peer(python: str, script: str, *args: str) -> dict:
    """Run `script` with `args` under the peer's `python`; its RESULT as wall_s, train_env_steps and
    env_steps_per_s (training steps over wall time, evaluation included)."""
    proc = subprocess.run([python, script, *args], cwd=PEER_DIR, capture_output=True, text=True, check=False)
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"peer run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    r = json.loads(m.group(1))
    return {"wall_s": r["wall_s"], "train_env_steps": r["train_env_steps"],
            "env_steps_per_s": r["train_env_steps"] / r["wall_s"]}

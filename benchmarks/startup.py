"""Start-up cost of the CLI: how long a config error takes to print, and what a one-generation CartPole run
costs outside training, as the flow on the embedded default (ephemeral Prefect, MLflow in SQLite) and as
--local. Each command runs in a fresh process (what a user waits for); medians over --repeats.

    python benchmarks/startup.py [--repeats 3]

Prints JSON: the time to a config error (a misspelt field) and to an env error (a misspelt env id); per
command the median wall time, the training loop's own wall_s (from the run's summary) and their
difference (start-up + end-of-run work: Prefect, MLflow, the champion's model logging). The first flow run
creates the ephemeral Prefect database (PREFECT_HOME is shared by the repeats, as a user's is); every run
writes a new MLflow SQLite file (a new output_dir). Targets: a config error in under 3 s; the flow's
overhead as small as the embedded services allow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """\
name: startup-bench
env_id: CartPole-v1
num_envs: 8
population_size: 4
evo_steps: 1000
eval_episodes: 5
max_env_steps: 4000
hyperparameters: {batch_size: 64, learning_delay: 500}
"""
_SERVERS = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL")


def _timed(args: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k not in _SERVERS}
    env["PREFECT_HOME"] = str(cwd / "prefect-home")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       check=False, timeout=600)
    return time.perf_counter() - t0, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out: dict = {"benchmark": "startup", "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="agilerl-startup-") as tmp:
        tmp_p = Path(tmp)
        good = tmp_p / "c.yaml"
        good.write_text(CONFIG)
        for name, bad_config in (("config_error_s", CONFIG.replace("batch_size", "batch_sise")),
                                 ("env_error_s", CONFIG.replace("CartPole-v1", "CartPol-v1"))):
            bad = tmp_p / f"{name}.yaml"
            bad.write_text(bad_config)
            errors = []
            for _ in range(args.repeats):
                wall, p = _timed(["run", str(bad)], tmp_p)
                if p.returncode != 2:
                    raise SystemExit(f"expected a config error, got {p.returncode}: {p.stderr[-2000:]}")
                errors.append(wall)
            out[name] = round(statistics.median(errors), 2)
        for name, extra in (("local", ["--local"]), ("flow", [])):
            walls, trains = [], []
            for r in range(args.repeats):
                wall, p = _timed(["run", str(good), "--no-progress", "--set", f"output_dir={tmp_p / f'{name}{r}'}",
                                  *extra], tmp_p)
                if p.returncode != 0:
                    raise SystemExit(f"{name} run failed: {p.stderr[-3000:]}")
                walls.append(wall)
                trains.append(json.loads(p.stdout.strip().splitlines()[-1])["wall_s"])
            out[name] = {"wall_s": round(statistics.median(walls), 2), "training_s": round(statistics.median(trains), 2),
                         "outside_training_s": round(statistics.median(w - t for w, t in zip(walls, trains,
                                                                                                strict=True)), 2)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

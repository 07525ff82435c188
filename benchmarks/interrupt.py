"""Ctrl-C on a flow run while the machine is busy: how soon the resume line comes, how soon the process is gone, and
what else it prints on the way out (issue 69's targets: the line within ~2 s, the process within ~5 s, no Prefect
or MLflow tracebacks or connection errors).

    python benchmarks/interrupt.py [--config deployments/configs/cartpole_dqn.yaml] [--load 2] [--repeats 3]

Each repeat starts ``agilerl-flow run CONFIG`` in a session of its own (tracking on: MLflow in a fresh folder), with
`--load` busy processes spinning beside it, waits for its first generation line and one more second (the second
generation is training), then sends SIGINT to its process group, as a terminal's Ctrl-C does. Prints one JSON
object: per repeat the seconds from the signal to the resume line and to the exit, the exit code, and the lines
after the signal other than the resume line (what a user would call noise); the medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOISE = ("Traceback", "Error logging to API", "Unable to connect", "EventsWorker", "Finished in state",
         "All connection attempts failed", "Exception in thread", "Task run", "Crashed")


def _spin() -> None:
    while True:
        pass


def one(config: Path, overrides: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "flows.cli", "run", str(config), "--no-progress",
                "--set", f"output_dir={tmp}/runs", *[x for o in overrides for x in ("--set", o)]]
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # the run's own local server
        proc = subprocess.Popen(args, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, env=env)
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        before, deadline = [], time.monotonic() + timeout
        while not any("generation 0: best" in line for line in before):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the run ended or stalled before its first generation:\n" + "".join(before[-20:]))
            if sel.select(timeout=1):
                before.append(proc.stderr.readline().decode())
        time.sleep(1.0)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        after, t_line = [], None
        while True:
            line = proc.stderr.readline().decode()
            if not line:
                break
            after.append(line.rstrip("\n"))
            if t_line is None and "continue it with" in line:
                t_line = time.monotonic() - t0
        proc.wait(timeout=timeout)
        t_exit = time.monotonic() - t0
        with_resume = [x for x in after if "continue it with" in x]
        noise = [x for x in after if "continue it with" not in x and x.strip()]
        return {"to_resume_line_s": None if t_line is None else round(t_line, 2), "to_exit_s": round(t_exit, 2),
                "returncode": proc.returncode, "resume_lines": len(with_resume),
                "noisy": [x[:200] for x in noise if any(n in x for n in NOISE)], "other_lines": len(noise)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "deployments" / "configs" / "cartpole_dqn.yaml")
    p.add_argument("--set", action="append", default=["evo_steps=20000", "target_fitness=null"],
                   metavar="FIELD=VALUE", help="overrides (default: long generations, no early stop)")
    p.add_argument("--load", type=int, default=2, help="busy processes beside the run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for s in spinners:
        s.start()
    try:
        runs = [one(args.config, args.set, args.timeout) for _ in range(args.repeats)]
    finally:
        for s in spinners:
            s.terminate()
    lines = [r["to_resume_line_s"] for r in runs if r["to_resume_line_s"] is not None]
    print(json.dumps({"benchmark": "interrupt", "config": str(args.config), "overrides": args.set, "load": args.load,
                      "median_to_resume_line_s": statistics.median(lines) if lines else None,
                      "median_to_exit_s": statistics.median(r["to_exit_s"] for r in runs),
                      "quiet": all(not r["noisy"] for r in runs), "runs": runs}))


if __name__ == "__main__":
    main()

"""One evolving run beside a tuning study: does the population find, in one run, what a Stable-Baselines3 user
finds with an Optuna study of separate runs, on tasks where hyperparameters matter?

Per task (an env, an algorithm, a success threshold) and side, per seed: the cumulative env steps and wall
seconds until the first evaluation at or above the threshold, the best evaluation within the side's budget,
and the hyperparameters the side ended with; then the median and worst over the seeds. Sides (``--sides``):

- ``ours``: the algorithm's generic config (cartpole_dqn, cartpole_ppo, pendulum_sac, pendulum_td3) with only
  env_id and env_wrappers changed, as shipped (learning_parity.py's ``generic``);
- ``static``: the same with evolution off (``selection.method=none``): K independent learners;
- ``random``: random search over the same space and budget: the population's first hyperparameters drawn from
  hp_space (``hp_init.method=sample``) and evolution off (a side equal to ``static`` when ``ours`` already
  samples: then it is reported as the same);
- ``zoo``: one Stable-Baselines3 run with rl-zoo3's tuned hyperparameters (learning_parity.py's ``sb3``):
  the reference, whose tuning cost is counted nowhere;
- ``optuna``: what an SB3 user runs to tune: rl-zoo3's own optimiser, ``python -m rl_zoo3.train --algo A
  --env E -optimize`` (Optuna TPE with its median pruner over the zoo's sampler for the algorithm), with
  ``--trials`` trials of ``--trial-steps`` env steps each (default: the zoo's n_timesteps), sequential unless
  ``--jobs``. Every trial's steps and time count: a study reaches the threshold at every earlier trial's steps
  (a pruned trial's up to its last evaluation) plus those inside the first trial whose evaluation got there;
  its wall seconds are the study's own clock to that trial's start plus the trial's share of its duration up to
  that evaluation (linear within the trial). Its ``best`` is the best evaluation of any trial; its
  hyperparameters are the study's best trial's.

Our sides and ``zoo`` are scored as learning_parity.py scores them: 10 deterministic episodes on seeds no run
trains on (10_000 + 100 * seed + k), after each of our generations (the population's elite) and every
``--eval-every`` SB3 steps. The ``optuna`` side is scored by the zoo's own trial evaluations (``--episodes``
deterministic episodes every trial_steps / ``--n-evaluations`` steps, on the zoo's eval env, whose seeds the zoo
chooses; its trials are unseeded by the zoo's design, the sampler seeded by ``--seed``): the study's numbers
are what its user sees.

Set up the SB3 venv as learning_parity.py's docstring says, plus ``pip install optuna pandas`` there (the zoo
writes its study report through pandas), and pass
``--peer-python``. Example (the cheap tasks, our sides only):

    python benchmarks/hpo_study.py --tasks acrobot-dqn,pendulum-td3 --seeds 0 1 2 3 4 --sides ours,static,random

Progress goes to stderr; one JSON object is printed last on stdout.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _parity() -> Any:
    """learning_parity.py (its cases, its runners of our configs and of SB3, its scoring)."""
    spec = importlib.util.spec_from_file_location("learning_parity", HERE / "learning_parity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("learning_parity", module)
    spec.loader.exec_module(module)
    return sys.modules["learning_parity"]


parity = _parity()


@dataclass(frozen=True)
class Task:
    case: str  # learning_parity.py's case (env, algorithm, wrappers)
    budget: int  # our sides' global env steps
    trial_steps: int  # one Optuna trial's env steps (the zoo's n_timesteps for the env)

    @property
    def threshold(self) -> float:
        return parity.THRESHOLDS[parity.CASES[self.case].env_id]


TASKS: dict[str, Task] = {
    "lunarlander-ppo": Task("lunarlander-ppo", 1_000_000, 1_000_000),
    "lunarlander-dqn": Task("lunarlander-dqn", 1_000_000, 100_000),
    "acrobot-dqn": Task("acrobot-dqn", 100_000, 100_000),
    "mountaincar-dqn": Task("mountaincar-dqn", 300_000, 120_000),
    "pendulum-td3": Task("pendulum-td3", 60_000, 20_000),
    "mountaincar-sac": Task("mountaincar-sac", 100_000, 50_000),
    "doorkey-ppo": Task("doorkey-ppo-flat", 300_000, 100_000),
}
SIDES = ("ours", "static", "random", "zoo", "optuna")
# each of our sides: dotted overrides on the generic config
OUR_SIDES: dict[str, dict[str, Any]] = {"ours": {}, "static": {"selection.method": "none"},
                                        "random": {"selection.method": "none", "hp_init.method": "sample"}}


# ---- pure parts ---------------------------------------------------------------------------------------------
def _comma(text: str, known: tuple[str, ...] | dict, what: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what}(s) {bad}; choose from {', '.join(known)}")
    return names


@dataclass(frozen=True)
class Trial:
    """One finished Optuna trial as the zoo's files record it."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL
    start: float  # seconds since the study's first trial started
    duration: float  # seconds
    evals: tuple[tuple[int, float], ...]  # (env steps, mean return) of its evaluations, in order
    steps: int  # env steps it spent
    params: dict[str, Any]
    value: float | None


def study_figures(trials: list[Trial], threshold: float) -> dict[str, Any]:
    """What a study's trials, in the order they ran, say: the cumulative steps and wall seconds until the first
    evaluation at or above `threshold`, the best evaluation, the best trial's hyperparameters (the one with the
    highest reported value, i.e. ``study.best_params``), and its total steps and seconds."""
    spent = 0
    reached = None
    for t in sorted(trials, key=lambda t: t.number):
        hit = next((steps for steps, mean in t.evals if mean >= threshold), None)
        if hit is not None and reached is None:
            share = hit / t.steps if t.steps else 1.0
            reached = {"steps": spent + hit, "wall_s": round(t.start + share * t.duration, 1), "trial": t.number}
        spent += t.steps
    scored = [m for t in trials for _, m in t.evals]
    valued = [t for t in trials if t.value is not None and t.state == "COMPLETE"]
    best_trial = max(valued, key=lambda t: t.value) if valued else None
    last = max(trials, key=lambda t: t.start + t.duration) if trials else None
    return {"steps_to_threshold": reached and reached["steps"], "wall_to_threshold": reached and reached["wall_s"],
            "trial_reaching": reached and reached["trial"], "best": max(scored) if scored else None,
            "hyperparameters": best_trial.params if best_trial else None,
            "best_trial_value": best_trial.value if best_trial else None,
            "trials": len(trials), "pruned": sum(t.state == "PRUNED" for t in trials),
            "global_steps": spent, "wall_s": round(last.start + last.duration, 1) if last else 0.0}


def read_study(report_csv: Path, log_dir: Path, trial_steps: int) -> list[Trial]:
    """The trials of one rl_zoo3 study: its report CSV (``study.trials_dataframe()``: state, value, start and
    end times, params) and each trial's ``evaluations.npz`` under ``--optimization-log-path``."""
    import numpy as np

    rows = list(csv.DictReader(report_csv.open()))
    if not rows:
        return []
    def when(text: str) -> float:
        return datetime.fromisoformat(text).timestamp() if text else math.nan
    t0 = min(when(r["datetime_start"]) for r in rows)
    trials = []
    for r in rows:
        n = int(r["number"])
        npz = log_dir / f"trial_{n}" / "evaluations.npz"
        evals: tuple[tuple[int, float], ...] = ()
        if npz.exists():
            with np.load(npz) as z:  # numeric arrays only (allow_pickle stays off)
                evals = tuple((int(s), float(np.mean(res))) for s, res in zip(z["timesteps"], z["results"], strict=True))
        state = r["state"]
        steps = trial_steps if state == "COMPLETE" else (evals[-1][0] if evals else 0)
        start, end = when(r["datetime_start"]), when(r["datetime_complete"])
        # the sampler's own parameters and what the zoo derived from them (gamma from one_minus_gamma, ...)
        params = {k.split("_", 1)[1].removeprefix("attrs_"): _number(v) for k, v in r.items()
                  if k.startswith(("params_", "user_attrs_")) and v != ""}
        value = float(r["value"]) if r.get("value") not in (None, "") else None
        trials.append(Trial(n, state, start - t0, (end - start) if not math.isnan(end) else 0.0, evals, steps,
                            params, value))
    return trials


def _number(text: str) -> Any:
    try:
        f = float(text)
    except ValueError:
        return text
    return int(f) if f.is_integer() and "." not in text and "e" not in text.lower() else f


def _inf(x: float | None) -> float:
    return math.inf if x is None else float(x)


def _fin(x: float) -> float | None:
    return None if math.isinf(x) else x


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures over its seeds (a seed that never reached the threshold counts as infinite)."""
    steps = [_inf(r["steps_to_threshold"]) for r in runs]
    walls = [_inf(r["wall_to_threshold"]) for r in runs]
    best = [r["best"] for r in runs if r["best"] is not None]
    return {"reached": f"{sum(not math.isinf(s) for s in steps)}/{len(runs)}",
            "steps_to_threshold": [r["steps_to_threshold"] for r in runs],
            "median_steps_to_threshold": _fin(statistics.median(steps)) if runs else None,
            "worst_steps_to_threshold": _fin(max(steps)) if runs else None,
            "wall_to_threshold": [r["wall_to_threshold"] for r in runs],
            "median_wall_to_threshold": _fin(statistics.median(walls)) if runs else None,
            "worst_wall_to_threshold": _fin(max(walls)) if runs else None,
            "best": [r["best"] for r in runs], "median_best": statistics.median(best) if best else None,
            "worst_best": min(best) if best else None,
            "global_steps": [r.get("global_steps") for r in runs], "wall_s": [r.get("wall_s") for r in runs]}


def targets(sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets for one task, from the sides that ran (a check whose sides did not run is None)."""
    ours = sides.get("ours")
    out: dict[str, Any] = {}
    if ours is None or "reached" not in ours:
        return out
    n = ours["reached"].split("/")[1]
    out["ours_every_seed"] = ours["reached"] == f"{n}/{n}"
    opt = sides.get("optuna")
    if opt and "reached" in opt and opt["median_steps_to_threshold"] is not None:
        o_s, o_w = _inf(ours["median_steps_to_threshold"]), _inf(ours["median_wall_to_threshold"])
        out["steps_ratio_optuna_over_ours"] = opt["median_steps_to_threshold"] / o_s if o_s else None
        out["wall_ratio_optuna_over_ours"] = opt["median_wall_to_threshold"] / o_w if o_w else None
        out["ours_5x_sooner_than_optuna"] = 5 * o_s <= opt["median_steps_to_threshold"] and \
            5 * o_w <= opt["median_wall_to_threshold"]
        out["ours_best_at_least_optuna"] = (ours["median_best"] or -math.inf) >= (opt["median_best"] or -math.inf)
    for other in ("static", "random"):
        side = sides.get(other)
        if side and "reached" in side:
            mine, theirs = _inf(ours["median_steps_to_threshold"]), _inf(side["median_steps_to_threshold"])
            out[f"ours_vs_{other}_median_steps"] = [_fin(mine), _fin(theirs)]
            out[f"ours_sooner_than_{other}"] = mine < theirs or (mine == theirs and
                                                                 (ours["median_best"] or 0) >= (side["median_best"] or 0))
    return out


# ---- running ------------------------------------------------------------------------------------------------
def run_our_side(task: Task, side: str, seed: int, args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    case = parity.CASES[task.case]
    path, extra = parity.our_config(case, "generic")
    extra = {**extra, **args.overrides, **OUR_SIDES[side]}  # a side's own settings win over --set
    budget = args.budget or task.budget
    r = parity.run_ours(path, parity.run_overrides(extra, seed, budget, out_dir), seed, task.threshold, budget,
                        args.episodes)
    return {"seed": seed, "steps_to_threshold": r["steps_to_threshold"], "wall_to_threshold": r["wall_to_threshold"],
            "best": r["best"], "final": r["final"], "hyperparameters": r["hyperparameters"], "evals": r["evals"],
            "global_steps": r["global_steps"], "wall_s": r["wall_s"], "generations": r["generations"]}


def run_zoo(task: Task, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    case = parity.CASES[task.case]
    r = parity.run_sb3(args.peer_python, case, seed, None, args.eval_every, args.episodes)
    wall = None
    if r["steps_to_threshold"] is not None:  # SB3's clock is not sampled per evaluation: linear in steps
        wall = round(r["wall_s"] * r["steps_to_threshold"] / max(r["env_steps"], 1), 1)
    return {"seed": seed, "steps_to_threshold": r["steps_to_threshold"], "wall_to_threshold": wall,
            "best": r["best"], "final": r["final"], "hyperparameters": r["hyperparameters"].get("model_kwargs"),
            "evals": r["evals"], "global_steps": r["env_steps"], "wall_s": r["wall_s"]}


def optuna_command(python: str, task: Task, seed: int, args: argparse.Namespace, work: Path) -> list[str]:
    case = parity.CASES[task.case]
    steps = args.trial_steps or task.trial_steps
    cmd = [python, "-m", "rl_zoo3.train", "--algo", case.algo, "--env", case.env_id, "-optimize",
           "--n-trials", str(args.trials), "--n-timesteps", str(steps),
           "--n-evaluations", str(max(1, steps // args.optuna_eval_every)), "--eval-episodes", str(args.episodes),
           "--sampler", "tpe", "--pruner", "median", "--n-startup-trials", str(args.startup_trials),
           "--n-jobs", str(args.jobs), "--seed", str(seed), "--optimization-log-path", str(work / "trials"),
           "-f", str(work / "logs"), "--device", "cpu", "--no-optim-plots", "--verbose", "0"]
    if case.module:
        cmd += ["--gym-packages", case.module]
    return cmd


def run_optuna(task: Task, seed: int, args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"optuna-{task.case}-{seed}-", dir=out_dir))
    cmd = optuna_command(args.peer_python, task, seed, args, work)
    t0 = time.perf_counter()
    # one thread, as our runs train (torch_threads: 1) and as learning_parity's SB3 runs do
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    reports = sorted((work / "logs").rglob("report_*.csv"))
    if proc.returncode != 0 or not reports:
        raise RuntimeError(f"rl_zoo3 -optimize failed ({proc.returncode}): {proc.stdout[-2000:]}")
    trials = read_study(reports[-1], work / "trials", args.trial_steps or task.trial_steps)
    fig = study_figures(trials, task.threshold)
    return {"seed": seed, **fig, "study_process_wall_s": round(wall, 1), "command": " ".join(cmd[1:]),
            "trial_log": [{"number": t.number, "state": t.state, "steps": t.steps, "start_s": round(t.start, 1),
                           "duration_s": round(t.duration, 1), "best_eval": max((m for _, m in t.evals), default=None)}
                          for t in trials]}


def run_task(name: str, args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    task = TASKS[name]
    case = parity.CASES[task.case]
    report: dict[str, Any] = {"env_id": case.env_id, "algo": case.algo, "threshold": task.threshold,
                              "budget": args.budget or task.budget,
                              "trial_steps": args.trial_steps or task.trial_steps, "sides": {}}
    for side in args.sides:
        if side in ("zoo", "optuna") and args.peer_python is None:
            report["sides"][side] = {"skipped": "no --peer-python (the SB3 venv)"}
            continue
        if side == "random" and args.overrides.get("hp_init.method") == "sample" and "static" in args.sides:
            report["sides"][side] = {"same_as": "static", "why": "ours already draws its first hyperparameters"}
            continue
        runs = []
        try:
            for seed in args.seeds:
                parity.log(f"{name} {side} seed {seed}")
                if side in OUR_SIDES:
                    runs.append(run_our_side(task, side, seed, args, out_dir))
                elif side == "zoo":
                    runs.append(run_zoo(task, seed, args))
                else:
                    runs.append(run_optuna(task, seed, args, out_dir))
                parity.log(f"  -> {json.dumps({k: v for k, v in runs[-1].items() if k not in ('evals', 'trial_log')})}")
        except Exception as err:  # an env this venv lacks, a study that failed: the other sides still run
            report["sides"][side] = {"error": f"{type(err).__name__}: {err}"}
            parity.log(f"{name} {side}: {type(err).__name__}: {err}")
            continue
        report["sides"][side] = {**summarize(runs), "runs": runs}
    report["targets"] = targets(report["sides"])
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=lambda t: _comma(t, TASKS, "task"), default=list(TASKS),
                   help=f"comma list of {', '.join(TASKS)}")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--sides", type=lambda t: _comma(t, SIDES, "side"), default=list(SIDES),
                   help=f"comma list of {', '.join(SIDES)}")
    p.add_argument("--peer-python", default=None, help="the SB3 venv's python (zoo and optuna sides)")
    p.add_argument("--budget", type=int, default=None, help="our sides' global env steps (default: the task's)")
    p.add_argument("--trials", type=int, default=10, help="optuna: trials per study")
    p.add_argument("--startup-trials", type=int, default=5, help="optuna: random trials before TPE")
    p.add_argument("--trial-steps", type=int, default=None, help="optuna: env steps per trial (default: the zoo's)")
    p.add_argument("--optuna-eval-every", type=int, default=5000, help="optuna: env steps between a trial's evals")
    p.add_argument("--jobs", type=int, default=1, help="optuna: parallel trials")
    p.add_argument("--eval-every", type=int, default=2000, help="zoo: env steps between evaluations")
    p.add_argument("--episodes", type=int, default=10, help="episodes per evaluation")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="dotted overrides on our sides")
    args = p.parse_args()
    from agilerl_core.config import parse_overrides

    args.overrides = parse_overrides(args.set)
    if args.peer_python is not None:
        args.peer_python = str(Path(args.peer_python).expanduser())
    with tempfile.TemporaryDirectory(prefix="agilerl-hpo-study-") as tmp:
        results = {name: run_task(name, args, tmp) for name in args.tasks}
    print(json.dumps({"benchmark": "hpo_study", "seeds": args.seeds, "sides": args.sides, "overrides": args.overrides,
                      "trials": args.trials, "startup_trials": args.startup_trials, "results": results}))


if __name__ == "__main__":
    main()

"""Learning parity: our populations beside Stable-Baselines3 with rl-zoo3's tuned hyperparameters, per env and
algorithm, on the same evaluation protocol.

Set up the peer venv once (SB3 and rl-zoo3 never go into our own environment):

    python3 -m venv ~/sb3-venv
    ~/sb3-venv/bin/pip install torch==2.13.0
    ~/sb3-venv/bin/pip install stable-baselines3==2.9.2 rl-zoo3==2.9.2 "gymnasium[classic-control,box2d]" minigrid

then run, for example:

    python benchmarks/learning_parity.py --cases cartpole-dqn,cartpole-ppo --seeds 0 1 2 3 4 \
        --peer-python ~/sb3-venv/bin/python

Sides (``--sides``, default all three): ``sb3`` (benchmarks/peer_sb3.py under ``--peer-python``: the zoo's block
for the env, its n_timesteps as the budget), ``ours`` (the shipped config for the env, where
deployments/configs has one) and ``generic`` (one config per algorithm, cartpole_dqn / cartpole_ppo /
pendulum_sac / pendulum_td3, with only env_id and env_wrappers replaced). Our budget is the same number of
*global* env steps (every member's steps count); ``--budget`` overrides both. Our runs never set a target
fitness: they spend the whole budget, so whether a run keeps the threshold once reached can be seen.

Evaluation, both sides: 10 deterministic episodes, one per sub-env of a separate vector env reset with seeds
10_000 + 100 * seed + k (never used in training or selection), with the same wrappers as training. SB3: every
``--eval-every`` env steps and at the end. Ours: after each generation, the population's elite (so every
evo_steps x population_size global steps: ``eval_every`` in the JSON), and at the end the run's champion
(``best_uri``, loaded from its checkpoint) is scored the same way: our ``final``. Per side and case: steps to the
threshold per seed, their median and worst (a seed that never reached it counts as infinite; None in JSON),
final and best scores, the share of evaluations after the first success that stay at or above the threshold,
wall seconds. ``parity`` per case and our side: ours reaches the threshold at every seed where SB3 does, our
median steps are at most twice SB3's, and our final score is at least SB3's at every seed and in the median.

Caveats: ``--budget`` also shortens SB3's schedules, which are fractions of the run (exploration_fraction,
``lin_*`` rates), as the zoo's ``-n`` does. SB3's final score is its last evaluation; ours is the champion the run
hands over (the final elite or the best generation's elite, whichever scored higher on the run's own fresh seeds);
``final_elite_eval`` is our last per-generation evaluation. ``--set KEY=VALUE ...`` applies dotted overrides to our
sides' configs (a variant: ``selection.method=multi_frequency "selection.periods=[1,4]"``). The MiniGrid cases
need minigrid in our env (the ``minigrid`` extra, part of ``test``).

Progress goes to stderr; one JSON object is printed last on stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "deployments" / "configs"


def _peer_module() -> Any:
    """benchmarks/peer_sb3.py's pure part (translation, scoring, eval seeds): it imports SB3 only in its run."""
    spec = importlib.util.spec_from_file_location("peer_sb3", HERE / "peer_sb3.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("peer_sb3", module)
    spec.loader.exec_module(module)
    return sys.modules["peer_sb3"]


peer = _peer_module()

# The zoo's success thresholds (gymnasium's reward_threshold where the env has one).
THRESHOLDS: dict[str, float] = {"CartPole-v1": 475, "Acrobot-v1": -100, "LunarLander-v3": 200, "Pendulum-v1": -200,
                                "MountainCarContinuous-v0": 90, "MiniGrid-DoorKey-5x5-v0": 0.9, "MountainCar-v0": -110}
# the one config per algorithm that "generic" runs on every env
GENERIC: dict[str, str] = {"dqn": "cartpole_dqn.yaml", "ppo": "cartpole_ppo.yaml", "sac": "pendulum_sac.yaml",
                           "td3": "pendulum_td3.yaml"}
SIDES = ("sb3", "ours", "generic")


@dataclass(frozen=True)
class Case:
    env_id: str  # as Gymnasium, SB3 and the zoo name it
    algo: str
    shipped: str | None  # our config for this env in deployments/configs (None: there is none)
    wrappers: tuple[dict[str, Any], ...] = ()  # our env_wrappers (the zoo's own env_wrapper stays on the SB3 side)
    module: str | None = None  # a module that registers the env (our env_id becomes module:EnvId)

    @property
    def our_env_id(self) -> str:
        return f"{self.module}:{self.env_id}" if self.module else self.env_id


_DOORKEY = "MiniGrid-DoorKey-5x5-v0"
CASES: dict[str, Case] = {
    "cartpole-dqn": Case("CartPole-v1", "dqn", "cartpole_dqn.yaml"),
    "cartpole-ppo": Case("CartPole-v1", "ppo", "cartpole_ppo.yaml"),
    "acrobot-dqn": Case("Acrobot-v1", "dqn", None),
    "acrobot-ppo": Case("Acrobot-v1", "ppo", None),
    "mountaincar-dqn": Case("MountainCar-v0", "dqn", None),
    "lunarlander-dqn": Case("LunarLander-v3", "dqn", "lunarlander_dqn.yaml"),
    "lunarlander-ppo": Case("LunarLander-v3", "ppo", "lunarlander_ppo.yaml"),
    "pendulum-sac": Case("Pendulum-v1", "sac", "pendulum_sac.yaml"),
    "pendulum-td3": Case("Pendulum-v1", "td3", "pendulum_td3.yaml"),
    "mountaincar-sac": Case("MountainCarContinuous-v0", "sac", None),
    "pendulum-ppo": Case("Pendulum-v1", "ppo", None),  # the zoo's PPO explores with gSDE here
    "doorkey-ppo-flat": Case(_DOORKEY, "ppo", None, ({"wrapper": "minigrid.wrappers.FlatObsWrapper"},), "minigrid"),
    "doorkey-ppo-image": Case(_DOORKEY, "ppo", None, ({"wrapper": "minigrid.wrappers.ImgObsWrapper"},), "minigrid"),
}


# ---- pure parts ---------------------------------------------------------------------------------------------
def our_config(case: Case, side: str) -> tuple[Path, dict[str, Any]] | None:
    """(config file, overrides beyond seed/budget/output) of our `side` ("ours": the shipped config, "generic":
    the algorithm's generic one with env_id and env_wrappers replaced); None where ours has no shipped config."""
    if side == "ours":
        if case.shipped is None:
            return None
        over: dict[str, Any] = {"env_wrappers": [dict(w) for w in case.wrappers]} if case.wrappers else {}
        return CONFIGS / case.shipped, over
    return CONFIGS / GENERIC[case.algo], {"env_id": case.our_env_id, "env_wrappers": [dict(w) for w in case.wrappers]}


def run_overrides(extra: dict[str, Any], seed: int, budget: int, out_dir: str) -> dict[str, Any]:
    """Every override of one of our runs: no target fitness (the run spends its whole budget)."""
    return {**extra, "seed": seed, "max_env_steps": budget, "target_fitness": None, "output_dir": out_dir}


def _inf(steps: int | None) -> float:
    return math.inf if steps is None else float(steps)


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures over its seeds; a seed that never reached the threshold counts as infinite steps."""
    steps = [_inf(r["steps_to_threshold"]) for r in runs]
    return {"steps_to_threshold": [r["steps_to_threshold"] for r in runs],
            "reached": f"{sum(not math.isinf(s) for s in steps)}/{len(runs)}",
            "median_steps_to_threshold": _finite(statistics.median(steps)) if runs else None,
            "worst_steps_to_threshold": _finite(max(steps)) if runs else None,
            "final": [r["final"] for r in runs], "median_final": _median([r["final"] for r in runs]),
            "best": [r["best"] for r in runs], "median_best": _median([r["best"] for r in runs]),
            "kept_fraction": [r["kept_fraction"] for r in runs],
            "median_kept_fraction": _median([r["kept_fraction"] for r in runs]),
            "wall_s": [r["wall_s"] for r in runs], "median_wall_s": _median([r["wall_s"] for r in runs])}


def verdict(ours: list[dict[str, Any]], sb3: list[dict[str, Any]]) -> dict[str, Any]:
    """Parity of one of our sides with SB3, seed by seed (runs paired by seed)."""
    theirs = {r["seed"]: r for r in sb3}
    pairs = [(o, theirs[o["seed"]]) for o in ours if o["seed"] in theirs]
    if not pairs:
        return {"parity": None, "why": "no seed ran on both sides"}
    missed = [o["seed"] for o, t in pairs if t["steps_to_threshold"] is not None and o["steps_to_threshold"] is None]
    ours_median = statistics.median(_inf(o["steps_to_threshold"]) for o, _ in pairs)
    sb3_median = statistics.median(_inf(t["steps_to_threshold"]) for _, t in pairs)
    steps_ok = ours_median <= 2 * sb3_median  # inf <= inf: neither side reached it in half the seeds
    below = [o["seed"] for o, t in pairs if not _at_least(o["final"], t["final"])]
    median_ok = _at_least(_median([o["final"] for o, _ in pairs]), _median([t["final"] for _, t in pairs]))
    checks = {"reaches_where_sb3_does": not missed, "median_steps_within_2x": steps_ok,
              "final_at_least_sb3_every_seed": not below, "median_final_at_least_sb3": median_ok}
    return {"parity": all(checks.values()), **checks, "seeds_missed": missed, "seeds_final_below_sb3": below,
            "median_steps": [_finite(ours_median), _finite(sb3_median)],  # ours, SB3 (None: never, in half)
            "sb3_reached": f"{sum(t['steps_to_threshold'] is not None for _, t in pairs)}/{len(pairs)}",
            "seeds": [o["seed"] for o, _ in pairs]}


def _at_least(a: float | None, b: float | None) -> bool:
    return b is None or (a is not None and a >= b)


def parse_sides(text: str) -> list[str]:
    """``--sides``: a comma list of sb3, ours (alias shipped), generic."""
    sides = [{"shipped": "ours"}.get(s.strip(), s.strip()) for s in text.split(",") if s.strip()]
    bad = [s for s in sides if s not in SIDES]
    if bad or not sides:
        raise argparse.ArgumentTypeError(f"unknown side(s) {bad}; choose from {', '.join(SIDES)} (shipped = ours)")
    return sides


def parse_cases(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in CASES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown case(s) {bad}; choose from {', '.join(CASES)}")
    return names


# ---- running ------------------------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peer_call(python: str, args: list[str]) -> dict[str, Any]:
    """Run peer_sb3.py under the peer venv's python; its RESULT (stderr passes through as progress)."""
    proc = subprocess.run([python, str(HERE / "peer_sb3.py"), *args], stdout=subprocess.PIPE, text=True, check=False)
    m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"peer_sb3.py {' '.join(args)} failed ({proc.returncode}): {proc.stdout[-2000:]}")
    return json.loads(m.group(1))


def run_sb3(python: str, case: Case, seed: int, budget: int | None, eval_every: int, episodes: int) -> dict[str, Any]:
    args = ["--algo", case.algo, "--env", case.env_id, "--seed", str(seed), "--threshold",
            str(THRESHOLDS[case.env_id]), "--eval-every", str(eval_every), "--eval-episodes", str(episodes)]
    return peer_call(python, [*args, "--budget", str(budget)] if budget is not None else args)


def run_ours(path: Path, overrides: dict[str, Any], seed: int, threshold: float, budget: int,
             episodes: int) -> dict[str, Any]:
    """One of our runs, its elite evaluated after every generation and its champion at the end (see the module
    docstring)."""
    from agilerl_core.algorithms.saved import load_member
    from agilerl_core.api.callbacks import CallbackHooks
    from agilerl_core.arenas.base import checked_space, evaluate_member
    from agilerl_core.envs.make import EnvRecipe
    from agilerl_core.experiment import train_local
    from agilerl_core.hpo.tournament import elite_index
    from tasks.config import load_config

    cfg = load_config(path, overrides)
    env = EnvRecipe.of(cfg).vector(episodes, evaluation=True)  # the training wrappers, with their eval_kwargs
    evals: list[tuple[int, float]] = []
    walls: list[float] = []  # the run's own seconds at each evaluation (this benchmark's scoring left out)
    t_eval = 0.0

    def score(agent: Any) -> float:
        nonlocal t_eval
        t = time.perf_counter()
        mean = evaluate_member(agent, env, seed=peer.eval_seed(seed))
        t_eval += time.perf_counter() - t
        return round(mean, 4)

    def on_generation(stats: Any, population: list[Any]) -> None:
        elite = population[elite_index([math.nan if p.fitness is None else p.fitness for p in population])]
        walls.append(round(time.perf_counter() - t0 - t_eval, 1))
        evals.append((stats.global_steps, score(elite.agent)))
        log(f"  generation {stats.generation}: {stats.global_steps:,} steps, population best {stats.best_fitness:.2f}, "
            f"elite on eval seeds {evals[-1][1]:.2f}")

    t0 = time.perf_counter()
    res = train_local(cfg, progress=False, hooks=CallbackHooks(on_generation, {}))
    wall = time.perf_counter() - t0
    champion, _ = load_member(res.best_uri)
    kept, live = score(champion.agent), score(res.best_member.agent)
    env.close()
    s = peer.score_evals(evals, threshold, budget)
    reached = next((w for (_, mean), w in zip(evals, walls, strict=True) if mean >= threshold), None)
    space = checked_space(cfg, type(champion.agent))  # the names the run could move
    found = {k: v for k, v in champion.agent.hp.model_dump().items() if k in space}
    return {"seed": seed, "steps_to_threshold": s["steps_to_threshold"], "final": kept, "best": s["best"],
            "wall_to_threshold": reached if s["steps_to_threshold"] is not None else None,
            "hyperparameters": found, "eval_walls": walls,
            "kept_fraction": s["kept_fraction"], "final_elite_eval": s["final"],
            "champion_live_final": live, "champion": res.champion, "evals": evals,
            "population_best": [round(h.best_fitness, 4) for h in res.history],
            "global_steps": res.global_steps, "generations": res.generations,
            "eval_every": cfg.evo_steps * cfg.population_size, "wall_s": round(wall, 1),
            "eval_wall_s": round(t_eval, 1)}


def zoo_budget(python: str | None, case: Case) -> int | None:
    """The zoo's n_timesteps for the case (asked of the peer venv, which has rl_zoo3); None without one."""
    if python is None:
        return None
    return int(peer_call(python, ["--algo", case.algo, "--env", case.env_id, "--describe"])["n_timesteps"])


def run_case(name: str, args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    case = CASES[name]
    threshold = THRESHOLDS[case.env_id]
    zoo = zoo_budget(args.peer_python, case)
    budget = args.budget or zoo
    if budget is None:
        raise SystemExit("give --budget or --peer-python (the default budget is the zoo's n_timesteps)")
    report: dict[str, Any] = {"env_id": case.env_id, "algo": case.algo, "threshold": threshold, "budget": budget,
                              "zoo_n_timesteps": zoo, "sides": {}}
    runs: dict[str, list[dict[str, Any]]] = {}
    for side in args.sides:
        if side == "sb3":
            if args.peer_python is None:
                report["sides"]["sb3"] = {"skipped": "no --peer-python"}
                continue
            runs["sb3"] = []
            try:
                for seed in args.seeds:
                    log(f"{name} sb3 seed {seed}")
                    runs["sb3"].append(run_sb3(args.peer_python, case, seed, args.budget, args.eval_every,
                                               args.episodes))
            except RuntimeError as err:
                runs.pop("sb3")
                report["sides"]["sb3"] = {"error": str(err)}
                log(f"{name} sb3: {err}")
                continue
            report["sides"]["sb3"] = {**summarize(runs["sb3"]), "eval_every": args.eval_every,
                                      "hyperparameters": runs["sb3"][0]["hyperparameters"],
                                      "runs": [{k: v for k, v in r.items() if k != "hyperparameters"}
                                               for r in runs["sb3"]]}
            continue
        made = our_config(case, side)
        if made is None:
            report["sides"][side] = {"skipped": f"no shipped config for {case.env_id} in deployments/configs"}
            continue
        path, extra = made
        extra = {**extra, **args.overrides}
        if side == "generic" and "ours" in runs and case.shipped == GENERIC[case.algo]:  # the same config: same runs
            runs[side] = runs["ours"]
            report["sides"][side] = {"same_as": "ours", "config": str(path.relative_to(HERE.parent))}
            continue
        runs[side] = []
        try:
            for seed in args.seeds:
                log(f"{name} {side} seed {seed} ({path.name}{' + ' + json.dumps(extra) if extra else ''})")
                runs[side].append(run_ours(path, run_overrides(extra, seed, budget, out_dir), seed, threshold, budget,
                                           args.episodes))
                log(f"  -> {json.dumps({k: v for k, v in runs[side][-1].items() if k not in ('evals', 'champion')})}")
        except Exception as err:  # e.g. an env whose package this env lacks: the other sides still run
            runs.pop(side)
            report["sides"][side] = {"error": f"{type(err).__name__}: {err}"}
            log(f"{name} {side}: {type(err).__name__}: {err}")
            continue
        report["sides"][side] = {**summarize(runs[side]), "config": str(path.relative_to(HERE.parent)),
                                 "overrides": extra, "eval_every": runs[side][0]["eval_every"], "runs": runs[side]}
    if "sb3" in runs:
        report["parity"] = {side: verdict(runs[side], runs["sb3"]) for side in ("ours", "generic") if side in runs}
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=parse_cases, default=list(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--peer-python", default=None, help="the SB3 venv's python, e.g. ~/sb3-venv/bin/python")
    p.add_argument("--sides", type=parse_sides, default=list(SIDES), help="comma list of sb3, ours, generic")
    p.add_argument("--budget", type=int, default=None,
                   help="env steps per run, both sides (ours: global steps; default: the zoo's n_timesteps)")
    p.add_argument("--eval-every", type=int, default=2000, help="SB3's evaluation rhythm in env steps")
    p.add_argument("--episodes", type=int, default=10, help="episodes per evaluation")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="dotted overrides on our sides' configs (a variant, e.g. selection.method=multi_frequency)")
    args = p.parse_args()
    from agilerl_core.config import parse_overrides

    args.overrides = parse_overrides(args.set)
    if args.peer_python is not None:
        args.peer_python = str(Path(args.peer_python).expanduser())
    results = {}
    with tempfile.TemporaryDirectory(prefix="agilerl-parity-") as tmp:
        for name in args.cases:
            results[name] = run_case(name, args, tmp)
    print(json.dumps({"benchmark": "learning_parity", "seeds": args.seeds, "sides": args.sides,
                      "eval_episodes": args.episodes, "eval_seeds": "10000 + 100 * seed + k, k < episodes",
                      "budget_override": args.budget, "overrides": args.overrides, "results": results}))


if __name__ == "__main__":
    main()

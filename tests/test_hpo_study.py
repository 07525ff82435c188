"""benchmarks/hpo_study.py's pure parts: reading an rl-zoo3 study from the files it writes (report CSV, each
trial's evaluations.npz), the study's cumulative steps and seconds to the threshold, the sides' summaries and the
issue's targets, the command an SB3 user runs, and our sides' overrides. No SB3 or Optuna needed; one of our
sides runs for real at a tiny budget."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("benchmarks_hpo_study", ROOT / "benchmarks" / "hpo_study.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks_hpo_study"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


hs = _load()
REPORT = """\
,number,value,datetime_start,datetime_complete,duration,params_learning_rate,params_net_arch,user_attrs_gamma,state
0,0,-300.0,2026-12-02 00:00:00.000000,2026-12-02 00:01:40.000000,0 days 00:01:40,0.001,small,0.99,COMPLETE
1,1,,2026-12-02 00:01:40.000000,2026-12-02 00:02:00.000000,0 days 00:00:20,0.1,tiny,0.9,PRUNED
2,2,-90.0,2026-12-02 00:02:00.000000,2026-12-02 00:03:40.000000,0 days 00:01:40,0.0005,medium,0.995,COMPLETE
"""


def _study(tmp_path: Path) -> list:
    (tmp_path / "report.csv").write_text(REPORT)
    evals = {0: ([5000, 10000], [[-500, -400], [-300, -300]]), 1: ([5000], [[-500, -500]]),
             2: ([5000, 10000], [[-150, -130], [-95, -85]])}
    for n, (steps, results) in evals.items():
        (tmp_path / "trials" / f"trial_{n}").mkdir(parents=True)
        np.savez(tmp_path / "trials" / f"trial_{n}" / "evaluations.npz", timesteps=np.array(steps),
                 results=np.array(results, dtype=float), ep_lengths=np.ones((len(steps), 2)))
    return hs.read_study(tmp_path / "report.csv", tmp_path / "trials", 10_000)


def test_a_study_counts_every_earlier_trial_s_steps_and_time(tmp_path):
    trials = _study(tmp_path)
    assert [(t.number, t.state, t.steps) for t in trials] == [(0, "COMPLETE", 10_000), (1, "PRUNED", 5000),
                                                               (2, "COMPLETE", 10_000)]
    assert trials[0].params == {"learning_rate": 0.001, "net_arch": "small", "gamma": 0.99}
    assert trials[2].evals == ((5000, -140.0), (10000, -90.0)) and trials[2].start == 120.0
    fig = hs.study_figures(trials, -100)
    # trial 0 (10k) + pruned trial 1 (5k) + trial 2's 10k; 120 s to its start + all of its 100 s
    assert fig["steps_to_threshold"] == 25_000 and fig["wall_to_threshold"] == 220.0 and fig["trial_reaching"] == 2
    assert fig["best"] == -90.0 and fig["hyperparameters"]["net_arch"] == "medium" and fig["pruned"] == 1
    assert fig["global_steps"] == 25_000 and fig["wall_s"] == 220.0
    never = hs.study_figures(trials, 0)
    assert never["steps_to_threshold"] is None and never["wall_to_threshold"] is None
    first = hs.study_figures(trials, -350)  # at the first trial's last evaluation: all of its duration
    assert first["steps_to_threshold"] == 10_000 and first["wall_to_threshold"] == 100.0


def test_summaries_and_targets():
    def run(seed, steps, wall, best):
        return {"seed": seed, "steps_to_threshold": steps, "wall_to_threshold": wall, "best": best}

    ours = hs.summarize([run(0, 8000, 10.0, 250), run(1, 16000, 20.0, 240), run(2, 12000, 15.0, 260)])
    assert ours["reached"] == "3/3" and ours["median_steps_to_threshold"] == 12000 and ours["worst_best"] == 240
    static = hs.summarize([run(0, None, None, 150), run(1, 40000, 50.0, 210), run(2, None, None, 120)])
    assert static["median_steps_to_threshold"] is None and static["worst_steps_to_threshold"] is None
    optuna = hs.summarize([run(0, 100000, 200.0, 240), run(1, 50000, 90.0, 255), run(2, 70000, 80.0, 230)])
    t = hs.targets({"ours": ours, "static": static, "optuna": optuna})
    assert t["ours_every_seed"] and t["ours_sooner_than_static"] and t["ours_best_at_least_optuna"]
    assert t["steps_ratio_optuna_over_ours"] == pytest.approx(70000 / 12000)
    assert t["ours_5x_sooner_than_optuna"] is True and t["wall_ratio_optuna_over_ours"] == pytest.approx(90 / 15)
    assert hs.targets({"ours": static})["ours_every_seed"] is False


def test_the_optuna_command_is_the_zoo_s_own_optimiser(tmp_path):
    args = argparse.Namespace(trial_steps=None, trials=10, optuna_eval_every=5000, episodes=10, startup_trials=5,
                              jobs=1)
    cmd = hs.optuna_command("py", hs.TASKS["acrobot-dqn"], 3, args, tmp_path)
    assert cmd[:8] == ["py", "-m", "rl_zoo3.train", "--algo", "dqn", "--env", "Acrobot-v1", "-optimize"]
    joined = " ".join(cmd)
    for part in ("--n-trials 10", "--n-timesteps 100000", "--n-evaluations 20", "--sampler tpe", "--pruner median",
                 "--seed 3", "--n-startup-trials 5"):
        assert part in joined, part
    door = hs.optuna_command("py", hs.TASKS["doorkey-ppo"], 0, args, tmp_path)
    assert "--gym-packages minigrid" in " ".join(door)
    for name, task in hs.TASKS.items():
        assert task.case in hs.parity.CASES, name
        assert task.threshold == hs.parity.THRESHOLDS[hs.parity.CASES[task.case].env_id]


def test_our_sides_differ_only_by_evolution_and_the_first_draw(tmp_path):
    """static is evolution off, random also draws the first hyperparameters: one real run each, tiny budget."""
    args = argparse.Namespace(budget=1600, episodes=2, overrides={"population_size": 2, "evo_steps": 400,
                                                                  "num_envs": 2})
    task = hs.Task("acrobot-dqn", 1600, 1600)
    runs = {side: hs.run_our_side(task, side, 0, args, str(tmp_path)) for side in ("ours", "static", "random")}
    for side, r in runs.items():
        assert r["global_steps"] == 1600 and len(r["evals"]) == r["generations"] == 2, side
        assert set(r["hyperparameters"]) == {"lr", "batch_size", "learn_step"}, side
    assert runs["static"]["hyperparameters"] == {"lr": 1e-3, "batch_size": 128, "learn_step": 1}

"""benchmarks/learning_parity.py and benchmarks/peer_sb3.py: the pure parts (rl-zoo3's hyperparameters as SB3
arguments, scoring evaluations, summaries, the parity verdict, our configs per case). No SB3 needed."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import yaml

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


_load = load_benchmark


peer = _load("peer_sb3")
lp = _load("learning_parity")

ZOO = """
CartPole-v1:
  n_envs: 8
  n_timesteps: !!float 1e5
  policy: 'MlpPolicy'
  n_steps: 32
  learning_rate: lin_0.001
  clip_range: lin_0.2
  gamma: 0.98
MiniGrid-DoorKey-5x5-v0:
  env_wrapper: minigrid.wrappers.FlatObsWrapper
  normalize: true
  n_envs: 8
  n_timesteps: !!float 1e5
  policy: 'MlpPolicy'
  gamma: 0.99
  learning_rate: 2.5e-4
Acrobot-v1:
  normalize: "dict(norm_obs=True, norm_reward=False)"
  n_timesteps: 1000
  policy: 'MlpPolicy'
  train_freq: [1, "episode"]
  frame_stack: 4
  policy_kwargs: "dict(net_arch=[400, 300], activation_fn=nn.ReLU)"
  noise_type: 'ornstein-uhlenbeck '
  noise_std: 0.5
  clip_range: -1
  env_kwargs: {max_episode_steps: 100}
default:
  n_timesteps: 500
  policy: 'MlpPolicy'
"""


def _block(env_id: str) -> dict:
    return peer.zoo_block(yaml.safe_load(ZOO), env_id)


def test_zoo_block_is_the_envs_own_else_the_default_and_a_copy():
    doc = yaml.safe_load(ZOO)
    block = peer.zoo_block(doc, "CartPole-v1")
    block["n_steps"] = 1
    assert doc["CartPole-v1"]["n_steps"] == 32
    assert peer.zoo_block(doc, "Pendulum-v1") == {"n_timesteps": 500, "policy": "MlpPolicy"}
    with pytest.raises(KeyError, match="Pendulum-v1"):
        peer.zoo_block({"CartPole-v1": {}}, "Pendulum-v1")


def test_translate_schedules_envs_and_the_budget():
    tr = peer.translate(_block("CartPole-v1"))
    assert tr["n_timesteps"] == 100_000 and isinstance(tr["n_timesteps"], int) and tr["n_envs"] == 8
    assert tr["linear_schedules"] == {"learning_rate": 0.001, "clip_range": 0.2}
    assert tr["model_kwargs"] == {"policy": "MlpPolicy", "n_steps": 32, "gamma": 0.98}
    assert tr["normalize"] is None and tr["frame_stack"] is None and tr["env_wrapper"] is None
    assert peer.translate(_block("CartPole-v1"), budget=20_000)["n_timesteps"] == 20_000


def test_translate_normalize_takes_the_algorithms_gamma_and_keeps_the_wrapper():
    tr = peer.translate(_block("MiniGrid-DoorKey-5x5-v0"))
    assert tr["normalize"] == {"gamma": 0.99}
    assert tr["env_wrapper"] == "minigrid.wrappers.FlatObsWrapper"
    assert tr["model_kwargs"]["learning_rate"] == 2.5e-4 and tr["linear_schedules"] == {}
    assert "env_wrapper" not in tr["model_kwargs"] and "normalize" not in tr["model_kwargs"]


def test_translate_the_rest_of_the_zoos_keys():
    tr = peer.translate(_block("Acrobot-v1"))
    assert tr["normalize"] == {"norm_obs": True, "norm_reward": False}  # no gamma in the block: none added
    assert tr["model_kwargs"]["train_freq"] == (1, "episode")
    assert tr["model_kwargs"]["clip_range"] == -1  # negative: left as it is, as the zoo does
    assert tr["frame_stack"] == 4 and tr["env_kwargs"] == {"max_episode_steps": 100}
    assert tr["evaluated"] == {"policy_kwargs": "dict(net_arch=[400, 300], activation_fn=nn.ReLU)"}
    assert tr["action_noise"] == {"type": "ornstein-uhlenbeck", "std": 0.5}
    assert set(tr["model_kwargs"]) == {"policy", "train_freq", "clip_range"}
    assert peer.describe(tr)["model_kwargs"]["train_freq"] == [1, "episode"]  # JSON-able


def test_score_evals():
    evals = [(1000, 10.0), (2000, 480.0), (3000, 470.0), (4000, 490.0), (5000, 500.0)]
    assert peer.score_evals(evals, 475, 5000) == {"steps_to_threshold": 2000, "final": 500.0, "best": 500.0,
                                                   "kept_fraction": round(2 / 3, 3)}
    assert peer.score_evals(evals, 600, 5000)["steps_to_threshold"] is None
    assert peer.score_evals(evals, 600, 5000)["kept_fraction"] is None
    # reached only past the budget (a last generation or rollout that overran it): not counted
    assert peer.score_evals([(1000, 0.0), (5100, 500.0)], 475, 5000)["steps_to_threshold"] is None
    # reached at the last evaluation: nothing after it to keep
    assert peer.score_evals([(1000, 0.0), (2000, 500.0)], 475, 5000)["kept_fraction"] is None
    assert peer.score_evals([], 475, 5000) == {"steps_to_threshold": None, "final": None, "best": None,
                                               "kept_fraction": None}
    assert peer.score_evals([(10, -150.0), (20, -300.0)], -200, 100)["steps_to_threshold"] == 10  # negative returns


def _run(seed, steps, final, kept=None, best=None, wall=1.0):
    return {"seed": seed, "steps_to_threshold": steps, "final": final, "best": best if best is not None else final,
            "kept_fraction": kept, "wall_s": wall}


def test_summarize_counts_never_as_infinite():
    s = lp.summarize([_run(0, 1000, 500), _run(1, None, 100), _run(2, 3000, 480)])
    assert s["steps_to_threshold"] == [1000, None, 3000] and s["reached"] == "2/3"
    assert s["median_steps_to_threshold"] == 3000 and s["worst_steps_to_threshold"] is None
    assert s["median_final"] == 480
    s = lp.summarize([_run(0, None, 1), _run(1, None, 2), _run(2, 3000, 3, kept=0.5)])
    assert s["median_steps_to_threshold"] is None and s["median_kept_fraction"] == 0.5


def test_verdict():
    sb3 = [_run(0, 2000, 500), _run(1, None, 200), _run(2, 4000, 490)]
    ok = lp.verdict([_run(0, 4000, 500), _run(1, None, 250), _run(2, 8000, 495)], sb3)
    assert ok["parity"] is True and ok["median_steps"] == [8000, 4000] and ok["sb3_reached"] == "2/3"
    missed = lp.verdict([_run(0, 4000, 500), _run(1, 1000, 500), _run(2, None, 495)], sb3)
    assert missed["parity"] is False and missed["seeds_missed"] == [2] and not missed["reaches_where_sb3_does"]
    slow = lp.verdict([_run(0, 9000, 500), _run(1, None, 250), _run(2, 9000, 495)], sb3)
    assert slow["parity"] is False and not slow["median_steps_within_2x"] and slow["reaches_where_sb3_does"]
    low = lp.verdict([_run(0, 2000, 499), _run(1, None, 250), _run(2, 4000, 495)], sb3)
    assert low["parity"] is False and low["seeds_final_below_sb3"] == [0] and low["median_final_at_least_sb3"]
    # SB3 never reaches it (median infinite): any median of ours is within 2x
    assert lp.verdict([_run(0, None, 10)], [_run(0, None, 5)])["parity"] is True
    assert lp.verdict([_run(3, 1, 1)], sb3)["parity"] is None  # no seed in common


def test_cases_configs_and_overrides():
    assert {c.env_id for c in lp.CASES.values()} <= set(lp.THRESHOLDS)
    for name, case in lp.CASES.items():
        for side in ("ours", "generic"):
            made = lp.our_config(case, side)
            if made is None:
                assert side == "ours" and case.shipped is None, name
                continue
            path, extra = made
            assert path.is_file(), path
            if side == "generic":
                assert path.name == lp.GENERIC[case.algo] and extra["env_id"] == case.our_env_id
    assert lp.our_config(lp.CASES["acrobot-dqn"], "ours") is None
    path, extra = lp.our_config(lp.CASES["doorkey-ppo-image"], "generic")
    assert path.name == "cartpole_ppo.yaml"
    assert extra == {"env_id": "minigrid:MiniGrid-DoorKey-5x5-v0",
                     "env_wrappers": [{"wrapper": "minigrid.wrappers.ImgObsWrapper"}]}
    over = lp.run_overrides(extra, 3, 50_000, "/tmp/x")
    assert over["target_fitness"] is None and over["max_env_steps"] == 50_000 and over["seed"] == 3


def test_generic_overrides_validate_as_configs(tmp_path):
    from tasks.config import load_config

    for name in ("acrobot-dqn", "acrobot-ppo", "mountaincar-sac", "lunarlander-ppo", "pendulum-ppo"):
        path, extra = lp.our_config(lp.CASES[name], "generic")
        cfg = load_config(path, lp.run_overrides(extra, 1, 10_000, str(tmp_path)))
        assert cfg.env_id == lp.CASES[name].env_id and cfg.target_fitness is None and cfg.max_env_steps == 10_000


def test_parse_sides_and_cases():
    assert lp.parse_sides("ours,generic,sb3") == ["ours", "generic", "sb3"]
    assert lp.parse_sides("shipped, sb3") == ["ours", "sb3"]
    with pytest.raises(argparse.ArgumentTypeError):
        lp.parse_sides("ours,agilerl")
    assert lp.parse_cases("cartpole-dqn,cartpole-ppo") == ["cartpole-dqn", "cartpole-ppo"]
    with pytest.raises(argparse.ArgumentTypeError):
        lp.parse_cases("cartpole-a2c")
    assert lp.peer.eval_seed(2) == 10_200 and not math.isnan(lp.THRESHOLDS["Pendulum-v1"])

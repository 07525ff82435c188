"""The Stable-Baselines3 side of benchmarks/learning_parity.py: one SB3 run with rl-zoo3's tuned hyperparameters,
evaluated on a fixed rhythm. Runs in the peer venv (stable_baselines3, rl_zoo3), never imports agilerl_core.

    ~/sb3-venv/bin/python benchmarks/peer_sb3.py --algo ppo --env CartPole-v1 --seed 0 --threshold 475

Hyperparameters: ``rl_zoo3/hyperparams/{algo}.yml`` of the installed rl_zoo3, the env's block, turned into
constructor arguments as rl_zoo3's ExperimentManager does (schedules, train_freq, normalize, frame_stack,
env_wrapper, policy_kwargs, action noise). Evaluation: every ``--eval-every`` env steps (all n_envs counted) and
once at the end, ``--eval-episodes`` deterministic episodes, one per sub-env of a separate vector env reset with
seeds ``10_000 + 100 * seed + k``; with VecNormalize, the training statistics are copied in and frozen. The last
stdout line is ``RESULT {json}``; ``--describe`` prints only the translated hyperparameters that way.

Everything above ``main`` is pure (no SB3 import): learning_parity.py and its tests use it from our own env.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from typing import Any

SCHEDULED = ("learning_rate", "clip_range", "clip_range_vf", "delta_std")  # as ExperimentManager's schedules
EVALUATED = ("policy_kwargs", "replay_buffer_class", "replay_buffer_kwargs")  # python source in the YAML


def eval_seed(seed: int) -> int:
    """First reset seed of a run's evaluation episodes (episode k: this + k); never a training seed."""
    return 10_000 + 100 * seed


def zoo_block(doc: dict[str, Any], env_id: str) -> dict[str, Any]:
    """The hyperparameters a zoo YAML (parsed) gives `env_id`: its own block, else ``default`` (a copy)."""
    for key in (env_id, "default"):
        if key in doc:
            return copy.deepcopy(doc[key])
    raise KeyError(f"rl-zoo3 has no hyperparameters for {env_id} (and no default)")


def _normalize_kwargs(value: Any, gamma: Any) -> dict[str, Any] | None:
    """VecNormalize kwargs from the zoo's ``normalize`` (True, a dict, or ``"dict(norm_obs=..., ...)"``); None
    when it does not normalize. The zoo gives VecNormalize the algorithm's gamma."""
    if value is False or value is None:
        return None
    if isinstance(value, str):
        value = eval(value, {"__builtins__": {}}, {"dict": dict, "True": True, "False": False})
    kwargs = dict(value) if isinstance(value, dict) else {}
    if gamma is not None:
        kwargs["gamma"] = gamma
    return kwargs


def translate(hp: dict[str, Any], budget: int | None = None) -> dict[str, Any]:
    """A zoo block as the parts an SB3 run is built from, still as plain data (strings for python source and
    classes): ``n_timesteps`` (`budget` when given), ``n_envs``, ``normalize`` (VecNormalize kwargs or None),
    ``frame_stack``, ``env_wrapper`` / ``vec_env_wrapper`` (the zoo's spec, for ``get_wrapper_class``),
    ``env_kwargs``, ``monitor_kwargs``, ``callback``, ``action_noise`` ({type, std} or None), ``linear_schedules``
    (argument -> initial value, decayed linearly to 0), ``evaluated`` (argument -> python source) and
    ``model_kwargs`` (the rest, as the algorithm takes them)."""
    hp = copy.deepcopy(hp)
    out: dict[str, Any] = {"n_timesteps": int(budget if budget is not None else hp["n_timesteps"]),
                           "n_envs": int(hp.pop("n_envs", 1))}
    hp.pop("n_timesteps", None)
    out["normalize"] = _normalize_kwargs(hp.pop("normalize", False), hp.get("gamma"))
    out["frame_stack"] = hp.pop("frame_stack", None)
    for key in ("env_wrapper", "vec_env_wrapper", "callback"):
        out[key] = hp.pop(key, None)
    out["env_kwargs"] = hp.pop("env_kwargs", None) or {}
    monitor = hp.pop("monitor_kwargs", None)
    out["monitor_kwargs"] = monitor
    noise = hp.pop("noise_type", None)
    std = hp.pop("noise_std", None)
    out["action_noise"] = None if noise is None else {"type": noise.strip(), "std": std}
    schedules = {}
    for key in SCHEDULED:
        value = hp.get(key)
        if isinstance(value, str):  # "lin_0.001": the zoo reads any "<name>_<value>" as linear to 0
            schedules[key] = float(value.split("_")[1])
            del hp[key]
    out["linear_schedules"] = schedules
    out["evaluated"] = {k: hp.pop(k) for k in EVALUATED if isinstance(hp.get(k), str)}
    if isinstance(hp.get("train_freq"), list):
        hp["train_freq"] = tuple(hp["train_freq"])
    out["model_kwargs"] = hp
    return out


def score_evals(evals: list[tuple[int, float]], threshold: float, budget: int) -> dict[str, Any]:
    """What a run's evaluations (step, mean return) say: ``steps_to_threshold`` (the step of the first one >=
    `threshold` within `budget`; None if none), ``final`` and ``best`` (None without evaluations), and
    ``kept_fraction``: of the evaluations after that first one, the share still >= `threshold` (None when it was
    never reached or nothing came after it)."""
    first = next((i for i, (step, mean) in enumerate(evals) if mean >= threshold and step <= budget), None)
    after = [] if first is None else [mean for _, mean in evals[first + 1:]]
    return {"steps_to_threshold": None if first is None else int(evals[first][0]),
            "final": float(evals[-1][1]) if evals else None,
            "best": max(float(m) for _, m in evals) if evals else None,
            "kept_fraction": round(sum(m >= threshold for m in after) / len(after), 3) if after else None}


def describe(tr: dict[str, Any]) -> dict[str, Any]:
    """`translate`'s output as JSON (tuples as lists)."""
    return json.loads(json.dumps(tr, default=str))


# ---- the SB3 run (peer venv only) ----------------------------------------------------------------------------
def _zoo_hyperparams(algo: str, env_id: str) -> dict[str, Any]:
    import importlib.util
    from pathlib import Path

    import yaml

    spec = importlib.util.find_spec("rl_zoo3")
    folder = Path(spec.submodule_search_locations[0]) / "hyperparams"
    with open(folder / f"{algo}.yml") as f:
        return zoo_block(yaml.safe_load(f), env_id)


def _build(algo: str, env_id: str, seed: int, tr: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(model, training env, evaluation env) as ExperimentManager.setup_experiment builds them."""
    import numpy as np
    import torch
    from rl_zoo3.utils import ALGOS, get_class_by_name, get_wrapper_class, linear_schedule
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise
    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize, VecTransposeImage

    wrapper = get_wrapper_class(tr)
    vec_wrapper = get_wrapper_class(tr, "vec_env_wrapper")

    def envs(n: int, evaluation: bool) -> Any:
        env = make_vec_env(env_id, n_envs=n, seed=None if evaluation else seed, wrapper_class=wrapper,
                           env_kwargs=tr["env_kwargs"], monitor_kwargs=tr["monitor_kwargs"])
        if vec_wrapper is not None:
            env = vec_wrapper(env)
        if tr["normalize"] is not None:
            kwargs = dict(tr["normalize"])
            if evaluation:
                kwargs.update(norm_reward=False, training=False)
            env = VecNormalize(env, **kwargs)
        if tr["frame_stack"] is not None:
            env = VecFrameStack(env, tr["frame_stack"])
        space = env.observation_space
        if is_image_space(space) and not is_image_space_channels_first(space):
            env = VecTransposeImage(env)
        return env

    kwargs = dict(tr["model_kwargs"])
    for key, value in tr["linear_schedules"].items():
        kwargs[key] = linear_schedule(value)
    for key, src in tr["evaluated"].items():
        kwargs[key] = eval(src, {"nn": torch.nn, "th": torch, "dict": dict})
    if "policy" in kwargs and "." in kwargs["policy"]:
        kwargs["policy"] = get_class_by_name(kwargs["policy"])
    train_env = envs(tr["n_envs"], False)
    noise = tr["action_noise"]
    if noise is not None:
        n = train_env.action_space.shape[0]
        kinds = {"normal": NormalActionNoise, "ornstein-uhlenbeck": OrnsteinUhlenbeckActionNoise}
        cls = next((c for name, c in kinds.items() if name in noise["type"]), None)  # the zoo's substring test
        if cls is None:
            raise RuntimeError(f"unknown noise type {noise['type']!r}")
        kwargs["action_noise"] = cls(mean=np.zeros(n), sigma=noise["std"] * np.ones(n))
    model = ALGOS[algo](env=train_env, seed=seed, verbose=0, device="cpu", **kwargs)
    return model, train_env, envs


def run(algo: str, env_id: str, seed: int, threshold: float, eval_every: int, episodes: int,
        budget: int | None) -> dict[str, Any]:
    import torch
    from rl_zoo3.utils import get_callback_list
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    try:
        import rl_zoo3.import_envs  # noqa: F401  (registers minigrid and the zoo's other optional envs)
    except ImportError:
        pass
    torch.set_num_threads(1)
    tr = translate(_zoo_hyperparams(algo, env_id), budget)
    model, train_env, make_envs = _build(algo, env_id, seed, tr)
    eval_env = make_envs(episodes, True)  # one deterministic episode per sub-env
    evals: list[tuple[int, float]] = []
    t_eval = 0.0

    def evaluate() -> None:
        nonlocal t_eval
        t = time.perf_counter()
        sync_envs_normalization(model.get_env(), eval_env)  # frozen copy of the training statistics
        eval_env.seed(eval_seed(seed))
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
        evals.append((int(model.num_timesteps), round(float(mean), 4)))
        t_eval += time.perf_counter() - t
        print(f"sb3 {algo} {env_id} seed {seed}: step {model.num_timesteps}: eval {mean:.2f}", file=sys.stderr,
              flush=True)

    class Every(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next = eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                evaluate()
                while self.next <= self.num_timesteps:
                    self.next += eval_every
            return True

    t0 = time.perf_counter()
    callbacks = get_callback_list({"callback": tr["callback"]}) if tr["callback"] is not None else []
    model.learn(total_timesteps=tr["n_timesteps"], callback=[*callbacks, Every()])
    if not evals or evals[-1][0] < model.num_timesteps:
        evaluate()
    wall = time.perf_counter() - t0
    train_env.close()
    eval_env.close()
    return {"seed": seed, **score_evals(evals, threshold, tr["n_timesteps"]), "evals": evals,
            "env_steps": int(model.num_timesteps), "wall_s": round(wall, 1), "eval_wall_s": round(t_eval, 1),
            "budget": tr["n_timesteps"], "eval_every": eval_every, "threshold": threshold,
            "hyperparameters": describe(tr)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--algo", required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=math.inf)
    p.add_argument("--eval-every", type=int, default=2000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--budget", type=int, default=None, help="env steps (default: the zoo's n_timesteps)")
    p.add_argument("--describe", action="store_true", help="print the translated hyperparameters only")
    args = p.parse_args()
    if args.describe:
        result = describe(translate(_zoo_hyperparams(args.algo, args.env), args.budget))
    else:
        result = run(args.algo, args.env, args.seed, args.threshold, args.eval_every, args.eval_episodes,
                     args.budget)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

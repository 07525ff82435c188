"""Record a dataset by running a policy in an env: uniformly random actions or a saved member (an elite)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces
from tqdm import tqdm

from agilerl_core.data.hdf5 import write_hdf5
from agilerl_core.data.transitions import from_episodes
from agilerl_core.envs.make import EnvRecipe
from agilerl_core.envs.vector import action_masks
from agilerl_core.errors import ConfigError


def _random_actions(space: spaces.Space, num_envs: int, mask: np.ndarray | None) -> np.ndarray:
    """One uniformly random action per sub-env, among the allowed ones where the env masks actions."""
    if mask is None:
        return np.stack([space.sample() for _ in range(num_envs)])
    return np.array([space.sample(mask=m.astype(np.int8)) for m in mask])


def collect_episodes(env_id: str, policy: str, episodes: int, seed: int = 0, num_envs: int = 8,
                     epsilon: float = 0.0, env_kwargs: dict | None = None, progress: bool = False,
                     entry_point: str | None = None, wrappers: Sequence = (),
                     algorithms: Callable[[str], Any] | None = None, acting: Callable[[Any], Any] | None = None
                     ) -> list[dict]:
    """The first `episodes` episodes that finish, each as {observations [T+1], actions, rewards,
    terminations, truncations [T]} in the env's own scale.

    `policy` is ``random`` or the path of a saved member (its greedy actions). With `epsilon`, each
    step's action is replaced by a uniformly random one with that probability (a noisier behaviour
    policy covers more states). Where the env puts an ``action_mask`` in its info, random and epsilon
    actions are drawn among the allowed ones only, and the policy acts under the mask. Same arguments,
    same episodes. `wrappers` (a config's ``env_wrappers``) wrap every env copy as in training. A saved
    member is rebuilt by the algorithm its checkpoint names, looked up in `algorithms` (the registry the caller
    hands in: :func:`agilerl_core.algorithms.registry.get_algorithm`), and acts through `acting`
    (:class:`agilerl_core.algorithms.acting.Acting`: its group of one, greedy).
    """
    if episodes < 1:
        raise ConfigError("--episodes: must be at least 1")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError("--epsilon: must lie in [0, 1]")
    env = EnvRecipe(env_id, dict(env_kwargs or {}), entry_point, tuple(wrappers)).vector(num_envs)
    agent = None
    if policy != "random":
        from agilerl_core.io.checkpoint import load_member

        if algorithms is None or acting is None:
            raise TypeError("collect_episodes: a saved policy needs algorithms= (the registry lookup, "
                            "agilerl_core.algorithms.registry.get_algorithm) and acting= (the member's actor, "
                            "agilerl_core.algorithms.acting.Acting)")
        if not Path(policy).is_dir():
            raise ConfigError(f"--policy {policy!r}: neither 'random' nor a saved member directory (the elite/ "
                              f"directory a run writes, e.g. runs/NAME-latest/elite)")
        from agilerl_core.envs.spaces import ObsSpec
        from agilerl_core.io.checkpoint import member_spec, same_spec

        spec = ObsSpec(env.single_observation_space)  # from --env (the caller's), never from the checkpoint
        recorded_spec = member_spec(policy)
        if recorded_spec is not None and not same_spec(recorded_spec, spec):
            raise ConfigError(f"--policy {policy!r}: the member was trained on other observation spaces than "
                              f"{env_id}'s")
        member, recorded = load_member(policy, spec, algorithms=algorithms)
        if recorded.get("env_id") != env_id:
            raise ConfigError(f"--policy {policy!r}: the member was trained on {recorded.get('env_id')}, not {env_id}")
        agent = member.agent
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    single = env.single_action_space
    single.seed(seed)
    n_actions = int(single.n) if isinstance(single, spaces.Discrete) else 0
    obs, info = env.reset(seed=seed)
    actor = None if agent is None else acting(agent)  # the member's group of one, greedy
    running = [{"observations": [obs[i]], "actions": [], "rewards": [], "terminations": [], "truncations": []}
               for i in range(num_envs)]
    done_eps: list[dict] = []
    bar = tqdm(total=episodes, unit="episode", desc=f"collect {env_id}", file=sys.stderr, disable=not progress)
    try:
        while len(done_eps) < episodes:
            mask = action_masks(info, num_envs, n_actions)[0] if n_actions else None
            if agent is None:
                actions = env.action_space.sample() if mask is None else _random_actions(single, num_envs, mask)
            else:
                actions = actor.env_action(agent.obs_spec.to_tensors(obs, agent.device), mask)
                if epsilon > 0:
                    swap = rng.random(num_envs) < epsilon
                    if swap.any():
                        random = _random_actions(single, num_envs, mask)
                        actions = np.where(swap.reshape(-1, *[1] * (np.ndim(actions) - 1)), random, actions)
            next_obs, reward, terminated, truncated, info = env.step(actions)
            if actor is not None:
                actor.reset(terminated | truncated)
            for i in range(num_envs):
                ep = running[i]
                ep["actions"].append(actions[i])
                ep["rewards"].append(reward[i])
                ep["terminations"].append(bool(terminated[i]))
                ep["truncations"].append(bool(truncated[i]))
                if terminated[i] or truncated[i]:
                    ep["observations"].append(info["final_obs"][i])
                    if len(done_eps) < episodes:
                        done_eps.append({k: np.asarray(v) for k, v in ep.items()})
                        bar.update(1)
                    running[i] = {"observations": [next_obs[i]], "actions": [], "rewards": [], "terminations": [],
                                  "truncations": []}
                else:
                    ep["observations"].append(next_obs[i])
            obs = next_obs
    finally:
        bar.close()
        env.close()
    for ep in done_eps:
        ep["observations"] = ep["observations"].astype(env.single_observation_space.dtype, copy=False)
        ep["rewards"] = ep["rewards"].astype(np.float64)
    return done_eps


def write_dataset(out: str, episodes: list[dict], env_id: str, policy: str, fmt: str = "hdf5", s3=None) -> str:
    """Write episodes to `out` (a local path, minari:ID, or s3://BUCKET/KEY: written locally, then
    uploaded); returns where it went."""
    from agilerl_core.data.minari_format import write_minari

    source = "random" if policy == "random" else f"member:{Path(policy).resolve()}"

    def write_local(dest: str) -> Path:
        if fmt == "minari":
            return write_minari(dest, episodes, env_id, source)
        return write_hdf5(dest, from_episodes(episodes), {"env_id": env_id, "source": source})

    if not out.startswith("s3://"):
        return str(write_local(out))
    from agilerl_core.io.storage import S3Storage

    bucket, _, key = out[len("s3://"):].partition("/")
    key = key.strip("/")
    if not bucket or not key:
        raise ConfigError(f"--out {out!r}: expected s3://BUCKET/KEY")
    store = S3Storage(f"s3://{bucket}", s3)
    with tempfile.TemporaryDirectory(prefix="agilerl-collect-") as tmp:
        local = write_local(str(Path(tmp) / "dataset"))
        if local.is_dir():
            store.upload_dir(local, key)
        else:
            store.put_bytes(key, local.read_bytes())
    return out

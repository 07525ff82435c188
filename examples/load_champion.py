"""Load a saved member (a run's elite, a population member, a registered champion's checkpoint) and act.

    python examples/own_env.py --steps 30000                # writes runs/corridor-latest/elite
    python examples/load_champion.py runs/corridor-latest/elite --env examples.own_env:Corridor --episodes 3
    agilerl-flow run deployments/configs/cartpole_dqn.yaml --local    # writes runs/cartpole-dqn-latest/elite
    python examples/load_champion.py runs/cartpole-dqn-latest/elite   # the Gymnasium id its checkpoint records
    python examples/load_champion.py s3://agilerl/runs/RUN_ID/elite --env CartPole-v1   # with the AWS_* variables set

Run these from the repository root. `--env` is the env to act in: a Gymnasium id (``CartPole-v1``) or your own
env as ``module:Class`` / ``module:factory`` (``examples.own_env:Corridor``; the module is imported from the
current directory or ``PYTHONPATH``). Without `--env`, the env id the checkpoint records is used when it is a
registered Gymnasium id. The checkpoint is data (safetensors + JSON, checksums verified): nothing it names is
imported or called, so an env class it records (``<Corridor>``) or a ``module:EnvId`` is yours to name with
`--env`. A member whose observation or action space differs from the env's is refused, naming both. Prints one
JSON line with each episode's return; a user error (a path, an env, a space) is one paragraph on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

import gymnasium as gym

import agilerl_core as ac
from agilerl_core.errors import AgileRLError


class UsageError(Exception):
    """A mistake in what the user asked for: printed as one paragraph, exit status 2."""


def _import_module(name: str, spec: str) -> Any:
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` does: modules beside you import
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and (name == err.name or name.startswith(err.name + ".")):
            raise UsageError(f"--env {spec}: no module named {name!r} from {os.getcwd()} or PYTHONPATH (for the "
                             f"repository's example env, run from the repository root: --env examples.own_env:Corridor)"
                             ) from None
        raise UsageError(f"--env {spec}: importing {name!r} failed: {err}") from None


def _registered(env_id: str) -> bool:
    try:
        gym.spec(env_id)
    except gym.error.Error:
        return False
    return True


def _gym_make(env_id: str, kwargs: dict[str, Any], spec: str) -> gym.Env:
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as err:
        raise UsageError(f"--env {spec}: not a Gymnasium env this process can make ({err}); for your own env class "
                         f"give --env module:Class, e.g. --env examples.own_env:Corridor") from None


def make_env(spec: str | None, recorded: dict[str, Any]) -> tuple[gym.Env, str]:
    """The env named by `spec` (a Gymnasium id, ``module:Class``, ``module:factory`` or Gymnasium's
    ``module:EnvId``), or, when `spec` is None, the registered Gymnasium id the checkpoint records; and its name.
    The recorded ``env_kwargs`` go to the env the member was trained in (the same id or factory name)."""
    recorded_id = str(recorded.get("env_id") or "")
    kwargs = dict(recorded.get("env_kwargs") or {})
    if spec is None:
        if not recorded_id:
            raise UsageError("the checkpoint records no env to act in; pass one: --env GYMNASIUM_ID or "
                             "--env module:Class")
        if recorded_id.startswith("<"):
            raise UsageError(f"the checkpoint records env {recorded_id}: an env class or function given to "
                             f"evolve(env=...) in the process that trained it, not a registered Gymnasium id. "
                             f"Pass the env to act in with --env module:Class (e.g. --env examples.own_env:Corridor "
                             f"from the repository root)")
        if ":" in recorded_id or not _registered(recorded_id):
            how = (f"it names a module to import, and a checkpoint's names are never imported: pass --env "
                   f"{recorded_id} yourself" if ":" in recorded_id else
                   f"it is not registered in this process: pass --env module:Class "
                   f"({'e.g. --env ' + recorded['env_entry_point'] if recorded.get('env_entry_point') else 'your env'})")
            raise UsageError(f"the checkpoint records env id {recorded_id!r}; {how}")
        return _gym_make(recorded_id, kwargs, recorded_id), recorded_id
    if ":" not in spec:
        return _gym_make(spec, kwargs if spec == recorded_id else {}, spec), spec
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--env {spec}: give module:Class (e.g. examples.own_env:Corridor) or a Gymnasium id")
    module = _import_module(module_name, spec)
    factory = getattr(module, attr, None) if attr.isidentifier() else None
    if factory is None:  # Gymnasium's module:EnvId: importing the module registered the id
        if _registered(attr):
            return _gym_make(attr, kwargs if spec == recorded_id else {}, spec), spec
        raise UsageError(f"--env {spec}: module {module_name!r} has no {attr!r}, and importing it registered no "
                         f"Gymnasium id {attr!r}")
    if not callable(factory):
        raise UsageError(f"--env {spec}: {attr!r} is a {type(factory).__name__}; name a class or a function that "
                         f"builds a new env")
    env = factory(**(kwargs if recorded_id == f"<{attr}>" else {}))
    if not (isinstance(getattr(env, "observation_space", None), gym.Space) and hasattr(env, "step")):
        raise UsageError(f"--env {spec}: {attr}() returned a {type(env).__name__}, not a Gymnasium env "
                         f"(with observation_space, action_space, reset and step)")
    return env, spec


def _fits(member: gym.Space, env: gym.Space) -> bool:
    """Whether observations (or actions) of `env` are what `member` takes: the same kind, shape, size, keys."""
    if isinstance(member, gym.spaces.Dict) or isinstance(env, gym.spaces.Dict):
        return (isinstance(member, gym.spaces.Dict) and isinstance(env, gym.spaces.Dict)
                and list(member.spaces) == list(env.spaces)
                and all(_fits(member[k], env[k]) for k in member.spaces))
    if isinstance(member, gym.spaces.Discrete) or isinstance(env, gym.spaces.Discrete):
        return isinstance(member, gym.spaces.Discrete) and isinstance(env, gym.spaces.Discrete) and member.n == env.n
    return type(member) is type(env) and member.shape == env.shape


def _member_actions(policy: ac.Policy) -> gym.Space | None:
    """The action space the member chooses in, rebuilt from its checkpoint's action record."""
    spec = getattr(policy.agent, "action_spec", None)
    if spec is None:
        return None
    if spec.discrete:
        return gym.spaces.Discrete(spec.dim)
    return gym.spaces.Box(-1.0, 1.0, tuple(spec.shape) or (spec.dim,))


def check_fits(policy: ac.Policy, env: gym.Env, env_name: str) -> None:
    """A UsageError naming both spaces when the env's observations or actions are not the member's."""
    wrappers = [str(w.get("wrapper")) for w in policy.env.get("env_wrappers") or [] if isinstance(w, dict)]
    inside = (f" It was trained inside the wrappers {', '.join(wrappers)}: give --env a module:factory that "
              f"returns the env wrapped the same way.") if wrappers else ""
    trained = f"member {policy.member_id} was trained in {policy.env.get('env_id')}"
    if not _fits(policy.observation_space, env.observation_space):
        raise UsageError(f"{env_name} does not fit this member: its observation space is {env.observation_space}, "
                         f"and {trained} with observation space {policy.observation_space}.{inside} Pass the env "
                         f"it was trained in with --env (a Gymnasium id or module:Class).")
    actions = _member_actions(policy)
    if actions is not None and not _fits(actions, env.action_space):
        raise UsageError(f"{env_name} does not fit this member: its action space is {env.action_space}, and {trained} "
                         f"choosing among {actions}.{inside} Pass the env it was trained in with --env.")


def run_episodes(policy: ac.Policy, env: gym.Env, episodes: int, max_steps: int) -> list[float]:
    """The member's greedy return in each of `episodes` episodes (seeds 0, 1, ...), each cut at `max_steps`."""
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        policy.reset()  # a recurrent member starts each episode with a fresh memory
        total, done, steps = 0.0, False, 0
        while not done and steps < max_steps:
            obs, reward, terminated, truncated, _ = env.step(policy.predict(obs))
            total += float(reward)
            done, steps = terminated or truncated, steps + 1
        returns.append(total)
    return returns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("uri", help="a member directory, local or s3:// (e.g. runs/corridor-latest/elite)")
    p.add_argument("--env", default=None, metavar="ID|module:Class",
                   help="the env to act in: a Gymnasium id or module:Class / module:factory (default: the Gymnasium "
                        "id the checkpoint records)")
    p.add_argument("--episodes", type=int, default=3, help="episodes to act in (seeds 0, 1, ...)")
    p.add_argument("--max-steps", type=int, default=10_000, help="cut an episode after this many steps")
    args = p.parse_args(argv)
    try:
        if args.episodes < 1 or args.max_steps < 1:
            raise UsageError("--episodes and --max-steps take a whole number >= 1")
        try:
            policy = ac.load(args.uri)
        except AgileRLError as err:  # no member there, a damaged file, an unreadable store
            raise UsageError(str(err)) from None
        if policy.kind == "llm":
            raise UsageError(f"{args.uri}: an LLM member writes text and acts in no env; call "
                             f"ac.load({args.uri!r}).generate(prompt)")
        if policy.env.get("kind") == "multi_agent":
            raise UsageError(f"{args.uri}: a multi-agent team's member acts in a PettingZoo env with a dict of "
                             f"observations keyed by agent id; this example acts in one Gymnasium env")
        env, env_name = make_env(args.env, policy.env)
        check_fits(policy, env, env_name)
    except UsageError as err:
        print(f"load_champion: {err}", file=sys.stderr)
        return 2
    returns = run_episodes(policy, env, args.episodes, args.max_steps)
    env.close()
    print(json.dumps({"member": policy.member_id, "algorithm": policy.algorithm, "fitness": policy.fitness,
                      "env_id": env_name, "trained_in": policy.env.get("env_id"), "returns": returns}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

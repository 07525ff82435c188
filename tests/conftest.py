"""Shared fixtures and small test envs (registered with Gymnasium under the `agilerl_test/` namespace)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

ROOT_DIR = Path(__file__).resolve().parents[1]


class ImageEnv(gym.Env):
    """8x8 RGB image (channels last, uint8); reward 1 for the action equal to the lit quadrant."""

    observation_space = spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.target = int(self.np_random.integers(2))
        img = np.zeros((8, 8, 3), np.uint8)
        img[:, self.target * 4:(self.target + 1) * 4, :] = 255
        return img

    def step(self, action):
        r = float(action == self.target)
        self.t += 1
        return self._obs(), r, False, self.t >= 16, {}


class MaskedDictEnv(gym.Env):
    """Dict observation (Discrete position + Box vector) with an action mask in info."""

    observation_space = spaces.Dict({"pos": spaces.Discrete(5), "vec": spaces.Box(-1, 1, (3,), np.float32)})
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {"action_mask": self._mask()}

    def _mask(self):
        m = np.ones(3, dtype=np.int8)
        m[2] = 0 if self.pos % 2 == 0 else 1  # action 2 only valid at odd positions
        return m

    def _obs(self):
        return {"pos": self.pos, "vec": self.np_random.uniform(-1, 1, 3).astype(np.float32)}

    def step(self, action):
        if self._mask()[action] == 0:
            raise AssertionError(f"invalid action {action} taken at position {self.pos}")
        self.pos = min(self.pos + 1, 4) if action >= 1 else max(self.pos - 1, 0)
        done = self.pos == 4
        return self._obs(), float(done), done, False, {"action_mask": self._mask()}


class MaskedLineEnv(gym.Env):
    """A Box position on a line; action 2 (jump) is allowed only at even steps (info's action_mask) and
    taking it when masked raises, so any forbidden action is caught."""

    observation_space = spaces.Box(-10, 10, (2,), np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.x = 0, 0.0
        return self._obs(), {"action_mask": self._mask()}

    def _mask(self):
        return np.array([1, 1, int(self.t % 2 == 0)], dtype=np.int8)

    def _obs(self):
        return np.array([self.x, self.t % 2], dtype=np.float32)

    def step(self, action):
        if self._mask()[action] == 0:
            raise AssertionError(f"forbidden action {action} at step {self.t}")
        self.x += (-1.0, 1.0, 2.0)[int(action)]
        self.t += 1
        done = abs(self.x) >= 6
        return self._obs(), float(self.x > 0), done, False, {"action_mask": self._mask()}


class DictCueEnv(gym.Env):
    """Dict observation: a Discrete cue and a Box of distractor noise. The reward is 1 when the action
    equals the cue (redrawn every step), 8 steps an episode: random play scores ~2.7, a learned policy 8."""

    observation_space = spaces.Dict({"cue": spaces.Discrete(3), "noise": spaces.Box(-1, 1, (6,), np.float32)})
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.cue = int(self.np_random.integers(3))
        return {"cue": self.cue, "noise": self.np_random.uniform(-1, 1, 6).astype(np.float32)}

    def step(self, action):
        r = float(int(action) == self.cue)
        self.t += 1
        return self._obs(), r, False, self.t >= 8, {}


for _id, _cls in (("agilerl_test/Image-v0", ImageEnv), ("agilerl_test/MaskedDict-v0", MaskedDictEnv),
                  ("agilerl_test/MaskedLine-v0", MaskedLineEnv), ("agilerl_test/DictCue-v0", DictCueEnv)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_cls, max_episode_steps=50)


# ---- tiers ---------------------------------------------------------------------------------------------------
# A test is `slow` (left out of the inner-loop tier `python -m pytest -m "not slow"`) when it asks for the real
# local stack (`stack`, `s3`, `servers` start servers), the CLI in subprocesses (`cli`) or a documentation page
# followed from a fresh clone (`run_page`, tests/test_docs_run.py), or is marked by hand (learning runs, Ray and
# Dask clusters); `integration` tests (which start a stack of their own) are slow too. The README's
# `python -m pytest` runs every tier.
SLOW_FIXTURES = frozenset({"stack", "s3", "servers", "cli", "run_page"})
STACK_FIXTURES = frozenset({"stack", "s3", "servers"})
#
# Workers: `python -m pytest` and the fast tier run on every core (pytest-xdist, `-n auto` in pyproject.toml:
# two workers here, at most four anywhere). Each test file is one unit of work, so a file's module fixtures (a
# stack of its own, a straight run to compare with) start once, and every test of the shared local stack runs on
# one worker, so one stack serves them all. A run that names tests (`python -m pytest tests/test_x.py -k y`) stays
# in this process (prints, `--pdb`); `-n 0` or `-n 2` say otherwise.


def pytest_xdist_auto_num_workers(config):
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return 0
    return min(os.cpu_count() or 1, 4)


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES.intersection(names) or item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.slow)
        group = "stack" if STACK_FIXTURES.intersection(names) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _single_thread():
    torch.set_num_threads(1)


def commit_generations(exp, store, generations: int = 1) -> None:
    """The pipeline's sequence in one process: evolve, train, evaluate, commit shards + generation, `generations`
    times (generation 0 first when `exp` has run none)."""
    for _ in range(generations):
        if exp.history:
            exp.evolve()
        exp.begin_generation()
        n = len(exp.population.members)
        results = [exp.train(s) for s in range(n)]
        fits = [exp.evaluate(s) for s in range(n)]
        shards = [exp.arena.buffer.shard(s) for s in range(n)]
        refs = [store.put_shard(exp.population.generation, s, sh) for s, sh in enumerate(shards)]
        exp.finish_generation(results, fits, shards)
        exp.commit(store, refs)


def wait_for_commit(store, generation: int, proc, timeout: float = 240) -> None:
    """Wait until `store` has committed `generation` (checked every 50 ms), failing at once with the run's
    stderr if `proc` exits first, and after `timeout` seconds otherwise."""
    deadline = time.monotonic() + timeout
    while generation not in store.committed_generations():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, f"generation {generation} not committed within {timeout} s"
        time.sleep(0.05)


def wait_until(check, timeout: float, what: str):
    """Poll `check` until it returns something truthy (returned) or `timeout` seconds pass (a failure naming
    `what`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def load_benchmark(name: str):
    """benchmarks/NAME.py as the module ``benchmarks_NAME``, loaded from its file (sys.path left as it is)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"benchmarks_{name}"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def with_overrides(data: dict, overrides: dict) -> dict:
    """`data` with dotted-key `overrides` set in place (``"hyperparameters.lr": 1e-3``)."""
    for k, v in overrides.items():
        node = data
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return data


class HostReads(torch.overrides.TorchFunctionMode):
    """Counts the calls that read a tensor back to the host (.cpu(), .item(), .tolist(), .numpy(), bool(), int(),
    float()) while it is active (``with HostReads() as reads: ...; reads.count``)."""

    names = frozenset({"cpu", "item", "tolist", "__bool__", "__int__", "__float__", "numpy"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.names
        return func(*args, **(kwargs or {}))


def greedy(agent, obs, mask=None):
    """A member's greedy actions (agent scale) through its group of one, as Policy.predict acts."""
    from agilerl_core.algorithms.acting import Acting

    return Acting(agent).actions(obs, mask)


def learn_alone(agent, batch):
    """One gradient step of a member on `batch` as a group of one (a training phase's group at K = 1), written
    back into the member; its (detached) loss."""
    group = type(agent).group([agent])
    loss = group.learn_batch(batch)
    group.write_back()
    return loss[0]


def ppo_rows(agent, rollout, steps, advantages, returns, valid=None):
    """What a PPO member learns from in a rollout: its first `steps` rows flattened with their advantages and
    returns, only those where `valid` [T, N] is set (None: all); a recurrent member's rollout gives sequences of
    ``seq_len`` steps instead."""
    if getattr(rollout, "states", None) is not None:
        assert valid is None, "a recurrent rollout learns from whole sequences"
        return rollout.sequences(steps, agent.hp.seq_len, advantages, returns)
    data = rollout.flat(steps)
    adv, ret = advantages[:steps].reshape(-1), returns[:steps].reshape(-1)
    if valid is not None:
        rows = valid[:steps].reshape(-1).nonzero().squeeze(1)
        data = {k: ({kk: vv.index_select(0, rows) for kk, vv in v.items()} if isinstance(v, dict)
                    else v.index_select(0, rows)) for k, v in data.items()}
        adv, ret = adv.index_select(0, rows), ret.index_select(0, rows)
    return data, adv, ret


def ppo_learn_alone(agent, rollout, steps, advantages, returns, valid=None) -> dict:
    """A PPO member's update on a rollout (:func:`ppo_rows`) as a group of one; its loss statistics."""
    data, adv, ret = ppo_rows(agent, rollout, steps, advantages, returns, valid)

    def one(d: dict) -> dict:  # [1, ...] every field (dicts of fields included)
        return {k: one(v) if isinstance(v, dict) else v.unsqueeze(0) for k, v in d.items()}

    group = type(agent).group([agent])
    stats = group.learn_stacked(one(data), adv.unsqueeze(0), ret.unsqueeze(0))
    group.write_back()
    updates = int(stats["updates"][0])
    agent.learn_steps += updates
    return {"loss": float(stats["loss_sum"][0]) / max(updates, 1), "approx_kl": float(stats["approx_kl"][0]),
            "updates": updates}


def tiny_config(**overrides):
    """A config that trains for a few hundred steps (for tests)."""
    from tasks.config import validate_config

    data = {"name": "test", "env_id": "CartPole-v1", "num_envs": 4, "population_size": 3, "evo_steps": 200,
            "eval_episodes": 2, "max_env_steps": 1200, "seed": 0,
            "hyperparameters": {"batch_size": 32, "learning_delay": 64, "buffer_size": 5000},
            "network": {"hidden_sizes": [32, 32], "min_nodes": 8}}
    with_overrides(data, overrides)
    if data.get("kind") == "offline":
        data.pop("num_envs")  # members never act in training
    return validate_config(data)


# ---- the real local stack (integration tests) --------------------------------------------------------------
@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """SeaweedFS S3 (credentials enforced), an MLflow server and a Prefect server on free loopback ports,
    started once per test session through infra.stack and stopped after it. Services start on demand:
    call stack.start_s3() / start_mlflow() / start_prefect() / start_worker()."""
    from infra.stack import Stack, free_port

    trusted = tmp_path_factory.mktemp("trusted-runs")  # local runs the workers' train-group runs may read
    s = Stack(tmp_path_factory.mktemp("stack"), ports={k: free_port() for k in ("s3", "mlflow", "prefect")},
              worker_env={"AGILERL_TRUSTED_URIS": f"{trusted}/"})
    s.trusted_runs = trusted
    yield s
    s.down()


@pytest.fixture(scope="session")
def s3(stack):
    stack.start_s3()
    return stack


@pytest.fixture(scope="session")
def servers(stack):
    """All three servers up; the env a client process needs to use them."""
    stack.start_s3()
    stack.start_mlflow()
    stack.start_prefect()
    return stack


# ---- the CLI as a user runs it -----------------------------------------------------------------------------
def _cli_env(tmp_path) -> dict:
    """The environment of a CLI subprocess on the embedded default: no server URLs inherited, Prefect's home in
    `tmp_path`, this checkout importable."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                            "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return env


def cli_summary(proc) -> dict:
    """The JSON summary a successful CLI run prints last."""
    import json

    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Cli:
    """`agilerl-flow` (and the repository's scripts) in subprocesses, as a user runs them from `tmp_path`: the
    only way a test starts the CLI. A test asking for the `cli` fixture is in the slow tier (each start imports
    Prefect and the engine afresh)."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.env = _cli_env(tmp_path)

    def run(self, *args, cwd=None, env=None, timeout: float = 300):
        """`agilerl-flow ARGS` to completion (a CompletedProcess with text output)."""
        return self.python("-m", "flows.cli", *map(str, args), cwd=cwd, env=env, timeout=timeout)

    def python(self, *argv, cwd=None, env=None, timeout: float = 300):
        """`python ARGV` (a script, ``-m module`` or ``-c code``) to completion, text output."""
        import subprocess
        import sys

        return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd or self.tmp_path,
                              env=self.env if env is None else env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def popen(self, *args, cwd=None, env=None):
        """`agilerl-flow ARGS` started in a session of its own (kill -9 its group to crash it), pipes open."""
        import subprocess
        import sys

        return subprocess.Popen([sys.executable, "-m", "flows.cli", *map(str, args)], cwd=cwd or self.tmp_path,
                                env=self.env if env is None else env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)

    def crash_and_resume(self, cfg_path, storage: str, kill_after: int = 2, straight_cfg=None) -> tuple[dict, dict]:
        """Run `cfg_path` as run "crashed", kill -9 its process group once generation `kill_after` is committed,
        resume it, then run it uninterrupted as "straight" (`straight_cfg`: that config instead, e.g. the same run
        on the threads runner, which gives every runner's result): (resumed summary, straight summary)."""
        import os
        import signal

        from agilerl_core.io.run_store import RunStore
        from agilerl_core.io.storage import open_storage

        common = ["--storage", storage, "--no-progress", "--set", f"output_dir={self.tmp_path / 'out'}"]
        proc = self.popen("run", cfg_path, "--run-id", "crashed", *common)
        store = RunStore(open_storage(storage), "crashed")
        wait_for_commit(store, kill_after, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        crashed_at = store.committed_generations()[-1]
        resumed = cli_summary(self.run("resume", "crashed", "--storage", storage, "--no-progress"))
        assert crashed_at < resumed["generations"] - 1, "the run finished before it was killed"
        # the resumed run's summary covers the whole run: every attempt's steps, the committed generations' wall time
        assert resumed["resumed_after_generation"] == crashed_at and resumed["attempt_steps"] < resumed["global_steps"]
        assert resumed["wall_s"] > resumed["attempt_wall_s"]
        straight = cli_summary(self.run("run", straight_cfg or cfg_path, "--run-id", "straight", *common))
        return resumed, straight


@pytest.fixture
def cli(tmp_path) -> Cli:
    """The CLI in subprocesses from `tmp_path` (marks the test slow)."""
    return Cli(tmp_path)


def committed_state(storage: str, run_id: str) -> tuple[list, list, dict]:
    """A run's last committed generation as data: (lineage, every generation's fitnesses, member file hashes)."""
    import json

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage

    s = RunStore(open_storage(storage), run_id)
    g = s.latest_generation()
    pop = json.loads(s.storage.get_bytes(s.key(s.gen_dir(g), "population", "population.json")))
    weights = {k.split("/population/")[1]: v for k, v in s.manifest(g)["files"].items() if k.endswith(".safetensors")}
    return pop["lineage"], [h["fitnesses"] for h in pop["extra"]["history"]], weights

"""The first hour of an RL user (issue 52), through the CLI as a user runs it: what a run prints when its output
is not a terminal, a budget too small to evolve said once, the libraries' chatter quiet unless --verbose, no link
into a server that is gone, NAME-latest for flow runs, Ctrl-C naming the way back, the working directory's modules
importable, the bar numbering generations as the history does."""

from __future__ import annotations

import os
import selectors
import shlex
import signal
import sys
import time
from pathlib import Path

import agilerl_core as ac
from agilerl_core.progress import show_generation
from tests.conftest import cli_summary

TINY = ("env_id: CartPole-v1\nname: tiny\nnum_envs: 4\npopulation_size: 2\nevo_steps: 200\neval_episodes: 1\n"
        "max_env_steps: {budget}\nhyperparameters: {{batch_size: 32, learning_delay: 40}}\n")

CUE_BANDIT = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CueBandit(gym.Env):
    """Press the button the cue shows (reward 1), ten cues an episode."""

    observation_space = spaces.Box(0, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self.cue], {}

    def step(self, action):
        reward = float(action == self.cue)
        self.t, self.cue = self.t + 1, int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self.cue], reward, False, self.t >= 10, {}
'''


def test_a_flow_run_piped_to_a_file_prints_lines_and_only_what_a_user_needs(tmp_path, cli):
    (tmp_path / "c.yaml").write_text(TINY.format(budget=400))
    p = cli.run("run", "c.yaml")  # stderr is a pipe, not a terminal: no bar, a line per generation
    summary = cli_summary(p)
    err = p.stderr
    assert "\r" not in err and "generation 0: best" in err and "best member's training: loss" in err
    assert err.count("pays for 1 generation") == 1 and "raise max_env_steps to at least 1,200" in err
    assert "View at http" not in err and "Prefect runs on a server of this command alone" in err
    for chatter in ("INFO mlflow", "Creating initial MLflow database tables", "Successfully registered model",
                    "Created version", "Downloading artifacts"):
        assert chatter not in err, chatter
    assert "registered as tiny version 1" in err  # what was registered, said once by the run itself
    latest = tmp_path / "runs" / "tiny-latest"
    assert latest.is_symlink() and os.readlink(latest) == summary["run_id"] and (latest / "elite").is_dir()

    verbose = cli.run("run", "c.yaml", "--verbose")
    assert "Successfully registered model" in verbose.stderr or "Registered model" in verbose.stderr, \
        verbose.stderr[-2000:]
    assert os.readlink(latest) == cli_summary(verbose)["run_id"]  # the newest run


def test_ctrl_c_names_the_run_and_the_command_that_continues_it(tmp_path, cli):
    (tmp_path / "c.yaml").write_text(TINY.format(budget=4000) + "tracking: {enabled: false}\n")  # 10 generations
    proc = cli.popen("run", "c.yaml", "--no-progress")
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    seen, deadline = "", time.monotonic() + 240
    while "generation 1: best" not in seen:
        assert proc.poll() is None and time.monotonic() < deadline, seen[-3000:]
        if sel.select(timeout=1):
            seen += proc.stderr.readline().decode()
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group (the local Prefect
    err = proc.communicate(timeout=120)[1].decode()  # server has a session of its own and keeps serving the run)
    assert proc.returncode == 130, (seen + err)[-3000:]
    # the line at once, then nothing: no crashed-task reports, lost connections or tracebacks on the way out
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("agilerl-flow: interrupted"), err[-3000:]
    line = lines[0]
    assert "generations up to" in line and "nothing committed is lost" in line
    command = line.split("continue it with: ")[1]
    args = shlex.split(command)
    assert args[:2] == ["agilerl-flow", "resume"] and args[2].startswith("tiny-s0-")
    resumed = cli_summary(cli.run(*args[1:], "--no-progress", timeout=600))  # the printed command, as printed
    assert resumed["run_id"] == args[2] and resumed["global_steps"] == 4000


STRAY = ("opt_einsum", "numexpr", "bottleneck", "dill", "lz4", "pydot", "pynvml")  # what libraries probe for


def test_a_config_names_a_module_beside_it_as_python_m_finds_it_and_nothing_else_there(tmp_path, cli, monkeypatch):
    """Issue 66, item 13: the working directory's modules that the config names are imported from there (a user's
    own env beside the config), and nothing else of it: a stray module named like one a library probes for (dill,
    pynvml... a plain run looks for them) is never imported, in the CLI, its worker processes or evolve."""
    (tmp_path / "myenvs").mkdir()
    (tmp_path / "myenvs" / "__init__.py").write_text("")
    (tmp_path / "myenvs" / "keyenv.py").write_text(CUE_BANDIT)
    for name in STRAY:
        (tmp_path / f"{name}.py").write_text(f"open({str(tmp_path / ('imported-' + name))!r}, 'w').close()\n")
    (tmp_path / "c.yaml").write_text(TINY.format(budget=400).replace("env_id: CartPole-v1", "env_id: CueBandit-v0")
                                     + "env_entry_point: myenvs.keyenv:CueBandit\n")
    # -P: the interpreter adds no working directory of its own (as the installed `agilerl-flow` script runs)
    p = cli.python("-P", "-m", "flows.cli", "run", "c.yaml", "--local", "--no-progress")
    assert cli_summary(p)["global_steps"] == 400
    (tmp_path / "plain.yaml").write_text(TINY.format(budget=400))  # a run naming no module of its own
    p = cli.python("-P", "-m", "flows.cli", "run", "plain.yaml", "--local", "--no-progress")
    assert cli_summary(p)["global_steps"] == 400
    assert not sorted(tmp_path.glob("imported-*")), "a module of the working directory that no config names ran"

    monkeypatch.chdir(tmp_path)  # evolve, from Python, finds it too (sys.path and PYTHONPATH restored after the test)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    result = ac.evolve({"env_id": "CueBandit-v1", "env_entry_point": "myenvs.keyenv:CueBandit", "num_envs": 2,
                        "population_size": 2, "evo_steps": 100, "max_env_steps": 200, "eval_episodes": 1,
                        "hyperparameters": {"batch_size": 32, "learning_delay": 20}}, progress=False)
    assert result.summary["global_steps"] == 200
    links = Path(sys.path[-1])  # a folder of links to the named top-level modules, nothing else of the directory
    assert sorted(p.name for p in links.iterdir() if p.name != "__pycache__") == ["myenvs"]
    assert (links / "myenvs").resolve() == tmp_path / "myenvs" and str(links) in os.environ["PYTHONPATH"]
    assert not sorted(tmp_path.glob("imported-*"))


def test_the_bar_numbers_the_generation_it_shows_as_the_history_does():
    class Bar:
        n, total, postfix = 0, 100, None

        def set_postfix(self, **kw):
            self.postfix = kw

    bar = Bar()
    show_generation(bar, 50, 0, 10.0, 9.0, 5.0)
    assert bar.n == 50 and bar.postfix["gen"] == 0 and bar.postfix["last"] == "9.00"

"""Every code block of README.md and docs/**/*.md, and every command line in the docstrings of examples/*.py, works
as a user runs it from the root of a fresh clone.

Each page (a markdown file or an example's docstring) is followed top to bottom in a sandbox of its own: a temp
directory linking the repository's top-level entries (so relative paths resolve as in a clone), with its own
``runs/``. Its python blocks run in order in one interpreter (as pasted into one session), then its runnable
command lines in order, so a line that loads ``runs/NAME-latest/elite`` finds what the page's earlier steps wrote.

- ``python`` blocks run as written; pages listed in ``BUDGETS`` run with smaller budgets (``evolve``'s overrides).
- Shell lines (``bash`` blocks, indented command blocks, docstring lines; ``&&`` splits a line): every
  ``agilerl-flow`` command is parsed by the CLI's own parser, a ``run``'s config loaded with its ``--set``
  overrides, a ``trigger``'s deployment looked up in deployments/prefect.yaml; every ``python SCRIPT`` line is
  parsed by the script's own parser; ``pip install`` names only extras pyproject.toml declares. The cheap ones
  (:func:`plan_command`: the examples, ``run --local``, ``dataset make-arithmetic``) run, with tiny budgets.
- A synopsis line (``[optional]`` parts, ``a|b`` choices) names only subcommands, options and choices the CLI has.
- ``yaml`` blocks are configs: validated and built (a section without ``env_id`` merged into cartpole_dqn.yaml).
- ``<!-- docs-test: skip (REASON) -->`` on the line before a block skips it (the reason is required).

A failure names the file and line of the block (python tracebacks point into the markdown file itself).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests import docs_pages
from tests.docs_pages import (
    BUDGETS,
    NOT_IN_SANDBOX,
    PAGES,
    ROOT,
    SHELL,
    TEXT,
    Block,
    Command,
    check_cli,
    check_pip,
    check_synopsis,
    commands,
    is_synopsis,
    markdown_blocks,
    page_blocks,
    plan_command,
)


# ---- collection -------------------------------------------------------------------------------------------------
def _collect() -> tuple[dict[str, list[Block]], list[str]]:
    blocks, errors = {}, []
    for page in PAGES:
        try:
            blocks[page] = page_blocks(page)
        except AssertionError as err:  # reported by the first test, not as a collection error hiding the rest
            blocks[page], errors = [], [*errors, str(err)]
    return blocks, errors


BLOCKS, EXTRACTION_ERRORS = _collect()


def test_every_block_has_a_known_language_and_skips_say_why():
    assert not EXTRACTION_ERRORS, "\n".join(EXTRACTION_ERRORS)
    langs = {b.where: b.lang for blocks in BLOCKS.values() for b in blocks}
    unknown = {w: lang for w, lang in langs.items() if lang not in {"python", "yaml", *SHELL, *TEXT}}
    assert not unknown, f"code blocks of a language this test does not check: {unknown}"
    skipped = [(b.where, b.skip) for blocks in BLOCKS.values() for b in blocks if b.skip]
    assert len(skipped) <= 4, f"keep skips few: {skipped}"
    assert sum(len(b) for b in BLOCKS.values()) > 20  # the extraction found the docs' blocks


def test_extraction_sees_fences_indented_blocks_markers_and_docstrings(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n    agilerl-flow stack status\n\n- a list\n\n    still the list\n\n"
                    "<!-- docs-test: skip (needs a GPU) -->\n```python\nx = 1\n```\n\n  ```yaml\n  env_id: a\n  ```\n")
    monkeypatch.setattr(docs_pages, "ROOT", tmp_path)
    blocks = markdown_blocks("p.md")
    assert [(b.line, b.lang, b.code, b.skip) for b in blocks] == [
        (3, "bash", "agilerl-flow stack status\n", None), (11, "python", "x = 1\n", "needs a GPU"),
        (15, "yaml", "env_id: a\n", None)]
    page.write_text("<!-- docs-test: skip (why) -->\ntext\n")
    with pytest.raises(AssertionError, match=r"p.md: docs-test comments on lines \[1\]"):
        markdown_blocks("p.md")
    page.write_text("<!-- docs-test: skipping -->\n```python\n```\n")
    with pytest.raises(AssertionError, match=r"p.md:1: unknown directive"):
        markdown_blocks("p.md")
    assert commands(Block("p", 4, "bash", "pip install x && agilerl-flow run a.yaml   # comment\n\npython b.py\n")) == [
        ("p:4", ["pip", "install", "x"]), ("p:4", ["agilerl-flow", "run", "a.yaml"]), ("p:6", ["python", "b.py"])]


# ---- static checks: every shell line and yaml block -------------------------------------------------------------
SHELL_BLOCKS = [b for blocks in BLOCKS.values() for b in blocks if b.lang in SHELL and not b.skip]
YAML_BLOCKS = [b for blocks in BLOCKS.values() for b in blocks if b.lang == "yaml" and not b.skip]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_lines_parse_and_their_configs_validate(block):
    for where, cmd in commands(block):
        if cmd[0] == "agilerl-flow":
            (check_synopsis if is_synopsis(cmd[1:]) else check_cli)(cmd[1:], where)
        elif cmd[0] == "pip":
            check_pip(cmd, where)
        elif cmd[0] in {"python", "python3"}:
            assert not is_synopsis(cmd[1:]), f"{where}: {shlex.join(cmd)}: write a command a user can paste"
            if cmd[1] == "-m":
                import importlib.util

                assert importlib.util.find_spec(cmd[2]) is not None, f"{where}: no module {cmd[2]}"
                if cmd[2] == "flows.cli":
                    check_cli(cmd[3:], where)
            else:
                assert (ROOT / cmd[1]).is_file(), f"{where}: no script {cmd[1]}"


def test_every_python_script_line_parses_with_the_scripts_own_parser(tmp_path):
    """`python SCRIPT ARGS` lines: the script's argparse accepts ARGS (run up to its parse_args, in one process)."""
    lines = [(where, cmd[1:]) for b in SHELL_BLOCKS for where, cmd in commands(b)
             if cmd[0] in {"python", "python3"} and not cmd[1].startswith("-")]
    assert any(argv[0].startswith("benchmarks/") for _, argv in lines)
    driver = r'''
import argparse, contextlib, io, json, os, runpy, sys
class Parsed(Exception):
    pass
parse = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_only
failures = []
for where, argv in json.load(open(sys.argv[1])):
    sys.argv, err = argv, io.StringIO()
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python SCRIPT` has it
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(argv[0], run_name="__main__")
        failures.append(f"{where}: {argv[0]} never parsed its arguments")
    except Parsed:
        pass
    except SystemExit:
        failures.append(f"{where}: {' '.join(argv)}: {err.getvalue().strip()}")
    except Exception as exc:
        failures.append(f"{where}: {' '.join(argv)}: {type(exc).__name__}: {exc}")
print(json.dumps(failures))
'''
    spec = tmp_path / "lines.json"
    spec.write_text(json.dumps(lines))
    proc = subprocess.run([sys.executable, "-c", driver, str(spec)], cwd=ROOT, env=_env(tmp_path, ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=lambda b: b.where)
def test_yaml_blocks_are_configs_that_validate_and_build(block):
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    data = yaml.safe_load(block.code)
    assert isinstance(data, dict), f"{block.where}: not a mapping"
    if "env_id" not in data and "kind" not in data:  # a section of a config
        data = {**yaml.safe_load((ROOT / "deployments" / "configs" / "cartpole_dqn.yaml").read_text()), **data}
    cfg = validate_config(data, source=block.where)
    if cfg.kind == "gym":
        build_evolution(cfg)  # the env, its wrappers and spaces checked


# ---- running pages ----------------------------------------------------------------------------------------------
DRIVER = r'''
import json, sys, traceback
spec = json.load(open(sys.argv[1]))
if spec["overrides"]:
    import agilerl_core as ac
    _evolve = ac.evolve
    def evolve(config, *args, overrides=None, **kwargs):
        return _evolve(config, *args, overrides={**(overrides or {}), **spec["overrides"]}, **kwargs)
    ac.evolve = evolve
scope = {"__name__": "__main__"}
for block in spec["blocks"]:
    print(f"docs-test: running {block['path']}:{block['line']}", file=sys.stderr, flush=True)
    try:
        exec(compile("\n" * (block["line"] - 1) + block["code"], block["path"], "exec"), scope)
    except BaseException:
        traceback.print_exc()
        print(f"docs-test: FAILED {block['path']}:{block['line']}", file=sys.stderr, flush=True)
        sys.exit(1)
'''


def _env(tmp_path: Path, root: Path) -> dict[str, str]:
    """A user's shell: no server URLs inherited, Prefect's home in `tmp_path`, torch on one thread."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                            "AGILERL_STORAGE_URI", "AWS_ENDPOINT_URL")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(root), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _sandbox(tmp_path: Path) -> Path:
    """A directory that looks like the root of a fresh clone: links to the repository's entries, no runs/."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in NOT_IN_SANDBOX and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    return clone


def page_plan(page: str) -> tuple[list[Block], list[Command], list[str]]:
    """(its python blocks, its commands to run, what is only checked and why) for one page."""
    python, runs, checked = [], [], []
    for block in BLOCKS[page]:
        if block.skip:
            checked.append(f"{block.where}: skipped ({block.skip})")
        elif block.lang == "python":
            python.append(block)
        elif block.lang in SHELL:
            for where, cmd in commands(block):
                argv, why = plan_command(cmd, where)
                if argv:
                    runs.append(Command(where, argv))
                else:
                    checked.append(f"{where}: {shlex.join(cmd)}: checked, not run ({why})")
    return python, runs, checked


RUNNABLE = [p for p in PAGES if any(page_plan(p)[:2])]
STATELESS = {"examples/grpo_custom_reward.py"}  # writes into its own temp dir only: once per session is enough


@dataclass
class PageRun:
    """What following a page left: its python blocks' stdout, the sandbox it ran in."""

    stdout: str
    clone: Path
    commands: list[tuple[list[str], str]] = field(default_factory=list)  # each command run and its stdout


@pytest.fixture(scope="module")
def run_page(tmp_path_factory):
    """Follow a page top to bottom in a fresh sandbox. Steps already taken are not taken again: a page whose
    steps begin another page's already followed (README's quickstart is the docs' one, own_env.py's lines begin
    examples.md's) reuses that run, and a stateless command runs once."""
    done: list[tuple[list, PageRun]] = []
    stateless_done: set[tuple[str, ...]] = set()

    def run(page: str) -> PageRun:
        python, runs, _ = page_plan(page)
        runs = [c for c in runs if not (c.argv[1] in STATELESS and tuple(c.argv) in stateless_done)]
        plan = [("python", json.dumps(BUDGETS.get(page)), b.code) for b in python] + [tuple(c.argv) for c in runs]
        for done_plan, result in done:
            if done_plan[:len(plan)] == plan:
                return result
        result = _follow(page, python, runs, tmp_path_factory.mktemp("page"))
        done.append((plan, result))
        stateless_done.update(tuple(c.argv) for c in runs if c.argv[1] in STATELESS)
        return result

    return run


def _follow(page: str, python: list[Block], runs: list[Command], tmp_path: Path) -> PageRun:
    tmp_path.mkdir(parents=True, exist_ok=True)
    clone = _sandbox(tmp_path)
    env = _env(tmp_path, clone)
    stdout = ""
    if python:
        spec = tmp_path / "blocks.json"
        spec.write_text(json.dumps({"overrides": BUDGETS.get(page, {}),
                                    "blocks": [{"path": b.path, "line": b.line, "code": b.code} for b in python]}))
        proc = subprocess.run([sys.executable, "-c", DRIVER, str(spec)], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=300)
        failed = re.findall(r"docs-test: FAILED (\S+)", proc.stderr)
        assert proc.returncode == 0, f"{failed[0] if failed else page}: the python block fails:\n{_tail(proc.stderr)}"
        stdout = proc.stdout
    commands = []
    for where, argv in runs:
        proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
        shown = shlex.join(["python" if a == sys.executable else a for a in argv])
        assert proc.returncode == 0, f"{where}: `{shown}` exits {proc.returncode}:\n{_tail(proc.stderr)}"
        assert "Traceback" not in proc.stderr, f"{where}: `{shown}`:\n{_tail(proc.stderr)}"
        commands.append((argv, proc.stdout))
    return PageRun(stdout, clone, commands)


def _tail(text: str) -> str:
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.strip() and not ln.startswith("evolution:")]
    return "\n".join(lines[-40:])


@pytest.mark.parametrize("page", RUNNABLE)
def test_the_page_runs_top_to_bottom_from_a_fresh_clone(page, run_page):
    run_page(page)


def test_the_quickstart_shows_evolution_across_generations(run_page):
    """The README's python block (the docs' quickstart is the same text) prints a fitness per generation, over
    several generations, that changes; its run lands in runs/corridor-latest."""
    (block,) = [b for b in BLOCKS["README.md"] if b.lang == "python"]
    assert block.code in [b.code for b in BLOCKS["docs/index.md"]], "README's quickstart differs from docs/index.md's"
    run = run_page("README.md")
    means = [float(m) for m in re.findall(r"^generation \d+: mean fitness (-?[\d.]+)", run.stdout, re.M)]
    assert len(means) >= 3 and len(set(means)) > 1, run.stdout
    assert (run.clone / "runs" / "corridor-latest" / "elite" / "member.json").is_file()


def test_the_offline_recipe_makes_a_medium_dataset_and_cqn_improves_on_it(run_page):
    """docs/training/offline.md's commands as written: the expert's noisy episodes are a medium dataset (the
    collect command prints their mean return: well below the expert's 500, well above a random policy's ~20),
    and the CQN population learns a policy better than the data it learned from."""
    run = run_page("docs/training/offline.md")
    outputs = {argv[argv.index("flows.cli") + 2] if argv[argv.index("flows.cli") + 1] == "dataset" else
               Path(argv[argv.index("flows.cli") + 2]).stem: json.loads(out.strip().splitlines()[-1])
               for argv, out in run.commands}
    medium = outputs["collect"]["return_mean"]
    assert 100 <= medium <= 300, outputs["collect"]
    assert outputs["cartpole_dqn"]["best_fitness"] >= 450  # the expert the noise is added to
    assert outputs["cartpole_cqn"]["best_fitness"] > medium + 100, (outputs["cartpole_cqn"], medium)


def test_the_multi_agent_page_has_a_quickstart_that_runs(run_page):
    run = run_page("docs/training/multi_agent.md")
    (out,) = [o for a, o in run.commands if "speaker_listener_matd3.yaml" in " ".join(a)]
    assert json.loads(out.strip().splitlines()[-1])["global_steps"] == 1024  # the page's run, on a tiny budget


# ---- load_champion: the errors a user meets -------------------------------------------------------------------
@pytest.fixture(scope="module")
def corridor_elite(run_page):
    """A sandbox holding the corridor example's run (what examples/own_env.py's docstring lines leave)."""
    clone = run_page("examples/own_env.py").clone
    assert (clone / "runs" / "corridor-latest" / "elite" / "member.json").is_file()
    return clone, "runs/corridor-latest/elite"


@pytest.fixture
def load_champion(corridor_elite, monkeypatch, capsys):
    """examples/load_champion.py's main, called in this process from the sandbox: (exit status, stdout, stderr)."""
    import importlib

    clone, _ = corridor_elite
    monkeypatch.chdir(clone)
    # as `python examples/load_champion.py` has it: the script's folder first; what --env imports is forgotten after
    monkeypatch.setattr(sys, "path", [str(clone / "examples"), *sys.path])
    main = importlib.import_module("examples.load_champion").main

    def call(*args: str) -> tuple[int, str, str]:
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return call


@pytest.mark.parametrize(("args", "words"), [
    ([], ["records env <Corridor>", "--env module:Class", "examples.own_env:Corridor"]),
    (["--env", "CartPole-v1"], ["observation space is Box(", "(4,)", "Box(0.0, 1.0, (6,), float32)"]),
    (["--env", "Acrobot-v1"], ["action space is Discrete(3)", "Discrete(2)"]),
    (["--env", "no_such_module:Env"], ["no module named 'no_such_module'"]),
    (["--env", "examples.own_env:Nope"], ["module 'examples.own_env' has no 'Nope'"]),
    (["--env", "examples.own_env:np"], ["'np' is a module"]),
    (["--env", "NoSuchEnv-v0"], ["--env NoSuchEnv-v0: not a Gymnasium env", "module:Class"]),
    (["--episodes", "0"], ["--episodes and --max-steps take a whole number >= 1"]),
])
def test_load_champion_refuses_in_one_paragraph(load_champion, corridor_elite, args, words):
    status, out, err = load_champion(corridor_elite[1], *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and not out and len(lines) == 1, err
    assert lines[0].startswith("load_champion: ") and all(w in lines[0] for w in words), lines[0]


def test_load_champion_acts_with_an_env_class_named_either_way(load_champion, corridor_elite):
    for env in ("examples.own_env:Corridor", "own_env:Corridor"):  # from the root, or the examples folder
        status, out, err = load_champion(corridor_elite[1], "--env", env, "--episodes", "2")
        assert status == 0, err
        out = json.loads(out.strip().splitlines()[-1])
        assert out["env_id"] == env and out["trained_in"] == "<Corridor>" and len(out["returns"]) == 2
        assert out["returns"] == [out["returns"][0]] * 2  # the corridor is deterministic: a greedy member repeats


def test_load_champion_exits_2_with_one_line_as_a_script(corridor_elite, tmp_path):
    clone, _ = corridor_elite
    proc = subprocess.run([sys.executable, "examples/load_champion.py", "runs/no-such-run/elite"], cwd=clone,
                          env=_env(tmp_path, clone), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "load_champion: runs/no-such-run/elite: no member checkpoint there (member.json)"


def test_a_failing_block_or_command_is_named_by_file_and_line(tmp_path):
    block = Block("docs/page.md", 7, "python", "x = 1\nraise ValueError('boom')\n")
    with pytest.raises(AssertionError, match=r"(?s)^docs/page.md:7: the python block fails:.*File \"docs/page.md\", "
                                             r"line 8.*ValueError: boom"):
        _follow("docs/page.md", [block], [], tmp_path / "a")
    command = Command("docs/page.md:12", [sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(AssertionError, match=r"^docs/page.md:12: `python -c 'import sys; sys.exit\(3\)'` exits 3"):
        _follow("docs/page.md", [], [command], tmp_path / "b")
